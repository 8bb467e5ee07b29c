"""HAMi API-side analysis on realistic annotation values: every encoding HAMi has written,
fresh and stale handshakes and locks, garbage, and pod allocation annotations."""
from __future__ import annotations

import datetime as dt

import pytest

from kubectl_gpudoctor.analysis.scheduling import hami, hami_annotations
from tests.hami.conftest import (NOW, REG_JSON, REG_LEGACY7, REG_LEGACY9, UUID_A, UUID_B, event,
                                 node, plugin_pod, pod)


def _by_id(findings, id_):
    return [f for f in findings if f.id == id_]


# -- register ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value,encoding", [(REG_LEGACY7, "legacy-7"), (REG_LEGACY9, "legacy-9"),
                                            (REG_JSON, "json")])
def test_register_decodes_every_encoding(value, encoding):
    devs, enc = hami_annotations.decode_register(value)
    assert enc == encoding
    assert [d["id"] for d in devs] == [UUID_A, UUID_B]
    assert all(d["count"] == 10 and d["devmem"] == 46068 and d["health"] for d in devs)
    assert devs[1]["index"] == (0 if encoding == "legacy-7" else 1)
    assert all(hami_annotations.validate_device(d) == [] for d in devs)


@pytest.mark.parametrize("value", [REG_LEGACY7, REG_LEGACY9, REG_JSON])
def test_valid_register_gives_no_finding(value, now):
    n = node(annotations={hami_annotations.REGISTER_KEY: value,
                          "hami.io/node-handshake": "Requesting_2024.05.14 07:09:45"})
    assert hami.analyze_node(n, [plugin_pod()], [], now) == []


@pytest.mark.parametrize("value,err", [
    ("GPU-03f69c50-207a-2038-9b45-23cac89cb67d", "no ':' separator"),
    ("{not json", "no ':' separator"),
    ("[{\"id\": \"GPU-x\", \"count\": \"ten\"}]", "non-numeric"),
    ("[1, 2]", "not a list of device objects"),
    ("[{\"id\": ", "invalid JSON"),
    (f"{UUID_A},10,46068,100,NVIDIA-A40,0:", "6 fields"),
    (f"{UUID_A},ten,46068,100,NVIDIA-A40,0,true:", "invalid count"),
    (f"{UUID_A},10,46068,100,NVIDIA-A40,0,yes:", "invalid health"),
])
def test_register_garbage_is_critical(value, err, now):
    with pytest.raises(hami_annotations.DecodeError, match=err):
        hami_annotations.decode_register(value)
    (f,) = hami.analyze_node(node(annotations={hami_annotations.REGISTER_KEY: value}), [], [], now)
    assert f.id == "hami.register_invalid" and f.severity.value == "critical"
    assert "cannot be decoded" in f.title and f.evidence["error"]


def test_register_invalid_devices_named():
    value = ('[{"id":"GPU-1234","count":10,"devmem":16384,"devcore":100,"type":"NVIDIA-T4","health":true},'
             '{"id":"%s","count":0,"devmem":0,"devcore":100,"type":"Tesla T4","health":true}]' % UUID_A)
    (f,) = hami.analyze_node(node(annotations={hami_annotations.REGISTER_KEY: value}), [plugin_pod()], [], NOW)
    assert f.severity.value == "critical" and "2 of 2 devices" in f.title
    probs = {p["id"]: " ".join(p["problems"]) for p in f.evidence["invalid_devices"]}
    assert "not a GPU UUID" in probs["GPU-1234"]
    assert "count 0" in probs[UUID_A] and "devmem 0" in probs[UUID_A]
    assert "does not start with NVIDIA" in probs[UUID_A]
    assert "kubectl -n kube-system delete pod hami-device-plugin-x7k2p" in f.remediation
    assert "Risk:" in f.remediation


def test_json_register_without_health_means_unhealthy():
    value = ('[{"id":"%s","count":10,"devmem":46068,"devcore":100,"type":"NVIDIA-NVIDIA A40"},'
             '{"id":"%s","index":1,"count":10,"devmem":46068,"devcore":100,'
             '"type":"NVIDIA-NVIDIA A40","health":true}]' % (UUID_A, UUID_B))
    (f,) = hami.analyze_node(node(annotations={hami_annotations.REGISTER_KEY: value}), [], [], NOW)
    assert f.severity.value == "warning" and f.evidence["unhealthy_devices"] == [UUID_A]
    assert "omits" in f.title


def test_empty_register_and_missing_register():
    (f,) = hami.analyze_node(node(annotations={hami_annotations.REGISTER_KEY: "[]"}), [], [], NOW)
    assert f.severity.value == "critical" and "no devices" in f.title
    (g,) = hami.analyze_node(node(annotations={
        "hami.io/node-handshake": "Requesting_2024.05.14 07:09:50"}), [], [], NOW)
    assert g.id == "hami.register_invalid" and "no hami.io/node-nvidia-register" in g.title
    assert "gpu=on" in g.remediation  # no plugin pod on the node: say where to look


