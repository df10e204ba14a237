"""Measurements of sequence-parallel FAVOR on 4 forced CPU devices, for
``tests/rfjax/attention/test_sequence_parallel.py``; run as a script in a process of its own
(XLA_FLAGS must set the device count before jax is imported):

  XLA_FLAGS=--xla_force_host_platform_device_count=4 \\
    python tests/support/sequence_parallel_checks.py

Prints one JSON object: per case, the relative errors of the sharded outputs and gradients
against one device, the outputs of earlier devices after later tokens change, the compiled
memory per device, and the Performer layer's sharded output against its unsharded one.
"""

from __future__ import annotations

import functools
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


def mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((DEVICES,), (AXIS,))


def inputs(seed: int, scale: float = 1.0) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Queries and keys with entries N(0, scale^2), values N(0, 1) (BTNH, float32)."""
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    shape = (BATCH, LENGTH, HEADS, HEAD_DIM)
    return (
        scale * jax.random.normal(kq, shape),
        scale * jax.random.normal(kk, shape),
        jax.random.normal(kv, (BATCH, LENGTH, HEADS, VALUE_DIM)),
    )


def padding_mask() -> jax.Array:
    """Batch 0: device 1's keys all masked; batch 1: a masked run across devices 2 and 3."""
    positions = jnp.arange(LENGTH)
    quarter = LENGTH // DEVICES
    first = (positions < quarter) | (positions >= 2 * quarter)
    second = (positions < 2 * quarter + 5) | (positions >= 3 * quarter + 7)
    return jnp.stack([first, second])


def garbage_in_masked_keys(key, value, mask):
    """NaN and inf where the mask is False: they must reach no output."""
    hidden = ~mask[:, :, None, None]
    return jnp.where(hidden, jnp.nan, key), jnp.where(hidden, jnp.inf, value)


def relative_error(got, expected) -> float:
    got, expected = np.asarray(got, np.float64), np.asarray(expected, np.float64)
    return float(np.max(np.abs(got - expected)) / np.max(np.abs(expected)))


def sharded(fn, mesh_):
    """``fn(q, k, v, mask)`` on local shards, as one jitted ``shard_map`` over the mesh."""
    return jax.jit(jax.shard_map(fn, mesh=mesh_, in_specs=SPLIT, out_specs=SPLIT))


def split(mesh_, *arrays):
    return tuple(jax.device_put(x, NamedSharding(mesh_, SPLIT)) for x in arrays)


def fitted_dense_exponential() -> features.FeatureMap:
    """FAVOR#'s asymmetric DERF, fitted on a calibration sample (causal attention needs a
    fitted map): one of the maps that keep a key shift per feature in causal attention."""
    fmap = features.get("derf_asymmetric")().init(jax.random.key(4), HEAD_DIM)
    q, k, _ = inputs(9)
    return fmap.fit(jax.random.key(5), q.reshape(-1, HEAD_DIM), k.reshape(-1, HEAD_DIM))


CASES = {
    # name: (favor_attention keywords, padding mask, scale of queries and keys)
    "bidirectional_positive_mask": (dict(causal=False), True, 1.0),
    # chunk 12 over shards of 16 positions: a chunk is cut at each shard's end.
    "causal_positive_mask": (dict(causal=True, chunk_size=12), True, 1.0),
    # A signed map, one projection per head, bounded scores (as the map's docstring asks: with
    # unbounded ones a row's estimated normaliser nears 0 and even one device's float32
    # gradient is off its float64 value by O(1)).
    "causal_trigonometric_per_head": (
        dict(causal=True, feature_map="trigonometric", per_head=True, eps=1e-3, chunk_size=8),
        False,
        0.5,
    ),
    # Queries and keys 12x larger: the positive features' logs lie near -100 on every device,
    # so device 0's earlier shift must be the log floor (a shift of 0 underflows them).
    "causal_positive_large_keys": (dict(causal=True, chunk_size=12), True, 12.0),
    # Per-feature key shifts across devices (sequence_parallel_feature_prefix), chunk 12 again.
    "causal_derf_asymmetric_mask": (
        dict(causal=True, feature_map=fitted_dense_exponential(), chunk_size=12),
        True,
        1.0,
    ),
}


