"""Typed facts between checks: declared keys, needs/provides closure, and a check that says it
could not look (status `skipped` with a reason)."""
import json
import time
from pathlib import Path

import pytest

from node_probe import protocol
from node_probe.engine import facts, registry
from node_probe.engine.context import FactUnavailable, ProbeContext, ProbeOptions, Skipped
from node_probe.engine.registry import Check
from node_probe.engine.runner import Runner
from node_probe.host import containers
from node_probe.protocol import catalog

UID = "6f1c0a6e-1b2c-4d3e-8f90-123456789abc"
CID = "ab" * 32


def _ctx(**kw):
    return ProbeContext(ProbeOptions(trace_s=0, timeout_s=5, **kw), lambda rec: None)


def _run(checks, timeout_s=5.0):
    out = []
    res = Runner(checks, ProbeOptions(timeout_s=timeout_s, trace_s=0), out.append).run()
    return res, out


# -- declaration ---------------------------------------------------------------------------------

def test_needs_naming_an_unknown_fact_is_an_error_at_registration():
    with pytest.raises(facts.UnknownFact, match="no.such.fact"):
        @registry.check("test.bad_needs", title="bad", needs=("no.such.fact",))
        def bad(ctx):
            return []
    # a FactKey that was never declared is not a loophole
    with pytest.raises(facts.UnknownFact):
        registry.check("test.bad_key", title="bad",
                       needs=(facts.FactKey("nvml", facts.NvmlInventory),))(lambda ctx: [])
    with pytest.raises(facts.UnknownFact):
        registry.check("test.bad_provides", title="bad", provides=("nvml.typo",))(lambda ctx: [])
    assert not {"test.bad_needs", "test.bad_key", "test.bad_provides"} & {
        c.id for c in registry.all_checks()}


def test_a_fact_has_one_producer():
    with pytest.raises(ValueError, match="provided by both 'nvml' and 'test.second_nvml'"):
        registry.check("test.second_nvml", title="x", provides=(facts.NVML,))(lambda ctx: [])


def test_every_builtin_fact_has_a_producer_and_every_check_only_known_keys():
    checks = registry.all_checks()
    provided = {k.name for c in checks for k in c.provides}
    builtin = {k.name for k in facts.declared() if not k.name.startswith("test.")}
    assert builtin <= provided
    for c in checks:
        for k in (*c.needs, *c.uses, *c.provides):
            assert facts.resolve(k.name) is k


def test_every_fact_a_check_module_reads_is_declared_by_its_checks():
    """A fact read but not declared in needs=/uses= silently reads the default under --only
    (its producer is neither pulled in nor waited for)."""
    import ast
    import importlib

    reads_nvml = {"nvml", "nvml_or_skip"}   # the _gpufacts helpers read the NVML fact
    by_module: dict[str, set[str]] = {}
    for c in registry.all_checks():
        declared = {k.name for k in (*c.needs, *c.uses, *c.provides)}
        by_module.setdefault(c.fn.__module__, set()).update(declared)
    assert len(by_module) > 5
    for modname, declared in by_module.items():
        mod = importlib.import_module(modname)
        tree = ast.parse(Path(mod.__file__).read_text())
        read: set[str] = set()
        for n in ast.walk(tree):
            if not isinstance(n, ast.Call) or not isinstance(n.func, ast.Attribute):
                continue
            if n.func.attr == "fact" and n.args and isinstance(n.args[0], ast.Name):
                key = getattr(mod, n.args[0].id)
                read.add(key.name)
            elif (n.func.attr in reads_nvml and isinstance(n.func.value, ast.Name)
                  and n.func.value.id == "_gpufacts"):
                read.add(facts.NVML.name)
        assert read <= declared, (modname, sorted(read - declared))


def test_publish_refuses_a_payload_of_the_wrong_type():
    ctx = _ctx()
    with pytest.raises(TypeError, match="fact nvml: expected NvmlInventory, got dict"):
        ctx.publish(facts.NVML, {"status": "ok", "gpus": []})
    with pytest.raises(TypeError, match="items must be PluginTargetInfo"):
        ctx.publish(facts.DEVICEPLUGIN_TARGETS, [{"pid": 1}])
    ctx.publish(facts.PODRESOURCES, [{"pod": "p"}])      # a list is stored as a tuple
    assert ctx.fact(facts.PODRESOURCES, timeout=0) == ({"pod": "p"},)


# -- selection: needs pull producers in, uses do not ---------------------------------------------

def test_selecting_a_check_pulls_in_the_producers_of_what_it_needs():
    ids = lambda cs: [c.id for c in cs]   # noqa: E731
    assert ids(registry.select(["hami"])) == ["containers", "hami"]
    assert ids(registry.select(["driver"])) == ["driver", "nvml"]
    # every GPU family judged from NVML's view pulls the NVML child in (--only fabric)
    for cid in ("fabric", "gpu_lost", "gpu_memory", "mig_pending", "persistence"):
        assert ids(registry.select([cid])) == sorted([cid, "nvml"]), cid
    # `uses` is not pulled in: --only cgroup.devices must not start device-plugin RPCs
    assert ids(registry.select(["cgroup.devices"])) == ["cgroup.devices", "containers"]
    # an explicit --skip wins; the consumer then reads the fact's default at once
    assert ids(registry.select(["hami"], ["containers"])) == ["hami"]
    assert "containers" not in ids(registry.select(skip=["containers"]))


