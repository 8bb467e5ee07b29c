"""The runner's promises: concurrency, deadlines, crash isolation, facts, summary last."""
import threading
import time

from node_probe.protocol import catalog
from node_probe.engine import facts
from node_probe.engine.context import FactUnavailable, ProbeOptions
from node_probe.engine.registry import Check
from node_probe.engine.runner import Runner


def _run(checks, timeout_s=5.0, **kw):
    out = []
    r = Runner(checks, ProbeOptions(timeout_s=timeout_s, trace_s=0), out.append, **kw)
    t0 = time.monotonic()
    res = r.run()
    return res, out, time.monotonic() - t0


def test_hung_check_times_out_and_summary_is_last():
    release = threading.Event()

    def hangs(ctx):
        release.wait(60)  # "hangs forever" as far as the run is concerned
        yield catalog.make("nvml.inventory", "info", "late", "too late")

    def fine(ctx):
        yield catalog.make("nvml.unavailable", "info", "node", "ok")

    res, out, wall = _run([Check("a.hang", hangs, "h", timeout_s=0.5),
                           Check("b.fine", fine, "f")])
    try:
        assert wall < 30   # a hang guard, far from both the 0.5 s deadline and the 60 s hang
        assert out[-1]["kind"] == "summary"
        st = {c.id: c.status for c in res.checks}
        assert st == {"a.hang": "timeout", "b.fine": "ok"}
        assert res.complete is False and out[-1]["complete"] is False
        assert int(res.exit_status) == 4  # only info findings, incomplete
    finally:
        release.set()
    time.sleep(0.1)
    assert out[-1]["kind"] == "summary"  # the late finding was dropped, nothing after summary
    assert not [r for r in out if r.get("subject") == "late"]


def test_whole_run_deadline_bounds_every_check():
    def slow(ctx):
        time.sleep(30)
        return []

    res, out, wall = _run([Check("slow", slow, "s", timeout_s=100)], timeout_s=1.0)
    assert res.checks[0].status == "timeout"
    assert wall < 15   # a hang guard: the check sleeps 30 s


def test_crash_becomes_error_status_and_log_record():
    def boom(ctx):
        yield catalog.make("nvml.unavailable", "warning", "node", "before crash")
        raise ValueError("bad parse")

    res, out, _ = _run([Check("boom", boom, "b")])
    assert res.checks[0].status == "error" and "ValueError: bad parse" in res.checks[0].message
    logs = [r for r in out if r["kind"] == "log" and r["level"] == "error"]
    assert logs and logs[0]["check"] == "boom"
    assert [f.id for f in res.findings] == ["nvml.unavailable"]  # yielded before the crash
    assert int(res.exit_status) == 1


def test_checks_run_concurrently():
    meet = threading.Barrier(5)

    def together(ctx):
        meet.wait(timeout=30)  # breaks (BrokenBarrierError: status error) unless all 5 run at once
        return []

    # generous bounds: run one after another, the first never gets past the barrier
    res, _, _ = _run([Check(f"s{i}", together, "s") for i in range(5)], timeout_s=60)
    assert {c.status for c in res.checks} == {"ok"}, res.checks


X = facts.declare("test.runner.x", int)
Y = facts.declare("test.runner.y", int)


def test_facts_flow_and_failed_producer_releases_consumers():
    seen = {}

    def producer(ctx):
        ctx.publish(X, 42)
        return []

    def broken_producer(ctx):
        raise RuntimeError("no")

    def consumer(ctx):
        seen["x"] = ctx.fact(X, timeout=30)  # returns once published
        try:
            ctx.fact(Y, timeout=10)
        except FactUnavailable as exc:
            seen["y"] = str(exc)
        seen["y_default"] = ctx.fact(Y, timeout=10, default="none")
        return []

    res, _, _ = _run([Check("p", producer, "p", provides=(X,)),
                      Check("q", broken_producer, "q", provides=(Y,)),
                      Check("c", consumer, "c", needs=(X,), uses=(Y,))])
    assert seen["x"] == 42
    # released by the failure, not by its 10 s timeout (that would say "not published within")
    assert "check q ended without publishing it" in seen["y"]
    assert seen["y_default"] == "none"
    assert {c.id: c.status for c in res.checks}["c"] == "ok"


def test_duplicate_findings_are_emitted_once():
    def dup(ctx):
        for _ in range(3):
            yield catalog.make("gpu.xid", "warning", "pci 1", "x")

    res, out, _ = _run([Check("d", dup, "d")])
    assert len([r for r in out if r["kind"] == "finding"]) == 1


def test_facts_of_checks_outside_the_run_fail_at_once():
    """`--only driver` must not make driver wait its timeout for a fact nvml would publish."""
    seen = {}

    def consumer(ctx):
        try:
            ctx.fact(facts.NVML, timeout=10)
        except FactUnavailable as exc:
            seen["why"] = str(exc)
        return []

    res, _, _ = _run([Check("c", consumer, "c")])
    # failed before any check ran (a timed-out wait would say "not published within")
    assert "check nvml is not part of this run" in seen["why"]
    assert res.checks[0].status == "ok"
