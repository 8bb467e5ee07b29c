#!/usr/bin/env python3
"""The probe's bundled kernel header set: only the files BCC reads to compile bpf/*.bpf.c.

Why: GKE's Container-Optimized OS, Bottlerocket, Talos, Flatcar and many driver-container
nodes have no kernel headers and no /sys/kernel/kheaders.tar.xz, and BCC compiles our programs
on the node. The programs only read syscall tracepoint arguments (layout checked against the
running kernel's tracefs format files), user memory and BPF helpers, so any recent header set
compiles them; the probe image carries the ~150 files of Debian's linux-headers that a real
compile opens, pinned by packaging/kheaders-<arch>.manifest (sha256 per file), instead of the
whole package (~60 MB) or the files themselves in git. One manifest per Debian architecture
(amd64, arm64): the arch/<x86|arm64> headers differ.

    build-kheaders.py trace [--arch A]  re-trace a compile (strace) against the pinned headers
                                        and rewrite packaging/kheaders-A.manifest (root, BCC,
                                        strace). Another architecture's headers are traced with
                                        BCC's own cross-compile switch (ARCH=arm64: clang target
                                        aarch64, arch/arm64 includes, -D__TARGET_ARCH_arm64)
    build-kheaders.py build DEST [--arch A]
                                        copy the manifest's files from the pinned Debian packages
                                        into DEST, check every sha256, write DEST/metadata.json
    build-kheaders.py check DIR         exit 0 if DIR is a complete set matching its manifest

Where the packages come from, in order: installed under /usr/src (the build machine's arch),
the download cache ($GPU_DOCTOR_CACHE/kheaders-debs), `apt-get download` (another arch through
a private apt state for that arch: the machine's own apt configuration is not touched), and
last the .deb's pool path on a Debian mirror (GPU_DOCTOR_DEBIAN_MIRRORS, space separated;
default deb.debian.org's debian-security and debian), checked against the sha256 the manifest
pins for the .deb: what a machine without Debian's apt (an Ubuntu or macOS runner) uses.

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
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
META = "metadata.json"
MACHINES = {"amd64": "x86_64", "arm64": "aarch64"}   # Debian arch -> uname -m
BCC_ARCH = {"amd64": "x86_64", "arm64": "arm64"}     # Debian arch -> BCC's ARCH variable
BCC_ARCH_DIR = {"amd64": "x86", "arm64": "arm64"}    # ... -> the arch/ dir BCC includes
MAX_TRACE_BYTES = 64 << 20           # strace output cap
MAX_DEB_BYTES = 128 << 20            # one downloaded .deb
DEFAULT_MIRRORS = ("http://deb.debian.org/debian-security", "http://deb.debian.org/debian")
LICENSE = ("GPL-2.0-only (Linux kernel headers; uapi headers GPL-2.0 WITH Linux-syscall-note), "
           "unmodified files of Debian's linux source package")


def manifest_path(arch: str) -> Path:
    return REPO / "packaging" / f"kheaders-{arch}.manifest"


def host_arch() -> str:
    """The Debian architecture of this machine (dpkg's, else from uname -m)."""
    if shutil.which("dpkg"):
        r = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                           timeout=30)
        if r.returncode == 0 and r.stdout.strip():
            return r.stdout.strip()
    m = os.uname().machine
    return {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(m, m)
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
def read_manifest(path: Path) -> tuple[dict, list[tuple[str, str]]]:
    """({abi, arch, packages: [(name, version)], debs: {name: (pool path, sha256)}},
    [(sha256, relpath)])."""
    head: dict = {"packages": [], "debs": {}}
    files: list[tuple[str, str]] = []
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            m = re.match(r"#\s*(\w+):\s*(.+)$", line)
            if m and m.group(1) == "package":
                name, version = m.group(2).split()
                head["packages"].append((name, version))
            elif m and m.group(1) == "deb":
                name, pool, digest = m.group(2).split()
                head["debs"][name] = (pool, digest)
            elif m:
                head[m.group(1)] = m.group(2).strip()
        elif line.strip():
            digest, rel = line.split(None, 1)
            files.append((digest, rel.strip()))
    return head, files


def write_manifest(abi: str, arch: str, packages: list[tuple[str, str]],
                   debs: dict[str, tuple[str, str]], files: list[tuple[str, str]],
                   path: Path) -> None:
    lines = ["# Kernel headers BCC opens to compile bpf/*.bpf.c (the probe's bundle and each",
             "# program alone), traced with strace by `scripts/build-kheaders.py trace`.",
             "# Do not edit by hand: re-trace after adding an #include to bpf/.",
             f"# abi: {abi}", f"# arch: {arch}"]
    lines += [f"# package: {n} {v}" for n, v in packages]
    lines += [f"# deb: {n} {debs[n][0]} {debs[n][1]}" for n, _v in packages if n in debs]
    lines += [f"{d}  {rel}" for d, rel in sorted(files, key=lambda x: x[1])]
    path.write_text("\n".join(lines) + "\n")


# --- the Debian packages ---------------------------------------------------------------------
def installed_version(pkg: str) -> str | None:
    if not shutil.which("dpkg-query"):
        return None
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status} ${Version}", pkg],
                       capture_output=True, text=True, timeout=30)
    parts = r.stdout.split()
    if r.returncode == 0 and parts[:3] == ["install", "ok", "installed"] and len(parts) == 4:
        return parts[3]
    return None


