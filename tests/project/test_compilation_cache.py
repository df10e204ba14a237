"""The suite's persistent compilation cache is written atomically in its processes
(``conftest.atomic_cache_writes``): a reader finds no entry or a whole one."""

from __future__ import annotations

import os

from jax._src import lru_cache

from conftest import atomic_cache_writes


def test_the_suite_runs_with_atomic_cache_writes():
    assert getattr(lru_cache.LRUCache.put, "atomic", False)
    assert not atomic_cache_writes()  # once per process


def test_an_entry_is_renamed_into_place_whole_and_kept(tmp_path, monkeypatch):
    cache = lru_cache.LRUCache(str(tmp_path), max_size=-1)
    renamed = []

    def replace(source, target):
        assert os.path.getsize(source) == 3  # whole before it is visible
        renamed.append(target)
        return os.rename(source, target)

    monkeypatch.setattr(os, "replace", replace)
    cache.put("key", b"abc")
    cache.put("key", b"other")  # an existing entry is kept
    assert cache.get("key") == b"abc"
    assert len(renamed) == 1
    assert not list(tmp_path.glob("*.partial"))
