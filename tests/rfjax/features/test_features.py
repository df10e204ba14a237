"""Feature maps across ``rfjax.features``: unbiasedness of every map under every coupling, shapes,
jit/vmap and float64, argument checks. Each module's own tests are in the file named for it."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import features, kernels, projections
from tests.support.feature_points import (
    COEFFICIENTS,
    COUPLINGS,
    DEFAULT_COUPLINGS,
    DIM,
    NUM_FEATURES,
    POLY_ROWS,
    POLY_WIDTH,
    X,
    Y,
    draw,
)
from tests.support.representatives import representatives

LENGTHSCALE = 1.5
NUM_DRAWS = 3000


def offsets_for(key, projection):
    # float32 offsets in every precision, so the float64 and float32 paths share them.
    return features.random_offsets(key, projection.num_features, dtype=jnp.float32)


def exact(kernel, **static):
    """The kernel value at (X, Y), compiled as one program."""
    return jax.jit(functools.partial(kernel, **static))(X, Y)


# name -> (phi(x, projection, key), exact kernel value at (X, Y)). ``key`` is independent of the
# projection's (used by cosine_features' offsets).
FEATURE_MAPS = {
    "fourier": (
        lambda x, w, k: features.fourier_features(x, w, lengthscale=LENGTHSCALE),
        exact(kernels.gaussian, lengthscale=LENGTHSCALE),
    ),
    "cosine": (
        lambda x, w, k: features.cosine_features(x, w, offsets_for(k, w), lengthscale=LENGTHSCALE),
        exact(kernels.gaussian, lengthscale=LENGTHSCALE),
    ),
    "positive_softmax": (lambda x, w, k: features.positive_features(x, w), exact(kernels.softmax)),
    "positive_gaussian": (
        lambda x, w, k: features.positive_features(
            x, w, kernel="gaussian", lengthscale=LENGTHSCALE
        ),
        exact(kernels.gaussian, lengthscale=LENGTHSCALE),
    ),
    "positive_softmax_antithetic": (
        lambda x, w, k: features.positive_features(x, w, antithetic=True),
        exact(kernels.softmax),
    ),
    "positive_gaussian_antithetic": (
        lambda x, w, k: features.positive_features(x, w, kernel="gaussian", antithetic=True),
        exact(kernels.gaussian),
    ),
    "trigonometric": (
        lambda x, w, k: features.trigonometric_features(x, w),
        exact(kernels.softmax),
    ),
    **{
        f"arccos{n}": (
            lambda x, w, k, n=n: features.arccos_features(x, w, order=n),
            exact(kernels.arccos, order=n),
        )
        for n in (0, 1, 2)
    },
    "angular": (lambda x, w, k: features.angular_features(x, w), exact(kernels.angular)),
    "linear": (lambda x, w, k: features.linear_features(x, w), exact(kernels.linear)),
    "polynomial": (
        lambda x, w, k: features.polynomial_features(x, w, coefficients=COEFFICIENTS),
        exact(kernels.polynomial, coefficients=COEFFICIENTS),
    ),
}


def rows_for(name):
    return POLY_ROWS if name == "polynomial" else NUM_FEATURES


def supported(coupling, name):
    """Pairs the maths says are unbiased: all, except polynomial with a one-block coupling."""
    return not (name == "polynomial" and coupling == "halton")


@functools.cache
def estimates(coupling):
    """NUM_DRAWS independent estimates phi(X).phi(Y) per feature map, float64 NumPy arrays.

    Within one draw all maps share the projection (so their estimates are correlated with each
    other), but the draws are independent, which is all the per-map test needs.
    """
    sampler = projections.get(coupling)
    names = [name for name in FEATURE_MAPS if supported(coupling, name)]
    x, y = jnp.asarray(X, jnp.float32), jnp.asarray(Y, jnp.float32)

    def one_draw(key):
        projection_key, polynomial_key, extra_key = jax.random.split(key, 3)
        w = {NUM_FEATURES: sampler(projection_key, DIM, NUM_FEATURES)}
        if "polynomial" in names:
            w[POLY_ROWS] = sampler(polynomial_key, DIM, POLY_ROWS)
        out = {}
        for name in names:
            phi, projection = FEATURE_MAPS[name][0], w[rows_for(name)]
            out[name] = features.estimate(
                phi(x, projection, extra_key), phi(y, projection, extra_key)
            )
        return out

    keys = jax.random.split(jax.random.key(20240601), NUM_DRAWS)
    return {k: np.asarray(v, np.float64) for k, v in jax.jit(jax.vmap(one_draw))(keys).items()}


# Polynomial features with a one-block coupling are rejected (test_polynomial_rejects_...).
@pytest.mark.parametrize(
    "coupling, name",
    representatives(
        [(c, n) for c in COUPLINGS for n in FEATURE_MAPS if supported(c, n)],
        DEFAULT_COUPLINGS,
        key=lambda case: case[0],
        unpack=True,
    ),
)
def test_unbiased(coupling, name):
    samples = estimates(coupling)[name]
    truth = float(FEATURE_MAPS[name][1])
    mean = samples.mean()
    se = samples.std(ddof=1) / math.sqrt(samples.size)
    assert se > 0
    assert abs(mean - truth) <= 4 * se, (coupling, name, mean, truth, se)


WIDTHS = {
    "fourier": 2 * NUM_FEATURES,
    "cosine": NUM_FEATURES,
    "positive_softmax": NUM_FEATURES,
    "positive_gaussian": NUM_FEATURES,
    "positive_softmax_antithetic": 2 * NUM_FEATURES,
    "positive_gaussian_antithetic": 2 * NUM_FEATURES,
    "trigonometric": 2 * NUM_FEATURES,
    "arccos0": NUM_FEATURES,
    "arccos1": NUM_FEATURES,
    "arccos2": NUM_FEATURES,
    "angular": NUM_FEATURES,
    "linear": NUM_FEATURES,
    "polynomial": POLY_WIDTH,
}


# One map per family in the default suite (Fourier, positive, trigonometric, arc-cosine).
REPRESENTATIVE_MAPS = ("fourier", "positive_softmax", "trigonometric", "arccos1")


@pytest.mark.parametrize("name", representatives(FEATURE_MAPS, REPRESENTATIVE_MAPS))
def test_shapes_determinism_jit_and_vmap(name):
    phi = FEATURE_MAPS[name][0]
    extra = jax.random.key(7)
    w = draw("orthogonal", rows_for(name))
    xs = jax.random.normal(jax.random.key(1), (3, 5, DIM)) * 0.5
    out = phi(xs, w, extra)
    assert out.shape == (3, 5, WIDTHS[name]) and out.dtype == jnp.float32
    # Same key, same features, bit for bit.
    np.testing.assert_array_equal(out, phi(xs, draw("orthogonal", rows_for(name)), extra))
    np.testing.assert_allclose(jax.jit(phi)(xs, w, extra), out, rtol=1e-5, atol=1e-6)
    # vmap over inputs.
    np.testing.assert_allclose(
        jax.jit(jax.vmap(phi, in_axes=(0, None, None)))(xs, w, extra), out, rtol=1e-5, atol=1e-6
    )
    # vmap over a batch of projections drawn with jax.vmap(sampler)(keys).
    keys = jax.random.split(jax.random.key(3), 4)
    sampler = functools.partial(projections.orthogonal, dim=DIM, num_features=rows_for(name))
    batch = jax.vmap(sampler)(keys)
    batched = jax.jit(jax.vmap(phi, in_axes=(None, 0, None)))(xs, batch, extra)
    for i, key in enumerate(keys):
        np.testing.assert_allclose(batched[i], phi(xs, sampler(key), extra), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", representatives(FEATURE_MAPS, REPRESENTATIVE_MAPS))
def test_float64(name):
    phi = FEATURE_MAPS[name][0]
    extra = jax.random.key(7)
    with jax.enable_x64(True):
        w = draw("simplex", rows_for(name), dtype=jnp.float64)
        out = jax.jit(phi)(jnp.asarray(X, jnp.float64), w, extra)
        assert out.dtype == jnp.float64
        # The same map in float32 (projection and input rounded) agrees to float32 accuracy.
        w32 = projections.DenseProjection(w.matrix().astype(jnp.float32), w.block_size)
        out32 = jax.jit(phi)(jnp.asarray(X, jnp.float32), w32, extra)
        assert out32.dtype == jnp.float32
        np.testing.assert_allclose(out, out32, rtol=1e-5, atol=1e-6)


W = draw("gaussian")
X32 = X.astype(np.float32)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: features.fourier_features(np.ones((2, DIM + 1), np.float32), W), ValueError, "x"),
        (lambda: features.positive_features(np.ones((2, DIM), np.int32), W), TypeError, "x"),
        (lambda: features.angular_features(X32, W.matrix()), TypeError, "projection"),
        (lambda: features.positive_features(X32, W, kernel="laplace"), ValueError, "kernel"),
        (lambda: features.positive_features(X32, W, stabilizer="global"), ValueError, "stabilizer"),
        (lambda: features.positive_features(X32, W, antithetic=1), TypeError, "antithetic"),
        (lambda: features.positive_features(X32, W, lengthscale=2.0), ValueError, "lengthscale"),
        (lambda: features.fourier_features(X32, W, lengthscale=-1.0), ValueError, "lengthscale"),
        (lambda: features.arccos_features(X32, W, order=3), ValueError, "order"),
        (lambda: features.arccos_features(X32, W, order="relu"), ValueError, "order"),
        (lambda: features.arccos_features(X32, W, order=1.0), ValueError, "order"),
        (
            lambda: features.cosine_features(X32, W, "abc"),
            TypeError,
            "offsets must be a numeric array",
        ),
        (
            lambda: features.generalized_exponential_features(X32, W, a="x"),
            TypeError,
            "a must be a numeric array",
        ),
        (lambda: features.PositiveFeatureMap(antithetic="yes"), TypeError, "antithetic"),
        (
            lambda: features.polynomial_features(X32, W, coefficients=(1.0,) * 4),
            ValueError,
            "multiple of l\\(l\\+1\\)/2 = 10",
        ),
        (
            lambda: features.polynomial_features(X32, W, coefficients=(1.0, -1.0)),
            ValueError,
            "coefficients",
        ),
        (
            lambda: features.cosine_features(X32, W, jnp.zeros(NUM_FEATURES + 1)),
            ValueError,
            "offsets",
        ),
        (
            lambda: features.cosine_features(X32, W, jnp.zeros(NUM_FEATURES, jnp.int32)),
            TypeError,
            "offsets",
        ),
        (lambda: features.random_offsets(jax.random.key(0), 0), ValueError, "num_features"),
        (lambda: features.estimate(jnp.ones((2, 3)), jnp.ones((2, 4))), ValueError, "width"),
    ],
)
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
