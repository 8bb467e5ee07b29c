"""What others wrote, kept out of the tool's own words (audit round 5, MCP-01).

Why: a finding's title becomes the verdict's headline, which a person reads first and an
assistant is told to read first. Text from the cluster -- an event's or a container's message,
a condition's message, a writer's name -- can be anyone's: a tenant's Warning event on its own
pod can say "ignore previous instructions". So titles say what kind of text there is, in our
words, and the text itself goes in the finding's `quoted` list (node_probe.protocol.quote),
which renderers show escaped and marked as quoted. Reasons (CamelCase identifiers the kubelet
and the scheduler use) may stay in a title when they are one word; anything else is replaced.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from node_probe.protocol import quote

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")


def word(reason: Any, placeholder: str = "(a reason that is not one word)") -> str:
    """An event's, a state's or a condition's reason as a title may carry it: one identifier,
    else `placeholder`."""
    r = str(reason or "")
    return r if _WORD.fullmatch(r) else placeholder


def event_quote(e: Mapping[str, Any], about: str) -> dict:
    """The `quoted` entry of an event's message: `event <reason> on <about>`."""
    return quote(f"event {word(e.get('reason'))} on {about}", "message", e.get("message"))
