"""OPRF/DERF in FAVOR attention: statistics from the current queries and keys (bidirectional),
from a calibration sample (causal, which keeps causality), masked keys left out; and in
``rfjax.nn.PerformerAttention``."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from rfjax import attention, features, projections
from rfjax.attention import PerHead, _data_fitted
from rfjax.nn import PerformerAttention
from tests.support.compiled import jitted

B, T, N, H, M = 2, 12, 3, 4, 16
DATA_FITTED = ("oprf", "derf_asymmetric", "derf_symmetric", "saderf")


def _qkv(key=0):
    return 0.8 * jax.random.normal(jax.random.key(key), (3, B, T, N, H))


@functools.partial(jax.jit, static_argnums=0)
def _fitted_per_head(name, query, key):
    """The map fitted per head by hand: normalised by H^{-1/4}, pooled over the batch (and the
    sequence, whose length may differ between ``query`` and ``key``)."""
    scale = H**-0.25
    heads_q, heads_k = (jnp.moveaxis(x * scale, 2, 0).reshape(N, -1, H) for x in (query, key))
    template = features.get(name)()
    return PerHead(jax.vmap(lambda q, k: template.fit(jax.random.key(0), q, k))(heads_q, heads_k))


@pytest.mark.parametrize("name", DATA_FITTED)
def test_bidirectional_attention_fits_the_map_to_the_current_inputs(name):
    q, k, v = _qkv()
    w = projections.orthogonal(jax.random.key(1), H, M)
    favor = jitted(attention.favor_attention)
    by_name = favor(q, k, v, w, feature_map=name)
    by_hand = favor(q, k, v, w, feature_map=_fitted_per_head(name, q, k))
    np.testing.assert_allclose(by_name, by_hand, rtol=2e-5, atol=1e-6)
    # It differs from FAVOR+ (which the unfitted map would be).
    plain = favor(q, k, v, w, feature_map="positive")
    assert float(jnp.max(jnp.abs(by_name - plain))) > 1e-3


@pytest.mark.parametrize("name", ["oprf", "saderf"])
def test_attention_weights_fit_the_map_as_favor_attention_does(name):
    # Issue 16: the explicit weights used to treat an unfitted map as FAVOR+. Masked keys
    # stay out of their fit too.
    q, k, v = _qkv()
    w = projections.orthogonal(jax.random.key(1), H, M)
    mask = jnp.tile(jnp.arange(T) < T - 4, (B, 1))
    favor_weights = jitted(attention.favor_attention_weights)
    weights = favor_weights(q, k, w, feature_map=name, mask=mask)
    fitted = _fitted_per_head(name, q, k[:, : T - 4])
    by_hand = favor_weights(q, k, w, feature_map=fitted, mask=mask)
    np.testing.assert_allclose(weights, by_hand, rtol=2e-5, atol=1e-6)
    applied = jnp.einsum("bnts,bsnh->btnh", weights, v)
    out = jitted(attention.favor_attention)(q, k, v, w, feature_map=name, mask=mask)
    np.testing.assert_allclose(applied, out, rtol=2e-4, atol=1e-5)


def test_causal_weights_and_decoding_reject_an_unfitted_map():
    q, k, v = _qkv()
    w = projections.orthogonal(jax.random.key(1), H, M)
    with pytest.raises(ValueError, match=r"feature_map OptimizedPositiveFeatureMap .*calibration"):
        attention.favor_attention_weights(q, k, w, feature_map="oprf", causal=True)
    with pytest.raises(ValueError, match=r"feature_map DenseExponentialFeatureMap .*calibration"):
        attention.favor_decode_init(B, N, H, w, feature_map="saderf")
    fitted = _fitted_per_head("saderf", q, k)
    state = attention.favor_decode_init(B, N, H, w, feature_map=fitted)
    with pytest.raises(ValueError, match=r"feature_map DenseExponentialFeatureMap .*calibration"):
        attention.favor_decode_step(state, q[:, 0], k[:, 0], v[:, 0], w, feature_map="saderf")
    # The fitted map decodes position 0 as causal attention does.
    step = jitted(attention.favor_decode_step)
    _, out = step(state, q[:, 0], k[:, 0], v[:, 0], w, feature_map=fitted)
    full = jitted(attention.favor_attention)(q, k, v, w, feature_map=fitted, causal=True)
    np.testing.assert_allclose(out, full[:, 0], rtol=1e-5, atol=1e-6)


def test_a_pair_with_an_unfitted_side_is_refused_and_a_fitted_pair_attends_as_its_map():
    # A pair's data-fitted side stayed unfitted (plain FAVOR+) without a word: the pair's
    # default fit fitted nothing, and attention did not see the unfitted side.
    q, k, v = _qkv()
    w = projections.orthogonal(jax.random.key(1), H, M)
    oprf = features.get("oprf")()
    pair = features.FeatureMapPair(oprf, oprf)
    for causal in (False, True):
        with pytest.raises(ValueError, match=r"FeatureMapPair .*calibration sample"):
            attention.favor_attention(q, k, v, w, feature_map=pair, causal=causal)
    sample_q, sample_k = (H**-0.25 * x.reshape(-1, H) for x in (q, k))
    fitted = pair.fit(jax.random.key(2), sample_q, sample_k)
    alone = oprf.fit(jax.random.key(3), sample_q, sample_k)
    for side in (fitted.query, fitted.key):
        np.testing.assert_array_equal(side.statistics.query_mean, alone.statistics.query_mean)
    favor = jitted(attention.favor_attention)
    np.testing.assert_array_equal(
        favor(q, k, v, w, feature_map=fitted), favor(q, k, v, w, feature_map=alone)
    )


@pytest.mark.parametrize("name", ["oprf", "derf_asymmetric"])
def test_the_statistics_are_means_over_the_unmasked_keys_only(name):
    # More queries than unmasked keys: the query sums divided by the key count (or the
    # reverse) went unseen while every key was unmasked.
    q, k, v = _qkv()
    w = projections.gaussian(jax.random.key(1), H, M)
    mask = jnp.tile(jnp.arange(T) < T - 4, (B, 1))
    favor = jitted(attention.favor_attention)
    by_name = favor(q, k, v, w, feature_map=name, mask=mask)
    by_hand = favor(q, k, v, w, feature_map=_fitted_per_head(name, q, k[:, : T - 4]), mask=mask)
    np.testing.assert_allclose(by_name, by_hand, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("name", DATA_FITTED)
def test_every_key_masked_gives_zero_outputs_as_favor_plus_does(name):
    # No key counted: the statistics' means divide by a count of at least 1 (0/0 was NaN).
    q, k, v = _qkv()
    w = projections.gaussian(jax.random.key(1), H, M)
    none = jnp.zeros((B, T), bool)
    np.testing.assert_array_equal(
        jitted(attention.favor_attention)(q, k, v, w, feature_map=name, mask=none), 0.0
    )


def test_low_precision_inputs_are_fitted_in_the_computation_dtype():
    q, k, _ = _qkv()
    q, k = q.astype(jnp.bfloat16), k.astype(jnp.bfloat16)
    mask = jnp.ones((B, T), bool)
    oprf = features.get("oprf")()
    fitted, axis = _data_fitted.fit_if_unfitted(
        oprf, None, q, k, mask, causal=False, dtype=jnp.float32
    )
    wide = _data_fitted.fit_to_inputs(
        oprf, *(x.astype(jnp.float32) for x in (q, k)), mask, causal=False
    )
    assert axis == 0
    for got, want in zip(jax.tree.leaves(fitted), jax.tree.leaves(wide.stacked), strict=True):
        assert got.dtype == jnp.float32
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("unfitted_side", ["query", "key"])
def test_a_pair_with_one_unfitted_side_is_refused(unfitted_side):
    # A pair counted as unfitted only when both sides were passed as fitted.
    q, k, v = _qkv()
    w = projections.orthogonal(jax.random.key(1), H, M)
    oprf = features.get("oprf")()
    fitted = oprf.fit(jax.random.key(2), *(H**-0.25 * x.reshape(-1, H) for x in (q, k)))
    sides = {"query": fitted, "key": fitted, unfitted_side: oprf}
    pair = features.FeatureMapPair(sides["query"], sides["key"])
    for causal in (False, True):
        with pytest.raises(ValueError, match=r"FeatureMapPair .*calibration sample"):
            attention.favor_attention(q, k, v, w, feature_map=pair, causal=causal)


def test_causal_attention_on_global_split_arrays_refuses_an_unfitted_map():
    # Global arrays go through _global_split, which fits before the local calls: causal
    # attention there must refuse the map too, not fit it to the current keys.
    q, k, v = _qkv()
    w = projections.orthogonal(jax.random.key(1), H, M)
    mesh = jax.make_mesh((1,), ("batch",), axis_types=(AxisType.Explicit,))
    q, k, v = (jax.device_put(x, NamedSharding(mesh, P("batch"))) for x in (q, k, v))
    with pytest.raises(ValueError, match=r"feature_map OptimizedPositiveFeatureMap .*calibration"):
        attention.favor_attention(q, k, v, w, feature_map="oprf", causal=True)


def test_masked_keys_do_not_enter_the_statistics():
    q, k, v = _qkv()
    mask = jnp.arange(T) < T - 4
    w = projections.gaussian(jax.random.key(1), H, M)
    favor = jitted(attention.favor_attention)
    out = favor(q, k, v, w, feature_map="saderf", mask=jnp.tile(mask, (B, 1)))
    for fill in (50.0, jnp.nan, jnp.inf):  # NaN/inf: issue 32 (0 * NaN entered the sums)
        garbage = jnp.where(mask[None, :, None, None], k, fill)
        again = favor(q, garbage, v, w, feature_map="saderf", mask=jnp.tile(mask, (B, 1)))
        np.testing.assert_allclose(out, again, rtol=1e-6)


@pytest.mark.parametrize("name", ["oprf", "saderf"])
def test_a_non_finite_row_stays_out_of_the_statistics(name):
    """A NaN query or an inf key reaches the outputs that attend to it only: the statistics
    pooled over the batch leave such rows out (they put NaN into every output of the head),
    even with one coordinate of the row non-finite."""
    q, k, v = _qkv()
    w = projections.gaussian(jax.random.key(1), H, M)
    favor = jitted(attention.favor_attention)
    out = np.asarray(favor(q.at[0, 3, 1, 0].set(jnp.nan), k, v, w, feature_map=name))
    assert np.argwhere(np.isnan(out).any(-1)).tolist() == [[0, 3, 1]]
    assert np.isfinite(np.delete(out.reshape(B * T * N, H), 3 * N + 1, axis=0)).all()
    out = favor(q, k.at[0, 3, :, 0].set(jnp.inf), v, w, feature_map=name)
    assert bool(jnp.all(jnp.isnan(out[0])))  # batch 0 attends to the key
    without = favor(q, k, v, w, feature_map=name, mask=jnp.ones((B, T), bool).at[0, 3].set(False))
    np.testing.assert_array_equal(out[1], without[1])  # the same statistics: as if masked


def test_causal_attention_needs_calibrated_statistics_and_stays_causal():
    q, k, v = _qkv()
    w = projections.orthogonal(jax.random.key(1), H, M)
    with pytest.raises(ValueError, match="calibration sample"):
        attention.favor_attention(q, k, v, w, feature_map="oprf", causal=True)
    calibration_q, calibration_k, _ = _qkv(key=5)
    fitted = _fitted_per_head("derf_asymmetric", calibration_q, calibration_k)
    favor = jitted(attention.favor_attention)
    out = favor(q, k, v, w, feature_map=fitted, causal=True)
    # Changing the keys and values at positions >= t leaves the outputs before t unchanged.
    t = 7
    k2 = k.at[:, t:].add(3.0)
    v2 = v.at[:, t:].add(-2.0)
    out2 = favor(q, k2, v2, w, feature_map=fitted, causal=True)
    np.testing.assert_allclose(out2[:, :t], out[:, :t], rtol=1e-5, atol=1e-6)
    assert float(jnp.max(jnp.abs(out2[:, t:] - out[:, t:]))) > 1e-2


def test_oprf_attention_is_closer_to_softmax_than_favor_plus_on_average():
    # Large scores (|q|, |k| ~ 2.5 after the normaliser): OPRF's variance advantage shows in the
    # attention output; averaged over 16 projections, paired, resolved beyond 4 SE.
    q, k, v = 2.5 * _qkv(key=3)
    exact = attention.softmax_attention(q, k, v)

    @jax.jit
    def errors(key):
        w = projections.gaussian(key, H, M)
        return jnp.stack(
            [
                jnp.mean((attention.favor_attention(q, k, v, w, feature_map=name) - exact) ** 2)
                for name in ("positive", "oprf")
            ]
        )

    squared = np.asarray([errors(key) for key in jax.random.split(jax.random.key(2), 16)])
    difference = squared[:, 0] - squared[:, 1]
    assert difference.mean() > 4.0 * difference.std(ddof=1) / np.sqrt(len(difference))


def test_performer_attention_trains_with_a_data_fitted_map():
    x = jax.random.normal(jax.random.key(0), (2, 10, 12))
    module = PerformerAttention(num_heads=3, num_features=8, feature_map="saderf")
    rngs = {"params": jax.random.key(1), "projection": jax.random.key(2)}
    variables = jax.jit(module.init)(rngs, x)
    params = variables["params"]

    @jax.jit
    def loss(params):
        out = module.apply(
            {**variables, "params": params}, x, rngs={"projection": jax.random.key(2)}
        )
        return jnp.mean(out**2)

    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    assert np.isfinite(float(value))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
    step = jax.jit(lambda params, grads: jax.tree.map(lambda p, g: p - 0.5 * g, params, grads))
    stepped = step(params, grads)
    assert float(loss(stepped)) < float(value)
