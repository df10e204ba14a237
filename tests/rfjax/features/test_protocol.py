"""The feature-map protocol and registry of ``rfjax.features``: names, the log-space form,
parameters (``init``/``fit``), pairs, and maps as pytrees under ``jit``/``vmap``."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import features, projections
from tests.support.representatives import representatives

DIM, NUM_FEATURES = 4, 8


@functools.partial(jax.jit, static_argnames=("name", "dim"))
def ready(name, dim=DIM):
    """The registered map ``name`` with its parameters (drawn, and fitted to random points)."""
    fmap = features.get(name)().init(jax.random.key(0), dim)
    points = jax.random.normal(jax.random.key(1), (2, 30, dim))
    return fmap.fit(jax.random.key(2), *points)


@pytest.mark.parametrize("side", features.SIDES)
@pytest.mark.parametrize(  # an exponential, a signed, a hybrid and an asymmetric map by default
    "name",
    representatives(
        features.available(), ("positive", "trigonometric", "angular_hybrid", "derf_asymmetric")
    ),
)
def test_log_space_form_is_the_features_with_their_gradients(name, side):
    # phi = psi exp(s), with s constant under differentiation and psi carrying the gradient.
    fmap = ready(name)
    w = projections.orthogonal(jax.random.key(3), DIM, NUM_FEATURES)
    x = 0.7 * jax.random.normal(jax.random.key(4), (5, DIM))

    direct, scaled, grads = _log_space_checks(fmap, w, x, side=side)
    np.testing.assert_allclose(scaled, direct, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-4, atol=1e-6)
    if isinstance(fmap, features.ExponentialFeatureMap):
        exp_log, max_psi = _exponential_checks(fmap, w, x, side=side)
        np.testing.assert_array_equal(exp_log, direct)
        np.testing.assert_array_equal(max_psi, 1.0)


# The maps with an affine form (``rfjax.attention._fused.AFFINE_MAPS``, which the fused kernels
# take); every other map's ``affine_log_form`` is None, checked below.
AFFINE_MAPS = ("positive", "positive_antithetic", "oprf")


@pytest.mark.parametrize("name", features.available())
def test_affine_log_form_is_the_maps_log_features(name):
    """x W^T + b + norm_weight |x|^2 from ``affine_log_form`` equals the map's own
    ``log_features`` (what the fused kernels compute against what the XLA form does), with
    rows of unequal norms (OPRF's bias carries A |w_i|^2). Only the fused kernels read the
    form, in tests that run in CI's interpret or GPU tiers: an antithetic map's [W; W] for
    [W; -W], a bias of -log(width)/4 or OPRF's A d for A |w_i|^2 passed every default test."""
    w = projections.orthogonal(jax.random.key(3), DIM, NUM_FEATURES)
    if name not in AFFINE_MAPS:
        assert getattr(ready(name), "affine_log_form", lambda *a, **k: None)(w, side="key") is None
        return
    fmap = ready(name)
    x = 0.7 * jax.random.normal(jax.random.key(4), (5, DIM))
    for side in features.SIDES:
        form = fmap.affine_log_form(w, side=side)
        np.testing.assert_allclose(
            form.log_features(x), fmap.log_features(x, w, side=side), rtol=1e-5, atol=1e-5
        )


@functools.partial(jax.jit, static_argnames="side")
def _log_space_checks(fmap, w, x, side):
    """The features, their log-space form and the gradients of both (one compiled program)."""

    def direct(x):
        return fmap.features(x, w, side=side)

    def scaled(x):  # psi alone must carry the gradient: consumers shift or drop s
        psi, log_scale = fmap.scaled_features(x, w, side=side)
        return psi * jnp.exp(jax.lax.stop_gradient(log_scale))[..., None]

    weights = jax.random.normal(jax.random.key(5), direct(x).shape)
    grads = [jax.grad(lambda x, f=f: jnp.sum(weights * f(x)))(x) for f in (direct, scaled)]
    return direct(x), scaled(x), grads


@functools.partial(jax.jit, static_argnames="side")
def _exponential_checks(fmap, w, x, side):
    psi = fmap.scaled_features(x, w, side=side).features
    return jnp.exp(fmap.log_features(x, w, side=side)), jnp.max(psi, axis=-1)


def test_parameters_are_pytree_leaves_through_jit_and_vmap():
    w = projections.orthogonal(jax.random.key(0), DIM, NUM_FEATURES)
    x = jax.random.normal(jax.random.key(1), (3, DIM))
    template = features.AngularHybridFeatureMap(num_sign_features=3)
    assert jax.tree.leaves(template) == [] and hash(template) == hash(template)
    fmap = template.init(jax.random.key(2), DIM)
    (leaf,) = jax.tree.leaves(fmap)
    assert leaf.shape == (3, DIM)
    apply = jax.jit(lambda f, x: f.features(x, w, side="key"))
    np.testing.assert_allclose(apply(fmap, x), fmap.features(x, w, side="key"), rtol=1e-6)
    # One map per head: vmap of init over keys stacks the parameters.
    stacked = jax.vmap(lambda k: template.init(k, DIM))(jax.random.split(jax.random.key(3), 5))
    assert jax.tree.leaves(stacked)[0].shape == (5, 3, DIM)
    per_head = jax.jit(jax.vmap(lambda f: f.features(x, w, side="query")))(stacked)
    single = jax.jit(lambda f: f.features(x, w, side="query"))(
        jax.tree.map(lambda leaf: leaf[4], stacked)
    )
    np.testing.assert_allclose(per_head[4], single, rtol=1e-6)


def test_fit_sets_the_fitted_fields():
    template = features.ClusterHybridFeatureMap(num_clusters=2)
    assert template.fitted_fields == ("query_centres", "key_centres")
    start = template.init(jax.random.key(0), DIM)
    np.testing.assert_array_equal(start.query_centres, jnp.zeros((2, DIM)))
    queries = jnp.concatenate([jnp.full((10, DIM), -3.0), jnp.full((10, DIM), 3.0)])
    fitted = jax.jit(lambda m, key, q, k: m.fit(key, q, k))(
        start, jax.random.key(1), queries, 2.0 * queries
    )
    np.testing.assert_allclose(jnp.sort(fitted.query_centres[:, 0]), [-3.0, 3.0])
    np.testing.assert_allclose(jnp.sort(fitted.key_centres[:, 0]), [-6.0, 6.0])
    # A map without fitted parameters is returned unchanged.
    positive = features.PositiveFeatureMap()
    assert (
        positive.init(jax.random.key(0), DIM).fit(jax.random.key(1), queries, queries) is positive
    )


def test_pair_takes_each_side_from_its_map():
    w = projections.gaussian(jax.random.key(0), DIM, NUM_FEATURES)
    x = jax.random.normal(jax.random.key(1), (3, DIM))
    pair = features.FeatureMapPair(features.PositiveFeatureMap(), features.ReluFeatureMap())
    np.testing.assert_array_equal(
        pair.features(x, w, side="query"), features.positive_features(x, w)
    )
    np.testing.assert_array_equal(pair.features(x, w, side="key"), features.relu_features(x, w))
    assert not pair.symmetric and not pair.has_log_space_form
    with pytest.raises(TypeError, match="FeatureMap"):
        features.FeatureMapPair(features.PositiveFeatureMap(), features.relu_features)


def test_maps_without_their_parameters_raise_clearly():
    w = projections.gaussian(jax.random.key(0), DIM, NUM_FEATURES)
    x = jnp.ones((2, DIM))
    with pytest.raises(ValueError, match=r"init\(key, dim\)"):
        features.AngularHybridFeatureMap().features(x, w, side="query")
    with pytest.raises(ValueError, match=r"init\(key, dim\)"):
        features.ClusterHybridFeatureMap().features(x, w, side="key")
    with pytest.raises(ValueError, match="num_sign_features"):
        features.AngularHybridFeatureMap(num_sign_features=0)
    with pytest.raises(ValueError, match="eps"):
        features.ReluFeatureMap(eps=0.0)


@pytest.mark.parametrize("name", ["trigonometric", "angular_hybrid", "gaussian_hybrid"])
def test_features_beyond_the_float_range_raise_and_never_give_nan(name):
    # Issue 32 item 3: the trigonometric and hybrid features carry e^{|x|^2/2}, which overflows
    # float32 from |x| = sqrt(2 log(max) + log m) (13.4 at m = 8): at |x| = 30 they were inf
    # and NaN (0 * inf) without a word. Outside jit such inputs now raise, naming the map, the
    # norm and the representable one; inside jit the entries are +-inf, never NaN; the
    # log-space form (what attention uses) stays finite.
    from rfjax.features import _fourier

    fmap = ready(name, dim=DIM)
    w = projections.orthogonal(jax.random.key(3), DIM, NUM_FEATURES)
    limit = _fourier.representable_norm(NUM_FEATURES, jnp.float32)
    assert 13.3 < limit < 13.5
    direction = jnp.ones((2, DIM)) / np.sqrt(DIM)
    for side in features.SIDES:
        inside = fmap.features(0.97 * limit * direction, w, side=side)
        assert bool(jnp.all(jnp.isfinite(inside)))
        beyond = 30.0 * direction
        with pytest.raises(ValueError, match=rf"{type(fmap).__name__}: .*\|x\| up to 30\b.*13\.4"):
            fmap.features(beyond, w, side=side)
        traced = jax.jit(lambda x, side=side: fmap.features(x, w, side=side))(beyond)
        assert not bool(jnp.any(jnp.isnan(traced))) and bool(jnp.any(jnp.isinf(traced)))
        assert bool(jnp.all(jnp.isfinite(fmap.scaled_features(beyond, w, side=side).features)))
    with pytest.raises(ValueError, match=r"trigonometric_features: .*\|x\| up to 30\b"):
        features.trigonometric_features(30.0 * direction, w)
