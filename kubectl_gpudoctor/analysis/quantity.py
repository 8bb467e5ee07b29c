"""Kubernetes resource quantities (`8`, `1k`, `1500m`, `64Gi`, `129e6`): the one parser.

Why: node capacity, pod requests/limits, quota and kubelet config values all arrive as quantity
strings; four ad-hoc parsers read the same text differently (`1k` as 0 in one, `500m` refused in
another), so the same node could be judged GPU-less by one analysis and full by the next. This
module reads the grammar of k8s.io/apimachinery `resource.Quantity`:

    quantity ::= [+-] number suffix
    number   ::= digits | digits "." [digits] | "." digits
    suffix   ::= "" | n | u | m | k | M | G | T | P | E      (decimal SI)
               | Ki | Mi | Gi | Ti | Pi | Ei                 (binary SI)
               | (e|E) [+-] digits                           (decimal exponent)

(`1E` is one exa, `1E3` one thousand.) Values come from the API and from tenants' pod specs, so
the work is bounded: input is capped in length, a huge exponent is clamped to QTY_MAX rather than
expanded into an enormous integer, an exponent beyond int32 is not a quantity. Pure; no I/O.
"""
from __future__ import annotations

import functools
import math
import re
from decimal import Decimal, InvalidOperation
from typing import Any

QTY_MAX = 2 ** 63 - 1      # the API server's int64 ceiling; a larger (hostile) value is clamped
MAX_LEN = 128              # canonical quantities are a few characters; longer text is not one
_MAX_EXP = 2 ** 31 - 1     # apimachinery keeps the scale in an int32
_BIG = 30                  # |value| >= 1e31 is past QTY_MAX whatever the suffix
_TINY = Decimal("1e-40")   # |value| below 1e-40 stands in as 1e-40: same ceiling, no underflow

_SUFFIX = {"": Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
           "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9,
           "T": Decimal(10) ** 12, "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
           "Ki": Decimal(2 ** 10), "Mi": Decimal(2 ** 20), "Gi": Decimal(2 ** 30),
           "Ti": Decimal(2 ** 40), "Pi": Decimal(2 ** 50), "Ei": Decimal(2 ** 60)}
_QTY_RE = re.compile(r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))"
                     r"(?:([eE])([+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)")


def parse(value: Any) -> Decimal | None:
    """The exact value of a quantity (ints and finite floats pass through), or None if `value`
    is not one. The magnitude is clamped to QTY_MAX."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return Decimal(max(-QTY_MAX, min(value, QTY_MAX)))
    if isinstance(value, float):
        return parse(repr(value)) if math.isfinite(value) else None
    s = str(value).strip()
    return None if len(s) > MAX_LEN else _parse_text(s)


# a fleet's 150,000 pods repeat a few dozen quantities; keys are at most MAX_LEN characters
@functools.lru_cache(maxsize=4096)
def _parse_text(s: str) -> Decimal | None:
    m = _QTY_RE.fullmatch(s)
    if m is None:
        return None
    number, e, exp, suffix = m.groups()
    try:
        if e is not None:
            if len(exp.lstrip("+-")) > 10 or abs(int(exp)) > _MAX_EXP:
                return None
            v, mult = Decimal(number + "E" + exp), Decimal(1)   # exact: no context, no rounding
        else:
            v, mult = Decimal(number), _SUFFIX[suffix or ""]
        if not v:
            return Decimal(0)
        if v.adjusted() > _BIG:
            return Decimal(-QTY_MAX if v.is_signed() else QTY_MAX)
        if v.adjusted() < -40:
            v = _TINY.copy_sign(v)
        v *= mult
    except (InvalidOperation, ArithmeticError):
        return None
    if abs(v) > QTY_MAX:
        return Decimal(-QTY_MAX if v.is_signed() else QTY_MAX)
    return v


def count(value: Any) -> int:
    """A quantity as a whole, non-negative number, rounded up as apimachinery's Value() does
    (`1500m` -> 2); 0 for anything that is not a quantity or is negative. For extended resources
    (GPUs), pod counts and label counts."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 18:
        return int(value)                         # the common case: "8"
    v = parse(value)
    if v is None or v <= 0:
        return 0
    return min(int(v.to_integral_value(rounding="ROUND_CEILING")), QTY_MAX)


def to_float(value: Any) -> float | None:
    """A quantity in base units as a float (bytes for memory: `64Gi` -> 68719476736.0), or None."""
    if type(value) is str:
        s = value.strip()
        return None if len(s) > MAX_LEN else _float_text(s)
    v = parse(value)
    return None if v is None else float(v)


@functools.lru_cache(maxsize=4096)
def _float_text(s: str) -> float | None:
    v = _parse_text(s)
    return None if v is None else float(v)
