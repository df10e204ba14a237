"""Feature maps: unbiasedness under every coupling, exact cases, stabiliser, jit/vmap, checks."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import features, kernels, projections
from tests.support.representatives import representatives

COUPLINGS = projections.marginally_exact()
DIM = 4
NUM_FEATURES = 6  # not a multiple of DIM: coupled couplings use a truncated second block
LENGTHSCALE = 1.5
COEFFICIENTS = (0.5, 0.3, 0.2)  # degree l = 3: T = 6 projection vectors per output feature
POLY_WIDTH = 4  # M >= block_size (= DIM) for every coupling except halton (one block)
NUM_DRAWS = 3000
X = np.array([0.3, -0.2, 0.5, 0.1])
Y = np.array([-0.1, 0.4, 0.2, -0.3])


def offsets_for(key, projection):
    # float32 offsets in every precision, so the float64 and float32 paths share them.
    return features.random_offsets(key, projection.num_features, dtype=jnp.float32)


# name -> (phi(x, projection, key), exact kernel value at (X, Y)). ``key`` is independent of the
# projection's (used by cosine_features' offsets).
FEATURE_MAPS = {
    "fourier": (
        lambda x, w, k: features.fourier_features(x, w, lengthscale=LENGTHSCALE),
        kernels.gaussian(X, Y, lengthscale=LENGTHSCALE),
    ),
    "cosine": (
        lambda x, w, k: features.cosine_features(x, w, offsets_for(k, w), lengthscale=LENGTHSCALE),
        kernels.gaussian(X, Y, lengthscale=LENGTHSCALE),
    ),
    "positive_softmax": (lambda x, w, k: features.positive_features(x, w), kernels.softmax(X, Y)),
    "positive_gaussian": (
        lambda x, w, k: features.positive_features(
            x, w, kernel="gaussian", lengthscale=LENGTHSCALE
        ),
        kernels.gaussian(X, Y, lengthscale=LENGTHSCALE),
    ),
    "positive_softmax_antithetic": (
        lambda x, w, k: features.positive_features(x, w, antithetic=True),
        kernels.softmax(X, Y),
    ),
    "positive_gaussian_antithetic": (
        lambda x, w, k: features.positive_features(x, w, kernel="gaussian", antithetic=True),
        kernels.gaussian(X, Y),
    ),
    "trigonometric": (lambda x, w, k: features.trigonometric_features(x, w), kernels.softmax(X, Y)),
    **{
        f"arccos{n}": (
            lambda x, w, k, n=n: features.arccos_features(x, w, order=n),
            kernels.arccos(X, Y, order=n),
        )
        for n in (0, 1, 2)
    },
    "angular": (lambda x, w, k: features.angular_features(x, w), kernels.angular(X, Y)),
    "linear": (lambda x, w, k: features.linear_features(x, w), kernels.linear(X, Y)),
    "polynomial": (
        lambda x, w, k: features.polynomial_features(x, w, coefficients=COEFFICIENTS),
        kernels.polynomial(X, Y, coefficients=COEFFICIENTS),
    ),
}
POLY_ROWS = POLY_WIDTH * len(COEFFICIENTS) * (len(COEFFICIENTS) + 1) // 2


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


# The SimRF paper's couplings in the default suite; every other marginally exact coupling in the
# full one (--runslow): each coupling costs one compiled program of all maps.
DEFAULT_COUPLINGS = ("gaussian", "orthogonal", "simplex")


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


def draw(coupling, rows=NUM_FEATURES, seed=0, dim=DIM, dtype=jnp.float32):
    return projections.get(coupling)(jax.random.key(seed), dim, rows, dtype=dtype)


@pytest.mark.parametrize("coupling", representatives(COUPLINGS, DEFAULT_COUPLINGS))
def test_exact_cases(coupling):
    w = draw(coupling)
    x = jnp.asarray(X * 2.0, jnp.float32)
    # sin^2 + cos^2 = 1: Fourier and trigonometric estimates are exact at x == y.
    np.testing.assert_allclose(
        features.estimate(*[features.fourier_features(x, w)] * 2), 1.0, rtol=1e-6
    )
    np.testing.assert_allclose(
        features.estimate(*[features.trigonometric_features(x, w)] * 2),
        kernels.softmax(x, x),
        rtol=1e-6,
    )
    # exp(w.x) exp(-w.x) = 1: positive softmax estimates are exact at y == -x.
    for antithetic in (False, True):
        phi = functools.partial(features.positive_features, projection=w, antithetic=antithetic)
        np.testing.assert_allclose(
            features.estimate(phi(x), phi(-x)), kernels.softmax(x, -x), rtol=1e-6
        )


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
        jax.vmap(phi, in_axes=(0, None, None))(xs, w, extra), out, rtol=1e-5, atol=1e-6
    )
    # vmap over a batch of projections drawn with jax.vmap(sampler)(keys).
    keys = jax.random.split(jax.random.key(3), 4)
    sampler = functools.partial(projections.orthogonal, dim=DIM, num_features=rows_for(name))
    batch = jax.vmap(sampler)(keys)
    batched = jax.vmap(phi, in_axes=(None, 0, None))(xs, batch, extra)
    for i, key in enumerate(keys):
        np.testing.assert_allclose(batched[i], phi(xs, sampler(key), extra), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", representatives(FEATURE_MAPS, REPRESENTATIVE_MAPS))
def test_float64(name):
    phi = FEATURE_MAPS[name][0]
    extra = jax.random.key(7)
    with jax.enable_x64(True):
        w = draw("simplex", rows_for(name), dtype=jnp.float64)
        out = phi(jnp.asarray(X, jnp.float64), w, extra)
        assert out.dtype == jnp.float64
        # The same map in float32 (projection and input rounded) agrees to float32 accuracy.
        w32 = projections.DenseProjection(w.matrix().astype(jnp.float32), w.block_size)
        out32 = phi(jnp.asarray(X, jnp.float32), w32, extra)
        assert out32.dtype == jnp.float32
        np.testing.assert_allclose(out, out32, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kernel", ["softmax", "gaussian"])
@pytest.mark.parametrize("antithetic", [False, True])
def test_row_stabiliser_rescales_each_input_by_its_largest_feature(kernel, antithetic):
    w = draw("simplex_plus", 8)
    xs = jax.random.normal(jax.random.key(4), (5, DIM))
    ys = jax.random.normal(jax.random.key(5), (6, DIM))
    phi = functools.partial(
        features.positive_features, projection=w, kernel=kernel, antithetic=antithetic
    )
    plain_x, plain_y = phi(xs), phi(ys)
    stable_x, stable_y = phi(xs, stabilizer="row"), phi(ys, stabilizer="row")
    np.testing.assert_allclose(stable_x.max(axis=-1), 1.0, rtol=1e-6)
    # phi_stab(x).phi_stab(y) exp(s(x) + s(y)) = phi(x).phi(y), with exp(s(x)) = max_j phi_j(x).
    scale = plain_x.max(axis=-1)[:, None] * plain_y.max(axis=-1)[None, :]
    np.testing.assert_allclose((stable_x @ stable_y.T) * scale, plain_x @ plain_y.T, rtol=1e-5)

    # Row-normalised attention weights are unchanged by stabilising the queries (xs).
    def attention(queries, keys):
        scores = queries @ keys.T
        return scores / scores.sum(-1, keepdims=True)

    np.testing.assert_allclose(attention(stable_x, plain_y), attention(plain_x, plain_y), rtol=1e-5)


def test_row_stabiliser_prevents_underflow():
    w = draw("gaussian", 8)
    x = jnp.full((DIM,), 8.0)  # |x|^2 / 2 = 128: exp(w.x - 128) underflows in float32
    assert float(features.positive_features(x, w).max()) < 1e-30
    stable = features.positive_features(x, w, stabilizer="row")
    assert float(stable.max()) == 1.0


def test_zero_input_conventions():
    w = draw("gaussian", 16)
    zero = jnp.zeros(DIM)
    np.testing.assert_array_equal(features.angular_features(zero, w), 0.0)
    np.testing.assert_allclose(features.arccos_features(zero, w, order=0), 0.5 * math.sqrt(2 / 16))
    np.testing.assert_array_equal(features.arccos_features(zero, w, order=1), 0.0)


def test_polynomial_layout():
    # Factor t of output feature k is row t * M + k.
    w = draw("gaussian", POLY_ROWS)
    x = jnp.asarray(X, jnp.float32)
    z = np.asarray(w(x), np.float64).reshape(-1, POLY_WIDTH)  # (T, M)
    c = COEFFICIENTS
    expected = (
        math.sqrt(c[0]) * z[0]
        + math.sqrt(c[1]) * z[1] * z[2]
        + math.sqrt(c[2]) * z[3] * z[4] * z[5]
    ) / math.sqrt(POLY_WIDTH)
    np.testing.assert_allclose(
        features.polynomial_features(x, w, coefficients=c), expected, rtol=1e-5
    )


def test_polynomial_rejects_coupled_rows():
    with pytest.raises(ValueError, match="block_size"):
        features.polynomial_features(
            X.astype(np.float32), draw("halton", POLY_ROWS), coefficients=COEFFICIENTS
        )
    with pytest.raises(ValueError, match="block_size"):
        features.polynomial_features(
            X.astype(np.float32), draw("orthogonal", 6 * 2), coefficients=COEFFICIENTS
        )
    # Degree 1 has no products, so any coupling works.
    out = features.polynomial_features(X.astype(np.float32), draw("halton", 5), coefficients=[2.0])
    np.testing.assert_allclose(
        out,
        math.sqrt(2.0) * features.linear_features(X.astype(np.float32), draw("halton", 5)),
        rtol=1e-6,
    )


def test_estimate():
    a = jax.random.normal(jax.random.key(0), (3, 8))
    b = jax.random.normal(jax.random.key(1), (3, 8))
    np.testing.assert_allclose(
        features.estimate(a, b), np.sum(np.asarray(a) * np.asarray(b), -1), rtol=1e-6
    )
    np.testing.assert_allclose(features.estimate(a[:, None], b[None]), a @ b.T, rtol=1e-5)


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
