"""The suite's compilation caches: the persistent one is written atomically in its processes
(``conftest.atomic_cache_writes``: a reader finds no entry or a whole one), and the programs a
test file compiled are released after it (``conftest.release_compiled_programs``)."""

from __future__ import annotations

import os

import pytest
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


def test_compiled_programs_are_released_with_the_caches():
    # Programs of 24 shapes of one jitted function hold memory mappings until the suite's
    # per-file release drops them (conftest.release_compiled_programs).
    import jax
    import jax.numpy as jnp

    from conftest import memory_mappings, release_compiled_programs

    if memory_mappings() is None:
        pytest.skip("this system has no /proc/self/maps")

    @jax.jit
    def program(x):
        return jnp.tanh(x @ x.T).sum(0)

    release_compiled_programs()
    before = memory_mappings()
    for size in range(8, 32):
        program(jnp.ones((size, 4))).block_until_ready()
    assert program._cache_size() == 24
    held = memory_mappings()
    assert held >= before + 24  # at least one mapping per loaded program
    after = release_compiled_programs()
    assert program._cache_size() == 0
    assert held - after >= 24  # and they are given back
