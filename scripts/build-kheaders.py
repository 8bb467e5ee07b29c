#!/usr/bin/env python3
"""The probe's bundled kernel header set: only the files BCC reads to compile bpf/*.bpf.c.

Why: GKE's Container-Optimized OS, Bottlerocket, Talos, Flatcar and many driver-container
nodes have no kernel headers and no /sys/kernel/kheaders.tar.xz, and BCC compiles our programs
on the node. The programs only read syscall tracepoint arguments (layout checked against the
running kernel's tracefs format files), user memory and BPF helpers, so any recent header set
compiles them; the probe image carries the ~150 files of Debian's linux-headers that a real
compile opens, pinned by packaging/kheaders.manifest (sha256 per file), instead of the whole
package (~60 MB) or the files themselves in git.

    build-kheaders.py trace            re-trace a compile (strace) against the installed headers
                                       and rewrite packaging/kheaders.manifest (root, BCC, strace)
    build-kheaders.py build DEST       copy the manifest's files from the pinned Debian packages
                                       (installed under /usr/src, else `apt-get download`) into
                                       DEST, check every sha256, write DEST/metadata.json
    build-kheaders.py check DIR        exit 0 if DIR is a complete set matching the manifest

Stdlib only; the trace step imports node_probe from this checkout to get the exact compile unit.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MANIFEST = REPO / "packaging" / "kheaders.manifest"
META = "metadata.json"
MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}   # Debian arch -> uname -m
MAX_TRACE_BYTES = 64 << 20           # strace output cap
_OPEN_RE = re.compile(r'^\d+\s+open(?:at)?\((?:AT_FDCWD, )?"([^"]+)".*\)\s+=\s+\d+')

# What the child compiles under strace: the bundle the probe compiles, and each program alone
# (every file compiles on its own too), so the set covers both.
_COMPILE = r"""
import sys
from node_probe.tracing import session
from node_probe.tracing.loader import TraceConfig
for loaders in [session.LOADERS, *[(c,) for c in session.LOADERS]]:
    s = session.TraceSession(TraceConfig(), tracefs="/sys/kernel/tracing", loaders=loaders)
    s.compile()
    s.close()
