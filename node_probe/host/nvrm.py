"""NVIDIA driver messages that say a GPU failed without an Xid number, and driver error lines we
do not know.

Why: newer drivers report some fatal states in words only. A GPU that drops off PCIe while the
driver probes it prints three lines and no Xid; a GSP firmware that stops answering prints
heartbeat timeouts; a GPU the driver cannot bring up prints `RmInitAdapter failed`; assertions
carry the status name (`[NV_ERR_GPU_IS_LOST]`, `[NV_ERR_RESET_REQUIRED]`). A tool that looks
only for `Xid` is silent on exactly these nodes (NVSentinel #155, GPUd PR #1209). Each class here
maps to the Xid whose action NVIDIA documents for the same state, so the advice is the same.

The formats are the driver's own, from NVIDIA/open-gpu-kernel-modules (595.45.04):
- off the bus: src/nvidia/arch/nvalloc/unix/src/osapi.c, `nv_printf(NV_DBG_ERRORS,
  "NVRM: The NVIDIA GPU %04x:%02x:%02x.%x\\n" "NVRM: (PCI ID: %04x:%04x) installed in this
  system has\\n" "NVRM: fallen off the bus and is not responding to commands.\\n", ...)` (status
  NV_ERR_GPU_IS_LOST) -- Xid 79's state
- GSP heartbeat: src/nvidia/src/kernel/gpu/gsp/kernel_gsp.c, `"Heartbeat timed out,
  currentTimeMs %u heartbeat %u ..."`, `"GSP RM heartbeat timed out"`, `"LibOS heartbeat timed
  out"`; GSP RPC: `"Timeout after %llus of waiting for RPC response from GPU%d GSP! ..."` (logged
  as Xid 119 when the driver can), older drivers' `"Timeout waiting for RPC from GSP!"`, the
  `_kgspLogXid119` banner `"GSP Timeout"`, and src/nvidia/src/kernel/vgpu/rpc.c
  `"rpcSendMessage failed with status 0x%08x for fn %d ..."` / `"rpcRecvPoll failed ..."`
  -- Xid 119's state
- init: src/nvidia/arch/nvalloc/unix/src/osinit.c `"RmInitAdapter failed! (0x%x:0x%x:%d)"`,
  `"Cannot initialize GSP firmware RM"`; kernel-open/nvidia/nv.c `"rm_init_adapter failed,
  device minor number %d"` -- Xid 143 (GPU_INIT_ERROR)'s state
- assertions: src/nvidia/src/libraries/utils/nvassert.c `"Assertion failed: %s (0x%08X)
  returned from ..."` with nvstatusToString's `"<text> [NV_ERR_...]"`, the texts from
  src/common/sdk/nvidia/inc/nvstatuscodes.h: `GPU lost from the bus [NV_ERR_GPU_IS_LOST]`
  (Xid 79's state), `Reset required [NV_ERR_RESET_REQUIRED]` (reset the GPU)

- API mismatch: kernel-open/nvidia/nv.c, `"NVRM: API mismatch: the client has the version
  %s, but\n" "NVRM: this kernel module has the version %s.  Please\n" ...` (newer drivers:
  `"NVRM: API mismatch: the client '%s' (pid %d)\n" "NVRM: has the version %s, but this kernel
  module has\n" "NVRM: the version %s. ..."`): a user-space driver of another version than the
  loaded module (an upgrade without a reboot, a module DKMS did not rebuild) -- the kernel's word
  for what NVML calls "driver/library version mismatch" (`Reader.mismatch`)

Pure and line-at-a-time: `Reader.feed(ts, msg)` keeps a bounded state (the multi-line off-bus
message, groups capped by count and bytes), so a kernel log is never held whole.
"""
from __future__ import annotations

import dataclasses
import re

from node_probe.host import xid

