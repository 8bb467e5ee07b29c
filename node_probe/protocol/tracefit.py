"""How much of the requested eBPF trace window fits in the run's deadline.

Why one rule for both sides: tracing costs more than its window (compiling and attaching the BPF
programs, ~1.5-3 s on two cores, then detaching and judging the results), and the whole probe
run has one deadline (`--timeout`). Asked for a 5 s window inside a 5 s deadline, the trace check
used to run out of time every time and the run ended incomplete (exit 4). The probe fits the
window to the deadline with this function, says so when it shortens or drops the window, and
the client and docs quote the same numbers.
"""
from __future__ import annotations

TRACE_OVERHEAD_S = 4.0   # compile + attach before the window, detach + verdicts after it
MIN_WINDOW_S = 1.0       # shorter than this, a trace shows nothing worth the cost


def fit(timeout_s: float, trace_s: float) -> tuple[float, str]:
    """(window to use, note). The window is `trace_s` when it fits, shorter when only part of
    it fits, 0 when not even MIN_WINDOW_S fits (tracing is then skipped); the note says why
    for anything but the requested window ("" then)."""
    if trace_s <= 0:
        return 0.0, ""
    room = timeout_s - TRACE_OVERHEAD_S
    if room >= trace_s:
        return float(trace_s), ""
    if room >= MIN_WINDOW_S:
        return round(room, 3), (f"trace window shortened from {trace_s:g}s to {room:g}s to fit "
                                f"--timeout {timeout_s:g}s (tracing needs about "
                                f"{TRACE_OVERHEAD_S:g}s beyond its window)")
    need = TRACE_OVERHEAD_S + min(trace_s, max(MIN_WINDOW_S, trace_s))
    return 0.0, (f"no eBPF trace: a {trace_s:g}s window does not fit in --timeout "
                 f"{timeout_s:g}s (tracing needs about {TRACE_OVERHEAD_S:g}s beyond its "
                 f"window); use --timeout {need:g}s or more, or --trace-seconds 0")
