"""Node-side half of kubectl gpu-doctor: checks and eBPF probes that print gpu-doctor/v1 NDJSON.

Runs with only the stdlib, grpcio, protobuf, pynvml and (optionally) bcc; never imports click,
kubernetes or kubectl_gpudoctor.

Layout (each folder's __init__ says why it exists):
  protocol/   the record model, finding catalog and renderers: the only part the client imports
  engine/     check registry, run context (typed facts), concurrent runner with deadlines
  host/       readers of the host: /proc, files under the host root, cgroups, kubelet files,
              NVIDIA devices and driver, child processes with deadlines
  deviceplugin/  device-plugin discovery and read-only RPCs; kubeletapi/ generated gRPC stubs
  tracing/    eBPF loaders for bpf/*.bpf.c (BCC imported lazily)
  checks/     one check family per module: every verdict lives here
"""


def __getattr__(name: str):
    """`node_probe.__version__` on first use (PEP 562): importing a part of the probe (the NVML
    child, each agent pass's helpers) does not import the record model with it."""
    if name == "__version__":
        from node_probe.protocol.version import __version__
        return __version__
    raise AttributeError(f"module 'node_probe' has no attribute {name!r}")
