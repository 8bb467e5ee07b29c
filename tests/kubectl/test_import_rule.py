"""The client's contract, enforced: what kubectl_gpudoctor may import of node_probe, and that
API errors are decided where the response is read.

- `kubectl_gpudoctor` imports nothing of `node_probe` outside `node_probe.protocol` (records,
  catalog, render, version). The one named exception: the `local` command's frozen-build
  re-entry (`local.run_probe_here`) imports `node_probe.cli`, lazily (inside the function).
  Checked with `ast` over every client file: `import x`, `from x import y` (relative ones
  resolved), and `importlib.import_module("...")` / `__import__("...")` with a literal name.
- No call site compares an HTTP status number (`exc.status == 404`): `api/kube.py` turns answers
  into typed exceptions through `errors.api_error` once.
- Inside the client, imports run one way (docs/architecture.md, "Layers"): cli -> commands ->
  session -> reach -> report -> api -> analysis -> the base modules (errors, params, build_info)
  -> node_probe.protocol. A module imports its own layer or lower ones; two layers on one floor
  never import each other; and no import circle exists anywhere in the package (lazy imports
  count: a circle through a function-level import is still a circle).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "kubectl_gpudoctor"
CONTRACT = "node_probe.protocol"
# (client file, module, must be lazy): the one deliberate exception
EXCEPTIONS = {("kubectl_gpudoctor/reach/localproc.py", "node_probe.cli")}
# where a response is read and typed; nowhere else may compare status numbers
STATUS_READERS = {"kubectl_gpudoctor/api/kube.py", "kubectl_gpudoctor/errors.py"}


def _module_of(rel: str) -> str:
    parts = list(Path(rel).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, rel: str) -> list[tuple[str, int, bool]]:
    """(absolute module, line, inside a function?) for every import in `source`."""
    tree = ast.parse(source)
    pkg = _module_of(rel).split(".")
    if not rel.endswith("__init__.py"):
        pkg = pkg[:-1]
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                               ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, lazy) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = pkg[:len(pkg) - child.level + 1]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                # `from node_probe import cli` imports node_probe.cli
                found.extend((f"{mod}.{a.name}" if a.name != "*" else mod, child.lineno, lazy)
                             for a in child.names)
                found.append((mod, child.lineno, lazy))
            elif isinstance(child, ast.Call):
                f = child.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if name in ("import_module", "__import__") and child.args:
                    arg = child.args[0]
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        found.append((arg.value, child.lineno, lazy))
                    else:
                        found.append(("<dynamic import>", child.lineno, lazy))
            visit(child, inner)

    visit(tree, False)
    return found


def violations(source: str, rel: str) -> list[str]:
    bad = []
    for mod, line, lazy in imported_modules(source, rel):
        if mod == "<dynamic import>":
            bad.append(f"{rel}:{line}: import of a computed module name")
            continue
        if mod != "node_probe" and not mod.startswith("node_probe."):
            continue
        if mod == CONTRACT or mod.startswith(CONTRACT + "."):
            continue
        if mod == "node_probe" and _is_from_import_base(source, line):
            continue  # `from node_probe import protocol`: the names are checked one by one
        if lazy and any(rel == r and (mod == m or mod.startswith(m + "."))
                        for r, m in EXCEPTIONS):
            continue
        bad.append(f"{rel}:{line}: imports {mod}")
    return bad


def _is_from_import_base(source: str, line: int) -> bool:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.lineno == line and node.module == \
                "node_probe" and not node.level:
            return True
    return False


def status_comparisons(source: str, rel: str) -> list[str]:
    """`<x>.status == 404`, `<x>.status in (401, 403)`, ... outside the status readers."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        has_status = any(isinstance(s, ast.Attribute) and s.attr == "status" for s in sides)
        has_number = any(
            (isinstance(s, ast.Constant) and isinstance(s.value, int)) or
            (isinstance(s, (ast.Tuple, ast.List, ast.Set)) and any(
                isinstance(e, ast.Constant) and isinstance(e.value, int) for e in s.elts))
            for s in sides)
        if has_status and has_number:
            bad.append(f"{rel}:{node.lineno}: compares .status with a number")
    return bad


