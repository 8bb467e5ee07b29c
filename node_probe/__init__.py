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
from node_probe.protocol.version import __version__  # noqa: F401
