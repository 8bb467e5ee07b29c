#!/usr/bin/env bash
# Set up (idempotently) and run the whole test suite, as CI does. Extra args go to pytest,
# e.g. `scripts/test.sh -m "not image"` or `scripts/test.sh tests/core`.
set -euo pipefail
cd "$(dirname "$0")/.."
GPU_DOCTOR_SETUP_TESTS=1 bash scripts/setup.sh
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
