#!/usr/bin/env bash
# Set up (idempotently) and run the whole test suite, as CI does.
#
# With no arguments: the tests that may share the machine run on GPU_DOCTOR_TEST_WORKERS
# workers (default 3 on this 2-core machine: most of these tests wait on child processes and
# sockets; whole files per worker), then the `serial` ones alone
# (eBPF, image and build tests: tests/conftest.py says which and why). Both phases always run;
# the exit code is the first failing phase's. GPU_DOCTOR_TEST_WORKERS=1 runs everything in one
# process. Extra args go to one plain pytest run, e.g. `scripts/test.sh -m "not image"` or
# `scripts/test.sh tests/core`.
set -euo pipefail
cd "$(dirname "$0")/.."
# Bytecode on, whatever the environment says: most tests start an interpreter or more (the CLI,
# the probe, helpers), and with PYTHONDONTWRITEBYTECODE set each one compiled the project's modules
# from source again (~0.1 s CPU a start: a third of a `kubectl gpu-doctor` run's CPU here), and
# each worker re-did pytest's assertion rewriting of every test module (collection 7.5 -> 2.7 s
# CPU). The .pyc files go to __pycache__/ beside the sources, which git and every build script
# ignore (build-wheel.sh, build-plugin.sh and build-image.sh exclude them).
unset PYTHONDONTWRITEBYTECODE
workers=${GPU_DOCTOR_TEST_WORKERS:-3}
case "$workers" in
  ''|*[!0-9]*) echo "scripts/test.sh: GPU_DOCTOR_TEST_WORKERS=$workers: want a whole number of workers" >&2; exit 2 ;;
esac
GPU_DOCTOR_SETUP_TESTS=1 bash scripts/setup.sh
PYTEST=(.venv/bin/python -m pytest -p no:cacheprovider)
if [ "$#" -gt 0 ] || [ "$workers" -le 1 ]; then
  exec "${PYTEST[@]}" "$@"
fi
# a short base dir: tests bind unix sockets under it (108-byte limit), and xdist adds a level
base=$(mktemp -d /tmp/gdt.XXXXXX)
prebuild=
trap '[ -z "$prebuild" ] || kill -- "-$prebuild" 2>/dev/null || true; rm -rf "$base"' EXIT
rc=0
# The krew archive that phase 2's build tests use (tests/packaging/conftest.py plugin_archive:
# a PyInstaller freeze, ~60 s of one core) is built meanwhile, niced: it takes the CPU the
# workers leave idle while they wait on their children and sockets, and the fixture then finds
# it up to date (build-plugin.sh skips a build whose inputs are unchanged). A failed build here
# is only logged: the fixture builds again and fails with the error.
if [ -x /usr/bin/python3 ]; then
  setsid nice -n 10 bash scripts/build-plugin.sh >"$base/prebuild.log" 2>&1 &   # its own group
  prebuild=$!
fi
echo "== phase 1: tests that may share the machine, on $workers workers"
"${PYTEST[@]}" -n "$workers" --dist loadfile --basetemp "$base/p" -m "not serial" || rc=$?
if [ -n "$prebuild" ]; then
  wait "$prebuild" || echo "scripts/test.sh: building the krew archive beside phase 1 failed" \
    "(phase 2 builds it again): $(tail -n 3 "$base/prebuild.log")" >&2
  prebuild=
fi
echo "== phase 2: tests that run alone (eBPF, image and build tests)"
"${PYTEST[@]}" --basetemp "$base/s" -m serial || { r=$?; [ "$rc" -ne 0 ] || rc=$r; }
exit "$rc"