def test_not_a_hami_node():
    assert hami.analyze_node(node(annotations={"nvidia.com/gpu.product": "A40"}),
                             [pod("plain", annotations={})], [], NOW) == []


# -- handshake --------------------------------------------------------------------------------

@pytest.mark.parametrize("value,state,iso", [
    ("Requesting_2024.05.14 07:07:33", "Requesting", "2024-05-14T07:07:33+00:00"),
    ("Requesting_2024-05-14 07:07:33", "Requesting", "2024-05-14T07:07:33+00:00"),
    ("Deleted_2024.05.14 07:08:40", "Deleted", "2024-05-14T07:08:40+00:00"),
    ("Reported 2024-05-14 07:09:50.434037031 +0000 UTC m=+1104711.777756895", "Reported",
     "2024-05-14T07:09:50.434037+00:00"),
    ("Reported 2024-05-14 15:09:50.1 +0800 CST m=+5.1", "Reported", "2024-05-14T15:09:50.100000+08:00"),
    ("Reported_2024.05.14 07:09:50", "Reported", "2024-05-14T07:09:50+00:00"),
])
def test_parse_handshake(value, state, iso):
    s, t = hami_annotations.parse_handshake(value)
    assert s == state and t.isoformat() == iso


def _hs(value, now=NOW):
    n = node(annotations={hami_annotations.REGISTER_KEY: REG_LEGACY7, "hami.io/node-handshake": value})
    return _by_id(hami.analyze_node(n, [plugin_pod()], [], now), "hami.handshake_stale")


def test_handshake_fresh_requesting_and_reported_are_fine():
    assert _hs("Requesting_2024.05.14 07:09:30") == []
    assert _hs("Reported 2024-05-14 07:09:45.1 +0000 UTC m=+3.2") == []


def test_handshake_requesting_older_than_60s_is_critical():
    (f,) = _hs("Requesting_2024.05.14 07:08:30")
    assert f.severity.value == "critical" and f.evidence["age_s"] == 90.0
    assert "never answered" in f.title
    assert "kubectl -n kube-system delete pod hami-device-plugin-x7k2p" in f.remediation
    assert "Risk:" in f.remediation


def test_handshake_deleted_is_critical():
    (f,) = _hs("Deleted_2024.05.14 07:05:00")
    assert f.severity.value == "critical" and "removed" in f.title


def test_handshake_old_report_is_a_warning():
    (f,) = _hs("Reported 2024-05-14 07:01:00.5 +0000 UTC m=+1.0")
    assert f.severity.value == "warning" and "8m59s ago" in f.title   # kubectl's HumanDuration


def test_handshake_unparseable_time_is_critical_like_hami_reads_it():
    (f,) = _hs("Requesting_yesterday")
    assert f.severity.value == "critical" and "cannot be parsed" in f.title


def test_handshake_in_the_future_is_clock_skew():
    (f,) = _hs("Requesting_2024.05.14 07:20:00")
    assert f.severity.value == "warning" and "clock skew" in f.title


def test_vendor_handshake_keys_are_read_too():
    n = node(annotations={hami_annotations.REGISTER_KEY: REG_LEGACY7,
                          "hami.io/node-handshake-mlu": "Requesting_2024.01.10 04:06:57"})
    (f,) = _by_id(hami.analyze_node(n, [], [], NOW), "hami.handshake_stale")
    assert f.evidence["annotation"] == "hami.io/node-handshake-mlu"


# -- node lock --------------------------------------------------------------------------------

def _lock(value, pods=(), events=(), index=None, now=NOW):
    n = node(annotations={hami_annotations.REGISTER_KEY: REG_LEGACY7, hami_annotations.LOCK_KEY: value})
    return _by_id(hami.analyze_node(n, list(pods), list(events), now, all_pods_index=index),
                  "hami.lock_stale")


def test_lock_formats():
    t, ns, name = hami_annotations.parse_lock("2024-05-14T07:07:33Z,default,train-0")
    assert (t.isoformat(), ns, name) == ("2024-05-14T07:07:33+00:00", "default", "train-0")
    t, ns, name = hami_annotations.parse_lock("2024-05-14T15:07:33+08:00")
    assert t == dt.datetime(2024, 5, 14, 7, 7, 33, tzinfo=dt.timezone.utc) and name == ""
    for bad in ("2024-05-14 07:07:33", "2024-05-14T07:07:33Z,default", "a,b,c,d", ""):
        with pytest.raises(hami_annotations.DecodeError):
            hami_annotations.parse_lock(bad)


