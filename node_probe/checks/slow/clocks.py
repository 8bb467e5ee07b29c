"""Clocks held down: NVML's clock event reasons that slow a GPU under load.

Why: a GPU that is too hot, at its power cap or told by the board to slow down (HW slowdown,
power brake) runs at a fraction of its clock and raises nothing. NVML reports why in one
bitmask (nvmlDeviceGetCurrentClocksEventReasons; nvmlDeviceGetCurrentClocksThrottleReasons on
old drivers, same bits). Not faults: GPU idle (0x1), application-clock settings (0x2, set by the
admin), sync boost (0x10) and display clocks (0x100). SW power cap (0x4) alone is the GPU working
at its power limit, which heavy work reaches by design: said only when the limit was lowered
below the default (someone or some agent capped it). Every other reason is judged only while the GPU is busy too: an idle GPU's
clocks mean nothing.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from node_probe.checks.slow import _common
from node_probe.protocol import Finding, catalog

FID = "gpu.clocks_throttled"
# nvml.h nvmlClocksEventReason* (= nvmlClocksThrottleReason*)
GPU_IDLE = 0x1
APPLICATIONS_CLOCKS_SETTING = 0x2
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SYNC_BOOST = 0x10
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
DISPLAY_CLOCK_SETTING = 0x100
REASONS = {HW_THERMAL: "hw_thermal", HW_POWER_BRAKE: "hw_power_brake",
           HW_SLOWDOWN: "hw_slowdown", SW_THERMAL: "sw_thermal", SW_POWER_CAP: "sw_power_cap"}
WORDS = {"hw_thermal": "HW thermal slowdown", "hw_power_brake": "HW power brake",
         "hw_slowdown": "HW slowdown", "sw_thermal": "SW thermal slowdown",
         "sw_power_cap": "SW power cap"}
NOT_FAULTS = GPU_IDLE | APPLICATIONS_CLOCKS_SETTING | SYNC_BOOST | DISPLAY_CLOCK_SETTING
REFS = ("https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksEventReasons.html",
        "https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html",
        "https://github.com/NVIDIA/NVSentinel/issues/890")


def reasons(mask: Any) -> list[str]:
    """The fault reasons set in an event-reason bitmask, worst first."""
    m = _common.num(mask)
    if m is None:
        return []
    return [name for bit, name in REASONS.items() if int(m) & bit]


def cause(names: Sequence[str]) -> str:
    """thermal | power | board: what the action is about."""
    if any("thermal" in n for n in names):
        return "thermal"
    if any("power" in n for n in names):
        return "power"
    return "board"


def judge(g: Mapping[str, Any],
          holders: Mapping[str, Sequence[str]] | None = None) -> list[Finding]:
    """gpu.clocks_throttled for one GPU record (contract a), or nothing."""
    if g.get("lost") or _common.busy(g) is not True:
        return []
    c = g.get("clocks") or {}
    names = reasons(c.get("event_reasons"))
    sm, sm_max = _common.num(c.get("sm_mhz")), _common.num(c.get("sm_max_mhz"))
    t = g.get("temperature") or {}
    p = g.get("power") or {}
    limit, default = _common.num(p.get("limit_w")), _common.num(p.get("default_limit_w"))
    lowered = limit is not None and default is not None and limit < default - 0.5
    if names == ["sw_power_cap"] and not lowered:
        # at its default power limit under heavy load the GPU trades clock for power by
        # design (an H100 at 700 W runs below its max boost clock): not a fault
        return []
    if not names:
        return []
    gpu_c, slow_c = _common.num(t.get("gpu_c")), _common.num(t.get("slowdown_c"))
    margin = None if gpu_c is None or slow_c is None else slow_c - gpu_c
    ev = _common.evidence(g, holders)
    ev.update({"reasons": names, "event_reasons": c.get("event_reasons"), "cause": cause(names),
               "sm_mhz": sm, "sm_max_mhz": sm_max, "mem_mhz": c.get("mem_mhz"),
               "mem_max_mhz": c.get("mem_max_mhz"), "temperature_c": gpu_c,
               "slowdown_c": slow_c, "shutdown_c": t.get("shutdown_c"),
               "thermal_margin_c": margin, "power_draw_w": p.get("draw_w"),
               "power_limit_w": limit, "power_default_limit_w": default,
               "power_limit_lowered": lowered})
    bits = [", ".join(WORDS[n] for n in names)]
    if sm is not None and sm_max:
        bits.append(f"SM {sm:.0f} of {sm_max:.0f} MHz")
    if margin is not None:
        bits.append(f"{gpu_c:.0f} C, {margin:.0f} C below slowdown")
    if lowered:
        bits.append(f"power limit {limit:.0f} W of default {default:.0f} W")
    pods = _common.held_by(ev)
    fix = {"thermal": "Cooling: check the node's fans, inlet temperature and airflow (blanking "
                      "panels, a failed fan); drain the node if it stays hot.",
           "power": ("Power: restore the default limit (nvidia-smi -pl <default W>) or find "
                     "who lowered it (a power-capping agent)." if lowered else
                     "Power: the GPU is at its power limit under this load; check the PSU and "
                     "the node's power budget (a brake means the board asked for it)."),
           "board": "HW slowdown: the board asserted a slowdown (power supply or thermal "
                    "sensor); drain the node and have the PSU and board checked."}[cause(names)]
    return [catalog.make(
        FID, "warning", _common.subject(g),
        f"{_common.label(g)}: clocks held down under load: {'; '.join(bits)}{pods}", ev,
        fix + " The pods on this GPU run slower until then.", REFS)]
