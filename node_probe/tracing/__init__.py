"""eBPF tracing for the node probe: BCC programs from bpf/*.bpf.c and one small loader each.

Why a package: the kernel side (bpf/<name>.bpf.c) and the user side (a loader that compiles
with -D cflags, attaches, reads the ring buffer and returns plain dicts) must stay small and
separate, and everything that needs `bcc` is imported lazily from here, so the probe runs
without BCC (DESIGN.md section 2) and reports `probe.ebpf_unavailable` instead.
"""
