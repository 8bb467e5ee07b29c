"""The NodeCondition contract between the watching agent and `nodes` (protocol/conditions.py)."""
from node_probe.protocol import catalog, conditions


def test_every_watched_id_is_in_the_catalog_and_raises_one_class():
    seen = {}
    for ctype, ids in conditions.CLASSES.items():
        assert ctype.startswith(conditions.TYPE_PREFIX)
        for fid in ids:
            assert fid in catalog.CATALOG, fid
            assert fid not in seen, f"{fid} raises {seen[fid]} and {ctype}"
            seen[fid] = ctype
            assert conditions.class_of(fid) == ctype


def test_reason_is_camel_case_and_round_trips():
    assert conditions.reason_of("deviceplugin.blocked_in_nvml") == "DevicepluginBlockedInNvml"
    for fid in conditions._CLASS_OF:
        r = conditions.reason_of(fid)
        assert r.isalnum() and r[0].isupper()
        assert conditions.finding_id_of(r) == fid


def test_message_is_one_bounded_printable_line():
    msg = conditions.sanitize_message("a\x1b[31m\nb" + "é" * 5000)
    assert "\n" not in msg and "\x1b" not in msg
    assert len(msg.encode()) <= conditions.MESSAGE_MAX
    assert msg.startswith("a [31m b")


def test_owned_types():
    assert conditions.is_owned({"type": "GpuDoctorXidErrors"})
    assert not conditions.is_owned({"type": "KernelDeadlock"})
    assert conditions.WATCHING_TYPE in conditions.OWNED_TYPES


def test_quiet_and_cleared_reasons_differ_and_are_camel_case():
    for ct in conditions.CLASSES:
        q, c = conditions.quiet_reason(ct), conditions.cleared_reason(ct)
        assert q != c and q.isalnum() and c.isalnum() and q[0].isupper() and c[0].isupper()
    assert conditions.cleared_reason("GpuDoctorXidErrors") == "XidErrorsCleared"
