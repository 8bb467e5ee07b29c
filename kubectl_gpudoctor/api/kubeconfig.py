"""The kubeconfig, read as kubectl reads it ($KUBECONFIG's files merged, else ~/.kube/config,
else the in-cluster config), but bounded and checked before the kubernetes client sees it.

Why a module of its own: a kubeconfig is input a person hands the tool, and a wrong one must
be one line in kubectl's words (exit 3), never a traceback or a read without end: each file is
read up to MAX_KUBECONFIG_BYTES (a FIFO or /dev/zero included), its shape checked (the named
lists kubectl expects), and the client's ConfigException worded as kubectl words it. Kube
(kube.py) calls this once, when it is built.
"""
from __future__ import annotations

import os
import stat
from typing import Any, Mapping, Sequence

from .. import errors


# -- the kubeconfig: read as kubectl reads it, but bounded -----------------------------------

MAX_KUBECONFIG_BYTES = 4 << 20  # real ones (embedded certificates, many contexts) are KiBs
NO_CONFIG = ("invalid configuration: no configuration has been provided, try setting "
             "KUBECONFIG or passing --kubeconfig")


def kubeconfig_files(flag: str | None, environ: Mapping[str, str] | None = None
                     ) -> list[tuple[str, dict]]:
    """The kubeconfig files to load, as kubectl picks them: --kubeconfig (must exist), else
    every file of $KUBECONFIG that exists (colon-separated, missing ones skipped), else
    ~/.kube/config if it exists. Each is checked before the kubernetes client reads it: a
    regular file (a FIFO or /dev/zero would block or never end), at most
    MAX_KUBECONFIG_BYTES, YAML of the kubeconfig's shape (wrong types, or nesting deeper than
    Python's recursion, are one line, not a crash). [] means no kubeconfig at all (kubectl
    would then try localhost:8080); KubeconfigError for one that cannot be used. Returns
    (path, parsed document) of each file to load, in order."""
    env = os.environ if environ is None else environ
    if flag:
        paths, must_exist = [flag], True
    elif env.get("KUBECONFIG"):
        paths, must_exist = [p for p in env["KUBECONFIG"].split(os.pathsep) if p], False
    else:
        paths, must_exist = ["~/.kube/config"], False
    files = []
    for raw in paths:
        path = os.path.expanduser(raw)
        text = _read_kubeconfig(path, must_exist)
        if text is not None:
            files.append((path, check_kubeconfig(path, text)))
    return files


def _read_kubeconfig(path: str, must_exist: bool) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        if must_exist:
            raise errors.KubeconfigError(f"stat {path}: no such file or directory") from None
        return None
    except OSError as exc:
        raise errors.KubeconfigError(f"open {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise bad_file(path, "not a regular file")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_KUBECONFIG_BYTES:
                raise bad_file(path, f"larger than {MAX_KUBECONFIG_BYTES >> 20} MiB, not a "
                                     f"kubeconfig")
            chunks.append(chunk)
    except OSError as exc:
        raise errors.KubeconfigError(f"read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace")


_NAMED_LISTS = {"clusters": "cluster", "contexts": "context", "users": "user"}


def check_kubeconfig(path: str, text: str) -> dict:
    """KubeconfigError unless `text` is YAML of a kubeconfig's shape (what the kubernetes
    client indexes without checking: top-level mapping, named lists of mappings, strings)."""
    import yaml
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        what = getattr(exc, "problem", None) or str(exc)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise bad_file(path, f"yaml: {where}{' '.join(str(what).split())[:160]}") from None
    except RecursionError:
        raise bad_file(path, "nested too deeply") from None
    bad = _shape_problem(doc)
    if bad:
        raise bad_file(path, bad)
    return doc


def bad_file(path: str, why: str) -> errors.KubeconfigError:
    """kubectl's words for a kubeconfig it cannot use."""
    return errors.KubeconfigError(f'error loading config file "{path}": {why}')


def _shape_problem(doc: Any) -> str | None:
    if doc is None:
        return "the file is empty"
    if not isinstance(doc, dict):
        return f"expected a mapping at the top, got {type(doc).__name__}"
    cur = doc.get("current-context")
    if cur is not None and not isinstance(cur, str):
        return "current-context must be a string"
    for key, inner in _NAMED_LISTS.items():
        items = doc.get(key)
        if items is None:
            continue
        if not isinstance(items, list):
            return f"{key} must be a list"
        for i, item in enumerate(items):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                return f"{key}[{i}] must be a mapping with a string name"
            body = item.get(inner)
            if body is not None and not isinstance(body, dict):
                return f"{key}[{i}].{inner} must be a mapping"
            if body and any(not isinstance(k, str) for k in body):
                return f"{key}[{i}].{inner} has a key that is not a string"
    return None


def config_error(exc: BaseException, files: Sequence[str]) -> errors.KubeconfigError:
    """The kubernetes client's ConfigException in kubectl's words."""
    text = " ".join(str(exc).split())
    if "current-context" in text:
        return errors.KubeconfigError(
            "current-context is not set (pass --context or run `kubectl config use-context`)")
    text = text.replace("Invalid kube-config file. ", "").replace("Invalid kube-config. ", "")
    return bad_file(":".join(files), text[:200] or type(exc).__name__)


def context_namespace(kconfig, kubeconfig: str | None, context: str | None) -> str:
    """The namespace of the kubeconfig context in use (kubectl's default for -n)."""
    try:
        contexts, active = kconfig.list_kube_config_contexts(config_file=kubeconfig)
        ctx = next((c for c in contexts if c.get("name") == context), None) if context else active
        ns = ((ctx or {}).get("context") or {}).get("namespace")
        return str(ns) if ns else "default"
    except Exception:  # noqa: BLE001 - in-cluster config or no contexts: kubectl's default
        return "default"
