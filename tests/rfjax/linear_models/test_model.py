"""Tests of ``rfjax.linear_models._model``: the fitted ridge model equals closed-form ridge on the
feature matrix, is a pytree and predicts in streamed blocks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import features, projections
from rfjax.linear_models import (
    RandomFeatureRidgeModel,
    RandomFeatureTransform,
    _model,
    array_blocks,
    fit_random_feature_ridge,
)
from tests.support.ridge_data import data, transform64


def _closed_form(phi, y, alpha, fit_intercept):
    """Ridge on the explicit feature matrix, as textbook: [Phi 1] with an unpenalised 1."""
    if fit_intercept:
        design = np.concatenate([phi, np.ones((phi.shape[0], 1))], axis=1)
        penalty = alpha * np.diag(np.r_[np.ones(phi.shape[1]), 0.0])
    else:
        design, penalty = phi, alpha * np.eye(phi.shape[1])
    solution = np.linalg.solve(design.T @ design + penalty, design.T @ y)
    if fit_intercept:
        return solution[:-1], solution[-1]
    return solution, np.zeros(y.shape[1])


@pytest.mark.parametrize(
    "coupling,feature_map,kernel,fit_intercept",
    [
        ("orthogonal", "fourier", "gaussian", True),
        ("simplex", "positive_antithetic", "softmax", False),
        ("gaussian", "positive", "gaussian", True),
    ],
)
def test_equals_closed_form_ridge_on_the_feature_matrix(
    float64, coupling, feature_map, kernel, fit_intercept
):
    x, y = data()
    transform = transform64(coupling, feature_map, kernel)
    phi = np.asarray(transform(jnp.asarray(x)))
    model = fit_random_feature_ridge(
        transform, array_blocks(x, y, 64), 0.3, fit_intercept=fit_intercept, dtype=jnp.float64
    )
    weights, intercept = _closed_form(phi, y, 0.3, fit_intercept)
    np.testing.assert_allclose(model.weights, weights, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(model.intercept, intercept, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(model.predict(x), phi @ weights + intercept, rtol=1e-8, atol=1e-8)


def test_the_model_is_a_pytree_with_its_projection():
    x, y = data(dtype=np.float32)
    transform = RandomFeatureTransform(
        projections.get("gaussian")(jax.random.key(0), 5, 8), features.get("positive")()
    )
    model = fit_random_feature_ridge(transform, array_blocks(x, y), 1.0)
    leaves, treedef = jax.tree.flatten(model)
    rebuilt = jax.tree.unflatten(treedef, leaves)
    assert isinstance(rebuilt, RandomFeatureRidgeModel)
    for projection_leaf in jax.tree.leaves(transform.projection):
        assert any(leaf is projection_leaf for leaf in leaves)
    np.testing.assert_array_equal(rebuilt.predict(x), model.predict(x))


def test_predict_streams_blocks_and_a_new_row_count_compiles_nothing():
    """predict equals the one-piece model on every row; counts of at least block_rows rows use
    one program whatever the count, fewer rows a power-of-two bucket (each compiled once), and
    leading axes and a traced input work as before."""
    x, y = data(n=700, dtype=np.float32)
    transform = RandomFeatureTransform(
        projections.get("orthogonal")(jax.random.key(0), 5, 16),
        features.get("fourier")(),
        kernel="gaussian",
    )
    model = fit_random_feature_ridge(transform, array_blocks(x, y), 1.0)
    whole = np.asarray(_model._predict(model, jnp.asarray(x)))
    np.testing.assert_allclose(np.asarray(model.predict(x, block_rows=256)), whole, atol=1e-6)
    compiled = _model._predict._cache_size()
    for count in (699, 611, 256, 300):  # >= block_rows: the 256-row program alone
        np.testing.assert_allclose(
            np.asarray(model.predict(x[:count], block_rows=256)), whole[:count], atol=1e-6
        )
    assert _model._predict._cache_size() == compiled
    assert [_model.bucket_rows(n, 4096) for n in (1, 256, 257, 4095, 4096, 10**6)] == [
        256,
        256,
        512,
        4096,
        4096,
        4096,
    ]
    np.testing.assert_allclose(np.asarray(model.predict(x[:3])), whole[:3], atol=1e-6)
    assert model.predict(x.reshape(7, 100, 5)).shape == (7, 100, 2)
    traced = jax.jit(lambda m, v: m.predict(v))(model, x[:9])
    np.testing.assert_allclose(np.asarray(traced), whole[:9], atol=1e-6)
    with pytest.raises(TypeError, match="x must be a floating array"):
        model.predict(np.zeros((3, 5), np.int32))
    with pytest.raises(ValueError, match="last axis of size dim=5"):
        model.predict(np.zeros((3, 4), np.float32))


def test_predict_refuses_inputs_beyond_the_transform_dtype(float64):
    """A float64 row beyond float32's range became infinite in the cast to a float32
    transform's dtype: a NaN prediction and no error (``ridge_statistics`` raises for it)."""
    projection = projections.get("orthogonal")(jax.random.key(0), 5, 16, dtype=jnp.float32)
    transform = RandomFeatureTransform(projection, features.get("fourier")(), kernel="gaussian")
    x, y = data(t=1)
    model = fit_random_feature_ridge(transform, array_blocks(x, y), 1.0)
    x[0, 0] = 1e39
    with pytest.raises(ValueError, match=r"x holds values up to .* float32"):
        model.predict(x[:4])


def test_a_predict_block_over_the_cap_is_refused_before_compiling(float64):
    """2^20 rows in one block of 1024 float64 features (8 GiB): refused, naming the block, where
    XLA's CPU runtime would abort the interpreter on an allocation it cannot make."""
    projection = projections.get("orthogonal")(jax.random.key(0), 5, 512, dtype=jnp.float64)
    transform = RandomFeatureTransform(projection, features.get("fourier")(), kernel="gaussian")
    x, y = data(t=1)
    model = fit_random_feature_ridge(transform, array_blocks(x, y), 1.0, dtype=jnp.float64)
    with pytest.raises(ValueError, match=r"block_rows=1048576, width=1024 imply the features"):
        model.predict(np.zeros((2**20, 5)), block_rows=2**20)
