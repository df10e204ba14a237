"""The fast Walsh-Hadamard transform as a JAX primitive with several lowerings.

``fwht_p`` transforms the last axis of its operand. It is linear and symmetric (H^T = H), so its
JVP applies it to the tangent and its transpose applies it to the cotangent; its batching rule
keeps the batch axis in front of the transformed axis, so ``vmap`` calls the kernel once on the
batched array. All of this is JAX's public primitive API (``jax.extend.core.Primitive`` and
``jax.interpreters.{ad,batching,mlir}``): a custom call cannot be given forward- and
reverse-mode rules and a batching rule together otherwise (``custom_vjp`` has no JVP).

Lowering: the implementation (``IMPLEMENTATIONS``) is resolved per platform when the primitive is
lowered; on a sharded operand it runs per shard, under explicit and automatic mesh axes alike
(``rfjax.ops._partition``).
"""

from __future__ import annotations

import functools
import importlib
import types
import typing
from typing import Literal

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jaxlib.mlir import ir

from rfjax.ops import _fwht_cpu
from rfjax.ops._partition import Kernel, auto_per_shard, explicit_spec, per_shard, requires_devices

Implementation = Literal[
    "auto",
    "cpu",
    "xla",
    "matmul",
    "pallas",
    "pallas_interpret",
    "pallas_tpu",
    "pallas_tpu_interpret",
    "mosaic_gpu",
    "mosaic_gpu_interpret",
]
IMPLEMENTATIONS: tuple[str, ...] = typing.get_args(Implementation)

# The platforms each compiled kernel runs on (the others run anywhere).
_PLATFORMS = {
    "cpu": ("cpu",),
    "pallas": ("cuda", "rocm"),
    "pallas_tpu": ("tpu",),
    "mosaic_gpu": ("cuda",),
}


# Where each implementation's kernel is: (module of rfjax.ops, function). The Pallas backends
# (Triton, Pallas TPU, Mosaic GPU) import JAX's Pallas and Mosaic modules, which take about a
# second to import: ``kernel`` imports them when a program using them is first lowered, so
# ``import rfjax`` never does.
_KERNEL_SOURCES: dict[str, tuple[str, str]] = {
    "cpu": ("_fwht_cpu", "fwht_rows"),
    "xla": ("_fwht_xla", "xla_butterfly"),
    "matmul": ("_fwht_xla", "kronecker_matmul"),
    "pallas": ("_fwht_triton", "fwht_rows"),
    "pallas_interpret": ("_fwht_triton", "fwht_rows_interpret"),
    "pallas_tpu": ("_fwht_tpu", "fwht_rows"),
    "pallas_tpu_interpret": ("_fwht_tpu", "fwht_rows_interpret"),
    "mosaic_gpu": ("_fwht_mosaic_gpu", "fwht_rows"),
    "mosaic_gpu_interpret": ("_fwht_mosaic_gpu", "fwht_rows_interpret"),
}


def backend(module: str) -> types.ModuleType:
    """The backend module ``rfjax.ops.<module>``, imported on first use."""
    return importlib.import_module(f"rfjax.ops.{module}")


def kernel(implementation: str) -> Kernel:
    """The row kernel of a resolved ``implementation`` (one of ``IMPLEMENTATIONS`` but "auto")."""
    module, name = _KERNEL_SOURCES[implementation]
    return getattr(backend(module), name)


# What ``"auto"`` picks on an sm90+ GPU (Hopper and newer), per (dtype, n): the fastest
# implementation measured by ``benchmarks/fwht_gpu.py`` on an H200, 2^24 elements: float32 in
# ``benchmarks/gpu_runs/2026-11-26-h200`` (the Triton kernel then failed tests, so it was left
# out), bfloat16 in ``benchmarks/gpu_runs/2026-11-27-h200`` (after its fix; every GPU test
# passed). Cases not listed (n = 2^15, bfloat16 n = 2^14 and n < 64 were not measured) use
# ``"matmul"``. ``tests/rfjax/ops/test_fwht.py`` checks this table against the committed runs.
GPU_AUTO_SM90: dict[tuple[str, int], str] = {
    ("float32", 64): "matmul",
    **{("float32", 1 << k): "mosaic_gpu" for k in range(7, 15)},
    **{("bfloat16", 1 << k): "pallas" for k in range(6, 13)},
    ("bfloat16", 8192): "mosaic_gpu",
}


def resolve(
    implementation: str,
    platform: str,
    *,
    n: int | None = None,
    dtype=None,
    capability: tuple[int, int] | None = None,
) -> str:
    """The implementation ``"auto"`` stands for on ``platform``, or ``implementation`` itself.

    ``"auto"``: on CPU the C++ kernel when it was built, else ``"matmul"``; on TPU ``"matmul"``;
    on an NVIDIA GPU of compute capability ``capability`` >= (9, 0) the fastest implementation
    measured for vectors of length ``n`` and ``dtype`` (``GPU_AUTO_SM90``), else ``"matmul"``;
    on other platforms ``"xla"`` (the measurements behind it are in ``fwht``).

    Raises:
      ValueError: if the implementation cannot run on ``platform``.
    """
    if implementation == "auto":
        if platform == "cpu":
            return "cpu" if _fwht_cpu.is_available() else "matmul"
        if platform == "cuda" and capability is not None and capability >= (9, 0):
            key = (jnp.dtype(dtype).name if dtype is not None else "", n or 0)
            return GPU_AUTO_SM90.get(key, "matmul")
        if platform in ("tpu", "cuda", "rocm"):
            return "matmul"
        return "xla"
    allowed = _PLATFORMS.get(implementation)
    if allowed is not None and platform not in allowed:
        raise ValueError(
            f"implementation={implementation!r} runs on {', '.join(allowed)}, not on platform "
            f"{platform!r}; use implementation='auto'"
        )
    return implementation