def test_fact_of_a_producer_outside_the_run_fails_at_start():
    seen = {}

    def consumer(ctx):
        seen["value"] = ctx.fact(facts.CONTAINERS, timeout=10, default="none")
        seen["why"] = ctx.facts.why(facts.CONTAINERS)

    runner = Runner([Check("c", consumer, "c", needs=(facts.CONTAINERS,))],
                    ProbeOptions(timeout_s=5, trace_s=0), lambda rec: None)
    # failed when the run is set up, so a wait returns at once instead of spending its timeout
    assert runner.ctx.facts.why(facts.CONTAINERS) == \
        "containers: check containers is not part of this run"
    res = runner.run()
    assert seen["value"] == "none" and res.checks[0].status == "ok"
    assert seen["why"] == "containers: check containers is not part of this run"


def test_fact_without_default_raises_and_times_out():
    ctx = _ctx()
    t0 = time.monotonic()
    with pytest.raises(FactUnavailable, match="kubelet.config: not published within 0.2s"):
        ctx.fact(facts.KUBELET_CONFIG, timeout=0.2)
    assert time.monotonic() - t0 >= 0.2   # it did wait its timeout


# -- typed payloads -------------------------------------------------------------------------------

def test_nvml_inventory_keeps_the_gpu_list_typed():
    rec = {"status": "ok", "driver_version": "570.158.01", "library_version": "570.158.01",
           "gpus": [{"index": 0, "uuid": "GPU-a", "name": "A100", "minor": 0, "mig_mode": True,
                     "mig_devices": [{"index": 0, "uuid": "MIG-x", "profile": "1g.10gb",
                                      "gpu_instance_id": 7, "compute_instance_id": 0}]},
                    {"index": 1, "uuid": "GPU-b", "minor": 1, "mig_mode": False}]}
    inv = facts.NvmlInventory.from_record(rec)
    assert [g.uuid for g in inv.gpus] == ["GPU-a", "GPU-b"]
    assert inv.gpus[0].mig_devices[0].gpu_instance_id == 7 and inv.version == "570.158.01"
    assert [g["mig_mode"] for g in inv.gpu_records()] == [True, False]
    assert facts.NvmlInventory.from_record(inv.to_dict()) == inv
    assert facts.NvmlInventory(status="hang", library_version="1.2").version == "1.2"


def test_container_list_finds_a_container_by_pid_and_by_cgroup():
    ref = containers.parse_cgroup_path(f"/kubepods/burstable/pod{UID}/{CID}")
    gpu = containers.Container(ref=ref, cgroup_path=Path("/sys/fs/cgroup/devices" + ref.rel),
                               cgroup_version=1, pids=[11, 12], gpu_source="environ",
                               gpu_ids=["0"])
    other_ref = containers.parse_cgroup_path(f"/kubepods/besteffort/pod{UID[:-1]}0/{'cd' * 32}")
    plain = containers.Container(ref=other_ref, cgroup_path=Path("/x"), cgroup_version=1,
                                 pids=[13])
    lst = facts.ContainerList(None, (gpu, plain))
    assert lst.gpu == (gpu,) and len(lst) == 2
    assert lst.by_pid(12) is gpu and lst.by_pid(13) is plain and lst.by_pid(99) is None
    assert lst.by_cgroup(ref.rel) is gpu
    assert lst.by_cgroup(f"/sys/fs/cgroup/devices{ref.rel}") is gpu
    assert lst.by_cgroup("/") is None and lst.by_cgroup("/kubepods/other") is None
    with pytest.raises(Exception):   # frozen: consumers cannot change a shared fact
        gpu.pids = []


# -- a check that could not look ------------------------------------------------------------------

def test_a_check_says_it_could_not_look_with_a_reason():
    def raises(ctx):
        yield catalog.make("nvml.unavailable", "info", "node", "seen before giving up")
        ctx.skip("no /dev/kmsg (needs CAP_SYSLOG)")

    def returns(ctx):
        return Skipped("kubelet not found")

    def gen_returns(ctx):
        if False:
            yield
        return Skipped("no GPU")

    def producer(ctx):
        ctx.skip("nothing to discover")

    seen = {}

    def consumer(ctx):
        seen["x"] = ctx.fact(facts.KUBELET_CONFIG, timeout=5, default=None)
        seen["why"] = ctx.facts.why(facts.KUBELET_CONFIG)

    res, out = _run([Check("a", raises, "a"), Check("b", returns, "b"),
                     Check("c", gen_returns, "c"),
                     Check("p", producer, "p", provides=(facts.KUBELET_CONFIG,)),
                     Check("q", consumer, "q", needs=(facts.KUBELET_CONFIG,))])
    by_id = {c.id: c for c in res.checks}
    assert {i: (c.status, c.reason) for i, c in by_id.items()} == {
        "a": ("skipped", "no /dev/kmsg (needs CAP_SYSLOG)"), "b": ("skipped", "kubelet not found"),
        "c": ("skipped", "no GPU"), "p": ("skipped", "nothing to discover"), "q": ("ok", "")}
    assert [f.title for f in res.findings] == ["seen before giving up"]
    assert res.complete is True   # skipped is an honest answer, not an incomplete run
    assert seen == {"x": None, "why": "kubelet.config: check p skipped: nothing to discover"}
    # the JSON `checks` list carries the reason (additive), and a Report reads it back
    summary = out[-1]
    assert {"id": "b", "status": "skipped", "reason": "kubelet not found"}.items() <= \
        next(c for c in summary["checks"] if c["id"] == "b").items()
    assert "reason" not in next(c for c in summary["checks"] if c["id"] == "q")
    report = protocol.Report({"kind": "local", "name": "n", "node": "n"}, "0")
    for rec in out:
        report.add_record(json.loads(protocol.encode(rec)))
    doc = report.document("warning")
    assert next(c for c in doc["checks"] if c["id"] == "a")["reason"].startswith("no /dev/kmsg")
    progress = [r for r in out if r["kind"] == "progress" and r.get("check") == "c"]
    assert progress and progress[0]["reason"] == "no GPU"
