"""Does a device cgroup let its processes open a given device? v1 by rules, v2 by asking the kernel.

Why: "NVML: Unknown Error" / CUDA error 30 inside a container is, in seeds 001 and 002, a
device cgroup that no longer allows `/dev/nvidiactl` or `/dev/nvidia-uvm`. The verdict must be
exactly the kernel's:

* cgroup v1 (security/device_cgroup.c): `devices.list` shows `a *:* rwm` when the cgroup's
  default is allow (deny exceptions are then not shown at all), otherwise the whitelist of
  exceptions, each `type major:minor access` with type `b`/`c`, `*` for any number and access a
  subset of `rwm`. An access is allowed only if ONE exception of the same type matches the
  numbers and covers every requested access bit (`c 195:* r` plus `c 195:0 w` does not allow
  O_RDWR). `m` is mknod only: an open needs `r` and/or `w`.
* cgroup v2 has no rule file: access is decided by BPF_CGROUP_DEVICE programs attached by the
  runtime. The only faithful test is the one `kubectl exec` would run into: a short-lived helper
  process placed in the container's cgroup checks each device node. It uses access(R_OK|W_OK),
  which runs the same kernel check (devcgroup_inode_permission) as open() without entering the
  NVIDIA driver (an open of a wedged GPU can block in the kernel); `mode="open"` is available
  for tests. One helper (devaccess_helper.py) serves all containers of a run: it starts in the
  probe's cgroup (its start-up memory is not charged to a container), marks itself first for
  the OOM killer, then writes its own pid into each container's cgroup.procs in turn and checks
  that container's nodes. It runs under subproc's deadline and is verified gone afterwards.
  (A helper per container joining in preexec cost ~58 ms each here: 1.1 s for 20 GPU
  containers; one helper moving itself is one start-up plus microseconds per container.)
"""
from __future__ import annotations

import dataclasses
import errno as errno_mod
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

from node_probe.host import procfs, subproc

ACCESS = frozenset("rwm")


# -- cgroup v1 ------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Rule:
    kind: str               # 'a', 'b' or 'c'
    major: int | None       # None = '*'
    minor: int | None
    access: frozenset

    @classmethod
    def parse(cls, line: str) -> "Rule":
        """One devices.list / devices.allow line: 'c 195:* rw', 'a *:* rwm', 'a'."""
        parts = line.split()
        if not parts or parts[0] not in ("a", "b", "c"):
            raise ValueError(f"bad device rule {line!r}")
        if parts[0] == "a":
            return cls("a", None, None, ACCESS)
        if len(parts) != 3 or ":" not in parts[1]:
            raise ValueError(f"bad device rule {line!r}")
        ma, _, mi = parts[1].partition(":")
        acc = frozenset(parts[2])
        if not acc or not acc <= ACCESS:
            raise ValueError(f"bad access in device rule {line!r}")
        return cls(parts[0], None if ma == "*" else int(ma), None if mi == "*" else int(mi), acc)

    def __str__(self) -> str:
        n = lambda v: "*" if v is None else str(v)  # noqa: E731
        return f"{self.kind} {n(self.major)}:{n(self.minor)} {''.join(c for c in 'rwm' if c in self.access)}"

    def _names(self, kind: str, major: int, minor: int) -> bool:
        """Same type (or `a`) and numbers equal or wildcard: the part both matchers share."""
        return ((self.kind == "a" or self.kind == kind)
                and (self.major is None or self.major == major)
                and (self.minor is None or self.minor == minor))

    def matches(self, kind: str, major: int, minor: int, access: frozenset) -> bool:
        """The kernel's match_exception(): same type, numbers equal or wildcard, and the
        requested access a subset of this one exception's access."""
        return self._names(kind, major, minor) and access <= self.access

    def matches_partially(self, kind: str, major: int, minor: int, access: frozenset) -> bool:
        """match_exception_partial(): any overlap (used for deny exceptions)."""
        return self._names(kind, major, minor) and bool(access & self.access)


@dataclasses.dataclass(frozen=True)
class RuleSet:
    """A v1 devices cgroup as devices.list shows it."""

    default_allow: bool
    exceptions: tuple[Rule, ...]
    lines: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> "RuleSet":
        lines = tuple(l.strip() for l in text.splitlines() if l.strip())
        rules = tuple(Rule.parse(l) for l in lines)
        if any(r.kind == "a" for r in rules):
            # the kernel prints a single 'a *:* rwm' for a default-allow cgroup; its deny
            # exceptions (if any) are not visible in devices.list
            return cls(True, (), lines)
        return cls(False, rules, lines)

    def allows(self, kind: str, major: int, minor: int, access: str | Iterable[str] = "rw") -> bool:
        acc = frozenset(access)
        if self.default_allow:
            return not any(r.matches_partially(kind, major, minor, acc) for r in self.exceptions)
        return any(r.matches(kind, major, minor, acc) for r in self.exceptions)

    def allows_major(self, kind: str, major: int, access: str | Iterable[str] = "rw") -> bool:
        """Some device of this type and major (any minor) may be accessed so: a default-allow
        cgroup, or one exception naming the major (or any) that covers every access bit."""
        return self.default_allow or grants(self.exceptions, kind, major, access)

    def nvidia_lines(self, majors: Iterable[int]) -> list[str]:
        ms = set(majors)
        return [str(r) for r in self.exceptions if r.major is None or r.major in ms]