@functools.cache
def cuda_capability() -> tuple[int, int] | None:
    """(major, minor) compute capability of the first CUDA device, or None without one."""
    try:
        device = jax.devices("cuda")[0]
    except RuntimeError:
        return None
    major, minor = str(getattr(device, "compute_capability", "0.0")).split(".")[:2]
    return int(major), int(minor)


# The interpret modes of the Pallas TPU and GPU kernels simulate the device with ordered host
# callbacks: a primitive lowered to them must declare those effects.
_SIMULATED = ("pallas_tpu_interpret", "mosaic_gpu_interpret")


@functools.cache
def kernel_effects(implementation: str, shape: tuple[int, ...], dtype, normalize: bool):
    """The effects of ``implementation``'s kernel on this operand (none but for simulators)."""
    if implementation not in _SIMULATED:
        return frozenset()
    rows = kernel(implementation)
    operand = jax.ShapeDtypeStruct(shape, dtype)
    return frozenset(jax.make_jaxpr(lambda v: rows(v, normalize))(operand).effects)


fwht_p = Primitive("rfjax_fwht")


def _abstract_eval(x, *, normalize, implementation):
    effects = kernel_effects(implementation, tuple(x.shape), x.dtype, normalize)
    return x.update(weak_type=False), effects  # keeps the sharding and shard_map's varying axes


@functools.cache
def _compiled(normalize: bool, implementation: str):
    return jax.jit(lambda x: fwht_p.bind(x, normalize=normalize, implementation=implementation))


def _impl(x, *, normalize, implementation):
    """Eager application: the primitive compiled on its own (what jit does for any primitive)."""
    return _compiled(normalize, implementation)(x)


fwht_p.def_effectful_abstract_eval(_abstract_eval)
fwht_p.def_impl(_impl)
requires_devices(fwht_p)  # its lowering partitions the kernel under automatic axes


def _batch(args, dims, *, normalize, implementation):
    (x,), (dim,) = args, dims
    if dim == x.ndim - 1:  # the batch axis must not be the transformed one
        x, dim = jnp.moveaxis(x, dim, 0), 0
    return fwht_p.bind(x, normalize=normalize, implementation=implementation), dim


batching.primitive_batchers[fwht_p] = _batch


def _transpose(cotangent, x, *, normalize, implementation):
    del x
    if type(cotangent) is ad.Zero:
        return [cotangent]
    return [fwht_p.bind(cotangent, normalize=normalize, implementation=implementation)]


ad.deflinear2(fwht_p, _transpose)


# Attributes JAX puts on an argument of the entry function that the caller donates.
_DONATION_ATTRIBUTES = ("tf.aliasing_output", "jax.buffer_donor")


def caller_keeps(value: ir.Value) -> bool:
    """Whether ``value`` is (a reshape of) an argument of the entry function that is not
    donated, so that its buffer stays the caller's and an in-place kernel would have XLA copy it
    first. False when unsure (an argument of a nested function, an operation's result).

    The lowering rule sees the entry function's arguments because it is registered with
    ``cacheable=False`` (a cacheable rule is lowered into a function of its own).
    """
    while isinstance(value, ir.OpResult) and value.owner.name == "stablehlo.reshape":
        value = value.owner.operands[0]
    if not isinstance(value, ir.BlockArgument):
        return False
    function = value.owner.owner.operation
    if function.name != "func.func" or ir.StringAttr(function.attributes["sym_name"]).value != (
        "main"
    ):
        return False
    if "arg_attrs" not in function.attributes:
        return True
    attributes = ir.DictAttr(ir.ArrayAttr(function.attributes["arg_attrs"])[value.arg_number])
    return not any(name in attributes for name in _DONATION_ATTRIBUTES)


def _lowering(platform: str):
    def rule(ctx, x, *, normalize, implementation):
        aval = ctx.avals_in[0]
        capability = cuda_capability() if platform == "cuda" else None
        chosen = resolve(
            implementation, platform, n=aval.shape[-1], dtype=aval.dtype, capability=capability
        )
        row_kernel = kernel(chosen)
        if chosen == "cpu" and caller_keeps(x):  # out of place: no copy of x first
            row_kernel = functools.partial(row_kernel, in_place=False)
        simulator = kernel_effects(chosen, tuple(aval.shape), aval.dtype, normalize)
        if explicit_spec(aval) is None and not simulator:
            transform = auto_per_shard(row_kernel, normalize)
        else:  # explicit axes; or ordered callbacks, which custom_partitioning cannot carry
            transform = per_shard(row_kernel, aval, normalize)
        return mlir.lower_fun(transform, multiple_results=False)(ctx, x)

    return rule


for _platform in ("cpu", "cuda", "rocm", "tpu"):
    mlir.register_lowering(fwht_p, _lowering(_platform), platform=_platform, cacheable=False)
mlir.register_lowering(fwht_p, _lowering("other"), cacheable=False)
