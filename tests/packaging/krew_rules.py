"""krew's manifest rules, re-stated in Python for the tests (krew itself is a Go binary we do not
have here). Sources, read from kubernetes-sigs/krew:
  internal/index/validation/validate.go  ValidatePlugin / validatePlatform / validateFiles /
                                          validateSelector / IsSafePluginName
  internal/installation/semver/version.go Parse: a leading "v", then k8s ParseSemantic
  cmd/validate-krew-manifest/main.go      supported os/arch pairs, no overlapping selectors,
                                          a LICENSE-like file installed, line lengths (warnings)
  internal/installation/move.go           files[]: `from` is a glob in the unpacked archive,
                                          each match moves to <to>/<basename>
krew-index's review rules add: shortDescription of at most 50 characters, https download URLs,
and plugin names that do not start with "kubectl-".
"""
from __future__ import annotations

import fnmatch
import os
import posixpath
import re
import shutil
from pathlib import Path

API_VERSION = "krew.googlecontainertools.github.com/v1alpha2"
SAFE_NAME = re.compile(r"^[\w-]+$")
WINDOWS_FORBIDDEN = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(1, 10)),
                     *(f"lpt{i}" for i in range(1, 10))}
SHA256 = re.compile(r"^[a-f0-9]{64}$")
# k8s.io/apimachinery/pkg/util/version ParseSemantic (strict semver 2.0)
SEMVER = re.compile(r"^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                    r"(?:-[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?(?:\+[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*)?$")
SUPPORTED_PLATFORMS = [("windows", "386"), ("windows", "amd64"), ("windows", "arm64"),
                       ("linux", "386"), ("linux", "amd64"), ("linux", "arm"), ("linux", "arm64"),
                       ("linux", "ppc64le"), ("darwin", "386"), ("darwin", "amd64"),
                       ("darwin", "arm64")]
LICENSE_FILES = {"license", "license.txt", "license.md", "licenses", "licenses.txt",
                 "licenses.md", "copying", "copying.txt"}


def selector_matches(selector: dict, os_: str, arch: str) -> bool:
    labels = {"os": os_, "arch": arch}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        value, op, values = labels.get(expr["key"]), expr["operator"], expr.get("values") or []
        if op == "In" and value not in values or op == "NotIn" and value in values:
            return False
        if op == "Exists" and value is None or op == "DoesNotExist" and value is not None:
            return False
    return True


def structural_errors(plugin: dict, file_name: str, *, filled: bool) -> list[str]:
    """ValidatePlugin + validatePlatform, plus krew-index review rules. With filled=False (the
    committed template) empty uri/sha256 are expected and not reported."""
    errs = []
    name = file_name.removesuffix(".yaml")
    if not file_name.endswith(".yaml"):
        errs.append(f"manifest file {file_name!r} must end in .yaml")
    if plugin.get("apiVersion") != API_VERSION:
        errs.append(f"apiVersion {plugin.get('apiVersion')!r}")
    if plugin.get("kind") != "Plugin":
        errs.append(f"kind {plugin.get('kind')!r}")
    if not SAFE_NAME.match(name) or name.lower() in WINDOWS_FORBIDDEN:
        errs.append(f"unsafe plugin name {name!r}")
    if name.startswith("kubectl-"):
        errs.append("plugin name must not start with kubectl-")
    if plugin.get("metadata", {}).get("name") != name:
        errs.append(f"metadata.name {plugin.get('metadata', {}).get('name')!r} != file name {name!r}")
    spec = plugin.get("spec") or {}
    short = spec.get("shortDescription") or ""
    if not short:
        errs.append("no shortDescription")
    if "\n" in short or "\r" in short:
        errs.append("line break in shortDescription")
    if len(short) > 50:
        errs.append(f"shortDescription is {len(short)} chars (> 50)")
    if not SEMVER.match(spec.get("version") or ""):
        errs.append(f"version {spec.get('version')!r} is not v-prefixed semver")
    platforms = spec.get("platforms") or []
    if not platforms:
        errs.append("no platforms")
    for i, p in enumerate(platforms):
        where = f"platforms[{i}]"
        if filled:
            if not p.get("uri"):
                errs.append(f"{where}: uri unset")
            elif not p["uri"].startswith("https://"):
                errs.append(f"{where}: uri {p['uri']!r} is not https")
            if not SHA256.match(p.get("sha256") or ""):
                errs.append(f"{where}: sha256 {p.get('sha256')!r} is not 64 lowercase hex")
        if not p.get("bin"):
            errs.append(f"{where}: bin unset")
        files = p.get("files")
        if files is not None:
            if not files:
                errs.append(f"{where}: files empty")
            for op in files:
                if not op.get("from") or not op.get("to"):
                    errs.append(f"{where}: files entry {op} needs from and to")
                elif posixpath.normpath(op["to"]) != op["to"]:
                    errs.append(f"{where}: files[].to {op['to']!r} is not clean")
        sel = p.get("selector")
        if not sel or (sel.get("matchLabels") is None and not sel.get("matchExpressions")):
            errs.append(f"{where}: empty selector")
            continue
        keys = list((sel.get("matchLabels") or {}).keys()) + [e["key"] for e in sel.get("matchExpressions") or []]
        bad = [k for k in keys if k not in ("os", "arch")]
        if bad:
            errs.append(f"{where}: selector keys {bad} not supported")
        if sel.get("matchLabels") is not None and not sel["matchLabels"]:
            errs.append(f"{where}: matchLabels specified but empty")
        if not any(selector_matches(sel, o, a) for o, a in SUPPORTED_PLATFORMS):
            errs.append(f"{where}: selector matches no supported platform")
    for o, a in SUPPORTED_PLATFORMS:
        hits = [i for i, p in enumerate(platforms) if p.get("selector") and selector_matches(p["selector"], o, a)]
        if len(hits) > 1:
            errs.append(f"platforms {hits} overlap on {o}/{a}")
    return errs


def long_lines(plugin: dict) -> list[str]:
    """validate-krew-manifest's line-length warnings (words without spaces may exceed)."""
    spec, out = plugin["spec"], []
    for field, limit in (("description", 80), ("shortDescription", 70), ("caveats", 80)):
        for line in (spec.get(field) or "").split("\n"):
            if len(line) > limit and " " in line.strip():
                out.append(f"{field}: {len(line)} > {limit}: {line!r}")
    return out


def install_platform(unpacked: Path, platform: dict, dest: Path) -> Path:
    """Apply files[] like krew's installation/move.go and return the path of `bin` under dest."""
    dest.mkdir(parents=True, exist_ok=True)
    ops = platform.get("files") or [{"from": "*", "to": "."}]
    for op in ops:
        matches = sorted(fnmatch.filter(os.listdir(unpacked), op["from"])) if "/" not in op["from"] \
            else [op["from"]] if (unpacked / op["from"]).exists() else []
        if not matches:
            raise FileNotFoundError(f"no files in the plugin archive matched the glob {op['from']!r}")
        target_dir = dest / op["to"]
        target_dir.mkdir(parents=True, exist_ok=True)
        for m in matches:
            shutil.move(str(unpacked / m), str(target_dir / Path(m).name))
    binary = dest / platform["bin"]
    if not binary.is_file():
        raise FileNotFoundError(f"bin {platform['bin']!r} not installed")
    return binary


def installed_license(dest: Path) -> list[Path]:
    return [p for p in dest.rglob("*") if p.is_file() and p.name.lower() in LICENSE_FILES]
