#!/usr/bin/env bash
# Build the pip wheel: dist/kubectl_gpu_doctor-<version>-py3-none-any.whl.
#
# Why a script and not a bare `pip wheel .`: the wheel carries the kernel header sets that let
# `kubectl gpu-doctor local` (and `gpu-doctor-probe`) compile eBPF on a host without kernel
# headers, as the probe image and the krew archive do. The sets are built from the Debian
# packages pinned in packaging/kheaders-<arch>.manifest (scripts/build-kheaders.py; not in git),
# one per machine because arch/<x86|arm64> differ: node_probe/kheaders/x86_64/ and
# node_probe/kheaders/aarch64/ (package data, pyproject.toml), where node_probe/tracing/
# kheaders.py looks for the running machine's. A wheel is pure Python (py3-none-any), so it
# carries both. The tree is staged in a temp dir so the checkout never holds generated sets.
# A plain `pip wheel .` still works; its wheel has no sets (`local` then needs host headers).
#
# Usage: scripts/build-wheel.sh        prints the wheel's path
# Environment: GPU_DOCTOR_BUILD_PYTHON (a Python with pip, setuptools >= 62.3 and wheel; default
#   the checkout's .venv, else /usr/bin/python3), GPU_DOCTOR_DIST (default dist/),
#   GPU_DOCTOR_CACHE (the .deb download cache, scripts/build-kheaders.py).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
log() { printf '[build-wheel] %s\n' "$*" >&2; }
t0=$(date +%s)
PY=${GPU_DOCTOR_BUILD_PYTHON:-}
[ -n "$PY" ] || { [ -x .venv/bin/python ] && PY=$ROOT/.venv/bin/python || PY=/usr/bin/python3; }
DIST=${GPU_DOCTOR_DIST:-dist}
mkdir -p "$DIST"; DIST=$(cd "$DIST" && pwd)

stage=$(mktemp -d "${TMPDIR:-/tmp}/gpu-doctor-wheel.XXXXXX")
trap 'rm -rf "$stage"' EXIT
# -h: kubectl_gpudoctor/manifests/*.yaml are symlinks to deploy/; the wheel holds the files
tar -C "$ROOT" -h --exclude='__pycache__' --exclude='*.pyc' --exclude='node_probe/kheaders' -cf - \
  pyproject.toml README.md LICENSE node_probe kubectl_gpudoctor bpf docs/findings | tar -C "$stage" -xf -
for pair in amd64:x86_64 arm64:aarch64; do   # Debian arch : uname -m
  arch=${pair%%:*} machine=${pair#*:}
  "$PY" scripts/build-kheaders.py build --arch "$arch" "$stage/node_probe/kheaders/$machine" >&2 \
    || { log "building the $arch kernel header set failed"; exit 1; }
done
rm -f "$DIST"/kubectl_gpu_doctor-*.whl
"$PY" -m pip wheel -q --no-deps --no-build-isolation --no-index -w "$DIST" "$stage" >&2 \
  || { log "pip wheel failed (needs pip, setuptools >= 62.3 and wheel in $PY)"; exit 1; }
wheel=$(ls "$DIST"/kubectl_gpu_doctor-*.whl)
"$PY" - "$wheel" <<'EOF' || { log "the wheel lacks a header set"; exit 1; }
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
for m in ("x86_64", "aarch64"):
    assert f"node_probe/kheaders/{m}/metadata.json" in names, m
    assert f"node_probe/kheaders/{m}/include/linux/kconfig.h" in names, m
EOF
log "$(basename "$wheel"): $(stat -c %s "$wheel") bytes in $(( $(date +%s) - t0 )) s"
echo "$wheel"
