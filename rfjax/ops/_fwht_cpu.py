"""The C++ CPU kernels behind ``fwht`` and ``sin_cos``, registered with XLA through ``jax.ffi``.

The kernels (``csrc/``) are compiled by the package's build (``setup.py``) into the shared
library ``rfjax/ops/_fwht_cpu_lib*.so``. It is not a Python module: it is loaded with ``ctypes``
and its handlers are registered as XLA custom-call targets on first use. When the build was
skipped or failed, ``is_available()`` is False and ``fwht`` and ``sin_cos`` fall back to pure
XLA. Set ``RFJAX_FWHT_CPU_LIB`` to the path of a library to load that one instead.

The library holds the kernels compiled for several instruction sets (on x86-64: AVX-512F,
AVX2+FMA, SSE2 and portable scalar code) and uses the best one the CPU supports, chosen when it
is loaded; ``isa()`` names it. ``RFJAX_FWHT_CPU_ISA`` (set before the library is loaded) or
``select_isa`` asks for another one.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import importlib.util
import math
import os
import pathlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.xla_metadata import set_xla_metadata

_LIB_STEM = "_fwht_cpu_lib"
_TARGETS = {
    jnp.dtype(jnp.float32): ("rfjax_fwht_f32", "RfjaxFwhtF32"),
    jnp.dtype(jnp.float64): ("rfjax_fwht_f64", "RfjaxFwhtF64"),
}
_SIN_COS_TARGETS = {
    jnp.dtype(jnp.float32): ("rfjax_sin_cos_f32", "RfjaxSinCosF32"),
    jnp.dtype(jnp.float64): ("rfjax_sin_cos_f64", "RfjaxSinCosF64"),
}
_GRAM_TARGETS = {
    jnp.dtype(jnp.float32): ("rfjax_gram_update_f32", "RfjaxGramUpdateF32"),
    jnp.dtype(jnp.float64): ("rfjax_gram_update_f64", "RfjaxGramUpdateF64"),
}
_CHAIN_TARGETS = {
    jnp.dtype(jnp.float32): ("rfjax_hd_chain_f32", "RfjaxHdChainF32"),
    jnp.dtype(jnp.float64): ("rfjax_hd_chain_f64", "RfjaxHdChainF64"),
}
_KERNELS = {
    "fwht": _TARGETS,
    "hd_chain": _CHAIN_TARGETS,
    "sin_cos": _SIN_COS_TARGETS,
    "gram_update": _GRAM_TARGETS,
}
KERNEL_DTYPES = tuple(_TARGETS)  # the dtypes the kernels take (fwht upcasts half types)


def _candidate_paths() -> list[pathlib.Path]:
    """Where the compiled library may be: env override, beside this file, the import system."""
    paths = []
    override = os.environ.get("RFJAX_FWHT_CPU_LIB")
    if override:
        paths.append(pathlib.Path(override))
    here = pathlib.Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        paths.append(here / f"{_LIB_STEM}{suffix}")
    paths.extend(sorted(here.glob(f"{_LIB_STEM}*.so")))
    try:  # editable installs may map the package to a build directory
        spec = importlib.util.find_spec(f"{__package__}.{_LIB_STEM}")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        paths.append(pathlib.Path(spec.origin))
    return paths


@functools.cache
def _library() -> ctypes.CDLL | None:
    for path in _candidate_paths():
        if path.is_file():
            try:
                lib = ctypes.CDLL(str(path))
            except OSError:
                continue
            _warn_of_ignored_settings(lib)
            return lib
    return None


def _warn_of_ignored_settings(lib: ctypes.CDLL) -> None:
    """Warns, naming the variable, where the library ignores ``RFJAX_FWHT_CPU_ISA`` (a name not
    compiled in or not supported by this CPU: the best supported set runs) or reads
    ``RFJAX_FWHT_CPU_THREADS`` as what it does not say (C's strtoll: "abc" is 0 threads)."""
    wanted = os.environ.get("RFJAX_FWHT_CPU_ISA", "")
    lib.rfjax_fwht_isa.restype = ctypes.c_char_p
    in_use = lib.rfjax_fwht_isa().decode()
    if wanted and wanted != in_use:
        warnings.warn(
            f"RFJAX_FWHT_CPU_ISA={wanted!r} is ignored: it is not one of the instruction sets "
            f"compiled into the library that this CPU supports; {in_use!r} runs",
            stacklevel=3,
        )
    threads = os.environ.get("RFJAX_FWHT_CPU_THREADS")
    if threads is not None and not threads.strip().lstrip("-").isdigit():
        warnings.warn(
            f"RFJAX_FWHT_CPU_THREADS={threads!r} is not an integer (the number of helper "
            "threads, or -1 for no cap); the library reads it as 0 (no helper threads)",
            stacklevel=3,
        )


def _capsule_pointer(capsule: object) -> int:
    """The pointer held by a ``PyCapsule`` (as SciPy's ``cython_blas.__pyx_capi__`` holds its
    functions), whatever its name."""
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype = ctypes.c_void_p
    get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return get_pointer(capsule, get_name(capsule))


def _set_blas(lib: ctypes.CDLL) -> None:
    """Hands SciPy's BLAS ``ssyrk``/``dsyrk`` to the library (the Gram update calls them)."""
    from scipy.linalg import cython_blas

    functions = [_capsule_pointer(cython_blas.__pyx_capi__[name]) for name in ("ssyrk", "dsyrk")]
    lib.rfjax_set_syrk(*(ctypes.c_void_p(f) for f in functions))


@functools.cache
def _register(kernel: str = "fwht") -> bool:
    """Registers the FFI targets of ``kernel`` (a key of ``_KERNELS``) once; False if the library
    is missing or lacks one of its handlers (a library built before that kernel), or, for the
    Gram update, SciPy's BLAS cannot be found."""
    lib = _library()
    if lib is None:
        return False
    try:
        if kernel == "gram_update":
            _set_blas(lib)
        for target, symbol in _KERNELS[kernel].values():
            jax.ffi.register_ffi_target(
                target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu"
            )
            # Under automatic sharding, XLA may split a call along its leading (batch) axes,
            # which each call names (num_batch_dims, below): every row is transformed alone.
            if kernel != "gram_update":
                jax.ffi.register_ffi_target_as_batch_partitionable(target)
    except (AttributeError, ValueError, RuntimeError, ImportError, KeyError):
        return False
    return True


def is_available(kernel: str = "fwht") -> bool:
    """Whether the compiled ``kernel`` (``"fwht"``, ``"hd_chain"``, ``"sin_cos"`` or
    ``"gram_update"``) was built and registered."""
    return _register(kernel)


def library_path() -> str | None:
    """The path of the loaded kernel library, or None."""
    lib = _library()
    return None if lib is None else lib._name


def _string_function(name: str):
    lib = _library()
    if lib is None:
        raise RuntimeError("the rfjax C++ FWHT kernel is not available (it was not built)")
    function = getattr(lib, name)
    function.restype = ctypes.c_char_p
    return function


def isa() -> str:
    """The instruction set in use: ``"avx512"``, ``"avx2"``, ``"sse2"`` or ``"scalar"``."""
    return _string_function("rfjax_fwht_isa")().decode()


def compiled_isas() -> tuple[str, ...]:
    """The instruction sets compiled into the library, best first (``"scalar"`` always last)."""
    return tuple(_string_function("rfjax_fwht_compiled_isas")().decode().split(","))


def build_details() -> dict[str, str | None]:
    """The loaded library's path and the instruction set in use (``"isa"``; None without the
    library), for benchmark reports."""
    return {"library": library_path(), "isa": isa() if _library() is not None else None}


def select_isa(name: str) -> None:
    """Runs the kernel with the instruction set ``name`` from now on (for tests and benchmarks).

    Raises:
      ValueError: if ``name`` was not compiled into the library or the CPU does not support it.
    """
    lib = _library()
    status = -1 if lib is None else lib.rfjax_fwht_select_isa(str(name).encode())
    if status != 0:
        reason = {1: "was not compiled", 2: "is not supported by this CPU"}.get(
            status, "cannot be used: the library is not built"
        )
        raise ValueError(
            f"isa {name!r} {reason}; compiled: {', '.join(compiled_isas()) if lib else 'none'}"
        )


def fwht_rows(
    x: jax.Array, normalize: bool, *, max_threads: int = -1, in_place: bool = True
) -> jax.Array:
    """H_n x (or H_n x / sqrt(n)) for every row of ``x``, n its last dimension (a power of two).

    float32 and float64 go to the kernel directly; float16/bfloat16 are upcast to float32,
    transformed, and rounded once. Traceable (used inside the primitive's CPU lowering).
    ``max_threads`` caps the XLA intra-op pool threads the kernel uses besides the calling
    thread (-1: all, for large batches; 0: the calling thread only). The environment variable
    ``RFJAX_FWHT_CPU_THREADS`` sets the same cap process-wide.

    ``in_place``: the output aliases ``x``, so the kernel transforms ``x``'s buffer when XLA can
    reuse it (an intermediate, or a donated argument), and XLA copies ``x`` first when it cannot
    (an argument the caller keeps). With ``in_place=False`` the kernel's first pass reads ``x``
    and writes a fresh output (no copy first), which is what an argument the caller keeps needs;
    the primitive's lowering chooses (``rfjax.ops._fwht``).
    """
    if not _register():
        raise RuntimeError(
            "the rfjax C++ FWHT kernel is not available (it was not built; reinstall rfjax "
            "with a C++17 compiler, or use implementation='xla')"
        )
    dtype = jnp.dtype(x.dtype)
    work = x.astype(jnp.float32) if dtype not in _TARGETS else x
    target, _ = _TARGETS[jnp.dtype(work.dtype)]
    # No vmap_method: this call only appears in the lowering of rfjax's fwht primitive, whose
    # own batching rule has already handled vmap by then.
    y = jax.ffi.ffi_call(
        target,
        jax.ShapeDtypeStruct(work.shape, work.dtype),
        input_output_aliases={0: 0} if in_place else None,
    )(work, normalize=np.bool_(normalize), max_threads=np.int64(max_threads))
    y = set_xla_metadata(y, num_batch_dims=str(work.ndim - 1))
    return y.astype(dtype)


def sin_cos_rows(
    t: jax.Array, scale: float, constants: dict[str, np.ndarray | np.floating]
) -> jax.Array:
    """scale * [sin t, cos t] along the last axis of a float32 or float64 ``t`` (``(..., m) ->
    (..., 2m)``), by the kernel of ``csrc/sincos_kernel.h`` with the reduction's and polynomials'
    ``constants`` (``split``, ``sine``, ``cosine`` arrays and ``limit``, in t's dtype). Traceable
    (used inside ``sin_cos``'s CPU lowering)."""
    if not _register("sin_cos"):
        raise RuntimeError("the rfjax C++ sin/cos kernel is not available (it was not built)")
    dtype = jnp.dtype(t.dtype)
    target, _ = _SIN_COS_TARGETS[dtype]
    y = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((*t.shape[:-1], 2 * t.shape[-1]), dtype))(
        t, scale=dtype.type(scale), **constants
    )
    return set_xla_metadata(y, num_batch_dims=str(t.ndim - 1))


