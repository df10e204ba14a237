"""Tests of ``rfjax.nn._conformer``: the Conformer encoder's outputs and gradients are finite and
padding does not change real frames."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.nn import (
    ConformerEncoder,
    conformer_attentions,
    fit_conformer_clusters,
)


def _tiny(attention, **kwargs):
    sizes = dict(num_classes=11, model_dim=8, num_layers=1, num_heads=2, ff_expansion=2)
    sizes |= dict(kernel_size=3, num_features=4, num_sign_features=2)
    return ConformerEncoder(attention=attention, **(sizes | kwargs))


def _init(model, features, mask):
    rngs = {"params": jax.random.key(1), "projection": jax.random.key(2)}
    variables = jax.jit(model.init)(rngs, features, mask)
    variables = {k: v for k, v in variables.items() if k != "intermediates"}
    if model.attention == "cluster_hybrid":
        fit = jax.jit(fit_conformer_clusters, static_argnums=1, static_argnames="num_points")
        variables = fit(jax.random.key(3), model, variables, features, mask, num_points=32)
    return variables


# Compiling a Conformer and its gradient costs 5-10 s per kind on the shared 2-core machine:
# the kind with the most machinery (cluster hybrid) and a signed kind (trigonometric: issue 7's
# NaN runs) run by default, the others with --runslow.
SLOW = pytest.mark.slow


DEFAULT_KINDS = ("cluster_hybrid", "trigonometric")


@pytest.mark.parametrize(
    "attention",
    [a if a in DEFAULT_KINDS else pytest.param(a, marks=SLOW) for a in conformer_attentions()],
)
def test_conformer_outputs_and_gradients_are_finite(attention):
    features = 3.0 * jax.random.normal(jax.random.key(0), (2, 24, 5))
    mask = jnp.arange(24)[None] < jnp.array([[24], [13]])
    model = _tiny(attention)
    variables = _init(model, features, mask)

    def loss(variables):
        logits, out_mask = model.apply(
            variables, features, mask, projection_step=7, rngs={"projection": jax.random.key(2)}
        )
        return jnp.sum(jnp.where(out_mask[..., None], logits, 0) ** 2), (logits, out_mask)

    grads, (logits, out_mask) = jax.jit(jax.grad(loss, has_aux=True))(variables)
    assert logits.shape == (2, 6, 11) and out_mask.sum(1).tolist() == [6, 4]
    assert np.all(np.isfinite(logits))
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads["params"]))
    assert any(np.any(g != 0) for g in jax.tree.leaves(grads["params"]))
    if attention == "cluster_hybrid":
        assert all(not np.any(g) for g in jax.tree.leaves(grads["feature_map"]))  # frozen


@pytest.mark.parametrize("attention", ["angular_hybrid", pytest.param("exact", marks=SLOW)])
def test_padding_does_not_change_real_frames(attention):
    features = jax.random.normal(jax.random.key(0), (1, 40, 5))
    lengths = jnp.array([[22]])
    model = _tiny(attention)
    short, long = features[:, :24], features.at[:, 22:].set(100.0)  # garbage in the padding
    variables = _init(model, short, jnp.arange(24)[None] < lengths)
    outputs = []
    apply = jax.jit(functools.partial(model.apply, projection_step=0))
    for x in (short, long):
        mask = jnp.arange(x.shape[1])[None] < lengths
        logits, out_mask = apply(variables, x, mask, rngs={"projection": jax.random.key(2)})
        outputs.append(logits[:, : int(out_mask.sum())])
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-5)


def test_bad_rates_and_widths_raise_naming_them():
    """A negative dropout rate and feed-forward blocks of width 0 ran without an error."""
    features, mask = jnp.ones((1, 6, 4)), jnp.ones((1, 6), bool)
    for options, name in (
        (dict(dropout_rate=-1.0), "dropout_rate"),
        (dict(ff_expansion=0), "ff_expansion"),
    ):
        with pytest.raises(ValueError, match=name):
            _tiny("trigonometric", **options).init(
                {"params": jax.random.key(1), "projection": jax.random.key(2)}, features, mask
            )


def test_fitting_clusters_without_a_real_frame_raises_or_gives_nan():
    """An all-padding mask fitted the centres to padded frames drawn with probabilities 0 / 0,
    finite and silently; now it raises, and inside jit the fitted parameters are NaN."""
    features = jax.random.normal(jax.random.key(0), (2, 16, 5))
    model = _tiny("cluster_hybrid")
    variables = _init(model, features, jnp.ones((2, 16), bool))
    padding = jnp.zeros((2, 16), bool)
    with pytest.raises(ValueError, match="mask must mark at least one real frame"):
        fit_conformer_clusters(jax.random.key(3), model, variables, features, padding)
    fit = jax.jit(fit_conformer_clusters, static_argnums=1, static_argnames="num_points")
    fitted = fit(jax.random.key(3), model, variables, features, padding, num_points=32)
    assert all(np.isnan(x).all() for x in jax.tree.leaves(fitted["feature_map"]))
    fitted = fit(jax.random.key(3), model, variables, features, padding.at[1, :3].set(True))
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(fitted["feature_map"]))


def test_cluster_centres_are_fitted_on_real_frames_only():
    """One real frame (input frame 0 of sequence 0, the first after subsampling): every point
    drawn is it, so each head's query and key centres are its query and key times H^{-1/4};
    a padded frame's would differ."""
    model = _tiny("cluster_hybrid")
    features = 3.0 * jax.random.normal(jax.random.key(0), (2, 24, 5))
    mask = jnp.zeros((2, 24), bool).at[0, 0].set(True)
    variables = _init(model, features, jnp.ones((2, 24), bool))
    fitted = fit_conformer_clusters(
        jax.random.key(3), model, variables, features, mask, num_points=32
    )
    _, state = model.apply(
        variables, features, mask, mutable=["intermediates"], rngs={"projection": jax.random.key(4)}
    )
    sown = state["intermediates"]["block_0"]["attention"]
    centres = fitted["feature_map"]["block_0"]["attention"]
    scale = 4**-0.25  # H = 8 / 2
    for side in ("query", "key"):
        frame = sown[f"{side}_heads"][0][0, 0] * scale  # (N, H)
        got = centres[f"{side}_centres"]  # (N, k, H)
        np.testing.assert_allclose(got, jnp.broadcast_to(frame[:, None], got.shape), atol=1e-5)
