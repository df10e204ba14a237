"""Bad input at the public boundary of projections, features and kernels (issues 18 and 19).

``test_bad_argument_is_named`` sweeps the public functions: each argument of a valid call is
replaced, one at a time, by the bad values of its category (``BAD``), and the call must raise a
``TypeError``/``ValueError`` whose message names that argument. The other tests are the
regression tests of the defects the adversarial sweeps found (each failed before its fix).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import features, kernels, ops, projections

KEY = jax.random.key(0)
DIM, NUM = 4, 6
W = projections.orthogonal(KEY, DIM, NUM)
W_IID = projections.gaussian(jax.random.key(1), DIM, NUM)
T = projections.gaussian(jax.random.key(2), DIM, 3)
X = jnp.full((3, DIM), 0.3)

# Bad values per argument category.
BAD = {
    "integer >= 1": [2.5, True, "3", np.float64(3.0), 0, -1],
    "integer >= 0": [2.5, True, "3", -1],
    "axis": [2.5, True, "3", 7],
    "dtype": [jnp.int32, None, "no-such-dtype", bool, np.uint8],
    "key": [0, np.zeros(3, np.uint32), jax.random.split(KEY, 2), jnp.ones(2)],
    "inputs (..., d)": [
        jnp.ones((3, DIM), jnp.int32),
        jnp.float32(1.0),
        jnp.ones((3, DIM + 1)),
        "x",
    ],
    "array": [jnp.ones((3, DIM), jnp.int32), "x"],
    "projection": [np.ones((NUM, DIM)), None, "gaussian"],
    "positive real": [0.0, -1.0, math.nan, math.inf, "1", True],
    "option": ["bogus", None, 3],
    "bool": ["yes", 1, None],
    "offsets": [jnp.full((NUM,), jnp.nan), jnp.ones(NUM + 1), jnp.ones(NUM, jnp.int32)],
}


def _sampler(name):
    return (
        projections.get(name),
        dict(key=KEY, dim=DIM, num_features=NUM, dtype=jnp.float32),
        {"key": "key", "dim": "integer >= 1", "num_features": "integer >= 1", "dtype": "dtype"},
    )


def _drawn(sampler, option, value, category):
    return (
        sampler,
        dict(key=KEY, dim=DIM, num_features=NUM, **{option: value}),
        {option: category},
    )


def _map(fn, *, extra=None, **options):
    """A feature map f(x, projection, **options), with the categories of ``extra`` options."""
    return (
        fn,
        dict(x=X, projection=W_IID, **options),
        {"x": "inputs (..., d)", "projection": "projection", **(extra or {})},
    )


def _kernel(fn, extra=None, **options):
    return (
        fn,
        dict(x=X, y=X, **options),
        {"x": "inputs (..., d)", "y": "inputs (..., d)", **(extra or {})},
    )


SPECS = {f"projections.{name}": _sampler(name) for name in projections.available()} | {
    "projections.simplex_directions": (
        projections.simplex_directions,
        dict(dim=DIM, dtype=jnp.float32),
        {"dim": "integer >= 1", "dtype": "dtype"},
    ),
    "projections.apply_simplex": (
        projections.apply_simplex,
        dict(z=X, axis=-1),
        {"z": "array", "axis": "axis"},
    ),
    "projections.simplex(partial_block)": _drawn(
        projections.simplex, "partial_block", "simplex", "option"
    ),
    "projections.simplex_plus(num_sweeps)": _drawn(
        projections.simplex_plus, "num_sweeps", 2, "integer >= 0"
    ),
    "projections.givens(num_layers)": _drawn(projections.givens, "num_layers", 2, "integer >= 0"),
    "projections.hd_orthogonal(num_rotations)": _drawn(
        projections.hd_orthogonal, "num_rotations", 2, "integer >= 1"
    ),
    "projections.circulant(preprocess)": _drawn(projections.circulant, "preprocess", True, "bool"),
    "projections.low_displacement_rank(rank)": _drawn(
        projections.low_displacement_rank, "rank", 1, "integer >= 1"
    ),
    "features.fourier_features": _map(
        features.fourier_features, lengthscale=2.0, extra={"lengthscale": "positive real"}
    ),
    "features.trigonometric_features": _map(features.trigonometric_features),
    "features.angular_features": _map(features.angular_features),
    "features.linear_features": _map(features.linear_features),
    **{
        f"features.{name}": _map(
            getattr(features, name),
            kernel="gaussian",
            antithetic=True,
            lengthscale=2.0,
            extra={"kernel": "option", "antithetic": "bool", "lengthscale": "positive real"},
        )
        for name in ("positive_features", "positive_log_features")
    },
    "features.arccos_features": _map(features.arccos_features, order=1, extra={"order": "option"}),
    "features.relu_features": _map(
        features.relu_features, eps=1e-3, extra={"eps": "positive real"}
    ),
    "features.polynomial_features": _map(
        features.polynomial_features, coefficients=(1.0, 0.5), extra={"coefficients": "option"}
    ),
    "features.cosine_features": _map(
        features.cosine_features,
        offsets=features.random_offsets(KEY, NUM),
        lengthscale=1.0,
        extra={"offsets": "offsets", "lengthscale": "positive real"},
    ),
    "features.random_offsets": (
        features.random_offsets,
        dict(key=KEY, num_features=NUM, dtype=jnp.float32),
        {"key": "key", "num_features": "integer >= 1", "dtype": "dtype"},
    ),
    "features.angular_hybrid_features": (
        features.angular_hybrid_features,
        dict(
            x=X, positive_projection=W, trigonometric_projection=W, sign_projection=T, side="query"
        ),
        {
            "x": "inputs (..., d)",
            "positive_projection": "projection",
            "trigonometric_projection": "projection",
            "sign_projection": "projection",
            "side": "option",
        },
    ),
    "features.gaussian_hybrid_features": (
        features.gaussian_hybrid_features,
        dict(
            x=X,
            positive_projection=W,
            trigonometric_projection=W_IID,
            coefficient_projection=T,
            side="key",
            bandwidth=1.0,
            radius=1.0,
        ),
        {
            "x": "inputs (..., d)",
            "positive_projection": "projection",
            "trigonometric_projection": "projection",
            "coefficient_projection": "projection",
            "side": "option",
            "bandwidth": "positive real",
            "radius": "positive real",
            "coefficient_estimator": "option",
        },
    ),
    "features.kmeans": (
        features.kmeans,
        dict(key=KEY, points=X, num_clusters=2, num_iterations=2),
        {
            "key": "key",
            "points": "array",
            "num_clusters": "integer >= 1",
            "num_iterations": "integer >= 0",
            "init": "option",
        },
    ),
    **{
        f"kernels.{name}": _kernel(getattr(kernels, name))
        for name in ("softmax", "linear", "angular")
    },
    "kernels.gaussian": _kernel(
        kernels.gaussian, lengthscale=2.0, extra={"lengthscale": "positive real"}
    ),
    "kernels.arccos": _kernel(kernels.arccos, order=2, extra={"order": "option"}),
    "kernels.polynomial": _kernel(
        kernels.polynomial, coefficients=(1.0,), extra={"coefficients": "option"}
    ),
}

CASES = [
    pytest.param(spec, argument, bad, id=f"{spec}-{argument}-{category}-{index}")
    for spec, (_, _, arguments) in SPECS.items()
    for argument, category in arguments.items()
    for index, bad in enumerate(BAD[category])
]


@pytest.mark.parametrize("spec", [s for s in SPECS if not s.startswith("projections.")])
def test_valid_call_of_the_sweep_runs(spec):
    # (The samplers' valid calls are tested in test_projections and test_structured_*.)
    function, kwargs, _ = SPECS[spec]
    function(**kwargs)  # the sweep's baseline: only the replaced argument is bad


@pytest.mark.parametrize(("spec", "argument", "bad"), CASES)
def test_bad_argument_is_named(spec, argument, bad):
    function, kwargs, _ = SPECS[spec]
    with pytest.raises((TypeError, ValueError), match=rf"\b{argument}\b"):
        function(**{**kwargs, argument: bad})


def test_simplex_directions_rejects_non_integer_dim_and_integer_dtype():
    # Regression (issue 18, defect 4): a JAX shape error, and a silent float32 result.
    with pytest.raises(TypeError, match=r"dim must be an integer >= 1, got 2.5"):
        projections.simplex_directions(2.5)
    with pytest.raises(TypeError, match=r"dtype must be a floating dtype .* got int32"):
        projections.simplex_directions(3, jnp.int32)


@pytest.mark.parametrize("name", ["gaussian", "simplex", "givens"])
def test_dtype_none_is_an_error(name):
    # Regression (issue 19, item 8): dtype=None silently meant float32.
    with pytest.raises(TypeError, match=r"dtype must be a floating dtype .* got None"):
        projections.get(name)(KEY, DIM, NUM, dtype=None)


@pytest.mark.parametrize("name", ["gaussian", "halton", "circulant"])
def test_float64_without_x64_is_truncated_with_a_warning_naming_dtype(name):
    # float64 without jax_enable_x64 gave float32 silently, where JAX warns (README: "as JAX
    # does").
    with jax.enable_x64(False):
        with pytest.warns(UserWarning, match=r"dtype=float64 .* truncated to float32"):
            projection = projections.get(name)(KEY, DIM, NUM, dtype=jnp.float64)
        assert projection.matrix().dtype == jnp.float32


@pytest.mark.parametrize("name", ["givens", "hd_orthogonal", "circulant", "orthogonal"])
def test_projection_of_an_empty_batch_is_empty(name):
    # Regression (issue 19, item 6): givens on a (0, d) input raised ZeroDivisionError.
    projection = projections.get(name)(KEY, DIM, NUM)
    assert projection(jnp.zeros((0, DIM))).shape == (0, NUM)
    assert projection(jnp.zeros((2, 0, DIM))).shape == (2, 0, NUM)


@pytest.mark.parametrize("name", ["angular_hybrid", "gaussian_hybrid", "cluster_hybrid"])
@pytest.mark.parametrize("side", ["query", "key"])
def test_hybrid_features_of_an_empty_batch_are_empty(name, side):
    # Regression (issue 19, item 6): the hybrids raised ZeroDivisionError on an empty batch.
    feature_map = features.get(name)().init(KEY, DIM)
    width = feature_map.features(X, W, side=side).shape[-1]
    assert feature_map.features(jnp.zeros((0, DIM)), W, side=side).shape == (0, width)


def test_apply_simplex_needs_two_dimensions():
    # Regression (issue 19, item 6): d = 1 raised ZeroDivisionError.
    with pytest.raises(ValueError, match=r"apply_simplex needs the axis length d >= 2.*d = 1"):
        ops.apply_simplex(jnp.ones((3, 1)))
    with pytest.raises(ValueError, match=r"axis 2 is out of range"):
        ops.apply_simplex(jnp.ones((3, 2)), axis=2)


@pytest.mark.parametrize(
    ("kernel", "options"),
    [
        (kernels.angular, {}),
        (kernels.arccos, {"order": 0}),
        (kernels.arccos, {"order": 1}),
        (kernels.arccos, {"order": 2}),
        (kernels.gaussian, {}),
        (kernels.softmax, {}),
    ],
)
def test_kernels_return_nan_for_nan_input(kernel, options):
    # Regression (issue 19, item 8): angular and arccos returned their zero-vector value.
    nan_row = jnp.array([[jnp.nan, 1.0], [0.5, 1.0]])
    values = kernel(nan_row, jnp.ones((2, 2)), **options)
    assert bool(jnp.isnan(values[0])) and bool(jnp.isfinite(values[1]))


def test_angular_kernels_keep_the_zero_vector_convention_and_its_gradient():
    zero, one = jnp.zeros(2), jnp.ones(2)
    assert float(kernels.angular(zero, one)) == 0.0
    assert float(kernels.arccos(zero, one, order=0)) == 0.5
    gradient = jax.grad(lambda x: kernels.arccos(x, one, order=1))(zero)
    assert bool(jnp.all(jnp.isfinite(gradient)))


def test_cosine_features_reject_non_finite_offsets():
    # Regression (issue 19, item 8): NaN offsets were accepted (and gave NaN features).
    for bad in (jnp.nan, jnp.inf):
        offsets = features.random_offsets(KEY, NUM).at[2].set(bad)
        with pytest.raises(ValueError, match=r"offsets must contain only finite values"):
            features.cosine_features(X, W, offsets)
