"""NVIDIA's Xid catalog: what each Xid code means and what NVIDIA says to do about it.

Why here, in the protocol: the probe reads Xid lines in the kernel log (node_probe/host/xid.py)
and the client reads Xid codes that other monitors put in node conditions (EKS's
`NvidiaXID79Error`, GKE's `XidCriticalError` reason, NVSentinel's `ErrorCode:119`,
kubectl_gpudoctor/analysis/foreign.py); both must give one code one meaning and one action, and
the client may import only node_probe.protocol. Facts from NVIDIA's catalog ("Analyzing Xid
Errors with the Xid Catalog", CATALOG_URL): each code's mnemonic, description and *resolution
bucket* (the immediate action: RESTART_APP, RESET_GPU, RESTART_BM, CONTACT_SUPPORT, IGNORE, or a
named workflow). Pure data and the standard library only.
"""
from __future__ import annotations

import dataclasses

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"

# the buckets we report, from NVIDIA's immediate-action column
RESTART_APP = "restart_app"       # RESTART_APP: the application must be restarted
RESET_GPU = "reset_gpu"           # RESET_GPU (and WORKFLOW_XID_48 / NVLink workflows when fatal)
REBOOT = "reboot"                 # RESTART_BM / RESTART_VM: reboot the machine
CONTACT_SUPPORT = "contact_support"  # drain the node and contact NVIDIA / the hardware vendor
IGNORE = "ignore"                 # informational; count it, do not act on one

BUCKET_TEXT = {
    RESTART_APP: "restart the application (the GPU itself is fine)",
    RESET_GPU: "drain the GPU's pods and reset the GPU (nvidia-smi -r -i <bus id>) or reboot",
    REBOOT: "drain the node and reboot it",
    CONTACT_SUPPORT: "drain the node and contact NVIDIA / the hardware vendor",
    IGNORE: "no action (informational); watch the rate",
}
SEVERITY = {RESTART_APP: "warning", RESET_GPU: "critical", REBOOT: "critical",
            CONTACT_SUPPORT: "critical", IGNORE: "info"}


@dataclasses.dataclass(frozen=True)
class Xid:
    code: int
    mnemonic: str
    meaning: str
    bucket: str            # one of the bucket constants above
    nvidia_bucket: str     # the catalog's immediate-action column, verbatim
    blame: str             # usual first suspect: application, hardware, driver, system
    action: str            # what to do, in words

    @property
    def severity(self) -> str:
        return SEVERITY[self.bucket]


_X = Xid
_NVLINK5 = ("NVLink5 error (Blackwell): NVIDIA's WORKFLOW_NVLINK5_ERR decodes the error status "
            "in the message; fatal statuses need a GPU reset, the others are informational. "
            "Drain the GPU's pods, reset the GPU; contact support if it repeats.")
