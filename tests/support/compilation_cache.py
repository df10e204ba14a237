"""Atomic writes for JAX's persistent compilation cache in the suite's processes.

JAX writes a cache entry in place (``jax._src.lru_cache.LRUCache.put``: ``Path.write_bytes``,
without a lock unless the cache evicts). Under ``pytest -n 2`` both workers share the suite's
cache (``conftest.py``), and when both compile one program at once, one may read the entry the
other is still writing: on 2026-12-01 a CI worker crashed (segmentation fault) deserializing
such an entry in ``compilation_cache.get_executable_and_time``. ``atomic_cache_writes`` makes
``put`` write a temporary file in the cache's folder and rename it into place, so that a reader
finds no entry or a whole one; it changes nothing else (an existing entry is kept, eviction
runs as before through JAX's own ``put``).
"""

from __future__ import annotations

import os
import tempfile


def atomic_cache_writes() -> bool:
    """Patch ``LRUCache.put`` (once per process); False where JAX's cache has another shape."""
    try:
        from jax._src import lru_cache
    except ImportError:
        return False
    cache = getattr(lru_cache, "LRUCache", None)
    suffix = getattr(lru_cache, "_CACHE_SUFFIX", None)
    if cache is None or suffix is None or getattr(cache.put, "atomic", False):
        return False
    original = cache.put

    def put(self, key: str, value: bytes) -> None:
        if not key or getattr(self, "eviction_enabled", True):
            return original(self, key, value)  # its checks, its lock and its eviction
        path = self.path / f"{key}{suffix}"
        if path.exists():
            return None
        handle, temporary = tempfile.mkstemp(dir=self.path, suffix=".partial")
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(value)
            os.replace(temporary, path)
        except BaseException:
            if os.path.exists(temporary):
                os.remove(temporary)
            raise
        return None

    put.atomic = True  # type: ignore[attr-defined]
    cache.put = put
    return True
