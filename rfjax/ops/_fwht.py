"""The fast Walsh-Hadamard transform as a JAX primitive with several lowerings.

``fwht_p`` transforms the last axis of its operand. It is linear and symmetric (H^T = H), so its
JVP applies it to the tangent and its transpose applies it to the cotangent; its batching rule
keeps the batch axis in front of the transformed axis, so ``vmap`` calls the kernel once on the
batched array. All of this is JAX's public primitive API (``jax.extend.core.Primitive`` and
``jax.interpreters.{ad,batching,mlir}``): a custom call cannot be given forward- and
reverse-mode rules and a batching rule together otherwise (``custom_vjp`` has no JVP).

Lowering: the implementation (a backend of ``rfjax.ops._fwht_backends``, or ``"auto"``) is
resolved per platform when the primitive is lowered, and its kernel runs there; on a sharded
operand it runs per shard, under explicit and automatic mesh axes alike
(``rfjax.ops._partition``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jaxlib.mlir import ir

from rfjax._devices import cuda_capability
from rfjax.ops._fwht_backends import fwht_backend, resolve_fwht
from rfjax.ops._partition import auto_per_shard, explicit_spec, per_shard, requires_devices


@functools.cache
def kernel_effects(implementation: str, shape: tuple[int, ...], dtype, normalize: bool):
    """The effects of ``implementation``'s kernel on this operand (none but for simulators, which
    ``"auto"`` never picks)."""
    if implementation == "auto" or not fwht_backend(implementation).simulated:
        return frozenset()
    rows = fwht_backend(implementation).kernel()
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
        chosen = resolve_fwht(
            implementation, platform, n=aval.shape[-1], dtype=aval.dtype, capability=capability
        )
        backend = fwht_backend(chosen)
        row_kernel = backend.kernel()
        if backend.in_place and caller_keeps(x):  # out of place: no copy of x first
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