def client_files() -> list[tuple[str, str]]:
    files = sorted(CLIENT.rglob("*.py"))
    assert len(files) > 15, "the client package moved?"
    return [(str(p.relative_to(REPO)), p.read_text()) for p in files]


def test_client_imports_only_the_protocol_of_node_probe():
    bad = [v for rel, src in client_files() for v in violations(src, rel)]
    assert bad == [], "\n".join(bad)


def test_the_one_exception_is_there_and_lazy():
    src = (CLIENT / "reach" / "localproc.py").read_text()
    uses = [(m, lazy) for m, _, lazy in imported_modules(src, "kubectl_gpudoctor/reach/localproc.py")
            if m.startswith("node_probe.cli")]
    assert uses and all(lazy for _, lazy in uses)


def test_no_call_site_compares_status_numbers():
    bad = [v for rel, src in client_files() if rel not in STATUS_READERS
           for v in status_comparisons(src, rel)]
    assert bad == [], "\n".join(bad)
    text = "".join(src for _, src in client_files())
    assert "raise_for" not in text and "AssertionError(\"unreachable\")" not in text


@pytest.mark.parametrize("source,rel", [
    ("import node_probe.engine.runner\n", "kubectl_gpudoctor/x.py"),
    ("import node_probe\n", "kubectl_gpudoctor/x.py"),
    ("from node_probe import engine\n", "kubectl_gpudoctor/x.py"),
    ("from node_probe import __version__\n", "kubectl_gpudoctor/x.py"),
    ("from node_probe.host import procfs\n", "kubectl_gpudoctor/analysis/x.py"),
    ("from ..node_probe import cli\n", "kubectl_gpudoctor/x.py"),  # resolves to node_probe
    ("import importlib\nm = importlib.import_module('node_probe.checks.nvml')\n",
     "kubectl_gpudoctor/x.py"),
    ("def f():\n    return __import__('node_probe.engine')\n", "kubectl_gpudoctor/x.py"),
    ("import importlib\nname = 'node_probe.' + 'cli'\nimportlib.import_module(name)\n",
     "kubectl_gpudoctor/x.py"),
    ("from node_probe.cli import main\n", "kubectl_gpudoctor/reach/localproc.py"),  # not lazy
    ("def f():\n    from node_probe.cli import main\n", "kubectl_gpudoctor/cli/parser.py"),
])
def test_the_rule_catches_every_form(source, rel):
    assert violations(source, rel), source


@pytest.mark.parametrize("source", [
    "from node_probe.protocol import catalog\n",
    "from node_probe import protocol\n",
    "import node_probe.protocol.render as r\n",
    "from node_probe.protocol.version import __version__\n",
    "from . import errors\nfrom .analysis import common\n",
    "import importlib\nimportlib.import_module('node_probe.protocol.catalog')\n",
])
def test_the_rule_allows_the_contract(source):
    assert violations(source, "kubectl_gpudoctor/x.py") == []


def test_the_status_rule_catches_comparisons():
    assert status_comparisons("if exc.status == 404:\n    pass\n", "x.py")
    assert status_comparisons("ok = e.status in (401, 403)\n", "x.py")
    assert status_comparisons("ok = 500 == e.status\n", "x.py")
    assert not status_comparisons("ok = isinstance(e, NotFound)\n", "x.py")


# -- layers inside the client ----------------------------------------------------------------

# floor of each part of the client (higher imports lower; one floor never imports another part
# of the same floor). A new subpackage or top-level module must be placed here explicitly.
LAYERS = {
    "__main__": 9, "launch": 8, "cli": 7,
    "commands": 6,
    "session": 5,
    "reach": 4,
    "report": 3,
    "api": 2,
    "analysis": 1,
    "errors": 0, "params": 0, "build_info": 0, "__init__": 0,
}
PKG = "kubectl_gpudoctor"