def grants(rules: Iterable[Rule], kind: str, major: int, access: str | Iterable[str] = "rw") -> bool:
    """One of these rules (as written to devices.allow) allows `access` to some device of this
    type and major: 'a', or an exception naming the major (or '*') covering every bit."""
    acc = frozenset(access)
    return any(r.kind in ("a", kind) and r.major in (None, major) and acc <= r.access
               for r in rules)


def revokes(rules: Iterable[Rule], kind: str, major: int, access: str | Iterable[str] = "rw") -> bool:
    """One of these rules (as written to devices.deny) takes some of `access` away from devices
    of this type and major: 'a' (deny all), or an exception naming it that overlaps `access`."""
    acc = frozenset(access)
    return any(r.kind in ("a", kind) and r.major in (None, major) and bool(acc & r.access)
               for r in rules)


def parse_lines(text: str) -> list[Rule]:
    """The rules of a devices.allow / devices.deny write (one per line; lines the kernel
    would reject are left out)."""
    out = []
    for line in text.splitlines():
        try:
            out.append(Rule.parse(line))
        except ValueError:
            continue
    return out


def read_rules(cgroup: Path) -> RuleSet | None:
    text = procfs.read_str(Path(cgroup) / "devices.list", 1 << 20)
    if text is None:
        return None
    try:
        return RuleSet.parse(text)
    except ValueError:
        return None


# -- cgroup v2: the access helper (devaccess_helper.py) ------------------------------------

# errno -> verdict. EPERM is the device cgroup's answer; ENXIO/ENODEV mean the cgroup let the
# open through to a node with no driver behind it (the kernel checks the cgroup first).
ALLOWED_ERRNOS = (0, errno_mod.ENXIO, errno_mod.ENODEV)
DENIED_ERRNOS = (errno_mod.EPERM,)

MIN_MEMORY_HEADROOM = 64 << 20


@dataclasses.dataclass
class AccessResult:
    ok: bool                            # the helper ran and reported
    errnos: dict[str, int]              # majmin -> errno
    reason: str = ""                    # why it could not run
    helper_pid: int | None = None
    left_behind: bool = False           # helper still in the cgroup afterwards (never expected)
    duration_s: float = 0.0
    setns_errno: int | None = None      # entering the host cgroup namespace failed

    def allowed(self, majmin: str) -> bool | None:
        e = self.errnos.get(majmin)
        if e is None:
            return None
        if e in DENIED_ERRNOS:
            return False
        if e in ALLOWED_ERRNOS:
            return True
        return None


def _read_int(p: Path) -> int | None:
    t = (procfs.read_str(p) or "").strip()
    return int(t) if t.isdigit() else None


def join_refusal(cgroup: Path) -> str:
    """Why joining this v2 cgroup would be unsafe or impossible ('' if fine)."""
    cg = Path(cgroup)
    if not (cg / "cgroup.procs").exists():
        return "cgroup is gone"
    if (_read_int(cg / "cgroup.freeze") or 0) == 1:
        return "cgroup is frozen (the helper would block)"
    mmax, mcur = _read_int(cg / "memory.max"), _read_int(cg / "memory.current")
    if mmax is not None and mcur is not None and mmax - mcur < MIN_MEMORY_HEADROOM:
        return f"memory headroom {max(0, mmax - mcur) >> 20} MiB < 64 MiB (helper could OOM the container)"
    pmax, pcur = _read_int(cg / "pids.max"), _read_int(cg / "pids.current")
    if pmax is not None and pcur is not None and pcur >= pmax:
        return "pids.max reached"
    return ""


def _node_for(major: int, minor: int, candidates: Sequence[Path], tmpdir: list) -> str | None:
    """A path to a char node with this major:minor: the host's own node when it has the right
    numbers, else one made with mknod in a private temp dir (removed by the caller)."""
    for p in candidates:
        try:
            st = os.stat(p)
        except OSError:
            continue
        if (st.st_mode & 0o170000) == 0o020000 and os.major(st.st_rdev) == major \
                and os.minor(st.st_rdev) == minor:
            return str(p)
    try:
        if not tmpdir:
            tmpdir.append(tempfile.mkdtemp(prefix="gpu-doctor-devnodes-"))
        node = os.path.join(tmpdir[0], f"c{major}_{minor}")
        if not os.path.exists(node):
            os.mknod(node, 0o600 | 0o020000, os.makedev(major, minor))
        return node
    except OSError:
        return None