def test_fresh_lock_held_by_allocating_pod_is_fine():
    owner = pod("train-0", annotations={hami_annotations.BIND_PHASE_KEY: "allocating"})
    assert _lock("2024-05-14T07:08:00Z,default,train-0", pods=[owner]) == []


def test_expired_lock_is_a_warning_and_critical_when_binds_are_rejected():
    owner = pod("train-0", annotations={hami_annotations.BIND_PHASE_KEY: "allocating"})
    (f,) = _lock("2024-05-14T06:58:00Z,default,train-0", pods=[owner])
    assert f.severity.value == "warning" and "12m" in f.title
    waiting = pod("train-1", node_name=None)
    rejected = event(waiting, "FailedScheduling",
                     "binding rejected: node gpu-1 has been locked within 5 minutes")
    (g,) = _lock("2024-05-14T06:58:00Z,default,train-0", pods=[owner], events=[rejected])
    assert g.severity.value == "critical" and g.evidence["binds_rejected_events"] == 1
    assert g.remediation.count("kubectl annotate node gpu-1 hami.io/mutex.lock-") == 1
    assert "Risk:" in g.remediation and "#3096" in g.remediation


def test_lock_owner_gone_is_critical_with_the_index():
    (f,) = _lock("2024-05-14T07:08:00Z,default,train-0", index={})
    assert f.severity.value == "critical" and f.evidence["owner_state"] == "gone"


def test_lock_owner_not_on_node_without_index_is_a_warning():
    (f,) = _lock("2024-05-14T07:08:00Z,default,train-0")
    assert f.severity.value == "warning" and f.evidence["owner_state"] == "not found on this node"


def test_lock_owner_finished_or_failed():
    done = pod("train-0", phase="Failed", annotations={hami_annotations.BIND_PHASE_KEY: "failed"})
    (f,) = _lock("2024-05-14T07:08:00Z,default,train-0", pods=[done])
    assert f.severity.value == "critical" and "is Failed" in f.title
    ok = pod("train-0", phase="Running", annotations={hami_annotations.BIND_PHASE_KEY: "success"})
    (g,) = _lock("2024-05-14T07:08:00Z,default,train-0", pods=[ok])
    assert "not released" in g.title


def test_old_format_lock_without_owner():
    assert _lock("2024-05-14T07:08:00Z") == []
    (f,) = _lock("2024-05-14T06:00:00Z")
    assert f.evidence["owner"] is None and "70m" in f.title


def test_garbage_lock_is_critical():
    (f,) = _lock("locked-by-someone")
    assert f.severity.value == "critical" and "cannot be parsed" in f.title


# -- pods -------------------------------------------------------------------------------------

def _pods(*pods, events=(), register=REG_LEGACY7):
    n = node(annotations={hami_annotations.REGISTER_KEY: register,
                          "hami.io/node-handshake": "Requesting_2024.05.14 07:09:50"})
    return _by_id(hami.analyze_node(n, list(pods), list(events), NOW), "hami.allocation_mismatch")


def test_decode_pod_devices():
    v = f"{UUID_A},NVIDIA,3000,30:{UUID_B},NVIDIA,3000,30:;;"
    assert [[d["uuid"] for d in c] for c in hami_annotations.decode_pod_devices(v)] == [[UUID_A, UUID_B]]
    assert hami_annotations.decode_pod_devices(";" + v) [1][0]["usedmem"] == 3000
    with pytest.raises(hami_annotations.DecodeError):
        hami_annotations.decode_pod_devices("GPU-x,NVIDIA:;")


def test_successful_allocation_is_fine():
    p = pod("ok", phase="Running", annotations={
        hami_annotations.ALLOCATED_KEY: f"{UUID_A},NVIDIA,3000,30:;", hami_annotations.TO_ALLOCATE_KEY: ";",
        hami_annotations.BIND_PHASE_KEY: "success", hami_annotations.BIND_TIME_KEY: "1715670000"})
    assert _pods(p) == []


def test_device_number_not_matched_event_is_critical():
    p = pod("infer-0", gpus=2, annotations={
        hami_annotations.ALLOCATED_KEY: f"{UUID_A},NVIDIA,3000,30:;", hami_annotations.TO_ALLOCATE_KEY: f"{UUID_A},NVIDIA,3000,30:;",
        hami_annotations.BIND_PHASE_KEY: "failed", hami_annotations.BIND_TIME_KEY: "1715670500"})
    ev = event(p, "UnexpectedAdmissionError",
               "Allocate failed due to device number not matched, which is unexpected")
    (f,) = _pods(p, events=[ev])
    assert f.severity.value == "critical"
    assert "device number not matched" in f.title and "allocated 1 device(s)" in f.title
    assert "kubectl -n default delete pod infer-0" in f.remediation
    assert "ReplicaSet recreates it" in f.remediation


