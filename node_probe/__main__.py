import sys

if sys.argv[1:2] == ["agent-idle"]:  # the agent's idle loop: skip the probe's imports
    from .agent_idle import main

    sys.exit(main())

from .cli import entrypoint

entrypoint()