def foreign_cgroupns(proc: Path = Path("/proc"), host_pid: int = 1) -> str | None:
    """The host's cgroup namespace (pid 1's) when we run in another one, else None."""
    try:
        host = os.stat(proc / str(host_pid) / "ns/cgroup")
        mine = os.stat("/proc/self/ns/cgroup")
    except OSError:
        return None
    if (host.st_dev, host.st_ino) == (mine.st_dev, mine.st_ino):
        return None
    return str(proc / str(host_pid) / "ns/cgroup")


def check_access_many(targets: Sequence[tuple[str, Path, Sequence[tuple[int, int, Sequence[Path]]]]],
                     timeout_s: float = 3.0, mode: str = "access",
                     python: str | None = None, cgroupns: str | None = "auto"
                     ) -> dict[str, AccessResult]:
    """One helper visits each target cgroup in turn and reports the errno per (major, minor).

    `targets`: (key, cgroup dir, [(major, minor, candidate host paths of the node)]). Works for
    v1 devices cgroups too (the helper then moves only in that hierarchy). Returns key ->
    AccessResult; targets refused up front (frozen, no memory headroom, gone) say why."""
    results: dict[str, AccessResult] = {}
    plan, node_maps, cgroups = [], {}, {}
    tmpdir: list = []
    try:
        for key, cgroup, devices in targets:
            cg = Path(cgroup)
            refusal = join_refusal(cg)
            if refusal:
                results[key] = AccessResult(False, {}, refusal)
                continue
            paths: dict[str, str] = {}
            for major, minor, cands in devices:
                node = _node_for(major, minor, cands, tmpdir)
                if node is not None:
                    paths[node] = f"{major}:{minor}"
            if not paths:
                results[key] = AccessResult(False, {}, "no device node to test with (mknod failed)")
                continue
            plan.append({"key": key, "procs": str(cg / "cgroup.procs"), "nodes": list(paths)})
            node_maps[key], cgroups[key] = paths, cg
        if not plan:
            return results
        if cgroupns == "auto":
            cgroupns = foreign_cgroupns()
        res = subproc.run([*_helper_argv(python), mode], timeout_s, env={},
                          input=json.dumps({"cgroupns": cgroupns, "targets": plan}).encode())
        pid, seen, setns_err = None, {}, None
        for obj in res.json_lines():
            if "pid" in obj:
                pid = obj["pid"]
            elif "setns_errno" in obj:
                setns_err = int(obj["setns_errno"])
            elif obj.get("key") in node_maps:
                seen[obj["key"]] = obj
        if res.timed_out:
            why = f"helper did not finish within {timeout_s:.1f}s (killed)"
        elif res.returncode != 0:
            err = res.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["?"]
            why = f"helper exited {res.returncode}: {err[0]}"
        else:
            why = "helper gave no answer for this cgroup"
        per = res.duration_s / max(1, len(plan))
        for t in plan:
            key, paths = t["key"], node_maps[t["key"]]
            left = pid is not None and pid in _procs(cgroups[key])
            obj = seen.get(key)
            if obj is None:
                results[key] = AccessResult(False, {}, why, pid, left, per)
            elif not obj.get("joined"):
                e = int(obj.get("error") or 0)
                hint = (f" (entering the host cgroup namespace failed: "
                        f"{errno_mod.errorcode.get(setns_err, setns_err)})" if setns_err else "")
                results[key] = AccessResult(False, {}, f"could not join the cgroup: "
                                            f"{errno_mod.errorcode.get(e, e)}{hint}", pid, left,
                                            per)
            else:
                errnos = {paths[p]: int(e) for p, e in (obj.get("errno") or {}).items()
                          if p in paths}
                results[key] = AccessResult(len(errnos) == len(paths), errnos, "", pid, left, per,
                                            setns_err)
        return results
    finally:
        for d in tmpdir:
            shutil.rmtree(d, ignore_errors=True)


def check_access(cgroup: Path, devices: Sequence[tuple[int, int, Sequence[Path]]],
                timeout_s: float = 2.0, mode: str = "access",
                python: str | None = None) -> AccessResult:
    """check_access_many for one cgroup."""
    return check_access_many([("", cgroup, devices)], timeout_s, mode, python)[""]


def _helper_argv(python: str | None) -> list[str]:
    if python is None and getattr(sys, "frozen", False):
        return subproc.python_module_argv("node_probe.host.devaccess_helper")
    return [python or sys.executable, "-I", "-S", str(Path(__file__).with_name("devaccess_helper.py"))]


def _procs(cg: Path) -> set[int]:
    text = procfs.read_str(cg / "cgroup.procs", 4 << 20) or ""
    return {int(x) for x in text.split() if x.isdigit()}
