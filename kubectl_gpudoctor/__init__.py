"""Client half of kubectl gpu-doctor: the kubectl plugin (click CLI, kubernetes client).

Never imports bcc or pynvml; imports `kubernetes` lazily (api/kube.py) so --help, version and
local stay fast (DESIGN.md sections 2 and 10).
"""
from node_probe.protocol.version import __version__  # noqa: F401  one version for both halves
