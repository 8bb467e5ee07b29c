"""The one Kubernetes quantity parser, and every analysis reading the same text the same way."""
from __future__ import annotations

import time
from decimal import Decimal

import pytest

from kubectl_gpudoctor.analysis.resources import capacity, memory
from kubectl_gpudoctor.analysis.scheduling import gpu_held, hami
from kubectl_gpudoctor.analysis import quantity
from kubectl_gpudoctor.analysis.quantity import QTY_MAX

D = Decimal
# (text, exact value or None when it is not a quantity)
TABLE = [
    ("0", D(0)), ("8", D(8)), ("+2", D(2)), ("-3", D(-3)), ("1.", D(1)), (".5", D("0.5")),
    ("+.5", D("0.5")), ("1.5", D("1.5")),
    # decimal SI
    ("5n", D("5e-9")), ("3u", D("3e-6")), ("500m", D("0.5")), ("1500m", D("1.5")),
    ("1k", D(1000)), ("1M", D(10) ** 6), ("1.5G", D("1.5e9")), ("2T", D("2e12")),
    ("1P", D(10) ** 15), ("1E", D(10) ** 18),
    # binary SI
    ("1Ki", D(1024)), ("65536Ki", D(64 << 20)), ("100Mi", D(100 << 20)), ("1.5Gi", D(3 << 29)),
    ("64Gi", D(64 << 30)), ("1Ti", D(1 << 40)), ("1Pi", D(1 << 50)), ("1Ei", D(1 << 60)),
    # decimal exponents (`1E` alone is exa, `1E3` a thousand)
    ("129e6", D("129e6")), ("1E3", D(1000)), ("1e+3", D(1000)), ("1e-3", D("0.001")),
    ("2e0", D(2)), ("-1e2", D(-100)),
    # surrounding whitespace is tolerated, inner is not
    (" 4 ", D(4)), ("1 Gi", None),
    # not quantities
    ("", None), (".", None), ("+", None), ("1e", None), ("e3", None), ("1ki", None),
    ("1KiB", None), ("1Gb", None), ("lots", None), ("NaN", None), ("Infinity", None),
    ("inf", None), ("1_000", None), ("0x10", None), ("1e3k", None), ("1.2.3", None),
    ("5%", None), (None, None), (True, None), ("\u00b2", None), ("\u0661\u0662", None),
    ("\uff18", None),                  # digits that are not ASCII (str.isdigit() says yes)
    # bounded: clamped, or refused when the exponent is not an int32
    ("1e999999999", D(QTY_MAX)), ("-1e999999999", D(-QTY_MAX)), ("9" * 40, D(QTY_MAX)),
    ("8Ei", D(QTY_MAX)), ("1e99999999999999999999", None), ("1" * (quantity.MAX_LEN + 1), None),
    ("0e999999999", D(0)),
    # numbers already decoded (YAML/JSON ints and floats)
    (1024, D(1024)), (1.5, D("1.5")), (float("nan"), None), (float("inf"), None),
]


@pytest.mark.parametrize("text,value", TABLE, ids=[repr(t)[:30] for t, _ in TABLE])
def test_parse_table(text, value):
    assert quantity.parse(text) == value
    assert quantity.to_float(text) == (None if value is None else float(value))


@pytest.mark.parametrize("text,n", [
    ("2", 2), ("1k", 1000), ("1500m", 2), ("500m", 1), ("3Gi", 3 << 30), ("1e-9", 1), ("1e-999999999", 1),
    ("2e0", 2), ("+2", 2), ("-3", 0), ("0", 0), ("bad", 0), ("NaN", 0), ("Infinity", 0), (None, 0),
    ("1e999999999", QTY_MAX), ("9" * 40, QTY_MAX), ("1e99999999999999999999", 0), (8, 8),
    ("\u00b2", 0), ("\u0661\u0662", 0), ("9" * 18, 10 ** 18 - 1), ("9" * 19, QTY_MAX)])
def test_count_rounds_up_and_is_never_negative(text, n):
    assert quantity.count(text) == n
    assert gpu_held.qty(text) == n   # the fit's scheduler replay reads the same numbers


def test_hostile_quantities_cost_nothing():
    hostile = ["1e999999999", "-1e2147483647", "1e-2147483647", "9" * 120, "." + "9" * 120,
               "1e99999999999999999999", "1" * 10000 + "Ki"]
    t = time.perf_counter()
    for _ in range(200):
        for h in hostile:
            quantity.count(h), quantity.to_float(h)
    assert time.perf_counter() - t < 2.0


# Inputs the four former parsers disagreed on: capacity read `1k`/`2e0` as 0, hami likewise,
# memory refused `n`/`u`, fit refused `1e3k`-like nothing but clamped differently.
DISAGREED = [("1k", 1000), ("2e0", 2), ("+2", 2), ("1500m", 2), ("1E3", 1000), (" 4 ", 4)]


@pytest.mark.parametrize("text,n", DISAGREED)
def test_every_analysis_reads_a_quantity_the_same_way(text, n):
    node = {"metadata": {"name": "n1", "labels": {capacity.GFD_COUNT_LABEL: text}},
            "status": {"capacity": {"nvidia.com/gpu": text, "memory": text},
                       "allocatable": {"nvidia.com/gpu": text, "memory": text}}}
    assert capacity.gpu_resources(node) == {"nvidia.com/gpu": (n, n)}
    assert capacity.is_gpu_node(node) and capacity.analyze_node(node) == []
    pod = {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": text}}}]}}
    assert hami._gpu_request_count(pod) == n
    assert gpu_held.pod_gpu_requests(pod) == {"nvidia.com/gpu": n}
    assert memory.to_float(text) == float(quantity.parse(text))


def test_memory_units_it_used_to_refuse():
    assert memory.to_float("3u") == 3e-6 and memory.to_float("12n") == 12e-9
