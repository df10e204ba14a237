"""Tests for the scikit-learn front door ``rfjax.sklearn.RandomFeatures``."""

import functools

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.kernel_approximation import RBFSampler
from sklearn.linear_model import RidgeClassifier
from sklearn.metrics.pairwise import rbf_kernel
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MinMaxScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from rfjax import features
from rfjax.sklearn import RandomFeatures, feature_names

# These checks set ``n_components = 1`` (sklearn/utils/estimator_checks.py), which sin/cos
# Fourier features cannot honour: their width is 2m, so ``n_components`` must be even and fit
# rejects 1 with a ValueError. The default (positive) configuration passes every check.
_FOURIER_NEEDS_EVEN_WIDTH = "sets n_components=1; sin/cos Fourier features need an even width"
_FOURIER_EXPECTED_FAILURES = {
    name: _FOURIER_NEEDS_EVEN_WIDTH
    for name in (
        "check_dont_overwrite_parameters",
        "check_fit2d_predict1d",
        "check_methods_subset_invariance",
        "check_methods_sample_order_invariance",
        "check_fit2d_1sample",
        "check_fit2d_1feature",
    )
}


def _expected_failed_checks(estimator):
    return _FOURIER_EXPECTED_FAILURES if estimator.features == "fourier" else {}


@parametrize_with_checks(
    [
        RandomFeatures(),
        RandomFeatures(features="fourier", coupling="orthogonal"),
        RandomFeatures(kernel="softmax", gamma=0.1, coupling="gaussian"),
    ],
    expected_failed_checks=_expected_failed_checks,
)
def test_sklearn_compatible(estimator, check):
    check(estimator)


@pytest.mark.parametrize(
    ("params", "name"),
    [
        ({"kernel": "laplacian"}, "kernel"),
        ({"coupling": "nope"}, "coupling"),
        ({"coupling": 3}, "coupling"),
        ({"features": "cosine"}, "features"),
        ({"features": "fourier", "kernel": "softmax"}, "features"),
        ({"n_components": 0}, "n_components"),
        ({"n_components": 2.5}, "n_components"),
        ({"features": "fourier", "n_components": 7}, "n_components"),
        ({"gamma": 0.0}, "gamma"),
        ({"gamma": -1.0}, "gamma"),
        ({"gamma": float("nan")}, "gamma"),
    ],
)
def test_invalid_params_raise_naming_the_parameter(params, name):
    with pytest.raises(ValueError, match=name):
        RandomFeatures(**params).fit(np.ones((3, 4)))


def test_shapes_seed_and_dtypes():
    x = np.random.default_rng(0).normal(size=(5, 6))
    z = RandomFeatures(n_components=10, random_state=1).fit_transform(x)
    assert z.shape == (5, 10) and z.dtype == np.float64 and np.all(z > 0)
    again = RandomFeatures(n_components=10, random_state=1).fit_transform(x)
    np.testing.assert_array_equal(z, again)
    other = RandomFeatures(n_components=10, random_state=2).fit_transform(x)
    assert not np.allclose(z, other)
    z32 = RandomFeatures(n_components=10, random_state=1).fit_transform(x.astype(np.float32))
    assert z32.dtype == np.float32
    zf = RandomFeatures(features="fourier", n_components=10, random_state=1).fit_transform(x)
    assert zf.shape == (5, 10)
    est = RandomFeatures(n_components=4).fit(x)
    assert est.n_features_in_ == 6 and est.projection_.matrix().shape == (4, 6)
    assert list(est.get_feature_names_out()) == [f"randomfeatures{i}" for i in range(4)]
    # one input feature: simplex falls back to the i.i.d. coupling
    assert RandomFeatures(random_state=0).fit_transform(x[:, :1]).shape == (5, 100)


@pytest.mark.parametrize(
    ("features", "coupling"),
    [("positive", "simplex"), ("positive", "gaussian"), ("fourier", "orthogonal")],
)
def test_gram_approximates_rbf_kernel(features, coupling):
    rng = np.random.default_rng(0)
    d, n, gamma, m = 8, 20, 0.1, 4096
    x = rng.normal(size=(n, d)) / np.sqrt(d) * 2.0
    exact = rbf_kernel(x, gamma=gamma)
    z = RandomFeatures(
        features=features, coupling=coupling, n_components=m, gamma=gamma, random_state=0
    ).fit_transform(x)
    approx = z @ z.T
    # Monte-Carlo tolerance from the i.i.d. per-feature variance of the estimate (couplings only
    # reduce it): positive features (gaussian kernel, l^2 = 1/(2 gamma), u = x / l):
    #   Var[phi_i(x) phi_i(y) m] = exp(-2|u|^2 - 2|v|^2 + 2|u + v|^2) - K^2;
    # Fourier (m/2 sin/cos pairs): Var = (1 - K^2)^2 / 2 per pair.
    u = x * np.sqrt(2 * gamma)
    sq = np.sum(u * u, axis=1)
    if features == "positive":
        second = np.exp(
            -2 * sq[:, None] - 2 * sq[None, :] + 2 * ((u[:, None] + u[None]) ** 2).sum(-1)
        )
        var = (second - exact**2) / m
    else:
        var = (1 - exact**2) ** 2 / (2 * (m // 2))
    std = np.sqrt(np.maximum(var, 0.0))
    error = np.abs(approx - exact)
    # 6 standard deviations elementwise (400 entries), plus float32 rounding slack; on average
    # within 2 standard deviations (E|N(0, s^2)| = 0.8 s for i.i.d.; couplings reduce it).
    np.testing.assert_array_less(error, 6 * std + 1e-4)
    assert np.mean(error) < 2 * np.mean(std) + 1e-4
    assert np.mean(std) < 0.1  # the tolerance is informative at this m


def test_pipeline_on_digits_matches_rbf_sampler():
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.3, random_state=0)
    gamma, m = 0.02, 500

    def score(transformer):
        model = make_pipeline(MinMaxScaler(), transformer, RidgeClassifier(alpha=1e-2))
        return model.fit(x_train, y_train).score(x_test, y_test)

    ours = score(RandomFeatures(gamma=gamma, n_components=m, random_state=0))
    fourier = score(RandomFeatures(features="fourier", gamma=gamma, n_components=m, random_state=0))
    reference = score(RBFSampler(gamma=gamma, n_components=m, random_state=0))
    assert reference > 0.95
    assert ours > 0.95 and ours > reference - 0.02, (ours, reference)
    assert fourier > 0.95 and fourier > reference - 0.02, (fourier, reference)


def test_features_come_from_the_feature_map_registry():
    names = feature_names()
    assert {"positive", "positive_antithetic", "trigonometric", "fourier"} <= set(names)
    assert "relu" not in names and "angular_hybrid" not in names  # other kernel; asymmetric
    for name in names:
        assert features.info(name).kernel in ("softmax", "gaussian")
    # A softmax-kernel map gives the Gaussian kernel through e^{-|u|^2/2} exp(u.v) e^{-|v|^2/2}:
    # trigonometric features e^{|u|^2/2} [sin, cos](W u) / sqrt(m) become the random Fourier
    # features of the same projection.
    x = np.random.default_rng(0).normal(size=(6, 5))
    make = functools.partial(RandomFeatures, n_components=16, gamma=0.3, random_state=4)
    trigonometric = make(features="trigonometric").fit_transform(x)
    fourier = make(features="fourier").fit_transform(x)
    np.testing.assert_allclose(trigonometric, fourier, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="n_components must be a multiple of 2"):
        RandomFeatures(features="positive_antithetic", n_components=7).fit(x)
