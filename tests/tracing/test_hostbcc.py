"""A Python without bcc (the frozen krew plugin, a venv) imports the host's python3-bpfcc, and
only one that root alone can write (node_probe/tracing/hostbcc.py).

The positive case is the real thing: Debian's python3-bpfcc under /usr/lib/python3/dist-packages,
imported by a CPython started with -S (no site-packages on sys.path, as in a venv without system
site packages or the frozen interpreter), which then compiles a real program with it."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from node_probe.tracing import hostbcc
from tests.tracing.conftest import REPO

DEBIAN_BCC = Path("/usr/lib/python3/dist-packages/bcc")

# a child whose sys.path lacks every site-packages: `import bcc` fails there, as in the frozen
# plugin; hostbcc must find the host's package and its BPF must compile a program
CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
try:
    import bcc
    print(json.dumps({"own": bcc.__file__})); sys.exit(0)
except ImportError:
    pass
from node_probe.tracing import hostbcc
module, from_host, why = hostbcc.import_bcc()
out = {"from_host": from_host, "why": why, "file": module and module.__file__}
if module is not None and sys.argv[2] == "compile":
    from bcc import BPF
    b = BPF(text=b"int f(void *ctx) { return 0; }")
    out["compiled"] = b.load_func(b"f", BPF.KPROBE).fd > 0
print(json.dumps(out))
"""


def _child(mode: str) -> dict:
    r = subprocess.run([sys.executable, "-S", "-c", CHILD, str(REPO), mode],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


def test_a_python_without_bcc_imports_the_hosts_package():
    if not (DEBIAN_BCC / "__init__.py").is_file():
        pytest.skip("Debian's python3-bpfcc is not installed here")
    got = _child("import")
    assert "own" not in got, "this Python finds bcc without site-packages: cannot show the path"
    assert got["from_host"] is True, got["why"]
    assert got["file"] == str(DEBIAN_BCC / "__init__.py")


@pytest.mark.root
@pytest.mark.bcc
def test_the_hosts_bcc_compiles_and_loads_a_program():
    if os.geteuid() != 0 or not (DEBIAN_BCC / "__init__.py").is_file():
        pytest.skip("needs root and Debian's python3-bpfcc")
    got = _child("compile")
    assert got["from_host"] is True and got["compiled"] is True, got


@pytest.fixture()
def root_only(tmp_path: Path):
    """A directory only root can write, with every directory above it (/run/gd-hostbcc-*):
    so what is judged is the planted package itself, not /tmp's mode."""
    if os.geteuid() != 0:
        pytest.skip("needs root (a root-only directory, chown)")
    d = Path(tempfile.mkdtemp(prefix="gd-hostbcc-", dir="/run"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _planted(tmp_path: Path, owner: int | None = None, mode: int = 0o755) -> tuple[Path, Path]:
    """A site dir holding a `bcc` package whose import would leave a marker file."""
    site = tmp_path / "site"
    pkg = site / "bcc"
    pkg.mkdir(parents=True)
    marker = tmp_path / "ran"
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\nBPF = object\n")
    os.chmod(pkg, mode)
    if owner is not None:
        os.chown(pkg, owner, owner)
    return site, marker


def _isolated_import(site: Path) -> tuple:
    """import_bcc in this process with only `site` searched (bcc itself hidden first)."""
    saved = {n: m for n, m in sys.modules.items() if n == "bcc" or n.startswith("bcc.")}
    for n in saved:
        del sys.modules[n]
    blocked = sys.path[:]
    sys.path[:] = [p for p in sys.path if "dist-packages" not in p and "site-packages" not in p]
    try:
        return hostbcc.import_bcc((str(site),))
    finally:
        sys.path[:] = blocked
        for n in [n for n in sys.modules if n == "bcc" or n.startswith("bcc.")]:
            del sys.modules[n]
        sys.modules.update(saved)


def test_a_package_someone_else_owns_is_never_imported(root_only: Path):
    """A bcc dir owned by nobody: refused with the reason, and its code never runs."""
    site, marker = _planted(root_only, owner=65534)
    module, from_host, why = _isolated_import(site)
    assert module is None and from_host is False
    assert f"not importing {site / 'bcc'}" in why
    assert f"{site / 'bcc'} is owned by uid 65534, not root" in why
    assert not marker.exists()


def test_a_group_writable_package_dir_is_refused(root_only: Path):
    site, marker = _planted(root_only, mode=0o775)
    why = hostbcc.check_dir(site / "bcc")
    assert why == f"{site / 'bcc'} is writable by group or others (mode 775)"
    module, _, _ = _isolated_import(site)
    assert module is None and not marker.exists()


def test_a_module_linked_in_from_elsewhere_is_refused(root_only: Path, tmp_path: Path):
    """Every module is judged, not only the directory: a symlinked one is refused."""
    site, marker = _planted(root_only)
    (tmp_path / "table.py").write_text("X = 1\n")
    (site / "bcc" / "table.py").symlink_to(tmp_path / "table.py")
    assert hostbcc.check_dir(site / "bcc") == f"{site / 'bcc' / 'table.py'} is a symlink"
    assert _isolated_import(site)[0] is None and not marker.exists()


def test_under_a_world_writable_dir_nothing_is_imported(tmp_path: Path):
    """/tmp (mode 1777): anyone could have swapped what lies below."""
    site, marker = _planted(tmp_path)
    why = hostbcc.check_dir(site / "bcc")
    assert why.startswith("/tmp is writable by group or others"), why
    assert _isolated_import(site)[0] is None and not marker.exists()


def test_no_host_package_says_where_it_looked(tmp_path: Path):
    module, from_host, why = _isolated_import(tmp_path / "nothing-here")
    assert module is None and from_host is False
    assert "No module named 'bcc'" in why and f"no host python3-bpfcc in {tmp_path}" in why