print("compiled", file=sys.stderr)
"""


def die(msg: str, code: int = 1) -> "None":
    print(f"build-kheaders: {msg}", file=sys.stderr)
    sys.exit(code)


# --- the manifest ----------------------------------------------------------------------------
def read_manifest(path: Path = MANIFEST) -> tuple[dict, list[tuple[str, str]]]:
    """({abi, arch, packages: [(name, version)]}, [(sha256, relpath)])."""
    head: dict = {"packages": []}
    files: list[tuple[str, str]] = []
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            m = re.match(r"#\s*(\w+):\s*(.+)$", line)
            if m and m.group(1) == "package":
                name, version = m.group(2).split()
                head["packages"].append((name, version))
            elif m:
                head[m.group(1)] = m.group(2).strip()
        elif line.strip():
            digest, rel = line.split(None, 1)
            files.append((digest, rel.strip()))
    return head, files


def write_manifest(abi: str, arch: str, packages: list[tuple[str, str]],
                   files: list[tuple[str, str]], path: Path = MANIFEST) -> None:
    lines = ["# Kernel headers BCC opens to compile bpf/*.bpf.c (the probe's bundle and each",
             "# program alone), traced with strace by `scripts/build-kheaders.py trace`.",
             "# Do not edit by hand: re-trace after adding an #include to bpf/.",
             f"# abi: {abi}", f"# arch: {arch}"]
    lines += [f"# package: {n} {v}" for n, v in packages]
    lines += [f"{d}  {rel}" for d, rel in sorted(files, key=lambda x: x[1])]
    path.write_text("\n".join(lines) + "\n")


# --- the Debian packages ---------------------------------------------------------------------
def installed_version(pkg: str) -> str | None:
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status} ${Version}", pkg],
                       capture_output=True, text=True, timeout=30)
    parts = r.stdout.split()
    if r.returncode == 0 and parts[:3] == ["install", "ok", "installed"] and len(parts) == 4:
        return parts[3]
    return None


def package_dirs(head: dict, workdir: Path, download: bool = True) -> list[Path]:
    """The header directories of the pinned packages, build (-<arch>) before source (-common):
    the installed ones when the pinned versions are installed, else downloaded and unpacked."""
    dirs = []
    for name, version in head["packages"]:
        d = Path("/usr/src") / name
        if installed_version(name) == version and d.is_dir():
            dirs.append(d)
            continue
        if not download:
            die(f"{name} {version} is not installed under {d}")
        dl = workdir / "deb"
        dl.mkdir(exist_ok=True)
        r = subprocess.run(["apt-get", "download", f"{name}={version}"], cwd=dl,
                           capture_output=True, text=True, timeout=600)
        debs = sorted(dl.glob(f"{name}_*.deb"))
        if r.returncode != 0 or not debs:
            die(f"{name} {version} is neither installed nor downloadable "
                f"({r.stderr.strip()[-300:]}); the pinned version may have left the mirror: "
                f"fetch it from snapshot.debian.org or re-trace against a current one")
        root = workdir / "x" / name
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(root)], check=True, timeout=600)
        dirs.append(root / "usr/src" / name)
    return dirs


def find_in(dirs: list[Path], rel: str) -> Path | None:
    """The file BCC's merged view (build over source) shows at `rel`."""
    for d in dirs:
        p = d / rel
        if p.is_file():
            return p
    return None


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- trace -----------------------------------------------------------------------------------
def cmd_trace(args) -> None:
    if os.geteuid() != 0:
        die("tracing a BCC compile needs root")
    if not shutil.which("strace"):
        die("strace is not installed (apt-get install strace)")
    abi = args.abi
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                          check=True).stdout.strip()
    packages = []
    for name in (f"linux-headers-{abi}-{arch}", f"linux-headers-{abi}-common"):
        v = installed_version(name)
        if v is None:
            die(f"{name} is not installed (apt-get install {name})")
        packages.append((name, v))
    dirs = [Path("/usr/src") / n for n, _ in packages]
    sys.path.insert(0, str(REPO))
    from node_probe.tracing.bcc_env import merged_tree
    with tempfile.TemporaryDirectory(prefix="gpu-doctor-kheaders-trace-") as tmp:
        tree = merged_tree(dirs[0], dirs[1], Path(tmp) / "tree")
        out = Path(tmp) / "strace.txt"
        env = dict(os.environ, BCC_KERNEL_SOURCE=str(tree),
                   PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        r = subprocess.run(["strace", "-f", "-z", "-qq", "-e", "trace=open,openat", "-o", str(out),
                            args.python, "-c", _COMPILE], env=env, capture_output=True,
                           text=True, timeout=300)
        if r.returncode != 0 or "compiled" not in r.stderr:
            die(f"the traced compile failed: {r.stderr.strip()[-1500:]}")
        if out.stat().st_size > MAX_TRACE_BYTES:
            die(f"strace output over {MAX_TRACE_BYTES} bytes")
        rels: set[str] = set()
        with out.open(errors="replace") as f:
            for line in f:
                m = _OPEN_RE.match(line)
                if not m:
                    continue
                p = m.group(1)
                if p.startswith(str(tree) + "/"):
                    p = p[len(str(tree)) + 1:]
                elif p.startswith("/"):
                    continue              # libraries, python, /proc: not the headers
                p = os.path.normpath(p)
                if (tree / p).is_file():   # opened relative to BCC's cwd, the header tree
                    rels.add(p)
    if not rels:
        die("the trace saw no header opens (did BCC use another header directory?)")
    files = []
    for rel in sorted(rels):
        src = find_in(dirs, rel)
        if src is None:
            die(f"traced {rel} is not in {dirs}")
        files.append((sha256(src), rel))
    out = Path(args.output) if args.output else MANIFEST
    write_manifest(abi, arch, packages, files, out)
    print(f"{out}: {len(files)} files, "
          f"{sum(find_in(dirs, r).stat().st_size for _, r in files)} bytes", file=sys.stderr)


# --- build / check ---------------------------------------------------------------------------
def upstream_version(debian_version: str) -> str:
    """6.1.192-2 -> 6.1.192 (the kernel.org release the package was built from)."""
    return debian_version.split("-", 1)[0].split("+", 1)[0]


def cmd_build(args) -> None:
    head, files = read_manifest()
    dest = Path(args.dest)
    with tempfile.TemporaryDirectory(prefix="gpu-doctor-kheaders-build-") as tmp:
        dirs = package_dirs(head, Path(tmp), download=not args.no_download)
        dest.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".kheaders-", dir=dest.parent))
        try:
            total = 0
            for digest, rel in files:
                src = find_in(dirs, rel)
                if src is None:
                    die(f"{rel} is missing from {', '.join(map(str, dirs))}")
                got = sha256(src)
                if got != digest:
                    die(f"{rel}: sha256 {got} differs from the manifest's {digest}")
                out = stage / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, out)
                total += out.stat().st_size
            build_pkg = head["packages"][0]
            meta = {
                "format": 1,
                "kernel_version": upstream_version(build_pkg[1]),
                "abi": head["abi"],
                "arch": head["arch"],
                "machine": MACHINES.get(head["arch"], head["arch"]),   # os.uname().machine
                "packages": [f"{n} {v}" for n, v in head["packages"]],
                "files": len(files),
                "bytes": total,
                "manifest_sha256": sha256(MANIFEST),
            }
            (stage / META).write_text(json.dumps(meta, indent=1) + "\n")
            os.chmod(stage, 0o755)
            if dest.exists():
                shutil.rmtree(dest)
            stage.rename(dest)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
    print(f"{dest}: Linux {meta['kernel_version']} headers ({meta['abi']}, {meta['arch']}), "
          f"{meta['files']} files, {meta['bytes']} bytes", file=sys.stderr)


def cmd_check(args) -> None:
    d = Path(args.dir)
    _head, files = read_manifest()
    try:
        meta = json.loads((d / META).read_text())
    except (OSError, ValueError) as exc:
        die(f"{d / META}: {exc}")
    if meta.get("manifest_sha256") != sha256(MANIFEST):
        die(f"{d} was built from another manifest")
    for digest, rel in files:
        p = d / rel
        if not p.is_file() or sha256(p) != digest:
            die(f"{d}: {rel} missing or changed")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("trace", help="re-trace a compile and rewrite the manifest")
    t.add_argument("--abi", default="6.1.0-56", help="Debian kernel ABI of the headers to trace")
    t.add_argument("--python", default=sys.executable, help="a Python that can import bcc")
    t.add_argument("--output", help="write the manifest here instead of packaging/")
    b = sub.add_parser("build", help="build the set into DEST from the pinned packages")
    b.add_argument("dest")
    b.add_argument("--no-download", action="store_true",
                   help="only from the installed packages (no apt-get download)")
    c = sub.add_parser("check", help="is DIR a complete set matching the manifest")
    c.add_argument("dir")
    args = ap.parse_args(argv)
    {"trace": cmd_trace, "build": cmd_build, "check": cmd_check}[args.cmd](args)


if __name__ == "__main__":
    main()
