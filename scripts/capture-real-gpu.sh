#!/usr/bin/env bash
# capture-real-gpu.sh: record, on a real NVIDIA GPU machine, what our test stand-ins imitate
# (issue 29 item 5), into tests/data/real-gpu/<host>-<driver>/ with a README the tests can read.
#
# NOT YET RUN: no real GPU was available where this script was written (the lead has none
# either). Run it as root on a machine with an NVIDIA GPU and its driver loaded, from the repo
# root (its .venv built by scripts/setup.sh), then review the folder and commit it:
#
#   sudo bash scripts/capture-real-gpu.sh            # ~1-3 minutes
#
# What it records (each step has its own deadline; the whole run is bounded by TOTAL_S and
# every file by MAX_BYTES; nothing is written outside the output folder):
#   local.json          `kubectl gpu-doctor local -o json` (the probe with NVML, tracing off)
#   nvidia-smi-q.txt    `nvidia-smi -q` (ECC, row remapping, recovery action, persistence)
#   nvidia-smi-q-ecc.txt / -row-remapper.txt   the same, narrowed (-d ECC, -d ROW_REMAPPER)
#   proc-driver-nvidia/ /proc/driver/nvidia: version, params, gpus/*/information
#   devices.txt         /dev/nvidia* with their majors/minors, and /proc/devices' NVIDIA lines
#   symbols.txt         the libcuda.so.1 / libnvidia-ml.so.1 symbols our uprobes attach to
#                       (node_probe/tracing: cuInit, cuCtxCreate_v2..v4, cuMemAlloc_v2, ...,
#                       nvmlInit, nvmlInit_v2, nvmlInitWithFlags): present or not, and where
#   kmsg-nvrm.txt       the kernel log's NVRM / nvidia lines (dmesg), at most KMSG_LINES
#   Why is it slow (issue 38): what the gpu.slow check and the offline parsers read
#   nvidia-smi-q.xml    `nvidia-smi -q -x` (the XML the offline parser reads)
#   nvidia-smi-q-slow.txt  `nvidia-smi -q -d PCIE,CLOCK,PERFORMANCE,TEMPERATURE,POWER,UTILIZATION,
#                       PAGE_RETIREMENT` (link gen/width, clock event reasons, thresholds, limits)
#   nvidia-smi-nvlink.txt  `nvidia-smi nvlink -s` and `-e` (link state, error counters)
#   nvidia-smi-topo.txt `nvidia-smi topo -m` (NVLink/PCIe topology, NUMA affinity)
#   lspci-vvv.txt       `lspci -vvv -D` of the NVIDIA functions and every bridge above them
#                       (LnkCap/LnkSta, "(downgraded)", AER)
#   sysfs-pci.txt       /sys/bus/pci/devices/<bdf>/{current,max}_link_{speed,width}, numa_node
#                       and the real path (the bridges) of each GPU and bridge above it
#   nvml-slow.json      what the NVML child (node_probe/host/nvml_child.py) answers for the
#                       new queries on this driver: the records tests/fakes/fake_nvml.c imitates
#   Capture twice: once idle, once under load (start a GPU job first, then run with
#   SUFFIX=-busy): an idle GPU's link sits at Gen1 by design, so only the busy capture shows
#   the link the GPU trains to.
#   README.md           host kind, driver, GPUs, the commands run and their exit codes
#
# Secrets: no environment, no kubeconfig, no tokens are read. Serial numbers and UUIDs are
# hardware ids, not secrets, but the script masks board serial numbers (`Serial Number`) and the
# hostname (the folder is named after a hash of it) so a public commit names no machine.
set -u -o pipefail

TOTAL_S=${TOTAL_S:-240}
STEP_S=${STEP_S:-60}
MAX_BYTES=${MAX_BYTES:-4194304}       # 4 MiB per file
KMSG_LINES=${KMSG_LINES:-5000}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY="$REPO/.venv/bin/python"
[ -x "$PY" ] || PY=python3
START=$(date +%s)

