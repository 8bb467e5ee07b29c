"""Generated Python stubs for the two kubelet gRPC APIs the probe speaks.

Why committed: the probe image must not need protoc. The sources are proto/deviceplugin/v1beta1/
api.proto and proto/podresources/v1/api.proto (wire-compatible with k8s.io/kubelet); regenerate
with scripts/gen-protos.sh. The generated modules carry version guards (grpcio and protobuf
must be at least what pyproject.toml says). Nothing is imported here on purpose: node_probe must
import without grpcio/protobuf, so callers import the *_pb2 modules lazily.
"""
