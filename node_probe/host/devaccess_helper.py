"""The short-lived process that asks the kernel "may this cgroup use these devices?".

Why a separate file: it must be tiny and import nothing from the probe (it runs as
`python -I -S devaccess_helper.py MODE` with a JSON plan on stdin). One helper serves every
container of a run: it starts in the probe's own cgroup (so its start-up memory is charged
there, not to a container near its limit), then for each target writes its own pid to the
container's cgroup.procs (what `kubectl exec` amounts to) and checks each device node. It
prints its pid, then one JSON line per target: {"key", "joined", "error", "errno": {path: n}}.
MODE `access` uses access(R_OK|W_OK), which runs the device cgroup check
(devcgroup_inode_permission, BPF programs included) without entering the driver; `open`
really opens the node O_RDWR|O_NONBLOCK (tests; an open of a wedged GPU can block).
When the probe runs in its own cgroup namespace (a debug pod on cgroup v2), the kernel refuses
to move a process to a cgroup outside that namespace (ENOENT), so the plan may name a cgroup
namespace to enter first (the host's, /proc/1/ns/cgroup with hostPID), via setns(2).
"""
import ctypes
import json
import os
import sys


def main(argv):
    mode = argv[0] if argv else "access"
    plan = json.loads(sys.stdin.read() or "{}")
    pid = os.getpid()
    try:  # if a container is at its memory limit, the OOM killer takes us first
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
    except OSError:
        pass
    print(json.dumps({"pid": pid}), flush=True)
    libc = ctypes.CDLL(None, use_errno=True)
    if plan.get("cgroupns"):
        fd = os.open(plan["cgroupns"], os.O_RDONLY)
        if libc.setns(fd, 0x02000000) != 0:   # CLONE_NEWCGROUP
            print(json.dumps({"setns_errno": ctypes.get_errno()}), flush=True)
        os.close(fd)
    for t in plan.get("targets") or ():
        out = {"key": t["key"], "joined": False, "error": 0, "errno": {}}
        try:
            fd = os.open(t["procs"], os.O_WRONLY)
            try:
                os.write(fd, str(pid).encode())
            finally:
                os.close(fd)
            out["joined"] = True
        except OSError as x:
            out["error"] = x.errno
            print(json.dumps(out), flush=True)
            continue
        for p in t["nodes"]:
            e = 0
            if mode == "open":
                try:
                    os.close(os.open(p, os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC))
                except OSError as x:
                    e = x.errno
            elif libc.access(p.encode(), os.R_OK | os.W_OK) != 0:
                e = ctypes.get_errno()
            out["errno"][p] = e
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
