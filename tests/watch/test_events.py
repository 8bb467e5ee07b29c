"""The agent's Event correlation (node_probe/watch/events.py) against client-go's: one Event
per reason, a token bucket per class of burst 25 refilled every 300 s, nothing lost while
waiting (kubernetes/client-go tools/record/events_cache.go: EventAggregatorByReasonFunc,
defaultSpamBurst = 25, defaultSpamQPS = 1/300)."""
from node_probe.watch.events import BURST, REFILL_S, Correlator


def test_repeats_of_a_reason_are_one_record_with_a_count():
    c = Correlator()
    for i in range(5):
        c.observe("GpuDoctorXidErrors", "GpuXid", f"Xid 79 x{i}", True, now=100.0 + i)
    (rec,) = c.records.values()
    assert (rec.count, rec.first, rec.last, rec.message) == (5, 100.0, 104.0, "Xid 79 x4")


def test_a_class_writes_at_most_its_burst_then_one_per_refill_and_loses_nothing():
    assert (BURST, REFILL_S) == (25, 300.0)   # client-go's defaults
    c = Correlator()
    writes = 0
    for i in range(100):                       # a flip every second for 100 s
        c.observe("GpuDoctorXidErrors", "GpuXid", "m", True, now=float(i))
        for rec in c.take_due(mono=float(i)):
            rec.written = rec.count
            writes += 1
    assert writes == 25
    (rec,) = c.records.values()
    assert rec.count == 100 and rec.due        # counted, waiting for a token
    assert c.next_token_at(mono=100.0) is not None
    assert c.take_due(mono=100.0 + REFILL_S)   # the next token carries the total


def test_classes_have_their_own_buckets():
    c = Correlator(burst=1)
    c.observe("GpuDoctorXidErrors", "GpuXid", "m", True, now=0.0)
    c.observe("GpuDoctorGpuLost", "GpuLost", "m", True, now=0.0)
    assert len(c.take_due(mono=0.0)) == 2
