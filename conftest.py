"""Shared pytest configuration: the ``slow``, ``statistical`` and ``integration`` markers and the
switches that run them (``--runstatistical --runintegration``, as ``.ci/run`` does;
``--runslow``: all three), ``--cpu-times`` (CPU seconds and XLA compiles per test file, for
``tests/cpu_budget.py``), where the FSDD recordings are
(``$RFJAX_FSDD_DIR``, else the project's shared copy beside the checkout), and XLA's CPU backend
at optimisation level 0 for the suite. It sits at the repository root, not in ``tests/``, so that
its options and hooks apply to the studies' tests under ``experiments/`` too (pytest applies a
``conftest.py`` to the test files below its folder, and reads its options only from those it
loads at start-up: the root's always).

Most of the suite's time is XLA compiling small programs once each; at backend optimisation level
0 (LLVM's expensive passes off) compiling takes about half the CPU time and the tests' arithmetic
is the same (the level changes code generation, not the HLO's semantics: fusion, sharding and
collectives are decided before it). Set ``RFJAX_TEST_XLA_OPTIMISE=1`` to test with XLA's default
level instead; flags already in ``$XLA_FLAGS`` are kept, and subprocesses inherit them.

The suite keeps JAX's persistent compilation cache in ``.pytest_cache/jax_compilation_cache`` (every
program, however fast it compiled): a cold run reuses the programs that several tests compile alike
(a first run of the default suite took 0.86x the CPU seconds without it), and a rerun loads most
programs instead of compiling them (0.43x a first run's CPU seconds when the cache came, 74411cd).
``$JAX_COMPILATION_CACHE_DIR`` set by the caller wins; set ``RFJAX_TEST_COMPILATION_CACHE=0`` to
compile everything afresh. Tests that count what a call compiles count cache loads too
(``tests/support/compile_counts.py``). After each test file the process drops JAX's in-memory
caches (``compiled_programs_released_after_each_file``, below): a process that keeps every
program it loaded runs out of memory mappings.
"""

import os

import pytest

FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
if os.environ.get("RFJAX_TEST_XLA_OPTIMISE") != "1":
    # Before anything imports jax (conftest modules load before the test modules).
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE_FLAGS}".strip()

ROOT = os.path.dirname(os.path.abspath(__file__))
if os.environ.get("RFJAX_TEST_COMPILATION_CACHE") != "0":
    # JAX reads these when it is imported; subprocesses (several processes, forced devices)
    # inherit them. The cache key includes $XLA_FLAGS, so the optimisation levels never mix.
    os.environ.setdefault(
        "JAX_COMPILATION_CACHE_DIR", os.path.join(ROOT, ".pytest_cache", "jax_compilation_cache")
    )
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
SHARED_FSDD = os.path.join(os.path.dirname(ROOT), "shared", "data", "fsdd", "recordings")


def pytest_configure(config):
    # The FSDD tests and the Conformer experiment read $RFJAX_FSDD_DIR (rfjax.data.fsdd_dir); the
    # tests skip when it names no folder.
    if not os.environ.get("RFJAX_FSDD_DIR") and os.path.isdir(SHARED_FSDD):
        os.environ["RFJAX_FSDD_DIR"] = SHARED_FSDD
    if os.environ.get("RFJAX_TEST_COMPILATION_CACHE") != "0":
        atomic_cache_writes()


def atomic_cache_writes() -> bool:
    """JAX's persistent compilation cache written atomically in this process; False where it
    was already, or where JAX's cache has another shape.

    JAX writes an entry in place (``jax._src.lru_cache.LRUCache.put``: ``Path.write_bytes``,
    without a lock unless the cache evicts). Under ``pytest -n 2`` both workers share the
    suite's cache, and when both compile one program at once one may read the entry the other
    is still writing; JAX's decompression then fails, and it warns and compiles the program
    again. Here ``put`` writes a temporary file in the cache's folder and renames it into
    place, so that a reader finds no entry or a whole one; nothing else changes (an existing
    entry is kept; an evicting cache runs JAX's own ``put``, under its lock). (This was first
    written as the cause of CI workers that died in XLA on 2026-12-01; the cause was the
    processes' memory mappings, ``compiled_programs_released_after_each_file`` below.)
    """
    import tempfile

    from jax._src import lru_cache

    cache = getattr(lru_cache, "LRUCache", None)
    suffix = getattr(lru_cache, "_CACHE_SUFFIX", None)
    if cache is None or suffix is None or getattr(cache.put, "atomic", False):
        return False
    original = cache.put

    def put(self, key: str, value: bytes) -> None:
        if not key or getattr(self, "eviction_enabled", True):
            return original(self, key, value)
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


