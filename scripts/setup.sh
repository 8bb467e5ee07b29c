#!/usr/bin/env bash
# Idempotent setup for running the probe locally and for the test suite on Debian 12.
#   - Debian packages: BCC's Python module (python3-bpfcc), venv, gcc, kernel headers
#   - /lib/modules/$(uname -r)/{build,source} -> Debian headers when the kernel ships none
#   - tracefs/debugfs mounted (BCC attaches tracepoints through tracefs)
#   - .venv built from /usr/bin/python3 with --system-site-packages so `import bcc` works
# Safe to run again: every step checks first. Needs root for apt, mounts and symlinks.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${GPU_DOCTOR_VENV:-$ROOT/.venv}
log() { printf '[setup] %s\n' "$*" >&2; }

# apt-get that waits for another package manager instead of failing: on a fresh VM
# unattended-upgrades holds dpkg's lock for minutes ("E: Could not get lock
# /var/lib/dpkg/lock-frontend. It is held by process N (apt-get)", exit 100). dpkg's lock is
# waited for by apt itself (DPkg::Lock::Timeout); the lists and archives locks of `apt-get
# update` are retried here, every 5 s, within the same budget.
APT_LOCK_WAIT_S=${GPU_DOCTOR_APT_LOCK_WAIT:-600}
apt_get() {
  local end=$((SECONDS + APT_LOCK_WAIT_S)) out
  while :; do
    if out=$(apt-get -o DPkg::Lock::Timeout="$APT_LOCK_WAIT_S" "$@" 2>&1); then
      return 0
    fi
    if ! grep -q "Could not get lock" <<<"$out" || [ "$SECONDS" -ge "$end" ]; then
      printf '%s\n' "$out" >&2
      return 1
    fi
    log "waiting for another package manager to finish (apt/dpkg lock held)"
    sleep "${GPU_DOCTOR_APT_RETRY_S:-5}"
  done
}
# `GPU_DOCTOR_SETUP_LIB=1 . scripts/setup.sh`: only the functions above (for tests)
if [ -n "${GPU_DOCTOR_SETUP_LIB:-}" ]; then return 0 2>/dev/null || exit 0; fi

need_pkgs=()
pkgs=(python3-bpfcc python3-venv python3-pip gcc libc6-dev)
# the test suite also runs a real OCI registry (tests/packaging/test_release.py) and checks the
# alert rules with promtool (tests/prometheus/; Debian's prometheus package ships it)
[ -n "${GPU_DOCTOR_SETUP_TESTS:-}" ] && pkgs+=(docker-registry prometheus)
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_pkgs+=("$p")
done
KREL=$(uname -r)
have_headers() { [ -e "/lib/modules/$KREL/build/include/linux/kconfig.h" ] || [ -e "/lib/modules/$KREL/source/include/linux/kconfig.h" ] || [ -n "${BCC_KERNEL_SOURCE:-}" ]; }
if ! have_headers && ! ls -d /usr/src/linux-headers-*-amd64 >/dev/null 2>&1; then
  need_pkgs+=(linux-headers-amd64)
fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
  log "installing Debian packages: ${need_pkgs[*]}"
  if [ ! -f /var/lib/apt/periodic/gpu-doctor-updated ] || [ -z "$(ls -A /var/lib/apt/lists 2>/dev/null | grep -v lock)" ]; then
    apt_get update -qq && mkdir -p /var/lib/apt/periodic && touch /var/lib/apt/periodic/gpu-doctor-updated
  fi
  DEBIAN_FRONTEND=noninteractive apt_get install -y -qq --no-install-recommends "${need_pkgs[@]}"
fi

# Kernel headers for BCC: this kernel ships none; Debian splits them in -amd64 (build) and
# -common (source). Point the standard paths at the newest pair when nothing is there yet.
if ! have_headers; then
  arch_dir=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n1)
  common_dir=${arch_dir%-amd64}-common
  if [ -n "$arch_dir" ] && [ -d "$common_dir" ]; then
    log "linking /lib/modules/$KREL/{build,source} -> $arch_dir, $common_dir"
    mkdir -p "/lib/modules/$KREL"
    ln -sfn "$arch_dir" "/lib/modules/$KREL/build"
    ln -sfn "$common_dir" "/lib/modules/$KREL/source"
  else
    log "warning: no kernel headers found; eBPF probes will report probe.ebpf_unavailable"
  fi
fi

# tracefs / debugfs
if [ ! -e /sys/kernel/tracing/events ]; then
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || log "warning: cannot mount tracefs"
fi
if ! mountpoint -q /sys/kernel/debug 2>/dev/null; then
  mount -t debugfs nodev /sys/kernel/debug 2>/dev/null || true
fi

# Python environment
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV (system site packages, for bcc)"
  /usr/bin/python3 -m venv --system-site-packages "$VENV"
fi
stamp="$VENV/.gpu-doctor-installed"
want=$(cat pyproject.toml | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "installing the project and its test dependencies into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -e ".[test,mcp]" 2>&1 | grep -v "^WARNING: Location" >&2 || true
  "$VENV/bin/python" -c "import kubernetes, click, grpc, pynvml, tabulate, msgspec, pytest, xdist, mcp"
  echo "$want" > "$stamp"
fi
log "ready: $VENV"
