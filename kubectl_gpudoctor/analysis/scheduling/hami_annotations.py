"""HAMi's annotations, decoded: the devices its device plugin registered on the node, the
scheduler's and the plugin's handshake, the node lock, and the devices written on each pod.

Why a module of its own: HAMi's scheduler extender and device plugin talk only through these
annotations, and each has had several encodings across HAMi releases (a colon-separated list of
7 or 9 fields, or JSON; three time formats in the handshake). Reading them exactly as HAMi's Go
code does (strconv, time.String, RFC 3339) is one job; judging what they say is hami.py's.

Pure functions over annotation strings; no I/O. Malformed text raises DecodeError.
"""
from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any, Mapping


REGISTER_KEY = "hami.io/node-nvidia-register"
HANDSHAKE_PREFIX = "hami.io/node-handshake"
LOCK_KEY = "hami.io/mutex.lock"
TO_ALLOCATE_KEY = "hami.io/vgpu-devices-to-allocate"
ALLOCATED_KEY = "hami.io/vgpu-devices-allocated"
BIND_PHASE_KEY = "hami.io/bind-phase"
BIND_TIME_KEY = "hami.io/bind-time"
ASSIGNED_NODE_KEY = "hami.io/vgpu-node"

UUID_RE = re.compile(r"^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                     r"[0-9a-fA-F]{12}$")
HANDSHAKE_RE = re.compile(r"^\s*(Reported|Requesting|Deleted)[ _](.*)$", re.S)
GO_TIME_RE = re.compile(r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:\.(\d+))?"
                        r"(?: ([+-]\d{4}))?(?: \S+)?(?: m=[+-][\d.]+)?\s*$")

_BOOL_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_BOOL_FALSE = {"0", "f", "F", "FALSE", "false", "False"}


class DecodeError(ValueError):
    pass


# -- decoding -------------------------------------------------------------------------------

def _go_bool(text: str) -> bool:
    if text in _BOOL_TRUE:
        return True
    if text in _BOOL_FALSE:
        return False
    raise DecodeError(f"invalid health field {text!r}")


_GO_INT = re.compile(r"[+-]?[0-9]{1,19}")
_INT64 = 2 ** 63


def go_int(text: str, what: str) -> int:
    """strconv.Atoi on 64-bit: ASCII digits with an optional sign, in int64 range (Python's
    int() would also take `1_000`, ` 5` and non-ASCII digits, which HAMi rejects)."""
    if _GO_INT.fullmatch(text) and -_INT64 <= int(text) < _INT64:
        return int(text)
    raise DecodeError(f"invalid {what} field {text[:40]!r}")


def decode_register(value: str) -> tuple[list[dict], str]:
    """Devices in `hami.io/node-nvidia-register` and the encoding found ("json", "legacy-7",
    "legacy-9"). Raises DecodeError where HAMi's own decoder would reject the annotation."""
    text = (value or "").strip()
    if text.startswith("["):
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DecodeError(f"invalid JSON: {exc.msg} at char {exc.pos}") from None
        except (ValueError, RecursionError) as exc:   # a 5,000-digit number, 100,000 `[`s
            raise DecodeError(f"invalid JSON: {str(exc)[:80]}") from None
        if not isinstance(raw, list) or not all(isinstance(d, dict) for d in raw):
            raise DecodeError("JSON is not a list of device objects")
        out = []
        for d in raw:
            try:
                out.append({
                    "id": str(d.get("id", "")), "index": int(d.get("index") or 0),
                    "count": int(d.get("count") or 0), "devmem": int(d.get("devmem") or 0),
                    "devcore": int(d.get("devcore") or 0), "type": str(d.get("type", "")),
                    "numa": int(d.get("numa") or 0), "mode": str(d.get("mode") or ""),
                    # Go omitempty drops `health: false`, so a missing key means unhealthy
                    "health": bool(d.get("health", False)),
                })
            except (TypeError, ValueError, OverflowError):   # OverflowError: 1e400 is inf
                raise DecodeError(f"device object with non-numeric fields: {d!r}"[:200]) from None
        return out, "json"
    if ":" not in text:
        raise DecodeError("neither a JSON list nor the `uuid,count,mem,cores,type,numa,health:` "
                          "list (no ':' separator)")
    out = []
    widths = set()
    for seg in text.split(":"):
        if not seg.strip():
            continue
        items = seg.split(",")
        if len(items) not in (7, 9):
            raise DecodeError(f"segment with {len(items)} fields (want 7 or 9): {seg!r}"[:200])
        widths.add(len(items))
        dev = {"id": items[0], "count": go_int(items[1], "count"),
               "devmem": go_int(items[2], "memory"), "devcore": go_int(items[3], "core"),
               "type": items[4], "numa": go_int(items[5], "numa"),
               "health": _go_bool(items[6]), "index": 0, "mode": "hami-core"}
        if len(items) == 9:
            dev["index"] = go_int(items[7], "index")
            if dev["index"] < 0:
                raise DecodeError(f"negative index {items[7]!r}")
            dev["mode"] = items[8]
        out.append(dev)
    enc = "legacy-9" if widths == {9} else "legacy-7" if widths == {7} else "legacy-mixed"
    return out, enc


