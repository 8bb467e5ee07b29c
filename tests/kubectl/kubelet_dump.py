"""Builds a realistic kubelet goroutine dump (`/debug/pprof/goroutine?debug=2`) for tests.

Modelled on seed 000: kubelet 1.27 whose pod sync loop is parked in the device manager's
GetPreferredAllocation call to the NVIDIA device plugin (call chain kubelet.go syncLoop ->
HandlePodAdditions -> canAdmitPod -> topologymanager Admit -> scope.allocateAlignedResources ->
devicemanager Allocate -> allocateContainerResources -> devicesToAllocate ->
callGetPreferredAllocationIfAvailable -> endpoint.getPreferredAllocation -> gRPC), plus the
ordinary background goroutines every kubelet has, in Go's exact debug=2 layout (header line,
then function line and tab-indented file:line +0xNN pairs, "created by ... in goroutine N").
"""
from __future__ import annotations

SRC = "/workspace/src/k8s.io/kubernetes/_output/local/go/src/k8s.io/kubernetes"
VENDOR = f"{SRC}/vendor"


def _frames(pairs: list[tuple[str, str]]) -> str:
    return "".join(f"{fn}\n\t{loc}\n" for fn, loc in pairs)


def _goroutine(gid: int, state: str, pairs: list[tuple[str, str]], created_by: str,
               created_in: int, created_loc: str) -> str:
    return (f"goroutine {gid} [{state}]:\n" + _frames(pairs)
            + f"created by {created_by} in goroutine {created_in}\n\t{created_loc}\n\n")


