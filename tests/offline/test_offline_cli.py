"""`gpu-doctor-probe --nvidia-smi-file/--lspci-file/--bug-report` (and `local`) end to end:
a real probe process over an EMPTY --host-root, each flag alone; the findings are the judges'
own over the same records (the wiring adds and drops nothing); a file of a format a flag does
not read is one line naming the formats, exit 2.

The bug report is assembled as nvidia-bug-report.sh writes one (each section after its line of
underscores and a blank line, headed by the command it ran -- `$lspci -nnDvvvxxxx`, `dmesg:`,
`$nvidia_smi --query`, `Scanning kernel log files for NVIDIA kernel messages:` -- each section a
gzip member appended to the .gz: see the script, e.g.
https://github.com/sakjain92/Fractional-GPUs/blob/72c86c113d29d41a31371325ab50f119dfd219df/driver/NVIDIA-Linux-x86_64-390.48/nvidia-bug-report.sh
and its current form's `report_command "$nvidia_smi --query"`), from real sections: the A10's
`nvidia-smi -q`, the H100 node's lspci, and Xid lines quoted in tests/realworld.
"""
from __future__ import annotations

import gzip
import json

from node_probe.checks.slow import judge
from node_probe.host.offline import bounded, nvsmi_xml
from tests.kubectl.conftest import run_cli
from tests.offline.sources import DATA
from tests.probe_run import run_probe

SEP = "____________________________________________"
PROLOGUE = [SEP, "", "Start of NVIDIA bug report log file.  Please include this file, along",
            "with a detailed description of your problem, when reporting a graphics",
            "driver bug via the NVIDIA Linux forum (see forums.developer.nvidia.com)",
            "or by sending email to 'linux-bugs@nvidia.com'.", "",
            "nvidia-bug-report.sh Version: 31831145", ""]
# https://github.com/NVIDIA/gpu-operator/issues/1146 (a DBE on one GPU: validator pods kept
# crashing), as /var/log/kern.log holds it
XID48 = ("Dec  2 10:43:35 worker4 kernel: [240314.528856] NVRM: Xid (PCI:0000:07:00): 48, "
         "pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been "
         "detected on GPU in the framebuffer at physAddr 0x7fdd60000 partition")
# https://github.com/leptonai/gpud/pull/46 (application Xid 13s then Xid 109 on one GPU)
XID109 = ("[Fri Aug 30 11:43:14 2024] NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, "
          "name=pt_main_thread, Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005")


def text(name: str) -> list[str]:
    return list(bounded.iter_lines(DATA / name))


def bug_report(tmp_path, dmesg=True, scan=True):
    sections = [PROLOGUE,
                [SEP, "", "/usr/bin/lspci -nnDvvvxxxx", "", *text("lspci-vvv-h100-hgx.txt.gz")]]
    if scan:
        sections.append([SEP, "", "Scanning kernel log files for NVIDIA kernel messages:", "",
                         "  /var/log/kern.log:", XID48, ""])
    if dmesg:
        sections.append([SEP, "", "dmesg:", "", XID109])
    sections.append([SEP, "", "/usr/bin/nvidia-smi --query", "",
                     *text("nvsmi-q-a10-idle.txt"), ""])
    f = tmp_path / "nvidia-bug-report.log.gz"
    f.write_bytes(b"".join(gzip.compress(("\n".join(s) + "\n").encode()) for s in sections))
    return f


def probe(tmp_path, *args):
    empty = tmp_path / "empty-host"
    empty.mkdir(exist_ok=True)
    return run_probe("--host-root", str(empty), "--trace-seconds", "0", "--timeout", "20", *args)


def check(run, cid):
    [c] = [c for c in run.summary["checks"] if c["id"] == cid]
    return c


def test_nvidia_smi_text_alone_idle_gen1_raises_nothing(tmp_path):
    run = probe(tmp_path, "--nvidia-smi-file", str(DATA / "nvsmi-q-a10-idle.txt"),
                "--only", "offline")
    assert run.returncode == 0, run.stderr
    assert run.findings() == [] and check(run, "offline")["status"] == "ok"
    assert any("nvidia-smi -q text" in r.get("message", "") for r in run.records
               if r["kind"] == "progress")


