"""The collective-hang signature: a GPU fully "busy" at a fraction of its power, clocks up.

Why: when one rank of a multi-node job stops (a bad GPU, a link down, a process stuck in the
kernel), every other rank's NCCL kernel keeps polling for its peer. NVML then reports the
GPU at ~100 % utilisation (a kernel is resident: that is all `utilization.gpu` measures) while
the board draws little power, because the SMs spin on a flag instead of computing. The users
who hit it describe exactly that:
- NVIDIA/nccl#968 ("How to detect which node causes a NCCL hang?"): "When the hang happens,
  the GPU util is 100% but the power consumption is pretty low (~70W)."
- vllm-project/vllm#41725: a "rank stuck spinning at ~96% GPU / ~20 W drawing no real power,
  peer blocked in `ncclAllReduce`".
- NVIDIA/nccl#2389: a gate waiting for a flag "spins forever ... GPUs stay at 100 %
  utilization and the job never progresses again".
- marin-community/marin#7344: a 512-GPU GB200 run "silently hangs mid-training (collective
  wedge, no error)", all 128 tasks RUNNING, no CUDA_ERROR, no NCCL WARN.
  The follow-up marin-community/marin#8870 states the test this check makes: "GPU
  utilisation separates 'spinning in a resident kernel' from 'kernel never launched' on its
  own".
- Theano/libgpuarray#387: "the utilization of all GPUs pegged at 100% except for one which is
  at 0%. But actually the power consumption of all of them is at idle" -- the odd one out is
  the GPU that does NOT spin.
- NVIDIA/nccl#1324 "How to locate the hanging node?" ("locating the hanging node is quite
  time-consuming"; the maintainer: "NCCL does not have any such features") and #1260 ("it's
  hard to find which ranks are not joining the collective call"; "There is no watchdog or
  timeout code in NCCL"). This check gives the per-GPU half of the answer; `job --probe`
  compares the nodes: the ones spinning are the waiters, the one that is not (or that shows an
  Xid, an IB port down, a process in D state) is the one they wait for.
- The caveat, ROCm/legacy-rocm-build#6530 (an AMD APU): "100% / 55 W" was "what genuine
  sustained compute looks like here" -- utilisation and power are a hint, not proof.

One NVML sample cannot tell a spin from a memory- or latency-bound kernel that draws little:
the finding says "looks like", is a warning (never critical), and the fix says how to sample
again. The judge is pure (contract (a) of checks/slow: utilization_gpu_pct, power, clocks).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from node_probe.checks import _gpufacts, slow_gpu
from node_probe.checks.slow import _common
from node_probe.engine.facts import PODRESOURCES
from node_probe.engine.registry import check
from node_probe.protocol import Finding, catalog

FID = "gpu.collective_spin"
UTIL_MIN_PCT = 95          # "100 %" in the threads; NVML's counter reads 96-100 while spinning
POWER_MAX_FRACTION = 0.30  # #968: ~70 W of an A100's 400 W (18 %); #41725: ~20 W
SM_UP_FRACTION = 0.5       # SM clock at least half its maximum: not an idle or throttled GPU
REFS = ("https://github.com/NVIDIA/nccl/issues/968",
        "https://github.com/NVIDIA/nccl/issues/1324",
        "https://github.com/NVIDIA/nccl/issues/1260",
        "https://github.com/marin-community/marin/issues/7344",
        "https://github.com/vllm-project/vllm/issues/41725")


def judge(g: Mapping[str, Any],
          holders: Mapping[str, Sequence[str]] | None = None) -> list[Finding]:
    """gpu.collective_spin for one GPU record, or nothing. Needs utilisation and power draw
    with a limit; the SM clock, when known, must be up (a GPU at idle clocks is not spinning)."""
    if g.get("lost"):
        return []
    util = _common.num(g.get("utilization_gpu_pct"))
    p = g.get("power") or {}
    draw = _common.num(p.get("draw_w"))
    limit = _common.num(p.get("limit_w")) or _common.num(p.get("default_limit_w"))
    if util is None or draw is None or not limit or util < UTIL_MIN_PCT:
        return []
    frac = draw / limit
    if frac >= POWER_MAX_FRACTION:
        return []
    c = g.get("clocks") or {}
    sm, sm_max = _common.num(c.get("sm_mhz")), _common.num(c.get("sm_max_mhz"))
    if sm is not None and sm_max and sm < SM_UP_FRACTION * sm_max:
        return []
    ev = _common.evidence(g, holders)
    ev.update({"power_draw_w": draw, "power_limit_w": limit,
               "power_fraction": round(frac, 3), "sm_mhz": sm, "sm_max_mhz": sm_max,
               "samples": 1})
    clocks = f", SM {sm:.0f} of {sm_max:.0f} MHz" if sm is not None and sm_max else ""
    pods = _common.held_by(ev)
    return [catalog.make(
        FID, "warning", _common.subject(g),
        f"{_common.label(g)}: {util:.0f} % busy at {draw:.0f} W of {limit:.0f} W "
        f"({frac:.0%}){clocks}: looks like a kernel spinning in a collective, waiting for a "
        f"peer (one sample){pods}", ev,
        "If a multi-node job hangs, this GPU is waiting, not failing: the node the job waits "
        "for is the one whose GPUs do not spin, or that shows an Xid, a link down or a process "
        "in D state (`kubectl gpu-doctor job NAME -n NS --probe` compares the nodes). One "
        "sample only: confirm with `nvidia-smi --query-gpu=utilization.gpu,power.draw,"
        "clocks.sm --format=csv -l 5` (a real kernel draws power).", REFS)]


PEER_FID = "gpu.collective_idle_peer"
IDLE_MAX_PCT = 5


def judge_peers(gpus: Sequence[Mapping[str, Any]], spinning: set[str],
                holders: Mapping[str, Sequence[str]]) -> list[Finding]:
    """gpu.collective_idle_peer: in ONE pod (pod-resources: the same pod holds them), some GPUs
    spin in a collective while another sits idle (libgpuarray#387: "all GPUs pegged at 100%
    except for one which is at 0%"): the rank on the idle one is likely the one the others
    wait for. Only within a pod: an idle GPU of another pod or job says nothing about them."""
    pods_of = {str(g.get("uuid")): set(holders.get(str(g.get("uuid")), ())) for g in gpus}
    out = []
    for g in gpus:
        u = str(g.get("uuid"))
        util = _common.num(g.get("utilization_gpu_pct"))
        if u in spinning or g.get("lost") or util is None or util > IDLE_MAX_PCT:
            continue
        for pod in sorted(pods_of.get(u, ())):
            spin = sorted(x for x in spinning if pod in pods_of.get(x, ()))
            if not spin:
                continue
            ev = _common.evidence(g, holders)
            ev.update({"pod": pod, "spinning_gpus": spin[:16], "idle_max_pct": IDLE_MAX_PCT,
                       "samples": 1})
            out.append(catalog.make(
                PEER_FID, "warning", _common.subject(g),
                f"{_common.label(g)} of pod {pod} is idle ({util:.0f} %) while {len(spin)} of "
                f"its other GPUs spin in a collective: the rank on it is likely the one they "
                f"wait for (one sample)", ev,
                f"Look at the process on this GPU first (`kubectl logs` of {pod}, a py-spy "
                f"dump of its rank): it is stuck outside the collective (a hang in its own "
                f"code, an I/O wait, a process in D state) or died; the others wait for it. "
                f"Restart the pod from the job's checkpoint if it does not recover.",
                ("https://github.com/Theano/libgpuarray/issues/387", *REFS)))
            break
    return out


@check("gpu.collective", title="Collective hang signature: GPUs busy at low power",
       timeout_s=15.0, needs=(_gpufacts.NVML,), uses=(PODRESOURCES,))
def collective_check(ctx):
    nv = _gpufacts.nvml_or_skip(ctx)
    gpus = [g for g in nv.get("gpus") or () if not g.get("lost")]
    known = [g for g in gpus if _common.num(g.get("utilization_gpu_pct")) is not None
             and _common.num((g.get("power") or {}).get("draw_w")) is not None]
    if not known:
        ctx.skip("NVML gave no utilisation and power draw for any GPU"
                 if gpus else "NVML reports no GPU")
    rows = ctx.fact(PODRESOURCES, timeout=min(1.0, ctx.budget(1.0)), default=None)
    names = {u: sorted(h["pod"] for h in held)
             for u, held in slow_gpu.podres_holders(rows).items()}
    spinning = set()
    for g in known:
        fs = judge(g, names)
        spinning.update(str(g.get("uuid")) for _ in fs)
        yield from fs
    if spinning and names:
        yield from judge_peers(known, spinning, names)