def stuck_in_get_preferred_allocation(gid: int, minutes: int, via_sync_loop: bool) -> str:
    grpc = [
        ("google.golang.org/grpc/internal/transport.(*Stream).waitOnHeader(0xc001b2c480)",
         f"{VENDOR}/google.golang.org/grpc/internal/transport/transport.go:328 +0x7d"),
        ("google.golang.org/grpc/internal/transport.(*Stream).RecvCompress(...)",
         f"{VENDOR}/google.golang.org/grpc/internal/transport/transport.go:343"),
        ("google.golang.org/grpc.(*csAttempt).recvMsg(0xc000ef6f70, {0x3c5ae60?, 0xc001bd2a50}, 0x0?)",
         f"{VENDOR}/google.golang.org/grpc/stream.go:1046 +0xc5"),
        ("google.golang.org/grpc.(*clientStream).RecvMsg.func1(0x0?)",
         f"{VENDOR}/google.golang.org/grpc/stream.go:900 +0x25"),
        ("google.golang.org/grpc.(*clientStream).withRetry(0xc001e26240, 0xc001b97a38, 0xc001b97a08)",
         f"{VENDOR}/google.golang.org/grpc/stream.go:751 +0x144"),
        ("google.golang.org/grpc.(*clientStream).RecvMsg(0xc001e26240, {0x3c5ae60?, 0xc001bd2a50?})",
         f"{VENDOR}/google.golang.org/grpc/stream.go:899 +0x12e"),
        ("google.golang.org/grpc.invoke({0x44e5f00?, 0xc001e0e2a0?}, {0x3f4a27d?, 0x0?}, {0x3c5ab40, 0xc001bd2a20}, {0x3c5ae60, 0xc001bd2a50}, 0x0?, {0x0, 0x0, 0x0})",
         f"{VENDOR}/google.golang.org/grpc/call.go:73 +0xd7"),
        ("google.golang.org/grpc.(*ClientConn).Invoke(0xc000a2e000, {0x44e5f00, 0xc001e0e2a0}, {0x3f4a27d, 0x3a}, {0x3c5ab40, 0xc001bd2a20}, {0x3c5ae60, 0xc001bd2a50}, {0x0, 0x0, 0x0})",
         f"{VENDOR}/google.golang.org/grpc/call.go:37 +0x23f"),
        ("k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1.(*devicePluginClient).GetPreferredAllocation(0xc000b1e2a8, {0x44e5f00, 0xc001e0e2a0}, 0xc001bd2a20, {0x0, 0x0, 0x0})",
         f"{VENDOR}/k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.pb.go:1417 +0xc9"),
        ("k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.(*endpointImpl).getPreferredAllocation(0xc000c2e0a0, {0xc001b95a40, 0x4, 0x4}, {0x0, 0x0, 0x0}, 0x1)",
         f"{SRC}/pkg/kubelet/cm/devicemanager/endpoint.go:126 +0x1a5"),
        ("k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.(*ManagerImpl).callGetPreferredAllocationIfAvailable(0xc00087e000, {0xc001c36f30, 0x24}, {0xc001c4e3c0, 0xb}, {0xc001c36f60, 0x16}, 0xc001d0a8d0, 0xc001d0a900, 0x1)",
         f"{SRC}/pkg/kubelet/cm/devicemanager/manager.go:995 +0x2b2"),
        ("k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.(*ManagerImpl).devicesToAllocate(0xc00087e000, {0xc001c36f30, 0x24}, {0xc001c4e3c0, 0xb}, {0xc001c36f60, 0x16}, 0x1, 0xc001d0a7b0?)",
         f"{SRC}/pkg/kubelet/cm/devicemanager/manager.go:623 +0x1225"),
        ("k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.(*ManagerImpl).allocateContainerResources(0xc00087e000, 0xc001d8a480, 0xc001d7e000, 0xc001d0a5a0?)",
         f"{SRC}/pkg/kubelet/cm/devicemanager/manager.go:801 +0x3c5"),
        ("k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.(*ManagerImpl).Allocate(0xc00087e000, 0xc001d8a480, 0xc001d7e000)",
         f"{SRC}/pkg/kubelet/cm/devicemanager/manager.go:370 +0x1b0"),
        ("k8s.io/kubernetes/pkg/kubelet/cm/topologymanager.(*scope).allocateAlignedResources(0xc000875a40, 0xc001d8a480, 0xc001d7e000)",
         f"{SRC}/pkg/kubelet/cm/topologymanager/scope.go:152 +0x92"),
        ("k8s.io/kubernetes/pkg/kubelet/cm/topologymanager.(*containerScope).Admit(0xc000875a40, 0xc001d8a480)",
         f"{SRC}/pkg/kubelet/cm/topologymanager/scope_container.go:53 +0x1ca"),
        ("k8s.io/kubernetes/pkg/kubelet/cm/topologymanager.(*manager).Admit(0xc0008d6050, 0xc001d0a240)",
         f"{SRC}/pkg/kubelet/cm/topologymanager/topology_manager.go:219 +0x7f"),
    ]
    if via_sync_loop:
        tail = [
            ("k8s.io/kubernetes/pkg/kubelet.(*Kubelet).canAdmitPod(0xc000a3e000, {0xc001d7c400, 0x16, 0x20}, 0xc001d8a480)",
             f"{SRC}/pkg/kubelet/kubelet.go:2552 +0x1a3"),
            ("k8s.io/kubernetes/pkg/kubelet.(*Kubelet).HandlePodAdditions(0xc000a3e000, {0xc001d7a5e0?, 0x1, 0x1})",
             f"{SRC}/pkg/kubelet/kubelet.go:2499 +0x4f8"),
            ("k8s.io/kubernetes/pkg/kubelet.(*Kubelet).syncLoopIteration(0xc000a3e000, {0x44e5f38, 0xc00012a000}, 0xc000b38a20, {0x44f3e50, 0xc000a3e000}, 0xc001a6c3c0, 0xc001a6c420, 0xc000b38b40)",
             f"{SRC}/pkg/kubelet/kubelet.go:2376 +0x4ec"),
            ("k8s.io/kubernetes/pkg/kubelet.(*Kubelet).syncLoop(0xc000a3e000, {0x44e5f38, 0xc00012a000}, 0x0?, {0x44f3e50, 0xc000a3e000})",
             f"{SRC}/pkg/kubelet/kubelet.go:2282 +0x3f2"),
            ("k8s.io/kubernetes/pkg/kubelet.(*Kubelet).Run(0xc000a3e000, 0x0?)",
             f"{SRC}/pkg/kubelet/kubelet.go:1635 +0x866"),
        ]
        return _goroutine(gid, f"select, {minutes} minutes", grpc + tail,
                          "k8s.io/kubernetes/cmd/kubelet/app.startKubelet", 1,
                          f"{SRC}/cmd/kubelet/app/server.go:1240 +0xe5")
    tail = [
        ("k8s.io/kubernetes/pkg/kubelet.(*Kubelet).canAdmitPod(0xc000a3e000, {0xc001e1c000, 0x17, 0x20}, 0xc001e2e480)",
         f"{SRC}/pkg/kubelet/kubelet.go:2552 +0x1a3"),
        ("k8s.io/kubernetes/pkg/kubelet.(*Kubelet).HandlePodAdditions(0xc000a3e000, {0xc001e1a5e0?, 0x1, 0x1})",
         f"{SRC}/pkg/kubelet/kubelet.go:2499 +0x4f8"),
        ("k8s.io/kubernetes/pkg/kubelet/config.(*podStorage).Merge.func1()",
         f"{SRC}/pkg/kubelet/config/config.go:223 +0x57"),
    ]
    return _goroutine(gid, f"select, {minutes} minutes", grpc + tail,
                      "k8s.io/kubernetes/pkg/kubelet/config.(*podStorage).Merge", 211,
                      f"{SRC}/pkg/kubelet/config/config.go:210 +0x3b5")


