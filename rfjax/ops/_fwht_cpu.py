"""The C++ CPU kernel behind ``fwht``, registered with XLA through ``jax.ffi``.

The kernel (``csrc/``) is compiled by the package's build (``setup.py``) into the shared library
``rfjax/ops/_fwht_cpu_lib*.so``. It is not a Python module: it is loaded with ``ctypes`` and its
handlers are registered as XLA custom-call targets on first use. When the build was skipped or
failed, ``is_available()`` is False and ``fwht`` falls back to pure XLA. Set
``RFJAX_FWHT_CPU_LIB`` to the path of a library to load that one instead.

The library holds the transform compiled for several instruction sets (on x86-64: AVX-512F,
AVX2+FMA, SSE2 and portable scalar code) and uses the best one the CPU supports, chosen when it
is loaded; ``isa()`` names it. ``RFJAX_FWHT_CPU_ISA`` (set before the library is loaded) or
``select_isa`` asks for another one.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import importlib.util
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.xla_metadata import set_xla_metadata

_LIB_STEM = "_fwht_cpu_lib"
_TARGETS = {
    jnp.dtype(jnp.float32): ("rfjax_fwht_f32", "RfjaxFwhtF32"),
    jnp.dtype(jnp.float64): ("rfjax_fwht_f64", "RfjaxFwhtF64"),
}


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
                return ctypes.CDLL(str(path))
            except OSError:
                continue
    return None


@functools.cache
def _register() -> bool:
    """Registers the FFI targets once; False if the library is missing or lacks a handler."""
    lib = _library()
    if lib is None:
        return False
    try:
        for target, symbol in _TARGETS.values():
            jax.ffi.register_ffi_target(
                target, jax.ffi.pycapsule(getattr(lib, symbol)), platform="cpu"
            )
            # Under automatic sharding, XLA may split a call along its leading (batch) axes,
            # which each call names (num_batch_dims, below): every row is transformed alone.
            jax.ffi.register_ffi_target_as_batch_partitionable(target)
    except (AttributeError, ValueError, RuntimeError):
        return False
    return True


def is_available() -> bool:
    """Whether the compiled kernel was built and registered."""
    return _register()


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


def fwht_rows(x: jax.Array, normalize: bool, *, max_threads: int = -1) -> jax.Array:
    """H_n x (or H_n x / sqrt(n)) for every row of ``x``, n its last dimension (a power of two).

    float32 and float64 go to the kernel directly; float16/bfloat16 are upcast to float32,
    transformed, and rounded once. Traceable (used inside the primitive's CPU lowering).
    ``max_threads`` caps the XLA intra-op pool threads the kernel uses besides the calling
    thread (-1: all, for large batches; 0: the calling thread only). The environment variable
    ``RFJAX_FWHT_CPU_THREADS`` sets the same cap process-wide.
    """
    if not _register():
        raise RuntimeError(
            "the rfjax C++ FWHT kernel is not available (it was not built; reinstall rfjax "
            "with a C++17 compiler, or use implementation='xla')"
        )
    dtype = jnp.dtype(x.dtype)
    work = x.astype(jnp.float32) if dtype not in _TARGETS else x
    target, _ = _TARGETS[jnp.dtype(work.dtype)]
    # The output aliases the input: the kernel works in place when XLA can reuse the operand's
    # buffer (an intermediate, or a donated argument); otherwise XLA copies the operand first.
    # No vmap_method: this call only appears in the lowering of rfjax's fwht primitive, whose
    # own batching rule has already handled vmap by then.
    y = jax.ffi.ffi_call(
        target,
        jax.ShapeDtypeStruct(work.shape, work.dtype),
        input_output_aliases={0: 0},
    )(work, normalize=np.bool_(normalize), max_threads=np.int64(max_threads))
    y = set_xla_metadata(y, num_batch_dims=str(work.ndim - 1))
    return y.astype(dtype)