# class -> (the Xid whose NVIDIA action applies, bucket, what happened, in words)
CLASSES: dict[str, tuple[int, str, str]] = {
    "off_the_bus": (79, xid.REBOOT,
                    "the GPU fell off the bus and does not answer (no Xid printed)"),
    "gpu_lost": (79, xid.REBOOT, "the driver reports the GPU lost from the bus "
                                 "(NV_ERR_GPU_IS_LOST)"),
    "gsp_heartbeat": (119, xid.RESET_GPU,
                      "the GPU System Processor (GSP) firmware stopped its heartbeat"),
    "gsp_rpc_timeout": (119, xid.RESET_GPU,
                        "the GPU System Processor (GSP) did not answer the driver's RPC"),
    "init_failed": (143, xid.RESET_GPU, "the driver could not initialise the GPU "
                                        "(RmInitAdapter failed): the GPU is unusable"),
    "reset_required": (154, xid.RESET_GPU, "the driver says the GPU needs a reset "
                                           "(NV_ERR_RESET_REQUIRED)"),
    # the driver's NVLink core (knvlink*): peers' links not detected after receiver detect,
    # so the NVLinks between the GPUs never train (gpud's nvlink component reads the same
    # lines, components/accelerator/nvidia/nvlink/kmsg.go)
    "nvlink_rxdet": (74, xid.RESET_GPU, "the driver could not detect its NVLink peers' links "
                                        "(post-Rx-detect link mask): the NVLinks did not train"),
    "nvlink_error": (74, xid.RESTART_APP, "the driver's NVLink core reported an error "
                                          "(knvlink...)"),
}
# classes whose severity is not the bucket's: an NVLink core error line without a fatal
# outcome is worth a look (warning), not a reset
SEVERITY_OVERRIDE = {"nvlink_error": "warning"}

_BUS = r"([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-9a-fA-F])?)"
_OFF_HEAD_RE = re.compile(r"NVRM: The NVIDIA GPU " + _BUS)
_OFF_TAIL = "fallen off the bus and is not responding to commands"
_BUS_ONLY_RE = re.compile(_BUS + "$")
UNPARSED = "?"           # the gpu of a line whose bus id is there but does not parse
_GPU_BUS_RE = re.compile(r"NVRM: GPU (?:at PCI:)?" + _BUS + r":")
# the one-line form, with no Xid before it: `NVRM: GPU 0000:09:00.0: GPU has fallen off the
# bus.` (nvidia-docker#1553), also `NVRM: GPU at PCI:0000:65:00: GPU has fallen off the bus.`
_OFF_ONE_RE = re.compile(r"NVRM: GPU (?:at PCI:)?(\S{1,24}): GPU has fallen off the bus")
_GPU_INST_RE = re.compile(r"NVRM: GPU([0-9]{1,3})\b")
# which init failure the line names, in our words (first match wins)
_INIT_SAID = (
    ("RmInitAdapter failed", "the driver could not initialise the GPU (RmInitAdapter failed): "
                             "the GPU is unusable"),
    ("rm_init_adapter failed", "the driver could not initialise the GPU (rm_init_adapter "
                               "failed): the GPU is unusable"),
    ("Cannot initialize GSP firmware RM", "the driver could not start the GPU's GSP firmware: "
                                          "the GPU is unusable"),
    ("failed to wait for GFW", "the GPU's firmware boot did not complete (the driver timed "
                               "out waiting for GFW): the GPU is unusable"),
    ("The NVIDIA probe routine failed", "the driver's probe of the GPU failed (the NVIDIA "
                                        "probe routine failed): the GPU is not usable"),
)
_RULES: tuple[tuple[str, re.Pattern], ...] = (
    ("gpu_lost", re.compile(r"\[NV_ERR_GPU_IS_LOST\]")),
    ("nvlink_rxdet", re.compile(r"knvlinkUpdatePostRxDetectLinkMask_[A-Za-z0-9_]{1,40}: Failed "
                                r"to update Rx Detect Link mask|knvlinkDiscoverPostRxDetLinks_"
                                r"[A-Za-z0-9_]{1,40}: Getting peer[0-9]{1,3}(?:'s)? "
                                r"postRxDetLinkMask failed")),
    ("nvlink_error", re.compile(r"\bknvlink[A-Za-z0-9_]{1,60}: .{0,200}?(?:fail|error|timed? ?out|"
                                r"not (?:trained|active|ready))", re.I)),
    ("reset_required", re.compile(r"\[NV_ERR_RESET_REQUIRED\]")),
    ("gsp_heartbeat", re.compile(r"(?:GSP RM|LibOS) heartbeat timed out|Heartbeat timed out, "
                                 r"currentTimeMs")),
    ("gsp_rpc_timeout", re.compile(r"Timeout waiting for RPC from GSP|waiting for RPC response "
                                   r"from GPU[0-9]{1,3} GSP|\bGSP Timeout\b|rpcSendMessage "
                                   r"failed with status|rpcRecvPoll failed with status")),
    ("init_failed", re.compile(r"RmInitAdapter failed!|rm_init_adapter failed, device minor|"
                               r"Cannot initialize GSP firmware RM|failed to wait for GFW|"
                               r"The NVIDIA probe routine failed")),
)
# an NVRM line we do not classify is shown (info) when it reads like an error
_ERRORISH_RE = re.compile(r"fail|error|timed? ?out|assert|invalid|unable|cannot|can't|\blost\b|"
                          r"\bhung\b|\bstuck\b|fault|not responding|mismatch|\bbad\b", re.I)
