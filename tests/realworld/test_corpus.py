"""The corpus itself: big enough, from enough public sources, keys unique, every channel fed,
and the healthy controls (real lines from healthy NVIDIA boots and a healthy monitor
condition) stay quiet through the same feeds.

Every tests/realworld/corpus_*.py module counts, found by name (corpus.py): a module another
branch adds is counted here without an edit."""
import pytest

from tests.realworld import corpus
from tests.realworld.artifact import Artifact
from tests.realworld.feed import probe_kmsg_file, probe_kmsg_host_root

ALL = corpus.artifacts()


def source_of(a):
    return a.source.split("#")[0].rstrip("/")


def test_corpus_size_sources_and_keys():
    keys = [a.key for a in ALL]
    assert len(keys) == len(set(keys)), "artifact keys must be unique"
    assert all(isinstance(a, Artifact) for a in ALL)
    assert len({source_of(a) for a in ALL}) >= 50
    assert len(ALL) >= 80
    assert {a.channel for a in ALL} >= {"kmsg", "event", "pod_status", "node_condition",
                                        "node_status"}


def test_every_corpus_module_is_counted():
    """A corpus_*.py module added to the folder (another branch's) is found by name."""
    names = corpus.module_names()
    assert {"corpus_api", "corpus_kmsg_driver", "corpus_kmsg_xid", "corpus_kmsg_nvswitch",
            "corpus_node_conditions", "corpus_node_status"} <= set(names)
    assert len(ALL) == sum(len(__import__(f"tests.realworld.{n}", fromlist=["ARTIFACTS"])
                               .ARTIFACTS) for n in names)


# Healthy boots, quoted exactly: NVIDIA/open-gpu-kernel-modules#1064 (a laptop's boot lines
# before its problem), akash-network/support#244 (the driver banner and GPU lines of a node),
# NVIDIA/NVSentinel#155 (the open module's banner), NVIDIA/nvtrust#124 (NVSwitches probed at
# boot: the switch driver's own lines are not SXids).
HEALTHY = [
    Artifact("oss#1064-healthy-boot", "https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1064",
             "[    8.046867] nvidia-nvlink: Nvlink Core is being initialized, major device number 239\n"
             "[    8.060361] nvidia 0000:01:00.0: enabling device (0000 -> 0003)\n"
             "[    8.108512] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  595.58.03  Release Build  (nixbld@)  \n"
             "[    9.082486] nvidia-modeset: Loading NVIDIA UNIX Open Kernel Mode Setting Driver for x86_64  595.58.03  Release Build  (nixbld@)  \n"
             "[    9.165175] [drm] [nvidia-drm] [GPU ID 0x00000100] Loading driver",
             "kmsg", "healthy boot", "none", "gpu.xid", "info", "quiet-control"),
    Artifact("akash#244-healthy-banner", "https://github.com/akash-network/support/issues/244",
             "[Sun Jul 28 09:15:27 2024] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\n"
             "[Wed Jul 31 23:14:18 2024] NVRM: GPU at PCI:0000:00:05: GPU-efbdfde9-5798-a6e7-4c46-12518fa15375\n"
             "[Wed Jul 31 23:14:18 2024] NVRM: GPU Board Serial Number: 1650423013443",
             "kmsg", "healthy boot", "none", "gpu.xid", "info", "quiet-control"),
    Artifact("nvsentinel#155-banner", "https://github.com/NVIDIA/NVSentinel/issues/155",
             "[ 1843.439669] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release Build  (dvs-builder@U22-I3-B10-02-5)  Mon Jun  2 13:13:04 UTC 2025",
             "kmsg", "healthy banner", "none", "gpu.xid", "info", "quiet-control"),
    Artifact("nvtrust#124-nvswitch-probe", "https://github.com/NVIDIA/nvtrust/issues/124",
             "[   14.817960] nvidia-nvswitch0: using MSI\n"
             "[   19.857274] nvidia-nvswitch: Probing device 0000:02:00.0, Vendor Id = 0x10de, Device Id = 0x22a3, Class = 0x68000\n"
             "[   20.898856] nvidia-nvswitch1: using MSI",
             "kmsg", "healthy NVSwitch probe", "none", "nvswitch.sxid", "info", "quiet-control"),
]


@pytest.mark.parametrize("a", HEALTHY, ids=[a.key for a in HEALTHY])
@pytest.mark.parametrize("feed", [probe_kmsg_host_root, probe_kmsg_file])
def test_healthy_nvidia_boot_lines_stay_quiet(a, feed, tmp_path):
    found = feed(a, tmp_path)
    assert found == [], [(f.id, f.severity.value, f.title) for f in found]
