"""Exact kernels against independent NumPy/SciPy computations; Gram matrices; input checks."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate

from rfjax import kernels
from tests.support.compiled import jitted

RNG = np.random.default_rng(20240601)
X = RNG.normal(size=(5, 4))
Y = RNG.normal(size=(7, 4))


def pairwise(fn, x, y):
    """NumPy reference Gram matrix by explicit loops."""
    return np.array([[fn(a, b) for b in y] for a in x])


def angle(a, b):
    """Angle between a and b via atan2 of the rejection norm and the dot product (float64)."""
    along = np.dot(a, b) / np.dot(b, b) * b
    return math.atan2(np.linalg.norm(a - along) * np.linalg.norm(b), np.dot(a, b))


def arccos_by_quadrature(a, b, order):
    """2 E[step(w.a) step(w.b) (w.a)^n (w.b)^n], reduced to the plane of a and b.

    With w = r (cos p, sin p) in that plane, the radial integral is 2^n n!, and both steps are on
    for p in (theta - pi/2, pi/2).
    """
    theta = angle(a, b)
    value, _ = integrate.quad(
        lambda p: (math.cos(p) * math.cos(p - theta)) ** order,
        theta - math.pi / 2,
        math.pi / 2,
        epsabs=1e-13,
        epsrel=1e-13,
    )
    radial = 2.0**order * math.factorial(order)
    scale = (np.linalg.norm(a) * np.linalg.norm(b)) ** order
    return 2.0 * scale * radial * value / (2.0 * math.pi)


@pytest.fixture(autouse=True)
def float64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("lengthscale", [0.5, 1.0, 2.3])
def test_gaussian_matches_numpy(lengthscale):
    expected = pairwise(lambda a, b: np.exp(-np.sum((a - b) ** 2) / (2 * lengthscale**2)), X, Y)
    got = jitted(functools.partial(kernels.gram, kernels.gaussian))(X, Y, lengthscale=lengthscale)
    np.testing.assert_allclose(got, expected, rtol=1e-12)


@pytest.mark.parametrize(
    "name, reference",
    [
        ("softmax", lambda a, b: np.exp(np.dot(a, b))),
        ("linear", np.dot),
        ("angular", lambda a, b: 1 - 2 * angle(a, b) / math.pi),
    ],
)
def test_kernels_match_numpy(name, reference):
    got = jitted(functools.partial(kernels.gram, getattr(kernels, name)))(X, Y)
    np.testing.assert_allclose(got, pairwise(reference, X, Y), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("order", [0, 1, 2])
def test_arccos_matches_quadrature(order):
    a = X[0]
    # Generic pairs plus the extreme angles 0 and pi.
    others = [*Y, 2.0 * a, -0.5 * a]
    expected = np.array([arccos_by_quadrature(a, b, order) for b in others])
    got = jitted(kernels.arccos)(a, np.stack(others), order=order)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)


def test_arccos_order_zero_is_step_kernel():
    # (pi - theta) / pi = 2 P(w.x > 0, w.y > 0): the Heaviside kernel (pi - theta)/(2 pi), doubled.
    got = jitted(kernels.arccos)(X[:1], Y, order=0)
    expected = np.array([(math.pi - angle(X[0], b)) / math.pi for b in Y])
    np.testing.assert_allclose(got, expected, rtol=1e-12)


def test_polynomial_matches_numpy():
    coefficients = (0.5, 0.0, 0.2, 1.5)
    expected = pairwise(
        lambda a, b: sum(c * np.dot(a, b) ** (i + 1) for i, c in enumerate(coefficients)), X, Y
    )
    # The coefficients are static (a tuple of Python numbers), as in an eager call.
    polynomial = functools.partial(kernels.gram, kernels.polynomial, coefficients=coefficients)
    got = jitted(polynomial)(X, Y)
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    np.testing.assert_allclose(
        kernels.polynomial(X, X, coefficients=np.array([1.0])), np.sum(X * X, axis=-1), rtol=1e-12
    )


def test_gram_shape_symmetry_and_broadcasting():
    g = jitted(functools.partial(kernels.gram, kernels.gaussian))(X, X, lengthscale=1.7)
    assert g.shape == (5, 5)
    np.testing.assert_allclose(g, g.T, rtol=0, atol=0)
    np.testing.assert_allclose(np.diag(g), 1.0, rtol=0, atol=1e-15)
    assert jax.eval_shape(lambda: kernels.gram(kernels.arccos, X, Y, order=1)).shape == (5, 7)
    # Leading axes broadcast: (5, 1, 4) with (7, 4) -> (5, 7), same as gram.
    np.testing.assert_allclose(
        jitted(kernels.softmax)(X[:, None, :], Y),
        jitted(functools.partial(kernels.gram, kernels.softmax))(X, Y),
    )
    assert jax.eval_shape(kernels.linear, X[0], Y).shape == (7,)


def test_lengthscale_is_input_rescaling():
    np.testing.assert_allclose(
        jitted(kernels.gaussian)(X, X[::-1], lengthscale=3.0),
        jitted(kernels.gaussian)(X / 3.0, X[::-1] / 3.0),
        rtol=1e-12,
    )


def test_zero_vector_convention():
    zero = np.zeros(4)
    assert float(jitted(kernels.angular)(zero, Y[0])) == 0.0
    assert float(jitted(kernels.angular)(zero, zero)) == 0.0
    assert float(jitted(kernels.arccos)(zero, Y[0], order=0)) == 0.5
    assert float(jitted(kernels.arccos)(zero, zero, order=0)) == 0.5
    for order in (1, 2):
        assert float(jitted(kernels.arccos)(zero, Y[0], order=order)) == 0.0
    # Gradients at a zero input are finite (masked square roots), not NaN.
    for fn, kwargs in [(kernels.angular, {}), *((kernels.arccos, {"order": n}) for n in (0, 1, 2))]:
        grad = jitted(jax.grad(lambda a, fn=fn, kwargs=kwargs: fn(a, Y[0], **kwargs)))(jnp.zeros(4))
        assert np.all(np.isfinite(grad))


@pytest.mark.parametrize("order", [1, 2])
def test_arccos_gradient_at_parallel_inputs(order):
    """The order-1 and order-2 kernels are differentiable at x = y (dJ_1/dc = J_0, dJ_2/dc =
    4 J_1 are finite at c = 1) and at x = -y; autodiff of arccos and sqrt(1 - c^2) gave NaN
    there, so the gradient of any Gram matrix with a diagonal was NaN in every entry."""
    a = X[0]
    # k_n(x, a) = |x|^n |a|^n J_n(theta) / pi, J_1(0) = pi, J_2(0) = 3 pi: at x = a the
    # gradient is n |x|^(n-2) x |a|^n J_n(0) / pi.
    norm = np.linalg.norm(a)
    expected = {1: a / norm * norm, 2: 2 * a * norm**2 * 3}[order]
    grad = jitted(jax.grad(lambda x: kernels.arccos(x, a, order=order)))
    np.testing.assert_allclose(grad(a), expected, rtol=1e-10)
    np.testing.assert_allclose(grad(-a), 0.0, atol=1e-12)
    # Gram matrix of a set with itself, against central differences.
    points = X[:3]

    def total(p):
        return jnp.sum(kernels.gram(kernels.arccos, p, p, order=order))

    step = 1e-6
    numeric = np.array(
        [
            (total(points + step * e) - total(points - step * e)) / (2 * step)
            for e in np.eye(points.size).reshape(-1, *points.shape)
        ]
    ).reshape(points.shape)
    np.testing.assert_allclose(jitted(jax.grad(total))(points), numeric, rtol=1e-6)


def test_cosine_is_clipped():
    with jax.enable_x64(False):
        a = jnp.asarray([0.1, 0.7, -0.3, 0.9], jnp.float32)
        for b in (a, 3.0 * a, -a, -7.0 * a):
            for value in (
                kernels.angular(a, b),
                *(kernels.arccos(a, b, order=n) for n in (0, 1, 2)),
            ):
                assert np.isfinite(value)
        assert float(kernels.angular(a, a)) == pytest.approx(1.0, abs=1e-3)
        assert float(kernels.angular(a, -a)) == pytest.approx(-1.0, abs=1e-3)


@pytest.mark.parametrize("scale", [1e-20, 1e20])
def test_angles_do_not_depend_on_the_inputs_scale(scale):
    """In float32, |x|^2 underflows at |x| = 1e-20 and overflows at 1e20: the angular kernel
    and the order-0 arc-cosine kernel (functions of the angle only) gave 0 and 0.5, or NaN."""
    with jax.enable_x64(False):
        a = np.asarray([0.1, 0.7, -0.3, 0.9], np.float32)
        b = np.asarray([0.5, -0.2, 0.4, 0.3], np.float32)
        for kernel in (kernels.angular, functools.partial(kernels.arccos, order=0)):
            np.testing.assert_allclose(kernel(scale * a, b), kernel(a, b), rtol=1e-6)
            # At theta = 0 a cosine's rounding of a few eps32 moves arccos by sqrt(2 x 4 eps),
            # the kernel by 2/pi of that, 3.1e-4 (test_cosine_is_clipped's 1e-3).
            np.testing.assert_allclose(kernel(scale * a, scale * a), kernel(a, a), atol=1e-3)


def test_dtypes_follow_inputs():
    # The dtype is fixed at trace time: eval_shape gives it without compiling.
    assert jax.eval_shape(kernels.gaussian, X, Y[:5]).dtype == jnp.float64
    with jax.enable_x64(False):
        x32 = jnp.asarray(X, jnp.float32)
        for fn, kwargs in [
            (kernels.gaussian, {}),
            (kernels.softmax, {}),
            (kernels.linear, {}),
            (kernels.angular, {}),
            (kernels.arccos, {"order": 1}),
            (kernels.polynomial, {"coefficients": (1.0, 2.0)}),
        ]:
            assert jax.eval_shape(functools.partial(fn, **kwargs), x32, x32).dtype == jnp.float32


def test_jit():
    f = jax.jit(lambda a, b: kernels.arccos(a, b, order=2))
    np.testing.assert_allclose(f(X, X[::-1]), kernels.arccos(X, X[::-1], order=2), rtol=1e-12)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: kernels.gaussian(np.ones((2, 3), np.int32), X[:2, :3]), TypeError, "x"),
        (lambda: kernels.softmax(X, Y[:, :3]), ValueError, "y"),
        (lambda: kernels.linear(X, Y), ValueError, "leading axes"),
        (lambda: kernels.gaussian(X, X, lengthscale=0.0), ValueError, "lengthscale"),
        (lambda: kernels.arccos(X, X, order=3), ValueError, "order"),
        (lambda: kernels.arccos(X, X, order=True), ValueError, "order"),
        (lambda: kernels.polynomial(X, X, coefficients=(1.0, -0.1)), ValueError, "coefficients"),
        (lambda: kernels.polynomial(X, X, coefficients=()), ValueError, "coefficients"),
        (lambda: kernels.gram(kernels.linear, X[0], Y), ValueError, "x"),
        (lambda: kernels.gram("linear", X, Y), TypeError, "kernel_fn"),
    ],
)
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()
