"""eBPF tracing for the node probe: BCC programs from bpf/*.bpf.c and one small loader each.

Why a package: the kernel side (bpf/<name>.bpf.c) and the user side (a loader that compiles
with -D cflags, attaches, reads the ring buffer and returns plain dicts) must stay small and
separate, and everything that needs `bcc` is imported lazily from here, so the probe runs
without BCC and reports `probe.ebpf_unavailable` instead.

Layout: bcc_env (can BCC run: module, headers, tracefs), hostbcc (the host's python3-bpfcc for
a Python without bcc: the frozen plugin, a venv), kheaders (the bundled header sets), sources
(where bpf/ is; the shared headers of bpf/include pasted into each compile unit), bundle (one
compile for all programs, syscall tracepoint attach/detach, the event head), abi (the C's
integer #defines, read from the C), loader (the Loader protocol, LoaderBase, TraceConfig,
Targets), fdtrack (the one fd tracker every syscall program shares), ucalls (library calls
watched by entry/return uprobe pairs, bpf/include/ucall.h), ticks (the kernel tick as the ioctl
clock), libs (a process's copy of a driver library, for uprobes), one loader per program
(nvidia_dev, cgroup_devices, nvml_calls, cuda_calls, futex_wait), session (one trace window;
LOADERS, the one list of probes). Verdicts live in node_probe/checks/_trace_verdicts.py. What a
blocked thread is inside, from /proc, comes from node_probe.host.proctasks and
node_probe.host.elfsyms (shared with the device-plugin check).

Known limits, by design or for now:
- Only syscall tracepoint arguments, user memory and BPF helpers are read: no kernel structs
  (headers on a node may not match its kernel). Hence paths are what the caller passed: a
  relative devices.allow path or a cgroup v2 target fd is resolved from /proc while the writer
  is alive (best effort), and a device opened through another path (/dev/char/195:0) or
  relative to /dev is not matched by the prefix.
- fds are tracked per process: a child forked during the window inherits device fds the maps
  do not know (processes that exist at attach time are seeded from /proc/PID/fd). ioctls are
  timed with the kernel tick (1-10 ms) unless TraceConfig.precise_ioctl_clock: enough for slow
  (>= 1 s) and stalled (>= 2 s) calls, not for the mean latency of fast ones. fds closed
  by close_range(2) or by exec of O_CLOEXEC fds stay in the maps; an ioctl on a reused fd
  number of that process could then be attributed to the old path.
- Calls and waits that began before the programs attached are invisible to BPF; futex waits
  of target threads are still found from /proc/PID/task/TID/syscall (with a stack scan), ioctls
  are not (the device-plugin check reads such threads itself).
- User stacks from BPF stop at the first frame without a frame pointer (glibc); in-progress
  waits get a heuristic stack scan instead (proctasks.symbolic_stack).
"""
