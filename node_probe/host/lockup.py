"""Soft lockups, RCU stalls and kernel `BUG:` reports whose stack, module list or task names
the NVIDIA driver or a GPU process.

Why: a CPU spinning inside the NVIDIA driver (a soft lockup with `[nvidia]` frames, an RCU stall
whose stack runs through `nvidia_uvm`, a NULL dereference at `RIP: ... [nvidia]`) freezes the
GPU's work and often the node, and no Xid is logged for it. The kernel prints each report as a
head line and then the task, the module list and the stack, a line each:

    watchdog: BUG: soft lockup - CPU#18 stuck for 27s! [python3:2254956]
    Modules linked in: nvidia_uvm(POE) nvidia_drm(POE) nvidia(POE) ...
    CPU: 18 PID: 2254956 Comm: python3 Tainted: P           OEL ...
    RIP: 0010:_nv012345rm+0x1f/0x30 [nvidia]
     ? os_acquire_spinlock+0x12/0x30 [nvidia]

(kernel/watchdog.c, kernel/rcu/tree_stall.h, arch/x86/mm/fault.c; gpud's cpu tests quote the
soft lockup heads). A report whose stack (or RIP) names an NVIDIA module is in the driver; one
whose task is a CUDA thread (`cuda-EvtHandlr`) is a GPU process's; one that names nvidia only in
the module list is a node problem on a node where the driver is loaded (informational).
Pure and line-at-a-time, bounded.
"""
from __future__ import annotations

import dataclasses
import re

NVIDIA_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem",
                  "nvidia_fs")
_SOFT_RE = re.compile(r"BUG: soft lockup - CPU#([0-9]{1,5}) stuck for ([0-9]{1,9})s! "
                      r"\[(.{1,64}):([0-9]{1,10})\]")
_HARD_RE = re.compile(r"Watchdog detected hard LOCKUP on cpu ([0-9]{1,5})")
_RCU_RE = re.compile(r"rcu: INFO: (rcu_\w{1,16}) (?:self-detected stall on CPU|detected stalls "
                     r"on CPUs/tasks)")
_BUG_RE = re.compile(r"(?:^|\s)BUG: (?!soft lockup)(.{1,80})")
_MODULES_RE = re.compile(r"^Modules linked in: (.*)")
_COMM_RE = re.compile(r"\bPID: ([0-9]{1,10}) Comm: (\S{1,64})")
_FRAME_RE = re.compile(r"\+0x[0-9a-f]{1,16}/0x[0-9a-f]{1,16} \[([a-z0-9_]{1,32})\]")
# CUDA's own threads: a task so named belongs to a GPU process
GPU_COMMS = ("cuda-EvtHandlr", "cuda-EvtHandl", "nvidia-", "nv-hostengine", "dcgm")
KINDS = {"soft_lockup": "soft lockup", "hard_lockup": "hard lockup", "rcu_stall": "RCU stall",
         "bug": "kernel BUG"}
MAX_REPORTS = 32
REPORT_LINES = 80


@dataclasses.dataclass(frozen=True)
class Lockup:
    kind: str                  # a key of KINDS
    what: str                  # the head's words: "soft lockup - CPU#18 stuck for 27s"
    comm: str | None
    pid: int | None
    count: int
    stack_modules: tuple[str, ...]     # NVIDIA modules in the stack or RIP
    nvidia_loaded: bool                # `Modules linked in:` names an NVIDIA module
    first_s: float | None
    last_s: float | None
    sample: str

    @property
    def in_driver(self) -> bool:
        return bool(self.stack_modules)

    @property
    def gpu_process(self) -> bool:
        return bool(self.comm) and self.comm.startswith(GPU_COMMS)


class Reader:
    def __init__(self) -> None:
        self.acc: dict[tuple[str, str | None], dict] = {}
        self.dropped = 0
        self._cur: dict | None = None
        self._left = 0

    def _head(self, kind: str, what: str, comm: str | None, pid: int | None, ts, msg) -> None:
        key = (kind, comm)
        d = self.acc.get(key)
        if d is None:
            if len(self.acc) >= MAX_REPORTS:
                self.dropped += 1
                self._cur = None
                return
            d = self.acc[key] = {"kind": kind, "what": what, "comm": comm, "pid": pid,
                                 "count": 0, "mods": [], "loaded": False, "first_s": ts,
                                 "last_s": ts, "sample": msg[:300]}
        d["count"] += 1
        d["last_s"] = ts
        self._cur, self._left = d, REPORT_LINES

    def feed(self, ts: float | None, msg: str) -> bool:
        m = _SOFT_RE.search(msg)
        if m:
            self._head("soft_lockup", f"soft lockup - CPU#{m.group(1)} stuck for "
                       f"{m.group(2)}s", m.group(3), int(m.group(4)), ts, msg)
            return True
        m = _HARD_RE.search(msg)
        if m:
            self._head("hard_lockup", f"hard LOCKUP on cpu {m.group(1)}", None, None, ts, msg)
            return True
        m = _RCU_RE.search(msg)
        if m:
            self._head("rcu_stall", f"{m.group(1)} stall", None, None, ts, msg)
            return True
        m = _BUG_RE.search(msg)
        if m and "blocked for more than" not in msg:
            self._head("bug", m.group(1).strip(), None, None, ts, msg)
            return True
        if self._cur is None:
            return False
        self._left -= 1
        if self._left < 0:
            self._cur = None
            return False
        d = self._cur
        mm = _MODULES_RE.search(msg)
        if mm:
            mods = {x.split("(")[0] for x in mm.group(1).split()}
            d["loaded"] = d["loaded"] or any(n in mods for n in NVIDIA_MODULES)
            return True
        cm = _COMM_RE.search(msg)
        if cm:
            if d["comm"] is None:
                d["comm"], d["pid"] = cm.group(2), int(cm.group(1))
            return True
        fm = _FRAME_RE.search(msg)
        if fm and fm.group(1) in NVIDIA_MODULES and fm.group(1) not in d["mods"]:
            d["mods"].append(fm.group(1))
        return bool(fm)

    def reports(self) -> list[Lockup]:
        return [Lockup(d["kind"], d["what"], d["comm"], d["pid"], d["count"], tuple(d["mods"]),
                       d["loaded"], d["first_s"], d["last_s"], d["sample"])
                for d in self.acc.values()]