def validate_device(d: Mapping[str, Any]) -> list[str]:
    """What makes a registered device unusable for the scheduler (health is reported apart)."""
    problems = []
    if not UUID_RE.match(str(d.get("id", ""))):
        problems.append(f"id {d.get('id')!r} is not a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
    if int(d.get("count", 0)) <= 0:
        problems.append(f"count {d.get('count')} <= 0 (no vGPU slots: deviceSplitCount?)")
    if int(d.get("devmem", 0)) <= 0:
        problems.append(f"devmem {d.get('devmem')} MiB <= 0 (NVML memory query failed? set "
                        "preConfiguredDeviceMemory on unified-memory GPUs)")
    if int(d.get("devcore", 0)) < 0:
        problems.append(f"devcore {d.get('devcore')} < 0")
    typ = str(d.get("type", ""))
    if not typ:
        problems.append("type is empty")
    elif not typ.upper().startswith("NVIDIA"):
        problems.append(f"type {typ!r} does not start with NVIDIA (scheduler type filters "
                        "will not match)")
    return problems


def parse_go_time(text: str) -> dt.datetime | None:
    """Go's time.Time.String(): `2024-01-23 04:30:04.434037031 +0000 UTC m=+1104711.77`."""
    m = GO_TIME_RE.match(text.strip())
    if not m:
        return None
    base, frac, off = m.group(1), m.group(2) or "0", m.group(3) or "+0000"
    try:
        t = dt.datetime.strptime(base, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    t = t.replace(microsecond=int(frac[:6].ljust(6, "0")))
    sign = 1 if off[0] == "+" else -1
    tz = dt.timezone(sign * dt.timedelta(hours=int(off[1:3]), minutes=int(off[3:5])))
    return t.replace(tzinfo=tz)


def parse_scheduler_time(text: str) -> dt.datetime | None:
    """`2006.01.02 15:04:05` (HAMi <= 2.5) or `2006-01-02 15:04:05` (time.DateTime). Go's
    time.Parse without a zone means UTC, which is how HAMi reads it back."""
    for fmt in ("%Y.%m.%d %H:%M:%S", "%Y-%m-%d %H:%M:%S"):
        try:
            return dt.datetime.strptime(text.strip(), fmt).replace(tzinfo=dt.timezone.utc)
        except ValueError:
            continue
    return None


def parse_handshake(value: str) -> tuple[str, dt.datetime | None]:
    """(state, time): state is Reported, Requesting, Deleted or "unknown"."""
    m = HANDSHAKE_RE.match(value or "")
    if not m:
        return "unknown", None
    state, rest = m.group(1), m.group(2)
    t = parse_go_time(rest) if state == "Reported" else None
    return state, t or parse_scheduler_time(rest) or parse_go_time(rest)


def parse_rfc3339(text: str) -> dt.datetime | None:
    s = (text or "").strip()
    if not re.match(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$", s):
        return None
    s = s.replace("Z", "+00:00")
    head, _, tail = s.partition(".")
    if tail:  # Python < 3.11 wants at most 6 fractional digits
        digits = re.match(r"\d+", tail).group(0)
        s = f"{head}.{digits[:6]}{tail[len(digits):]}"
    try:
        return dt.datetime.fromisoformat(s)
    except ValueError:
        return None


def parse_lock(value: str) -> tuple[dt.datetime, str, str]:
    """(lock time, namespace, pod) of `hami.io/mutex.lock`; ("", "") owner for the old format.
    Raises DecodeError where HAMi's ParseNodeLock fails (then every bind on the node errors)."""
    text = (value or "").strip()
    if "," not in text:
        t = parse_rfc3339(text)
        if t is None:
            raise DecodeError(f"lock time {text!r} is not RFC 3339")
        return t, "", ""
    parts = text.split(",")
    if len(parts) != 3:
        raise DecodeError(f"expected `time,namespace,pod`, got {len(parts)} parts")
    t = parse_rfc3339(parts[0])
    if t is None:
        raise DecodeError(f"lock time {parts[0]!r} is not RFC 3339")
    return t, parts[1], parts[2]


def decode_pod_devices(value: str) -> list[list[dict]]:
    """`uuid,type,mem,cores:uuid,...:;...` -> per container, its devices (`;` between
    containers, `:` between devices)."""
    out: list[list[dict]] = []
    for ctr in (value or "").split(";"):
        devs = []
        for seg in ctr.split(":"):
            if "," not in seg:
                continue
            items = seg.split(",")
            if len(items) < 4:
                raise DecodeError(f"device {seg!r} has {len(items)} fields (want >= 4)")
            devs.append({"uuid": items[0], "type": items[1],
                         "usedmem": go_int(items[2], "memory"), "usedcores": go_int(items[3], "cores")})
        out.append(devs)
    while out and not out[-1]:
        out.pop()
    return out


def parse_bind_time(value: str) -> dt.datetime | None:
    text = (value or "").strip()
    if text.isdigit():
        try:
            return dt.datetime.fromtimestamp(int(text), tz=dt.timezone.utc)
        except (OverflowError, OSError, ValueError):  # out of range: as unreadable as garbage
            return None
    return parse_scheduler_time(text)
