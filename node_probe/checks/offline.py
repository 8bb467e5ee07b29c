"""Offline input: the slow-GPU judges over what a ticket pasted (issue 38).

Why: `local --nvidia-smi-file/--lspci-file/--bug-report` answer "why is it slow" for a machine
nobody can reach. The files were read into the records the NVML child and the sysfs reader
make (host.offline) before the run; this check hands them to the same judges the live
`gpu.slow` check uses (checks/slow.judge), so a file gives the findings the live probe would
have given on that machine at that moment. No pods are named: a file does not say who held
the GPU. The bug report's kernel log is read by the `kmsg` check, as any --kmsg-file.
"""
from __future__ import annotations

from node_probe.checks.slow import judge
from node_probe.engine.context import Skipped
from node_probe.engine.registry import check

NONE_GIVEN = "no --nvidia-smi-file, --lspci-file or --bug-report given"


@check("offline", title="Offline input: nvidia-smi -q, lspci -vvv, nvidia-bug-report judged "
       "as slow GPUs", timeout_s=10.0)
def offline_check(ctx):
    off = ctx.options.offline
    if off is None:
        return Skipped(NONE_GIVEN)
    for line in off.sources:
        ctx.progress(message=line)
    for note in off.notes:
        ctx.log("warning", f"offline input {note}; later lines were not read")
    if not off.gpus:
        return Skipped("the offline input holds no GPU (no nvidia-smi section and no NVIDIA "
                       "GPU in the lspci text): nothing to judge")
    yield from judge.judge_gpus([dict(g) for g in off.gpus], off.links, {})
