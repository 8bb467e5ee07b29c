"""node_probe's import direction, enforced as the client's is (docs/architecture.md, "Layers of
the probe"; tests/kubectl/test_import_rule.py holds the machinery).

Inside node_probe imports run one way: __main__ -> cli, agent_idle -> watch -> checks -> engine
-> deviceplugin, tracing -> host -> kubeletapi -> protocol. A module imports its own part or
lower floors; two parts of one floor (deviceplugin, tracing) never import each other; no import
circle exists. The one named exception: engine.registry discovers the checks package (its
plugins) lazily, by iterating it. Before issue 29, host/ imported deviceplugin/ (the socket
owner lookup every resolver uses) and the rule was nowhere written down.
"""
from __future__ import annotations

import pytest

from tests.kubectl.test_import_rule import REPO, import_cycles, layer_violations

PKG = "node_probe"
LAYERS = {
    "__main__": 8,
    "cli": 7, "agent_idle": 7,
    "watch": 6,
    "checks": 5,
    "engine": 4,
    "deviceplugin": 3, "tracing": 3,
    "host": 2,
    "kubeletapi": 1,
    "__init__": 1,
    "protocol": 0,
}
# (importer, imported): allowed only as a lazy (function-level) import
EXCEPTIONS = frozenset({("node_probe.engine.registry", "node_probe.checks")})


def probe_files() -> list[tuple[str, str]]:
    files = sorted((REPO / PKG).rglob("*.py"))
    assert len(files) > 40, "the probe package moved?"
    return [(str(p.relative_to(REPO)), p.read_text()) for p in files]


def test_probe_imports_run_one_way():
    bad = layer_violations(probe_files(), LAYERS, PKG, EXCEPTIONS)
    assert bad == [], "\n".join(bad)


def test_no_import_circle_in_the_probe():
    assert import_cycles(probe_files(), PKG, EXCEPTIONS) == []


def test_every_part_of_the_probe_has_a_floor():
    parts = {p.stem if p.is_file() else p.name for p in (REPO / PKG).iterdir()
             if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())}
    assert parts - set(LAYERS) == set(), "place new parts of node_probe in LAYERS"


@pytest.mark.parametrize("files", [
    # a reader of the host reaching up into the device-plugin package (as host/layout did)
    [("node_probe/host/layout.py", "from node_probe.deviceplugin.discovery import find_owners\n"),
     ("node_probe/deviceplugin/discovery.py", "")],
    # tracing and deviceplugin share a floor: sideways is not down
    [("node_probe/tracing/libs.py", "def f():\n    from ..deviceplugin import rpc\n"),
     ("node_probe/deviceplugin/rpc.py", "")],
    # the protocol (shared with the client) importing anything of the probe
    [("node_probe/protocol/render.py", "from node_probe.host import procfs\n"),
     ("node_probe/host/procfs.py", "")],
    # the exception holds only lazily
    [("node_probe/engine/registry.py", "from node_probe import checks\n"),
     ("node_probe/checks/__init__.py", "")],
])
def test_the_rule_catches_upward_and_sideways_imports(files):
    assert layer_violations(files, LAYERS, PKG, EXCEPTIONS)


def test_the_exception_is_lazy_only():
    files = [("node_probe/engine/registry.py", "def f():\n    from node_probe import checks\n"),
             ("node_probe/checks/__init__.py", "")]
    assert layer_violations(files, LAYERS, PKG, EXCEPTIONS) == []
