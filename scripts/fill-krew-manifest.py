#!/usr/bin/env python3
"""Fill the krew manifest's uri and sha256 from built plugin archives.

Why: krew-manifest.yaml is a template (a committed sha256 would be stale after the next commit).
This reads it, sets spec.version from node_probe.__version__, and for every platform finds
dist/kubectl-gpu_doctor-<version>-<os>-<arch>.tar.gz (built by scripts/build-plugin.sh on that
platform and copied here), checks that the archive holds `bin` and every `files[].from`, and
writes the uri (release download URL) and the archive's sha256. It never invents a checksum:
a platform without an archive is an error, or with --allow-missing is left out of the output
(and named on stderr). Output: dist/gpu-doctor.yaml (krew wants <plugin name>.yaml).

  .venv/bin/python scripts/fill-krew-manifest.py [--allow-missing] [--base-url URL] [--out FILE]
  .venv/bin/python scripts/fill-krew-manifest.py --bot-template > .krew.yaml

--bot-template writes the same manifest as krew-release-bot's template (`.krew.yaml`, the bot's
convention): the bot fills each platform's uri and sha256 from the published GitHub release
itself when it opens the krew-index pull request. One source (krew-manifest.yaml) for both.
"""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import re
import sys
import tarfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BASE_URL = "https://github.com/gpu-doctor/kubectl-gpu-doctor/releases/download/v{version}"


def project_version() -> str:
    text = (ROOT / "node_probe" / "protocol" / "version.py").read_text()
    m = re.search(r'^__version__ = "([^"]+)"', text, re.M)
    if not m:
        raise SystemExit("cannot read __version__ from node_probe/protocol/version.py")
    return m.group(1)


def archive_name(version: str, os_: str, arch: str) -> str:
    return f"kubectl-gpu_doctor-{version}-{os_}-{arch}.tar.gz"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def top_level_entries(path: Path) -> set[str]:
    """Names at the archive's top level (what krew's `files[].from` globs are matched against)."""
    with tarfile.open(path, "r:gz") as tar:
        names = set()
        for member in tar.getmembers():
            name = member.name[2:] if member.name.startswith("./") else member.name
            if name and name != ".":
                names.add(name.split("/", 1)[0])
        return names


def check_archive(path: Path, platform: dict) -> list[str]:
    problems = []
    top = top_level_entries(path)
    for op in platform.get("files") or []:
        if not fnmatch.filter(top, op["from"]):
            problems.append(f"{path.name}: files[].from {op['from']!r} matches nothing in the archive")
    if platform["bin"] not in top:
        problems.append(f"{path.name}: bin {platform['bin']!r} is not in the archive")
    return problems


def fill(manifest: dict, dist: Path, base_url: str, allow_missing: bool) -> tuple[dict, list[str]]:
    version = project_version()
    manifest["spec"]["version"] = f"v{version}"
    kept, missing, problems = [], [], []
    for platform in manifest["spec"]["platforms"]:
        labels = platform["selector"]["matchLabels"]
        name = archive_name(version, labels["os"], labels["arch"])
        path = dist / name
        if not path.is_file():
            missing.append(f"{labels['os']}/{labels['arch']}")
            continue
        problems += check_archive(path, platform)
        platform["uri"] = base_url.format(version=version).rstrip("/") + "/" + name
        platform["sha256"] = sha256_of(path)
        kept.append(platform)
    if problems:
        raise SystemExit("\n".join(problems))
    if missing and not allow_missing:
        raise SystemExit(f"no archive for {', '.join(missing)} in {dist} "
                         "(build them on those platforms, or pass --allow-missing)")
    if not kept:
        raise SystemExit(f"no plugin archive for version {version} in {dist}")
    manifest["spec"]["platforms"] = kept
    return manifest, missing


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (description, caveats) as literal blocks, as krew-index reviewers read them."""


_BlockDumper.add_representer(
    str, lambda dumper, s: dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None))


BOT_URL = ('(printf "https://github.com/gpu-doctor/kubectl-gpu-doctor/releases/download/%s/'
           'kubectl-gpu_doctor-%s-{os}-{arch}.tar.gz" .TagName (trimPrefix "v" .TagName))')


def bot_template(manifest: dict) -> str:
    """krew-release-bot's `.krew.yaml`: version and every platform's uri+sha256 as bot placeholders."""
    manifest["spec"]["version"] = "__TAG__"
    for platform in manifest["spec"]["platforms"]:
        labels = platform["selector"]["matchLabels"]
        platform.pop("sha256", None)
        platform["uri"] = f"__URI_{labels['os']}_{labels['arch']}__"
    text = yaml.dump(manifest, Dumper=_BlockDumper, sort_keys=False, width=100)
    text = text.replace("version: __TAG__", 'version: "{{ .TagName }}"')
    out = []
    for line in text.splitlines():
        stripped = line.lstrip()
        if stripped.startswith("uri: __URI_"):
            os_, arch = stripped[len("uri: __URI_"):-2].split("_")
            indent = len(line) - len(stripped)
            out.append("{{ addURIAndSha " + BOT_URL.format(os=os_, arch=arch)
                       + f" .TagName | indent {indent} }}}}")
        else:
            out.append(line)
    return ("# krew-release-bot template, generated by scripts/fill-krew-manifest.py --bot-template\n"
            "# from krew-manifest.yaml; do not edit (tests/packaging/test_release.py checks it).\n"
            + "\n".join(out) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--manifest", type=Path, default=ROOT / "krew-manifest.yaml")
    ap.add_argument("--dist", type=Path, default=ROOT / "dist")
    ap.add_argument("--base-url", default=DEFAULT_BASE_URL,
                    help="release download URL; {version} is replaced (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=None, help="default: <dist>/gpu-doctor.yaml")
    ap.add_argument("--allow-missing", action="store_true",
                    help="leave out platforms whose archive was not built instead of failing")
    ap.add_argument("--bot-template", action="store_true",
                    help="print krew-release-bot's .krew.yaml template instead (no archives needed)")
    args = ap.parse_args(argv)
    if args.bot_template:
        sys.stdout.write(bot_template(yaml.safe_load(args.manifest.read_text())))
        return 0
    if not args.base_url.startswith("https://"):
        raise SystemExit("--base-url must be https:// (krew downloads over TLS)")
    manifest = yaml.safe_load(args.manifest.read_text())
    filled, missing = fill(manifest, args.dist, args.base_url, args.allow_missing)
    out = args.out or args.dist / f"{filled['metadata']['name']}.yaml"
    header = ("# Generated by scripts/fill-krew-manifest.py from krew-manifest.yaml; do not edit.\n"
              + (f"# Left out (no archive built): {', '.join(missing)}\n" if missing else ""))
    out.write_text(header + yaml.dump(filled, Dumper=_BlockDumper, sort_keys=False, width=100))
    for m in missing:
        print(f"fill-krew-manifest: warning: no archive for {m}; platform left out", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