def test_nvidia_smi_xml_gives_the_judges_findings_exactly(tmp_path):
    for name in ("nvsmi-x-a10g.xml", "nvsmi-x-rtx-3080-v13.xml", "nvsmi-x-tesla-t4.xml"):
        run = probe(tmp_path, "--nvidia-smi-file", str(DATA / name), "--only", "offline")
        want = judge.judge_gpus(nvsmi_xml.parse(text(name)))
        got = [(f["id"], f["subject"], f["title"]) for f in run.findings()]
        assert got == [(f.id, f.subject, f.title) for f in want], name
        assert run.summary["complete"] is True


def test_lspci_alone_judges_the_gpu_functions(tmp_path):
    run = probe(tmp_path, "--lspci-file", str(DATA / "lspci-vvv-h100-hgx.txt.gz"),
                "--only", "offline")
    assert run.returncode == 0, run.stderr
    assert run.findings() == [] and check(run, "offline")["status"] == "ok"


def test_bug_report_goes_through_every_check_that_applies(tmp_path):
    rep = bug_report(tmp_path)
    run = probe(tmp_path, "--bug-report", str(rep), "--only", "offline", "--only", "kmsg")
    assert check(run, "offline")["status"] == "ok" and check(run, "kmsg")["status"] == "ok"
    # the kernel log is dmesg's (Xid 109 on cb:00), read by the kmsg check itself
    xids = run.findings("gpu.xid")
    assert xids and all("0000:cb:00" in json.dumps(f) for f in xids), xids
    assert not any("0000:07:00" in json.dumps(f) for f in run.findings())
    # the idle A10 and the healthy H100 links: nothing slow
    assert not [f for f in run.findings() if f["check"] == "offline"]
    msgs = " ".join(r.get("message", "") for r in run.records if r["kind"] == "progress")
    assert "nvidia-smi --query (1 GPUs)" in msgs and "lspci (517 functions)" in msgs
    assert "kernel log (dmesg)" in msgs


def test_bug_report_without_dmesg_reads_the_kernel_log_scan(tmp_path):
    rep = bug_report(tmp_path, dmesg=False)
    run = probe(tmp_path, "--bug-report", str(rep), "--only", "kmsg")
    xids = run.findings("gpu.xid")
    assert xids and all("0000:07:00" in json.dumps(f) for f in xids)
    assert xids[0]["severity"] == "critical"


