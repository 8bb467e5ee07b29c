"""The client's contract, enforced: what kubectl_gpudoctor may import of node_probe, and that
API errors are decided where the response is read.

- `kubectl_gpudoctor` imports nothing of `node_probe` outside `node_probe.protocol` (records,
  catalog, render, version). The one named exception: the `local` command's frozen-build
  re-entry (`local.run_probe_here`) imports `node_probe.cli`, lazily (inside the function).
  Checked with `ast` over every client file: `import x`, `from x import y` (relative ones
  resolved), and `importlib.import_module("...")` / `__import__("...")` with a literal name.
- No call site compares an HTTP status number (`exc.status == 404`): `kube.py` turns answers
  into typed exceptions through `errors.api_error` once.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "kubectl_gpudoctor"
CONTRACT = "node_probe.protocol"
# (client file, module, must be lazy): the one deliberate exception
EXCEPTIONS = {("kubectl_gpudoctor/local.py", "node_probe.cli")}
# where a response is read and typed; nowhere else may compare status numbers
STATUS_READERS = {"kubectl_gpudoctor/kube.py", "kubectl_gpudoctor/errors.py"}


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
    src = (CLIENT / "local.py").read_text()
    uses = [(m, lazy) for m, _, lazy in imported_modules(src, "kubectl_gpudoctor/local.py")
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
    ("from node_probe.cli import main\n", "kubectl_gpudoctor/local.py"),  # not lazy
    ("def f():\n    from node_probe.cli import main\n", "kubectl_gpudoctor/cli.py"),
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
