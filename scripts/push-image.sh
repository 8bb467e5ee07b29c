#!/usr/bin/env bash
# Push the probe image archives built by scripts/build-image.sh (one per architecture) to a
# registry as ONE multi-arch image, and print the reference the plugin must pin:
#   <repo>:<version>@sha256:<digest of the image index>
#
# Why a digest: a tag can be moved by anyone who can push to the registry; the privileged debug
# pod must run exactly what was released. scripts/build-plugin.sh bakes this reference into the
# plugin (GPU_DOCTOR_PROBE_IMAGE), and `kubectl gpu-doctor version` prints it.
#
# Usage: scripts/push-image.sh REPO ARCHIVE [ARCHIVE...]
#   REPO      e.g. ghcr.io/gpu-doctor/gpu-doctor-probe (log in first: `skopeo login`, or
#             REGISTRY_AUTH_FILE)
#   ARCHIVE   dist/gpu-doctor-probe-<version>-<arch>.oci.tar
# Environment: GPU_DOCTOR_TLS_VERIFY=false for a plain-HTTP test registry on 127.0.0.1.
# Needs skopeo and buildah (scripts/build-image.sh installs both).
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[push-image] %s\n' "$*" >&2; }
[ $# -ge 2 ] || { echo "usage: $0 REPO ARCHIVE [ARCHIVE...]" >&2; exit 2; }
REPO=$1; shift
TLS=${GPU_DOCTOR_TLS_VERIFY:-true}
VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' node_probe/protocol/version.py)
[ -n "$VERSION" ] || { log "cannot read __version__ from node_probe/protocol/version.py"; exit 1; }

list=gpu-doctor-release-$$
cleanup() { buildah manifest rm "$list" >/dev/null 2>&1 || true; rm -f "${digestfile:-}"; }
trap cleanup EXIT
buildah manifest create "$list" >/dev/null
for archive in "$@"; do
  [ -s "$archive" ] || { log "no such archive: $archive"; exit 1; }
  arch=$(skopeo inspect --config "oci-archive:$archive" | python3 -c 'import json,sys; print(json.load(sys.stdin)["architecture"])')
  digest=$(skopeo inspect --format '{{.Digest}}' "oci-archive:$archive")
  log "push $archive ($arch, $digest) -> $REPO:$VERSION-$arch"
  # --preserve-digests: the registry must hold the very manifest we built, or refuse
  skopeo copy -q --preserve-digests --dest-tls-verify="$TLS" \
    "oci-archive:$archive" "docker://$REPO:$VERSION-$arch"
  buildah manifest add --tls-verify="$TLS" --arch "$arch" --os linux "$list" "docker://$REPO@$digest" >/dev/null
done
digestfile=$(mktemp)
buildah manifest push --quiet --all --format oci --tls-verify="$TLS" --digestfile "$digestfile" \
  "$list" "docker://$REPO:$VERSION"
index=$(cat "$digestfile")
# what the registry serves under the tag must be the index we pushed
served=$(skopeo inspect --raw --tls-verify="$TLS" "docker://$REPO:$VERSION" | sha256sum | cut -d' ' -f1)
[ "sha256:$served" = "$index" ] || { log "the registry serves $served under $VERSION, not $index"; exit 1; }
log "pushed $REPO:$VERSION = $index"
echo "$REPO:$VERSION@$index"
