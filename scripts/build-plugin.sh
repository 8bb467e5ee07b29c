#!/usr/bin/env bash
# Build the krew artifact: dist/kubectl-gpu_doctor-<version>-<os>-<arch>.tar.gz holding the
# `kubectl-gpu_doctor` executable, its `_internal/` directory and LICENSE.
#
# Why PyInstaller --onedir (numbers: docs/install.md, bench/plugin_artifacts.py re-measures):
# the kubectl plugin needs the `kubernetes` client, whose pydantic_core is a compiled extension,
# so a stdlib zipapp cannot carry it; pex/shiv need a system CPython of the exact minor version
# the wheels were built for; PyInstaller --onefile unpacks ~30 MB into /tmp on EVERY start. The
# onedir bundle carries its own interpreter and starts `--help` fastest.
#
# The bundle is built by PyInstaller in a private venv (cached under $GPU_DOCTOR_CACHE, keyed by
# pyproject.toml + packaging/requirements-build.txt + the Python version) that holds only the
# project's runtime dependencies; the project's own code comes from this work tree. node_probe
# and bpf/ are bundled too (`kubectl gpu-doctor local` runs the probe by re-entering the frozen
# executable); bcc is never bundled (libbcc, LLVM and clang are the host's): the frozen probe
# imports the host's python3-bpfcc (node_probe/tracing/hostbcc.py), so the stdlib modules that
# package uses are bundled as hidden imports. On Linux the kernel header set for this arch
# (scripts/build-kheaders.py, packaging/kheaders-<arch>.manifest) is bundled as _internal/kheaders
# for hosts without headers. The finding pages (docs/findings) are bundled for
# `kubectl gpu-doctor explain ID`, which works offline.
#
# Platforms: PyInstaller cannot cross-compile. This script builds the archive for the machine it
# runs on (here linux/amd64). linux/arm64: scripts/build-plugin-arm64.sh runs this script in an
# arm64 chroot under qemu on an amd64 machine (or run it on an arm64 machine). darwin/amd64 and
# darwin/arm64 cannot be built on Linux at all: run this script on macOS (e.g. CI runners
# macos-13, macos-14). scripts/fill-krew-manifest.py then fills each platform's uri and sha256.
#
# Usage: scripts/build-plugin.sh [--kind onedir|onefile] [--no-archive] [--venv-only]
#   --kind onefile   build the single-file variant instead (for bench/plugin_artifacts.py)
#   --no-archive     leave the bundle under build/plugin/<kind>/ and skip the tarball
#   --venv-only      only make sure the build venv exists and print its path
# Prints the archive path (or the bundle's executable with --no-archive) on stdout.
# Environment:
#   GPU_DOCTOR_PROBE_IMAGE  the probe image this build pulls by default, pinned by digest
#                           (<repo>[:<tag>]@sha256:<64 hex>; the release workflow passes what it
#                           pushed). Baked into the bundle as kubectl_gpudoctor/_build_info.json;
#                           unset: a tag-only development build (`version` says so).
#   GPU_DOCTOR_DIST         where the archive goes (default dist/)
#   GPU_DOCTOR_KHEADERS_SET a kernel header set already built for this arch (checked against
#                           its manifest; scripts/build-plugin-arm64.sh builds it natively)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${GPU_DOCTOR_CACHE:-/var/cache/gpu-doctor}
if ! mkdir -p "$CACHE" 2>/dev/null || [ ! -w "$CACHE" ]; then  # not root: a per-user cache
  CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/gpu-doctor
fi
PY=${GPU_DOCTOR_BUILD_PYTHON:-/usr/bin/python3}
KIND=onedir
ARCHIVE=1
while [ $# -gt 0 ]; do
  case "$1" in
    --kind) KIND=$2; shift 2 ;;
    --no-archive) ARCHIVE=0; shift ;;
    --venv-only) ARCHIVE=venv; shift ;;
    *) echo "usage: $0 [--kind onedir|onefile] [--no-archive]" >&2; exit 2 ;;
  esac
done
case "$KIND" in onedir|onefile) ;; *) echo "--kind must be onedir or onefile" >&2; exit 2 ;; esac
log() { printf '[build-plugin] %s\n' "$*" >&2; }
t0=$(date +%s)

VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' node_probe/protocol/version.py)
OS=$(uname -s | tr '[:upper:]' '[:lower:]')
case "$(uname -m)" in x86_64|amd64) ARCH=amd64 ;; aarch64|arm64) ARCH=arm64 ;; *) ARCH=$(uname -m) ;; esac
[ -f kubectl_gpudoctor/cli/__init__.py ] || { log "kubectl_gpudoctor/cli/ is missing: nothing to freeze yet"; exit 1; }

# --- the build venv: runtime deps + PyInstaller, no system site-packages (bcc stays out) -----
pyver=$("$PY" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
KEY=$( { echo "$pyver $OS $ARCH"; cat pyproject.toml packaging/requirements-build.txt; } | sha256sum | cut -c1-16)
VENV=$CACHE/plugin-venv-$KEY
if [ ! -f "$VENV/.complete" ]; then
  log "creating build venv $VENV (Python $pyver)"
  mkdir -p "$CACHE"; rm -rf "$VENV"
  # venvs for older inputs are dead weight (~250 MB each)
  find "$CACHE" -maxdepth 1 -name 'plugin-venv-*' ! -name "plugin-venv-$KEY" -exec rm -rf {} + 2>/dev/null || true
  "$PY" -m venv "$VENV"
  deps=$("$PY" - <<'EOF'
import tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
# the runtime deps and the `mcp` extra (the MCP server of `kubectl gpu-doctor mcp`)
print("\n".join(project["dependencies"] + project["optional-dependencies"]["mcp"]))
EOF
)
  # shellcheck disable=SC2086
  printf '%s\n' "$deps" > "$VENV/runtime-requirements.txt"
  "$VENV/bin/pip" install -q --disable-pip-version-check \
    -r "$VENV/runtime-requirements.txt" -r packaging/requirements-build.txt 2>&1 | grep -v "^WARNING: Location" >&2 || true
  "$VENV/bin/python" -c "import kubernetes, click, grpc, pynvml, yaml, tabulate, msgspec, mcp, PyInstaller" \
    || { log "build venv incomplete"; exit 1; }
  touch "$VENV/.complete"
fi
if [ "$ARCHIVE" = venv ]; then echo "$VENV"; exit 0; fi

# --- the default probe image, pinned by digest in release builds -------------------------------
PIN=${GPU_DOCTOR_PROBE_IMAGE:-}
if [ -n "$PIN" ]; then
  PYTHONPATH="$ROOT" "$VENV/bin/python" -c 'import sys; from kubectl_gpudoctor.build_info import parse_pinned; parse_pinned(sys.argv[1])' "$PIN" \
    || { log "GPU_DOCTOR_PROBE_IMAGE must be pinned by digest: <repo>[:<tag>]@sha256:<64 hex>, got '$PIN'"; exit 2; }
fi

# --- up to date? (same sources, same venv, same kind, same pin) -> nothing to do -------------
DIST=${GPU_DOCTOR_DIST:-dist}
mkdir -p "$DIST"
OUT=$DIST/kubectl-gpu_doctor-$VERSION-$OS-$ARCH.tar.gz
WORK=$ROOT/build/plugin/$KIND${PIN:+-pinned}
KH_MANIFEST=packaging/kheaders-$ARCH.manifest   # `local` on a host without kernel headers
[ "$OS" = linux ] && [ -f "$KH_MANIFEST" ] || KH_MANIFEST=/dev/null
src_hash=$( { echo "$KEY $KIND $PIN"; cat LICENSE packaging/kubectl-gpu_doctor.py "$0" "$KH_MANIFEST";
              find kubectl_gpudoctor node_probe bpf deploy docs/findings -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 \
                | sort -z | xargs -0 sha256sum; } | sha256sum | cut -c1-16)
if [ "$ARCHIVE" = 1 ] && [ -s "$OUT" ] && [ "$(cat "$OUT.inputs" 2>/dev/null)" = "$src_hash" ] && [ -z "${FORCE:-}" ]; then
  log "up to date: $OUT (inputs $src_hash)"; echo "$OUT"; exit 0
fi

# --- freeze ----------------------------------------------------------------------------------
rm -rf "$WORK"; mkdir -p "$WORK"
extra_data=()
if [ -n "$PIN" ]; then
  printf '{"probe_image": "%s"}\n' "$PIN" > "$WORK/_build_info.json"
  extra_data=(--add-data "$WORK/_build_info.json:kubectl_gpudoctor")
fi
if [ "$KH_MANIFEST" != /dev/null ]; then
  if [ -n "${GPU_DOCTOR_KHEADERS_SET:-}" ]; then   # built beforehand (build-plugin-arm64.sh)
    /usr/bin/python3 scripts/build-kheaders.py check "$GPU_DOCTOR_KHEADERS_SET" >&2 \
      || { log "GPU_DOCTOR_KHEADERS_SET=$GPU_DOCTOR_KHEADERS_SET is not a complete $ARCH set"; exit 1; }
    cp -r "$GPU_DOCTOR_KHEADERS_SET" "$WORK/kheaders"
  else
    /usr/bin/python3 scripts/build-kheaders.py build --arch "$ARCH" "$WORK/kheaders" >&2 \
      || { log "building the kernel header set for $ARCH failed"; exit 1; }
  fi
  extra_data+=(--add-data "$WORK/kheaders:kheaders")
else
  log "no kernel header set for $OS/$ARCH: \`local\` on a host without headers will not trace"
fi
# the stdlib modules the host's bcc package imports (hostbcc.py loads it at run time)
bcc_stdlib=(atexit ctypes errno fcntl json platform re subprocess traceback warnings functools
            collections.abc)
hidden=(); for m in "${bcc_stdlib[@]}"; do hidden+=(--hidden-import "$m"); done
mode=--onedir; [ "$KIND" = onefile ] && mode=--onefile
log "PyInstaller $mode kubectl-gpu_doctor $VERSION ($OS/$ARCH)"
(
  cd "$WORK"
  # PYTHONPATH too: --collect-submodules imports the packages in an isolated child that does not
  # see --paths, and node_probe.checks.* are only found by pkgutil at run time
  PYTHONPATH="$ROOT" "$VENV/bin/python" -m PyInstaller --noconfirm --log-level WARN "$mode" --name kubectl-gpu_doctor \
    --distpath "$WORK/dist" --workpath "$WORK/work" --specpath "$WORK" \
    --paths "$ROOT" \
    --collect-submodules kubectl_gpudoctor --collect-submodules node_probe \
    --add-data "$ROOT/bpf:bpf" "${extra_data[@]}" "${hidden[@]}" \
    --add-data "$ROOT/deploy/*.yaml:kubectl_gpudoctor/manifests" \
    --add-data "$ROOT/kubectl_gpudoctor/schema/*.json:kubectl_gpudoctor/schema" \
    --add-data "$ROOT/docs/findings:docs/findings" \
    --exclude-module bcc --exclude-module tkinter --exclude-module pytest \
    "$ROOT/packaging/kubectl-gpu_doctor.py" >&2
)
if [ "$KIND" = onedir ]; then
  BUNDLE=$WORK/dist/kubectl-gpu_doctor
  EXE=$BUNDLE/kubectl-gpu_doctor
else
  BUNDLE=$WORK/dist
  EXE=$WORK/dist/kubectl-gpu_doctor
fi
cp "$ROOT/LICENSE" "$BUNDLE/LICENSE"
"$EXE" version >/dev/null || { log "the frozen executable does not run: $EXE version"; exit 1; }
"$EXE" explain node.not_ready >/dev/null || { log "the frozen executable lacks the finding pages: $EXE explain"; exit 1; }
if [ -n "$PIN" ] && ! "$EXE" version | grep -qF "${PIN##*@}"; then
  log "the frozen executable does not report the pinned digest ${PIN##*@}"; exit 1
fi
log "bundle: $(du -sm "$BUNDLE" | cut -f1) MiB in $(( $(date +%s) - t0 )) s"
if [ "$ARCHIVE" = 0 ]; then echo "$EXE"; exit 0; fi

# --- archive: kubectl-gpu_doctor, _internal/, LICENSE at the top (krew-manifest.yaml `files`) ---
# reproducible-ish: fixed owner, mtime and order, so an unchanged tree gives the same sha256
tar -C "$BUNDLE" --sort=name --owner=0 --group=0 --numeric-owner --mtime='2020-01-01 00:00:00Z' \
  -cf - $(cd "$BUNDLE" && ls -A) | gzip -n -6 > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "$src_hash" > "$OUT.inputs"
log "archive $OUT: $(du -m "$OUT" | cut -f1) MiB, sha256 $(sha256sum "$OUT" | cut -c1-64) ($(( $(date +%s) - t0 )) s)"
echo "$OUT"
