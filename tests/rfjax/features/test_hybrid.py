"""Hybrid random features: CE features, Lemma 2.3, angular/Gaussian/cluster hybrids, HRF theory.

Statistical checks use fixed keys and pass when |measured - predicted| <= 4 standard errors.
Zero-variance checks hold for every draw to float32 rounding.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import features, kernels, projections, theory
from tests.support.representatives import representatives

NSIG = 4.0
DIM = 4
NUM_FEATURES = 8  # m: two blocks of d rows for the orthogonal coupling
NUM_SIGNS = 4  # n
THEORY_DRAWS = 20_000
UNBIASED_DRAWS = 4_000
COUPLINGS = ("gaussian", "orthogonal")
BANDWIDTH = 1.3


def _pair(norm_x: float, norm_y: float, angle: float) -> tuple[np.ndarray, np.ndarray]:
    """x, y in R^DIM with the given norms and angle between them."""
    x = np.zeros(DIM)
    y = np.zeros(DIM)
    x[0] = norm_x
    y[0] = norm_y * math.cos(angle)
    y[1] = norm_y * math.sin(angle)
    return x, y


def _mean_se(values: np.ndarray) -> tuple[float, float]:
    values = np.asarray(values, dtype=np.float64)
    return float(values.mean()), float(values.std(ddof=1) / math.sqrt(values.size))


def _assert_within(values: np.ndarray, predicted: float) -> None:
    measured, se = _mean_se(values)
    assert se > 0
    z = (measured - predicted) / se
    assert abs(measured - predicted) <= NSIG * se, (
        f"measured {measured:.6g} +- {se:.2g}, predicted {predicted:.6g}, z = {z:+.2f}"
    )


def _f32(v: np.ndarray) -> jax.Array:
    return jnp.asarray(v, jnp.float32)


@functools.partial(jax.jit, static_argnums=(0, 2))
def _draw_batch(coupling: str, keys: jax.Array, num_features: int) -> projections.Projection:
    """One projection per key, as a batched pytree (weights ``(len(keys), m, DIM)``).

    Feature maps applied to an input ``(DIM,)`` with it return ``(len(keys), width)``: one
    independent draw per row, evaluated without recompiling each estimator under ``vmap``.
    """
    sampler = projections.get(coupling)
    return jax.vmap(lambda key: sampler(key, DIM, num_features))(keys)


# One batch size per coupling, so each sampler compiles once per row count (QR is slow to
# compile); smaller samples are leading slices of a batch (still independent draws).
_BATCH = {"gaussian": THEORY_DRAWS, "orthogonal": UNBIASED_DRAWS}


def _projection_sets(coupling: str, seed: int, num: int, sizes=(NUM_FEATURES,) * 2 + (NUM_SIGNS,)):
    """Independent batched projections (w_1, w_2, ..., tau) of the given sizes, ``num`` draws."""
    keys = jax.random.split(jax.random.key(seed), (len(sizes), _BATCH[coupling]))
    return [
        jax.tree.map(lambda a: a[:num], _draw_batch(coupling, k, size))
        for k, size in zip(keys, sizes, strict=True)
    ]


# A genuinely complex, well-conditioned matrix (fixed).
_RNG = np.random.default_rng(7)
COMPLEX_A = (
    0.5 * (_RNG.standard_normal((DIM, DIM)) + 1j * _RNG.standard_normal((DIM, DIM))) / 2
    + 0.8 * np.eye(DIM)
).astype(np.complex64)
REAL_A = (0.4 * _RNG.standard_normal((DIM, DIM)) + np.eye(DIM)).astype(np.float32)


# --------------------------------------------------------------------------------------------
# Complex-exponential features: special cases and the real-valued implementation
# --------------------------------------------------------------------------------------------


def test_ce_special_cases_reproduce_trigonometric_and_positive():
    w = projections.gaussian(jax.random.key(0), DIM, NUM_FEATURES)
    x, y = _f32(_pair(0.7, 0.9, 1.1)[0]), _f32(_pair(0.7, 0.9, 1.1)[1])

    def ce(matrix):
        return features.estimate(
            features.complex_exponential_features(x, w, matrix, side="query"),
            features.complex_exponential_features(y, w, matrix, side="key"),
        )

    trig = features.estimate(
        features.trigonometric_features(x, w), features.trigonometric_features(y, w)
    )
    positive = features.estimate(features.positive_features(x, w), features.positive_features(y, w))
    np.testing.assert_allclose(ce(1j * jnp.eye(DIM)), trig, rtol=1e-5)
    np.testing.assert_allclose(ce(jnp.eye(DIM)), positive, rtol=1e-5)
    # Widths: 2m for complex A, m for real A; a diagonal (d,) equals the dense diag(alpha).
    assert features.complex_exponential_features(x, w, 1j * jnp.eye(DIM), side="query").shape == (
        2 * NUM_FEATURES,
    )
    assert features.complex_exponential_features(x, w, jnp.eye(DIM), side="key").shape == (
        NUM_FEATURES,
    )
    alpha = jnp.asarray([0.5 + 0.2j, -1.0j, 1.3, 0.7 - 0.7j], jnp.complex64)
    for side, u in (("query", x), ("key", y)):
        np.testing.assert_allclose(
            features.complex_exponential_features(u, w, alpha, side=side),
            features.complex_exponential_features(u, w, jnp.diag(alpha), side=side),
            rtol=1e-5,
            atol=1e-6,
        )


def test_ce_real_features_are_the_real_part_of_the_complex_estimator():
    w = projections.gaussian(jax.random.key(1), DIM, NUM_FEATURES)
    x, y = _pair(0.6, 0.8, 2.0)
    a = COMPLEX_A.astype(np.complex128)
    omega = np.asarray(w.matrix(), np.float64)
    ax, by = a @ x, np.linalg.inv(a.T) @ y
    psi_x = np.exp(omega @ ax - np.sum(ax * ax) / 2) / math.sqrt(NUM_FEATURES)
    psi_y = np.exp(omega @ by - np.sum(by * by) / 2) / math.sqrt(NUM_FEATURES)
    bilinear = np.sum(psi_x * psi_y)  # Eq. 16: no conjugation
    got = features.estimate(
        features.complex_exponential_features(_f32(x), w, COMPLEX_A, side="query"),
        features.complex_exponential_features(_f32(y), w, COMPLEX_A, side="key"),
    )
    np.testing.assert_allclose(got, bilinear.real, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# Lemma 2.3: the hybrid feature map reproduces Eq. 8 exactly
# --------------------------------------------------------------------------------------------


def test_lemma_2_3_identity_general_hybrid():
    keys = jax.random.split(jax.random.key(3), 5)
    w_pos = projections.gaussian(keys[0], DIM, 6)
    w_trig = projections.gaussian(keys[1], DIM, 5)
    w_ce = projections.gaussian(keys[2], DIM, 3)
    tau = projections.gaussian(keys[3], DIM, 5)
    tau_g = projections.gaussian(keys[4], DIM, 4)
    xs = _f32(np.random.default_rng(0).normal(scale=0.5, size=(5, DIM)))
    ys = _f32(np.random.default_rng(1).normal(scale=0.5, size=(3, DIM)))

    def sides(u, side):
        bases = [
            features.positive_features(u, w_pos, antithetic=True),
            features.complex_exponential_features(u, w_ce, COMPLEX_A, side=side),
            features.trigonometric_features(u, w_trig),
        ]
        sign = 1.0 if side == "query" else -1.0
        coefficients = [
            sign * features.angular_features(u, tau) / math.sqrt(2.0),
            features.fourier_features(sign * u, tau_g, lengthscale=BANDWIDTH),
        ]
        return bases, coefficients

    offsets = [0.5, -0.2]
    sides = jax.jit(sides, static_argnums=1)
    (bx, cx), (by, cy) = sides(xs, "query"), sides(ys, "key")
    pair = jax.jit(features.hybrid_features, static_argnums=2)(
        [features.FeaturePair(q, k) for q, k in zip(bx, by, strict=True)],
        [features.FeaturePair(q, k) for q, k in zip(cx, cy, strict=True)],
        tuple(offsets),
    )
    gram = np.asarray(pair.query @ pair.key.T, np.float64)
    base_grams = [
        np.asarray(q, np.float64) @ np.asarray(k, np.float64).T for q, k in zip(bx, by, strict=True)
    ]
    lambdas = [
        a + np.asarray(q, np.float64) @ np.asarray(k, np.float64).T
        for a, q, k in zip(offsets, cx, cy, strict=True)
    ]
    direct = np.asarray(features.hybrid_estimate(base_grams, lambdas))
    np.testing.assert_allclose(gram, direct, rtol=2e-5, atol=1e-6)
    widths = [b.shape[-1] for b in bx]
    sizes = [c.shape[-1] for c in cx]
    expected = (
        widths[0] * (1 + sizes[0]) + widths[1] * (1 + sizes[1]) + widths[2] * (1 + sum(sizes))
    )
    assert pair.query.shape == (5, expected) and pair.key.shape == (3, expected)
    # The one-sided builders agree with the pair builder.
    np.testing.assert_array_equal(features.hybrid_query_features(bx, cx, offsets), pair.query)
    np.testing.assert_array_equal(features.hybrid_key_features(by, cy), pair.key)


@pytest.mark.parametrize("name", ["angular", "gaussian"])
def test_hybrid_gram_is_the_flat_features_product(name):
    """The factored Gram (Eq. 8 on the factors' Grams) equals Psi(X) Psi'(Y)^T of Lemma 2.3,
    also where the log-scales differ by row (inputs of different norms)."""
    fmap = (
        features.AngularHybridFeatureMap(num_sign_features=NUM_SIGNS)
        if name == "angular"
        else features.GaussianHybridFeatureMap(
            num_coefficient_features=NUM_SIGNS, bandwidth=BANDWIDTH, radius=1.5
        )
    ).init(jax.random.key(4), DIM)
    w = projections.gaussian(jax.random.key(5), DIM, NUM_FEATURES)
    xs = _f32(np.random.default_rng(2).normal(scale=1.2, size=(6, DIM)))
    ys = _f32(np.random.default_rng(3).normal(scale=0.4, size=(7, DIM)))
    gram = features.hybrid_gram(
        fmap.hybrid_parts(xs, w, side="query"), fmap.hybrid_parts(ys, w, side="key")
    )
    flat = fmap.features(xs, w, side="query") @ fmap.features(ys, w, side="key").T
    np.testing.assert_allclose(gram, flat, rtol=2e-5, atol=1e-6 * float(jnp.max(jnp.abs(flat))))
    parts = fmap.hybrid_parts(xs, w, side="query")
    with pytest.raises(ValueError, match="query-side and key-side"):
        features.hybrid_gram(parts, parts)


def test_angular_hybrid_is_eq_12():
    keys = jax.random.split(jax.random.key(4), 3)
    w1 = projections.gaussian(keys[0], DIM, NUM_FEATURES)
    w2 = projections.gaussian(keys[1], DIM, 5)
    tau = projections.gaussian(keys[2], DIM, NUM_SIGNS)
    x, y = map(_f32, _pair(1.3, 0.3, 2.0))
    lam = 0.5 - 0.5 * features.estimate(
        features.angular_features(x, tau), features.angular_features(y, tau)
    )
    positive = features.estimate(
        features.positive_features(x, w1, antithetic=True),
        features.positive_features(y, w1, antithetic=True),
    )
    trig = features.estimate(
        features.trigonometric_features(x, w2), features.trigonometric_features(y, w2)
    )
    query = features.angular_hybrid_features(x, w1, w2, tau, side="query")
    key = features.angular_hybrid_features(y, w1, w2, tau, side="key")
    assert query.shape == ((2 * NUM_FEATURES + 2 * 5) * (NUM_SIGNS + 1),)
    np.testing.assert_allclose(
        features.estimate(query, key), lam * positive + (1 - lam) * trig, rtol=1e-5
    )


# --------------------------------------------------------------------------------------------
# Cluster-adapted hybrid: fixtures
# --------------------------------------------------------------------------------------------

QUERY_MEANS = np.array([[0.5, -0.4, 0.3, 0.2], [-0.4, 0.3, -0.5, 0.4]])
KEY_MEANS = np.array([[-0.3, 0.5, 0.4, -0.2], [0.4, 0.4, -0.3, -0.5]])
CLUSTER_SPREAD = 0.05


def _blobs(means: np.ndarray, per_cluster: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate(
        [m + CLUSTER_SPREAD * rng.standard_normal((per_cluster, DIM)) for m in means]
    )


@functools.cache
def _cluster_parameters(matrix: str) -> features.ClusterHybridParameters:
    return features.fit_cluster_hybrid(
        jax.random.key(11),
        _f32(_blobs(QUERY_MEANS, 60, 0)),
        _f32(_blobs(KEY_MEANS, 50, 1)),
        2,
        2,
        matrix=matrix,
    )


def test_kmeans_recovers_separated_clusters():
    means = np.array([[3.0, 0.0, 0.0, 0.0], [0.0, 3.0, 0.0, 0.0], [0.0, 0.0, -3.0, 1.0]])
    points = _blobs(means, 40, 5)
    blob_means = points.reshape(3, 40, DIM).mean(axis=1)
    keys = jax.random.split(jax.random.key(2), 3)
    centres = jax.jit(jax.vmap(lambda k: features.kmeans(k, _f32(points), 3)))(keys)
    for c in np.asarray(centres):
        order = np.argmin(((c[:, None, :] - blob_means[None]) ** 2).sum(-1), axis=1)
        assert sorted(order.tolist()) == [0, 1, 2]
        np.testing.assert_allclose(c, blob_means[order], atol=1e-5)
    labels = features.assign_clusters(_f32(points), centres[0])
    labels = np.asarray(labels).reshape(3, 40)
    assert np.all(labels == labels[:, :1]) and len(set(labels[:, 0].tolist())) == 3
    random_init = features.kmeans(jax.random.key(3), _f32(points), 3, init="random")
    assert random_init.shape == (3, DIM)


def test_cluster_adapted_diagonals_closed_forms():
    x = np.array([[0.7, -0.4, 0.3, 0.5]])
    y = np.array([[0.2, 0.6, 0.9, -0.1]])
    alpha = np.asarray(features.cluster_adapted_diagonals(_f32(x), _f32(y), matrix="complex"))[0, 0]
    np.testing.assert_allclose(alpha * x[0] + y[0] / alpha, 0.0, atol=1e-6)  # Eq. 17, 85-87
    real = np.asarray(features.cluster_adapted_diagonals(_f32(x), _f32(y)))[0, 0]
    loss = np.sum((real * x[0] + y[0] / real) ** 2)
    np.testing.assert_allclose(loss, 4 * np.sum(np.clip(x[0] * y[0], 0, None)), rtol=1e-5)
    # Degenerate coordinates: x = y = 0 -> 1, x = 0 != y -> max_scale, y = 0 != x -> 1/max_scale.
    degenerate = features.cluster_adapted_diagonals(
        _f32([[0.0, 0.0, 0.5, 1.0]]), _f32([[0.0, 0.3, 0.0, 1.0]]), max_scale=8.0
    )
    np.testing.assert_allclose(degenerate[0, 0], [1.0, 8.0, 1 / 8.0, 1.0], rtol=1e-6)


# --------------------------------------------------------------------------------------------
# Unbiasedness of every hybrid (and the CE estimator) under two couplings
# --------------------------------------------------------------------------------------------

UNBIASED_X, UNBIASED_Y = _pair(0.8, 0.7, 2.2)
RADIUS = 0.8
# Cluster inputs: near (not at) a query centre and a key centre of different clusters.
CLUSTER_X = QUERY_MEANS[0] + np.array([0.04, -0.03, 0.02, 0.05])
CLUSTER_Y = KEY_MEANS[1] + np.array([-0.02, 0.05, 0.03, -0.04])


def _both_sides(fn, x, y):
    return features.estimate(fn(x, "query"), fn(y, "key"))


@functools.cache
def _unbiased_draws(coupling: str) -> dict[str, np.ndarray]:
    w1, w2, tau = _projection_sets(
        coupling, {"gaussian": 21, "orthogonal": 22}[coupling], UNBIASED_DRAWS
    )
    x, y = _f32(UNBIASED_X), _f32(UNBIASED_Y)
    cx, cy = _f32(CLUSTER_X), _f32(CLUSTER_Y)
    real_params, complex_params = _cluster_parameters("real"), _cluster_parameters("complex")

    def angular(w_pos, w_trig):
        return lambda u, side: features.angular_hybrid_features(u, w_pos, w_trig, tau, side=side)

    def gaussian(estimator):
        return lambda u, side: features.gaussian_hybrid_features(
            u,
            w1,
            w2,
            tau,
            side=side,
            bandwidth=BANDWIDTH,
            radius=RADIUS,
            coefficient_estimator=estimator,
        )

    def cluster(params, mixture, bandwidth=None):
        # The cluster features add axes of their own: map over the batched projection instead.
        def one_draw(w):
            return _both_sides(
                lambda u, side: features.cluster_hybrid_features(
                    u, w, params, side=side, mixture=mixture, bandwidth=bandwidth
                ),
                cx,
                cy,
            )

        return jax.vmap(one_draw)(w1)

    def ce(u, side):
        return features.complex_exponential_features(u, w1, COMPLEX_A, side=side)

    draws = {
        "complex_exponential": _both_sides(ce, x, y),
        "angular_independent": _both_sides(angular(w1, w2), x, y),
        "angular_shared": _both_sides(angular(w1, w1), x, y),
        "gaussian_trigonometric": _both_sides(gaussian("trigonometric"), x, y),
        "gaussian_positive": _both_sides(gaussian("positive"), x, y),
        "cluster_zero_one_real": cluster(real_params, "zero_one"),
        "cluster_zero_one_complex": cluster(complex_params, "zero_one"),
        "cluster_gaussian": cluster(complex_params, "gaussian", 0.3),
    }
    return {k: np.asarray(v, np.float64) for k, v in draws.items()}


UNBIASED_NAMES = (
    "complex_exponential",
    "angular_independent",
    "angular_shared",
    "gaussian_trigonometric",
    "gaussian_positive",
    "cluster_zero_one_real",
    "cluster_zero_one_complex",
    "cluster_gaussian",
)


@pytest.mark.parametrize(  # orthogonal (coupled rows) by default, i.i.d. in the full suite
    "coupling",
    representatives(COUPLINGS, ("orthogonal",)),
)
@pytest.mark.parametrize("name", UNBIASED_NAMES)
def test_unbiased(coupling, name):
    samples = _unbiased_draws(coupling)[name]
    if name.startswith("cluster"):
        truth = float(kernels.softmax(CLUSTER_X, CLUSTER_Y))
    else:
        truth = float(kernels.softmax(UNBIASED_X, UNBIASED_Y))
    assert np.std(samples) > 0  # a genuinely random estimate at these inputs
    _assert_within(samples, truth)


# --------------------------------------------------------------------------------------------
# Zero-variance cases: exact for every draw
# --------------------------------------------------------------------------------------------


ZERO_VARIANCE_DRAWS = 32


def _assert_exact(values, truth):
    values = np.asarray(values, np.float64)
    assert values.shape[0] == ZERO_VARIANCE_DRAWS  # one value per independent draw
    np.testing.assert_allclose(values, np.broadcast_to(truth, values.shape), rtol=2e-5)


def test_angular_hybrid_zero_variance_at_both_ends():
    # Equal norms, theta = 0 (row 0) and theta = pi (row 1); variants I and II.
    x, y = _pair(1.1, 1.1, 0.0)[0], _pair(1.1, 1.1, math.pi)[1]
    w1, w2, tau = _projection_sets("gaussian", 99, ZERO_VARIANCE_DRAWS)
    for w_trig in (w2, w1):
        for a, b in ((x, x), (x, y)):
            _assert_exact(
                _both_sides(
                    lambda u, s, w=w_trig: features.angular_hybrid_features(u, w1, w, tau, side=s),
                    _f32(a),
                    _f32(b),
                ),
                math.exp(a @ b),
            )


def test_base_estimators_zero_variance():
    x = _pair(1.1, 1.1, 0.0)[0]
    (w,) = _projection_sets("gaussian", 98, ZERO_VARIANCE_DRAWS, (NUM_FEATURES,))
    phi = features.trigonometric_features(_f32(x), w)
    _assert_exact(features.estimate(phi, phi), math.exp(x @ x))  # theta = 0
    positive = features.estimate(
        features.positive_features(_f32(x), w, antithetic=True),
        features.positive_features(_f32(-x), w, antithetic=True),
    )
    _assert_exact(positive, math.exp(-x @ x))  # theta = pi


def test_complex_exponential_zero_variance_where_u_vanishes():
    # Real dense A: y = -A^T A x gives A x + A^{-T} y = 0 (Eq. 17).
    x = np.array([0.3, -0.2, 0.4, 0.1])
    y = -(REAL_A.astype(np.float64).T @ REAL_A.astype(np.float64) @ x)
    # Complex diagonal A from Eq. 85-87 for a generic pair.
    x2, y2 = np.array([0.7, -0.4, 0.3, 0.5]), np.array([0.2, 0.6, 0.9, -0.1])
    alpha = features.cluster_adapted_diagonals(_f32(x2[None]), _f32(y2[None]), matrix="complex")
    (w,) = _projection_sets("gaussian", 97, ZERO_VARIANCE_DRAWS, (NUM_FEATURES,))
    for matrix, a, b in ((REAL_A, x, y), (alpha[0, 0], x2, y2)):
        np.testing.assert_allclose(theory.complex_exponential_mse(a, b, matrix, 4), 0.0, atol=1e-9)
        estimates = _both_sides(
            lambda u, s, matrix=matrix: features.complex_exponential_features(u, w, matrix, side=s),
            _f32(a),
            _f32(b),
        )
        _assert_exact(estimates, math.exp(a @ b))


def test_cluster_hybrid_exact_at_the_centres():
    params = _cluster_parameters("complex")
    centres_q, centres_k = np.asarray(params.query_centres), np.asarray(params.key_centres)
    (w,) = _projection_sets("gaussian", 96, ZERO_VARIANCE_DRAWS, (NUM_FEATURES,))
    for i in range(2):
        for j in range(2):
            estimates = _both_sides(
                lambda u, s: features.cluster_hybrid_features(u, w, params, side=s),
                _f32(centres_q[i]),
                _f32(centres_k[j]),
            )
            _assert_exact(estimates, math.exp(centres_q[i] @ centres_k[j]))


@pytest.mark.parametrize("estimator, angle", (("trigonometric", math.pi), ("positive", 0.0)))
def test_gaussian_hybrid_selects_the_exact_base(estimator, angle):
    # On S(r): trig-estimated lambda-hat = 1 exactly at theta = pi (the ++ estimate, exact there);
    # positive-estimated lambda-hat = 0 exactly at theta = 0 (the trig estimate, exact there).
    x, y = _pair(RADIUS, RADIUS, angle)
    w1, w2, tau = _projection_sets("gaussian", 95, ZERO_VARIANCE_DRAWS)
    estimates = _both_sides(
        lambda u, s: features.gaussian_hybrid_features(
            u,
            w1,
            w2,
            tau,
            side=s,
            bandwidth=BANDWIDTH,
            radius=RADIUS,
            coefficient_estimator=estimator,
        ),
        _f32(x),
        _f32(y),
    )
    _assert_exact(estimates, math.exp(x @ y))


# --------------------------------------------------------------------------------------------
# Theory against Monte Carlo (i.i.d. Gaussian projections, m = 8, n = 4)
# --------------------------------------------------------------------------------------------


@functools.cache
def _theory_draws(norm_x: float, norm_y: float, angle: float) -> dict[str, np.ndarray]:
    """THEORY_DRAWS independent i.i.d. draws of each estimator at one pair (fixed keys)."""
    x, y = map(_f32, _pair(norm_x, norm_y, angle))
    w1, w2, tau = _projection_sets("gaussian", 2022, THEORY_DRAWS)

    def hybrid(w_trig):
        return _both_sides(
            lambda u, s: features.angular_hybrid_features(u, w1, w_trig, tau, side=s), x, y
        )

    signs = features.estimate(features.angular_features(x, tau), features.angular_features(y, tau))
    draws = {
        "positive": features.estimate(
            features.positive_features(x, w1, antithetic=True),
            features.positive_features(y, w1, antithetic=True),
        ),
        "trig": features.estimate(
            features.trigonometric_features(x, w1), features.trigonometric_features(y, w1)
        ),
        "lambda": 0.5 - 0.5 * signs,
        "independent": hybrid(w2),
        "shared": hybrid(w1),
    }
    return {k: np.asarray(v, np.float64) for k, v in draws.items()}


def _squared_errors(norm_x, norm_y, angle, name):
    x, y = _pair(norm_x, norm_y, angle)
    return (_theory_draws(norm_x, norm_y, angle)[name] - math.exp(x @ y)) ** 2


def test_lemma_2_2_trigonometric_and_positive_mse():
    x, y = _pair(0.8, 0.6, math.acos(0.3))
    _assert_within(
        _squared_errors(0.8, 0.6, math.acos(0.3), "trig"), theory.trigonometric_mse(x, y, 8)
    )
    _assert_within(
        _squared_errors(0.8, 0.6, math.acos(0.3), "positive"),
        theory.positive_antithetic_mse(x, y, 8),
    )


@pytest.mark.parametrize("kind", ("complex", "real"))
def test_complex_exponential_mse(kind):
    matrix = COMPLEX_A if kind == "complex" else REAL_A
    x, y = _pair(0.7, 0.6, 1.4)
    num_features = 4

    (w,) = _projection_sets("gaussian", 5, THEORY_DRAWS, (num_features,))
    values = _both_sides(
        lambda u, s: features.complex_exponential_features(u, w, matrix, side=s), _f32(x), _f32(y)
    )
    values = np.asarray(values, np.float64)
    sm = math.exp(x @ y)
    _assert_within(values, sm)
    _assert_within((values - sm) ** 2, theory.complex_exponential_mse(x, y, matrix, num_features))


def test_theorem_3_1_both_variants_discriminating_setting():
    # docs/maths/hybrid.md: m = 8, n = 4, |x| = 1.3, |y| = 0.3, theta = 2: variant II is well
    # below variant I.
    args = (1.3, 0.3, 2.0)
    x, y = _pair(*args)
    predicted_i = theory.angular_hybrid_mse(x, y, 8, 4, variant="independent")
    predicted_ii = theory.angular_hybrid_mse(x, y, 8, 4, variant="shared")
    _assert_within(_squared_errors(*args, "independent"), predicted_i)
    _assert_within(_squared_errors(*args, "shared"), predicted_ii)
    measured_ii, se_ii = _mean_se(_squared_errors(*args, "shared"))
    assert abs(measured_ii - predicted_i) > NSIG * se_ii  # the check tells the variants apart
    np.testing.assert_allclose([predicted_i, predicted_ii], [0.1070, 0.0747], rtol=5e-3)


@pytest.fixture
def float64():
    """The closed forms of rfjax.theory are float64 only with x64 enabled."""
    with jax.enable_x64(True):
        yield


def test_lemma_3_2_coefficient_moments(float64):
    args = (1.3, 0.3, 2.0)
    x, y = _pair(*args)
    moments = theory.angular_coefficient_moments(x, y, NUM_SIGNS)
    lam = _theory_draws(*args)["lambda"]
    np.testing.assert_allclose(moments.mean, 2.0 / math.pi, rtol=1e-12)
    _assert_within(lam, moments.mean)
    _assert_within((lam - moments.mean) ** 2, moments.variance)
    _assert_within(lam * (1 - lam), moments.cross_moment)


# (++ at theta = pi and trig at theta = 0 have zero variance: see the zero-variance tests.)
@pytest.mark.parametrize("angle, name", ((math.pi, "trig"), (1.0, "trig"), (1.0, "positive")))
def test_lemma_3_4_relative_errors(angle, name):
    r = 0.8
    sm2 = math.exp(2 * r * r * math.cos(angle))
    relative_error = {
        "trig": theory.trigonometric_relative_error,
        "positive": theory.positive_relative_error,
    }[name]
    _assert_within(_squared_errors(r, r, angle, name) / sm2, relative_error(angle, r, 8) ** 2)


@pytest.mark.parametrize("variant", ("independent", "shared"))
def test_angular_hybrid_relative_error(variant):
    r, angle = 0.9, 2.0
    sm2 = math.exp(2 * r * r * math.cos(angle))
    _assert_within(
        _squared_errors(r, r, angle, variant) / sm2,
        theory.angular_hybrid_relative_error(angle, r, 8, NUM_SIGNS) ** 2,
    )


def test_theory_identities(float64):
    r = 1.1
    thetas = np.linspace(0.0, math.pi, 2001)
    x = np.stack([np.full_like(thetas, r), np.zeros_like(thetas), *[np.zeros_like(thetas)] * 2], -1)
    y = np.stack([r * np.cos(thetas), r * np.sin(thetas), *[np.zeros_like(thetas)] * 2], -1)
    sm = np.exp(r * r * np.cos(thetas))
    hyb = theory.angular_hybrid_relative_error(thetas, r, 8, NUM_SIGNS)
    for variant in ("independent", "shared"):  # equal norms: the variants coincide
        np.testing.assert_allclose(
            np.sqrt(theory.angular_hybrid_mse(x, y, 8, NUM_SIGNS, variant=variant)) / sm,
            hyb,
            rtol=1e-9,
            atol=1e-12,
        )
    np.testing.assert_allclose(
        np.sqrt(theory.trigonometric_mse(x, y, 8)) / sm,
        theory.trigonometric_relative_error(thetas, r, 8),
        rtol=1e-9,
        atol=1e-12,
    )
    trig_max = theory.trigonometric_relative_error(thetas, r, 8).max()
    positive_max = theory.positive_relative_error(thetas, r, 8).max()
    np.testing.assert_allclose(
        [trig_max, positive_max], theory.max_relative_error(r, 8), rtol=1e-12
    )
    assert hyb[0] == 0.0 and hyb[-1] < 1e-12 and hyb.max() < trig_max
    # CE with A = iI has the trigonometric MSE, with A = I the plain positive (PRF) MSE.
    xa, ya = _pair(0.9, 0.5, 1.2)
    np.testing.assert_allclose(
        theory.complex_exponential_mse(xa, ya, 1j * np.eye(DIM), 8),
        theory.trigonometric_mse(xa, ya, 8),
        rtol=1e-9,
    )
    np.testing.assert_allclose(
        theory.complex_exponential_mse(xa, ya, np.eye(DIM), 8),
        theory.prf_mse(xa, ya, 8, kernel="softmax"),
        rtol=1e-9,
    )


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


def test_singular_matrix_is_rejected():
    w = projections.gaussian(jax.random.key(0), DIM, NUM_FEATURES)
    x = jnp.ones(DIM)
    singular = jnp.eye(DIM).at[2, 2].set(0.0)
    for matrix in (singular, jnp.diagonal(singular), jnp.ones((DIM, DIM), jnp.complex64)):
        with pytest.raises(ValueError, match="invertible"):
            features.complex_exponential_features(x, w, matrix, side="key")
        with pytest.raises(ValueError, match="invertible"):
            theory.complex_exponential_mse(np.ones(DIM), np.ones(DIM), np.asarray(matrix), 4)
    with pytest.raises(ValueError, match="shape"):
        features.complex_exponential_features(x, w, jnp.eye(DIM + 1), side="query")
    with pytest.raises(TypeError, match="matrix"):
        features.complex_exponential_features(x, w, jnp.eye(DIM, dtype=jnp.int32), side="query")
    with pytest.raises(ValueError, match="side"):
        features.complex_exponential_features(x, w, jnp.eye(DIM), side="value")


def test_mismatched_clusters_are_rejected():
    params = _cluster_parameters("real")
    w = projections.gaussian(jax.random.key(0), DIM, NUM_FEATURES)
    bad = features.ClusterHybridParameters(
        params.query_centres, jnp.concatenate([params.key_centres] * 2), params.diagonals
    )
    with pytest.raises(ValueError, match="numbers of query and key clusters"):
        features.cluster_hybrid_features(jnp.ones(DIM), w, bad, side="query")
    zero = features.ClusterHybridParameters(
        params.query_centres, params.key_centres, params.diagonals.at[0, 1, 2].set(0.0)
    )
    with pytest.raises(ValueError, match="invertible"):
        features.cluster_hybrid_features(jnp.ones(DIM), w, zero, side="key")
    with pytest.raises(ValueError, match="num_clusters"):
        features.kmeans(jax.random.key(0), jnp.ones((3, DIM)), 4)
    with pytest.raises(ValueError, match="num_clusters"):
        features.kmeans(jax.random.key(0), jnp.ones((3, DIM)), 0)
    with pytest.raises(ValueError, match="same d"):
        features.fit_cluster_hybrid(jax.random.key(0), jnp.ones((5, DIM)), jnp.ones((5, 3)), 2, 2)
    with pytest.raises(ValueError, match="bandwidth"):
        features.cluster_hybrid_features(jnp.ones(DIM), w, params, side="query", mixture="gaussian")
    with pytest.raises(ValueError, match="bandwidth"):
        features.cluster_hybrid_features(jnp.ones(DIM), w, params, side="query", bandwidth=1.0)


def test_bad_hybrid_inputs_are_rejected():
    w = projections.gaussian(jax.random.key(0), DIM, NUM_FEATURES)
    tau = projections.gaussian(jax.random.key(1), DIM, NUM_SIGNS)
    no_signs = projections.DenseProjection(jnp.zeros((0, DIM)))
    x = jnp.ones(DIM)
    with pytest.raises(ValueError, match="n >= 1"):
        features.angular_hybrid_features(x, w, w, no_signs, side="query")
    with pytest.raises(ValueError, match="independently"):
        features.angular_hybrid_features(x, w, w, w, side="query")
    with pytest.raises(ValueError, match="num_sign_features"):
        theory.angular_hybrid_mse(np.ones(DIM), np.ones(DIM), 8, 0)
    with pytest.raises(ValueError, match="num_sign_features"):
        theory.angular_hybrid_relative_error(1.0, 1.0, 8, 0)
    with pytest.raises(ValueError, match="variant"):
        theory.angular_hybrid_mse(np.ones(DIM), np.ones(DIM), 8, 4, variant="both")
    with pytest.raises(ValueError, match="theta"):
        theory.trigonometric_relative_error(4.0, 1.0, 8)
    with pytest.raises(ValueError, match="radius"):
        features.gaussian_hybrid_features(x, w, w, tau, side="key", bandwidth=1.0, radius=0.0)
    with pytest.raises(ValueError, match="coefficient_features"):
        features.hybrid_query_features([x, x], [], [])
    with pytest.raises(ValueError, match="offsets"):
        features.hybrid_query_features([x, x], [x], [0.5, 0.5])
    with pytest.raises(ValueError, match="p coefficient"):
        features.hybrid_estimate([1.0, 2.0], [])
    with pytest.raises(TypeError, match="FeaturePair"):
        features.hybrid_features([(x, x)], [], [])


@pytest.mark.parametrize("side", ["query", "key"])
def test_hybrid_features_take_lists_on_both_sides(side):
    # Issue 32 item 7: gaussian_hybrid_features(list, ..., side="key") failed with "bad operand
    # type for unary -: 'list'" while side="query" took the list: inputs are converted once, at
    # the boundary, for both hybrids; integer inputs are still rejected there.
    w = projections.gaussian(jax.random.key(0), DIM, NUM_FEATURES)
    tau = projections.gaussian(jax.random.key(1), DIM, NUM_SIGNS)
    rows = np.asarray(jax.random.normal(jax.random.key(2), (3, DIM)))
    gaussian = functools.partial(
        features.gaussian_hybrid_features, side=side, bandwidth=1.0, radius=1.0
    )
    angular = functools.partial(features.angular_hybrid_features, side=side)
    for hybrid in (gaussian, angular):
        from_list = hybrid(rows.tolist(), w, w, tau)
        np.testing.assert_array_equal(from_list, hybrid(jnp.asarray(rows, jnp.float32), w, w, tau))
        with pytest.raises(TypeError, match="x must be a floating array"):
            hybrid(np.ones((3, DIM), np.int32), w, w, tau)
