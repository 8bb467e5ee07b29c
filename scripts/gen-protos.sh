#!/usr/bin/env bash
# Regenerate node_probe/kubeletapi/*_pb2*.py from proto/ with grpcio-tools (in the venv).
#   scripts/gen-protos.sh            # regenerate
#   scripts/gen-protos.sh --check    # exit 1 if the committed stubs differ from a fresh run
# The protos are compiled with -I proto so their registered file names stay distinct
# (deviceplugin/v1beta1/api.proto, podresources/v1/api.proto); the generated absolute imports
# are rewritten to relative ones so the stubs live inside the node_probe package.
# After changing grpcio-tools, update the lower bounds of grpcio/protobuf in pyproject.toml to
# the versions the generated guards name (GRPC_GENERATED_VERSION, ValidateProtobufRuntimeVersion).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=node_probe/kubeletapi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m grpc_tools.protoc -I proto --python_out="$tmp" --pyi_out="$tmp" --grpc_python_out="$tmp" \
  deviceplugin/v1beta1/api.proto podresources/v1/api.proto
gen="$tmp/out"
mkdir -p "$gen"
for spec in deviceplugin/v1beta1:deviceplugin_v1beta1 podresources/v1:podresources_v1; do
  src=${spec%%:*}; name=${spec##*:}
  dotted=$(echo "$src" | sed 's#/#.#g')
  for suffix in _pb2.py _pb2.pyi _pb2_grpc.py; do
    sed -e "s#^from ${dotted} import api_pb2 as #from . import ${name}_pb2 as #" \
      "$tmp/$src/api$suffix" > "$gen/${name}${suffix}"
  done
done
if [ "${1:-}" = "--check" ]; then
  rc=0
  for f in "$gen"/*; do
    cmp -s "$f" "$OUT/$(basename "$f")" || { echo "stale: $OUT/$(basename "$f")" >&2; rc=1; }
  done
  exit $rc
fi
mkdir -p "$OUT"
cp "$gen"/* "$OUT"/
grep -h -E "GRPC_GENERATED_VERSION = |ValidateProtobufRuntimeVersion\(" -A 6 "$OUT"/deviceplugin_v1beta1_pb2*.py \
  | grep -E "GRPC_GENERATED_VERSION =|^\s+[0-9]+,$" | tr -d ' \n' ; echo
echo "generated into $OUT" >&2
