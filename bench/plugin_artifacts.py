#!/usr/bin/env python3
"""Compare ways to ship the kubectl plugin: size and `--help` start-up time.

Why: the plugin must run on a laptop with no matching Python; the choice in
scripts/build-plugin.sh (PyInstaller --onedir) rests on these numbers (docs/install.md).

Candidates, all from this work tree and the same pinned dependencies:
  onedir   PyInstaller --onedir  (scripts/build-plugin.sh --no-archive)
  onefile  PyInstaller --onefile (scripts/build-plugin.sh --kind onefile --no-archive)
  pex      pex of the project + its requirements (runs on a system CPython 3.11 only;
           first start extracts into ~/.pex, measured separately)
  zipapp   stdlib zipapp of the project + `pip install --target` of its requirements
           (runs on a system CPython; zipimport cannot load compiled extensions)
For each: size on disk, size gzipped (what users download), median wall time of `--help`,
`version`, and whether `import kubernetes.client` (what every cluster command needs) works.
Usage: .venv/bin/python bench/plugin_artifacts.py [--runs 7] [--skip-build]
"""
from __future__ import annotations

import argparse
import gzip
import io
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
import zipapp
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "build" / "plugin"


def sh(*argv: str, env: dict | None = None, **kw) -> str:
    return subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})}, **kw).stdout.strip()


def size_mib(path: Path) -> float:
    if path.is_file():
        return path.stat().st_size / 2**20
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink()) / 2**20


def gz_mib(path: Path) -> float:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=9, mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w") as tar:
            tar.add(path, arcname=path.name)
    return len(buf.getvalue()) / 2**20


def wall(cmd: list[str], runs: int, env: dict | None = None) -> tuple[float, bool]:
    times, ok = [], True
    for _ in range(runs):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           env={**os.environ, **(env or {})}, timeout=120)
        times.append(time.perf_counter() - t0)
        ok = ok and r.returncode == 0
    return statistics.median(times), ok


def build_pex(venv: Path) -> Path:
    out = BUILD / "pex" / "kubectl-gpu_doctor.pex"
    out.parent.mkdir(parents=True, exist_ok=True)
    sh(str(venv / "bin" / "pex"), ".", "-r", str(venv / "runtime-requirements.txt"),
       "-c", "kubectl-gpu_doctor", "-o", str(out), "--python", str(venv / "bin" / "python"))
    return out


def build_zipapp(venv: Path) -> Path:
    stage = BUILD / "zipapp" / "stage"
    shutil.rmtree(stage.parent, ignore_errors=True)
    stage.mkdir(parents=True)
    sh(str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", "--no-compile",
       "--target", str(stage), "-r", str(venv / "runtime-requirements.txt"))
    for pkg in ("kubectl_gpudoctor", "node_probe"):
        shutil.copytree(REPO / pkg, stage / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    out = BUILD / "zipapp" / "kubectl-gpu_doctor.pyz"
    zipapp.create_archive(stage, out, interpreter="/usr/bin/env python3",
                          main="kubectl_gpudoctor.launch:entrypoint", compressed=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--skip-build", action="store_true", help="reuse build/plugin/*")
    args = ap.parse_args()
    venv = Path(sh("scripts/build-plugin.sh", "--venv-only"))
    py = str(venv / "bin" / "python")  # a CPython 3.11 with nothing installed is what pex/zipapp need
    candidates: dict[str, tuple[list[str], Path, float]] = {}

    def timed_build(name: str, fn):
        t0 = time.perf_counter()
        artifact = fn()
        candidates[name] = (artifact[0], artifact[1], time.perf_counter() - t0)

    onedir = BUILD / "onedir" / "dist" / "kubectl-gpu_doctor"
    onefile = BUILD / "onefile" / "dist" / "kubectl-gpu_doctor"
    if args.skip_build:
        candidates["onedir"] = ([str(onedir / "kubectl-gpu_doctor")], onedir, float("nan"))
        candidates["onefile"] = ([str(onefile)], onefile, float("nan"))
        candidates["pex"] = ([py, str(BUILD / "pex" / "kubectl-gpu_doctor.pex")],
                             BUILD / "pex" / "kubectl-gpu_doctor.pex", float("nan"))
        candidates["zipapp"] = ([py, str(BUILD / "zipapp" / "kubectl-gpu_doctor.pyz")],
                                BUILD / "zipapp" / "kubectl-gpu_doctor.pyz", float("nan"))
    else:
        timed_build("onedir", lambda: ([sh("scripts/build-plugin.sh", "--no-archive")], onedir))
        timed_build("onefile", lambda: ([sh("scripts/build-plugin.sh", "--kind", "onefile", "--no-archive")],
                                        onefile))
        timed_build("pex", lambda: (lambda p: ([py, str(p)], p))(build_pex(venv)))
        timed_build("zipapp", lambda: (lambda p: ([py, str(p)], p))(build_zipapp(venv)))

    print(f"{'artifact':8} {'disk MiB':>9} {'gz MiB':>7} {'build s':>8} {'--help s':>9} "
          f"{'version s':>10} {'first run s':>12}  kubernetes.client")
    for name, (cmd, path, build_s) in candidates.items():
        first = float("nan")
        env = None
        if name == "pex":  # first start extracts into the pex root; measure it, then warm
            root = BUILD / "pex" / "root"
            shutil.rmtree(root, ignore_errors=True)
            env = {"PEX_ROOT": str(root)}
            first, _ = wall(cmd + ["--help"], 1, env)
        help_s, help_ok = wall(cmd + ["--help"], args.runs, env)
        ver_s, ver_ok = wall(cmd + ["version"], args.runs, env)
        if name in ("onedir", "onefile"):
            k8s = "bundled"
        else:  # the import every cluster command needs, from inside the artifact
            if name == "pex":
                r = subprocess.run([cmd[0], str(path), "-c", "import kubernetes.client"],
                                   capture_output=True, timeout=120,
                                   env={**os.environ, **(env or {}), "PEX_INTERPRETER": "1"})
            else:
                code = f"import sys; sys.path.insert(0, {str(path)!r}); import kubernetes.client"
                r = subprocess.run([cmd[0], "-c", code], capture_output=True, timeout=120)
            last = (r.stderr.decode().strip().splitlines() or ["?"])[-1]
            k8s = "ok" if r.returncode == 0 else "FAILS: " + last[:70]
        print(f"{name:8} {size_mib(path):9.1f} {gz_mib(path):7.1f} {build_s:8.1f} "
              f"{help_s:9.3f}{'' if help_ok else '!'} {ver_s:10.3f}{'' if ver_ok else '!'} {first:12.3f}  {k8s}")
    kubectl = shutil.which("kubectl")
    if kubectl:
        bindir = BUILD / "kubectl-path"
        shutil.rmtree(bindir, ignore_errors=True)
        bindir.mkdir(parents=True)
        (bindir / "kubectl-gpu_doctor").symlink_to(onedir / "kubectl-gpu_doctor")
        env = {"PATH": f"{bindir}:{os.environ['PATH']}"}
        direct, _ = wall([str(bindir / "kubectl-gpu_doctor"), "--help"], args.runs, env)
        via, ok = wall([kubectl, "gpu-doctor", "--help"], args.runs, env)
        print(f"kubectl dispatch (onedir, via krew-style symlink): direct {direct:.3f} s, "
              f"`kubectl gpu-doctor --help` {via:.3f} s{'' if ok else ' (FAILED)'}")
    print("('!' = the command exited non-zero)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
