"""The user side of bpf/include/ucall.h: library calls watched by entry + return uprobe pairs.

Why one place: nvml_calls and cuda_calls attach the same kind of programs (entry program N for
FUNCS[N], one return program for all) and read unfinished calls out of their map the same way;
a thread in a map of calls in progress is reported only while it still exists. Also used by
futex_wait (its map of waits in progress has the same thread key).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from node_probe.host import procfs
from .bundle import mono_to_wall


def func_name(funcs: Sequence[str], index: int) -> str:
    """FUNCS[index], or the number when the program reports one the loader does not know."""
    return funcs[index] if 0 <= index < len(funcs) else str(index)


def attach_pairs(b, path: str, funcs: Sequence[str], entry_prefix: str, return_fn: str,
                 pid: int) -> tuple[list[str], list[str]]:
    """Attach `<entry_prefix><N>` to the entry and `return_fn` to the return of each FUNCS[N]
    in the library at `path` (pid -1: every process). (functions attached, errors): a
    function this version of the library does not export is an error, not a failure."""
    done, errors = [], []
    for i, func in enumerate(funcs):
        try:
            b.attach_uprobe(name=path.encode(), sym=func.encode(),
                            fn_name=f"{entry_prefix}{i}".encode(), pid=pid)
            b.attach_uretprobe(name=path.encode(), sym=func.encode(),
                               fn_name=return_fn.encode(), pid=pid)
            done.append(func)
        except Exception as exc:   # symbol absent in this library version
            errors.append(f"{func}: {exc}")
    return done, errors


def live_threads(table, proc: Path = procfs.PROC) -> Iterator[tuple[int, int, Any]]:
    """(pid, tid, value) of a map keyed by bpf_get_current_pid_tgid(), for threads that still
    exist (a thread that died inside a call or wait has nothing left to report)."""
    for k, v in table.items():
        pid, tid = k.value >> 32, k.value & 0xFFFFFFFF
        if (proc / str(pid) / "task" / str(tid)).exists():
            yield pid, tid, v


def unfinished(table, funcs: Sequence[str], library: Callable[[int], str | None], now_ns: int,
               proc: Path = procfs.PROC) -> list[dict]:
    """Calls entered and not returned (a map of struct gd_ucall), as records."""
    return [{"pid": pid, "tid": tid, "comm": procfs.read_comm(pid, proc),
             "func": func_name(funcs, v.func), "library": library(pid), "returned": False,
             "duration_s": round((now_ns - v.ts) / 1e9, 6), "ts": mono_to_wall(v.ts)}
            for pid, tid, v in live_threads(table, proc)]