die() { echo "capture-real-gpu: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "run as root (sudo): /dev/kmsg, /proc/driver/nvidia and NVML need it"
[ -r /proc/driver/nvidia/version ] || die "no NVIDIA driver loaded (/proc/driver/nvidia/version)"
command -v nvidia-smi >/dev/null || die "nvidia-smi not found"

driver=$(sed -n 's/.*Kernel Module[^0-9]*\([0-9][0-9.]*\).*/\1/p' /proc/driver/nvidia/version | head -1)
hosttag=$(hostname | sha256sum | cut -c1-8)
OUT="$REPO/tests/data/real-gpu/host${hosttag}-${driver:-unknown}"
mkdir -p "$OUT/proc-driver-nvidia" || die "cannot create $OUT"
RUNLOG="$OUT/.commands"
: > "$RUNLOG"

left() { echo $(( TOTAL_S - ($(date +%s) - START) )); }
mask() { sed -E 's/(Serial Number[^:]*: *)[0-9A-Za-z]+/\1<masked>/; s/(GPU Board Serial Number: *)[0-9A-Za-z]+/\1<masked>/'; }
# run NAME FILE CMD...: at most STEP_S (and what is left of TOTAL_S), output capped and masked
run() {
  local name=$1 file=$2; shift 2
  local t; t=$(left); [ "$t" -gt "$STEP_S" ] && t=$STEP_S
  if [ "$t" -le 0 ]; then echo "$name skipped (total deadline)" >> "$RUNLOG"; return; fi
  timeout -k 5 "$t" "$@" 2>&1 | head -c "$MAX_BYTES" | mask > "$OUT/$file"
  echo "$name exit=${PIPESTATUS[0]} file=$file" >> "$RUNLOG"
}

run local local.json "$PY" -m kubectl_gpudoctor local -o json --trace-seconds 0 --timeout 45s
run nvidia-smi-q nvidia-smi-q.txt nvidia-smi -q
run nvidia-smi-ecc nvidia-smi-q-ecc.txt nvidia-smi -q -d ECC
run nvidia-smi-remap nvidia-smi-q-row-remapper.txt nvidia-smi -q -d ROW_REMAPPER

for f in version params registry; do
  [ -r "/proc/driver/nvidia/$f" ] && head -c "$MAX_BYTES" "/proc/driver/nvidia/$f" | mask \
    > "$OUT/proc-driver-nvidia/$f"
done
for g in /proc/driver/nvidia/gpus/*/; do
  [ -d "$g" ] || continue
  bus=$(basename "$g")
  head -c 65536 "$g/information" 2>/dev/null | mask > "$OUT/proc-driver-nvidia/gpu-$bus-information"
done

{
  echo "# ls -l /dev/nvidia* (major, minor)"
  ls -l /dev/nvidia* /dev/nvidia-caps/* 2>&1
  echo "# /proc/devices (NVIDIA lines)"
  grep -i nvidia /proc/devices
} | head -c "$MAX_BYTES" > "$OUT/devices.txt"
echo "devices exit=0 file=devices.txt" >> "$RUNLOG"

# the symbols our uprobes attach to (node_probe/tracing/cuda_calls.py, nvml_calls.py)
SYMS="cuInit cuDeviceGet cuDeviceGetCount cuDevicePrimaryCtxRetain cuCtxCreate_v2 cuCtxCreate_v3
cuCtxCreate_v4 cuMemAlloc_v2 cuMemAllocAsync cuMemAllocHost_v2 cuMemAllocManaged cuMemCreate
nvmlInit nvmlInit_v2 nvmlInitWithFlags"
{
  for lib in libcuda.so.1 libnvidia-ml.so.1; do
    path=$(ldconfig -p 2>/dev/null | awk -v l="$lib" '$1 == l {print $NF; exit}')
    echo "# $lib -> ${path:-not found} ($(readlink -f "${path:-/nonexistent}" 2>/dev/null))"
    [ -n "$path" ] || continue
    dyn=$(timeout 20 nm -D --defined-only "$path" 2>/dev/null || timeout 20 readelf -Ws --dyn-syms "$path" 2>/dev/null)
    for s in $SYMS; do
      if echo "$dyn" | grep -qE "[[:space:]]$s(@@?[A-Za-z0-9_.]+)?$"; then echo "$s present"; fi
    done
  done
} | head -c "$MAX_BYTES" > "$OUT/symbols.txt"
echo "symbols exit=0 file=symbols.txt" >> "$RUNLOG"

# why is it slow (issue 38): the same questions the gpu.slow check and the offline parsers ask
SUFFIX=${SUFFIX:-}
run nvidia-smi-xml "nvidia-smi-q${SUFFIX}.xml" nvidia-smi -q -x
run nvidia-smi-slow "nvidia-smi-q-slow${SUFFIX}.txt" nvidia-smi -q -d \
  PCIE,CLOCK,PERFORMANCE,TEMPERATURE,POWER,UTILIZATION,PAGE_RETIREMENT
run nvidia-smi-nvlink "nvidia-smi-nvlink${SUFFIX}.txt" sh -c 'nvidia-smi nvlink -s; nvidia-smi nvlink -e'
run nvidia-smi-topo "nvidia-smi-topo${SUFFIX}.txt" nvidia-smi topo -m
gpus_bdf=$(for d in /sys/bus/pci/devices/*; do
  [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] && basename "$d"; done)
chain() {   # the bdf and every bridge above it (from the real sysfs path)
  readlink -f "/sys/bus/pci/devices/$1" | tr '/' '\n' | grep -E '^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$'
}
all_bdf=$(for b in $gpus_bdf; do chain "$b"; done | sort -u)
if command -v lspci >/dev/null; then
  run lspci "lspci-vvv${SUFFIX}.txt" sh -c "for b in $(echo $all_bdf); do lspci -vvv -D -s \$b; done"
fi
{
  for b in $all_bdf; do
    d=/sys/bus/pci/devices/$b
    echo "# $b -> $(readlink -f "$d")"
    for f in vendor device class current_link_speed current_link_width max_link_speed \
             max_link_width numa_node local_cpulist; do
      printf '%s: %s\n' "$f" "$(cat "$d/$f" 2>&1 | head -c 256)"
    done
  done
  for n in /sys/devices/system/node/node*/cpulist; do echo "# $n: $(cat "$n")"; done
} | head -c "$MAX_BYTES" > "$OUT/sysfs-pci${SUFFIX}.txt"
echo "sysfs-pci exit=0 file=sysfs-pci${SUFFIX}.txt" >> "$RUNLOG"
run nvml-slow "nvml-slow${SUFFIX}.json" "$PY" -c '
import json, sys
sys.path.insert(0, sys.argv[1])
import pynvml
from node_probe.host import nvml_child
pynvml.nvmlInit()
try:
    inv = nvml_child.inventory(pynvml)