def favor(options: dict, sequence_axis: str | None):
    options = dict(options)
    if options.pop("per_head", False):
        projection = attention.draw_projection(
            jax.random.key(1), HEAD_DIM, NUM_FEATURES, num_heads=HEADS
        )
    else:
        projection = projections.orthogonal(jax.random.key(1), HEAD_DIM, NUM_FEATURES)

    def run(q, k, v, mask):
        return attention.favor_attention(
            q, k, v, projection, mask=mask, sequence_axis=sequence_axis, **options
        )

    return run


def loss(run):
    """A loss whose cotangent differs per output element (sum would hide errors)."""
    return lambda q, k, v, mask: jnp.sum(jnp.sin(3.0 * run(q, k, v, mask)))


def output_and_gradients(run):
    """(output, gradients for q, k, v of ``loss``) in one jitted function."""

    def with_output(q, k, v, mask):
        out = run(q, k, v, mask)
        return jnp.sum(jnp.sin(3.0 * out)), out

    grad = jax.grad(with_output, argnums=(0, 1, 2), has_aux=True)
    return jax.jit(lambda *args: grad(*args)[::-1])


def case_inputs(masked: bool, scale: float) -> tuple[jax.Array, ...]:
    q, k, v = inputs(0, scale)
    mask = padding_mask() if masked else jnp.ones((BATCH, LENGTH), bool)
    if masked:
        k, v = garbage_in_masked_keys(k, v, mask)
    return q, k, v, mask


def errors_against(got, expected) -> dict[str, float]:
    """Relative errors of (output, gradients) against one device's; NaN (a failure) if either
    is not finite."""
    names = ("output", "grad_query", "grad_key", "grad_value")
    return {
        name: relative_error(g, e)
        for name, g, e in zip(names, jax.tree.leaves(got), jax.tree.leaves(expected), strict=True)
    }


def case_errors(options: dict, masked: bool, scale: float) -> dict[str, float]:
    mesh_ = mesh()
    q, k, v, mask = case_inputs(masked, scale)
    expected = output_and_gradients(favor(options, None))(q, k, v, mask)
    many = jax.shard_map(favor(options, AXIS), mesh=mesh_, in_specs=SPLIT, out_specs=SPLIT)
    with jax.set_mesh(mesh_):
        got = output_and_gradients(many)(*split(mesh_, q, k, v, mask))
    return errors_against(got, expected)


# Global arrays under jax.set_mesh with Explicit axes: favor_attention(..., sequence_axis=) runs
# the shard_map itself, keeping a batch or head split over another axis. name: (case of CASES
# or favor_attention keywords, the other axis, what it splits).
GLOBAL_CASES = {
    **{f"{name}_batch_over_data": (name, "data", "batch") for name in CASES},
    "causal_trigonometric_per_head_heads_over_model": (
        "causal_trigonometric_per_head",
        "model",
        "heads",
    ),
    # An unfitted data-fitted map: fitted to the statistics of the whole batch and sequence
    # (one device's), per head.
    "bidirectional_oprf_unfitted_mask": (dict(causal=False, feature_map="oprf"), "data", "batch"),
    "bidirectional_oprf_unfitted_heads_over_model": (
        dict(causal=False, feature_map="oprf"),
        "model",
        "heads",
    ),
}


def global_case_errors(case: str | dict, other_axis: str, splits: str) -> dict[str, float]:
    options, masked, scale = CASES[case] if isinstance(case, str) else (case, True, 1.0)
    q, k, v, mask = case_inputs(masked, scale)
    expected = output_and_gradients(favor(options, None))(q, k, v, mask)
    explicit = jax.make_mesh((2, 2), (other_axis, AXIS), axis_types=(AxisType.Explicit,) * 2)
    spec = P(other_axis, AXIS) if splits == "batch" else P(None, AXIS, other_axis)
    mask_spec = P(other_axis, AXIS) if splits == "batch" else P(None, AXIS)
    with jax.set_mesh(explicit):
        placed = [jax.device_put(x, NamedSharding(explicit, spec)) for x in (q, k, v)]
        placed.append(jax.device_put(mask, NamedSharding(explicit, mask_spec)))
        got = output_and_gradients(favor(options, AXIS))(*placed)
        out_spec = tuple(jax.typeof(got[0]).sharding.spec)
        assert out_spec == (*spec, None, None)[:4], jax.typeof(got[0])  # split as the query
    return errors_against(got, expected)


