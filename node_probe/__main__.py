import sys

if sys.argv[1:2] == ["agent-idle"]:  # the agent's idle loop: skip the probe's imports
    from .agent_idle import main

    sys.exit(main())

if sys.argv[1:2] == ["agent-watch"]:  # the agent's watch mode (node_probe/watch)
    import os

    from .watch.loop import main as watch_main

    code = watch_main(sys.argv[2:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # abandoned check threads may be stuck in C calls

if sys.argv[1:2] == ["agent-history"]:  # read the evidence ring (no probe imports)
    from .watch.history import main as history_main

    sys.exit(history_main(sys.argv[2:]))

from .cli import entrypoint

entrypoint()