def cache_dir() -> Path:
    """Where downloaded .debs are kept (the scripts' cache; per-user when not writable)."""
    base = Path(os.environ.get("GPU_DOCTOR_CACHE", "/var/cache/gpu-doctor"))
    try:
        (base / "kheaders-debs").mkdir(parents=True, exist_ok=True)
        if os.access(base / "kheaders-debs", os.W_OK):
            return base / "kheaders-debs"
    except OSError:
        pass
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    (home / "gpu-doctor" / "kheaders-debs").mkdir(parents=True, exist_ok=True)
    return home / "gpu-doctor" / "kheaders-debs"


def package_arch(name: str) -> str:
    """linux-headers-<abi>-common is arch all; linux-headers-<abi>-<arch> is <arch>."""
    return "all" if name.endswith("-common") else name.rsplit("-", 1)[1]


def apt_options(arch: str) -> list[str]:
    """apt-get options for packages of `arch`: none for this machine's own (and arch all);
    for another arch a private apt state (lists, cache) under the download cache, so the
    machine's dpkg architectures and apt lists stay as they are."""
    if arch in ("all", host_arch()):
        return []
    state = cache_dir() / f"apt-{arch}"
    for d in ("lists/partial", "archives/partial"):
        (state / d).mkdir(parents=True, exist_ok=True)
    return ["-o", f"Dir::State::Lists={state}/lists", "-o", f"Dir::Cache={state}",
            "-o", f"APT::Architecture={arch}", "-o", f"APT::Architectures::={arch}",
            "-o", "Dir::State::status=/dev/null", "-o", "APT::Sandbox::User=root"]


_updated: set[str] = set()


def apt_lists(arch: str) -> list[str]:
    """apt_options(arch), with the private state's lists fetched once per run (it starts
    with none)."""
    opts = apt_options(arch)
    if opts and arch not in _updated:
        subprocess.run(["apt-get", "-qq", *opts, "update"], capture_output=True, text=True,
                       timeout=600)
        _updated.add(arch)
    return opts


