"""Xid lines as real nodes logged them, each with the cause its thread established.

Quoted exactly from the source (a line cut at the source's own cut is quoted up to there);
the feeding test (test_kmsg_feed.py) gives each to the probe as /dev/kmsg records in a host root
and as a pasted file.
"""
from tests.realworld.artifact import Artifact

OSS = "https://github.com/NVIDIA/open-gpu-kernel-modules/issues/"
GPUD = "https://github.com/leptonai/gpud/pull/"

ARTIFACTS = [
    Artifact(
        "gpud#46-xid13-then-109", GPUD + "46",
        "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter\n"
        "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Global Exception on (GPC 7, TPC 7, SM 0): Multiple Warp Errors\n"
        "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics Exception: ESR 0x57c730=0xc04000b 0x57c734=0x24 0x57c728=0x1f81fb60 0x57c72c=0x1174\n"
        "[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
        "kmsg", "one GPU logged application Xid 13s, then Xid 109 (context-switch timeout): the "
        "GPU stopped and needs a reset; the later Xid decides", "reset the GPU",
        "gpu.xid", "critical", "reset"),
    Artifact(
        "gpu-operator#1146-xid48", "https://github.com/NVIDIA/gpu-operator/issues/1146",
        "Dec  2 10:43:35 worker4 kernel: [240314.528856] NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr 0x7fdd60000 partition",
        "kmsg", "an uncorrectable double-bit ECC error on one GPU: the validator pods on that node "
        "kept crashing", "reset the GPU (row remapping takes effect), replace it if it repeats",
        "gpu.xid", "critical", "reset"),
    Artifact(
        "akash#244-xid94", "https://github.com/akash-network/support/issues/244",
        "[Fri Aug  9 13:32:56 2024] NVRM: Xid (PCI:0000:00:08): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1). RST: No, D-RST: No",
        "kmsg", "a contained ECC error: only the application that hit it is affected",
        "restart the application", "gpu.xid", "warning", "restart"),
    Artifact(
        "akash#244-xid31", "https://github.com/akash-network/support/issues/244",
        "[Mon Aug  5 03:54:13 2024] NVRM: Xid (PCI:0000:00:07): 31, pid=2512125, name=python3.10, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_8 faulted @ 0x73ac_1c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE",
        "kmsg", "an MMU fault of the application (illegal address)", "restart the application",
        "gpu.xid", "warning", "sanitizer"),
    Artifact(
        "akash#244-xid43", "https://github.com/akash-network/support/issues/244",
        "[Wed Jul 31 23:14:18 2024] NVRM: Xid (PCI:0000:00:05): 43, pid=1045242, name=pt_main_thread, Ch 00000008",
        "kmsg", "the driver stopped one faulting context; the GPU itself is fine",
        "none needed", "gpu.xid", "info", "healthy"),
    Artifact(
        "pytorch#51382-xid31-many-pids", "https://github.com/pytorch/pytorch/issues/51382",
        "[Fri Jan 29 23:42:34 2021] NVRM: Xid (PCI:0000:db:00): 31, pid=13641, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_10 faulted @ 0x7fd7_90743000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ\n"
        "[Sat Jan 30 00:05:20 2021] NVRM: Xid (PCI:0000:db:00): 31, pid=14323, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_10 faulted @ 0x7efe_ba290000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ\n"
        "[Sat Jan 30 00:32:48 2021] NVRM: Xid (PCI:0000:db:00): 31, pid=33275, Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_10 faulted @ 0x7f57_2c9e8000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
        "kmsg", "unrelated processes kept faulting on the same GPU: likely a faulty device",
        "take the GPU out of service", "gpu.xid", "warning", "hardware"),
    Artifact(
        "flashinfer#3869-xid13", "https://github.com/flashinfer-ai/flashinfer/issues/3869",
        "19:14:43  NVRM: Xid (PCI:0000:1a:00): 13, Graphics Exception: ESR 0x57e7b0=0x81e0017 0x57e7b4=0x24 0x57e7a8=0x1f81fb60 0x57e7ac=0x1174",
        "kmsg", "an out-of-bounds write in a FlashInfer kernel (application bug)",
        "fix the kernel", "gpu.xid", "warning", "out-of-range"),
    Artifact(
        "trtllm#15610-xid13", "https://github.com/NVIDIA/TensorRT-LLM/issues/15610",
        "[Wed Jun 24 15:44:20 2026] NVRM: Xid (PCI:0000:70:00): 13, Graphics SM Warp Exception on (GPC 1, TPC 1, SM 1): MMU Fault\n"
        "[Wed Jun 24 15:44:20 2026] NVRM: Xid (PCI:0000:70:00): 13, Graphics Exception: ESR 0x5167b0=0x80f0017 0x5167b4=0x20 0x5167a8=0x1f81fb60 0x5167ac=0x1174",
        "kmsg", "an illegal address in a customized TensorRT-LLM kernel (application bug)",
        "fix the kernel", "gpu.xid", "warning", "out-of-range"),
    Artifact(
        "oss#1150-xid45-after-nvlink", OSS + "1150",
        "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149\n"
        "kernel: NVRM: Xid (PCI:0000:ed:00): 45, pid=1818992, name=python3, Ch 0000000c caused by previous Xid 145\n"
        "kernel: NVRM: Xid (PCI:0000:ba:00): 45, pid=1818989, name=python3, Ch 00000002 caused by previous Xid 145\n"
        "kernel: NVRM: Xid (PCI:0000:97:00): 45, pid=1818987, name=python3, Ch 00000003 caused by previous Xid 145",
        "kmsg", "Xid 45 tears contexts down after NVLink errors (Xid 149, 145); the links stay "
        "inactive until the node reboots", "reboot", "gpu.xid", "critical", "nvlink"),
    Artifact(
        "gpud#1174-149-fatal", GPUD + "1174",
        "NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
        "kmsg", "a Fatal NVLink5 NETIR error", "reset the GPU", "gpu.xid", "critical", "reset"),
    Artifact(
        "gpud#1174-149-evt-fatal", GPUD + "1174",
        "NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x025001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
        "kmsg", "a Fatal NVLink5 link event (investigate the peer device)", "reset the GPU",
        "gpu.xid", "critical", "reset"),
    Artifact(
        "gpud#1174-145-nonfatal", GPUD + "1174",
        "NVRM: Xid (PCI:0018:01:00): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)",
        "kmsg", "a Nonfatal NVLink5 RLW error: GPUd had reported it as fatal by mistake",
        "none (watch the rate)", "gpu.xid", "info", "informational"),
    Artifact(
        "gpud#1174-94", GPUD + "1174",
        "NVRM: Xid (PCI:0000:9b:00): 94, pid=1234, name=python3, Contained ECC error",
        "kmsg", "a contained ECC error", "restart the application", "gpu.xid", "warning",
        "restart"),
    Artifact(
        "gpud#1160-144-nonfatal", GPUD + "1160",
        "NVRM: Xid (PCI:0000:01:00): 144, SAW_MVB Nonfatal XC0 i0 Link 0 (0x00000001 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)",
        "kmsg", "a Nonfatal NVLink5 SAW error (GPUd: warning, not fatal)", "none (watch the rate)",
        "gpu.xid", "info", "informational"),
    Artifact(
        "gpud#1160-149-evt38-fatal", GPUD + "1160",
        "NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 (0x026001c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)",
        "kmsg", "a Fatal NVLink5 NETIR link event", "reset the GPU", "gpu.xid", "critical",
        "reset"),
    Artifact(
        "nvsentinel#1357-145-nonfatal", "https://github.com/NVIDIA/NVSentinel/issues/1357",
        "NVRM: Xid (PCI:0000:c5:00): 145, RLW_SRC_TRACK Nonfatal XC1 i0 Link 17 (0x04084507 0x00000004 0x00000000 0x00000000 0x00000000 0x00000000",
        "kmsg", "the kernel says Nonfatal; DCGM's diag called the same event fatal (the bug): the "
        "driver's word wins", "none (watch the rate)", "gpu.xid", "info", "informational"),
    Artifact(
        "nvidia-docker#1648-xid119", "https://github.com/NVIDIA/nvidia-docker/issues/1648",
        "[Mon Mar  6 21:34:31 2023] NVRM: Xid (PCI:0000:61:00): 119, pid=977823, name=nvidia-smi, Timeout waiting for RPC from GSP! Expected function 76 (GSP_RM_CONTROL) (0x2080014b 0x5).\n"
        "[Mon Mar  6 21:35:16 2023] NVRM: Xid (PCI:0000:61:00): 119, pid=977772, name=nvidia-smi, Timeout waiting for RPC from GSP! Expected function 103 (GSP_RM_ALLOC) (0x208f 0x0).",
        "kmsg", "GSP RPC timeouts (a 525-driver GSP bug): containers cannot start on the GPU",
        "reset/reboot; a fixed driver (525.105.17) or GSP firmware disabled",
        "gpu.xid", "critical", "reset"),
    Artifact(
        "oss#659-xid119-init-done", OSS + "659",
        "Apr 24 13:23:29 banana kernel: NVRM: _kgspLogXid119: ********************************* GSP Timeout **********************************\n"
        "Apr 24 13:23:29 banana kernel: NVRM: _kgspLogXid119: Note: Please also check logs above.\n"
        "Apr 24 13:23:29 banana kernel: NVRM: nvAssertFailedNoLog: Assertion failed: expectedFunc == pHistoryEntry->function @ kernel_gsp.c:1744\n"
        "Apr 24 13:23:29 banana kernel: NVRM: GPU at PCI:0000:01:00: GPU-02187fd8-22a1-3f71-cd52-22af54f42481\n"
        "Apr 24 13:23:29 banana kernel: NVRM: Xid (PCI:0000:01:00): 119, pid=1671935, name=kworker/1:3, Timeout after 1149s of waiting for RPC response from GPU0 GSP! Expected function 4097 (GSP_INIT_DONE) (0x0 0x0).",
        "kmsg", "the GSP firmware stopped answering (stutters, GSP timeouts)",
        "reset the GPU / reboot", "gpu.xid", "critical", "reset"),
    Artifact(
        "dcgm-exporter#84-xid120-119", "https://github.com/NVIDIA/dcgm-exporter/issues/84",
        "[Mon Jul 25 16:46:04 2022] NVRM: Xid (PCI:0000:3b:00): 120, pid='<unknown>', name=<unknown>, GSP Error: Task 1 raised error code 0x5 for reason 0x0 at 0x63f01ac (0 more errors skipped)\n"
        "[Mon Jul 25 16:46:20 2022] NVRM: Xid (PCI:0000:3b:00): 119, pid='<unknown>', name=<unknown>, Timeout waiting for RPC from GSP! Expected function FREE (0x0 0x0).",
        "kmsg", "the GSP crashed after dcgm-exporter was SIGKILLed: nvidia-smi hangs, no process "
        "can use the GPU", "restart the server", "gpu.xid", "critical", "reset"),
    Artifact(
        "oss#502-xid109", OSS + "502",
        "[ 7839.537911] NVRM: Xid (PCI:0000:26:00): 109, pid=55914, name=re8.exe, Ch 00000046, errorString CTX SWITCH TIMEOUT, Info 0x2c02c",
        "kmsg", "a context-switch timeout froze the GPU's work", "reset the GPU / restart",
        "gpu.xid", "critical", "reset"),
    Artifact(
        "oss#363-xid31-chrome", OSS + "363",
        "NVRM: Xid (PCI:0000:08:00): 31, pid=169800, name=chrome, Ch 00000023, intr 00000000. MMU Fault: ENGINE CE0 HUBCLIENT_HSCE0 faulted @ 0x0_0abe0000. Fault is of type FAULT_PTE ACCESS_TYPE_VIRT_READ",
        "kmsg", "an application (Chrome) faulted; nothing else breaks", "none for the GPU",
        "gpu.xid", "warning", "application"),
    Artifact(
        "tinygrad#6947-xid31", "https://github.com/tinygrad/tinygrad/issues/6947",
        "[22859.081860] NVRM: Xid (PCI:0000:01:00): 31, pid=14292, name=python, Ch 00000030, intr 00000000. MMU Fault: ENGINE HOST0 HUBCLIENT_ESC faulted @ 0x10_00200000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
        "kmsg", "the application's (tinygrad NV backend) accesses fault: a software problem, "
        "not the GPU", "use the kernel modules tinygrad expects", "gpu.xid", "warning",
        "application"),
    Artifact(
        "gpu-burn#1-xid79", "https://github.com/wilicc/gpu-burn/issues/1",
        "[74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.",
        "kmsg", "the card fell off the bus under load (overheating or a faulty card)",
        "cooling / replace the card", "gpu.xid", "critical", "reboot"),
    Artifact(
        "nccl#2241-xid145-137", "https://github.com/NVIDIA/nccl/issues/2241",
        "kernel: NVRM: Xid (PCI:...): 145, RLW_RXPIPE Nonfatal XC0 i0 Link 11 (...)\n"
        "kernel: NVRM: Xid (PCI:...): 137, RLW_RXPIPE interrupt hit on link 11 on GPU0: PRIV Error",
        "kmsg", "NVLink / fabric manager problem under an AllGather deadlock: file an NVIDIA bug",
        # NVIDIA's catalog: Xid 137 is an application-level NVLink fault (immediate IGNORE,
        # XID_137_FLOW: sanitizer, then a bug report); it was critical only while unknown
        "report to NVIDIA (nvbug)", "gpu.xid", "warning", "support"),
    Artifact(
        "nvsentinel#288-xid45", "https://github.com/NVIDIA/NVSentinel/pull/288",
        "kernel: [16450076.463693] NVRM: Xid (PCI:0002:00:00): 45, pid=2864945, name=kit, Ch 0000000e",
        "kmsg", "Xid 45 alone: a context was torn down (kill, reset, after another error)",
        "follow the other Xid, if any", "gpu.xid", "info", "torn"),
    Artifact(
        "oss#1045-xid38-then-109", OSS + "1045",
        "kwi 15 07:56:59 testowy kernel: NVRM: GPU at PCI:0000:07:00: GPU-fb51809b-350a-99db-67b5-e16fc6d498ab\n"
        "kwi 15 07:56:59 testowy kernel: NVRM: Xid (PCI:0000:07:00): 38, pid=326, name=modprobe, channel 0x00000003 0000c597 00000000 00000000\n"
        "kwi 15 07:56:59 testowy kernel: NVRM: Xid (PCI:0000:07:00): 109, pid=326, name=modprobe, channel 0x00000007, errorString CTX SWITCH TIMEOUT, Info 0x74007",
        "kmsg", "a driver firmware error (Xid 38) then context-switch timeouts on an idle GPU: a "
        "driver/firmware problem for NVIDIA", "report to NVIDIA", "gpu.xid", "critical",
        "support"),
    Artifact(
        "bumblebee#677-xid32-31-card-died", "https://github.com/Bumblebee-Project/Bumblebee/issues/677",
        "[24128.828315] NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000000 intr 00004000\n"
        "[24128.828608] NVRM: Xid (PCI:0000:01:00): 32, Channel ID 00000000 intr 00004000\n"
        "[24128.834365] NVRM: Xid (PCI:0000:01:00): 31, Ch 00000003, engmask 00000101, intr 10000000",
        "kmsg", "the card itself was failing (it later died)", "none: the hardware died",
        "gpu.xid", "warning", "hardware"),
    Artifact(
        "oss#1146-xid109", OSS + "1146",
        "Sep 18 20:07:01 NVRM: Xid (PCI:0000:02:00): 109, pid=8494,   name=RenderThread, channel 0x0000000d, CTX SWITCH TIMEOUT, Info 0x14c011",
        "kmsg", "a context-switch timeout on a Blackwell GPU during a game: the GPU stopped the "
        "context", "reset / update the driver", "gpu.xid", "critical", "reset"),
    Artifact(
        "nvsentinel#1270-kernel-line-119", "https://github.com/NVIDIA/NVSentinel/pull/1270",
        "kernel: [16450076.435595] NVRM: Xid (PCI:0002:00:00): 119, pid=1582259, name=nvc:[driver], Timeout after 6s of waiting for RPC response from GPU1 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).",
        "kmsg", "a GSP RPC timeout; NVSentinel's remediation is a component (GPU) reset",
        "COMPONENT_RESET", "gpu.xid", "critical", "drain"),
    Artifact(
        "steam-headless#249-xid16-display", "https://github.com/Steam-Headless/docker-steam-headless/pull/249",
        "NVRM: Xid (PCI:0000:02:00): 16, pid=41466, name=Xorg, Head 00000003\n"
        "NVRM: krcWatchdogCallbackVblankRecovery_IMPL: RM has detected that 7 Seconds\n"
        "      without a Vblank Counter Update on head:D0\n"
        "nvidia-modeset: ERROR: GPU:0: Idling display engine timed out",
        "kmsg", "a client-requested 4K120 mode on a fake monitor pinned to a 165 MHz TMDS head "
        "wedged the display engine; Xorg hung, HAMi marked the GPU unhealthy", "fix the xorg "
        "monitor configuration; only a host reboot cleared the GPU", "gpu.xid", "critical",
        "monitor"),
    Artifact(
        "vkd3d-proton#1605-xid69", "https://github.com/HansKristian-Work/vkd3d-proton/issues/1605",
        "NVRM: Xid (PCI:0000:08:00): 69, pid=4729, name=F1_2021_dx12.ex, Class Error: ChId 00ce, Class 0000c597, Offset 00002388, Data fffffff0, ErrorCode 00000004\n"
        "NVRM: GPU at PCI:0000:08:00: GPU-a8fb3a3a-9dd5-b430-1b78-cb1f1ecd6079",
        "kmsg", "a graphics-engine class error from one shader: reproduced by the maintainer "
        "on another GPU and called an NVIDIA driver bug; the GPU itself is fine",
        "the previous driver (530.41.3) works", "gpu.xid", "warning", "driver"),
    Artifact(
        "oss#1151-xid79-gsp-lost", OSS + "1151",
        "NVRM: GPU at PCI:0000:06:00: GPU-0b6b7808-c002-f593-ac86-cd8e57757b94\n"
        "NVRM: GPU Board Serial Number: 0\n"
        "NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.\n"
        "NVRM: GPU 0000:06:00.0: GPU has fallen off the bus.\n"
        "NVRM: GPU 0000:06:00.0: GPU serial number is 0.\n"
        "NVRM: kgspRcAndNotifyAllChannels_IMPL: RC all channels for critical error 79.\n"
        "NVRM: _threadNodeCheckTimeout: API_GPU_ATTACHED_SANITY_CHECK failed!",
        "kmsg", "an RTX 5090 falls off the PCIe bus with no precursor; recovery needs a full "
        "reboot (another reporter's box was stable once moved to a dedicated power circuit)",
        "reboot; check the power feed", "gpu.xid", "critical", "reboot"),
    Artifact(
        "akash#209-xid79-crash-dump", "https://github.com/akash-network/support/issues/209",
        "[Mon Apr  8 17:04:05 2024] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.161.07  Sat Feb 17 22:55:48 UTC 2024\n"
        "[Tue Apr  9 01:21:38 2024] NVRM: GPU at PCI:0000:a1:00: GPU-979426f2-893a-7cbb-c4cf-81472f89a462\n"
        "[Tue Apr  9 01:21:38 2024] NVRM: Xid (PCI:0000:a1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
        "[Tue Apr  9 01:21:38 2024] NVRM: GPU 0000:a1:00.0: GPU has fallen off the bus.\n"
        "[Tue Apr  9 01:21:38 2024] NVRM: A GPU crash dump has been created. If possible, please run\n"
        "                           NVRM: nvidia-bug-report.sh as root to collect this data before\n"
        "                           NVRM: the NVIDIA kernel module is unloaded.",
        "kmsg", "one GPU of a provider node keeps falling off the bus; the lost GPU made the "
        "node spew thousands of failed pods", "cordon the node, reboot it, file an NVIDIA bug "
        "report", "gpu.xid", "critical", "reboot"),
    Artifact(
        "oss#1208-xid31-jax-jit", OSS + "1208",
        "NVRM: Xid (PCI:0000:01:00): 31, pid=<varies>, name=python3, channel 0x00000002,\n"
        "  intr 00000000. MMU Fault: ENGINE GRAPHICS GPC0 GPCCLIENT_T1_0 faulted\n"
        "  @ 0x0_00019000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
        "kmsg", "the application created a new jax.jit per optimisation run (~20 programs in one "
        "context) and faulted; the same on all three cards, not the hardware",
        "compile once and reuse the function", "gpu.xid", "warning", "application"),
    Artifact(
        "syv-ai#98-vllm-xid31-dflash2", "https://github.com/syv-ai/qwen38-27b-rtx3090/issues/98",
        "NVRM: Xid (PCI:0000:0a:00): 31, name=VLLM::EngineCor, channel 0x00000002.\n"
        "MMU Fault: ENGINE GRAPHICS GPC0/1/2/4 GPCCLIENT_T1_* faulted @ <varies>.\n"
        "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
        "kmsg", "vLLM's dflash2 speculative decoding faults within minutes at any setting, "
        "while SPEC=mtp on the same box runs for 9+ hours: the serving code path, not the GPU",
        "use SPEC=mtp", "gpu.xid", "warning", "application"),
    Artifact(
        "gpud-testdata-xid119-rpc-history",
        "https://github.com/leptonai/gpud/blob/main/components/accelerator/nvidia/xid/testdata/dmesg-with-xid-119.log",
        "[Sun Feb 23 16:24:18 2025] NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-b600-ac93-3616-d754b23d636d\n"
        "[Sun Feb 23 16:24:18 2025] NVRM: GPU Board Serial Number: 1650124014249\n"
        "[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).\n"
        "[Sun Feb 23 16:24:18 2025] NVRM: GPU4 GSP RPC buffer contains function 103 (GSP_RM_ALLOC) and data 0x0000000000002081 0x0000000000000004.\n"
        "[Sun Feb 23 16:24:18 2025] NVRM: GPU4 RPC history (CPU -> GSP):\n"
        "[Sun Feb 23 16:24:18 2025] NVRM:     entry function                   data0              data1              ts_start           ts_end             duration actively_polling\n"
        "[Sun Feb 23 16:24:18 2025] NVRM:      0    103  GSP_RM_ALLOC          0x0000000000002081 0x0000000000000004 0x00062ed1a6bd61fa 0x0000000000000000          y\n"
        "[Sun Feb 23 16:24:18 2025] NVRM:     -1    103  GSP_RM_ALLOC          0x0000000000002080 0x0000000000000004 0x00062ed1a6b51c6f 0x00062ed1a6b51f2a    699us",
        "kmsg", "a GSP RPC timeout on GPU4 with the driver's RPC history dump (a real node's "
        "dmesg GPUd keeps as test data): the GSP stopped answering", "reset the GPU / reboot",
        "gpu.xid", "critical", "reset"),
    Artifact(
        "oss#1045-xid62-pmu-halt", OSS + "1045",
        "Mar 11 10:37:00 dev.luketic kernel: NVRM: GPU at PCI:0000:01:00: GPU-cccfc25d-fc66-0d40-e289-3b1a1f5d7896\n"
        "Mar 11 10:37:00 dev.luketic kernel: NVRM: GPU Board Serial Number: 0\n"
        "Mar 11 10:37:00 dev.luketic kernel: NVRM: Xid (PCI:0000:01:00): 62, 3239edf9 0000c3d8 00000000 206dae60 206da022 206da190 206d85f6 206d8d86\n"
        "Mar 11 10:37:00 dev.luketic kernel: NVRM: GPU0 _kgspRpcGspEventPmuHalted: Received signal from GSP that PMU has halted.",
        "kmsg", "the GPU's PMU micro-controller halted (Xid 62) on an idle desktop: firmware; "
        "the system needed a hard reset", "hard reset; driver/firmware update",
        "gpu.xid", "critical", "reset"),
    Artifact(
        "nixpkgs#334180-xid13-after-suspend", "https://github.com/NixOS/nixpkgs/issues/334180",
        "[  409.775718] NVRM: Xid (PCI:0000:01:00): 13, Graphics Exception: Shader Program Header 11 Error                                                                                     \n"
        "[  409.775722] NVRM: Xid (PCI:0000:01:00): 13, Graphics Exception: Shader Program Header 18 Error                                                                                     \n"
        "[  409.775842] NVRM: Xid (PCI:0000:01:00): 13, Graphics Exception: ESR 0x405840=0xa0040800                                                                                            ",
        "kmsg", "a vLLM container left running through a suspend faulted on resume: the "
        "application's GPU state did not survive; the GPU is fine", "stop the workload before "
        "suspending; reload the module", "gpu.xid", "warning", "restart"),
]
