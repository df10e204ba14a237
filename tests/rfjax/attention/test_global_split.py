"""Tests of ``rfjax.attention._global_split`` that need one device: whether an axis is bound by
an enclosing ``shard_map``, the errors for a sequence axis that names no Explicit mesh axis and
for a sequence split without one. Attention split over several devices is checked in
test_sequence_parallel.py."""

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from rfjax import attention, projections
from rfjax.attention import _global_split


def test_an_axis_is_bound_only_inside_a_shard_map_over_it():
    assert not _global_split.bound_by_shard_map("seq")
    mesh = jax.make_mesh((1,), ("seq",), axis_types=(AxisType.Auto,))
    seen = []

    def body(x):
        seen.append(_global_split.bound_by_shard_map("seq"))
        return x

    jax.shard_map(body, mesh=mesh, in_specs=P("seq"), out_specs=P("seq"))(jnp.ones(2))
    assert seen == [True]


def test_the_sequence_axis_must_be_an_explicit_axis_of_the_mesh_set():
    with pytest.raises(
        ValueError, match=r"sequence_axis='seq' names no mesh axis.*axes here: \(\)"
    ):
        _global_split.explicit_mesh_axis("seq")
    auto = jax.make_mesh((1,), ("seq",), axis_types=(AxisType.Auto,))
    with jax.set_mesh(auto), pytest.raises(ValueError, match="is an Auto axis of the mesh"):
        _global_split.explicit_mesh_axis("seq")
    explicit = jax.make_mesh((1,), ("seq",), axis_types=(AxisType.Explicit,))
    with jax.set_mesh(explicit):
        _global_split.explicit_mesh_axis("seq")  # accepted


def test_a_sequence_split_needs_the_sequence_axis_named():
    """Global arrays whose sequence is split over an Explicit axis, without sequence_axis: a
    ValueError naming the axis to pass (a sharding error from inside the scans before)."""
    explicit = jax.make_mesh((1,), ("seq",), axis_types=(AxisType.Explicit,))
    q = jax.device_put(jnp.ones((2, 8, 2, 4)), NamedSharding(explicit, P(None, "seq")))
    w = projections.gaussian(jax.random.key(0), 4, 8)
    for causal in (False, True):
        with pytest.raises(
            ValueError, match=r"sequence .* of query is split .*sequence_axis='seq'"
        ):
            attention.favor_attention(q, q, q, w, causal=causal)
    unsplit = jax.device_put(jnp.ones((2, 8, 2, 4)), NamedSharding(explicit, P("seq")))
    out = attention.favor_attention(unsplit, unsplit, unsplit, w, causal=True)
    assert jax.typeof(out).sharding.spec[0] == "seq"  # data parallel: split as the query


def _placed(mesh: jax.sharding.Mesh, specs: dict[str, P]) -> dict[str, jax.Array]:
    """(2, 8, 2, 4) query, key and value, each placed on ``mesh`` as ``specs`` says."""
    arrays = jax.random.normal(jax.random.key(1), (3, 2, 8, 2, 4))
    return {
        name: jax.device_put(x, NamedSharding(mesh, specs[name]))
        for name, x in zip(("query", "key", "value"), arrays, strict=True)
    }


def test_the_sequence_split_over_more_axes_or_a_split_key_vector_is_rejected():
    """The sequence must be split over the sequence axis alone (not with another axis: the
    prefix would combine only the sequence axis' shards), and the key's H, like the query's,
    must not be split (the features read whole vectors)."""
    mesh = jax.make_mesh((1, 1), ("seq", "model"), axis_types=(AxisType.Explicit,) * 2)
    w = projections.gaussian(jax.random.key(0), 4, 8)
    split, both = P(None, "seq"), P(None, ("seq", "model"))
    cases = {
        r"must split the sequence \(dimension 1\) of query alone": dict(query=both),
        r"last dimension \(H\) of key must not be split": dict(key=P(None, "seq", None, "model")),
    }
    with jax.set_mesh(mesh):
        for message, wrong in cases.items():
            arrays = _placed(mesh, dict(query=split, key=split, value=split) | wrong)
            with pytest.raises(ValueError, match=message):
                attention.favor_attention(*arrays.values(), w, sequence_axis="seq")


def test_a_split_value_vector_and_an_unmasked_unfitted_map_on_global_arrays():
    """The output is split as the query but for its last dimension, split as the value's (each
    output column reads its own value column); an unfitted OPRF without a mask is fitted to
    every key, as on one device."""
    mesh = jax.make_mesh((1, 1), ("seq", "model"), axis_types=(AxisType.Explicit,) * 2)
    w = projections.gaussian(jax.random.key(0), 4, 8)
    split = P(None, "seq")
    arrays = _placed(mesh, dict(query=split, key=split, value=P(None, "seq", None, "model")))
    unsplit = [jax.device_put(x, NamedSharding(mesh, P())) for x in arrays.values()]
    favor = jax.jit(attention.favor_attention, static_argnames=("feature_map", "sequence_axis"))
    with jax.set_mesh(mesh):
        got = favor(*arrays.values(), w, feature_map="oprf", sequence_axis="seq")
        assert jax.typeof(got).sharding.spec == P(None, "seq", None, "model")
        want = favor(*unsplit, w, feature_map="oprf")
    assert jnp.allclose(got, want, rtol=1e-6, atol=1e-6)