def background(start_gid: int = 1) -> str:
    g = start_gid
    parts = [
        _goroutine(g, "running", [
            ("runtime/pprof.writeGoroutineStacks({0x44b7e40, 0xc001f2a1c0})",
             "/usr/local/go/src/runtime/pprof/pprof.go:703 +0x6a"),
            ("runtime/pprof.writeGoroutine({0x44b7e40?, 0xc001f2a1c0?}, 0x2?)",
             "/usr/local/go/src/runtime/pprof/pprof.go:692 +0x25"),
            ("net/http/pprof.handler.ServeHTTP({0xc001f36031, 0x9}, {0x44dc3a0, 0xc001f2a1c0}, 0xc001f3a000?)",
             "/usr/local/go/src/net/http/pprof/pprof.go:249 +0x4a5"),
            ("net/http.(*conn).serve(0xc001f32000, {0x44e5ea8, 0xc000e7a8d0})",
             "/usr/local/go/src/net/http/server.go:2009 +0x5f4"),
        ], "net/http.(*Server).Serve", 305, "/usr/local/go/src/net/http/server.go:3086 +0x5cb"),
        _goroutine(g + 6, "chan receive, 70 minutes", [
            ("k8s.io/klog/v2.(*flushDaemon).run.func1()",
             f"{VENDOR}/k8s.io/klog/v2/klog.go:1159 +0x127"),
        ], "k8s.io/klog/v2.(*flushDaemon).run", 1, f"{VENDOR}/k8s.io/klog/v2/klog.go:1155 +0x17f"),
        _goroutine(g + 93, "select", [
            ("k8s.io/client-go/tools/cache.(*Reflector).watch(0xc000b52000, {0x0, 0x0}, 0xc000112540, 0xc000c84a20)",
             f"{VENDOR}/k8s.io/client-go/tools/cache/reflector.go:483 +0x66d"),
            ("k8s.io/client-go/tools/cache.(*Reflector).ListAndWatch(0xc000b52000, 0xc000112540)",
             f"{VENDOR}/k8s.io/client-go/tools/cache/reflector.go:325 +0x4de"),
        ], "k8s.io/apimachinery/pkg/util/wait.(*Group).StartWithChannel.func1", 119,
            f"{VENDOR}/k8s.io/apimachinery/pkg/util/wait/wait.go:55 +0x5b"),
        _goroutine(g + 140, "select, 3 minutes", [
            ("k8s.io/kubernetes/pkg/kubelet/nodelease.(*controller).Run(...)",
             f"{VENDOR}/k8s.io/component-helpers/apimachinery/lease/controller.go:95 +0x1f0"),
        ], "k8s.io/kubernetes/pkg/kubelet.(*Kubelet).Run", 1,
            f"{SRC}/pkg/kubelet/kubelet.go:1603 +0x6d9"),
        _goroutine(g + 171, "IO wait", [
            ("internal/poll.runtime_pollWait(0x7f4e8c6a1d88, 0x72)",
             "/usr/local/go/src/runtime/netpoll.go:306 +0x89"),
            ("internal/poll.(*FD).Accept(0xc000c1e000)",
             "/usr/local/go/src/internal/poll/fd_unix.go:614 +0x2bd"),
            ("google.golang.org/grpc.(*Server).Serve(0xc000c0a1e0, {0x44d9a00?, 0xc000bcc058})",
             f"{VENDOR}/google.golang.org/grpc/server.go:824 +0x475"),
        ], "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1.(*server).Start", 1,
            f"{SRC}/pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go:114 +0x5d0"),
        _goroutine(g + 230, "sync.Cond.Wait, 11 minutes", [
            ("sync.runtime_notifyListWait(0xc0009a4b50, 0x1c7)",
             "/usr/local/go/src/runtime/sema.go:527 +0x159"),
            ("k8s.io/kubernetes/pkg/kubelet.(*podWorkers).podWorkerLoop(0xc000a78000, {0xc001c36f30, 0x24}, 0xc001a6c3c0?)",
             f"{SRC}/pkg/kubelet/pod_workers.go:1196 +0x2d4"),
        ], "k8s.io/kubernetes/pkg/kubelet.(*podWorkers).UpdatePod", 304,
            f"{SRC}/pkg/kubelet/pod_workers.go:945 +0x1ff6"),
    ]
    return "".join(parts)


def wedged_kubelet_dump(stuck: int = 2, minutes: int = 11) -> str:
    """A dump with `stuck` goroutines inside callGetPreferredAllocationIfAvailable."""
    text = background(1)
    for i in range(stuck):
        text += stuck_in_get_preferred_allocation(312 + i * 97, minutes - i, via_sync_loop=i == 0)
    return text


def healthy_kubelet_dump() -> str:
    return background(1)


HEALTHZ_SYNCLOOP_FAILED = ("[+]ping ok\n[+]log ok\n[-]syncloop failed: reason withheld\n"
                           "healthz check failed\n")
