"""The short-lived process that asks the kernel "may this cgroup use these devices?".

Why a separate file: cgroup_rules.test_access starts it inside a container's cgroup (it joins
in preexec, before exec), so it must be tiny and import nothing from the probe: it runs as
`python -I -S devaccess_helper.py MODE PATH...`. It prints its pid, then one JSON line per path
with the errno (0 = allowed). MODE `access` uses access(R_OK|W_OK), which runs the device
cgroup check (devcgroup_inode_permission) without entering the driver; `open` really opens the
node O_RDWR|O_NONBLOCK (tests; an open of a wedged GPU can block in the kernel).
"""
import ctypes
import json
import os
import sys


def main(argv):
    print(json.dumps({"pid": os.getpid()}), flush=True)
    mode = argv[0] if argv else "access"
    libc = ctypes.CDLL(None, use_errno=True)
    for p in argv[1:]:
        e = 0
        if mode == "open":
            try:
                os.close(os.open(p, os.O_RDWR | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC))
            except OSError as x:
                e = x.errno
        elif libc.access(p.encode(), os.R_OK | os.W_OK) != 0:
            e = ctypes.get_errno()
        print(json.dumps({"path": p, "errno": e}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