# --- JAX's compiled programs released after each test file ------------------------------------
#
# Every XLA program a process keeps loaded holds a few memory mappings (its machine code and
# data, about 6 for a small program), and JAX keeps every program it compiled for as long as the
# function it compiled lives: module-level jitted functions and cached helpers live as long as the
# process. Linux caps a process at ``vm.max_map_count`` mappings (65,530 by default); past it
# XLA's next compile or cache load dies with a segmentation fault (2026-12-01: five CI runs lost
# a pytest-xdist worker so, about 90% through the suite; replaying that worker's 2,423 tests in
# one process reached 65,462 mappings at the test it died in). After each test file the suite
# drops JAX's caches (``jax.clear_caches``), so a worker holds one file's programs (at most about
# 8,000 mappings in that replay) and a later file that needs a program loads it from the
# persistent compilation cache.

MEMORY_MAPPING_LIMIT_FILE = "/proc/sys/vm/max_map_count"


def memory_mappings() -> int | None:
    """The memory mappings this process holds (``/proc/self/maps``); None where there is none."""
    try:
        with open("/proc/self/maps") as handle:
            return sum(1 for _ in handle)
    except OSError:
        return None


def release_compiled_programs() -> int | None:
    """Drops JAX's caches in this process (if it imported JAX) and returns the memory mappings
    it holds after that (None where ``/proc`` does not say)."""
    import gc
    import sys

    if "jax" in sys.modules:
        sys.modules["jax"].clear_caches()
        gc.collect()  # programs held in reference cycles (tracebacks, closures)
    return memory_mappings()


@pytest.fixture(autouse=True, scope="module")
def compiled_programs_released_after_each_file():
    yield
    held = release_compiled_programs()
    try:
        with open(MEMORY_MAPPING_LIMIT_FILE) as handle:
            limit = int(handle.read())
    except (OSError, ValueError):
        return
    if held is not None and held > limit // 2:
        pytest.fail(
            f"this process still holds {held} memory mappings after JAX's caches were dropped, "
            f"more than half of vm.max_map_count ({limit}); past the limit XLA dies with a "
            "segmentation fault: something keeps compiled programs alive across test files"
        )


def pytest_addoption(parser):
    parser.addoption(
        "--runslow",
        action="store_true",
        default=False,
        help="everything: also run the tests marked slow (paper-scale runs, long Monte Carlo or "
        "training), statistical and integration",
    )
    parser.addoption(
        "--runstatistical",
        action="store_true",
        default=False,
        help="also run the tests marked statistical (checks repeated at further sizes, "
        "couplings, keys or settings beyond the default suite's representative cases), as CI does",
    )
    parser.addoption(
        "--runintegration",
        action="store_true",
        default=False,
        help="also run the tests marked integration (an experiment's quick variant or a training "
        "job run end to end, a notebook, a wheel install, code on several processes or forced "
        "devices, a Pallas kernel in interpret mode), as CI does",
    )
    parser.addoption(
        "--cpu-times",
        metavar="PATH",
        default=None,
        help="write the CPU seconds of every test file's tests, and the XLA programs they "
        "compiled and the seconds that took, to PATH (JSON), for tests/cpu_budget.py",
    )


