"""The agent's Events, correlated as client-go's EventCorrelator does: one Event per node and
reason, its count and lastTimestamp patched, and a token bucket per problem class.

Why: under a flapping fault every transition used to be a new Event object (security round 4,
W-12: 161 Events in 4 minutes, each with count 1), which floods `kubectl describe node` and the
API server's etcd. client-go (tools/record/events_cache.go, kubernetes/client-go) does three
things, and this does the same for the agent's stdlib writer:

- aggregation by reason (EventAggregatorByReasonFunc): Events that share source component and
  host, involvedObject, type and reason are one; here every later occurrence of a (type,
  reason) on this node PATCHes that Event (strategic merge of `count`, `lastTimestamp` and
  the latest `message`, as recordEvent's sink.Patch does) instead of creating another. client-
  go first keeps up to defaultAggregateMaxEvents = 10 distinct messages per reason within
  defaultAggregateIntervalInSeconds = 600 s before it combines them; the agent's messages
  differ with every pass (counts, ages), so it combines at once.
- the spam filter (EventSourceObjectSpamFilter): a token bucket per key, defaultSpamBurst = 25
  writes, refilled at defaultSpamQPS = 1/300 s. Here the key is the problem class (one bucket
  per condition type, and one for the agent's own start/stop), and an occurrence that finds
  no token is not lost: it is counted, and the next write carries the total.
- the cache is bounded (maxLruCacheEntries = 4096 there): here at most MAX_RECORDS reasons,
  the oldest forgotten first.
"""
from __future__ import annotations

import collections
import dataclasses
import time

BURST = 25                  # client-go defaultSpamBurst
REFILL_S = 300.0            # client-go defaultSpamQPS = 1/300
MAX_RECORDS = 256           # reasons remembered (client-go: an LRU of 4096)


@dataclasses.dataclass
class Record:
    """One Event on the server (or about to be): a (type, reason) of this node."""
    cls: str
    reason: str
    warning: bool
    message: str
    first: float
    last: float
    count: int = 1
    name: str | None = None       # the server's name, once created
    written: int = 0              # the count the server has

    @property
    def due(self) -> bool:
        return self.count != self.written


class Bucket:
    def __init__(self, burst: int = BURST, refill_s: float = REFILL_S,
                 now: float | None = None) -> None:
        self.burst, self.refill_s = burst, refill_s
        self.tokens = float(burst)
        self.at = time.monotonic() if now is None else now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) / self.refill_s)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False

    def next_at(self, now: float) -> float:
        return now + max(0.0, (1 - self.tokens) * self.refill_s)


class Correlator:
    """Not thread-safe: the writer holds its lock around every call."""

    def __init__(self, burst: int = BURST, refill_s: float = REFILL_S) -> None:
        self.burst, self.refill_s = burst, refill_s
        self.records: collections.OrderedDict[tuple[bool, str], Record] = \
            collections.OrderedDict()
        self.buckets: dict[str, Bucket] = {}

    def observe(self, cls: str, reason: str, message: str, warning: bool,
                now: float | None = None) -> Record:
        """One occurrence (a transition, the agent starting or stopping)."""
        t = time.time() if now is None else now
        key = (warning, reason)
        rec = self.records.get(key)
        if rec is None:
            rec = Record(cls, reason, warning, message, t, t)
            self.records[key] = rec
            while len(self.records) > MAX_RECORDS:
                self.records.popitem(last=False)
        else:
            rec.count += 1
            rec.last, rec.message = t, message
            self.records.move_to_end(key)
        return rec

    def take_due(self, mono: float | None = None) -> list[Record]:
        """The records to write now: changed since their last write, with a token of their
        class's bucket (spent here)."""
        now = time.monotonic() if mono is None else mono
        out = []
        for rec in self.records.values():
            if not rec.due:
                continue
            b = self.buckets.get(rec.cls)
            if b is None:
                b = self.buckets[rec.cls] = Bucket(self.burst, self.refill_s, now)
            if b.take(now):
                out.append(rec)
        return out

    def pending(self) -> bool:
        return any(r.due for r in self.records.values())

    def next_token_at(self, mono: float | None = None) -> float | None:
        """When a waiting record's class gets a token again (None: nothing waits)."""
        now = time.monotonic() if mono is None else mono
        ats = [self.buckets[r.cls].next_at(now) for r in self.records.values()
               if r.due and r.cls in self.buckets]
        return min(ats) if ats else None
