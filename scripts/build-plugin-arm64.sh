#!/usr/bin/env bash
# Build the linux/arm64 plugin archive on an amd64 Linux machine, under qemu-user emulation.
#
# PyInstaller cannot cross-compile, so this runs the ordinary scripts/build-plugin.sh inside a
# Debian bookworm arm64 chroot (debootstrap --arch=arm64, executed through binfmt_misc +
# qemu-user-static), with arm64 CPython and arm64 wheels from PyPI. The chroot is cached under
# $GPU_DOCTOR_CACHE/arm64-builder-<key>; its build venv lives there too.
# Slow (emulation): a release step, not part of CI. darwin archives need a macOS machine.
#
#   sudo scripts/build-plugin-arm64.sh   # -> dist/kubectl-gpu_doctor-<version>-linux-arm64.tar.gz
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${GPU_DOCTOR_CACHE:-/var/cache/gpu-doctor}
SUITE=bookworm
RECIPE=1
log() { printf '[build-plugin-arm64] %s\n' "$*" >&2; }
[ "$(id -u)" = 0 ] || { log "needs root (debootstrap, chroot, binfmt_misc)"; exit 1; }
[ "$(dpkg --print-architecture)" = amd64 ] || { log "run scripts/build-plugin.sh directly on non-amd64 machines"; exit 1; }
t0=$(date +%s)

need=()
for p in debootstrap qemu-user-static binfmt-support; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] || { log "qemu-aarch64 is not registered with binfmt_misc"; exit 1; }

MIRROR=${GPU_DOCTOR_MIRROR:-$(bash scripts/debian-mirror.sh "$SUITE")}
pkgs=python3,python3-venv,python3-pip,binutils,ca-certificates
KEY=$( { echo "recipe=$RECIPE $SUITE arm64 $MIRROR $pkgs"; dpkg-query -W -f='${Version}' debootstrap; } | sha256sum | cut -c1-16)
CHROOT=$CACHE/arm64-builder-$KEY

mounts=()
cleanup() {
  for ((i=${#mounts[@]}-1; i>=0; i--)); do umount -l "${mounts[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT

if [ ! -f "$CHROOT/.complete" ]; then
  rm -rf "$CHROOT"; mkdir -p "$CHROOT"
  log "debootstrap --arch=arm64 $SUITE from $MIRROR (second stage under qemu; several minutes)"
  debootstrap --arch=arm64 --variant=minbase --foreign --include="$pkgs" "$SUITE" "$CHROOT" "$MIRROR" \
    >"$CACHE/arm64-builder-$KEY.log" 2>&1
  chroot "$CHROOT" /debootstrap/debootstrap --second-stage >>"$CACHE/arm64-builder-$KEY.log" 2>&1 \
    || { tail -n 20 "$CACHE/arm64-builder-$KEY.log" >&2; exit 1; }
  touch "$CHROOT/.complete"
  log "arm64 builder ready in $(( $(date +%s) - t0 )) s"
fi

# packages added to the builder after it was bootstrapped (apt inside the chroot, under qemu)
extra=(libpython3.11)  # PyInstaller bundles libpython3.11.so.1.0
missing=()
for p in "${extra[@]}"; do
  chroot "$CHROOT" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

for m in proc sys dev; do
  mount --rbind "/$m" "$CHROOT/$m"; mount --make-rslave "$CHROOT/$m"; mounts+=("$CHROOT/$m")
done
cp /etc/resolv.conf "$CHROOT/etc/resolv.conf"
# the host's CA bundle (it may hold a TLS-intercepting proxy's CA) for pip inside
mkdir -p "$CHROOT/etc/ssl/certs"; cp /etc/ssl/certs/ca-certificates.crt "$CHROOT/etc/ssl/certs/ca-certificates.crt"

if [ ${#missing[@]} -gt 0 ]; then
  log "apt-get install ${missing[*]} in the arm64 builder"
  echo "deb $MIRROR $SUITE main" > "$CHROOT/etc/apt/sources.list"
  chroot "$CHROOT" apt-get update -qq >&2
  chroot "$CHROOT" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

rm -rf "$CHROOT/src"; mkdir -p "$CHROOT/src"
tar -C "$ROOT" --exclude='__pycache__' --exclude='*.pyc' -cf - \
  LICENSE pyproject.toml kubectl_gpudoctor node_probe bpf packaging scripts deploy docs/findings \
  | tar -C "$CHROOT/src" -xf -
# the arm64 kernel header set, built natively here (no apt or dpkg-deb under emulation); the
# build inside checks it against packaging/kheaders-arm64.manifest
GPU_DOCTOR_CACHE=$CACHE /usr/bin/python3 scripts/build-kheaders.py build --arch arm64 \
  "$CHROOT/src/build/kheaders-arm64" >&2 || { log "building the arm64 kernel header set failed"; exit 1; }
log "scripts/build-plugin.sh inside the arm64 chroot"
chroot "$CHROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
  GPU_DOCTOR_CACHE=/var/cache/gpu-doctor PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
  GPU_DOCTOR_KHEADERS_SET=/src/build/kheaders-arm64 \
  ${HTTPS_PROXY:+HTTPS_PROXY=$HTTPS_PROXY} ${https_proxy:+https_proxy=$https_proxy} \
  bash /src/scripts/build-plugin.sh >&2
VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' node_probe/protocol/version.py)
NAME=kubectl-gpu_doctor-$VERSION-linux-arm64.tar.gz
mkdir -p dist
cp "$CHROOT/src/dist/$NAME" "dist/$NAME.tmp" && mv "dist/$NAME.tmp" "dist/$NAME"
log "dist/$NAME: $(du -m "dist/$NAME" | cut -f1) MiB in $(( $(date +%s) - t0 )) s"
echo "dist/$NAME"
