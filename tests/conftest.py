"""Which tests must run alone when the suite runs on several workers (scripts/test.sh).

Most of the suite is independent: each test has its own tmp dir, its own fake API server on its
own port, its own cgroups (named with the owning pid), its own processes. What is not:
  - eBPF tests (`bcc`): their trace windows see every process on the machine, and compiling
    programs under another worker's load stretches the window they must land in;
  - the packaging builds (`image`, and tests using the built plugin archive, the probe image or
    a wheel built in the checkout): they write into dist/, build/ and container storage;
  - tests marked `serial` by hand, which look at machine-wide state (a global temp dir glob,
    signal timing under load).
This hook marks all of them `serial`; scripts/test.sh runs `-m "not serial"` on three workers,
then `-m serial` alone. A plain `pytest` runs everything in one process, as before.
"""
from __future__ import annotations

import pytest

BUILDS_IN_THE_CHECKOUT = {"plugin_archive", "unpacked_plugin", "probe_image_archive"}
SERIAL_FILES = {"test_release.py", "test_wheel_pages.py", "test_krew_manifest.py"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if (item.get_closest_marker("bcc") or item.get_closest_marker("image")
                or BUILDS_IN_THE_CHECKOUT & set(getattr(item, "fixturenames", ()))
                or item.path.name in SERIAL_FILES):
            item.add_marker(pytest.mark.serial)
