"""What an evidence bundle keeps: an allow-list of fields per recorded object, and a scrubber for
the free text those fields still carry. Linear and bounded on any input.

Why an allow-list: a deny-list of secret patterns misses every shape nobody thought of (an
annotation `db-conn: postgres://u:pw@h`, a JSON password inside an event message). A bundle keeps
the fields the verdicts read and a person needs to check them (names, owners, node, resources,
phases, states and reasons, conditions, events' reasons and messages, the kubelet settings the
analysis reads), and nothing else: no env values, no volumes, no unknown annotations' values, no
managedFields. What free text remains (messages, titles, command lines, labels, kept
annotations, node records' evidence) is capped and scrubbed of credential shapes.

Why linear: a tenant controls annotations, event messages, container args; a 200 KiB one must
not make `--save` spin (a regular expression with `[\\w.-]*` before a keyword was quadratic on
long runs of word characters, minutes in C with Ctrl-C ignored). Every string is cut to a bound
first; each pass below starts a match only where a token starts and bounds every repetition.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

REDACTED = "<redacted>"
MAX_TEXT = 16 * 1024          # one kept string (a message, a title, a label value)
MAX_BIG_TEXT = 64 * 1024      # the goroutine excerpt and healthz text
MAX_DEPTH = 24                # node evidence is a few levels deep
MAX_ITEMS = 2000              # items of one list kept from node evidence
# annotation values kept (scrubbed): the ones analyses read; any other key keeps its name only
ANNOTATION_PREFIXES = ("hami.io/", "nvidia.com/", "gpu-doctor/", "gpu-doctor.io/")
_KEYWORDS = (r"passw(?:or)?d|passwd|pwd|secret|token|api[_-]?key|apikey|access[_-]?key|"
             r"private[_-]?key|client[_-]?key|key[_-]?data|credential|auth|jwt|session|"
             r"cookie|signature")
# key = value / key: value / "key": "value" (the key starts where a token starts)
_KEY_VALUE = re.compile(
    r"(?i)(?<![\w.-])([\w.-]{0,48}?(?:" + _KEYWORDS + r")[\w.-]{0,48}[\"']?\s{0,4}[:=]\s{0,4})"
    r"(\"[^\"\n]{0,1024}\"?|'[^'\n]{0,1024}'?|[^\s,;&\"'}\])]{1,1024})")
# --db-password VALUE (a flag naming a secret, then its value as the next word)
_FLAG_VALUE = re.compile(
    r"(?i)(?<![\w.-])(--?[\w.-]{0,48}?(?:" + _KEYWORDS + r")[\w.-]{0,48}\s{1,4})"
    r"([^\s-][^\s]{0,1024})")
_BEARER = re.compile(r"(?i)(?<![\w-])(?:bearer|basic)\s{1,8}[A-Za-z0-9._~+/=-]{8,1024}")
_JWT = re.compile(r"(?<![\w-])eyJ[\w-]{2,4096}\.[\w-]{2,4096}\.[\w-]{0,4096}")
_AWS_KEY_ID = re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Za-z0-9])")
_URL_PASSWORD = re.compile(r"(?i)(?<![\w+.-])([a-z][a-z0-9+.-]{0,20}://[^\s:/@]{0,128}:)"
                           r"[^\s/@]{1,256}(?=@)")
_PEM_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY-----")
_PEM_END = "-----END "
_SECRET_FLAG = re.compile(r"(?i)^--?[\w.-]{0,48}(?:" + _KEYWORDS + r")[\w.-]{0,48}$")
_SECRET_NAME = re.compile(r"(?i)(?:" + _KEYWORDS + r")")
# mysql's -pPASSWORD as a word of a shell command string (`sh -c "mysql -pX -h db"`)
_SHORT_P = re.compile(r"(?<![^\s;&|(`'\"])-p(?:\"[^\"\n]{0,1024}\"?|'[^'\n]{0,1024}'?|"
                      r"[^\s;&|)`'\"-][^\s;&|)`'\"]{0,1023})")


# -- text -------------------------------------------------------------------------------------

def cap(text: str, limit: int = MAX_TEXT) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"... ({len(text) - limit} more characters not kept)"


def scrub(text: str, limit: int = MAX_TEXT) -> str:
    """`text` cut to `limit` and scrubbed of credential shapes: PEM private keys, JWTs, AWS
    access key ids, bearer/basic credentials, passwords in URLs, values of secret-named keys
    and flags (key=v, key: v, "key": "v", --flag v). Linear in len(text)."""
    text = _pem(cap(text, limit))
    text = _BEARER.sub(REDACTED, text)
    text = _JWT.sub(REDACTED, text)
    text = _AWS_KEY_ID.sub(REDACTED, text)
    text = _URL_PASSWORD.sub(lambda m: m.group(1) + REDACTED, text)
    text = _KEY_VALUE.sub(lambda m: m.group(1) + _quoted(m.group(2)), text)
    return _FLAG_VALUE.sub(lambda m: m.group(1) + REDACTED, text)


def _quoted(value: str) -> str:
    q = value[:1] if value[:1] in "\"'" else ""
    return f"{q}{REDACTED}{q if value.endswith(q) and len(value) > 1 else ''}"


def _pem(text: str) -> str:
    out, pos = [], 0
    for m in _PEM_BEGIN.finditer(text):
        if m.start() < pos:
            continue
        out.append(text[pos:m.start()] + "<redacted private key>")
        end = text.find(_PEM_END, m.end())
        if end < 0:
            return "".join(out)
        close = text.find("-----", end + len(_PEM_END))
        pos = len(text) if close < 0 else close + 5
    out.append(text[pos:])
    return "".join(out)


def scrub_command(text: str, limit: int = MAX_TEXT) -> str:
    """A word of a command line that may be a whole shell command (`sh -c "..."`): scrub()
    and mysql's `-pPASSWORD` (bare or quoted) where a word starts (round-3 S-13). Linear in
    len(text). Also hides `-pthread`: a short flag glued to its value is the password form."""
    return _SHORT_P.sub(lambda m: "-p" + _quoted(m.group()[2:]), scrub(text, limit))


def scrub_argv(argv: Sequence[Any]) -> list[str]:
    """A command line: the value after a secret-named flag, `--flag=value` of one, a short
    `-pVALUE` (mysql's password form, also inside a `sh -c` string) and any credential shape
    in a word are redacted."""
    out: list[str] = []
    hide_next = False
    for a in list(argv)[:MAX_ITEMS]:
        a = cap(str(a), 4096)
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, _ = a.partition("=")
        if _SECRET_FLAG.match(flag):
            if eq:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(a)
                hide_next = True
            continue
        if len(a) > 2 and a.startswith("-p") and not a.startswith("--"):
            out.append("-p" + REDACTED)
            continue
        out.append(scrub_command(a))
    return out


# -- structure --------------------------------------------------------------------------------
# A shape: TEXT (a string, scrubbed), KEEP (any value; strings in it scrubbed), a dict of
# field -> shape (fields not named are dropped), [shape] (each item), or a function.

TEXT = "text"
KEEP = "keep"


def keep(value: Any, shape: Any, depth: int = 0) -> Any:
    """`value` reduced to `shape` (see above). Non-matching types are dropped (None)."""
    if depth > MAX_DEPTH:
        return "<nested too deep: not kept>"
    if callable(shape):
        return shape(value)
    if shape == TEXT:
        return scrub(value) if isinstance(value, str) else _scalar(value)
    if shape == KEEP:
        return _any(value, depth)
    if isinstance(shape, list):
        if not isinstance(value, list):
            return None
        return [keep(v, shape[0], depth + 1) for v in value[:MAX_ITEMS]]
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return None
        return {k: keep(value[k], s, depth + 1) for k, s in shape.items() if k in value}
    raise TypeError(shape)  # pragma: no cover - shapes are written below


def _scalar(v: Any) -> Any:
    return v if v is None or isinstance(v, (bool, int, float)) else None


def _any(value: Any, depth: int = 0) -> Any:
    """Any JSON value, strings scrubbed, bounded in depth and list length."""
    if depth > MAX_DEPTH:
        return "<nested too deep: not kept>"
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, list):
        return [_any(v, depth + 1) for v in value[:MAX_ITEMS]]
    if isinstance(value, dict):
        return {cap(str(k), 256): _any(v, depth + 1) for k, v in list(value.items())[:MAX_ITEMS]}
    return _scalar(value)


def _labels(value: Any) -> Any:
    """Label values scrubbed; the value of a key that names a secret (`api-token`) is not
    kept at all: a label value has no syntax that scrub() could recognise (round-3 S-13)."""
    if not isinstance(value, dict):
        return None
    out = {}
    for k, v in list(value.items())[:MAX_ITEMS]:
        k = cap(str(k), 320)
        out[k] = None if not isinstance(v, str) else \
            REDACTED if _SECRET_NAME.search(k) else scrub(v, 1024)
    return out


def _annotations(value: Any) -> Any:
    """Values of the annotations analyses read (scrubbed); of any other key only the name and
    the size: its value may be anything (last-applied-configuration, a connection string)."""
    if not isinstance(value, dict):
        return None
    out = {}
    for k, v in list(value.items())[:MAX_ITEMS]:
        k = cap(str(k), 320)
        if k.startswith(ANNOTATION_PREFIXES) and isinstance(v, str):
            out[k] = scrub(v, 4096)
        else:
            out[k] = f"{REDACTED} ({len(v) if isinstance(v, str) else 0} characters)"
    return out


def _env(value: Any) -> Any:
    """Container env: names stay, values (and where they come from) go."""
    if not isinstance(value, list):
        return None
    return [{"name": cap(str(e.get("name")), 256),
             **({"value": REDACTED} if "value" in e or "valueFrom" in e else {})}
            if isinstance(e, dict) else REDACTED for e in value[:MAX_ITEMS]]


def _argv(value: Any) -> Any:
    return scrub_argv(value) if isinstance(value, list) else None


META = {"name": TEXT, "namespace": TEXT, "uid": TEXT, "creationTimestamp": TEXT,
        "deletionTimestamp": TEXT, "generateName": TEXT, "labels": _labels,
        "annotations": _annotations,
        "ownerReferences": [{"apiVersion": TEXT, "kind": TEXT, "name": TEXT, "uid": TEXT,
                             "controller": TEXT}]}
CONTAINER = {"name": TEXT, "image": TEXT, "imagePullPolicy": TEXT, "command": _argv,
             "args": _argv, "env": _env, "resources": KEEP, "securityContext": KEEP,
             "restartPolicy": TEXT}
STATE = {"waiting": {"reason": TEXT, "message": TEXT},
         "running": {"startedAt": TEXT},
         "terminated": {"exitCode": TEXT, "signal": TEXT, "reason": TEXT, "message": TEXT,
                        "startedAt": TEXT, "finishedAt": TEXT, "containerID": TEXT}}
CONTAINER_STATUS = {"name": TEXT, "containerID": TEXT, "image": TEXT, "imageID": TEXT,
                    "ready": TEXT, "started": TEXT, "restartCount": TEXT, "state": STATE,
                    "lastState": STATE, "allocatedResources": KEEP,
                    "allocatedResourcesStatus": KEEP, "resources": KEEP}
CONDITION = {"type": TEXT, "status": TEXT, "reason": TEXT, "message": TEXT,
             "lastTransitionTime": TEXT, "lastHeartbeatTime": TEXT, "lastProbeTime": TEXT}
POD = {"kind": TEXT, "apiVersion": TEXT, "metadata": META,
       "spec": {"nodeName": TEXT, "schedulerName": TEXT, "priority": TEXT,
                "priorityClassName": TEXT, "runtimeClassName": TEXT, "restartPolicy": TEXT,
                "nodeSelector": _labels, "tolerations": KEEP, "affinity": KEEP,
                "containers": [CONTAINER], "initContainers": [CONTAINER],
                "resourceClaims": KEEP, "overhead": KEEP, "hostPID": TEXT,
                "hostNetwork": TEXT, "activeDeadlineSeconds": TEXT},
       "status": {"phase": TEXT, "reason": TEXT, "message": TEXT, "qosClass": TEXT,
                  "startTime": TEXT, "nominatedNodeName": TEXT, "conditions": [CONDITION],
                  "containerStatuses": [CONTAINER_STATUS],
                  "initContainerStatuses": [CONTAINER_STATUS],
                  "resourceClaimStatuses": KEEP}}
NODE = {"kind": TEXT, "apiVersion": TEXT, "metadata": META,
        "spec": {"unschedulable": TEXT, "taints": KEEP, "providerID": TEXT},
        "status": {"capacity": KEEP, "allocatable": KEEP, "conditions": [CONDITION],
                   "nodeInfo": KEEP}}
EVENT = {"kind": TEXT, "apiVersion": TEXT, "metadata": META,
         "involvedObject": {"kind": TEXT, "name": TEXT, "namespace": TEXT, "uid": TEXT,
                            "fieldPath": TEXT},
         "reason": TEXT, "message": TEXT, "type": TEXT, "count": TEXT,
         "firstTimestamp": TEXT, "lastTimestamp": TEXT, "eventTime": TEXT,
         "source": {"component": TEXT, "host": TEXT}, "reportingComponent": TEXT,
         "reportingInstance": TEXT, "series": KEEP}
LEASE = {"kind": TEXT, "apiVersion": TEXT, "metadata": META,
         "spec": {"holderIdentity": TEXT, "leaseDurationSeconds": TEXT, "renewTime": TEXT,
                  "acquireTime": TEXT}}


def _configz(value: Any) -> Any:
    """The kubelet settings the analysis reads (analysis/kubelet_config.KEYS), nothing else
    (the config also holds staticPodURLHeader, TLS and authentication settings)."""
    from ..analysis.resources import kubelet_config
    if not isinstance(value, dict):
        return None
    wrap = "kubeletconfig" if "kubeletconfig" in value else \
        "componentconfig" if "componentconfig" in value else None
    cfg = value.get(wrap) if wrap else value
    kept = keep(cfg, {k: KEEP for k in kubelet_config.KEYS})
    return {wrap: kept} if wrap else kept


# evidence kind (bundle._KINDS) -> the shape of its object or of each item of its list
SHAPES: dict[str, Any] = {"node": NODE, "nodes": NODE, "pod": POD, "pods": POD,
                          "events": EVENT, "lease": LEASE, "leases": LEASE,
                          "kubelet_configz": _configz}

# records: the report's findings and checks, and the node probe's records
FINDING = {"schema": TEXT, "kind": TEXT, "id": TEXT, "severity": TEXT, "subject": TEXT,
           "title": TEXT, "evidence": KEEP, "remediation": TEXT, "refs": [TEXT],
           "check": TEXT, "ts": TEXT, "_node": TEXT}
CHECK = {"id": TEXT, "status": TEXT, "duration_s": TEXT, "message": TEXT, "reason": TEXT}
RECORD_SHAPES: dict[str, Any] = {
    "finding": FINDING,
    "summary": {"schema": TEXT, "kind": TEXT, "complete": TEXT, "critical": TEXT,
                "warning": TEXT, "info": TEXT, "exit_code": TEXT, "duration_s": TEXT,
                "checks": [CHECK], "incomplete_reason": TEXT, "target": KEEP, "ts": TEXT,
                "version": TEXT, "_node": TEXT},
    "log": {"schema": TEXT, "kind": TEXT, "level": TEXT, "message": TEXT, "ts": TEXT,
            "_node": TEXT},
    "event": {"schema": TEXT, "kind": TEXT, "name": TEXT, "subject": TEXT, "message": TEXT,
              "data": KEEP, "ts": TEXT, "_node": TEXT},
    "progress": {"schema": TEXT, "kind": TEXT, "message": TEXT, "phase": TEXT, "check": TEXT,
                 "status": TEXT, "ts": TEXT, "_node": TEXT},
}


def keep_object(kind: str, obj: Any) -> Any:
    shape = SHAPES.get(kind)
    return keep(obj, shape) if shape is not None else None


def keep_record(rec: Any) -> Any:
    """A probe record as the bundle keeps it (an unknown kind keeps its kind only)."""
    if not isinstance(rec, dict):
        return None
    shape = RECORD_SHAPES.get(rec.get("kind"))
    return keep(rec, shape) if shape is not None else {"kind": scrub(str(rec.get("kind")), 64)}


def keep_findings(findings: Sequence[Mapping[str, Any]]) -> list:
    return [keep(f, FINDING) for f in findings]


def keep_checks(checks: Sequence[Mapping[str, Any]]) -> list:
    return [keep(c, CHECK) for c in checks]