finally:
    pynvml.nvmlShutdown()
keys = ("index", "name", "pci_bus_id", "pcie", "utilization_gpu_pct", "clocks", "temperature",
        "power", "nvlink", "ecc", "remapped_rows", "processes")
print(json.dumps({"driver_version": inv["driver_version"],
                  "gpus": [{k: g.get(k) for k in keys} for g in inv["gpus"]]}, indent=1))
' "$REPO"

run kmsg kmsg-nvrm.txt sh -c "dmesg 2>/dev/null | grep -E 'NVRM|nvidia' | tail -n $KMSG_LINES"

{
  echo "# Real GPU capture: host${hosttag}, driver ${driver:-unknown}"
  echo
  echo "Recorded by scripts/capture-real-gpu.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ) (UTC),"
  echo "kernel $(uname -r), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c | sed 's/^ *//' | paste -sd, -)."
  echo
  echo "Tests read these files as real output of the driver, NVML and the probe (see the"
  echo "script's header for what each file is). Commands and exit codes:"
  echo
  sed 's/^/- /' "$RUNLOG"
} > "$OUT/README.md"
rm -f "$RUNLOG"
echo "capture-real-gpu: wrote $OUT ($(du -sh "$OUT" | cut -f1)) in $(( $(date +%s) - START )) s"