# the other NVIDIA modules' error lines (nvidia-modeset, nvidia-uvm, nvidia-drm)
_OTHER_ERR_RE = re.compile(r"nvidia-(?:modeset|uvm|drm|peermem): ERROR")
_SHAPE_RE = re.compile(r"0x[0-9a-fA-F]+|[0-9a-fA-F]{4,}:[0-9a-fA-F:.]+|[0-9]+")
MAX_GROUPS = 64          # distinct GPUs x classes kept
MAX_UNKNOWN = 20         # distinct shapes of unknown lines kept
MAX_LINE = 300           # one sample line per group, cut
OFF_BUS_WINDOW = 4       # lines between "The NVIDIA GPU <bus>" and "fallen off the bus"
MISMATCH_WINDOW = 4      # continuation lines of one "API mismatch" message
# the versions in "the client has the version 535.54.03, but ... has the version 530.30.02."
_VERSION_RE = re.compile(r"version ([0-9]{1,4}\.[0-9][0-9.]{0,16})")


@dataclasses.dataclass(frozen=True)
class DriverError:
    """Every occurrence of one class on one GPU."""
    kind: str                 # a key of CLASSES
    gpu: str                  # PCI bus id, `GPU<n>` (the driver's instance number) or ""
    count: int
    first_s: float | None
    last_s: float | None
    sample: str               # the last line, cut to MAX_LINE

    @property
    def xid_like(self) -> int:
        return CLASSES[self.kind][0]

    @property
    def bucket(self) -> str:
        return CLASSES[self.kind][1]

    @property
    def what(self) -> str:
        """The state in words, saying only what the line said: a failed probe of the GPU is
        not an RmInitAdapter failure (issue 36)."""
        if self.kind == "init_failed":
            said = next((w for p, w in _INIT_SAID if p in self.sample), None)
            if said:
                return said
        return CLASSES[self.kind][2]


@dataclasses.dataclass(frozen=True)
class Unrecognized:
    """NVRM lines of one shape (numbers and bus ids blanked) that we do not classify."""
    count: int
    sample: str
    last_s: float | None


def _gpu_of(msg: str) -> str:
    m = _GPU_BUS_RE.search(msg)
    if m:
        return m.group(1).lower()
    m = _GPU_INST_RE.search(msg)
    return f"GPU{m.group(1)}" if m else ""


