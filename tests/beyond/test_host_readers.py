"""Host readers of the beyond-the-seeds checks on hostile host files: FIFOs never block, links
never leave the host root, sizes stay bounded, bad TOML is a reported error."""
from __future__ import annotations

import os
import threading
from pathlib import Path

from node_probe.host import daemons, runtime_config


def test_fabric_manager_log_fifo_and_escaping_link(tmp_path):
    root = tmp_path / "h"
    (root / "var/log").mkdir(parents=True)
    os.mkfifo(root / "var/log/fabricmanager.log")
    done = threading.Event()
    out = []
    t = threading.Thread(target=lambda: (out.append(daemons.fabricmanager_log_version(root)),
                                         done.set()), daemon=True)
    t.start()
    assert done.wait(5), "reading a FIFO blocked"
    assert out == [(None, None)]
    (root / "var/log/fabricmanager.log").unlink()
    secret = tmp_path / "outside.log"
    secret.write_text("Fabric Manager version is : 999.1.1\n")
    (root / "var/log/fabricmanager.log").symlink_to(secret)  # absolute: host-relative, missing
    assert daemons.fabricmanager_log_version(root) == (None, None)


def test_fabric_manager_log_tail_is_bounded(tmp_path):
    root = tmp_path / "h"
    (root / "var/log").mkdir(parents=True)
    (root / "var/log/fabricmanager.log").write_text(
        "Fabric Manager version is : 535.1.1\n" + "x" * (daemons.MAX_LOG_TAIL * 2)
        + "\n[INFO] Fabric Manager version is : 570.172.08\n")
    assert daemons.fabricmanager_log_version(root) == ("570.172.08", "/var/log/fabricmanager.log")


def test_dpkg_versions_of_host_and_driver_container(tmp_path):
    root = tmp_path / "h"
    for d, v in (("var/lib/dpkg", "570.172.08-1"), ("run/nvidia/driver/var/lib/dpkg", "1:570.158.01-0ubuntu1")):
        (root / d).mkdir(parents=True)
        (root / d / "status").write_text(
            "Package: nvidia-fabricmanager-570\nStatus: install ok installed\n"
            f"Version: {v}\nDescription: fm\n continuation line\n\n"
            "Package: nvidia-fabricmanager-dev-570\nStatus: deinstall ok config-files\n"
            "Version: 570.1.1-1\n")
    got = daemons.dpkg_versions(root, "nvidia-fabricmanager")
    assert got == {"nvidia-fabricmanager-570": "570.172.08-1",
                   "nvidia-fabricmanager-570 (run/nvidia/driver)": "1:570.158.01-0ubuntu1"}
    assert sorted(daemons.driver_version_of(v) for v in got.values()) == ["570.158.01",
                                                                         "570.172.08"]


def test_unparsable_containerd_config_is_an_error_not_a_crash(tmp_path):
    root = tmp_path / "h"
    (root / "etc/containerd").mkdir(parents=True)
    (root / "etc/containerd/config.toml").write_text("version = 2\n[plugins\n")
    cfg = runtime_config.containerd(root, Path("/nonexistent-proc"))
    assert cfg is not None and cfg.errors and not cfg.handlers


def test_cdi_spec_fifo_is_skipped(tmp_path):
    root = tmp_path / "h"
    (root / "etc/cdi").mkdir(parents=True)
    os.mkfifo(root / "etc/cdi/nvidia.yaml")
    done = threading.Event()
    t = threading.Thread(target=lambda: (runtime_config.cdi_specs(root), done.set()), daemon=True)
    t.start()
    assert done.wait(5), "reading a FIFO blocked"


def test_dpkg_versions_are_bounded(tmp_path):
    """A container's dpkg database says whatever its owner wrote: a bounded few, cut short."""
    status = tmp_path / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True)
    status.write_text("".join(
        f"Package: nvidia-fabricmanager-{i}{'x' * 500}\nStatus: install ok installed\n"
        f"Version: 570.{i}{'9' * 500}\n\n" for i in range(2000)))
    got = daemons.dpkg_versions(tmp_path, "nvidia-fabricmanager", ("",))
    assert len(got) == daemons.MAX_PACKAGES
    assert all(len(k) <= daemons.MAX_FIELD and len(v) <= daemons.MAX_FIELD
               for k, v in got.items())