def part_of(module: str) -> str:
    """`kubectl_gpudoctor.reach.debugpod` -> `reach`; `kubectl_gpudoctor` -> `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def client_edges(files: list[tuple[str, str]], pkg: str = PKG) -> list[tuple[str, str, int, bool]]:
    """(importer module, imported module of `pkg`, line, lazy?) for every import inside `pkg`
    (the client by default; tests/core/test_probe_import_rule.py asks the same of node_probe)."""
    known = {_module_of(rel) for rel, _ in files}
    edges = []
    for rel, src in files:
        me = _module_of(rel)
        for mod, line, lazy in imported_modules(src, rel):
            if mod != pkg and not mod.startswith(pkg + "."):
                continue
            # `from pkg import name`: the module pkg.name when it exists, else pkg itself
            while mod not in known and "." in mod:
                mod = mod.rsplit(".", 1)[0]
            if mod != me:
                edges.append((me, mod, line, lazy))
    return edges


def layer_violations(files: list[tuple[str, str]], layers: dict = LAYERS, pkg: str = PKG,
                     exceptions=frozenset()) -> list[str]:
    """Imports that do not run downward through `layers`; `exceptions` holds (importer, imported)
    module pairs allowed as lazy imports only."""
    bad = []
    for me, mod, line, lazy in client_edges(files, pkg):
        a, b = part_of(me), part_of(mod)
        if a not in layers or b not in layers:
            bad.append(f"{me}:{line}: {a if a not in layers else b} has no floor in LAYERS")
        elif a != b and layers[b] >= layers[a] and not (lazy and (me, mod) in exceptions):
            bad.append(f"{me}:{line}: imports {mod} ({b}, floor {layers[b]}) from {a} "
                       f"(floor {layers[a]}): imports run downward only")
    return bad


def import_cycles(files: list[tuple[str, str]], pkg: str = PKG,
                  exceptions=frozenset()) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan, iterative); the lazy
    `exceptions` edges (importer, imported) of layer_violations are left out."""
    graph: dict[str, set[str]] = {}
    for me, mod, _, lazy in client_edges(files, pkg):
        if lazy and (me, mod) in exceptions:
            continue
        graph.setdefault(me, set()).add(mod)
        graph.setdefault(mod, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_client_imports_run_one_way():
    bad = layer_violations(client_files())
    assert bad == [], "\n".join(bad)


def test_no_import_circle_in_the_client():
    assert import_cycles(client_files()) == []


def test_every_part_of_the_client_has_a_floor():
    parts = {p.stem if p.is_file() else p.name for p in CLIENT.iterdir()
             if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())}
    assert parts - set(LAYERS) == set(), "place new parts of the client in LAYERS"


def test_the_client_top_level_stays_small():
    """At most 8 entries besides the subpackages (issue 20): new code goes into a package."""
    top = [p.name for p in CLIENT.iterdir() if p.suffix == ".py"]
    assert len(top) <= 8, sorted(top)


@pytest.mark.parametrize("files", [
    # an upward import: the API layer reaching into a command
    [("kubectl_gpudoctor/api/kube.py", "from ..commands import node\n"),
     ("kubectl_gpudoctor/commands/node.py", "")],
    # analysis importing the report
    [("kubectl_gpudoctor/analysis/fit.py", "from ..report.output import Output\n"),
     ("kubectl_gpudoctor/report/output.py", "")],
    # a sideways import between two parts of one floor... none share one now; reach -> session
    [("kubectl_gpudoctor/reach/debugpod.py", "def f():\n    from .. import session\n"),
     ("kubectl_gpudoctor/session.py", "")],
    # base module importing a layer above it
    [("kubectl_gpudoctor/errors.py", "from .report import bundle\n"),
     ("kubectl_gpudoctor/report/bundle.py", "")],
])
def test_the_layer_rule_catches_upward_imports(files):
    assert layer_violations(files)


def test_the_cycle_check_finds_circles_lazy_or_not():
    files = [("kubectl_gpudoctor/analysis/dra.py", "from .goroutines import func_name\n"),
             ("kubectl_gpudoctor/analysis/goroutines.py",
              "def f():\n    from .dra import analyze_goroutines\n")]
    assert import_cycles(files) == [["kubectl_gpudoctor.analysis.dra",
                                     "kubectl_gpudoctor.analysis.goroutines"]]
    assert import_cycles(files[:1]) == []