class Reader:
    """Fold kernel log lines (already stripped of their timestamps) one at a time."""

    def __init__(self) -> None:
        self.acc: dict[tuple[str, str], dict] = {}
        self.unknown: dict[str, dict] = {}
        self.dropped = 0
        self.unknown_dropped = 0
        self._off_head: tuple[str, int] | None = None   # (bus, lines since)
        # "API mismatch" messages: count, times, the client's and the module's versions
        self.mismatch: dict | None = None
        self._mm_left = 0
        self._mm_text = ""
        self._off_lines = 0                 # off-the-bus lines read, and the last one's bus
        self.last_off_bus = ""

    def _add(self, kind: str, gpu: str, ts: float | None, msg: str) -> None:
        if kind == "off_the_bus":
            self._off_lines += 1
            self.last_off_bus = gpu
        key = (kind, gpu)
        d = self.acc.get(key)
        if d is None:
            if len(self.acc) >= MAX_GROUPS:
                self.dropped += 1
                return
            d = self.acc[key] = {"count": 0, "first_s": ts, "last_s": ts}
        d["count"] += 1
        if ts is not None:
            d["first_s"] = ts if d["first_s"] is None else min(d["first_s"], ts)
            d["last_s"] = ts if d["last_s"] is None else max(d["last_s"], ts)
        d["sample"] = msg[:MAX_LINE]

    def _mismatch(self, ts: float | None, msg: str, head: bool) -> None:
        """One line of an "API mismatch" message: its head, or a continuation line (pasted
        logs split it; /dev/kmsg and syslog's `#012` keep it one line)."""
        text = msg[msg.find("NVRM"):]
        if head:
            self._mm_text = text[:MAX_LINE * 2]
            self._mm_left = MISMATCH_WINDOW
            d = self.mismatch
            if d is None:
                d = self.mismatch = {"count": 0, "first_s": ts, "last_s": ts,
                                     "client_version": None, "module_version": None}
            d["count"] += 1
            if ts is not None:
                d["first_s"] = ts if d["first_s"] is None else min(d["first_s"], ts)
                d["last_s"] = ts if d["last_s"] is None else max(d["last_s"], ts)
        else:
            self._mm_left -= 1
            self._mm_text = (self._mm_text + " " + text.strip())[:MAX_LINE * 2]
        if self.mismatch is None:
            return
        self.mismatch["sample"] = " ".join(self._mm_text.replace("#012", " ").split())[:MAX_LINE]
        versions = [v.rstrip(".") for v in _VERSION_RE.findall(self._mm_text)]
        if len(versions) >= 2:
            self.mismatch["client_version"], self.mismatch["module_version"] = versions[:2]

    @property
    def busy(self) -> bool:
        """In the middle of a message that spans lines (every line must be fed)."""
        return self._off_head is not None or self._mm_left > 0

    def off_bus_count(self) -> int:
        return self._off_lines

    def feed(self, ts: float | None, msg: str) -> bool:
        """Read one line; True when it was an NVIDIA driver line we classified or showed."""
        if "NVRM" not in msg:
            self._mm_left = 0
            self._age()
            if _OTHER_ERR_RE.search(msg):        # nvidia-modeset: ERROR: GPU:0: ...
                self._unknown(ts, msg)
                return True
            return False
        if "NVRM: API mismatch" in msg:
            self._mismatch(ts, msg, head=True)
            return True
        if self._mm_left > 0 and msg.lstrip().startswith("NVRM:"):
            self._mismatch(ts, msg, head=False)
            return True
        self._mm_left = 0
        head = _OFF_HEAD_RE.search(msg)
        if head:
            self._off_head = (head.group(1).lower(), 0)
        if _OFF_TAIL in msg:
            bus = head.group(1).lower() if head else (self._off_head[0] if self._off_head else "")
            self._off_head = None
            self._add("off_the_bus", bus, ts, " ".join(msg.split()))
            return True
        if head:
            return True
        one = _OFF_ONE_RE.search(msg)
        if one:
            bus = one.group(1).lower()
            self._add("off_the_bus", bus if _BUS_ONLY_RE.match(bus) else UNPARSED, ts,
                      " ".join(msg.split()))
            return True
        self._age()
        if self._off_head is not None and "(PCI ID:" in msg:
            return True        # the middle line of the off-the-bus message
        for kind, rx in _RULES:
            if rx.search(msg):
                self._add(kind, _gpu_of(msg), ts, msg)
                return True
        if "Xid" not in msg and _ERRORISH_RE.search(msg):
            self._unknown(ts, msg)
            return True
        return False

    def _age(self) -> None:
        if self._off_head is not None:
            bus, n = self._off_head
            self._off_head = (bus, n + 1) if n + 1 < OFF_BUS_WINDOW else None

    def _unknown(self, ts: float | None, msg: str) -> None:
        at = msg.find("NVRM")
        text = msg[at:] if at >= 0 else msg[msg.find("nvidia-"):]
        shape = _SHAPE_RE.sub("#", text[:MAX_LINE])
        d = self.unknown.get(shape)
        if d is None:
            if len(self.unknown) >= MAX_UNKNOWN:
                self.unknown_dropped += 1
                return
            d = self.unknown[shape] = {"count": 0}
        d["count"] += 1
        d["sample"] = text[:MAX_LINE]
        d["last_s"] = ts

    def errors(self) -> list[DriverError]:
        return [DriverError(kind, gpu, d["count"], d["first_s"], d["last_s"], d["sample"])
                for (kind, gpu), d in self.acc.items()]

    def unrecognized(self) -> list[Unrecognized]:
        return [Unrecognized(d["count"], d["sample"], d["last_s"]) for d in self.unknown.values()]