def later_device_perturbations() -> dict[str, dict[str, int]]:
    """Causal outputs per device after the tokens of one later device change (large keys raise
    the running key maximum), or the last device's values are so large that its state
    overflows: the number of changed output elements per device."""
    mesh_ = mesh()
    quarter = LENGTH // DEVICES
    q, k, v = inputs(2)
    noise = inputs(3, scale=3.0)
    mask = jnp.ones((BATCH, LENGTH), bool)
    result = {}
    for name, options in (
        ("positive", dict(causal=True, chunk_size=8)),
        ("relu", dict(causal=True, chunk_size=8, feature_map="relu")),
        (
            "derf_asymmetric",
            dict(causal=True, chunk_size=8, feature_map=fitted_dense_exponential()),
        ),
    ):
        run = sharded(favor(options, AXIS), mesh_)
        before = np.asarray(run(*split(mesh_, q, k, v, mask)))
        for device in (DEVICES - 1, 1):
            on_device = (jnp.arange(LENGTH) // quarter == device)[None, :, None, None]
            changed = [
                jnp.where(on_device, x + 10.0 * n, x) for x, n in zip((q, k, v), noise, strict=True)
            ]
            after = np.asarray(run(*split(mesh_, *changed, mask)))
            differs = (before != after).reshape(BATCH, DEVICES, quarter, -1)
            result[f"{name}_perturb_device_{device}"] = differs.sum(axis=(0, 2, 3)).tolist()
        # Finite values whose sums overflow: the last device's state is inf, and 0 times it
        # would be NaN on every earlier device.
        on_last = (jnp.arange(LENGTH) // quarter == DEVICES - 1)[None, :, None, None]
        huge = jnp.where(on_last, jnp.finfo(v.dtype).max, v)
        after = np.asarray(run(*split(mesh_, q, k, huge, mask)))
        differs = (before != after).reshape(BATCH, DEVICES, quarter, -1)
        result[f"{name}_overflow_device_{DEVICES - 1}"] = differs.sum(axis=(0, 2, 3)).tolist()
    return result


def non_finite_rows() -> dict[str, list[int]]:
    """Rows per device with a non-finite output when one unmasked key on device 1 is NaN: the
    rows that attend to it (all rows bidirectional; rows from it on, causal)."""
    mesh_ = mesh()
    quarter = LENGTH // DEVICES
    q, k, v = inputs(5)
    k = k.at[:, quarter + 3].set(jnp.nan)
    mask = jnp.ones((BATCH, LENGTH), bool)
    result = {}
    for mode, options in (("bidirectional", dict(causal=False)), ("causal", dict(causal=True))):
        out = sharded(favor(options, AXIS), mesh_)(*split(mesh_, q, k, v, mask))
        rows = ~np.all(np.isfinite(np.asarray(out)), axis=(2, 3))  # (B, T)
        result[mode] = rows.reshape(BATCH, DEVICES, quarter).sum(axis=(0, 2)).tolist()
    return result


def compiled_bytes(fn, *arg_shapes) -> int:
    """Arguments + outputs + temporaries of one device's program (XLA's memory analysis)."""
    analysis = jax.jit(fn).lower(*arg_shapes).compile().memory_analysis()
    return int(
        analysis.argument_size_in_bytes
        + analysis.output_size_in_bytes
        + analysis.temp_size_in_bytes
    )


def memory_per_device(length: int) -> dict[str, dict[str, dict[str, int]]]:
    """Compiled bytes per device of the forward pass and of the gradient (forward and backward)
    of (1, T, 4, 64) inputs with m = 128: on one device at T = ``length`` and at T / D, and per
    device of the mesh at T = ``length``; by mode, then pass."""
    mesh_ = mesh()
    projection = projections.orthogonal(jax.random.key(1), 64, 128)

    def shapes(length: int, sharding=None) -> list[jax.ShapeDtypeStruct]:
        qkv = jax.ShapeDtypeStruct((1, length, 4, 64), jnp.float32, sharding=sharding)
        return [qkv, qkv, qkv, jax.ShapeDtypeStruct((1, length), jnp.bool_, sharding=sharding)]

    passes = {"forward": lambda fn: fn, "gradient": lambda fn: jax.grad(loss(fn), (0, 1, 2))}
    # The per-feature key shifts (sequence_parallel_feature_prefix): DERF fitted to N(0, I) inputs.
    sample = jax.random.normal(jax.random.key(2), (2, 512, 64))
    per_feature = features.get("derf_asymmetric")().fit(jax.random.key(3), *sample)
    modes = {
        "bidirectional": dict(causal=False),
        "causal": dict(causal=True),
        "causal_per_key": dict(causal=True, feature_map="relu"),
        "causal_per_feature": dict(causal=True, feature_map=per_feature),
    }
    result = {}
    for mode_name, options in modes.items():

        def run(q, k, v, mask, axis, options=options):
            return attention.favor_attention(
                q, k, v, projection, mask=mask, sequence_axis=axis, **options
            )

        one = functools.partial(run, axis=None)
        many = jax.shard_map(
            functools.partial(run, axis=AXIS), mesh=mesh_, in_specs=SPLIT, out_specs=SPLIT
        )
        mode = result.setdefault(mode_name, {})
        for name, wrap in passes.items():
            with jax.set_mesh(mesh_):
                per_device = compiled_bytes(
                    wrap(many), *shapes(length, NamedSharding(mesh_, SPLIT))
                )
            mode[name] = {
                "one_device": compiled_bytes(wrap(one), *shapes(length)),
                "one_device_at_length_over_devices": compiled_bytes(
                    wrap(one), *shapes(length // DEVICES)
                ),
                "per_device": per_device,
            }
    return result


def performer_layer(global_arrays: bool = False) -> float:
    """Relative error of causal ``rfjax.nn.PerformerAttention(sequence_axis=...)`` in
    ``shard_map``, or called on global tokens split over an Explicit axis, against the layer
    without it (same parameters and projection key)."""
    mesh_ = mesh()
    tokens = jax.random.normal(jax.random.key(4), (BATCH, LENGTH, 16))
    layer = functools.partial(nn.PerformerAttention, num_heads=2, num_features=16, causal=True)
    rngs = {"projection": jax.random.key(5)}
    params = jax.jit(layer().init)({"params": jax.random.key(6)}, tokens)
    expected = jax.jit(functools.partial(layer().apply, rngs=rngs))(params, tokens)
    if global_arrays:
        explicit = jax.make_mesh((DEVICES,), (AXIS,), axis_types=(AxisType.Explicit,))
        with jax.set_mesh(explicit):
            split_tokens = jax.device_put(tokens, NamedSharding(explicit, SPLIT))
            apply = functools.partial(layer(sequence_axis=AXIS).apply, rngs=rngs)
            return relative_error(jax.jit(apply)(params, split_tokens), expected)

    def local(params, x):
        return layer(sequence_axis=AXIS).apply(params, x, rngs=rngs)

    many = jax.jit(jax.shard_map(local, mesh=mesh_, in_specs=(P(), SPLIT), out_specs=SPLIT))
    return relative_error(many(params, *split(mesh_, tokens)), expected)


def performer_nnx_layer(global_arrays: bool = False) -> float:
    """Relative error of causal ``rfjax.nn.nnx.PerformerAttention(sequence_axis=...)`` in
    ``shard_map`` (state split outside, replicated, merged inside), or called on global tokens
    split over an Explicit axis, against the same layer without it (the same state)."""
    from flax import nnx

    from rfjax.nn import nnx as rnnx

    mesh_ = mesh()
    tokens = jax.random.normal(jax.random.key(7), (BATCH, LENGTH, 16))

    def layer(sequence_axis):
        return rnnx.PerformerAttention(
            2, 16, num_features=16, causal=True, sequence_axis=sequence_axis, rngs=nnx.Rngs(8)
        )

    expected = jax.jit(lambda x: layer(None)(x))(tokens)
    if global_arrays:  # the layer called on the global tokens split over an Explicit axis
        explicit = jax.make_mesh((DEVICES,), (AXIS,), axis_types=(AxisType.Explicit,))
        with jax.set_mesh(explicit):
            split_tokens = jax.device_put(tokens, NamedSharding(explicit, SPLIT))
            return relative_error(nnx.jit(lambda m, x: m(x))(layer(AXIS), split_tokens), expected)
    graphdef, state = nnx.split(layer(AXIS))

    def local(state, x):
        return nnx.merge(graphdef, state)(x)

    many = jax.jit(jax.shard_map(local, mesh=mesh_, in_specs=(P(), SPLIT), out_specs=SPLIT))
    return relative_error(many(state, *split(mesh_, tokens)), expected)


def data_parallel_errors(causal: bool) -> dict[str, float]:
    """FAVOR inside ``shard_map`` with the batch split over ``BATCH`` devices, no
    ``sequence_axis`` and the projection replicated (data parallelism): relative errors of the
    output and the gradients of the projection (summed over the devices), q, k and v against
    one program's."""
    devices = np.array(jax.devices()[:BATCH])
    data = jax.sharding.Mesh(devices, ("data",), axis_types=(AxisType.Auto,))
    projection = projections.orthogonal(jax.random.key(1), HEAD_DIM, NUM_FEATURES).matrix()

    def attend(projection, q, k, v):
        return attention.favor_attention(q, k, v, projection, causal=causal)

    rows = P("data")
    split = jax.shard_map(attend, mesh=data, in_specs=(P(), rows, rows, rows), out_specs=rows)

    def output_and_gradients(fn):
        def with_output(*args):
            out = fn(*args)
            return jnp.sum(jnp.sin(3.0 * out)), out

        grad = jax.grad(with_output, argnums=(0, 1, 2, 3), has_aux=True)
        return jax.jit(grad)(projection, *inputs(0))

    (got, got_out), (want, want_out) = output_and_gradients(split), output_and_gradients(attend)
    names = ("grad_projection", "grad_query", "grad_key", "grad_value")
    errors = {name: relative_error(g, w) for name, g, w in zip(names, got, want, strict=True)}
    return errors | {"output": relative_error(got_out, want_out)}


# Global arrays split over jax.make_mesh's default (Explicit) axis, no sequence_axis: data
# parallelism as jax.device_put leaves it (favor_attention runs the shard_map itself; causal
# FAVOR raised and bidirectional under jax.set_mesh did, until 2026-12-01). name: (options,
# the split of q, k and v, the mask's).
GLOBAL_DATA_PARALLEL = {
    "causal_positive_batch": (dict(causal=True), P("data"), P("data")),
    "bidirectional_oprf_unfitted_batch": (dict(feature_map="oprf"), P("data"), P("data")),
    "causal_positive_heads": (dict(causal=True), P(None, None, "data"), P()),
}


def global_data_parallel_errors(options: dict, spec: P, mask_spec: P) -> dict[str, float]:
    """Output and gradients under ``jax.set_mesh``, and the output of an eager call without
    it, against one device's."""
    q, k, v, mask = case_inputs(True, 1.0)
    expected = output_and_gradients(favor(options, None))(q, k, v, mask)
    explicit = jax.make_mesh((BATCH,), ("data",), devices=jax.devices()[:BATCH])
    placed = [jax.device_put(x, NamedSharding(explicit, spec)) for x in (q, k, v)]
    placed.append(jax.device_put(mask, NamedSharding(explicit, mask_spec)))
    eager = favor(options, None)(*placed)
    with jax.set_mesh(explicit):
        got = output_and_gradients(favor(options, None))(*placed)
    return errors_against(got, expected) | {"output_eager": relative_error(eager, expected[0])}


def main() -> None:
    assert jax.device_count() == DEVICES, jax.devices()
    report = {
        "cases": {name: case_errors(*case) for name, case in CASES.items()},
        "global_cases": {name: global_case_errors(*case) for name, case in GLOBAL_CASES.items()},
        "perturbations": later_device_perturbations(),
        "non_finite_rows": non_finite_rows(),
        "data_parallel": {
            mode: data_parallel_errors(mode == "causal") for mode in ("causal", "bidirectional")
        },
        "data_parallel_global": {
            name: global_data_parallel_errors(*case) for name, case in GLOBAL_DATA_PARALLEL.items()
        },
        "memory": memory_per_device(4096),
        "performer": performer_layer(),
        "performer_global": performer_layer(global_arrays=True),
        "performer_nnx": performer_nnx_layer(),
        "performer_nnx_global": performer_nnx_layer(global_arrays=True),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
