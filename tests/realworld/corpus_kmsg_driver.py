"""Kernel-log text without an Xid: driver errors in words, unknown driver lines, hung tasks.

Quoted exactly from the source; fed as /dev/kmsg records and as a pasted file
(test_kmsg_feed.py). The driver formats are in node_probe/host/nvrm.py with their
open-gpu-kernel-modules source lines.
"""
from tests.realworld.artifact import Artifact

OSS = "https://github.com/NVIDIA/open-gpu-kernel-modules/issues/"

ARTIFACTS = [
    Artifact(
        "nvsentinel#155-off-bus-no-xid", "https://github.com/NVIDIA/NVSentinel/issues/155",
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
        "               NVRM: fallen off the bus and is not responding to commands.\n"
        "[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).\n"
        "[ 1843.439669] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release Build  (dvs-builder@U22-I3-B10-02-5)  Mon Jun  2 13:13:04 UTC 2025",
        "kmsg", "the GPU fell off the bus without an Xid line (same state as Xid 79)",
        "NVSentinel learnt the message (PR #195); the node needs a reboot",
        "gpu.driver_error", "critical", "reboot"),
    Artifact(
        "oss#789-rminit-gsp", OSS + "789",
        "[  903.609564] NVRM: RmInitAdapter: Cannot initialize GSP firmware RM\n"
        "[  903.610907] NVRM: GPU 0000:98:00.0: RmInitAdapter failed! (0x62:0x65:1792)\n"
        "[  903.611884] NVRM: GPU 0000:98:00.0: rm_init_adapter failed, device minor number 0",
        "kmsg", "the driver cannot bring the GPU up (GSP firmware init fails): nvidia-smi finds no "
        "device", "none reported", "gpu.driver_error", "critical", "reset"),
    Artifact(
        "gpu-operator#649-rminit", "https://github.com/NVIDIA/gpu-operator/issues/649",
        "[ 1097.650222] NVRM: GPU 0000:04:01.0: RmInitAdapter failed! (0x11:0x45:2525)\n"
        "[ 1097.650377] NVRM: GPU 0000:04:01.0: rm_init_adapter failed, device minor number 0",
        "kmsg", "the driver cannot initialise the GPUs of the node, so the operator never "
        "becomes ready", "none reported", "gpu.driver_error", "critical", "reset"),
    Artifact(
        "gpu-operator#1146-rminit", "https://github.com/NVIDIA/gpu-operator/issues/1146",
        "Dec  2 11:49:53 worker4 kernel: [  885.242168] NVRM: GPU 0000:0a:00.0: RmInitAdapter failed! (0x24:0x72:1568)\n"
        "Dec  2 11:49:53 worker4 kernel: [  885.242457] NVRM: GPU 0000:0a:00.0: rm_init_adapter failed, device minor number 5",
        "kmsg", "one GPU of the node fails initialisation (with DBEs on another): the validator "
        "pods on that node crash", "take the GPU out / replace it",
        "gpu.driver_error", "critical", "reset"),
    Artifact(
        "oss#1151-rminit-after-79", OSS + "1151",
        "May 27 16:50:10 fedora kernel: NVRM: GPU 0000:09:00.0: rm_init_adapter failed, device minor number 0\n"
        "May 27 16:50:10 fedora kernel: NVRM: osInitNvMapping: *** Cannot attach gpu\n"
        "May 27 16:50:10 fedora kernel: NVRM: RmInitAdapter: osInitNvMapping failed, bailing out of RmInitAdapter\n"
        "May 27 16:50:10 fedora kernel: NVRM: GPU 0000:09:00.0: RmInitAdapter failed! (0x22:0x56:894)",
        "kmsg", "after a random Xid 79 the GPU cannot be attached again (a dying GPU)",
        "hardware replacement", "gpu.driver_error", "critical", "support"),
    Artifact(
        "oss#688-gpu-lost-assert", OSS + "688",
        "Feb 17 08:02:06 abggdna-DGX-Station-A100 kernel: NVRM: _issueRpcAndWait: rpcSendMessage failed with status 0x0000000f for fn 76!\n"
        "Feb 17 08:02:27 abggdna-DGX-Station-A100 kernel: NVRM: _issueRpcAndWait: rpcSendMessage failed with status 0x0000000f for fn 76!\n"
        "Feb 17 08:02:35 abggdna-DGX-Station-A100 kernel: NVRM: _issueRpcAndWait: rpcSendMessage failed with status 0x0000000f for fn 76!\n"
        "Feb 17 08:02:35 abggdna-DGX-Station-A100 kernel: NVRM: _issueRpcAndWait: rpcSendMessage failed with status 0x0000000f for fn 76!\n"
        "Feb 17 08:02:35 abggdna-DGX-Station-A100 kernel: NVRM: nvAssertOkFailedNoLog: Assertion failed: GPU lost from the bus [NV_ERR_GPU_IS_LOST] (0x0000000F) returned from rmStatus @ kernel_ce_gv100.c:106",
        "kmsg", "the GPU was lost from the bus (status 0xf = NV_ERR_GPU_IS_LOST) on a DGX "
        "Station; every RPC to it fails", "reboot; a driver fix was implemented",
        "gpu.driver_error", "critical", "reboot"),
    Artifact(
        "bazzite#4449-gsp-heartbeat", "https://github.com/ublue-os/bazzite/issues/4449",
        "     Mar 21 21:42:01 kernel: NVRM: GPU0 _kgspIsHeartbeatTimedOut: Heartbeat timed out, currentTimeMs 322227881 heartbeat 0 heartbeatWithOffsetMs 318098841 diff 4129040 timeout 5200\n"
        "     Mar 21 21:42:01 kernel: NVRM: GPU0 _kgspRpcRecvPoll: GSP RM heartbeat timed out",
        "kmsg", "the GSP firmware's heartbeat stopped: GSP timeouts hang the GPU",
        "none reported", "gpu.driver_error", "critical", "reset"),
    Artifact(
        "oss#1230-gsp-heartbeat-timeout", OSS + "1230",
        "[   24.302465] NVRM: GPU6 _kgspIsHeartbeatTimedOut: Heartbeat timed out, currentTimeMs 812751949 heartbeat 1899482 heartbeatWithOffsetMs 812745879 diff 6070 timeout 5200\n"
        "[   24.302484] NVRM: GPU6 _kgspIsHeartbeatTimedOut: Heartbeat timed out, currentTimeMs 812751949 heartbeat 1899482 heartbeatWithOffsetMs 812745879 diff 6070 timeout 5200\n"
        "[   84.300451] NVRM: GPU6 _threadNodeCheckTimeout: _threadNodeCheckTimeout: currentTime: f420db7018cc0 >= f420db7018cc0\n"
        "[   84.300463] NVRM: GPU6 _threadNodeCheckTimeout: _threadNodeCheckTimeout: Timeout was set to: 4000 msecs!\n"
        "[   84.300476] NVRM: GPU6 kbusSendSysmembarSingle_GH100: - timeout error waiting for startToken = 0x3 cnt=24105122\n"
        "[   84.300480] NVRM: GPU6 kgmmuCheckMemSubsysError_IMPL: Memory Subsystem Error detected. kbusSendSysmembarSingle failed.\n"
        "[   84.300482] NVRM: GPU6 _kgspCheckIfMemsysError: Unexpected error when checking for memory subsystem error: 0x72 \n"
        "[   84.300488] NVRM: GPU6 _kgspLogRpcTimeout: ********************************* GSP Timeout **********************************",
        "kmsg", "GPU6's GSP stopped answering at boot (heartbeat, then RPC timeouts)",
        "none reported", "gpu.driver_error", "critical", "reset"),
    Artifact(
        "gpud#1271-unknown-nvlink-line", "https://github.com/leptonai/gpud/pull/1271",
        "Jul 09 10:42:47 pool0-0082 kernel: NVRM: knvlinkDiscoverPostRxDetLinks_GH100: Getting peer0's postRxDetLinkMask failed!",
        # issue 40.8: the driver's NVLink core lines are rated, not only shown: the peers'
        # links were not detected, so the NVLinks never trained (GPUd marks it unhealthy)
        "kmsg", "an NVLink discovery failure GPUd had to learn to detect", "GPUd added a check",
        "gpu.driver_error", "critical", "did not train"),
    Artifact(
        "nccl#2241-unknown-vf-line", "https://github.com/NVIDIA/nccl/issues/2241",
        "kernel: NVRM: GPU1 kbifCacheVFInfo_GB100: Unable to read NV_PF0_INITIAL_AND_TOTAL_VFS",
        "kmsg", "a driver line next to NVLink Xids on a B200 node (fabric/NVLink issue)",
        "nvbug filed", "gpu.driver_message", "info", "recognise"),
    Artifact(
        "oss#1252-modeset-errors", "https://github.com/NVIDIA/open-gpu-kernel-modules/pull/1252",
        "      nvidia-modeset: ERROR: GPU:0: Failed to query display engine channel state: 0x0000ca7e:0:0:0x00000062\n"
        "      nvidia-modeset: ERROR: GPU:0: Failed to query display engine channel state: 0x0000ca7e:2:0:0x00000062",
        "kmsg", "the GPU had become unresponsive before nvidia-drm was unloaded; the unload hung",
        "a driver fix for the unload path", "gpu.driver_message", "info", "recognise"),
    Artifact(
        "returnn#1480-dmesg-H-uvm-hang", "https://github.com/rwth-i6/returnn/issues/1480",
        "[  +0.000049] task:python3.11      state:D stack:    0 pid:15277 ppid: 15257 flags:0x00000002\n"
        "[  +0.000006] Call Trace:\n"
        "[  +0.000003]  <TASK>\n"
        "[  +0.000004]  __schedule+0x23d/0x590\n"
        "[  +0.000011]  schedule+0x4e/0xb0\n"
        "[  +0.000003]  schedule_preempt_disabled+0xe/0x10\n"
        "[  +0.000003]  __mutex_lock.constprop.0+0x263/0x490\n"
        "[  +0.000005]  __mutex_lock_slowpath+0x13/0x20\n"
        "[  +0.000003]  mutex_lock+0x34/0x40\n"
        "[  +0.000005]  uvm_page_tree_get_ptes_async+0x93/0x970 [nvidia_uvm]\n"
        "[  +0.000084]  ? __kmalloc+0x179/0x330\n"
        "[  +0.000008]  ? alloc_internal.part.0+0x24/0x30 [nvidia_uvm]\n"
        "[  +0.000053]  uvm_page_table_range_vec_init+0x191/0x260 [nvidia_uvm]\n"
        "[  +0.000042]  uvm_page_table_range_vec_create+0x65/0xb0 [nvidia_uvm]\n"
        "[  +0.000042]  mem_map_gpu+0x68/0x210 [nvidia_uvm]\n"
        "[  +0.000034]  uvm_mem_map_gpu_kernel+0xcc/0x1a0 [nvidia_uvm]\n"
        "[  +0.000034]  uvm_api_alloc_semaphore_pool+0x19c/0x2f0 [nvidia_uvm]\n"
        "[  +0.000037]  uvm_ioctl+0x13e0/0x16f0 [nvidia_uvm]",
        "kmsg", "a torchrun process hangs in uvm_ioctl inside the NVIDIA UVM driver (D state)",
        "the node had to be rebooted", "kernel.hung_task", "critical", "driver"),
    Artifact(
        "k8s-device-plugin#77-nvc-driver-hang", "https://github.com/NVIDIA/k8s-device-plugin/issues/77",
        "[  721.028170] INFO: task nvc:[driver]:5403 blocked for more than 120 seconds.\n"
        "[  721.028229]       Tainted: P           O    4.4.146-1.el7.elrepo.x86_64 #1\n"
        "[  721.028273] \"echo 0 > /proc/sys/kernel/hung_task_timeout_secs\" disables this message.\n"
        "[  721.028323] nvc:[driver]    D ffff883f2cc43bd8     0  5403   5396 0x00000084\n"
        "[  721.028331]  ffff883f2cc43bd8 ffffffff8170e16e ffff883f33d62c80 ffff883f2cc44000\n"
        "[  721.028336]  ffffffffa0a53a9c ffff883f33d62c80 00000000ffffffff ffffffffa0a53aa0\n"
        "[  721.028341]  ffff883f2cc43bf0 ffffffff8170de85 ffffffffa0a53a98 ffff883f2cc43c00\n"
        "[  721.028346] Call Trace:\n"
        "[  721.028360]  [<ffffffff8170e16e>] ? schedule_preempt_disabled+0xe/0x10\n"
        "[  721.028368]  [<ffffffff8170de85>] schedule+0x35/0x80\n"
        "[  721.028374]  [<ffffffff8170e16e>] schedule_preempt_disabled+0xe/0x10\n"
        "[  721.028379]  [<ffffffff8170fca4>] __mutex_lock_slowpath+0xb4/0x130\n"
        "[  721.028383]  [<ffffffff8170fd3f>] mutex_lock+0x1f/0x2f\n"
        "[  721.028422]  [<ffffffffa09c376e>] uvm_gpu_retain_by_uuid+0x1e/0x40 [nvidia_uvm]",
        "kmsg", "nvidia-container-cli's driver thread is stuck on a UVM mutex in the kernel "
        "driver; containers cannot start and the load climbs", "reboot the node",
        "kernel.hung_task", "critical", "reboot"),
    Artifact(
        "gpud#117-xid45-then-hung", "https://github.com/leptonai/gpud/pull/117",
        "[Sat Oct 12 18:35:32 2024] NVRM: Xid (PCI:0000:61:00): 45, pid=1496200, name=distprovers-gpu, Ch 0000000a\n"
        "[Sat Oct 12 18:35:32 2024] NVRM: Xid (PCI:0000:61:00): 45, pid=1496200, name=distprovers-gpu, Ch 0000000b\n"
        "[Sat Oct 12 18:35:32 2024] NVRM: Xid (PCI:0000:61:00): 45, pid=1496200, name=distprovers-gpu, Ch 0000000c\n"
        "[Sat Oct 12 18:35:32 2024] NVRM: Xid (PCI:0000:61:00): 45, pid=1496200, name=distprovers-gpu, Ch 0000000d\n"
        "[Sat Oct 12 18:35:32 2024] NVRM: Xid (PCI:0000:61:00): 45, pid=1496200, name=distprovers-gpu, Ch 0000000e\n"
        "[Sat Oct 12 18:35:32 2024] NVRM: Xid (PCI:0000:61:00): 45, pid=1496200, name=distprovers-gpu, Ch 0000000f\n"
        "[Sat Oct 12 18:38:44 2024] INFO: task cache_mgr_event:620917 blocked for more than 120 seconds.\n"
        "[Sat Oct 12 18:38:44 2024]       Tainted: P           OE     5.15.0-97-generic #107-Ubuntu\n"
        "[Sat Oct 12 18:38:44 2024] \"echo 0 > /proc/sys/kernel/hung_task_timeout_secs\" disables this message.\n"
        "[Sat Oct 12 18:38:44 2024] task:cache_mgr_event state:D stack:    0 pid:620917 ppid:620571 flags:0x00000002",
        "kmsg", "after Xid 45, processes (and nvidia-smi) sit in D state: GPUd suggests a reboot",
        "reboot", "kernel.hung_task", "warning", "reboot"),
    Artifact(
        "oss#1045-fullchip-reset-asserts", OSS + "1045",
        "Jun 12 16:31:50 fedora-box kernel: NVRM: GPU0 nvAssertFailedNoLog: Assertion failed: (status == NV_OK) || (status == NV_ERR_GPU_IN_FULLCHIP_RESET) @ rs_client.c:844\n"
        "Jun 12 16:31:50 fedora-box kernel: NVRM: nvAssertFailedNoLog: Assertion failed: (status == NV_OK) || (status == NV_ERR_GPU_IN_FULLCHIP_RESET) @ rs_server.c:259",
        "kmsg", "assertions while the GPU was in a full-chip reset after GSP timeouts (Xid 119 -> "
        "154 lockups)", "none reported", "gpu.driver_message", "info", "recognise"),
    Artifact(
        "gpud#1209-off-bus-journal", "https://github.com/leptonai/gpud/pull/1209",
        "Feb 14 05:03:42 000-000-00000-1-gpu-1 kernel: nvidia 0000:18:00.0: enabling device (0140 -> 0142)\n"
        "\n"
        "Feb 14 05:03:42 000-000-00000-1-gpu-1 kernel: NVRM: The NVIDIA GPU 0000:18:00.0\n"
        "                                              NVRM: (PCI ID: 10de:2901) installed in this system has\n"
        "                                              NVRM: fallen off the bus and is not responding to commands.\n"
        "\n"
        "Feb 14 05:03:42 000-000-00000-1-gpu-1 kernel: nvidia: probe of 0000:18:00.0 failed with error -1",
        "kmsg", "a B200 fell off the bus at driver probe; newer drivers say so in three lines "
        "and no Xid (GPUd maps it to Xid 79)", "GPUd learnt the format; the node needs a reboot",
        "gpu.driver_error", "critical", "reboot"),
    Artifact(
        "oss#968-nv-open-q-deadlock", OSS + "968",
        "Nov 19 01:03:26.198647 myserver kernel: task:nv_open_q       state:D stack:0     pid:1014  tgid:1014  ppid:2      flags:0x00004000\n"
        "Nov 19 01:03:26.198686 myserver kernel: Call Trace:\n"
        "Nov 19 01:03:26.198721 myserver kernel:  <TASK>\n"
        "Nov 19 01:03:26.198752 myserver kernel:  __schedule+0x27c/0x6b0\n"
        "Nov 19 01:03:26.198836 myserver kernel:  schedule+0x33/0x110\n"
        "Nov 19 01:03:26.198878 myserver kernel:  schedule_preempt_disabled+0x15/0x30\n"
        "Nov 19 01:03:26.198916 myserver kernel:  rwsem_down_write_slowpath+0x27e/0x550\n"
        "Nov 19 01:03:26.198948 myserver kernel:  down_write+0x5c/0x80\n"
        "Nov 19 01:03:26.198978 myserver kernel:  os_acquire_rwlock_write+0x3c/0x70 [nvidia]\n"
        "Nov 19 01:03:26.199004 myserver kernel:  portSyncRwLockAcquireWrite+0x10/0x40 [nvidia]\n"
        "Nov 19 01:03:26.199034 myserver kernel:  rmapiLockAcquire+0x294/0x360 [nvidia]\n"
        "Nov 19 01:03:26.200733 myserver kernel:  kgspInitRm_IMPL+0xcad/0x1680 [nvidia]",
        "kmsg", "a deadlock in the NVIDIA driver when two containers open two GPUs at once "
        "(persistence mode off): every GPU open waits on the RM lock", "a driver with the fix "
        "(595 series); persistence mode avoids the path", "kernel.hung_task", "critical",
        "update"),
    Artifact(
        "oss#968-console-lock-deadlock", OSS + "968",
        "INFO: task python:564994 blocked for more than 122 seconds.\n"
        "task:python          state:D stack:0     pid:564994 tgid:564994 ppid:562534\n"
        "Call Trace:\n"
        " __schedule+0x27c/0x6b0\n"
        " schedule+0x33/0x110\n"
        " schedule_timeout+0x157/0x170\n"
        " ___down_common+0xfd/0x160\n"
        " __down_common+0x22/0xd0\n"
        " __down+0x1d/0x30\n"
        " down+0x54/0x80\n"
        " console_lock+0x25/0x70\n"
        " os_disable_console_access+0xe/0x20 [nvidia]\n"
        " RmShutdownAdapter+0x195/0x3e0 [nvidia]\n"
        " rm_shutdown_adapter+0x58/0x60 [nvidia]\n"
        " nv_shutdown_adapter+0xae/0x1d0 [nvidia]\n"
        " nv_close_device+0x11e/0x160 [nvidia]",
        "kmsg", "the same driver deadlock on 590.44.01: a task holds the RM API lock while "
        "blocked on console_lock in adapter shutdown, everything else queues behind it",
        "the 595 driver fix; persistence mode was disabled", "kernel.hung_task", "critical",
        "update"),
    Artifact(
        "ansible-slurm#287-api-mismatch-syslog", "https://github.com/stackhpc/ansible-slurm-appliance/issues/287",
        "Jun 30 11:07:05 gpu-0 kernel: NVRM: API mismatch: the client has the version 535.54.03, but#012NVRM: this kernel module has the version 530.30.02.  Please#012NVRM: make sure that this kernel module and all NVIDIA driver#012NVRM: components have the same version.",
        "kmsg", "the playbook upgraded the driver packages while the old kernel module stayed "
        "loaded (syslog escapes the message's newlines as #012)", "fixed by a reboot",
        "driver.version_mismatch", "critical", "reboot"),
    Artifact(
        "nvidia-docker#182-api-mismatch-journal", "https://github.com/NVIDIA/nvidia-docker/issues/182",
        "Aug 26 14:08:07 nyasara-linux kernel: NVRM: API mismatch: the client has the version 367.44, but\n"
        "                                      NVRM: this kernel module has the version 367.35.  Please\n"
        "                                      NVRM: make sure that this kernel module and all NVIDIA driver\n"
        "                                      NVRM: components have the same version.",
        "kmsg", "the driver was upgraded to 367.44 and the 367.35 module was still loaded",
        "a reboot", "driver.version_mismatch", "critical", "reboot"),
    Artifact(
        "pop-os-beta#137-api-mismatch-dmesg", "https://github.com/pop-os/beta/issues/137",
        "               NVRM: API mismatch: the client has the version 465.24.02, but\n"
        "               NVRM: this kernel module has the version 460.67.  Please\n"
        "               NVRM: make sure that this kernel module and all NVIDIA driver\n"
        "               NVRM: components have the same version.",
        "kmsg", "an OS upgrade brought the 465 driver while the 460 module was loaded, before "
        "the reboot", "reboot after the upgrade", "driver.version_mismatch", "critical",
        "reboot"),
    Artifact(
        "nvidia-all#394-api-mismatch-new-format", "https://github.com/Frogging-Family/nvidia-all/issues/394",
        "[    9.424670] NVRM: API mismatch: the client 'kwin_wayland' (pid 1005)\n"
        "               NVRM: has the version 595.84, but this kernel module has\n"
        "               NVRM: the version 595.80.  Please make sure that this\n"
        "               NVRM: kernel module and all NVIDIA driver components\n"
        "               NVRM: have the same version.",
        "kmsg", "user space upgraded to 595.84 but the DKMS module on disk is still 595.80 "
        "(modinfo), so a reboot alone loads the old module again", "rebuild the module for the "
        "new driver", "driver.version_mismatch", "critical", "DKMS"),
    Artifact(
        "bazzite#2668-api-mismatch-image", "https://github.com/ublue-os/bazzite/issues/2668",
        "[   12.014918] NVRM: API mismatch: the client has the version 570.153.02, but\n"
        "               NVRM: this kernel module has the version 570.144.  Please\n"
        "               NVRM: make sure that this kernel module and all NVIDIA driver\n"
        "               NVRM: components have the same version.\n"
        "[   12.105293] NVRM: API mismatch: the client has the version 570.153.02, but\n"
        "               NVRM: this kernel module has the version 570.144.  Please\n"
        "               NVRM: make sure that this kernel module and all NVIDIA driver\n"
        "               NVRM: components have the same version.\n"
        "[   12.107719] NVRM: API mismatch: the client has the version 570.153.02, but\n"
        "               NVRM: this kernel module has the version 570.144.  Please\n"
        "               NVRM: make sure that this kernel module and all NVIDIA driver\n"
        "               NVRM: components have the same version.\n"
        "[   23.991660] nvidia 0000:07:00.0: Direct firmware load for nvidia/570.144/gsp_ga10x.bin failed with error -2\n"
        "[   23.991667] NVRM: RmFetchGspRmImages: No firmware image found\n"
        "[   23.991672] NVRM: GPU 0000:07:00.0: RmInitAdapter failed! (0x61:0x56:1770)\n"
        "[   23.991822] NVRM: GPU 0000:07:00.0: rm_init_adapter failed, device minor number 0",
        "kmsg", "the image updated the user-space driver but not the kernel module (nor its GSP "
        "firmware): the desktop does not start", "(ublue-os/main#891) ship kmod and driver of "
        "one version", "driver.version_mismatch", "critical", "upgraded"),
]
