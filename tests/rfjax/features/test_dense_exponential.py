"""Tests of ``rfjax.features._dense_exponential``: DERF/SADERF (FAVOR#, arXiv:2302.00787).

The closed-form variance is checked against Monte Carlo (within 4 standard errors, fixed keys);
the fitted scales are stationary points (and minima) of the averaged log second moment.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import features, projections, theory
from rfjax.features import _dense_exponential
from tests.support.exponential_estimates import SETTINGS, VARIANTS, check, pair, statistics

pytestmark = pytest.mark.usefixtures("float64")

# The fit as one compiled program (eagerly, each of its operations compiles on its own).
_fit = jax.jit(features.fit_dense_exponential, static_argnames=("variant", "ridge"))
_dense_exponential_features = jax.jit(features.dense_exponential_features, static_argnames="side")
_fit_map = jax.jit(lambda fmap, key, queries, keys: fmap.fit(key, queries, keys))
_map_features = jax.jit(
    lambda fmap, x, w, side: fmap.features(x, w, side=side), static_argnames="side"
)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(  # the first setting by default, the others in the full suite
    "setting",
    [SETTINGS[0], *(pytest.param(s, marks=pytest.mark.statistical) for s in SETTINGS[1:3])],
)
def test_derf_is_unbiased_with_the_closed_form_variance(setting, variant):
    dim, m, norm_x, norm_y, cosine = setting
    x, y = pair(dim, norm_x, norm_y, cosine)
    queries, keys = statistics(dim)
    params = _fit(queries, keys, variant=variant)

    def estimate(key):
        w = projections.gaussian(key, dim, m, dtype=jnp.float64)
        derf = features.dense_exponential_features
        return derf(x, w, side="query", parameters=params) @ derf(
            y, w, side="key", parameters=params
        )

    variance = float(
        jax.jit(theory.dense_exponential_variance, static_argnums=2)(x, y, m, parameters=params)
    )
    check(estimate, np.exp(float(x @ y)), variance)


@jax.jit
def _mean_log_second_moment(queries, keys, params):
    return jnp.mean(
        theory.dense_exponential_log_second_moment(queries[:, None], keys[None], parameters=params)
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_derf_scales_are_optimal_for_their_transform(variant):
    # For the fitted Phi (and U), q minimises the pair-averaged log second moment: the gradient
    # in q vanishes (for SADERF along the one shared scale) and perturbations increase it.
    queries, keys = statistics(4)
    params = _fit(queries, keys, variant=variant, ridge=0.0)

    def objective(scales):
        return _mean_log_second_moment(queries, keys, params._replace(scales=scales))

    grad = jax.jit(jax.grad(objective))(params.scales)
    if variant == "simplified":
        grad = jnp.sum(grad)
    np.testing.assert_allclose(grad, 0.0, atol=1e-9)
    base = objective(params.scales)
    for sign in (-1.0, 1.0):
        assert objective(params.scales * (1.0 + sign * 0.05)) > base


def test_derf_variants_improve_on_oprf_as_the_derivation_orders_them():
    # On anisotropic data the dense variants have more freedom than OPRF (scalar A, Phi = I):
    # each optimum's averaged log second moment is at most OPRF's (it contains OPRF's family).
    queries, keys = statistics(6)
    dim = 6

    @jax.jit
    def oprf_as_derf(queries, keys):
        stats = features.input_statistics(queries, keys)
        shrink = 1.0 - 4.0 * features.optimal_gerf_parameter(stats)
        eye = jnp.eye(dim)
        oprf = features.DenseExponentialParameters(eye, jnp.full(dim, shrink), eye, eye)
        derf_moment = theory.dense_exponential_log_second_moment(
            queries[0], keys[0], parameters=oprf
        )
        gerf_moment = theory.gerf_log_second_moment(
            queries[0], keys[0], a=features.optimal_gerf_parameter(stats)
        )
        return oprf, derf_moment, gerf_moment

    oprf, derf_moment, gerf_moment = oprf_as_derf(queries, keys)
    # The OPRF parameters written as DERF parameters give OPRF's second moment exactly.
    np.testing.assert_allclose(derf_moment, gerf_moment, rtol=1e-12)
    reference = _mean_log_second_moment(queries, keys, oprf)
    for variant in VARIANTS:
        params = _fit(queries, keys, variant=variant, ridge=0.0)
        assert _mean_log_second_moment(queries, keys, params) < reference, variant


def test_saderf_is_oprf_on_balanced_inputs():
    queries, keys = statistics(3)
    params = _fit(queries, keys, variant="simplified", ridge=0.0)
    w = projections.gaussian(jax.random.key(0), 3, 6, dtype=jnp.float64)

    @jax.jit
    def both_features(queries, keys, params, w):
        psi = (jnp.mean(keys**2, 0) / jnp.mean(queries**2, 0)) ** 0.25
        balanced = features.input_statistics(queries * psi, keys / psi)
        return [
            (
                features.dense_exponential_features(points, w, side=side, parameters=params),
                features.optimized_positive_features(
                    points * scale, w, side=side, statistics=balanced
                ),
            )
            for side, points, scale in (("query", queries, psi), ("key", keys, 1.0 / psi))
        ]

    for derf, oprf in both_features(queries, keys, params, w):
        np.testing.assert_allclose(derf, oprf, rtol=1e-10)


def test_symmetric_derf_has_the_same_features_on_both_sides():
    queries, keys = statistics(3)
    fmap = _fit_map(features.get("derf_symmetric")(), jax.random.key(0), queries, keys)
    assert fmap.symmetric and not features.get("saderf")().symmetric
    w = projections.gaussian(jax.random.key(1), 3, 6, dtype=jnp.float64)
    np.testing.assert_array_equal(
        _map_features(fmap, queries, w, side="query"), _map_features(fmap, queries, w, side="key")
    )


def test_unfitted_maps_are_favor_plus_and_fit_is_the_closed_form():
    queries, keys = statistics(3)
    w = projections.gaussian(jax.random.key(1), 3, 6, dtype=jnp.float64)
    for name in ("oprf", "derf_asymmetric", "saderf"):
        np.testing.assert_allclose(
            features.get(name)().features(queries, w, side="key"),
            features.positive_features(queries, w),
            rtol=1e-12,
        )
    fitted = features.get("derf_asymmetric")().fit(jax.random.key(0), queries, keys)
    expected = features.fit_dense_exponential(queries, keys, variant="asymmetric")
    for got, want in zip(fitted.parameters, expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_derf_bad_inputs_raise():
    queries, keys = statistics(3)
    with pytest.raises(ValueError, match="variant"):
        features.fit_dense_exponential(queries, keys, variant="dense")
    with pytest.raises(ValueError, match="ridge"):
        features.fit_dense_exponential(queries, keys, variant="symmetric", ridge=-1.0)
    with pytest.raises(ValueError, match="variant"):
        features.DenseExponentialFeatureMap("full")
    params = features.fit_dense_exponential(queries, keys, variant="symmetric")
    w = projections.gaussian(jax.random.key(0), 4, 5)
    with pytest.raises(ValueError, match="d=4"):
        features.dense_exponential_features(jnp.ones((2, 4)), w, side="key", parameters=params)


def test_the_ridge_is_relative_to_the_mean_eigenvalue():
    # M + ridge tr(M)/d I enters SADERF's psi_l = ((M_k + r I)_ll / (M_q + r I)_ll)^{1/4}.
    queries, keys = statistics(3)
    params = _fit(queries, keys, variant="simplified", ridge=0.5)
    m_q, m_k = (np.mean(np.asarray(p) ** 2, axis=0) for p in (queries, keys))
    psi = ((m_k + 0.5 * m_k.mean()) / (m_q + 0.5 * m_q.mean())) ** 0.25
    np.testing.assert_allclose(np.diagonal(params.query_transform), psi, rtol=1e-12)
    np.testing.assert_allclose(np.diagonal(params.key_transform), 1.0 / psi, rtol=1e-12)


def test_a_zero_moment_gets_an_absolute_ridge():
    # Keys all at the origin (or none: every key masked in attention): the relative ridge
    # ridge tr(M)/d of a zero moment is 0, and the asymmetric fit's M^{-1/2} was NaN.
    queries, keys = statistics(3)
    keys = 0.0 * keys
    params = _fit(queries, keys, variant="simplified", ridge=0.5)
    m_q = np.mean(np.asarray(queries) ** 2, axis=0)
    psi = (0.5 / (m_q + 0.5 * m_q.mean())) ** 0.25
    np.testing.assert_allclose(np.diagonal(params.query_transform), psi, rtol=1e-12)
    for leaf in jax.tree.leaves(_fit(queries, keys, variant="asymmetric")):
        assert bool(np.all(np.isfinite(leaf)))


@pytest.mark.parametrize("variant", VARIANTS)
def test_parameters_per_sequence_give_each_sequence_its_own_fit(variant):
    # Parameters with a batch axis (one fit per head) on (heads, n, d) inputs are each head's
    # own fit applied to its rows (3 heads of 5 rows: the batch axis is not the point axis).
    queries, keys = statistics(3, n=15)
    heads_q, heads_k = queries.reshape(3, 5, 3), keys.reshape(3, 5, 3)
    batched = _fit(heads_q, heads_k, variant=variant)
    w = projections.gaussian(jax.random.key(0), 3, 6, dtype=jnp.float64)
    for side, points in (("query", heads_q), ("key", heads_k)):
        got = _dense_exponential_features(points, w, side=side, parameters=batched)
        for head in range(3):
            single = _fit(heads_q[head], heads_k[head], variant=variant)
            want = _dense_exponential_features(points[head], w, side=side, parameters=single)
            np.testing.assert_allclose(got[head], want, rtol=1e-10)


def test_asymmetric_fit_with_fewer_points_than_dimensions_is_finite_in_float32():
    # Regression: 12 points in d = 16 give singular second moments; in float32 rounding made
    # eigenvalues negative and M^{-1/2} NaN (found by the estimator zoo's default run).
    with jax.enable_x64(False):
        queries = 0.3 * jax.random.normal(jax.random.key(0), (12, 16))
        keys = 0.3 * jax.random.normal(jax.random.key(1), (12, 16))
        params = _fit(queries, keys, variant="asymmetric")
        w = projections.gaussian(jax.random.key(2), 16, 32)
        for side, points in (("query", queries), ("key", keys)):
            phi = _dense_exponential_features(points, w, side=side, parameters=params)
            assert bool(np.all(np.isfinite(phi)))


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("variant", _dense_exponential.VARIANTS)
def test_fits_in_low_precision_are_float32_fits_returned_in_the_input_dtype(dtype, variant):
    # Issue 32 item 5: the asymmetric and symmetric fits failed on bfloat16/float16 inputs
    # inside eigh (JAX's dtype error). Every fit (OPRF's statistics too) now computes in float32
    # and returns the input dtype: the same numbers as a float32 fit of the same (rounded)
    # inputs, cast back.
    # 30 points, not a power of two: dividing a low-precision sum by n rounds (moments
    # accumulated in the input dtype differ from float32 ones cast back).
    queries = jax.random.normal(jax.random.key(0), (30, 4)).astype(dtype)
    keys = 2.0 * jax.random.normal(jax.random.key(1), (30, 4)).astype(dtype)
    params = features.fit_dense_exponential(queries, keys, variant=variant)
    wide = features.fit_dense_exponential(
        queries.astype(jnp.float32), keys.astype(jnp.float32), variant=variant
    )
    for got, want in zip(params, wide, strict=True):
        assert got.dtype == dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want.astype(dtype)))
    statistics = features.input_statistics(queries, keys)
    wide_inputs = (queries.astype(jnp.float32), keys.astype(jnp.float32))
    for got, want in zip(statistics, features.input_statistics(*wide_inputs), strict=True):
        assert got.dtype == dtype
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want.astype(dtype)))
    from_statistics = features.dense_exponential_parameters(statistics, variant=variant)
    assert all(p.dtype == dtype for p in from_statistics)
    fitted = features.DenseExponentialFeatureMap(variant).fit(jax.random.key(2), queries, keys)
    w = projections.orthogonal(jax.random.key(3), 4, 8)
    assert bool(jnp.all(jnp.isfinite(fitted.features(queries, w, side="query"))))
