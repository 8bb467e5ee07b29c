"""The check registry: each check family registers itself here with a stable id.

Why: the runner, `--only/--skip`, the `checks` list in the report and the docs all need the same
list of checks; one decorator keeps them in one place. A check is a callable taking the
ProbeContext and returning (or yielding) Findings; it may also emit events/logs through the
context and publish facts for other checks.

Facts are declared with keys from engine.facts: `provides=` what the check publishes, `needs=`
facts it cannot do its job without (selecting the check pulls their producers into the run),
`uses=` facts it reads when their producer happens to run (never pulled in: the cgroup audit
uses the device plugin's pod-resources rows if the deviceplugin check runs, but `--only
cgroup.devices` must not start RPCs to every plugin). A key that is not declared is an error
here, at import, not a silent wait at run time.
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Callable, Iterable

from node_probe.engine import facts
from node_probe.engine.context import ProbeContext
from node_probe.engine.facts import FactKey
from node_probe.protocol import Finding

CheckFn = Callable[[ProbeContext], "Iterable[Finding] | None"]


@dataclasses.dataclass(frozen=True)
class Check:
    id: str
    fn: CheckFn
    title: str
    timeout_s: float = 10.0
    provides: tuple[FactKey, ...] = ()
    needs: tuple[FactKey, ...] = ()   # producers are pulled into the run
    uses: tuple[FactKey, ...] = ()    # read if their producer runs
    # "trace": runs for the eBPF window; the runner allows it trace_s + timeout_s.
    uses_trace_window: bool = False

    def __post_init__(self) -> None:
        for name in ("provides", "needs", "uses"):
            object.__setattr__(self, name, facts.resolve_all(getattr(self, name)))


_REGISTRY: dict[str, Check] = {}


def check(id: str, *, title: str, timeout_s: float = 10.0,
          provides: Iterable[FactKey | str] = (), needs: Iterable[FactKey | str] = (),
          uses: Iterable[FactKey | str] = (),
          uses_trace_window: bool = False) -> Callable[[CheckFn], CheckFn]:
    """Register a check function under a stable dotted id. facts.UnknownFact if a key in
    `provides`/`needs`/`uses` is not declared in engine.facts; ValueError if a fact would get a
    second producer."""

    def deco(fn: CheckFn) -> CheckFn:
        if id in _REGISTRY and _REGISTRY[id].fn is not fn:
            raise ValueError(f"check id {id!r} registered twice")
        c = Check(id=id, fn=fn, title=title, timeout_s=timeout_s, provides=tuple(provides),
                  needs=tuple(needs), uses=tuple(uses), uses_trace_window=uses_trace_window)
        for key in c.provides:
            other = next((o.id for o in _REGISTRY.values()
                          if o.id != id and key in o.provides), None)
            if other is not None:
                raise ValueError(f"fact {key.name!r} provided by both {other!r} and {id!r}")
        _REGISTRY[id] = c
        return fn

    return deco


def producer_of(key: FactKey) -> Check | None:
    """The registered check that provides this fact."""
    load_builtin_checks()
    return next((c for c in _REGISTRY.values() if key in c.provides), None)


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
    """Checks chosen by --only / --skip; an id matches itself and its dotted children. The
    producers of what a chosen check `needs` join the run (transitively) unless skipped."""
    only, skip = tuple(only), tuple(skip)
    known = all_checks()
    ids = {c.id for c in known}
    for name in (*only, *skip):
        if not any(i == name or i.startswith(name + ".") for i in ids):
            raise KeyError(name)

    def match(cid: str, names: tuple[str, ...]) -> bool:
        return any(cid == n or cid.startswith(n + ".") for n in names)

    chosen = {c.id for c in known if (not only or match(c.id, only)) and not match(c.id, skip)}
    by_id = {c.id: c for c in known}
    by_fact = {key.name: c for c in known for key in c.provides}
    todo = list(chosen)
    while todo:
        c = by_id[todo.pop()]
        for key in c.needs:
            p = by_fact.get(key.name)
            if p is not None and p.id not in chosen and not match(p.id, skip):
                chosen.add(p.id)
                todo.append(p.id)
    return [c for c in known if c.id in chosen]
