#!/usr/bin/env bash
# Build the node probe image without a registry or a Docker engine, and save it as an OCI archive.
#
#   1. base: debootstrap --variant=minbase bookworm from the Debian mirror apt already uses,
#      with python3 + python3-bpfcc (packaging/base-packages.txt) and the probe's PyPI wheels
#      (packaging/requirements-probe.txt) -> a rootfs tarball cached under
#      /var/cache/gpu-doctor/base-<key>.tar, key = hash of every input (mirror, suite, arch,
#      package lists, this recipe, debootstrap version). Cold ~1-2 min; warm: skipped.
#   2. podman import of that tarball as localhost/gpu-doctor-base:<key>        (no network)
#   3. buildah build of packaging/Containerfile on top, from a staged context holding only
#      node_probe/, bpf/ and kheaders/ (the bundled kernel header set for the image's arch, built
#      by scripts/build-kheaders.py from the Debian packages pinned in
#      packaging/kheaders-<arch>.manifest: installed ones, else downloaded and cached)
#      -> localhost/gpu-doctor-probe:<node_probe.__version__>
#   4. podman save --format oci-archive -> dist/gpu-doctor-probe-<version>-<arch>.oci.tar
#      naming the image <plugin's default repo>:<version> (skipped when inputs are unchanged)
#
# Idempotent; needs root (debootstrap, container storage). Installs debootstrap, buildah,
# podman, runc, skopeo, umoci and catatonit (podman kube play's pause) with apt when missing.
# Prints the archive path on stdout.
# Environment: GPU_DOCTOR_CACHE (default /var/cache/gpu-doctor), GPU_DOCTOR_MIRROR (override the
# mirror), GPU_DOCTOR_IMAGE_NAME (the repository the archive names; default: the plugin's
# DEFAULT_IMAGE_REPO), FORCE=1.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${GPU_DOCTOR_CACHE:-/var/cache/gpu-doctor}
SUITE=bookworm
RECIPE=3   # bump when the base recipe below changes in a way the key does not see
log() { printf '[build-image] %s\n' "$*" >&2; }
t0=$(date +%s)

[ "$(id -u)" = 0 ] || { log "needs root (debootstrap, container storage)"; exit 1; }

VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' node_probe/protocol/version.py)
[ -n "$VERSION" ] || { log "cannot read __version__ from node_probe/protocol/version.py"; exit 1; }
HOST_ARCH=$(dpkg --print-architecture)
# GPU_DOCTOR_ARCH=arm64 on an amd64 machine builds the arm64 image under qemu-user (binfmt_misc):
# debootstrap's second stage and the import check run emulated; slow, a release step.
ARCH=${GPU_DOCTOR_ARCH:-$HOST_ARCH}
FOREIGN=0; [ "$ARCH" != "$HOST_ARCH" ] && FOREIGN=1
case "$ARCH" in
  amd64) WHEEL_PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64) ;;
  arm64) WHEEL_PLATFORMS=(manylinux_2_28_aarch64 manylinux_2_17_aarch64 manylinux2014_aarch64) ;;
  *) log "unsupported architecture $ARCH"; exit 1 ;;
esac

# --- tools --------------------------------------------------------------------------------
need=()
tools=(debootstrap buildah podman runc skopeo umoci catatonit python3-pip)
[ "$FOREIGN" = 1 ] && tools+=(qemu-user-static binfmt-support)
for p in "${tools[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  if [ -z "$(ls -A /var/lib/apt/lists 2>/dev/null | grep -v -e lock -e partial)" ]; then apt-get update -qq; fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if [ "$FOREIGN" = 1 ]; then
  qarch=$( [ "$ARCH" = arm64 ] && echo aarch64 || echo x86_64 )
  mountpoint -q /proc/sys/fs/binfmt_misc || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
  [ -e "/proc/sys/fs/binfmt_misc/qemu-$qarch" ] || update-binfmts --enable "qemu-$qarch" >/dev/null 2>&1 || true
  [ -e "/proc/sys/fs/binfmt_misc/qemu-$qarch" ] || { log "qemu-$qarch is not registered with binfmt_misc"; exit 1; }
fi

# --- the Debian mirror apt uses -----------------------------------------------------------
MIRROR=${GPU_DOCTOR_MIRROR:-$(bash scripts/debian-mirror.sh "$SUITE")}

