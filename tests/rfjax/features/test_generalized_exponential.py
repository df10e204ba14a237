"""GERF/OPRF (FAVOR++, arXiv:2205.15317); DERF/SADERF (FAVOR#) are in test_dense_exponential.py.

Every closed form is checked against Monte Carlo at several (d, m, |x|, |y|, angle): the mean of
the estimate is exp(x.y) and its sample variance the closed-form variance, each within 4 standard
errors (fixed keys). The optimal parameters are checked to be stationary points (and minima) of
the averaged log second moment they are derived from.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import features, projections, theory
from tests.support.exponential_estimates import NSIG, SETTINGS, check, pair, statistics

pytestmark = pytest.mark.usefixtures("float64")

# The closed forms as compiled programs (eagerly, each of their operations compiles on its own).
_gerf_variance = jax.jit(theory.gerf_variance, static_argnums=2, static_argnames="a")
_oprf_variance = jax.jit(theory.oprf_variance, static_argnums=2)


@pytest.mark.parametrize(
    ("setting", "a"),
    [(s, -0.15) for s in SETTINGS] + [(SETTINGS[0], 0.0), (SETTINGS[1], 0.04)],
)
def test_gerf_is_unbiased_with_the_closed_form_variance(setting, a):
    dim, m, norm_x, norm_y, cosine = setting
    x, y = pair(dim, norm_x, norm_y, cosine)

    def estimate(key):
        w = projections.gaussian(key, dim, m, dtype=jnp.float64)
        gerf = features.generalized_exponential_features
        return gerf(x, w, a=a) @ gerf(y, w, a=a)

    check(estimate, np.exp(float(x @ y)), float(_gerf_variance(x, y, m, a=a)))


def test_gerf_at_zero_is_favor_plus():
    x, y = pair(5, 0.8, 1.1, 0.4)
    w = projections.orthogonal(jax.random.key(0), 5, 7, dtype=jnp.float64)

    @jax.jit
    def gerf_and_favor_plus(x, y, w):
        return (
            (
                features.generalized_exponential_features(x, w, a=0.0),
                features.positive_features(x, w),
            ),
            (theory.gerf_variance(x, y, 7, a=0.0), theory.prf_mse(x, y, 7, kernel="softmax")),
        )

    (gerf, favor_plus), (gerf_variance, prf_mse) = gerf_and_favor_plus(x, y, w)
    np.testing.assert_allclose(gerf, favor_plus)
    np.testing.assert_allclose(gerf_variance, prf_mse)


def test_optimal_gerf_parameter_minimises_the_mean_log_second_moment():
    queries, keys = statistics(5)

    @jax.jit
    def fitted(queries, keys):
        stats = features.input_statistics(queries, keys)
        pairs = jnp.mean(jnp.sum((queries[:, None] + keys[None]) ** 2, -1))
        return features.mean_squared_sum(stats), pairs, features.optimal_gerf_parameter(stats)

    phi, pairs, a_star = fitted(queries, keys)
    phi = float(phi)
    np.testing.assert_allclose(phi, pairs, rtol=1e-12)
    a_star = float(a_star)
    # The OPRF closed form, written as in the paper.
    rho = phi / 5
    np.testing.assert_allclose(
        a_star, (1 - 2 * rho - np.sqrt((2 * rho + 1) ** 2 + 8 * rho)) / 16, rtol=1e-12
    )
    assert a_star < 0

    @jax.jit
    def objective(a):
        log_second = theory.gerf_log_second_moment(queries[:, None], keys[None], a=a)
        return jnp.mean(log_second)

    assert abs(float(jax.jit(jax.grad(objective))(a_star))) < 1e-9
    for delta in (-0.05, 0.05):
        assert objective(a_star + delta) > objective(a_star)


@pytest.mark.parametrize("coupling", ["gaussian", "orthogonal", "simplex"])
def test_oprf_is_unbiased_for_every_coupling(coupling):
    queries, keys = statistics(4)
    stats = features.input_statistics(queries, keys)
    x, y = queries[0], keys[1]
    sampler = projections.get(coupling)

    def estimate(key):
        w = sampler(key, 4, 4, dtype=jnp.float64)
        phi_x = features.optimized_positive_features(x, w, side="query", statistics=stats)
        phi_y = features.optimized_positive_features(y, w, side="key", statistics=stats)
        return phi_x @ phi_y

    variance = float(_oprf_variance(x, y, 4, statistics=stats))
    check(estimate, np.exp(float(x @ y)), variance if coupling == "gaussian" else None)


def test_statistics_per_sequence_give_one_parameter_per_head():
    queries, keys = statistics(3, n=12)
    batch_q = jnp.stack([queries, 2.0 * queries])
    batch_k = jnp.stack([keys, 0.5 * keys])
    w = projections.gaussian(jax.random.key(0), 3, 5, dtype=jnp.float64)

    @jax.jit
    def batched_and_per_head(batch_q, batch_k, w):
        stats = features.input_statistics(batch_q, batch_k)
        batched = features.optimized_positive_features(batch_q, w, side="query", statistics=stats)
        per_head = []
        for head in range(2):
            single = features.input_statistics(batch_q[head], batch_k[head])
            per_head.append(
                features.optimized_positive_features(
                    batch_q[head], w, side="query", statistics=single
                )
            )
        return batched, per_head

    batched, per_head = batched_and_per_head(batch_q, batch_k, w)
    for head in range(2):
        np.testing.assert_allclose(batched[head], per_head[head], rtol=1e-12)
    # The map with per-sequence statistics is the same; its affine form takes one A only.
    fmap = features.OptimizedPositiveFeatureMap(features.input_statistics(batch_q, batch_k))
    np.testing.assert_allclose(
        jnp.exp(fmap.log_features(batch_q, w, side="query")), batched, rtol=1e-12
    )
    with pytest.raises(ValueError, match="one fitted A per map"):
        fmap.affine_log_form(w, side="key")


def test_gerf_bad_inputs_raise():
    w = projections.gaussian(jax.random.key(0), 3, 4)
    x = jnp.ones((2, 3))
    for a in (0.2, 0.125):  # 1/8 itself: the second moment (1 - 8A)^{-d/2} is infinite
        with pytest.raises(ValueError, match="a must be < 1/8"):
            features.generalized_exponential_features(x, w, a=a)
    with pytest.raises(TypeError, match="a must be a real floating"):
        features.generalized_exponential_features(x, w, a=jnp.array(0))
    with pytest.raises(ValueError, match="finite"):
        features.generalized_exponential_features(x, w, a=jnp.nan)
    with pytest.raises(ValueError, match="num_points"):
        features.input_statistics(jnp.ones(3), x)
    with pytest.raises(ValueError, match="same d"):
        features.input_statistics(x, jnp.ones((2, 4)))
    stats = features.input_statistics(x, x)
    with pytest.raises(ValueError, match="side"):
        features.optimized_positive_features(x, w, side="value", statistics=stats)


def test_oprf_fit_keeps_the_queries_and_keys_statistics_apart():
    # A* is symmetric in queries and keys, but the fitted statistics are what a DERF fit or a
    # reader takes: the query moments must be the queries'.
    queries, keys = statistics(3)
    fitted = features.get("oprf")().fit(jax.random.key(0), queries, keys)
    for got, want in zip(fitted.statistics, features.input_statistics(queries, keys), strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(fitted.statistics.query_mean, jnp.mean(queries, 0), rtol=1e-12)


# --- DERF ---------------------------------------------------------------------------------------


def test_orthogonal_rows_lower_the_oprf_mse():
    # Chefs' Random Tables (arXiv:2205.15317): orthogonal rows reduce OPRF's variance
    # for any d. Paired Monte Carlo on common keys, the Gram MSE of 36 pairs, d = m = 4.
    kq, kk = jax.random.split(jax.random.key(3))
    queries, keys = 0.5 * jax.random.normal(kq, (6, 4)), 0.5 * jax.random.normal(kk, (6, 4))
    stats = features.input_statistics(queries, keys)
    truth = jnp.exp(queries @ keys.T)

    def squared_errors(key):
        out = []
        for sampler in (projections.gaussian, projections.orthogonal):
            w = sampler(key, 4, 4, dtype=jnp.float64)
            phi_q = features.optimized_positive_features(queries, w, side="query", statistics=stats)
            phi_k = features.optimized_positive_features(keys, w, side="key", statistics=stats)
            out.append(jnp.mean((phi_q @ phi_k.T - truth) ** 2))
        return jnp.stack(out)

    draws = jax.random.split(jax.random.key(0), 5_000)
    errors = np.asarray(jax.jit(jax.vmap(squared_errors))(draws))
    difference = errors[:, 1] - errors[:, 0]
    assert difference.mean() < -NSIG * difference.std(ddof=1) / np.sqrt(len(difference))
