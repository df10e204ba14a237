"""Tests of ``rfjax.nn._conformer``: the Conformer encoder's outputs and gradients are finite,
padding does not change real frames, and its dataflow (subsampling, positions, macaron block,
convolution module, dropout) is the Conformer's."""

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
from tests.support.module_calls import recorded_calls


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


def _subsampled(x: np.ndarray, params: dict) -> np.ndarray:
    """Conv1D of kernel 3, stride 2, one zero frame of padding on each side, written out."""
    padded = np.pad(x, ((0, 0), (1, 1), (0, 0)))
    kernel = np.asarray(params["kernel"])  # (3, F, D)
    frames = range((x.shape[1] - 1) // 2 + 1)
    out = [sum(padded[:, 2 * t + i] @ kernel[i] for i in range(3)) for t in frames]
    return np.stack(out, 1) + np.asarray(params["bias"])


def _depthwise_same(x: np.ndarray, params: dict) -> np.ndarray:
    """Depthwise Conv1D (one filter per channel) of odd kernel k, (k - 1) / 2 zero frames of
    padding on each side, written out."""
    kernel = np.asarray(params["kernel"])[:, 0]  # (k, D)
    half = kernel.shape[0] // 2
    padded = np.pad(x, ((0, 0), (half, half), (0, 0)))
    out = [
        sum(padded[:, t + i] * kernel[i] for i in range(kernel.shape[0])) for t in range(x.shape[1])
    ]
    return np.stack(out, 1) + np.asarray(params["bias"])


def test_encoder_dataflow_is_the_conformers():
    """From the recorded inputs and outputs of every module: 4x subsampling (kernel 3, stride
    2, padding 1, ReLU, padded frames zeroed), the interleaved sinusoidal positions (sin at even,
    cos at odd channels), the block x + FF/2, + MHSA(LN x) under the frame mask, + Conv, + FF/2,
    then LayerNorm, the convolution module's depthwise 'same' convolution of masked frames then
    LayerNorm, swish and Dense, and the feed-forward's swish."""
    model = _tiny("exact", kernel_size=5)
    features = jax.random.normal(jax.random.key(0), (2, 15, 5))
    mask = jnp.arange(15)[None] < jnp.array([[15], [9]])
    variables = _init(model, features, mask)
    params = variables["params"]
    with recorded_calls() as calls:
        logits, out_mask = model.apply(variables, features, mask)

    def close(a, b):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)

    x, frame_mask = np.where(mask[..., None], features, 0), np.asarray(mask)
    for layer in range(2):
        call = calls[f"subsample_{layer}"]
        close(call.args[0], x)
        close(call.output, _subsampled(x, params[f"subsample_{layer}"]))
        frame_mask = frame_mask[:, ::2]
        x = np.where(frame_mask[..., None], np.maximum(call.output, 0), 0)
    np.testing.assert_array_equal(out_mask, frame_mask)
    assert frame_mask.sum(1).tolist() == [4, 3]  # ceil(ceil(T / 2) / 2)
    close(calls["input_projection"].args[0], x)
    angles = np.arange(4)[:, None] / 10_000.0 ** (np.arange(0, 8, 2) / 8)
    table = np.stack([np.sin(angles), np.cos(angles)], -1).reshape(4, 8)  # interleaved
    x = calls["input_projection"].output + table
    close(calls["block_0"].args[0], x)

    def block(name):
        return calls[f"block_0/{name}"]

    close(block("_FeedForward_0").args[0], x)
    x = x + 0.5 * block("_FeedForward_0").output
    close(block("LayerNorm_0").args[0], x)
    close(block("attention").args[0], block("LayerNorm_0").output)
    np.testing.assert_array_equal(block("attention").kwargs["mask"], frame_mask)
    x = x + block("attention").output
    close(block("_Convolution_0").args[0], x)
    np.testing.assert_array_equal(block("_Convolution_0").args[1], frame_mask)
    gated = jax.nn.glu(block("_Convolution_0/Dense_0").output, axis=-1)
    conv = block("_Convolution_0/Conv_0")
    close(conv.args[0], np.where(frame_mask[..., None], gated, 0))
    close(
        conv.output,
        _depthwise_same(np.asarray(conv.args[0]), params["block_0"]["_Convolution_0"]["Conv_0"]),
    )
    inner = {name: block(f"_Convolution_0/{name}") for name in ("LayerNorm_1", "Dense_1")}
    close(inner["LayerNorm_1"].args[0], conv.output)
    close(inner["Dense_1"].args[0], jax.nn.swish(inner["LayerNorm_1"].output))
    close(block("_Convolution_0").output, inner["Dense_1"].output)
    feed = {name: block(f"_FeedForward_0/{name}") for name in ("LayerNorm_0", "Dense_0", "Dense_1")}
    close(feed["Dense_0"].args[0], feed["LayerNorm_0"].output)
    close(feed["Dense_1"].args[0], jax.nn.swish(feed["Dense_0"].output))
    x = x + block("_Convolution_0").output
    close(block("_FeedForward_1").args[0], x)
    x = x + 0.5 * block("_FeedForward_1").output
    close(block("LayerNorm_1").args[0], x)
    close(calls["block_0"].output, block("LayerNorm_1").output)
    close(calls["logits"].args[0], calls["block_0"].output)
    close(logits, calls["logits"].output)


def test_dropout_acts_only_in_training():
    """train=False: no dropout (the outputs of dropout_rate=0 with the same parameters, and no
    "dropout" stream needed); train=True: dropout, drawn from the stream."""
    features = jax.random.normal(jax.random.key(0), (1, 12, 5))
    mask = jnp.ones((1, 12), bool)
    variables = _init(_tiny("exact"), features, mask)
    noisy = _tiny("exact", dropout_rate=0.5)
    plain = _tiny("exact").apply(variables, features, mask)[0]
    np.testing.assert_allclose(noisy.apply(variables, features, mask)[0], plain, rtol=1e-6)
    dropped = [
        noisy.apply(variables, features, mask, train=True, rngs={"dropout": jax.random.key(s)})[0]
        for s in (0, 1)
    ]
    assert not np.allclose(dropped[0], plain) and not np.allclose(dropped[0], dropped[1])


def test_only_kinds_that_need_a_floor_get_hybrid_eps():
    """The FAVOR denominator is floored at hybrid_eps for the maps that set
    needs_denominator_floor (the signed trigonometric one here); FAVOR+ keeps attention's
    default floor (eps None) and exact attention has none."""
    assert _tiny("trigonometric", hybrid_eps=0.25)._attention_config()["eps"] == 0.25
    assert _tiny("positive", hybrid_eps=0.25)._attention_config()["eps"] is None
    assert "eps" not in _tiny("exact", hybrid_eps=0.25)._attention_config()
