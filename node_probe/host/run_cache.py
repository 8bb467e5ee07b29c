"""The layout resolvers' per-run cache: one run asks each "where is it" question once.

Why a module of its own: the kubelet dir (kubelet_root_dir.py) is asked by the runtime
resolver and by every check through layout.py; one cache (keyed by host root, /proc and
override, each answer kept CACHE_TTL_S, at most MAX_CACHED) serves them all, and a long-lived
process (the agent's watch loop) asks again once an answer is older, since kubelets restart and
drivers get reinstalled.
"""
from __future__ import annotations

import threading
import time


# --- per-run cache -------------------------------------------------------------------------
# One run asks each question once; a long-lived process (a watch loop) asks again after
# CACHE_TTL_S, since kubelets restart and drivers get reinstalled.
CACHE_TTL_S = 30.0
MAX_CACHED = 64
_lock = threading.Lock()
_cache: dict[tuple, tuple[float, object]] = {}


def cached(key: tuple, fn):
    now = time.monotonic()
    with _lock:
        hit = _cache.get(key)
        if hit is not None and now - hit[0] < CACHE_TTL_S:
            return hit[1]
    val = fn()
    with _lock:
        if len(_cache) >= MAX_CACHED:
            _cache.clear()
        _cache[key] = (now, val)
        return val


def clear() -> None:
    """Forget every answer (a test that builds another host under the same root)."""
    with _lock:
        _cache.clear()
