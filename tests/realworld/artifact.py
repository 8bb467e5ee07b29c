"""One real-world artifact: text quoted exactly from a public source, with the cause that source
established, and what the tool must answer when it meets that text.

Why: every other test feeds the tool strings we wrote. The corpus (tests/realworld/corpus_*.py,
each a list ARTIFACTS) holds what real drivers, kubelets, runtimes and device plugins printed,
as quoted in public issue threads, vendor docs and source; the feeding tests give each artifact
to the tool the way it meets it on a node or in a cluster (CHANNELS says how) and check the
thread's cause by finding id, severity and a cause word that the artifact does not contain, so
that echoing the input back cannot pass.
"""
from __future__ import annotations

import dataclasses
import re

# how the tool meets the text; each channel has one feeding test module
CHANNELS = {
    "kmsg": "kernel log lines, as /dev/kmsg records in a host root and as a pasted file",
    "event": "a Kubernetes Event through the fake API server",
    "pod_status": "a pod's status (waiting/terminated reason and message) through the fake API server",
    "node_condition": "a node condition written by another monitor, through the fake API server",
    "node_status": "a node's GPU capacity and allocatable, through the fake API server",
    "plugin_log": "a device plugin's or DRA driver's log line (the plugin pod's log or its event)",
    "runtime_message": "a container runtime's error as the kubelet reports it on container start",
}
SEVERITIES = ("critical", "warning", "info")


@dataclasses.dataclass(frozen=True)
class Artifact:
    key: str                # unique, short: "<project>#<number>-<what>" or "<doc>-<what>"
    source: str             # the public URL where the text is quoted (thread, doc, source line)
    quote: str              # the text exactly as quoted there; whitespace kept
    channel: str            # a key of CHANNELS
    diagnosis: str          # the cause the source established, one sentence
    fix: str                # what fixed it there (or "none reported")
    expect_id: str          # the finding id the tool must report for it
    expect_severity: str    # critical | warning | info
    cause_word: str         # in the finding's title, evidence words or remediation; not in quote
    # channel extras (event reason, phase, the condition's type/status/reason, capacity): the
    # fields around the quoted message, quoted from the same source where it shows them
    context: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.channel not in CHANNELS:
            raise ValueError(f"{self.key}: unknown channel {self.channel!r}")
        if self.expect_severity not in SEVERITIES:
            raise ValueError(f"{self.key}: unknown severity {self.expect_severity!r}")
        if not re.match(r"https?://", self.source):
            raise ValueError(f"{self.key}: source must be a URL")
        if not self.cause_word.strip() or self.cause_word.lower() in self.quote.lower():
            raise ValueError(f"{self.key}: cause word {self.cause_word!r} is empty or occurs in "
                             "the quote; echoing the input back must not pass")
