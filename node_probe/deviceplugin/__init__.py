"""Device plugins as the kubelet sees them: discovery, read-only RPCs, pod-resources, /dev view.

Why a package: the `deviceplugin` check (node_probe/checks/deviceplugin.py) joins several
independent pieces of evidence (sockets and processes, gRPC with deadlines, the thread view of
node_probe.host.proctasks, the eBPF trace), and each piece is tested on its own against real
processes and sockets. grpcio is imported lazily by rpc/podresources only.
"""
