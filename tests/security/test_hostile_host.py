"""Hostile input on the host (issue 12 item 3), through the real probe process or the real
reader: a device as --plugin-log, a 400 MB sparse ld.so.preload in a container root, a
process whose comm is not UTF-8, a process posing as the device plugin by its name."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.deviceplugin.conftest import host, start_plugin  # noqa: F401 - fixtures
from tests.probe_run import REPO, run_probe

MiB = 1 << 20


# The child reports its own peak RSS (VmHWM of its address space) when it ends. wait4's
# ru_maxrss cannot be used: a child forked from a large pytest process carries the parent's
# high-water mark across exec, so in a full suite it reports pytest's size, not the probe's.
_HWM_WRAPPER = """
import os, runpy, sys
def _hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            with open(os.environ["GD_HWM_FILE"], "w") as f:
                f.write(line.split()[1])
mode, what, *rest = sys.argv[1:]
try:
    if mode == "-m":  # the probe ends with os._exit (abandoning hung threads): call its main
        assert what == "node_probe", what
        from node_probe.cli import main
        code = main(rest)
        sys.stdout.flush()
        _hwm()
        os._exit(int(code))
    else:
        sys.argv = ["-c", *rest]
        exec(compile(what, "<test>", "exec"), {"__name__": "__main__"})
finally:
    sys.stdout.flush()
    _hwm()
"""


def _peak_rss(argv: list[str], as_limit: int = 1 << 30, timeout: float = 60):
    """Run `python -m MOD ...` or `python -c CODE` under an address-space limit; return
    (exit code, stdout, peak RSS in bytes of that process alone)."""
    assert argv[0] == sys.executable and argv[1] in ("-m", "-c"), argv
    hwm_file = Path(OUT_FILE + ".hwm")
    hwm_file.unlink(missing_ok=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), GD_HWM_FILE=str(hwm_file))
    argv = [sys.executable, "-c", _HWM_WRAPPER, *argv[1:]]
    pid = os.fork()
    if pid == 0:  # child
        try:
            resource.setrlimit(resource.RLIMIT_AS, (as_limit, as_limit))
            os.chdir(REPO)
            fd = os.open(os.devnull, os.O_WRONLY)
            out = os.open(OUT_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(out, 1)
            os.dup2(fd, 2)
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    end = time.monotonic() + timeout
    while True:
        wpid, status, _ = os.wait4(pid, os.WNOHANG)
        if wpid:
            break
        if time.monotonic() > end:
            os.kill(pid, 9)
            os.wait4(pid, 0)
            pytest.fail("child did not finish")
        time.sleep(0.02)
    if not hwm_file.exists():
        pytest.fail("the child did not report its peak RSS")
    return os.waitstatus_to_exitcode(status), Path(OUT_FILE).read_text(), int(hwm_file.read_text()) * 1024


OUT_FILE = f"/tmp/gd-hostile-{os.getpid()}.out"


def test_dev_zero_as_plugin_log_keeps_the_probe_small():
    code, out, rss = _peak_rss([sys.executable, "-m", "node_probe", "-o", "jsonl", "--only",
                                "hami", "--trace-seconds", "0", "--plugin-log", "/dev/zero"])
    recs = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert recs and recs[-1]["kind"] == "summary", out[-1000:]
    assert rss < 150 * MiB, f"peak RSS {rss / MiB:.0f} MiB"
    logs = [r["message"] for r in recs if r["kind"] == "log"]
    assert any("/dev/zero" in m and "not a regular file" in m for m in logs), logs
    (hami,) = [c for c in recs[-1]["checks"] if c["id"] == "hami"]
    assert hami["status"] == "ok", hami


def test_sparse_400mb_ld_so_preload_is_read_in_part(tmp_path):
    """A container root whose /etc/ld.so.preload is a 400 MB sparse file: the audit reads a
    capped head (flagged), still finds the library, and stays far under the pod's 384Mi."""
    root = tmp_path / "ctr"
    (root / "etc").mkdir(parents=True)
    (root / "usr/local/vgpu").mkdir(parents=True)
    (root / "usr/local/vgpu/libvgpu.so").write_bytes(b"\x7fELF")
    with open(root / "etc/ld.so.preload", "wb") as f:
        f.write(b"/usr/local/vgpu/libvgpu.so\n")
        f.truncate(400 * MiB)
    code = textwrap.dedent(f"""
        import json
        from pathlib import Path
        from node_probe.checks import hami
        res = hami.audit_root(Path({str(root)!r}), {{"CUDA_DEVICE_MEMORY_LIMIT": "1g"}})
        print(json.dumps(res, default=str))
    """)
    rc, out, rss = _peak_rss([sys.executable, "-c", code])
    assert rc == 0, out
    res = json.loads(out)
    assert rss < 100 * MiB, f"peak RSS {rss / MiB:.0f} MiB"
    assert res["ld_so_preload_truncated_at"] > 0
    assert res["preloaded_libs"] == ["/usr/local/vgpu/libvgpu.so"]
    assert res["lib_present"] == {"/usr/local/vgpu/libvgpu.so": True}


