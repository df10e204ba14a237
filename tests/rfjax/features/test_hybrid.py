"""Hybrid random features: CE features, Lemma 2.3, angular/Gaussian/cluster hybrids, HRF theory.

Statistical checks use fixed keys and pass when |measured - predicted| <= 4 standard errors.
Zero-variance checks hold for every draw to float32 rounding.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import features, kernels, projections, theory
from tests.support.hybrid_points import (
    COMPLEX_A,
    DIM,
    KEY_MEANS,
    NUM_FEATURES,
    QUERY_MEANS,
    REAL_A,
    cluster_parameters,
    f32,
    pair,
)
from tests.support.representatives import representatives

NSIG = 4.0
NUM_SIGNS = 4  # n
THEORY_DRAWS = 20_000
UNBIASED_DRAWS = 4_000
COUPLINGS = ("gaussian", "orthogonal")
BANDWIDTH = 1.3


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
    xs = f32(np.random.default_rng(0).normal(scale=0.5, size=(5, DIM)))
    ys = f32(np.random.default_rng(1).normal(scale=0.5, size=(3, DIM)))

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
    query = jax.jit(lambda b, c: features.hybrid_query_features(b, c, offsets))(bx, cx)
    np.testing.assert_array_equal(query, pair.query)
    np.testing.assert_array_equal(jax.jit(features.hybrid_key_features)(by, cy), pair.key)


@jax.jit
def _gram_flat_and_parts(fmap, w, xs, ys):
    gram = features.hybrid_gram(
        fmap.hybrid_parts(xs, w, side="query"), fmap.hybrid_parts(ys, w, side="key")
    )
    flat = fmap.features(xs, w, side="query") @ fmap.features(ys, w, side="key").T
    return gram, flat, fmap.hybrid_parts(xs, w, side="query")


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
    xs = f32(np.random.default_rng(2).normal(scale=1.2, size=(6, DIM)))
    ys = f32(np.random.default_rng(3).normal(scale=0.4, size=(7, DIM)))
    gram, flat, parts = _gram_flat_and_parts(fmap, w, xs, ys)
    np.testing.assert_allclose(gram, flat, rtol=2e-5, atol=1e-6 * float(np.max(np.abs(flat))))
    with pytest.raises(ValueError, match="query-side and key-side"):
        features.hybrid_gram(parts, parts)


def test_kronecker_blocks_are_in_numpy_kron_order():
    # Lemma 2.3's layout: index l w + j of rho (x) phi holds rho_l phi_j, as np.kron.
    phi, last, rho = jnp.array([1.0, 2.0, 3.0]), jnp.array([11.0, 13.0]), jnp.array([5.0, 7.0])
    query = features.hybrid_query_features([phi, last], [rho], [0.25])
    want = [0.25 * phi, np.kron(rho, phi), 0.75 * last, np.kron(rho, last)]
    np.testing.assert_array_equal(query, np.concatenate(want))
    key = features.hybrid_key_features([phi, last], [rho])
    np.testing.assert_array_equal(
        key, np.concatenate([phi, np.kron(rho, phi), last, -np.kron(rho, last)])
    )


def test_hybrid_gram_is_zero_where_the_estimate_is_zero_and_the_scale_overflows():
    # e^(s_i + s_j) = inf in float32: an estimate that is exactly 0 stays 0 (never 0 * inf =
    # NaN); a nonzero one is +-inf (hybrid_gram's docstring).
    def parts(base, log_scale, side):
        bases = [jnp.zeros((1, 2)), jnp.full((1, 2), base)]
        return features.HybridParts(bases, [jnp.ones((1, 1))], jnp.array([log_scale]), (0.5,), side)

    with pytest.raises(ValueError, match="same hybrid estimator"):
        features.hybrid_gram(
            parts(0.0, 0.0, "query"), dataclasses.replace(parts(0.0, 0.0, "key"), offsets=(0.2,))
        )
    for base, want in ((0.0, 0.0), (1.0, -np.inf)):  # lambda-hat = 1.5: -0.5 * 2 e^100
        gram = features.hybrid_gram(parts(base, 100.0, "query"), parts(base, 0.0, "key"))
        np.testing.assert_array_equal(gram, [[want]])


def test_hybrid_bases_share_the_larger_log_scale():
    # s = max(max_i l_i, |x|^2/2 - log(m)/2) (l the positive log-features): no base entry of
    # psi exceeds 1 whichever base dominates (a row along the longest w_i: the positive one;
    # a long row: the trigonometric one), so neither overflows in attention's shifted form.
    fmap = features.AngularHybridFeatureMap(num_sign_features=NUM_SIGNS).init(
        jax.random.key(0), DIM
    )
    w = projections.gaussian(jax.random.key(1), DIM, NUM_FEATURES)
    rows = w.matrix()
    longest = rows[jnp.argmax(jnp.sum(rows**2, axis=-1))]
    x = jnp.stack([longest / jnp.linalg.norm(longest), jnp.full(DIM, 3.0)])
    for side in features.SIDES:
        bases = fmap.hybrid_parts(x, w, side=side).bases
        largest = jnp.max(jnp.abs(jnp.concatenate(bases, axis=-1)), axis=-1)
        assert bool(jnp.all(largest <= 1.0 + 1e-6)), largest
        np.testing.assert_allclose(jnp.max(bases[0][0]), 1.0, rtol=1e-6)


@pytest.mark.parametrize("estimator", ("trigonometric", "positive"))
def test_gaussian_hybrid_coefficient_estimates_the_normalised_gaussian_kernel(estimator):
    # lambda-hat = a + rho(x).eta(y) estimates (exp(-|x + y|^2 / (2 tau^2)) - c) / (1 - c),
    # c = exp(-2 r^2 / tau^2) (HRF Eq. 20 as reconstructed), within 4 SE of the n i.i.d.
    # per-projection terms; tau != 1 and |x| != r so that the bandwidth and c both matter.
    n = 8192
    fmap = features.GaussianHybridFeatureMap(
        num_coefficient_features=n,
        bandwidth=BANDWIDTH,
        radius=RADIUS,
        coefficient_estimator=estimator,
    ).init(jax.random.key(6), DIM)
    w = projections.gaussian(jax.random.key(7), DIM, NUM_FEATURES)
    x, y = map(f32, pair(0.9, 0.7, 2.0))
    query, key = fmap.hybrid_parts(x, w, side="query"), fmap.hybrid_parts(y, w, side="key")
    (offset,), (rho,), (eta,) = query.offsets, query.coefficients, key.coefficients
    products = np.asarray(rho, np.float64) * np.asarray(eta, np.float64)
    if estimator == "trigonometric":  # [sin, cos]: one term per projection from both halves
        products = products[:n] + products[n:]
    c = math.exp(-2.0 * RADIUS**2 / BANDWIDTH**2)
    exact = (math.exp(-np.sum((x + y) ** 2) / (2.0 * BANDWIDTH**2)) - c) / (1.0 - c)
    terms = n * products
    se = terms.std(ddof=1) / math.sqrt(n)
    np.testing.assert_allclose(offset, -c / (1.0 - c), rtol=1e-12)
    assert abs(offset + terms.mean() - exact) <= NSIG * se, (offset + terms.mean(), exact, se)


def test_angular_hybrid_is_eq_12():
    keys = jax.random.split(jax.random.key(4), 3)
    w1 = projections.gaussian(keys[0], DIM, NUM_FEATURES)
    w2 = projections.gaussian(keys[1], DIM, 5)
    tau = projections.gaussian(keys[2], DIM, NUM_SIGNS)
    x, y = map(f32, pair(1.3, 0.3, 2.0))

    @jax.jit
    def hybrid_and_eq_12(x, y, w1, w2, tau):
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
        return query, features.estimate(query, key), lam * positive + (1 - lam) * trig

    query, hybrid, eq_12 = hybrid_and_eq_12(x, y, w1, w2, tau)
    assert query.shape == ((2 * NUM_FEATURES + 2 * 5) * (NUM_SIGNS + 1),)
    np.testing.assert_allclose(hybrid, eq_12, rtol=1e-5)


# --------------------------------------------------------------------------------------------
# Unbiasedness of every hybrid (and the CE estimator) under two couplings
# --------------------------------------------------------------------------------------------

UNBIASED_X, UNBIASED_Y = pair(0.8, 0.7, 2.2)
RADIUS = 0.8
# Cluster inputs: near (not at) a query centre and a key centre of different clusters.
CLUSTER_X = QUERY_MEANS[0] + np.array([0.04, -0.03, 0.02, 0.05])
CLUSTER_Y = KEY_MEANS[1] + np.array([-0.02, 0.05, 0.03, -0.04])


def _both_sides(fn, x, y):
    return features.estimate(fn(x, "query"), fn(y, "key"))


@functools.cache
def _jitted_both_sides(fn):
    return jax.jit(lambda x, y, *ps: _both_sides(lambda u, side: fn(u, side, *ps), x, y))


def _jit_both_sides(fn, x, y, *projections):
    """``_both_sides`` compiled as one program (once per ``fn``): ``fn(u, side, *projections)``."""
    return _jitted_both_sides(fn)(x, y, *projections)


def _angular_hybrid(u, side, w_pos, w_trig, tau):
    return features.angular_hybrid_features(u, w_pos, w_trig, tau, side=side)


def _complex_exponential(u, side, w, matrix):
    return features.complex_exponential_features(u, w, matrix, side=side)


def _cluster_hybrid(u, side, w, params):
    return features.cluster_hybrid_features(u, w, params, side=side)


@functools.cache
def _unbiased_draws(coupling: str) -> dict[str, np.ndarray]:
    w1, w2, tau = _projection_sets(
        coupling, {"gaussian": 21, "orthogonal": 22}[coupling], UNBIASED_DRAWS
    )
    params = cluster_parameters("real"), cluster_parameters("complex")
    draws = _unbiased_estimates(w1, w2, tau, params)
    return {k: np.asarray(v, np.float64) for k, v in draws.items()}


@jax.jit
def _unbiased_estimates(w1, w2, tau, params) -> dict[str, jax.Array]:
    x, y = f32(UNBIASED_X), f32(UNBIASED_Y)
    cx, cy = f32(CLUSTER_X), f32(CLUSTER_Y)
    real_params, complex_params = params

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
    return draws


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
    x, y = pair(1.1, 1.1, 0.0)[0], pair(1.1, 1.1, math.pi)[1]
    w1, w2, tau = _projection_sets("gaussian", 99, ZERO_VARIANCE_DRAWS)
    for w_trig in (w2, w1):
        for a, b in ((x, x), (x, y)):
            _assert_exact(
                _jit_both_sides(_angular_hybrid, f32(a), f32(b), w1, w_trig, tau),
                math.exp(a @ b),
            )


def test_base_estimators_zero_variance():
    x = pair(1.1, 1.1, 0.0)[0]
    (w,) = _projection_sets("gaussian", 98, ZERO_VARIANCE_DRAWS, (NUM_FEATURES,))

    @jax.jit
    def estimates(x, w):
        phi = features.trigonometric_features(x, w)
        positive = features.estimate(
            features.positive_features(x, w, antithetic=True),
            features.positive_features(-x, w, antithetic=True),
        )
        return features.estimate(phi, phi), positive

    trig, positive = estimates(f32(x), w)
    _assert_exact(trig, math.exp(x @ x))  # theta = 0
    _assert_exact(positive, math.exp(-x @ x))  # theta = pi


def test_complex_exponential_zero_variance_where_u_vanishes():
    # Real dense A: y = -A^T A x gives A x + A^{-T} y = 0 (Eq. 17).
    x = np.array([0.3, -0.2, 0.4, 0.1])
    y = -(REAL_A.astype(np.float64).T @ REAL_A.astype(np.float64) @ x)
    # Complex diagonal A from Eq. 85-87 for a generic pair.
    x2, y2 = np.array([0.7, -0.4, 0.3, 0.5]), np.array([0.2, 0.6, 0.9, -0.1])
    alpha = jax.jit(features.cluster_adapted_diagonals, static_argnames="matrix")(
        f32(x2[None]), f32(y2[None]), matrix="complex"
    )
    (w,) = _projection_sets("gaussian", 97, ZERO_VARIANCE_DRAWS, (NUM_FEATURES,))
    for matrix, a, b in ((REAL_A, x, y), (alpha[0, 0], x2, y2)):
        mse = jax.jit(lambda a, b, m=matrix: theory.complex_exponential_mse(a, b, m, 4))(a, b)
        np.testing.assert_allclose(mse, 0.0, atol=1e-9)
        estimates = _jit_both_sides(_complex_exponential, f32(a), f32(b), w, matrix)
        _assert_exact(estimates, math.exp(a @ b))


def test_cluster_hybrid_exact_at_the_centres():
    params = cluster_parameters("complex")
    centres_q, centres_k = np.asarray(params.query_centres), np.asarray(params.key_centres)
    (w,) = _projection_sets("gaussian", 96, ZERO_VARIANCE_DRAWS, (NUM_FEATURES,))
    for i in range(2):
        for j in range(2):
            estimates = _jit_both_sides(
                _cluster_hybrid, f32(centres_q[i]), f32(centres_k[j]), w, params
            )
            _assert_exact(estimates, math.exp(centres_q[i] @ centres_k[j]))


@pytest.mark.parametrize("estimator, angle", (("trigonometric", math.pi), ("positive", 0.0)))
def test_gaussian_hybrid_selects_the_exact_base(estimator, angle):
    # On S(r): trig-estimated lambda-hat = 1 exactly at theta = pi (the ++ estimate, exact there);
    # positive-estimated lambda-hat = 0 exactly at theta = 0 (the trig estimate, exact there).
    x, y = pair(RADIUS, RADIUS, angle)
    w1, w2, tau = _projection_sets("gaussian", 95, ZERO_VARIANCE_DRAWS)
    estimates = _jit_both_sides(
        lambda u, s, w1, w2, tau: features.gaussian_hybrid_features(
            u,
            w1,
            w2,
            tau,
            side=s,
            bandwidth=BANDWIDTH,
            radius=RADIUS,
            coefficient_estimator=estimator,
        ),
        f32(x),
        f32(y),
        w1,
        w2,
        tau,
    )
    _assert_exact(estimates, math.exp(x @ y))


# --------------------------------------------------------------------------------------------
# Theory against Monte Carlo (i.i.d. Gaussian projections, m = 8, n = 4)
# --------------------------------------------------------------------------------------------


@functools.cache
def _theory_draws(norm_x: float, norm_y: float, angle: float) -> dict[str, np.ndarray]:
    """THEORY_DRAWS independent i.i.d. draws of each estimator at one pair (fixed keys)."""
    x, y = map(f32, pair(norm_x, norm_y, angle))
    w1, w2, tau = _projection_sets("gaussian", 2022, THEORY_DRAWS)
    return {k: np.asarray(v, np.float64) for k, v in _theory_estimates(x, y, w1, w2, tau).items()}


@jax.jit
def _theory_estimates(x, y, w1, w2, tau) -> dict[str, jax.Array]:
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
    return draws


def _squared_errors(norm_x, norm_y, angle, name):
    x, y = pair(norm_x, norm_y, angle)
    return (_theory_draws(norm_x, norm_y, angle)[name] - math.exp(x @ y)) ** 2


def test_lemma_2_2_trigonometric_and_positive_mse():
    x, y = pair(0.8, 0.6, math.acos(0.3))
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
    x, y = pair(0.7, 0.6, 1.4)
    num_features = 4

    (w,) = _projection_sets("gaussian", 5, THEORY_DRAWS, (num_features,))
    values = _jit_both_sides(_complex_exponential, f32(x), f32(y), w, matrix)
    values = np.asarray(values, np.float64)
    sm = math.exp(x @ y)
    _assert_within(values, sm)
    _assert_within((values - sm) ** 2, theory.complex_exponential_mse(x, y, matrix, num_features))


def test_theorem_3_1_both_variants_discriminating_setting():
    # docs/maths/hybrid.md: m = 8, n = 4, |x| = 1.3, |y| = 0.3, theta = 2: variant II is well
    # below variant I.
    args = (1.3, 0.3, 2.0)
    x, y = pair(*args)
    predicted_i = theory.angular_hybrid_mse(x, y, 8, 4, variant="independent")
    predicted_ii = theory.angular_hybrid_mse(x, y, 8, 4, variant="shared")
    _assert_within(_squared_errors(*args, "independent"), predicted_i)
    _assert_within(_squared_errors(*args, "shared"), predicted_ii)
    measured_ii, se_ii = _mean_se(_squared_errors(*args, "shared"))
    assert abs(measured_ii - predicted_i) > NSIG * se_ii  # the check tells the variants apart
    np.testing.assert_allclose([predicted_i, predicted_ii], [0.1070, 0.0747], rtol=5e-3)


def test_lemma_3_2_coefficient_moments(float64):
    args = (1.3, 0.3, 2.0)
    x, y = pair(*args)
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


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


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
    # A projection of another dimension is named, not blamed on x; a radius / bandwidth whose
    # offset -c / (1 - c) is past float32 is named (an overflow blamed on |x| before).
    wide = projections.gaussian(jax.random.key(3), DIM + 1, NUM_SIGNS)
    with pytest.raises(ValueError, match="trigonometric_projection must have the input dim"):
        features.angular_hybrid_features(x, w, wide, tau, side="query")
    with pytest.raises(ValueError, match="sign_projection must have the input dimension"):
        features.angular_hybrid_features(x, w, w, wide, side="query")
    with pytest.raises(ValueError, match=r"radius / bandwidth = 1e-20 .* float32's range"):
        features.gaussian_hybrid_features(
            0.1 * x, w, w, tau, side="query", bandwidth=1e10, radius=1e-10
        )


def test_the_hybrids_overflow_message_names_the_factor_that_overflows():
    """At d = 256 the positive base e^(w.x - |x|^2/2) overflows float32 at |x| = 12, below the
    trigonometric base's 13.5, which the message gave as the bound it had passed."""
    w = projections.orthogonal(jax.random.key(0), 256, 128)
    row = w.matrix()[0]
    other = jax.random.normal(jax.random.key(2), (256,))  # a longer row that does not overflow
    x = jnp.stack([12.0 * row / jnp.linalg.norm(row), 13.0 * other / jnp.linalg.norm(other)])
    hybrid = features.AngularHybridFeatureMap(num_sign_features=4).init(jax.random.key(1), 256)
    with pytest.raises(ValueError, match=r"up to 12 give .* < 13.5 here, so another factor"):
        hybrid.features(x, w, side="query")


def test_the_hybrids_overflow_bound_is_the_trigonometric_bases():
    # e^(|x|^2/2 - log(m_t)/2) sets the bound: m_t = 128 trigonometric rows (13.5 in float32),
    # not the m_+ = 4 positive ones (13.37).
    w_pos = projections.gaussian(jax.random.key(0), DIM, 4)
    w_trig = projections.gaussian(jax.random.key(1), DIM, 128)
    tau = projections.gaussian(jax.random.key(2), DIM, NUM_SIGNS)
    x = f32(pair(14.0, 1.0, 0.0)[0])
    with pytest.raises(ValueError, match=r"finite for \|x\| < 13.5 here"):
        features.angular_hybrid_features(x, w_pos, w_trig, tau, side="query")


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
