"""The backends of ``fwht`` and ``hd_chain``: one table, one entry per backend.

An entry (``FwhtBackend``) is everything the primitives' lowerings, ``"auto"`` and the tests need
to know about one implementation: where its row kernel is (a function of a module of
``rfjax.ops``, imported when a program using it is first lowered: the Pallas modules take about
a second to import, so ``import rfjax`` never does), the platforms it compiles for, whether it is
available, the lengths and dtypes it takes, where ``"auto"`` may pick it, and its fused
``hd_chain`` kernel if it has one. A backend with an interpret mode (the Pallas kernels) gets its
twin ``<name>_interpret`` from the same ``register`` call: the same kernel in Pallas' interpret
mode, on any platform, which is how it is tested on CPU.

Adding a backend is its kernel file (``rfjax/ops/_fwht_<backend>.py`` with
``fwht_rows(x, normalize)``, the transform of the last axis, and ``fwht_rows_interpret`` for an
interpret twin), one ``register`` call at the end of this module, and the kernel's own test file
(``tests/rfjax/ops/test_fwht_<backend>.py``); the generic tests of ``tests/rfjax/ops/test_fwht.py``
and ``tests/rfjax/ops/test_partition.py`` are parametrised from the table.

``"auto"``: on an NVIDIA GPU of compute capability 9.0 or newer, the fastest implementation
measured for the length and dtype (``GPU_AUTO_SM90``, from committed runs of
``benchmarks/fwht_gpu.py``); otherwise, and where nothing was measured, the first registered
backend that lists the platform in ``auto_on`` and is available.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from rfjax._registry import Registry
from rfjax._validation import check_choice
from rfjax.ops import _fwht_cpu

ALL_DTYPES = ("float16", "bfloat16", "float32", "float64")
ANY_PLATFORM = "*"  # in ``auto_on``: every platform
GPU_PLATFORMS = ("cuda", "rocm")  # the lowering platforms of ``jax.default_backend() == "gpu"``


def _always() -> bool:
    return True


def _no_details() -> dict[str, str | None]:
    return {}


@dataclasses.dataclass(frozen=True)
class FusedChain:
    """A backend's fused ``hd_chain`` kernel: ``(x, signs, norms, simplex) -> (..., B, p)``.

    Attributes:
      function: its name in the backend's module (``<function>_interpret`` for the twin).
      dtypes: the dtypes it takes, if fewer than the backend's ``fwht`` kernel.
      available: whether it was built (the C++ library may predate it).
    """

    function: str
    dtypes: tuple[str, ...] | None = None
    available: Callable[[], bool] = _always


@dataclasses.dataclass(frozen=True)
class FwhtBackend:
    """What the registry knows about one implementation of ``rfjax.ops.fwht``.

    Attributes:
      name: the ``implementation=`` name.
      description: one line for listings and docs.
      module: the module of ``rfjax.ops`` that holds the kernel (e.g. ``"_fwht_tpu"``).
      function: its row kernel there, ``(x, normalize) -> H x`` along the last axis.
      platforms: the lowering platforms it compiles for (``"cpu"``, ``"cuda"``, ``"rocm"``,
        ``"tpu"``); ``()``: every platform.
      min_capability: for CUDA kernels, the oldest compute capability they compile for.
      dtypes: the dtypes it takes (names, e.g. ``"bfloat16"``).
      min_n, max_n: the lengths it takes (powers of two; ``max_n`` None: no limit).
      available: whether it can run in this installation (the C++ kernel may not be built).
      details: what the installed kernel is (the C++ library's path and instruction set), for
        benchmark reports.
      auto_on: the platforms where ``"auto"`` picks it when nothing measured picks another
        (``"*"``: every platform), in registration order among the available ones.
      in_place: the kernel takes ``in_place=`` (it can overwrite its operand's buffer); the
        lowering passes ``in_place=False`` for an argument the caller keeps.
      chain: its fused ``hd_chain`` kernel, or None (``hd_chain`` then composes ``fwht`` calls).
      interprets: for an interpret twin, the backend whose kernel it runs in interpret mode.
      simulated: the kernel simulates a device with ordered host callbacks (Pallas' TPU and
        Mosaic GPU interpret modes): the primitive declares those effects, and under automatic
        sharding its operand is gathered (``custom_partitioning`` cannot carry them).
    """

    name: str
    description: str
    module: str
    function: str = "fwht_rows"
    platforms: tuple[str, ...] = ()
    min_capability: tuple[int, int] | None = None
    dtypes: tuple[str, ...] = ALL_DTYPES
    min_n: int = 1
    max_n: int | None = None
    available: Callable[[], bool] = _always
    details: Callable[[], dict[str, str | None]] = _no_details
    auto_on: tuple[str, ...] = ()
    in_place: bool = False
    chain: FusedChain | None = None
    interprets: str | None = None
    simulated: bool = False

    def runs_on(self, platform: str) -> bool:
        """Whether it compiles for ``platform`` (a lowering platform, or ``"gpu"`` for either
        GPU platform, as ``jax.default_backend()`` names them)."""
        if not self.platforms:
            return True
        return platform in self.platforms or (
            platform == "gpu" and any(p in GPU_PLATFORMS for p in self.platforms)
        )

    def check(self, n: int, dtype: DTypeLike) -> None:
        """Raises unless the kernel takes vectors of length ``n`` (a power of two) in ``dtype``.

        Raises:
          TypeError: for a dtype it does not take.
          ValueError: for a length it does not take.
        """
        name = jnp.dtype(dtype).name
        if name not in self.dtypes:
            raise TypeError(
                f"implementation={self.name!r} takes {_listed(self.dtypes)}, got {name}; use "
                "implementation='auto', 'matmul' or 'xla'"
            )
        if n < 1 or n & (n - 1):
            raise ValueError(
                f"implementation={self.name!r} takes power-of-two lengths, got {n}; pad with "
                "rfjax.ops.pad_to_power_of_two"
            )
        if n < self.min_n or (self.max_n is not None and n > self.max_n):
            if self.max_n is None:
                lengths = f"from {self.min_n}"
            else:
                lengths = (
                    f"up to {self.max_n}" if self.min_n == 1 else f"{self.min_n} ... {self.max_n}"
                )
            raise ValueError(
                f"implementation={self.name!r} takes power-of-two lengths {lengths}, got {n}; "
                "use implementation='auto', 'matmul' or 'xla'"
            )

    def supports(self, n: int, dtype: DTypeLike) -> bool:
        """Whether ``check(n, dtype)`` passes.

        Examples:
          >>> from rfjax.ops import fwht_backend
          >>> fwht_backend("mosaic_gpu").supports(8, "float32")  # 16 <= n <= 2^14
          False
        """
        try:
            self.check(n, dtype)
        except (TypeError, ValueError):
            return False
        return True

    def kernel(self) -> Callable[..., jax.Array]:
        """The row kernel ``(x, normalize, **options) -> H x`` along the last axis (its module
        imported now), checking the length and dtype it is given (the shard's, under a sharded
        transformed axis); ``options`` are the kernel's own (the C++ kernel's ``max_threads``
        and ``in_place``)."""
        return _checked(getattr(_module(self.module), self.function), self)

    def chain_kernel(self) -> Callable[..., jax.Array]:
        """The fused ``hd_chain`` kernel ``(x, signs, norms, simplex) -> (..., B, p)``."""
        if self.chain is None:
            raise ValueError(f"implementation={self.name!r} has no fused hd_chain kernel")
        suffix = "_interpret" if self.interprets is not None else ""
        return getattr(_module(self.module), self.chain.function + suffix)

    def chain_takes(self, p: int, dtype: DTypeLike) -> bool:
        """Whether the fused ``hd_chain`` kernel exists and takes vectors of length ``p`` in
        ``dtype`` (else ``hd_chain`` composes ``fwht`` calls)."""
        chain = self.chain
        if chain is None or not chain.available():
            return False
        return jnp.dtype(dtype).name in (chain.dtypes or self.dtypes) and self.supports(p, dtype)


def _listed(names: tuple[str, ...]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _module(name: str):
    """The backend module ``rfjax.ops.<name>``, imported on first use."""
    return importlib.import_module(f"rfjax.ops.{name}")


def _checked(kernel: Callable[..., jax.Array], backend: FwhtBackend) -> Callable[..., jax.Array]:
    @functools.wraps(kernel)
    def checked(x, normalize, **options):
        backend.check(x.shape[-1], x.dtype)
        return kernel(x, normalize, **options)

    return checked


_REGISTRY: Registry[FwhtBackend] = Registry("fwht implementation")


def register(backend: FwhtBackend, *, interpret: bool = False, simulated: bool = False) -> None:
    """Registers ``backend`` under its name (an error if the name is taken).

    Args:
      backend: the entry.
      interpret: also register ``<name>_interpret``, the same kernel in Pallas' interpret mode
        (``<function>_interpret`` of the same module, and of its fused chain) on every platform.
      simulated: that interpret mode simulates a device with ordered host callbacks.

    Raises:
      TypeError: for a name that is not a non-empty string.
      ValueError: if the name is taken.
    """
    _REGISTRY.add(backend.name, backend)
    if interpret:
        twin = f"{backend.name}_interpret"
        _REGISTRY.add(
            twin,
            dataclasses.replace(
                backend,
                name=twin,
                description=f"{backend.description}, in Pallas' interpret mode (tests on CPU)",
                function=f"{backend.function}_interpret",
                platforms=(),
                min_capability=None,
                auto_on=(),
                interprets=backend.name,
                simulated=simulated,
            ),
        )


def fwht_backends(*, platform: str | None = None) -> tuple[str, ...]:
    """The names ``fwht``'s and ``hd_chain``'s ``implementation=`` takes besides ``"auto"``
    (registration order), optionally only those that compile for ``platform``.

    Args:
      platform: a lowering platform (``"cpu"``, ``"cuda"``, ``"rocm"``, ``"tpu"``) or
        ``"gpu"``; interpret twins run on every platform.

    Examples:
      >>> from rfjax.ops import fwht_backends
      >>> "mosaic_gpu" in fwht_backends(platform="cuda"), "mosaic_gpu" in fwht_backends()
      (True, True)
      >>> "mosaic_gpu" in fwht_backends(platform="tpu")  # its interpret twin runs anywhere
      False
    """
    return tuple(
        name for name, backend in _REGISTRY.items() if platform is None or backend.runs_on(platform)
    )


def fwht_backend(name: str) -> FwhtBackend:
    """The registry entry of the backend ``name``.

    Raises:
      TypeError: if ``name`` is not a string.
      ValueError: if no backend has that name; the message lists the known names.

    Examples:
      >>> from rfjax.ops import fwht_backend
      >>> fwht_backend("pallas_tpu").platforms, fwht_backend("pallas_tpu").max_n
      (('tpu',), 16384)
    """
    return _REGISTRY.get(name)


def check_implementation(implementation: object) -> str:
    """``implementation`` if it is ``"auto"`` or a registered backend, else a ``ValueError``
    listing the allowed names."""
    return check_choice("implementation", implementation, ("auto", *fwht_backends()))


# What ``"auto"`` picks on an sm90+ GPU (Hopper and newer), per (dtype, n): the fastest
# implementation measured by ``benchmarks/fwht_gpu.py`` on an H200, 2^24 elements: float32 in
# ``benchmarks/gpu_runs/2026-11-26-h200`` (the Triton kernel then failed tests, so it was left
# out), bfloat16 in ``benchmarks/gpu_runs/2026-11-27-h200`` (after its fix; every GPU test
# passed), bfloat16 n = 2^14 in ``benchmarks/gpu_runs/2026-11-30-h200`` (which also measured
# n = 2^15, where only ``"matmul"`` and ``"xla_butterfly"`` take the length, and the float32
# cases again, with the same choices). Cases not listed (n = 2^15, n < 64) fall back to
# ``auto_on``. ``tests/rfjax/ops/test_fwht_backends.py`` checks this table against the
# committed runs.
GPU_AUTO_SM90: dict[tuple[str, int], str] = {
    ("float32", 64): "matmul",
    **{("float32", 1 << k): "mosaic_gpu" for k in range(7, 15)},
    **{("bfloat16", 1 << k): "pallas_triton" for k in range(6, 13)},
    ("bfloat16", 8192): "mosaic_gpu",
    ("bfloat16", 16384): "mosaic_gpu",
}


def resolve_fwht(
    implementation: str,
    platform: str,
    *,
    n: int | None = None,
    dtype: DTypeLike | None = None,
    capability: tuple[int, int] | None = None,
) -> str:
    """The backend ``implementation`` stands for on ``platform``: ``"auto"``'s choice, or
    ``implementation`` itself.

    ``"auto"``: on an NVIDIA GPU (``platform="cuda"``) of compute capability ``capability`` >=
    (9, 0), the fastest backend measured for vectors of length ``n`` in ``dtype``
    (``GPU_AUTO_SM90``); otherwise the first available backend whose ``auto_on`` lists the
    platform: on CPU the C++ kernel when it was built, else ``"matmul"``; on TPU and GPUs
    ``"matmul"``; elsewhere ``"xla"`` (the measurements behind it are in ``fwht``).

    Args:
      implementation: ``"auto"`` or a name of ``fwht_backends()``.
      platform: the lowering platform (``"cpu"``, ``"cuda"``, ``"rocm"``, ``"tpu"``, ...).
      n: the transformed length, for the measured GPU choice.
      dtype: the operand's dtype, for the measured GPU choice.
      capability: the CUDA device's compute capability (major, minor), if any.

    Returns:
      A name of ``fwht_backends(platform=platform)``.

    Raises:
      ValueError: for an unknown name, or a backend that does not compile for ``platform``.

    Examples:
      >>> from rfjax.ops import resolve_fwht
      >>> resolve_fwht("auto", "cuda", n=1024, dtype="float32", capability=(9, 0))
      'mosaic_gpu'
      >>> resolve_fwht("auto", "tpu")
      'matmul'
    """
    check_implementation(implementation)
    if implementation == "auto":
        if platform == "cuda" and capability is not None and capability >= (9, 0):
            measured = GPU_AUTO_SM90.get((jnp.dtype(dtype).name if dtype else "", n or 0))
            if measured is not None:
                return measured
        for name, backend in _REGISTRY.items():
            if (platform in backend.auto_on or ANY_PLATFORM in backend.auto_on) and (
                backend.available()
            ):
                return name
        raise ValueError(f"no fwht backend is registered for platform {platform!r}")
    backend = fwht_backend(implementation)
    if not backend.runs_on(platform):
        raise ValueError(
            f"implementation={implementation!r} runs on {', '.join(backend.platforms)}, not on "
            f"platform {platform!r}; use implementation='auto'"
        )
    return implementation


# ---------------------------------------------------------------------------------------------
# The table: one call per backend (registration order is the order of ``fwht_backends()`` and
# ``"auto"``'s order of preference).
# ---------------------------------------------------------------------------------------------

register(
    FwhtBackend(
        "cpu",
        description="the C++ kernel (XLA FFI; SIMD chosen at load time)",
        module="_fwht_cpu",
        platforms=("cpu",),
        available=_fwht_cpu.is_available,
        details=_fwht_cpu.build_details,
        auto_on=("cpu",),
        in_place=True,
        chain=FusedChain(
            "chain_rows",
            dtypes=("float32", "float64"),
            available=functools.partial(_fwht_cpu.is_available, "hd_chain"),
        ),
    )
)
register(
    FwhtBackend(
        "matmul",
        description="Kronecker factors of at most 128 as small dense contractions",
        module="_fwht_xla",
        function="kronecker_matmul",
        auto_on=("cpu", "tpu", "cuda", "rocm"),
    )
)
register(
    FwhtBackend(
        "xla",
        description="a radix-2 butterfly in plain XLA",
        module="_fwht_xla",
        function="xla_butterfly",
        auto_on=(ANY_PLATFORM,),
    )
)
register(
    FwhtBackend(
        "pallas_triton",
        description="the Pallas Triton kernel (sm80+; JAX deprecated its Triton backend)",
        module="_fwht_triton",
        platforms=GPU_PLATFORMS,
        min_capability=(8, 0),
        max_n=8192,
    ),
    interpret=True,
)
register(
    FwhtBackend(
        "pallas_tpu",
        description="the Pallas TPU (Mosaic) kernel",
        module="_fwht_tpu",
        platforms=("tpu",),
        dtypes=("float16", "bfloat16", "float32"),
        max_n=1 << 14,
        chain=FusedChain("chain_rows"),
    ),
    interpret=True,
    simulated=True,
)
register(
    FwhtBackend(
        "mosaic_gpu",
        description="the Pallas Mosaic GPU kernel (sm90+)",
        module="_fwht_mosaic_gpu",
        platforms=("cuda",),
        min_capability=(9, 0),
        dtypes=("float16", "bfloat16", "float32"),
        min_n=16,
        max_n=1 << 14,
    ),
    interpret=True,
    simulated=True,
)
register(  # the same kernel launched differently, until a GPU run says which launch stays
    dataclasses.replace(
        fwht_backend("mosaic_gpu"),
        name="mosaic_gpu_pipelined",
        description="the Pallas Mosaic GPU kernel, several tiles per program and the next "
        "tile loading while one is transformed (sm90+)",
        function="fwht_rows_pipelined",
    ),
    interpret=True,
    simulated=True,
)