def test_unregistered_device_and_bare_pod_risk():
    p = pod("bare", owner=False, annotations={
        hami_annotations.ALLOCATED_KEY: "GPU-deadbeef-0000-0000-0000-000000000000,NVIDIA,1000,10:;",
        hami_annotations.BIND_PHASE_KEY: "allocating", hami_annotations.BIND_TIME_KEY: str(int(NOW.timestamp()) - 30)})
    (f,) = _pods(p)
    assert f.evidence["unregistered_devices"] == ["GPU-deadbeef-0000-0000-0000-000000000000"]
    assert "gone for good" in f.remediation


def test_stuck_allocating_is_a_warning():
    p = pod("slow", annotations={
        hami_annotations.ALLOCATED_KEY: f"{UUID_A},NVIDIA,3000,30:;", hami_annotations.TO_ALLOCATE_KEY: f"{UUID_A},NVIDIA,3000,30:;",
        hami_annotations.BIND_PHASE_KEY: "allocating", hami_annotations.BIND_TIME_KEY: "2024-05-14 06:50:00"})
    (f,) = _pods(p)
    assert f.severity.value == "warning" and "20m" in f.title


def test_success_with_devices_left_to_allocate():
    p = pod("half", phase="Running", annotations={
        hami_annotations.ALLOCATED_KEY: f"{UUID_A},NVIDIA,3000,30:;", hami_annotations.TO_ALLOCATE_KEY: f"{UUID_A},NVIDIA,3000,30:;",
        hami_annotations.BIND_PHASE_KEY: "success", hami_annotations.BIND_TIME_KEY: "1715670000"})
    (f,) = _pods(p)
    assert f.severity.value == "warning" and "still in" in f.title


def test_out_of_range_bind_time_is_unknown_not_a_crash():
    assert hami_annotations.parse_bind_time("99999999999999999999") is None
    p = pod("far", annotations={
        hami_annotations.ALLOCATED_KEY: f"{UUID_A},NVIDIA,3000,30:;", hami_annotations.TO_ALLOCATE_KEY: f"{UUID_A},NVIDIA,3000,30:;",
        hami_annotations.BIND_PHASE_KEY: "allocating", hami_annotations.BIND_TIME_KEY: "99999999999999999999"})
    ok = pod("ok", phase="Running", annotations={hami_annotations.ALLOCATED_KEY: "GPU-x,NVIDIA:;"})
    # the far pod's age is unknown (no verdict on it), and the other pod is still judged
    assert [f.subject for f in _pods(p, ok)] == ["pod/default/ok"]


def test_undecodable_pod_annotation():
    p = pod("bad", annotations={hami_annotations.ALLOCATED_KEY: "GPU-x,NVIDIA:;"})
    (f,) = _pods(p)
    assert f.severity.value == "critical" and "cannot be decoded" in f.title


def test_lock_rejections_for_another_node_do_not_count():
    owner = pod("train-0", annotations={hami_annotations.BIND_PHASE_KEY: "allocating"})
    other = event(pod("x", node_name=None), "FailedScheduling",
                  "binding rejected: node gpu-10 has been locked within 5 minutes")
    (f,) = _lock("2024-05-14T06:58:00Z,default,train-0", pods=[owner], events=[other])
    assert f.evidence["binds_rejected_events"] == 0 and f.severity.value == "warning"


def test_lock_rejection_at_end_of_sentence_counts():
    owner = pod("train-0", annotations={hami_annotations.BIND_PHASE_KEY: "allocating"})
    ev = event(pod("x", node_name=None), "FailedScheduling",
               "0/3 nodes are available: binding rejected, has been locked within 5 minutes on gpu-1.")
    (f,) = _lock("2024-05-14T06:58:00Z,default,train-0", pods=[owner], events=[ev])
    assert f.evidence["binds_rejected_events"] == 1


@pytest.mark.parametrize("value", [
    '[{"id": "GPU-a", "index": 1e400}]',                  # inf: int() raised OverflowError
    '[{"id": "GPU-a", "count": ' + "9" * 5000 + "}]",    # json raised a plain ValueError
    "[" * 100_000,                                        # RecursionError in json
    "GPU-a,1_0,100,100,NVIDIA,0,true:",                   # Go's Atoi refuses what int() takes
    "GPU-a, 1,100,100,NVIDIA,0,true:",
    "GPU-a,\u0661,100,100,NVIDIA,0,true:",
    "GPU-a,99999999999999999999,100,100,NVIDIA,0,true:",  # past int64
])
def test_hostile_register_annotation_is_a_decode_error_not_a_crash(value):
    with pytest.raises(hami_annotations.DecodeError):
        hami_annotations.decode_register(value)
    assert hami_annotations.go_int("+3", "x") == 3 and hami_annotations.go_int("-3", "x") == -3
