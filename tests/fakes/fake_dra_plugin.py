"""A stand-in kubelet DRA plugin process: a registration server (pluginregistration v1, stubs
generated from tests/beyond/protos by grpcio-tools) and a plugin endpoint server on real unix
sockets, as a DRA driver's kubelet plugin runs them.

Why a separate process: a hung plugin is tested by stopping this process (SIGSTOP), a dead one
by killing it with its sockets left behind, exactly what the kubelet meets on a node. The
endpoint server logs every method it is asked for, so tests can prove the probe never calls
NodePrepareResources/NodeUnprepareResources.

    python fake_dra_plugin.py STUBS_DIR REGISTRY_SOCK ENDPOINT_SOCK NAME ENDPOINT HEALTH LOG
HEALTH: serving | not_serving | none (health service not implemented)
"""
from __future__ import annotations

import sys
import time
from concurrent import futures

import grpc


def main(argv: list[str]) -> int:
    stubs, reg_sock, ep_sock, name, endpoint, health, log = argv
    sys.path.insert(0, stubs)
    import pluginregistration_pb2 as pb
    import pluginregistration_pb2_grpc as pbg

    class Registration(pbg.RegistrationServicer):
        def GetInfo(self, request, context):
            return pb.PluginInfo(type="DRAPlugin", name=name, endpoint=endpoint,
                                 supported_versions=["v1.DRAPlugin", "v1beta1.DRAPlugin"])

        def NotifyRegistrationStatus(self, request, context):
            return pb.RegistrationStatusResponse()

    class Endpoint(grpc.GenericRpcHandler):
        def service(self, details):
            with open(log, "a") as f:
                f.write(details.method + "\n")
            if details.method == "/grpc.health.v1.Health/Check" and health != "none":
                # HealthCheckResponse{status: SERVING(1) | NOT_SERVING(2)}
                reply = b"\x08\x01" if health == "serving" else b"\x08\x02"
                return grpc.unary_unary_rpc_method_handler(lambda req, ctx: reply)
            return None

    reg = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pbg.add_RegistrationServicer_to_server(Registration(), reg)
    reg.add_insecure_port(f"unix://{reg_sock}")
    ep = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=[Endpoint()])
    ep.add_insecure_port(f"unix://{ep_sock}")
    reg.start()
    ep.start()
    print("ready", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
