"""Can eBPF tracing run here, and if not, exactly what is missing and how to provide it.

Why: BCC compiles programs on the node, so it needs three things the probe image may lack:
the `bcc` Python module (Debian: python3-bpfcc), kernel headers for the running kernel (in the
debug pod they are the host's, under --host-root; Debian splits them into -amd64 and -common,
and BCC_KERNEL_SOURCE takes one directory, so a merged tree of symlinks is built when needed),
and a mounted tracefs (mounted here when absent, and said so in a log record). Checked before
`import bcc`, because bcc reads the tracefs location at import time. When the node has no
headers at all (no /lib/modules/<release>/{build,source}, no kheaders.tar.xz), the probe's own
bundled set (kheaders.py) is used; `headers` says which ones were used, for the report. A
Python without bcc (the frozen krew plugin, a venv) uses the host's python3-bpfcc (hostbcc.py);
`bcc_module` says which.
"""
from __future__ import annotations

import atexit
import dataclasses
import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable

from node_probe.host import hostfs, subproc
from . import hostbcc, kheaders

TRACEFS_CANDIDATES = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
KCONFIG = "include/linux/kconfig.h"
KHEADERS = "/sys/kernel/kheaders.tar.xz"

Log = Callable[..., None]


@dataclasses.dataclass
class BccEnv:
    ok: bool
    missing: list[str]          # what is missing, one phrase each
    remedies: list[str]         # how to provide it, one command/setting each
    kernel_release: str
    kernel_source: str | None   # headers dir BCC will use (None: BCC's default lookup)
    tracefs: str | None
    notes: list[str] = dataclasses.field(default_factory=list)
    # which headers BCC compiles against: {"source": env|probe|host|kheaders|bundled, "path":
    # ..., "kernel_version": (bundled only) ...}; {} when none were found
    headers: dict = dataclasses.field(default_factory=dict)
    bcc_module: str = ""        # which bcc Python package was imported (hostbcc.import_bcc)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _has_headers(d: Path | None) -> bool:
    return d is not None and (d / KCONFIG).is_file()


def own_dir(path: Path) -> Path:
    """`path` as a directory only this process's user can write: created 0700 here, or kept
    when it already is one (a real directory, not a symlink, owned by us, no access for group
    or others). Anything else at that name -- a directory another local user made in the shared
    temp dir, with headers of their choosing for the BCC compile that runs as root -- is left
    alone, and a fresh private directory is used instead (security audit round 4, B-01)."""
    try:
        os.mkdir(path, 0o700)
        return path
    except FileExistsError:
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() \
                and not st.st_mode & 0o077:
            return path
    fresh = Path(tempfile.mkdtemp(prefix=path.name + "-"))
    atexit.register(shutil.rmtree, fresh, True)      # not reusable by name: nothing left behind
    return fresh


def merged_tree(build: Path, source: Path, dest: Path) -> Path:
    """A tree of symlinks holding `build` (generated headers, config) over `source` (the
    rest): what BCC_KERNEL_SOURCE needs when headers come split in two directories."""
    dest.mkdir(parents=True, exist_ok=True)

    def merge(dst: Path, srcs: list[Path]) -> None:
        names: dict[str, list[Path]] = {}
        for s in srcs:
            try:
                for entry in os.scandir(s):
                    names.setdefault(entry.name, []).append(Path(entry.path))
            except OSError:
                continue
        for name, paths in names.items():
            target = dst / name
            dirs = [p for p in paths if p.is_dir()]
            if len(dirs) > 1:
                target.mkdir(exist_ok=True)
                merge(target, dirs)
            elif not target.exists() and not target.is_symlink():
                target.symlink_to(dirs[0] if dirs else paths[0])

    merge(dest, [build, source])
    return dest


def _tracefs(log: Log) -> tuple[str | None, str | None]:
    """(mounted tracefs dir or None, error text)."""
    for d in TRACEFS_CANDIDATES:
        if os.path.isdir(os.path.join(d, "events")):
            return d, None
    target = TRACEFS_CANDIDATES[0]
    if not os.path.isdir(target):
        return None, f"{target} does not exist (no sysfs tracing directory)"
    try:
        res = subproc.run(["mount", "-t", "tracefs", "nodev", target], timeout_s=3.0)
    except OSError as exc:  # no mount(8) in the image
        return None, f"tracefs not mounted and running mount(8) failed: {exc}"
    if res.returncode == 0 and os.path.isdir(os.path.join(target, "events")):
        log("info", f"tracefs was not mounted: mounted it at {target}", check="trace")
        return target, None
    err = (res.stderr or b"").decode("utf-8", "replace").strip() or "timed out"
    return None, f"tracefs not mounted and mounting it at {target} failed: {err}"


