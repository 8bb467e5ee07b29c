"""hostfs's one safe open (issue 12 item 3): it cannot leave the root, never blocks on FIFOs
or devices, reads at most its cap. Every test runs both resolution methods: openat2
(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS) and the O_NOFOLLOW component walk."""
from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from node_probe.host import hostfs

METHODS = [pytest.param(True, id="openat2"), pytest.param(False, id="nofollow-walk")]


@pytest.fixture(params=METHODS)
def method(request):
    if request.param and not hostfs.openat2_available():
        pytest.skip("this kernel has no openat2")
    return request.param


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    outside = tmp_path / "outside-secret"
    outside.write_text("OUTSIDE")
    return root, outside


def _bounded(fn, timeout=30.0):
    """Run fn in a thread; fail (instead of hanging the suite) if it blocks."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["exc"] = exc
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "the read blocked"
    if "exc" in box:
        raise box["exc"]
    return box["value"]


def test_openat2_is_used_on_this_kernel():
    # the fallback is tested below; the primary path must really be the kernel's here
    assert hostfs.openat2_available()


def test_absolute_symlink_resolves_inside_the_root(tree, method):
    root, outside = tree
    inside_copy = root / str(outside).lstrip("/")
    inside_copy.parent.mkdir(parents=True)
    inside_copy.write_text("INSIDE")
    (root / "etc" / "cfg").symlink_to(outside)          # absolute, as host links are
    assert hostfs.read_under(root, "etc/cfg", use_openat2=method).text == "INSIDE"
    inside_copy.unlink()
    with pytest.raises(FileNotFoundError):
        hostfs.read_under(root, "/etc/cfg", use_openat2=method)


def test_dotdot_never_climbs_above_the_root(tree, method):
    root, outside = tree
    (root / "etc" / "up").symlink_to("../../../../../" + outside.name)
    (root / outside.name).write_text("INSIDE")
    assert hostfs.read_under(root, "etc/up", use_openat2=method).text == "INSIDE"
    assert hostfs.read_under(root, "../../" + outside.name, use_openat2=method).text == "INSIDE"


def test_symlink_swapped_to_outside_is_never_followed(tree, method):
    """A tenant flips etc/cfg between a regular file and an absolute symlink to a file
    outside the root. The old resolve-then-open read the outside file in the window."""
    root, outside = tree
    cfg = root / "etc" / "cfg"
    regular, link = root / "etc" / ".regular", root / "etc" / ".link"
    cfg.write_text("INSIDE")
    stop = threading.Event()

    def flipper():
        while not stop.is_set():
            regular.write_text("INSIDE")
            os.replace(regular, cfg)
            try:
                link.unlink()
            except FileNotFoundError:
                pass
            link.symlink_to(outside)
            os.replace(link, cfg)
    t = threading.Thread(target=flipper, daemon=True)
    t.start()
    seen = set()
    try:
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            if method:
                try:
                    seen.add(hostfs.read_under(root, "etc/cfg", use_openat2=True).text)
                except OSError:
                    seen.add(None)
            else:
                seen.add(_walk_read(root))
    finally:
        stop.set()
        t.join()
    assert "OUTSIDE" not in seen
    assert "INSIDE" in seen


def _walk_read(root):
    try:
        return hostfs.read_under(root, "etc/cfg", use_openat2=False).text
    except OSError:
        return None


def test_read_text_public_api_never_reads_outside_under_a_swap(tree):
    """The same race through the API the checks use (read_text)."""
    root, outside = tree
    cfg = root / "etc" / "cfg"
    regular, link = root / "etc" / ".regular", root / "etc" / ".link"
    cfg.write_text("INSIDE")
    stop = threading.Event()

    def flipper():
        while not stop.is_set():
            regular.write_text("INSIDE")
            os.replace(regular, cfg)
            try:
                link.unlink()
            except FileNotFoundError:
                pass
            link.symlink_to(outside)
            os.replace(link, cfg)
    t = threading.Thread(target=flipper, daemon=True)
    t.start()
    seen = set()
    try:
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            seen.add(hostfs.read_text(root, "etc/cfg"))
    finally:
        stop.set()
        t.join()
    assert "OUTSIDE" not in seen and "INSIDE" in seen


@pytest.mark.root
def test_proc_magic_link_inside_a_container_root_is_not_followed(tree, method):
    """A container root has its own /proc; /proc/self/root there is a magic link to the
    reader's (the probe's) root. Following it would leave the container."""
    root, outside = tree
    (root / "proc").mkdir()
    subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")], check=True)
    try:
        (root / "etc" / "cfg").symlink_to("../proc/self/root" + str(outside))
        with pytest.raises(OSError):
            hostfs.read_under(root, "etc/cfg", use_openat2=method)
        assert hostfs.read_text(root, "proc/self/root" + str(outside)) is None
        assert hostfs.resolve(root, "etc/cfg") is None
    finally:
        subprocess.run(["umount", "-l", str(root / "proc")], check=True)


def test_fifo_where_a_config_is_expected_does_not_block(tree, method):
    root, _ = tree
    os.mkfifo(root / "etc" / "cfg")
    with pytest.raises(hostfs.NotRegularFile, match="FIFO"):
        _bounded(lambda: hostfs.read_under(root, "etc/cfg", use_openat2=method))
    assert _bounded(lambda: hostfs.read_text(root, "etc/cfg")) is None


@pytest.mark.root
def test_device_node_is_refused_without_being_opened(tree, method):
    root, _ = tree
    os.mknod(root / "etc" / "cfg", 0o600 | 0o020000, os.makedev(1, 5))  # /dev/zero
    with pytest.raises(hostfs.NotRegularFile, match="character device"):
        _bounded(lambda: hostfs.read_under(root, "etc/cfg", use_openat2=method))


def test_dev_zero_as_a_plain_path_is_refused():
    with pytest.raises(hostfs.NotRegularFile):
        _bounded(lambda: hostfs.read_file("/dev/zero"))
    with pytest.raises(hostfs.NotRegularFile):
        _bounded(lambda: hostfs.read_tail("/dev/zero", 1 << 20))


def test_reads_are_capped_and_flagged(tree, method):
    root, _ = tree
    big = root / "etc" / "big"
    with open(big, "wb") as f:
        f.write(b"head\n")
        f.truncate(400 << 20)                        # sparse: 400 MB of zeros on paper
    blob = hostfs.read_under(root, "etc/big", cap=4096, use_openat2=method)
    assert blob.truncated and len(blob.data) == 4096 and blob.data.startswith(b"head\n")
    small = hostfs.read_under(root, "etc/big", cap=(400 << 20) + 1, use_openat2=False)
    assert not small.truncated
    del small
    tail = hostfs.read_tail(big, 10)
    assert tail.truncated and tail.data == b"\0" * 10


def test_text_is_decoded_with_replacement(tree, method):
    root, _ = tree
    (root / "etc" / "cfg").write_bytes(b"ok \xff\xfe \xed\xa0\x80 end")
    assert hostfs.read_text(root, "etc/cfg") == "ok \ufffd\ufffd \ufffd\ufffd\ufffd end"


def test_resolve_and_exists_follow_links_inside_the_root(tree):
    root, _ = tree
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/libnvidia-ml.so.570").write_text("elf")
    (root / "usr/lib/libnvidia-ml.so.1").symlink_to("/usr/lib/libnvidia-ml.so.570")
    assert hostfs.resolve(root, "/usr/lib/libnvidia-ml.so.1") == root / "usr/lib/libnvidia-ml.so.570"
    assert hostfs.resolve(root, "usr/lib/missing") is None
    assert hostfs.exists_under(root, "usr/lib/libnvidia-ml.so.1", "file")
    assert hostfs.exists_under(root, "usr/lib", "dir")
    assert not hostfs.exists_under(root, "usr/lib", "file")


def test_symlink_loop_is_an_error_not_a_hang(tree, method):
    root, _ = tree
    (root / "etc" / "a").symlink_to("b")
    (root / "etc" / "b").symlink_to("a")
    with pytest.raises(OSError):
        _bounded(lambda: hostfs.read_under(root, "etc/a", use_openat2=method))
    assert hostfs.resolve(root, "etc/a") is None


def test_proc_style_reads_refuse_a_fifo_without_blocking(tmp_path):
    from node_probe.host import procfs
    os.mkfifo(tmp_path / "comm")
    assert _bounded(lambda: procfs.read_str(tmp_path / "comm")) is None
    with pytest.raises(hostfs.NotRegularFile):
        _bounded(lambda: hostfs.read_pseudo(tmp_path / "comm"))
    assert hostfs.read_pseudo("/proc/self/stat", cap=8).truncated
