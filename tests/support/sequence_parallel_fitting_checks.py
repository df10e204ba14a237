"""Sequence-parallel FAVOR with data-fitted maps given unfitted (OPRF, DERF, SADERF: fitted to the
current inputs), on 4 forced CPU devices, for
``tests/rfjax/attention/test_sequence_parallel_fitting.py``; run as a script in a process of its own
(XLA_FLAGS must set the device count before jax is imported):

  XLA_FLAGS=--xla_force_host_platform_device_count=4 \
    python tests/support/sequence_parallel_fitting_checks.py

Prints one JSON object: per map, the relative errors of the sharded bidirectional outputs and
gradients against one device (``favor_attention`` with a padding mask, in ``shard_map`` and on
global arrays split over Explicit "data" x "seq" axes), and of
``rfjax.nn.nnx.PerformerAttention(sequence_axis=...)`` and ``rfjax.nn.PerformerAttention``
against the same layer unsharded.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from rfjax import attention, features, nn, projections

DEVICES = 4
AXIS = "seq"
BATCH, LENGTH, HEADS, HEAD_DIM, VALUE_DIM, NUM_FEATURES = 2, 64, 2, 8, 4, 16
SPLIT = P(None, AXIS)  # (B, T, ...) split along T


def data_fitted_maps() -> list[str]:
    """Every registered map that is fitted to data and still unfitted after ``init``."""
    return [
        name
        for name in features.available()
        if any(
            getattr(features.get(name)().init(jax.random.key(0), HEAD_DIM), field) is None
            for field in features.get(name)().fitted_fields
        )
    ]


def relative_error(got, expected) -> float:
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    return float(np.max(np.abs(got - expected)) / np.max(np.abs(expected)))


def split(mesh, *arrays):
    return tuple(jax.device_put(x, NamedSharding(mesh, SPLIT)) for x in arrays)


def inputs():
    """Queries, keys and values (BTNH, float32) whose statistics differ between the devices
    (each quarter of the sequence has its own scale and offset), and a padding mask with NaN
    in the masked keys (the statistics must leave them out)."""
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    shape = (BATCH, LENGTH, HEADS, HEAD_DIM)
    quarter = jnp.arange(LENGTH) // (LENGTH // DEVICES)
    scale = (0.5 + 0.5 * quarter)[None, :, None, None]
    q = scale * jax.random.normal(kq, shape) + 0.3 * quarter[None, :, None, None]
    k = scale * jax.random.normal(kk, shape) - 0.2 * quarter[None, :, None, None]
    v = jax.random.normal(kv, (BATCH, LENGTH, HEADS, VALUE_DIM))
    positions = jnp.arange(LENGTH)
    mask = jnp.stack([positions % 5 != 3, (positions < 20) | (positions >= 27)])
    k = jnp.where(mask[:, :, None, None], k, jnp.nan)
    return q, k, v, mask


def few_keys_mask() -> jax.Array:
    """Two keys in all (batch row 0, devices 0 and 2), fewer than the devices: the counts
    pooled over the mesh, not averaged, keep the means of the statistics those of two keys."""
    positions = jnp.arange(LENGTH)
    return jnp.stack([(positions == 5) | (positions == 40), jnp.zeros(LENGTH, bool)])


def favor_errors(
    name: str, mesh, global_arrays: bool = False, mask: jax.Array | None = None
) -> dict[str, float]:
    projection = projections.orthogonal(jax.random.key(1), HEAD_DIM, NUM_FEATURES)

    def run(axis):
        def attend(q, k, v, mask):
            return attention.favor_attention(
                q, k, v, projection, feature_map=name, mask=mask, sequence_axis=axis
            )

        def with_output(q, k, v, mask):
            out = attend(q, k, v, mask)
            return jnp.sum(jnp.sin(3.0 * out)), out

        grad = jax.grad(with_output, argnums=(0, 1, 2), has_aux=True)
        return lambda *args: grad(*args)[::-1]

    q, k, v, all_keys = inputs()
    mask = all_keys if mask is None else mask & all_keys
    expected = jax.jit(run(None))(q, k, v, mask)
    if global_arrays:  # batch over "data", sequence over AXIS; favor_attention splits itself
        explicit = jax.make_mesh((2, 2), ("data", AXIS), axis_types=(AxisType.Explicit,) * 2)
        with jax.set_mesh(explicit):
            placed = [
                jax.device_put(x, NamedSharding(explicit, P("data", AXIS))) for x in (q, k, v, mask)
            ]
            got = jax.jit(run(AXIS))(*placed)
    else:
        many = jax.shard_map(run(AXIS), mesh=mesh, in_specs=SPLIT, out_specs=SPLIT)
        with jax.set_mesh(mesh):
            got = jax.jit(many)(*split(mesh, q, k, v, mask))
    names = ("output", "grad_query", "grad_key", "grad_value")
    return {
        n: relative_error(g, e)
        for n, g, e in zip(names, jax.tree.leaves(got), jax.tree.leaves(expected), strict=True)
    }


def nnx_layer_error(name: str, mesh) -> float:
    from flax import nnx

    from rfjax.nn import nnx as rnnx

    tokens = jax.random.normal(jax.random.key(7), (BATCH, LENGTH, 16))
    tokens = tokens * (1.0 + jnp.arange(LENGTH) // (LENGTH // DEVICES))[None, :, None]

    def layer(sequence_axis):
        return rnnx.PerformerAttention(
            2,
            16,
            num_features=16,
            feature_map=name,
            sequence_axis=sequence_axis,
            rngs=nnx.Rngs(8),
        )

    expected = jax.jit(lambda x: layer(None)(x))(tokens)
    graphdef, state = nnx.split(layer(AXIS))

    def local(state, x):
        return nnx.merge(graphdef, state)(x)

    many = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), SPLIT), out_specs=SPLIT))
    return relative_error(many(state, *split(mesh, tokens)), expected)


def linen_layer_error(name: str, mesh) -> float:
    tokens = jax.random.normal(jax.random.key(4), (BATCH, LENGTH, 16))
    tokens = tokens * (1.0 + jnp.arange(LENGTH) // (LENGTH // DEVICES))[None, :, None]
    layer = lambda **kw: nn.PerformerAttention(  # noqa: E731
        num_heads=2, num_features=16, feature_map=name, **kw
    )
    rngs = {"projection": jax.random.key(5)}
    params = jax.jit(layer().init)({"params": jax.random.key(6)}, tokens)
    expected = jax.jit(lambda p, x: layer().apply(p, x, rngs=rngs))(params, tokens)

    def local(params, x):
        return layer(sequence_axis=AXIS).apply(params, x, rngs=rngs)

    many = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), SPLIT), out_specs=SPLIT))
    return relative_error(many(params, *split(mesh, tokens)), expected)


def main() -> None:
    assert jax.device_count() == DEVICES, jax.devices()
    mesh = jax.make_mesh((DEVICES,), (AXIS,))
    names = data_fitted_maps()
    report = {
        "maps": names,
        "favor": {name: favor_errors(name, mesh) for name in names},
        "favor_global": {name: favor_errors(name, mesh, global_arrays=True) for name in names},
        "favor_few_keys": favor_errors("oprf", mesh, mask=few_keys_mask()),
        "nnx": {name: nnx_layer_error(name, mesh) for name in names},
        "linen": {name: linen_layer_error(name, mesh) for name in ("oprf", "saderf")},
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