XIDS: dict[int, Xid] = {x.code: x for x in (
    _X(8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "GPU stopped processing", RESTART_APP,
       "RESTART_APP", "application", "Restart the application; if it repeats, check the job."),
    _X(13, "ROBUST_CHANNEL_GR_EXCEPTION", "Graphics Engine Exception", RESTART_APP,
       "RESTART_APP", "application",
       "Usually an out-of-range access in the application's kernel; check the job's logs. "
       "If many unrelated jobs hit it on one GPU, suspect the hardware."),
    _X(16, "ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", "Display engine hung", RESET_GPU,
       "CONTACT_SUPPORT", "driver",
       "The display engine stopped (no vblank on a head): usually a display mode the head "
       "cannot drive -- a virtual or headless monitor configuration asking for more than the "
       "head's pixel clock -- or a display driver bug. The display stays wedged (Xorg hangs) "
       "until the GPU is reset or the node rebooted; fix the monitor configuration first. "
       "Data-centre GPUs without display never log it (NVIDIA's catalog: unused)."),
    _X(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", RESTART_APP,
       "RESTART_APP", "application",
       "An illegal memory access by the application: run it under compute-sanitizer memcheck. "
       "If unrelated jobs keep hitting it on one GPU, suspect the GPU (hardware)."),
    _X(32, "ROBUST_CHANNEL_PBDMA_ERROR", "Invalid or corrupted push buffer stream", RESTART_APP,
       "RESTART_APP", "system",
       "Restart the application; repeated 32s point at PCIe quality: check the link and "
       "system logs."),
    _X(38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", "Driver firmware error", IGNORE,
       "IGNORE", "driver",
       "A watchdog of the GPU's context-switch firmware (FECS) fired: informational by itself "
       "(NVIDIA: IGNORE; investigate with support if it repeats). Follow the other Xids on this "
       "GPU; repeated 38s with context-switch timeouts (Xid 109) are a driver/firmware problem "
       "to report to NVIDIA."),
    _X(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", IGNORE,
       "IGNORE", "application",
       "The driver stopped a faulting application context; the GPU stays healthy."),
    _X(45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "Preemptive cleanup, due to previous errors",
       IGNORE, "WORKFLOW_XID_45", "application",
       "A context was torn down (Ctrl-C, kill, reset, or after another Xid): follow the other "
       "Xid on this GPU, if any."),
    _X(46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "GPU stopped processing", RESET_GPU,
       "RESET_GPU", "driver", "Drain the GPU's pods and reset the GPU."),
    _X(48, "ROBUST_CHANNEL_GPU_ECC_DBE", "Double Bit ECC Error", RESET_GPU, "WORKFLOW_XID_48",
       "hardware",
       "Uncorrectable memory error: a GPU reset or node reboot is needed to clear it; check "
       "row remapping (nvidia-smi -q -d ROW_REMAPPER) and replace the GPU if it repeats."),
    _X(54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", "Auxiliary power is not connected to the "
       "GPU board", CONTACT_SUPPORT, "CHECK_MECHANICALS", "hardware",
       "The board's auxiliary power cable is missing or loose: the GPU runs at reduced clocks. "
       "Drain the node and check the power connectors (NVIDIA: CHECK_MECHANICALS)."),
    _X(62, "PMU_HALT_ERROR", "Internal micro-controller halt", RESET_GPU, "RESET_GPU",
       "hardware", "Firmware halted: drain and reset the GPU; update the driver."),
    _X(63, "INFOROM_DRAM_RETIREMENT_EVENT", "GPU memory remapping event", IGNORE, "IGNORE",
       "hardware",
       "A bad memory row was marked for remapping; it takes effect at the next GPU reset "
       "(see gpu.row_remap_pending). A rising rate leads to Xid 64."),
    _X(64, "INFOROM_DRAM_RETIREMENT_FAILURE", "GPU memory remapping failure", RESET_GPU,
       "RESET_GPU", "hardware",
       "The row could not be remapped: drain and reset the GPU; contact support (RMA) if it "
       "repeats."),
    _X(68, "ROBUST_CHANNEL_NVDEC0_ERROR", "NVDEC0 Exception", RESTART_APP, "RESTART_APP",
       "driver", "Video decoder fault: restart the application; update the driver."),
    _X(69, "ROBUST_CHANNEL_GR_CLASS_ERROR", "Graphics Engine class error", RESTART_APP,
       "RESTART_APP", "application",
       "The GPU rejected a command of the application's channel (an invalid class or method): "
       "restart the application. When one driver version triggers it for a workload that ran "
       "before, it is a driver bug: try another driver version and report it to NVIDIA."),
    _X(74, "NVLINK_ERROR", "NVLink Error", RESET_GPU, "WORKFLOW_NVLINK_ERR", "hardware",
       "NVLink fault between GPUs or to an NVSwitch: a GPU reset or node reboot is needed to "
       "clear it; check nvidia-smi nvlink -s and the GPU at the other end; contact support if "
       "it repeats."),
    _X(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", REBOOT,
       "RESTART_BM", "hardware",
       "The GPU is no longer reachable over PCIe: drain the node and reboot it; check power, "
       "thermals and the PCIe slot; replace the GPU if it repeats."),
    _X(92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", IGNORE, "IGNORE",
       "hardware", "Memory is degrading: watch the error counters; contact support if it grows."),
    _X(94, "ROBUST_CHANNEL_CONTAINED_ERROR", "Contained memory error", RESTART_APP,
       "RESTART_APP", "hardware",
       "An uncorrectable error was contained to one application: restart it; other "
       "applications are unaffected. Reset the GPU when convenient."),
    _X(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", "Uncontained memory error", RESET_GPU,
       "RESET_GPU", "hardware",
       "Every application on the GPU is affected: drain the GPU's pods and reset the GPU "
       "before anything restarts on it."),
    _X(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "Context Switch Timeout Error", RESET_GPU,
       "RESET_GPU", "driver", "Drain and reset the GPU; contact support if it repeats."),
    _X(110, "SEC_FAULT_ERROR", "Security Fault Error", RESET_GPU, "RESET_GPU", "driver",
       "Drain the GPU's pods and reset the GPU; update the driver (NVIDIA's investigatory "
       "action is INVESTIGATE_SW)."),
    _X(119, "GSP_RPC_TIMEOUT", "GSP RPC Timeout", RESET_GPU, "RESET_GPU", "driver",
       "The GPU System Processor stopped answering: drain and reset the GPU (or reboot); "
       "update the driver (NVIDIA's investigatory action is INVESTIGATE_SW)."),
    _X(120, "GSP_ERROR", "GSP Error", RESET_GPU, "RESET_GPU", "driver",
       "GSP firmware error: drain and reset the GPU; update the driver."),
    _X(121, "C2C_ERROR", "C2C Error", IGNORE, "IGNORE", "hardware",
       "Grace-Hopper/Blackwell chip-to-chip link error: watch for repeats."),
    _X(136, "ALI_TRAINING_FAIL", "Link Training Failed", RESET_GPU, "RESET_GPU", "hardware",
       "An NVLink did not train: drain and reset the GPU; check the link's signal integrity "
       "and connections if it repeats (NVIDIA: INVESTIGATE_LINK_SI)."),
    _X(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "ECC Unrecovered Error", RESET_GPU, "RESET_GPU",
       "hardware", "Drain the GPU's pods and reset the GPU; contact support if it repeats."),
    _X(142, "ROBUST_CHANNEL_NVENC3_ERROR", "NVENC3 Error", CONTACT_SUPPORT, "CONTACT_SUPPORT",
       "hardware", "Video encoder fault: drain the node and contact NVIDIA support."),
    _X(143, "GPU_INIT_ERROR", "GPU Initialization Error", RESET_GPU, "RESET_GPU", "hardware",
       "Reset the GPU; contact support if it repeats."),
    *(_X(c, m, d, RESET_GPU, "WORKFLOW_NVLINK5_ERR", "hardware", _NVLINK5) for c, m, d in (
        (144, "NVLINK_SAW_ERROR", "NVLINK: SAW Error"),
        (145, "NVLINK_RLW_ERROR", "NVLINK: RLW Error"),
        (146, "NVLINK_TLW_ERROR", "NVLINK: TLW Error"),
        (147, "NVLINK_TREX_ERROR", "NVLINK: TREX Error"),
        (148, "NVLINK_NVLPW_CTRL_ERROR", "NVLINK: NVLPW_CTRL Error"),
        (149, "NVLINK_NETIR_ERROR", "NVLINK: NETIR Error"),
        (150, "NVLINK_MSE_ERROR", "NVLINK: MSE Error"))),
    _X(151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", "Key rotation Error", REBOOT, "RESTART_VM",
       "driver", "Confidential-computing key rotation failed: restart the VM (reboot the "
       "node); contact support if it repeats."),
    _X(154, "GPU_RECOVERY_ACTION_CHANGED", "GPU Recovery Action Changed", RESET_GPU, "XID_154",
       "driver",
       "The driver states the recovery the other Xids on this GPU need (None, Drain P2P, "
       "Drain and Reset, GPU Reset Required, Node Reboot Required): do it after draining."),
    _X(155, "NVLINK_SW_DEFINED_ERROR", "NVLINK: SW Defined Error", RESET_GPU, "RESET_GPU",
       "driver",
       "Also raised by intentional link-down (SLEEP) transitions: reset only if workloads on "
       "the GPU fail."),
    _X(156, "RESOURCE_RETIREMENT_EVENT", "Resource Retirement Event", RESET_GPU, "RESET_GPU",
       "hardware", "Reset the GPU when idle so the retirement takes effect."),
    _X(157, "RESOURCE_RETIREMENT_FAILURE", "Resource Retirement Failure", IGNORE, "IGNORE",
       "hardware", "No repair resources are left: workloads still run but the Xid may recur; "
       "contact support."),
    _X(158, "GPU_FATAL_TIMEOUT", "GPU Fatal Timeout", RESET_GPU, "RESET_GPU", "hardware",
       "Drain and reset the GPU; contact support if it repeats."),
)}


def describe(code: int) -> Xid:
    return XIDS.get(code) or Xid(code, "", "Xid not in our copy of NVIDIA's catalog",
                                 CONTACT_SUPPORT, "", "unknown",
                                 f"Look Xid {code} up in NVIDIA's Xid catalog ({CATALOG_URL}).")