# --- 1. base rootfs (cached) --------------------------------------------------------------
pkgs=$(grep -v -e '^#' -e '^[[:space:]]*$' packaging/base-packages.txt | paste -sd, -)
reqs=$(grep -v -e '^#' -e '^[[:space:]]*$' packaging/requirements-probe.txt)
KEY=$( { echo "recipe=$RECIPE suite=$SUITE arch=$ARCH mirror=$MIRROR"; echo "pkgs=$pkgs"; echo "$reqs";
         dpkg-query -W -f='${Version}' debootstrap; } | sha256sum | cut -c1-16)
BASE_TAR=$CACHE/base-$KEY.tar
BASE_IMAGE=localhost/gpu-doctor-base:$KEY
mkdir -p "$CACHE"

if [ ! -s "$BASE_TAR" ] || [ -n "${FORCE:-}" ]; then
  rootfs=$CACHE/rootfs-$KEY.tmp
  rm -rf "$rootfs"; mkdir -p "$rootfs"
  cleanup_rootfs() { for m in proc sys dev; do umount -l "$rootfs/$m" 2>/dev/null || true; done; rm -rf "$rootfs"; }
  trap cleanup_rootfs EXIT
  log "debootstrap --variant=minbase $SUITE ($ARCH) from $MIRROR with $pkgs"
  tb=$(date +%s)
  foreign=(); [ "$FOREIGN" = 1 ] && foreign=(--foreign)
  debootstrap --variant=minbase --arch="$ARCH" "${foreign[@]}" --include="$pkgs" "$SUITE" "$rootfs" "$MIRROR" >"$CACHE/debootstrap-$KEY.log" 2>&1 \
    || { log "debootstrap failed, see $CACHE/debootstrap-$KEY.log"; tail -n 20 "$CACHE/debootstrap-$KEY.log" >&2; exit 1; }
  if [ "$FOREIGN" = 1 ]; then
    chroot "$rootfs" /debootstrap/debootstrap --second-stage >>"$CACHE/debootstrap-$KEY.log" 2>&1 \
      || { log "second stage failed, see $CACHE/debootstrap-$KEY.log"; exit 1; }
  fi
  log "debootstrap done in $(( $(date +%s) - tb )) s"

  # The probe's wheels, for the image's own Python (bookworm: CPython 3.11) and platform,
  # into the directory Debian's python3 searches for locally installed packages.
  pyver=$(chroot "$rootfs" python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  site=$rootfs/usr/local/lib/python$pyver/dist-packages
  plat_args=(); for p in "${WHEEL_PLATFORMS[@]}"; do plat_args+=(--platform "$p"); done
  log "pip wheels for CPython $pyver into /usr/local/lib/python$pyver/dist-packages: $(echo $reqs)"
  /usr/bin/python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-cache-dir --no-compile \
    --only-binary=:all: --implementation cp --python-version "$pyver" "${plat_args[@]}" \
    --target "$site" -r packaging/requirements-probe.txt 2>&1 | grep -v "^WARNING: Location" >&2 || true
  [ -d "$site/grpc" ] || { log "pip did not install the wheels into $site"; exit 1; }
  chroot "$rootfs" python3 -c 'import grpc, google.protobuf, pynvml, bcc' \
    || { log "the base cannot import grpc/protobuf/pynvml/bcc"; exit 1; }

  # slim: what bookworm-slim drops (docs, man pages, locales) and apt's downloaded state
  rm -rf "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
         "$rootfs"/usr/share/locale/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
         "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/log/* "$rootfs"/tmp/*
  find "$rootfs/usr/local/lib" -name __pycache__ -prune -exec rm -rf {} +
  tar -C "$rootfs" --numeric-owner --xattrs -cf "$BASE_TAR.tmp" .
  mv "$BASE_TAR.tmp" "$BASE_TAR"
  echo "$ARCH" > "$CACHE/base-$KEY.arch"
  cleanup_rootfs; trap - EXIT
  log "base cached: $BASE_TAR ($(du -m "$BASE_TAR" | cut -f1) MiB)"
  for old in "$CACHE"/base-*.tar; do  # bases for older inputs, and their imported images
    [ "$old" = "$BASE_TAR" ] && continue
    okey=$(basename "$old" .tar); okey=${okey#base-}
    [ "$(cat "$CACHE/base-$okey.arch" 2>/dev/null || echo "$HOST_ARCH")" = "$ARCH" ] || continue  # other arch
    podman image rm -f "localhost/gpu-doctor-base:$okey" >/dev/null 2>&1 || true
    rm -f "$old" "$CACHE/debootstrap-$okey.log" "$CACHE/base-$okey.arch"
  done
  podman image rm -f "$BASE_IMAGE" >/dev/null 2>&1 || true
fi

# --- 2. import --------------------------------------------------------------------------
if ! podman image exists "$BASE_IMAGE"; then
  log "podman import $BASE_TAR as $BASE_IMAGE"
  podman import --quiet --arch "$ARCH" "$BASE_TAR" "$BASE_IMAGE" >/dev/null
fi

# --- 3. build ---------------------------------------------------------------------------
IMAGE=localhost/gpu-doctor-probe:$VERSION
[ "$FOREIGN" = 1 ] && IMAGE=$IMAGE-$ARCH  # keep the host's image under the plain tag
# The release name the plugin pulls by default (kubectl_gpudoctor/build_info.py DEFAULT_IMAGE_REPO):
# the archive carries it, so `ctr -n k8s.io images import` on a node gives exactly the image the
# debug pod asks for (imagePullPolicy IfNotPresent), with no registry and no --image.
RELEASE_REPO=${GPU_DOCTOR_IMAGE_NAME:-$(sed -n 's/^DEFAULT_IMAGE_REPO = "\(.*\)"/\1/p' kubectl_gpudoctor/build_info.py 2>/dev/null)}
RELEASE_REPO=${RELEASE_REPO:-ghcr.io/gpu-doctor/gpu-doctor-probe}
RELEASE=$RELEASE_REPO:$VERSION
LOCAL_RELEASE=$RELEASE; [ "$FOREIGN" = 1 ] && LOCAL_RELEASE=$RELEASE-$ARCH
mkdir -p dist
OUT=dist/gpu-doctor-probe-$VERSION-$ARCH.oci.tar
src_hash=$( { echo "$KEY $RELEASE"; cat packaging/Containerfile "packaging/kheaders-$ARCH.manifest";
              find node_probe bpf -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | sort -z | xargs -0 sha256sum; } \
            | sha256sum | cut -c1-16)
stamp=$OUT.inputs
# the stamp holds the inputs' hash and the image ID saved; another checkout building the same tag
# changes the ID, and then this one rebuilds
cur_id=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
if [ -s "$OUT" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$src_hash $cur_id" ] && [ -z "${FORCE:-}" ]; then
  log "up to date: $OUT ($IMAGE, inputs $src_hash) in $(( $(date +%s) - t0 )) s"
  echo "$OUT"; exit 0
fi

ctx=$(mktemp -d /tmp/gpu-doctor-ctx.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
tar -C "$ROOT" --exclude='__pycache__' --exclude='*.pyc' -cf - node_probe bpf | tar -C "$ctx" -xf -
[ -f "packaging/kheaders-$ARCH.manifest" ] \
  || { log "no kernel header manifest for $ARCH (scripts/build-kheaders.py trace --arch $ARCH)"; exit 1; }
GPU_DOCTOR_CACHE=$CACHE /usr/bin/python3 scripts/build-kheaders.py build --arch "$ARCH" "$ctx/kheaders" >&2 \
  || { log "building the bundled kernel header set for $ARCH failed"; exit 1; }
old_id=$(podman image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
log "buildah build $IMAGE (base $BASE_IMAGE)"
tags=(-t "$IMAGE" -t "$LOCAL_RELEASE")
buildah build --quiet --pull=never --isolation=chroot --arch "$ARCH" --build-arg "BASE=$BASE_IMAGE" \
  --label "org.opencontainers.image.version=$VERSION" \
  --label "org.opencontainers.image.source=https://github.com/gpu-doctor/kubectl-gpu-doctor" \
  --label "org.opencontainers.image.licenses=Apache-2.0" \
  "${tags[@]}" -f "$ROOT/packaging/Containerfile" "$ctx" >/dev/null
new_id=$(podman image inspect --format '{{.Id}}' "$IMAGE")
# drop the image this tag pointed at before (now untagged), so reruns do not pile up layers
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then podman image rm "$old_id" >/dev/null 2>&1 || true; fi

# --- 4. save ----------------------------------------------------------------------------
rm -f "$OUT.tmp"
if [ "$FOREIGN" = 1 ]; then  # the archive names it $RELEASE whatever the local tag
  skopeo copy -q "containers-storage:$IMAGE" "oci-archive:$OUT.tmp:$RELEASE" 2>/dev/null
else
  podman save --quiet --format oci-archive -o "$OUT.tmp" "$RELEASE"
fi
mv "$OUT.tmp" "$OUT"
echo "$src_hash $new_id" > "$stamp"
log "saved $OUT ($(du -m "$OUT" | cut -f1) MiB; image $(podman image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%d MB", $1/1e6}')) in $(( $(date +%s) - t0 )) s"
echo "$OUT"