def gram_update(c: jax.Array, a: jax.Array) -> jax.Array:
    """c + a^T a in the lower triangle (j <= i), c above it, by BLAS ``syrk`` (SciPy's) in place
    on c's buffer (``c`` ``(m, m)``, ``a`` ``(b, m)``, both float32 or both float64). Traceable
    (``rfjax.ops.symmetric_rank_update``'s CPU branch)."""
    if not _register("gram_update"):
        raise RuntimeError("the rfjax C++ Gram update is not available (it was not built)")
    target, _ = _GRAM_TARGETS[jnp.dtype(c.dtype)]
    return jax.ffi.ffi_call(
        target, jax.ShapeDtypeStruct(c.shape, c.dtype), input_output_aliases={0: 0}
    )(c, a)


def chain_rows(x: jax.Array, signs: jax.Array, norms: jax.Array, *, simplex: bool) -> jax.Array:
    """The structured-coupling chain of ``rfjax.ops.hd_chain`` fused into one kernel
    (``csrc/fwht_kernel.h``: every stage of a row's block in L1): x ``(..., p)``, signs
    ``(B, k, p)``, norms ``(B, p)``, all float32 or all float64, to ``(..., B, p)``. Traceable
    (``hd_chain``'s CPU lowering)."""
    if not _register("hd_chain"):
        raise RuntimeError("the rfjax C++ chain kernel is not available (it was not built)")
    dtype = jnp.dtype(x.dtype)
    p = x.shape[-1]
    # S of SimRF Eq. 9 (rfjax.ops.apply_simplex): sqrt(p/(p-1)) z_i - (sqrt(p)+1)/(p-1)^1.5 sigma,
    # and sigma / sqrt(p-1) last
    terms = (
        (math.sqrt(p / (p - 1)), (math.sqrt(p) + 1) / (p - 1) ** 1.5, math.sqrt(p - 1))
        if p > 1
        else (0.0, 0.0, 1.0)
    )
    target, _ = _CHAIN_TARGETS[dtype]
    y = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((*x.shape[:-1], signs.shape[0], p), dtype))(
        x, signs, norms, simplex=np.bool_(simplex), simplex_terms=np.asarray(terms, dtype)
    )
    return set_xla_metadata(y, num_batch_dims=str(x.ndim - 1))
