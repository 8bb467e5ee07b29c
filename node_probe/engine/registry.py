"""The check registry: each check family registers itself here with a stable id.

Why: the runner, `--only/--skip`, the `checks` list in the report and the docs all need the same
list of checks; one decorator keeps them in one place. A check is a callable taking the
ProbeContext and returning (or yielding) Findings; it may also emit events/logs through the
context and publish facts for other checks.
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Callable, Iterable

from node_probe.engine.context import ProbeContext
from node_probe.protocol import Finding

CheckFn = Callable[[ProbeContext], "Iterable[Finding] | None"]


@dataclasses.dataclass(frozen=True)
class Check:
    id: str
    fn: CheckFn
    title: str
    timeout_s: float = 10.0
    provides: tuple[str, ...] = ()
    # "trace": runs for the eBPF window; the runner allows it trace_s + timeout_s.
    uses_trace_window: bool = False


_REGISTRY: dict[str, Check] = {}


def check(id: str, *, title: str, timeout_s: float = 10.0, provides: Iterable[str] = (),
          uses_trace_window: bool = False) -> Callable[[CheckFn], CheckFn]:
    """Register a check function under a stable dotted id."""

    def deco(fn: CheckFn) -> CheckFn:
        if id in _REGISTRY and _REGISTRY[id].fn is not fn:
            raise ValueError(f"check id {id!r} registered twice")
        _REGISTRY[id] = Check(id=id, fn=fn, title=title, timeout_s=timeout_s,
                              provides=tuple(provides), uses_trace_window=uses_trace_window)
        return fn

    return deco


def load_builtin_checks() -> None:
    """Import every module in node_probe.checks so their @check decorators run."""
    from node_probe import checks as pkg

    for mod in pkgutil.iter_modules(pkg.__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{pkg.__name__}.{mod.name}")


def all_checks() -> list[Check]:
    load_builtin_checks()
    return sorted(_REGISTRY.values(), key=lambda c: c.id)


def select(only: Iterable[str] = (), skip: Iterable[str] = ()) -> list[Check]:
    """Checks chosen by --only / --skip; an id matches itself and its dotted children."""
    only, skip = tuple(only), tuple(skip)
    known = all_checks()
    ids = {c.id for c in known}
    for name in (*only, *skip):
        if not any(i == name or i.startswith(name + ".") for i in ids):
            raise KeyError(name)

    def match(cid: str, names: tuple[str, ...]) -> bool:
        return any(cid == n or cid.startswith(n + ".") for n in names)

    return [c for c in known if (not only or match(c.id, only)) and not match(c.id, skip)]
