"""NVIDIA Xid codes: what each means and whose fault it usually is.

Why: an Xid line in the kernel log is the GPU driver's only word on a failure, but the number
alone means nothing to most on-call engineers. Source: NVIDIA's "Xid Errors" catalog
(https://docs.nvidia.com/deploy/xid-errors/). `blame` is the usual first suspect:
"application", "hardware", "driver" or "system" (PCIe, power, thermal).
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Xid:
    code: int
    meaning: str
    blame: str
    severity: str  # severity of the finding when seen
    action: str


_X = Xid
XIDS: dict[int, Xid] = {x.code: x for x in (
    _X(13, "Graphics Engine Exception", "application", "warning",
       "Usually an out-of-range access in the application's kernel; check the job's logs. "
       "If many unrelated jobs hit it on one GPU, suspect the hardware."),
    _X(31, "GPU memory page fault", "application", "warning",
       "An illegal memory access by the application (run it with compute-sanitizer)."),
    _X(32, "Invalid or corrupted push buffer stream", "system", "warning",
       "Often PCIe errors; check the PCIe link and system logs."),
    _X(43, "GPU stopped processing", "application", "info",
       "The driver stopped a faulting application context; the GPU itself is usually fine."),
    _X(45, "Preemptive cleanup, due to previous errors", "application", "info",
       "A context was torn down (often after another Xid or a killed process)."),
    _X(48, "Double Bit ECC Error", "hardware", "critical",
       "Uncorrectable memory error: drain the node, reset the GPU; replace it if it repeats."),
    _X(61, "Internal micro-controller breakpoint/warning", "driver", "warning",
       "Firmware assertion; update the driver; reset the GPU if it is stuck."),
    _X(62, "Internal micro-controller halt", "hardware", "critical",
       "Firmware halted: reset the GPU (drain first) and update the driver."),
    _X(63, "ECC page retirement or row remapping recording event", "hardware", "warning",
       "A bad memory row was recorded for retirement; reset the GPU when idle to apply it."),
    _X(64, "ECC page retirement or row remapper recording failure", "hardware", "critical",
       "Retirement could not be recorded: drain the node, reset; RMA if it repeats."),
    _X(68, "NVDEC0 Exception", "driver", "warning", "Video decoder fault; update the driver."),
    _X(74, "NVLink Error", "hardware", "critical",
       "NVLink fault: drain the node, check fabric manager and NVLink status "
       "(nvidia-smi nvlink -s), reset the GPUs."),
    _X(79, "GPU has fallen off the bus", "hardware", "critical",
       "The GPU is no longer reachable over PCIe: drain the node and reboot it; check power, "
       "thermals and the PCIe slot; replace the GPU if it repeats."),
    _X(92, "High single-bit ECC error rate", "hardware", "warning",
       "Memory is degrading: schedule a reset and watch the error counters."),
    _X(94, "Contained ECC error", "hardware", "warning",
       "An uncorrectable error was contained to one application; restart it. Reset the GPU "
       "when convenient."),
    _X(95, "Uncontained ECC error", "hardware", "critical",
       "All applications on the GPU are affected: drain the node and reset the GPU."),
    _X(109, "Context Switch Timeout Error", "application", "warning",
       "A context did not yield in time; often the application, sometimes the driver."),
    _X(119, "GSP RPC Timeout", "driver", "critical",
       "The GPU System Processor stopped answering: drain and reset the GPU or reboot; "
       "update the driver (or disable GSP firmware if NVIDIA advises it)."),
    _X(120, "GSP Error", "driver", "critical",
       "GSP firmware error: drain and reset the GPU; update the driver."),
    _X(121, "C2C Link corrected error", "hardware", "warning", "Watch for repeats."),
    _X(140, "Unrecovered ECC Error", "hardware", "critical",
       "Drain the node and reset the GPU."),
    _X(154, "GPU recovery action changed", "driver", "critical",
       "The driver asks for a GPU reset or a node reboot: read the message and do it after "
       "draining the node."),
)}


def describe(code: int) -> Xid:
    return XIDS.get(code) or Xid(code, "Unlisted Xid", "unknown", "warning",
                                 "Look the code up in NVIDIA's Xid catalog.")
