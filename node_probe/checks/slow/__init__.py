"""Why is it slow: pure judges of GPUs that run degraded without raising an Xid (issue 38).

Why a package of pure functions: the same verdicts come from three sources -- the live probe
(the NVML child plus sysfs), the offline parsers (`nvidia-smi -q` text/XML, `lspci -vvv`, an
nvidia-bug-report) and the agent's watch pass -- so the judging takes plain records and
returns findings, and reads nothing itself. The records below are THE CONTRACT between the
NVML child (host/nvml_child.py), the sysfs reader (host/pcie_links.py), the offline parsers
and these judges. A key that is absent or None means "not known / the source could not say":
never invent a value; a judge that lacks what it needs says nothing rather than guess.

(a) One GPU record (an element of the `nvml` fact's "gpus"; the keys the NVML child already
    fills -- index, uuid, name, pci_bus_id, processes, remapped_rows, ... -- stay as they are):
    "pcie": {"gen_cur", "width_cur", "gen_max", "width_max", "gen_gpu_max", "width_gpu_max"}
        ints. gen_max/width_max = nvmlDeviceGetMaxPcieLinkGeneration/Width: what the GPU AND
        the system both support; gen_gpu_max = nvmlDeviceGetGpuMaxPcieLinkGeneration (the
        GPU alone); width_gpu_max has no NVML call (offline parsers may fill it).
    "utilization_gpu_pct": int (nvmlDeviceGetUtilizationRates().gpu)
    "clocks": {"event_reasons": int, "sm_mhz", "sm_max_mhz", "mem_mhz", "mem_max_mhz"}
        event_reasons: NVML's bitmask of nvmlClocksEventReason* (the older name
        nvmlClocksThrottleReason*; same bits, see REASONS in clocks.py).
    "temperature": {"gpu_c", "slowdown_c", "shutdown_c"}
    "power": {"draw_w", "limit_w", "default_limit_w"}   watts, floats
    "nvlink": [{"link": int, "active": bool,
                "errors": {"replay": int, "recovery": int, "crc_flit": int, "crc_data": int}}]
        only the links NVML answers for (a GPU without NVLink: [] or absent).
    "ecc": {"sbe_volatile": int, "dbe_volatile": int, "retired_pending": bool}
    "processes": [{"pid": int, "used_memory_bytes": int|None}] (as before; None = unknown)

(b) One PCIe link record per PCI function (host/pcie_links.py from
    /sys/bus/pci/devices/<bdf>/{current,max}_link_{speed,width}; offline: `lspci -vvv`
    LnkSta/LnkCap):
    {"bdf": "0000:3b:00.0", "speed_cur_gts": float, "width_cur": int,
     "speed_max_gts": float, "width_max": int, "upstream": "<bdf of the bridge above>"|None}
    Links are passed to the judges as a mapping bdf -> record (bdf lower case, 4-digit domain:
    _gpufacts.norm_bus_id form). GT/s maps to a generation with pcie.GEN_OF_GTS
    (2.5->1, 5->2, 8->3, 16->4, 32->5, 64->6).

(c) Holders: the pods that hold each GPU, a mapping GPU UUID -> list of "namespace/pod"
    strings (from pod-resources in the probe; offline: empty).

Entry point for every source: judge.judge_gpus(gpus, links=None, holders=None,
previous=None) -> list[Finding] (previous: an earlier sample of the same GPU records, for
counters that must be seen rising). Each sub-module also exposes its own judge
(pcie.judge, clocks.judge, nvlink.judge, memory.judge) taking one GPU record.
"Busy" (_common.busy) is utilisation above 0 %; running compute processes count only where
NVML gives no utilisation (a process idling with a context open lets the link drop to Gen1).
Healthy controls every judge keeps: an idle GPU at Gen1 raises nothing (NVIDIA GPUs drop the
link to Gen1 when idle, by design); idle and application-clock reasons raise nothing; a busy
GPU at full link and clocks raises nothing.
"""