# marker -> (the option that runs it besides --runslow, the skip reason)
OPTIONAL_MARKERS = {
    "slow": ("--runslow", "slow (paper-scale run, long Monte Carlo or training); use --runslow"),
    "statistical": (
        "--runstatistical",
        "statistical (a check repeated beyond the default suite's representative cases); use "
        "--runstatistical",
    ),
    "integration": (
        "--runintegration",
        "integration (a quick variant, training job, notebook, wheel, several processes or "
        "devices, or a Pallas kernel in interpret mode, run end to end); use --runintegration",
    ),
}


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    for item in items:
        for marker, (option, reason) in OPTIONAL_MARKERS.items():
            if marker in item.keywords and not config.getoption(option):
                item.add_marker(pytest.mark.skip(reason=reason))
                break


# --- CPU seconds per test file (``--cpu-times=PATH``; checked by tests/cpu_budget.py) ---------
#
# Each phase (setup, call, teardown) of a test is timed in CPU seconds, user + system, of the
# process that runs it and of the child processes it waited for (``time.process_time`` and
# ``resource.getrusage(RUSAGE_CHILDREN)``): the work a file costs, whatever else loads the
# machine. Beside them, the XLA programs the phase's own process compiled (or loaded from the
# persistent cache) and the seconds that took, from JAX's ``backend_compile_duration`` events:
# most of the suite's CPU seconds are compiling (child processes' programs are not counted). A
# phase's figures travel in its report (``user_properties``), so under pytest-xdist the
# controller sums the workers' reports per file and writes the JSON.

CPU_PROPERTY = "cpu_seconds"
COMPILE_PROPERTIES = ("compile_seconds", "compiles")
_CPU_MARK = pytest.StashKey[float]()
_COMPILE_MARK = pytest.StashKey[tuple[float, int]]()
_COMPILED = {"compile_seconds": 0.0, "compiles": 0, "listening": False}


def _count_compile(event: str, duration: float, **kwargs) -> None:
    del kwargs
    if event == "/jax/core/compile/backend_compile_duration":
        _COMPILED["compile_seconds"] += duration
        _COMPILED["compiles"] += 1


def _compiled_so_far() -> tuple[float, int]:
    if not _COMPILED["listening"]:  # JAX imported here, in a process that runs tests
        import jax

        jax.monitoring.register_event_duration_secs_listener(_count_compile)
        _COMPILED["listening"] = True
    return _COMPILED["compile_seconds"], _COMPILED["compiles"]


def _cpu_seconds() -> float:
    import resource
    import time

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    if item.config.getoption("--cpu-times"):
        item.stash[_COMPILE_MARK] = _compiled_so_far()
        item.stash[_CPU_MARK] = _cpu_seconds()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if item.config.getoption("--cpu-times") and _CPU_MARK in item.stash:
        now, compiled = _cpu_seconds(), _compiled_so_far()
        report.user_properties.append((CPU_PROPERTY, now - item.stash[_CPU_MARK]))
        before = item.stash[_COMPILE_MARK]
        for name, value, start in zip(COMPILE_PROPERTIES, compiled, before, strict=True):
            report.user_properties.append((name, value - start))
        item.stash[_CPU_MARK], item.stash[_COMPILE_MARK] = now, compiled  # the next phase's start
    return report


def pytest_runtest_logreport(report):
    properties = dict(report.user_properties)
    if CPU_PROPERTY not in properties:
        return
    path = report.nodeid.split("::", 1)[0]
    entry = _FILE_CPU.setdefault(
        path, {CPU_PROPERTY: 0.0, **{name: 0 for name in COMPILE_PROPERTIES}, "tests": 0}
    )
    for name in (CPU_PROPERTY, *COMPILE_PROPERTIES):
        entry[name] += properties[name]
    entry["tests"] += report.when == "call" or (report.when == "setup" and report.skipped)


_FILE_CPU: dict[str, dict] = {}


def pytest_sessionfinish(session, exitstatus):
    del exitstatus
    path = session.config.getoption("--cpu-times")
    if not path or hasattr(session.config, "workerinput"):  # xdist workers: the controller writes
        return
    import json

    files = dict(sorted(_FILE_CPU.items(), key=lambda item: -item[1][CPU_PROPERTY]))
    totals = {
        f"total_{name}": sum(entry[name] for entry in files.values())
        for name in (CPU_PROPERTY, *COMPILE_PROPERTIES)
    }
    with open(path, "w") as handle:
        json.dump({**totals, "files": files}, handle, indent=1)
