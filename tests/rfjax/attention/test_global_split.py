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
