"""Tests for the scikit-learn front door ``rfjax.sklearn.RandomFeatures``."""

import functools
import warnings

import jax
import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.kernel_approximation import RBFSampler
from sklearn.linear_model import RidgeClassifier
from sklearn.metrics.pairwise import rbf_kernel
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import MinMaxScaler, StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from rfjax import features
from rfjax.sklearn import RandomFeatures, feature_names
from tests.support.compile_counts import count_programs


# Regression (issue 18): with features="fourier", 6 checks failed (they set n_components=1,
# and odd widths were rejected); every check passes now, for every setting below.
# Positive features of some checks' data (|x|^2 in the thousands) are all 0: fit warns, rightly.
# One setting per contract (issue 33): the default (Fourier features of the Gaussian kernel, odd
# widths with the extra cosine: RBFSampler's drop-in) and positive features (the softmax kernel:
# no odd feature, the degenerate-features warning). The coupling does not change the contract;
# the simplex coupling's fall-back to i.i.d. rows for one input feature (what
# check_fit2d_1feature would exercise) is checked in test_shapes_seed_and_dtypes.
@pytest.mark.filterwarnings("ignore:RandomFeatures.*carry almost no information:UserWarning")
@parametrize_with_checks(
    [
        RandomFeatures(),
        RandomFeatures(kernel="softmax", gamma=0.1, coupling="simplex"),
    ]
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
        ({"features": "auto", "kernel": "laplacian"}, "kernel"),
        ({"features": "positive_antithetic", "n_components": 7}, "n_components"),
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
    positive = functools.partial(RandomFeatures, features="positive", gamma=0.1)
    z = positive(n_components=10, random_state=1).fit_transform(x)
    assert z.shape == (5, 10) and z.dtype == np.float64 and np.all(z > 0)
    again = positive(n_components=10, random_state=1).fit_transform(x)
    np.testing.assert_array_equal(z, again)
    other = positive(n_components=10, random_state=2).fit_transform(x)
    assert not np.allclose(z, other)
    z32 = RandomFeatures(n_components=10, random_state=1).fit_transform(x.astype(np.float32))
    assert z32.dtype == np.float32
    est = RandomFeatures(n_components=9).fit(x)  # the default: 4 sin/cos pairs and one cosine
    assert est.features_ == "fourier" and est.transform(x).shape == (5, 9)
    assert est.n_features_in_ == 6 and est.projection_.matrix().shape == (4, 6)
    assert est.odd_feature_.projection.matrix().shape == (1, 6)
    assert list(est.get_feature_names_out()) == [f"randomfeatures{i}" for i in range(9)]
    assert RandomFeatures(kernel="softmax", gamma=0.1).fit(x).features_ == "positive"
    # one input feature: simplex falls back to the i.i.d. coupling
    one = RandomFeatures(coupling="simplex", random_state=0).fit_transform(x[:, :1])
    assert one.shape == (5, 100)


@pytest.mark.parametrize(
    ("features", "coupling", "m"),
    [
        ("positive", "simplex", 4096),
        ("positive", "gaussian", 4096),
        ("fourier", "orthogonal", 4096),
        ("fourier", "orthogonal", 4097),
    ],
)
def test_gram_approximates_rbf_kernel(features, coupling, m):
    rng = np.random.default_rng(0)
    d, n, gamma = 8, 20, 0.1
    x = rng.normal(size=(n, d)) / np.sqrt(d) * 2.0
    exact = rbf_kernel(x, gamma=gamma)
    z = RandomFeatures(
        features=features, coupling=coupling, n_components=m, gamma=gamma, random_state=0
    ).fit_transform(x)
    approx = z @ z.T
    # Monte-Carlo tolerance from the i.i.d. per-feature variance of the estimate (couplings only
    # reduce it): positive features (gaussian kernel, l^2 = 1/(2 gamma), u = x / l):
    #   Var[phi_i(x) phi_i(y) m] = exp(-2|u|^2 - 2|v|^2 + 2|u + v|^2) - K^2;
    # Fourier (p = m // 2 sin/cos pairs): Var = (1 - K^2)^2 / 2 per pair; an odd m adds one
    # cosine, 2 cos(a) cos(b) with variance (1 + K(2 Delta)) / 2 - K^2 + K(x + y) terms <= 2,
    # weighted 1/m (the pairs 2p/m).
    u = x * np.sqrt(2 * gamma)
    sq = np.sum(u * u, axis=1)
    if features == "positive":
        second = np.exp(
            -2 * sq[:, None] - 2 * sq[None, :] + 2 * ((u[:, None] + u[None]) ** 2).sum(-1)
        )
        var = (second - exact**2) / m
    else:
        pairs = m // 2
        var = (2 * pairs / m) ** 2 * (1 - exact**2) ** 2 / (2 * max(pairs, 1)) + (m % 2) * 2 / m**2
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


def test_one_component_is_rbf_samplers_single_cosine():
    x = np.random.default_rng(0).normal(size=(7, 3))
    est = RandomFeatures(n_components=1, gamma=0.3, random_state=0).fit(x)
    assert est.projection_ is None
    w = np.asarray(est.odd_feature_.projection.matrix(), np.float64)
    b = np.asarray(est.odd_feature_.offsets, np.float64)
    expected = np.sqrt(2.0) * np.cos(x * np.sqrt(2 * 0.3) @ w.T + b)
    np.testing.assert_allclose(est.transform(x), expected, rtol=1e-5, atol=1e-5)


def test_an_odd_width_is_the_fourier_pairs_and_one_cosine_weighted_to_stay_unbiased():
    """n = 2m + 1 = 5: Z = sqrt(2/n) [sin(W u), cos(W u), cos(w.u + b)], u = x sqrt(2 gamma):
    the m pairs weighted 2m/n and the cosine 1/n (a cosine weighted 2/n biased every kernel
    estimate by (2m + 2)/(2m + 1), below the Monte Carlo tolerance at m = 2048)."""
    x = np.random.default_rng(1).normal(size=(7, 3))
    est = RandomFeatures(n_components=5, gamma=0.3, random_state=0).fit(x)
    u = x * np.sqrt(2 * 0.3)
    projected = u @ np.asarray(est.projection_.matrix(), np.float64).T
    w = np.asarray(est.odd_feature_.projection.matrix(), np.float64)
    b = np.asarray(est.odd_feature_.offsets, np.float64)
    blocks = [np.sin(projected), np.cos(projected), np.cos(u @ w.T + b)]
    expected = np.sqrt(2 / 5) * np.concatenate(blocks, axis=1)
    np.testing.assert_allclose(est.transform(x), expected, rtol=1e-5, atol=1e-5)


def test_the_odd_cosine_has_its_own_projection_vector():
    """The odd feature's w is drawn with its own key: from the projection's key, an i.i.d.
    Gaussian w is the projection's first row (JAX draws elementwise), and the cosine
    repeats a direction the pairs already use."""
    x = np.random.default_rng(0).normal(size=(7, 3))
    est = RandomFeatures(coupling="gaussian", n_components=9, random_state=0).fit(x)
    rows = np.asarray(est.projection_.matrix(), np.float64)
    w = np.asarray(est.odd_feature_.projection.matrix(), np.float64)
    assert np.min(np.abs(rows - w).max(axis=1)) > 1e-3


@pytest.mark.parametrize("features", ["fourier", "positive"])
def test_new_n_samples_compiles_nothing_and_rows_do_not_interact(features):
    # Regression (issue 20, item 3): every new n_samples recompiled (0.4-0.9 s each).
    x = np.random.default_rng(0).normal(size=(1500, 5))
    est = RandomFeatures(features=features, n_components=33 if features == "fourier" else 32)
    est.set_params(gamma=0.1, random_state=0).fit(x[:50])
    full = est.transform(x)  # two blocks, the second padded
    with count_programs() as programs:
        parts = [est.transform(x[:1]), est.transform(x[1:777]), est.transform(x[777:])]
    assert programs[0] == 0  # no compilation for new n_samples
    # The features of a row do not depend on the other rows of its call (nor on the padding).
    np.testing.assert_allclose(np.concatenate(parts), full, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    ("features", "coupling"), [("fourier", "orthogonal"), ("positive", "simplex")]
)
def test_a_cold_fit_and_transform_compile_two_programs(features, coupling):
    # Issue 20, item 3: a cold fit + first transform compiled 7 programs (key, seed conversion,
    # a fold_in per derived key, the sampler, input staging, the block function); now the
    # draw is one program and the block function the other. A refit with a new random_state
    # and a transform of a new n_samples compile nothing.
    x = np.random.default_rng(0).normal(size=(300, 7))
    width = 37 if features == "fourier" else 37 * 2  # a setting no other test compiles
    est = RandomFeatures(features=features, coupling=coupling, n_components=width, gamma=0.05)
    with count_programs() as cold:
        est.set_params(random_state=0).fit(x).transform(x)
    assert cold[0] == 2
    with count_programs() as warm:
        est.set_params(random_state=1).fit(x).transform(x[:123])
    assert warm[0] == 0


def test_float64_input_beyond_float32_is_refused_where_features_compute_in_float32():
    """Finite float64 input beyond float32's range became infinite inputs and NaN features,
    with no error."""
    x = np.linspace(-1.0, 1.0, 12).reshape(4, 3)
    model = RandomFeatures(n_components=8, random_state=0).fit(x)
    huge = np.full((2, 3), 1e39)
    with pytest.raises(ValueError, match=r"X holds values up to .* float32.* cannot represent"):
        model.transform(huge)
    with pytest.raises(ValueError, match="cannot represent"):
        RandomFeatures(n_components=8, random_state=0).fit(huge)
    assert np.isfinite(model.transform(np.full((2, 3), 1e30))).all()  # representable: fine
    with jax.enable_x64(True):  # features in float64: the input is representable
        wide = RandomFeatures(n_components=8, random_state=0).fit(x)
        assert wide.transform(huge).dtype == np.float64


def test_degenerate_positive_features_warn():
    # Regression (issue 20, item 3): positive features of standardised digits with gamma = 1
    # were all below 1.5e-14, without a warning. The check is on the features' estimate of
    # k(x, x) against k(x, x), so it holds for every draw of the projection, not for a lucky one.
    x = StandardScaler().fit_transform(load_digits().data[:200])
    for seed in range(4):
        with pytest.warns(UserWarning, match=r"estimate \|z\(x\)\|\^2 of k\(x, x\) is a fraction"):
            RandomFeatures(
                features="positive", coupling="simplex", gamma=1.0, random_state=seed
            ).fit(x)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            RandomFeatures(gamma=1.0, random_state=seed).fit(x)  # Fourier stays informative
            RandomFeatures(features="positive", gamma=1.0 / 64, random_state=seed).fit(x)
            RandomFeatures(kernel="softmax", gamma=1.0 / 64, random_state=seed).fit(x)


@pytest.mark.parametrize("changes", [{"gamma": 5.0}, {"kernel": "gaussian"}, {"n_components": 10}])
def test_parameters_set_after_fit_wait_for_the_next_fit(changes):
    """As for ``RBFSampler``, ``transform`` gives the features of the last fit: a new gamma or
    kernel was applied to the projection drawn (and the map fitted) under the old one, and a
    new n_components raised a broadcasting error."""
    x = np.random.default_rng(0).normal(size=(20, 4)) * 0.1
    sampler = RandomFeatures(kernel="softmax", n_components=8, gamma=0.1, random_state=0).fit(x)
    before = sampler.transform(x)
    sampler.set_params(**changes)
    np.testing.assert_array_equal(sampler.transform(x), before)
    refitted = sampler.fit(x).transform(x)
    assert refitted.shape[1] == sampler.n_components and not np.array_equal(refitted, before)


def test_a_width_whose_transform_block_exceeds_the_cap_is_refused_before_compiling():
    """n_components = 2^27 on 4 inputs: a projection of 0.5 GiB, but a transform block of
    1024 x 2^27 features (512 GiB) that aborted the interpreter (an XLA check failure) in
    fit's degenerate-feature check."""
    x = np.random.default_rng(0).normal(size=(5, 4))
    with pytest.raises(ValueError, match=r"n_components=134217728 implies the features of a"):
        RandomFeatures(n_components=2**27, random_state=0).fit(x)