def apt(args: list[str], arch: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["apt-get", "-qq", *apt_lists(arch), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def deb_record(name: str, version: str) -> tuple[str, str] | None:
    """(pool path, sha256) of the .deb from apt's lists, or None when apt does not know it."""
    if not shutil.which("apt-cache"):
        return None
    opts = apt_lists(package_arch(name))
    r = subprocess.run(["apt-cache", *opts, "show", f"{name}={version}"], capture_output=True,
                       text=True, timeout=120)
    fields = dict(re.findall(r"^(Filename|SHA256): (\S+)$", r.stdout.split("\n\n")[0], re.M))
    if r.returncode != 0 or set(fields) != {"Filename", "SHA256"}:
        return None
    return fields["Filename"], fields["SHA256"]


def _mirrors() -> list[str]:
    env = os.environ.get("GPU_DOCTOR_DEBIAN_MIRRORS", "").split()
    return [m.rstrip("/") for m in env] or list(DEFAULT_MIRRORS)


def _fetch_pool(name: str, version: str, head: dict, dest: Path) -> str:
    """Download the pinned .deb by its pool path from a Debian mirror into dest (checked
    against the manifest's sha256); the error text, or "" when it is there."""
    if name not in head["debs"]:
        return "the manifest pins no .deb for it"
    pool, digest = head["debs"][name]
    errors = []
    for mirror in _mirrors():
        url = f"{mirror}/{pool}"
        tmp = dest.with_suffix(f".part{os.getpid()}")
        try:
            h = hashlib.sha256()
            with urllib.request.urlopen(url, timeout=60) as resp, open(tmp, "wb") as out:
                total = 0
                while chunk := resp.read(1 << 20):
                    total += len(chunk)
                    if total > MAX_DEB_BYTES:
                        raise OSError(f"larger than {MAX_DEB_BYTES} bytes")
                    h.update(chunk)
                    out.write(chunk)
            if h.hexdigest() != digest:
                raise OSError(f"sha256 {h.hexdigest()} is not the pinned {digest}")
            tmp.replace(dest)
            return ""
        except (OSError, ValueError) as exc:
            errors.append(f"{url}: {exc}")
        finally:
            tmp.unlink(missing_ok=True)
    return "; ".join(errors)


def fetch_deb(name: str, version: str, head: dict, download: bool) -> Path:
    """The pinned .deb: from the cache, else downloaded (apt-get, then a mirror's pool)."""
    arch = package_arch(name)
    cached = cache_dir() / f"{name}_{version}_{arch}.deb"
    if cached.is_file():
        return cached
    if not download:
        die(f"{name} {version} is neither installed nor in {cached.parent} (no download asked)")
    why = []
    if shutil.which("apt-get"):
        with tempfile.TemporaryDirectory(prefix="gpu-doctor-kheaders-dl-") as tmp:
            r = apt(["download", f"{name}={version}"], arch, cwd=Path(tmp))
            got = sorted(Path(tmp).glob(f"{name}_*.deb"))
            if r.returncode == 0 and got:
                part = cached.with_suffix(f".part{os.getpid()}")   # whole or absent for others
                shutil.copyfile(got[-1], part)
                part.replace(cached)
                return cached
            why.append(f"apt-get download: {(r.stderr.strip() or 'no .deb')[-300:]}")
    err = _fetch_pool(name, version, head, cached)
    if not err:
        return cached
    why.append(err)
    die(f"{name} {version} is neither installed nor downloadable ({'; '.join(why)}); the "
        f"pinned version may have left the mirrors: set GPU_DOCTOR_DEBIAN_MIRRORS to a "
        f"snapshot.debian.org archive URL or re-trace against a current one")


def package_dirs(head: dict, workdir: Path, download: bool = True) -> list[Path]:
    """The header directories of the pinned packages, build (-<arch>) before source (-common):
    the installed ones when the pinned versions are installed (this machine's arch), else the
    .debs unpacked."""
    dirs = []
    for name, version in head["packages"]:
        d = Path("/usr/src") / name
        if installed_version(name) == version and d.is_dir():
            dirs.append(d)
            continue
        deb = fetch_deb(name, version, head, download)
        root = workdir / "x" / name
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True, timeout=600)
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
    abi, arch = args.abi, args.arch or host_arch()
    if arch not in MACHINES:
        die(f"unknown architecture {arch} (known: {', '.join(MACHINES)})")
    common = f"linux-headers-{abi}-common"
    version = args.version or installed_version(common)
    if version is None:
        die(f"{common} is not installed: install it or pass --version")
    packages = [(f"linux-headers-{abi}-{arch}", version), (common, version)]
    debs = {n: rec for n, v in packages if (rec := deb_record(n, v)) is not None}
    head = {"packages": packages, "debs": debs}
    sys.path.insert(0, str(REPO))
    from node_probe.tracing.bcc_env import merged_tree
    with tempfile.TemporaryDirectory(prefix="gpu-doctor-kheaders-trace-") as tmp:
        dirs = package_dirs(head, Path(tmp))
        tree = merged_tree(dirs[0], dirs[1], Path(tmp) / "tree")
        out = Path(tmp) / "strace.txt"
        env = dict(os.environ, BCC_KERNEL_SOURCE=str(tree),
                   PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("ARCH", None)
        if arch != host_arch():     # BCC's cross switch: clang target, arch/ dir, __TARGET_ARCH
            env["ARCH"] = BCC_ARCH[arch]
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
        if not any(r.startswith(f"arch/{BCC_ARCH_DIR[arch]}/") for r in rels):
            die(f"the trace opened no arch/{BCC_ARCH_DIR[arch]} headers: not a {arch} compile")
        files = []
        for rel in sorted(rels):
            src = find_in(dirs, rel)
            if src is None:
                die(f"traced {rel} is not in {dirs}")
            files.append((sha256(src), rel))
        size = sum(find_in(dirs, r).stat().st_size for _, r in files)
    dest = Path(args.output) if args.output else manifest_path(arch)
    write_manifest(abi, arch, packages, debs, files, dest)
    print(f"{dest}: {len(files)} files, {size} bytes", file=sys.stderr)


# --- build / check ---------------------------------------------------------------------------
def upstream_version(debian_version: str) -> str:
    """6.1.192-2 -> 6.1.192 (the kernel.org release the package was built from)."""
    return debian_version.split("-", 1)[0].split("+", 1)[0]


def cmd_build(args) -> None:
    arch = args.arch or host_arch()
    manifest = manifest_path(arch)
    if not manifest.is_file():
        die(f"no header manifest for {arch} ({manifest}): trace one with "
            f"`scripts/build-kheaders.py trace --arch {arch}`")
    head, files = read_manifest(manifest)
    dest = Path(args.dest)
    t0 = time.monotonic()
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
                "manifest_sha256": sha256(manifest),
                "license": LICENSE,
                "source": f"https://snapshot.debian.org/package/linux/{build_pkg[1]}/",
            }
            (stage / META).write_text(json.dumps(meta, indent=1) + "\n")
            for d in (stage, *(p for p in stage.rglob("*") if p.is_dir())):
                os.chmod(d, 0o755)
            for f in stage.rglob("*"):
                if f.is_file():
                    os.chmod(f, 0o644)
            if dest.exists():
                shutil.rmtree(dest)
            stage.rename(dest)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
    print(f"{dest}: Linux {meta['kernel_version']} headers ({meta['abi']}, {meta['arch']}), "
          f"{meta['files']} files, {meta['bytes']} bytes in {time.monotonic() - t0:.1f} s",
          file=sys.stderr)


def cmd_check(args) -> None:
    d = Path(args.dir)
    try:
        meta = json.loads((d / META).read_text())
    except (OSError, ValueError) as exc:
        die(f"{d / META}: {exc}")
    manifest = manifest_path(str(meta.get("arch", "")))
    if not manifest.is_file() or meta.get("manifest_sha256") != sha256(manifest):
        die(f"{d} was built from another manifest")
    _head, files = read_manifest(manifest)
    for digest, rel in files:
        p = d / rel
        if not p.is_file() or sha256(p) != digest:
            die(f"{d}: {rel} missing or changed")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    arches = sorted(MACHINES)
    t = sub.add_parser("trace", help="re-trace a compile and rewrite the manifest")
    t.add_argument("--abi", default="6.1.0-56", help="Debian kernel ABI of the headers to trace")
    t.add_argument("--arch", choices=arches, help="Debian architecture (default: this machine's)")
    t.add_argument("--version", help="Debian package version (default: the installed -common's)")
    t.add_argument("--python", default=sys.executable, help="a Python that can import bcc")
    t.add_argument("--output", help="write the manifest here instead of packaging/")
    b = sub.add_parser("build", help="build the set into DEST from the pinned packages")
    b.add_argument("dest")
    b.add_argument("--arch", choices=arches, help="Debian architecture (default: this machine's)")
    b.add_argument("--no-download", action="store_true",
                   help="only from the installed packages or the download cache")
    c = sub.add_parser("check", help="is DIR a complete set matching the manifest")
    c.add_argument("dir")
    args = ap.parse_args(argv)
    {"trace": cmd_trace, "build": cmd_build, "check": cmd_check}[args.cmd](args)


if __name__ == "__main__":
    main()
