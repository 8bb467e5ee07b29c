"""The agent's NVML forkserver (host/nvml_forkserver.py, issue 41 item 3): each pass's NVML work
still runs in a fresh, killable process with its own nvmlInit, but forked from a process that
imported the NVML child once instead of a new interpreter every pass.

Real processes throughout: the real `python -m node_probe agent-watch`, the C stand-in
libnvidia-ml.so.1 (tests/fakes/fake_nvml.c) with `init_log=` so that each nvmlInit writes the
pid of the process that called it. No timing assertions: each test waits on a state.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.fakes.nvml import build_fake_nvml, config_text
from tests.watch.conftest import wait_for

NODE = "gpu-node-a"
LIBDIR = "usr/lib/x86_64-linux-gnu"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the NVML child runs as root")


def _children(pid: int) -> list[int]:
    out = []
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _forkserver(agent_pid: int) -> int | None:
    return next((p for p in _children(agent_pid) if _comm(p) == "nvml-forkserver"), None)


def _gone(pid: int) -> bool:
    """Exited (a zombie waiting for its reaper counts: it runs nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _maps_nvml(pid: int) -> bool:
    return "libnvidia-ml" in Path(f"/proc/{pid}/maps").read_text()


def _inits(log: Path) -> list[int]:
    try:
        return [int(x) for x in log.read_text().split()]
    except (OSError, ValueError):
        return []


def _agent(start_agent, host, tmp_path, *extra):
    kmsg = tmp_path / "kmsg.txt"
    kmsg.write_text("")
    cg = tmp_path / "cgroup"
    cg.mkdir(exist_ok=True)
    return start_agent(*host.args(), "--node-name", NODE, "--interval", "1", "--no-api",
                       "--no-evidence", "--kmsg-file", str(kmsg), "--cgroup-root", str(cg),
                       *extra)


def test_each_pass_inits_nvml_in_a_fresh_child_the_agent_and_forkserver_never_map_it(
        host, start_agent, tmp_path):
    """Three passes: three nvmlInit calls from three different processes, none of them the
    agent or its forkserver; neither long-lived process has libnvidia-ml mapped. Before: no
    forkserver (each pass started an interpreter)."""
    log = tmp_path / "inits"
    build_fake_nvml(host.root / LIBDIR, init="ok", init_log=log)
    agent = _agent(start_agent, host, tmp_path)
    fs = wait_for(lambda: _forkserver(agent.pid), 60, "the agent's NVML forkserver")
    pids = wait_for(lambda: len(_inits(log)) >= 3 and _inits(log), 120,
                    "three passes that called nvmlInit")
    assert len(set(pids)) == len(pids), f"a process called nvmlInit twice: {pids}"
    assert agent.pid not in pids and fs not in pids
    assert not _maps_nvml(agent.pid), "libnvidia-ml is mapped in the agent"
    assert not _maps_nvml(fs), "libnvidia-ml is mapped in the forkserver"
    assert _forkserver(agent.pid) == fs   # the same forkserver served every pass
    # each NVML child is gone once its pass is over: none lingers beside the forkserver
    wait_for(lambda: all(_gone(p) for p in _inits(log)[:3]), 60, "the NVML children exited")
    assert agent.stop() == 0


def test_a_hung_nvmlinit_is_killed_at_its_deadline_and_the_next_pass_still_asks(
        host, start_agent, tmp_path):
    """nvmlInit blocks for ever (a real futex wait): the pass's child is killed at the
    --nvml-timeout deadline and reported as a hang; the forkserver lives on, and once the driver
    answers again the next pass's fresh child initialises and the condition clears."""
    log = tmp_path / "inits"
    libdir = host.root / LIBDIR
    build_fake_nvml(libdir, init="block", init_log=log)
    agent = _agent(start_agent, host, tmp_path, "--nvml-timeout", "1s", "--clear-after", "1",
                   "--clear-quiet", "0")
    fs = wait_for(lambda: _forkserver(agent.pid), 60, "the agent's NVML forkserver")
    hung = wait_for(lambda: _inits(log), 120, "a pass's child in nvmlInit")[0]
    wait_for(lambda: _gone(hung), 60, "the hung NVML child killed at its deadline")
    wait_for(lambda: "GpuDoctorDevicePluginStuck -> True" in agent.text(), 120,
             "the hang reported")
    assert "NVML did not answer" in agent.text()
    (libdir / "fake_nvml.conf").write_text(config_text(init="ok", init_log=log))
    wait_for(lambda: "GpuDoctorDevicePluginStuck -> False" in agent.text(), 120,
             "a later pass that initialised NVML")
    after = [p for p in _inits(log) if p != hung]
    assert after and fs not in after and agent.pid not in after
    assert _forkserver(agent.pid) == fs and not _maps_nvml(fs)
    assert agent.stop() == 0


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
def test_the_forkserver_goes_with_the_agent(host, start_agent, tmp_path, how):
    """SIGKILL (PR_SET_PDEATHSIG) or Ctrl-C (the agent stops, the forkserver's control socket
    has no peer left): no forkserver and no NVML child outlives the agent, even one hung in
    nvmlInit at that moment."""
    log = tmp_path / "inits"
    build_fake_nvml(host.root / LIBDIR, init="block", init_log=log)
    agent = _agent(start_agent, host, tmp_path, "--nvml-timeout", "30s")
    fs = wait_for(lambda: _forkserver(agent.pid), 60, "the agent's NVML forkserver")
    hung = wait_for(lambda: _inits(log), 120, "a pass's child in nvmlInit")[0]
    os.kill(agent.pid, how)
    agent.proc.wait(60)
    wait_for(lambda: _gone(fs), 60, "the forkserver exited with the agent")
    wait_for(lambda: _gone(hung), 60, "the hung NVML child exited with it")


# A process like the agent: it starts the forkserver, forks a requester like a pass child, and
# that requester asks for the NVML child (argv: host root, library, timeout, then "die" to have
# the requester SIGKILLed as soon as nvmlInit is entered, as the agent kills a pass at its
# deadline, then waits, holding the forkserver, for the hung NVML child to go). Prints the
# forkserver's pid, then the result (or whether the NVML child is gone).
AGENT_LIKE = r"""
import json, os, signal, sys, time
from pathlib import Path
from node_probe.host import nvml_forkserver
from node_probe.checks import nvml
root, lib, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
mode, log = sys.argv[4], sys.argv[5]
srv = nvml_forkserver.start()
print(srv.pid, flush=True)
pid = os.fork()
if pid == 0:
    res, stage, raw = nvml.run_child(Path(lib), timeout, Path(root))
    print(json.dumps({"status": (res or {}).get("status"), "stage": stage,
                      "timed_out": raw.timed_out}), flush=True)
    os._exit(0)
if mode == "die":
    while not Path(log).exists() or not Path(log).read_text().strip():
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    hung = int(Path(log).read_text().split()[0])
    end = time.monotonic() + 60   # the forkserver (still up: this process holds it) kills it
    while time.monotonic() < end:
        try:
            if Path(f"/proc/{hung}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
        except OSError:
            break
        time.sleep(0.05)
    else:
        print("alive", flush=True)
        sys.exit(0)
    print("gone", flush=True)
else:
    os.waitpid(pid, 0)
"""


def _agent_like(host, lib, timeout, mode, log):
    import subprocess
    import sys
    from tests.watch.conftest import REPO
    return subprocess.run([sys.executable, "-c", AGENT_LIKE, str(host.root), str(lib),
                           str(timeout), mode, str(log)], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_pass_killed_takes_its_nvml_child_with_it(host, tmp_path):
    """The requester (a pass child) is SIGKILLed while its NVML child hangs in nvmlInit with a
    deadline far away: the forkserver sees the requester's end close and kills the child."""
    log = tmp_path / "inits"
    lib = build_fake_nvml(host.root / LIBDIR, init="block", init_log=log)
    p = _agent_like(host, lib, 300, "die", log)
    assert p.stdout.split()[1:] == ["gone"], p.stderr
    assert len(_inits(log)) == 1


def test_a_hung_child_times_out_as_a_started_one_did(host, tmp_path):
    log = tmp_path / "inits"
    lib = build_fake_nvml(host.root / LIBDIR, init="block", init_log=log)
    p = _agent_like(host, lib, 1.0, "wait", log)
    import json
    got = json.loads(p.stdout.splitlines()[-1])
    assert got == {"status": None, "stage": "init", "timed_out": True}, p.stderr
    (hung,) = _inits(log)
    wait_for(lambda: _gone(hung), 60, "the hung NVML child killed")


def test_a_dead_forkserver_leaves_the_passes_their_nvml_child(host, start_agent, tmp_path):
    """The forkserver killed (the OOM killer, an operator): the agent reaps it, says so once,
    and its next passes start their NVML child as before: NVML is still asked every pass."""
    log = tmp_path / "inits"
    build_fake_nvml(host.root / LIBDIR, init="ok", init_log=log)
    agent = _agent(start_agent, host, tmp_path)
    fs = wait_for(lambda: _forkserver(agent.pid), 60, "the agent's NVML forkserver")
    wait_for(lambda: _inits(log), 120, "a pass that called nvmlInit")
    os.kill(fs, signal.SIGKILL)
    wait_for(lambda: "the NVML forkserver exited" in agent.text(), 120, "the agent noticed")
    n = len(_inits(log))
    wait_for(lambda: len(_inits(log)) >= n + 2, 120, "two more passes that called nvmlInit")
    assert _forkserver(agent.pid) is None and not _maps_nvml(agent.pid)
    assert agent.text().count("the NVML forkserver exited") == 1
    assert agent.stop() == 0