def test_fifo_as_ld_so_preload_does_not_block(tmp_path):
    from node_probe.checks import hami
    root = tmp_path / "ctr"
    (root / "etc").mkdir(parents=True)
    os.mkfifo(root / "etc/ld.so.preload")
    t0 = time.monotonic()
    res = hami.audit_root(root, {"CUDA_DEVICE_MEMORY_LIMIT": "1g"})
    assert time.monotonic() - t0 < 20  # hang guard: opening the FIFO would block forever
    assert any("unreadable" in p for p in res["problems"]), res["problems"]


def _named(name: bytes) -> subprocess.Popen:
    """A real process whose comm is `name` (set with prctl(PR_SET_NAME), as any tenant can)."""
    code = textwrap.dedent(f"""
        import ctypes, sys, time
        libc = ctypes.CDLL(None)
        libc.prctl(15, ctypes.c_char_p({name!r}), 0, 0, 0)
        sys.stdout.write("ready\\n"); sys.stdout.flush()
        time.sleep(120)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert p.stdout.readline() == b"ready\n"
    return p


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
    p.wait(timeout=10)


def test_non_utf8_comm_does_not_crash_the_kubelet_check(host):  # noqa: F811
    (host.kubelet / "config.yaml").write_text("kind: KubeletConfiguration\ncpuManagerPolicy: none\n")
    p = _named(b"\xff\xfekube\xc3let")
    try:
        run = run_probe(*host.args("--only", "kubelet", "--trace-seconds", "0"))
    finally:
        _stop(p)
    (chk,) = [c for c in run.summary["checks"] if c["id"] == "kubelet"]
    assert chk["status"] == "ok", (chk, run.stderr[-2000:])
    assert run.returncode == 0


def test_process_named_like_the_plugin_is_not_taken_for_it(host):  # noqa: F811
    """A tenant process named nvidia-device-plugin owns no plugin socket: it is not the
    plugin (with cpuManagerPolicy static the old name match raised a false warning)."""
    (host.kubelet / "config.yaml").write_text(
        "kind: KubeletConfiguration\ncpuManagerPolicy: static\n")
    p = _named(b"nvidia-device-plugin")
    try:
        run = run_probe(*host.args("--only", "kubelet", "--trace-seconds", "0"))
    finally:
        _stop(p)
    assert run.findings("deviceplugin.no_device_specs") == []
    (cm,) = run.findings("kubelet.cpu_manager_static")
    assert cm["severity"] == "info" and p.pid not in cm["evidence"]["nvidia_plugins"]


def test_socket_with_the_plugins_path_in_another_mount_namespace_is_not_the_plugin(
        host, tmp_path):  # noqa: F811
    """Binding a socket whose path string equals the plugin socket's (in another mount
    namespace, or unlinked after bind) does not make a process the plugin: only the
    socket inode the kubelet dials counts."""
    import socket as socketmod

    from node_probe.deviceplugin import discovery
    real = host.plugins_dir / "nvidia-gpu.sock"
    s_real = socketmod.socket(socketmod.AF_UNIX)
    s_real.bind(str(real))                 # a socket file nobody in particular serves ...
    s_real.close()                         # ... (closed: no process holds its inode)
    code = textwrap.dedent(f"""
        import os, socket, sys, time
        s = socket.socket(socket.AF_UNIX)
        s.bind({str(tmp_path / 'x.sock')!r})
        os.unlink({str(tmp_path / 'x.sock')!r})
        # a poser: binds the same basename elsewhere, then removes the file
        t = socket.socket(socket.AF_UNIX)
        t.bind({str(tmp_path / 'nvidia-gpu.sock')!r})
        t.listen(1)
        os.unlink({str(tmp_path / 'nvidia-gpu.sock')!r})
        sys.stdout.write("ready\\n"); sys.stdout.flush()
        time.sleep(120)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"ready\n"
        (t,) = discovery.discover(host.kubelet)
        assert t.pid is None, t
    finally:
        _stop(p)


def test_elf_reader_refuses_a_fifo_where_a_mapped_library_was(tmp_path):
    """The stack scan reads libraries through /proc/PID/root/<mapped path>, which a container
    can replace with a FIFO: an error at once, never a blocked check."""
    import threading

    from node_probe.host import elfsyms, hostfs
    fifo = tmp_path / "libnvidia-ml.so.1"
    os.mkfifo(fifo)
    box = {}

    def run():
        try:
            elfsyms.read_function_symbols(fifo)
        except (OSError, elfsyms.ElfError) as exc:
            box["exc"] = exc
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)  # hang guard: opening the FIFO for reading would block forever
    assert not t.is_alive() and isinstance(box.get("exc"), hostfs.NotRegularFile)