def _headers(host_root: Path, release: str, log: Log) -> tuple[str | None, str | None, dict]:
    """(BCC_KERNEL_SOURCE to set or None, error text or None, which headers: see BccEnv)."""
    env = os.environ.get("BCC_KERNEL_SOURCE")
    if env:
        if _has_headers(Path(env)):
            return env, None, {"source": "env", "path": env, "how": f"BCC_KERNEL_SOURCE={env}"}
        return None, f"BCC_KERNEL_SOURCE={env} has no {KCONFIG}", {}
    own = Path("/lib/modules") / release
    if _has_headers(own / "build") or _has_headers(own / "source"):
        # BCC's own lookup handles build+source pairs.
        return None, None, {"source": "probe", "path": str(own),
                            "how": f"{own}/{{build,source}}"}
    build = hostfs.resolve(host_root, f"lib/modules/{release}/build")
    source = hostfs.resolve(host_root, f"lib/modules/{release}/source")
    if _has_headers(build):
        return str(build), None, {"source": "host", "path": str(build), "how": str(build)}
    if build is not None and _has_headers(source):
        key = hashlib.sha256(f"{build}\0{source}".encode()).hexdigest()[:12]
        dest = own_dir(Path(tempfile.gettempdir()) / f"gpu-doctor-kheaders-{release}-{key}")
        if not _has_headers(dest):   # new, or stale links from an older tree
            for entry in os.scandir(dest):
                (shutil.rmtree if entry.is_dir(follow_symlinks=False) else os.unlink)(entry.path)
        merged_tree(build, source, dest)
        log("info", f"kernel headers are split ({build}, {source}): merged them for BCC "
                    f"at {dest}", check="trace")
        return str(dest), None, {"source": "host", "path": str(dest),
                                 "how": f"merged {build} + {source}"}
    if _has_headers(source):
        return str(source), None, {"source": "host", "path": str(source), "how": str(source)}
    if os.path.exists(KHEADERS):
        return None, None, {"source": "kheaders", "path": KHEADERS, "how": KHEADERS}
    bundled, why_not = kheaders.find()
    if bundled is not None:
        how = (f"{bundled.describe()}, since the node has none for {release}: our programs "
               "read only syscall tracepoint arguments, user memory and BPF helpers, and the "
               "tracepoint layout is checked against this kernel's format files")
        log("info", f"no kernel headers for {release} on the node: compiling the eBPF programs "
                    f"with {bundled.describe()}", check="trace")
        return str(bundled.path), None, {"source": "bundled", "how": how, **bundled.to_dict()}
    where = host_root / "lib/modules" / release
    return None, (f"no kernel headers for {release} (looked in {where}/build, {where}/source"
                  f", /lib/modules/{release} and {KHEADERS}; no bundled set: {why_not})"), {}


def check(host_root: Path, log: Log) -> BccEnv:
    """Find what BCC needs; sets BCC_KERNEL_SOURCE when headers need pointing at. No import
    of bcc happens here except the availability test at the end."""
    release = os.uname().release
    missing: list[str] = []
    remedies: list[str] = []
    notes: list[str] = []
    tracefs, err = _tracefs(log)
    if err:
        missing.append(err)
        remedies.append("mount tracefs: `mount -t tracefs nodev /sys/kernel/tracing` (in a pod: "
                        "mount the host's /sys/kernel/debug or run privileged)")
    ksrc, err, headers = _headers(host_root, release, log)
    if err:
        missing.append(err)
        remedies.append(f"install headers on the host (`apt-get install linux-headers-{release}`)"
                        " and mount the host's /lib/modules and /usr/src into the probe, or set"
                        " BCC_KERNEL_SOURCE to one directory holding the headers (the probe"
                        " image, the krew plugin and the wheel carry a small bundled set; a"
                        " checkout builds one with scripts/build-kheaders.py and"
                        " GPU_DOCTOR_KHEADERS_DIR names it)")
    else:
        notes.append(f"kernel headers: {headers['how']}")
        if ksrc:
            os.environ["BCC_KERNEL_SOURCE"] = ksrc
    # the availability test (tracefs is settled by now): this Python's bcc, else the host's
    module, from_host, why = hostbcc.import_bcc()
    where = ""
    if module is None:
        missing.append(f"the bcc Python module cannot be imported ({why})")
        remedies.append("install BCC on the node: `apt-get install python3-bpfcc` (Debian, "
                        "Ubuntu) or `dnf install python3-bcc` (Fedora, RHEL)")
    else:
        pkg = Path(module.__file__).parent
        where = f"the host's {pkg}" if from_host else f"this Python's {pkg}"
        notes.append(f"bcc: {where}")
        if from_host:
            log("info", f"this Python has no bcc module: using {where}", check="trace")
    return BccEnv(ok=not missing, missing=missing, remedies=remedies, kernel_release=release,
                  kernel_source=ksrc, tracefs=tracefs, notes=notes, headers=headers,
                  bcc_module=where)
