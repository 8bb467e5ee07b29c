"""A real gRPC device plugin serving the kubelet's v1beta1 DevicePlugin API on a unix socket.

Why: the device-plugin check must be tested against a real process with its own pid, a real
listening socket (found through /proc/net/unix and /proc/PID/fd) and real gRPC, including the
seed-000 failure: GetPreferredAllocation calling nvmlInit_v2 of a libnvidia-ml.so.1 that never
returns. It registers with nobody (there is no kubelet); it only serves its socket.

    python tests/fakes/fake_device_plugin.py --socket DIR/device-plugins/nvidia-gpu.sock \
        [--mode healthy|unhealthy|nvml-block] [--nvml-lib PATH] [--devices GPU-a,GPU-b] \
        [--no-preferred-allocation] [--call-log FILE]

Prints "READY <pid>" on stdout once it serves. Every RPC received is appended to --call-log
(one name per line) so tests can prove the probe never calls Allocate/PreStartContainer.
In nvml-block mode the library is dlopen()ed at start (the real plugin keeps NVML loaded) and
nvmlInit_v2 is called in every GetPreferredAllocation, as NVIDIA's plugin does; ctypes releases
the GIL, so the other RPCs keep answering while that handler thread is stuck.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import threading
from concurrent import futures
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import grpc  # noqa: E402

from node_probe.kubeletapi import deviceplugin_v1beta1_pb2 as pb  # noqa: E402
from node_probe.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pbg  # noqa: E402

_STOP = threading.Event()


class FakePlugin(pbg.DevicePluginServicer):
    def __init__(self, args) -> None:
        self.args = args
        self.devices = [d for d in args.devices.split(",") if d]
        self.nvml = ctypes.CDLL(args.nvml_lib) if args.nvml_lib else None
        self._log_lock = threading.Lock()

    def _log(self, name: str) -> None:
        if self.args.call_log:
            with self._log_lock, open(self.args.call_log, "a") as f:
                f.write(name + "\n")

    def GetDevicePluginOptions(self, request, context):
        self._log("GetDevicePluginOptions")
        return pb.DevicePluginOptions(
            pre_start_required=False,
            get_preferred_allocation_available=not self.args.no_preferred_allocation)

    def ListAndWatch(self, request, context):
        self._log("ListAndWatch")
        devs = []
        for i, d in enumerate(self.devices):
            health = "Unhealthy" if self.args.mode == "unhealthy" and i == 0 else "Healthy"
            devs.append(pb.Device(ID=d, health=health,
                                  topology=pb.TopologyInfo(nodes=[pb.NUMANode(ID=0)])))
        yield pb.ListAndWatchResponse(devices=devs)
        done = threading.Event()
        context.add_callback(done.set)
        while not done.wait(0.2) and not _STOP.is_set():
            pass

    def GetPreferredAllocation(self, request, context):
        self._log("GetPreferredAllocation")
        if self.args.mode == "nvml-block":
            rc = self.nvml.nvmlInit_v2()  # blocks forever with init=block
            self._log(f"nvmlInit_v2 returned {rc}")
        out = []
        for req in request.container_requests:
            chosen = list(req.must_include_deviceIDs)
            for d in req.available_deviceIDs:
                if len(chosen) >= req.allocation_size:
                    break
                if d not in chosen:
                    chosen.append(d)
            out.append(pb.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return pb.PreferredAllocationResponse(container_responses=out)

    def Allocate(self, request, context):
        self._log("Allocate")
        resp = pb.AllocateResponse()
        specs = (self.args.pass_device_specs or os.environ.get("PASS_DEVICE_SPECS", "false"))
        for req in request.container_requests:
            c = resp.container_responses.add()
            c.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(req.devices_ids)
            if specs.lower() == "true":
                for path in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"):
                    c.devices.add(container_path=path, host_path=path, permissions="rw")
        return resp

    def PreStartContainer(self, request, context):
        self._log("PreStartContainer")
        return pb.PreStartContainerResponse()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    # more sockets served by the same process, as NVIDIA's plugin does with the mixed MIG
    # strategy: one gRPC server per resource, one process (tests/data/captures/k8s-1.35/
    # healthy-nvidia-device-plugin.log: pid 15981 serves nvidia-gpu.sock and three
    # nvidia-mig-*.sock)
    ap.add_argument("--extra-socket", action="append", default=[])
    ap.add_argument("--mode", choices=("healthy", "unhealthy", "nvml-block"), default="healthy")
    ap.add_argument("--nvml-lib", default=None)
    ap.add_argument("--devices", default="GPU-11111111-2222-3333-4444-555555555555,"
                                         "GPU-66666666-7777-8888-9999-000000000000")
    ap.add_argument("--no-preferred-allocation", action="store_true")
    ap.add_argument("--call-log", default=None)
    # like NVIDIA's plugin: device specs in Allocate from a flag, $PASS_DEVICE_SPECS or a
    # config file with `passDeviceSpecs: true` (the probe reads these, it never calls Allocate)
    ap.add_argument("--pass-device-specs", nargs="?", const="true", default=None)
    ap.add_argument("--config-file", default=None)
    args = ap.parse_args(argv)
    if args.mode == "nvml-block" and not args.nvml_lib:
        ap.error("--mode nvml-block needs --nvml-lib")
    for sock in [args.socket, *args.extra_socket]:
        try:
            os.unlink(sock)
        except FileNotFoundError:
            pass
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pbg.add_DevicePluginServicer_to_server(FakePlugin(args), server)
    for sock in [args.socket, *args.extra_socket]:
        server.add_insecure_port("unix:" + sock)
    server.start()

    def stop(signum, frame):
        _STOP.set()
        server.stop(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("READY", os.getpid(), flush=True)
    server.wait_for_termination()
    # a handler thread may be stuck in nvmlInit_v2 forever: do not wait for it
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
