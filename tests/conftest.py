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

The pager's memory bound (kubectl_gpudoctor/api/pager.py, MAX_RSS_BYTES) is on the resident
memory of the process that reads the lists: the CLI's, which starts with nothing else. A test
that pages in-process (test_agent_fleet_paging.py, test_fleet_pageparse.py, ...) runs inside a
pytest worker that already holds every test module and what the files it ran before left
behind (a worker reached 436 MiB and a 2,500-pod list was refused as over 432 MiB). So for each
test the bound counts from the worker's resident memory at the test's start, as it counts
from the CLI's; the CLI's own runs (subprocesses, e.g. test_hostile_api.py) keep the bound as
it is.

Ctrl-C as a user's terminal sends it: a suite started as a background job of a non-interactive
shell (`scripts/test.sh &` in a script) inherits SIGINT ignored (POSIX: such a job ignores
SIGINT and SIGQUIT), and so do the workers and every CLI they start; a Python that starts with
SIGINT ignored never raises KeyboardInterrupt, and the four tests that press Ctrl-C at a CLI
failed (the CLI ran on to exit 3 or 4, or never ended). So the suite's processes take SIGINT
back (their children start with the default action and Python's own handler), whoever started
them.
"""
from __future__ import annotations

import signal
import sys

import pytest

BUILDS_IN_THE_CHECKOUT = {"plugin_archive", "unpacked_plugin", "probe_image_archive"}
SERIAL_FILES = {"test_release.py", "test_wheel_pages.py", "test_krew_manifest.py"}


def pytest_configure(config):
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if (item.get_closest_marker("bcc") or item.get_closest_marker("image")
                or BUILDS_IN_THE_CHECKOUT & set(getattr(item, "fixturenames", ()))
                or item.path.name in SERIAL_FILES):
            item.add_marker(pytest.mark.serial)


@pytest.fixture(autouse=True)
def _pager_bound_counts_from_here():
    pager = sys.modules.get("kubectl_gpudoctor.api.pager")  # imported by a test module, if any
    if pager is None or not hasattr(pager, "MAX_RSS_BYTES"):
        yield
        return
    bound = pager.MAX_RSS_BYTES
    pager.MAX_RSS_BYTES = bound + (pager.resident_bytes() or 0)
    try:
        yield
    finally:
        pager.MAX_RSS_BYTES = bound