def one_line_exit_2(run):
    assert run.returncode == 2, (run.returncode, run.stderr)
    lines = [x for x in run.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    return lines[0]


def test_a_file_of_another_format_is_one_line_and_exit_2(tmp_path):
    xml, lsp = DATA / "nvsmi-x-a10g.xml", DATA / "lspci-vvv-h100-hgx.txt.gz"
    line = one_line_exit_2(probe(tmp_path, "--nvidia-smi-file", str(lsp)))
    assert "it reads `nvidia-smi -q` text and `nvidia-smi -q -x` XML" in line
    line = one_line_exit_2(probe(tmp_path, "--lspci-file", str(xml)))
    assert "it reads `lspci -vvv` text" in line
    line = one_line_exit_2(probe(tmp_path, "--bug-report", str(xml)))
    assert "nvidia-bug-report.log and nvidia-bug-report.log.gz" in line
    line = one_line_exit_2(probe(tmp_path, "--nvidia-smi-file", str(tmp_path / "nope")))
    assert "no such file" in line


def test_xml_with_entities_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "laughs.xml"
    bad.write_text('<?xml version="1.0"?>\n<!DOCTYPE nvidia_smi_log [<!ENTITY a "aaaa">]>\n'
                   "<nvidia_smi_log><gpu id='x'><uuid>&a;</uuid></gpu></nvidia_smi_log>\n")
    line = one_line_exit_2(probe(tmp_path, "--nvidia-smi-file", str(bad)))
    assert "entit" in line


def test_without_offline_input_the_check_is_not_listed(tmp_path):
    run = probe(tmp_path, "--only", "kmsg")
    assert "offline" not in {c["id"] for c in run.summary["checks"]}


def test_kubectl_local_passes_the_offline_flags(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run_cli("local", "--host-root", str(empty), "--nvidia-smi-file",
                str(DATA / "nvsmi-x-a10g.xml"), "--only", "offline", "--trace-seconds", "0",
                "--timeout", "20", "-o", "json")
    doc = json.loads(r.stdout)
    assert [f["id"] for f in doc["findings"]] == ["gpu.pcie_downtrained"], r.stderr
    r = run_cli("local", "--host-root", str(empty), "--lspci-file",
                str(DATA / "nvsmi-x-a10g.xml"), "--trace-seconds", "0")
    assert r.returncode == 2 and "it reads `lspci -vvv` text" in r.stderr
    # one line, the probe's own: the wrapper no longer adds "the probe rejected its
    # arguments (see above)" under it
    assert [x for x in r.stderr.splitlines() if x.strip()] == [r.stderr.strip()], r.stderr


def test_the_header_says_offline_not_live(tmp_path):
    empty = tmp_path / "e"
    empty.mkdir()
    t = run_probe("--host-root", str(empty), "--trace-seconds", "0", "--only", "offline",
           "--nvidia-smi-file", str(DATA / "nvsmi-q-a10-idle.txt"), output="table")
    first = t.stdout.splitlines()[0]
    assert "offline, from nvsmi-q-a10-idle.txt" in first and "live" not in first
    r = run_cli("local", "--host-root", str(empty), "--lspci-file",
                str(DATA / "lspci-vvv-h100-hgx.txt.gz"), "--only", "offline",
                "--trace-seconds", "0", "--timeout", "20")
    first = r.stdout.splitlines()[0]
    assert "offline, from lspci-vvv-h100-hgx.txt.gz" in first and "live" not in first


def test_offline_verify_is_capture_again_not_this_host(tmp_path):
    """The evidence of an offline run is another machine's: the verdict's verify step is to
    capture the same files again there after the fix (our commands for each flag given), never
    `kubectl gpu-doctor node <this host>` or `local` on this host."""
    rep = bug_report(tmp_path)
    empty = tmp_path / "e"
    empty.mkdir()
    r = run_cli("local", "--host-root", str(empty), "--bug-report", str(rep),
                "--trace-seconds", "0", "--timeout", "20", "-o", "json")
    doc = json.loads(r.stdout)
    assert doc["target"]["offline"] == ["bug-report"]
    v = doc["verdict"]
    assert v["root_cause"] == "gpu.xid" and v["subject"] == "the captured machine"
    [verify] = [a for a in v["actions"] if a["step"] == "verify"]
    assert verify["command"] == "sudo nvidia-bug-report.sh"
    assert "capture again after the fix" in verify["text"]
    cmds = " ".join(str(a["command"]) for a in v["actions"])
    assert "kubectl gpu-doctor node" not in cmds and "kubectl-gpu_doctor local" not in cmds
    assert "this host" not in json.dumps(v)
    t = run_cli("local", "--host-root", str(empty), "--bug-report", str(rep),
                "--trace-seconds", "0", "--timeout", "20")
    assert "on this host" not in t.stdout.splitlines()[0]


def test_offline_on_a_kubernetes_node_names_no_kubectl_command_for_it():
    """Run on a Kubernetes node (no node.not_kubernetes), the files still come from elsewhere:
    no cordon/drain of this node, verify captures each file given again."""
    from kubectl_gpudoctor.analysis.verdict import decide
    from node_probe.protocol import catalog
    xid = catalog.make("gpu.xid", "critical", "pci 0000:cb:00", "Xid 79 on the GPU",
                       {"xid": 79, "resolution_bucket": "reboot",
                       "bus_id": "0000:cb:00"})
    target = {"kind": "local", "name": "gpu-node-7", "node": "gpu-node-7",
              "offline": ["nvidia-smi", "lspci"]}
    v = decide([xid], target)
    cmds = [a.command for a in v.actions if a.command]
    assert not [c for c in cmds if "gpu-node-7" in c], cmds
    [verify] = [a for a in v.actions if a.step == "verify"]
    assert verify.command == "nvidia-smi -q -x > nvidia-smi.xml && sudo lspci -vvv > lspci.txt"
    live = decide([xid], {k: target[k] for k in ("kind", "name", "node")})
    assert any("kubectl drain gpu-node-7" in (a.command or "") for a in live.actions)
