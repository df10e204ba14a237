"""Tests of ``rfjax.nn._performer_lm``: PerformerLM's token NLL, parameter layout, decoding,
attribute checks, scaled and tied embedding and pre-norm blocks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.nn import PerformerLM
from rfjax.nn._performer_lm import sinusoidal_positions, token_nll
from tests.support.module_calls import assert_pre_norm_block, recorded_calls

SIZES = dict(vocab_size=37, num_layers=2, embed_dim=16, num_heads=2, mlp_dim=24, num_features=8)


def _model(kind: str, **options) -> PerformerLM:
    return PerformerLM(**SIZES, attention_kind=kind, chunk_size=8, loss_chunk=7, **options)


def _tokens(length: int = 30) -> jax.Array:
    return jax.random.randint(jax.random.key(0), (2, length), 0, SIZES["vocab_size"])


RNGS = {"projection": jax.random.key(3)}


@pytest.mark.parametrize("kind", ["performer", "exact"])
def test_token_nll_is_the_log_softmax_of_the_logits(kind):
    # Chunks of 7 positions over T = 30 (the last one padded).
    model, tokens = _model(kind), _tokens()
    targets = jnp.roll(tokens, -1, axis=1)
    variables = model.init(jax.random.key(1), tokens)
    logits = model.apply(variables, tokens, rngs=RNGS, projection_step=5)
    nll = model.apply(variables, tokens, targets, rngs=RNGS, projection_step=5)
    expected = -jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(nll, expected, rtol=1e-5, atol=1e-5)
    grad = jax.grad(
        lambda h: token_nll(h, variables["params"]["embed"]["embedding"], targets, 7).sum()
    )(jnp.ones((2, 30, 16)))
    assert np.all(np.isfinite(grad))


def test_kinds_share_the_parameter_layout_and_initialisation():
    tokens = _tokens()
    performer = _model("performer").init(jax.random.key(1), tokens)
    exact = _model("exact").init(jax.random.key(1), tokens)
    assert jax.tree.structure(performer) == jax.tree.structure(exact)
    for a, b in zip(jax.tree.leaves(performer), jax.tree.leaves(exact), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", ["performer", "exact"])
def test_decoding_token_by_token_gives_the_parallel_logits(kind):
    # FAVOR's recurrent state / Flax's key-value cache against the causal forward pass, at the
    # same projection step; positions continue from the cache's.
    tokens = _tokens(12)
    variables = _model(kind).init(jax.random.key(1), tokens)
    parallel = _model(kind).apply(variables, tokens, rngs=RNGS, projection_step=5)
    decoder = _model(kind, decode=True)
    cache = decoder.init(jax.random.key(1), tokens)["cache"]

    def step(cache, token):
        logits, updated = decoder.apply(
            {**variables, "cache": cache},
            token[:, None],
            rngs=RNGS,
            projection_step=5,
            mutable=["cache"],
        )
        return updated["cache"], logits[:, 0]

    _, stepped = jax.lax.scan(step, cache, tokens.T)
    np.testing.assert_allclose(jnp.moveaxis(stepped, 0, 1), parallel, rtol=2e-5, atol=2e-5)


def test_bad_attributes_raise_naming_them():
    tokens = _tokens()
    with pytest.raises(ValueError, match="attention_kind must be one of"):
        _model("flash").init(jax.random.key(0), tokens)
    with pytest.raises(ValueError, match="embed_dim must be even and a multiple of num_heads"):
        PerformerLM(vocab_size=5, embed_dim=15, num_heads=3).init(jax.random.key(0), tokens)
    with pytest.raises(ValueError, match=r"decode=True .* sequence_axis=.seq."):
        _model("performer", decode=True, sequence_axis="seq").init(jax.random.key(0), tokens)


def test_token_ids_outside_the_vocabulary_raise_or_give_nan_in_their_rows():
    """Concrete ids outside [0, V) raise naming tokens or targets (-1 wrapped to class V - 1,
    V gave NaN); inside jit, NaN at that position and the later ones only."""
    model = _model("exact")
    tokens = _tokens(8)
    variables = model.init(jax.random.key(0), tokens)
    vocabulary = SIZES["vocab_size"]
    for bad in (-1, vocabulary):
        with pytest.raises(ValueError, match=rf"tokens must hold ids in \[0, {vocabulary}\)"):
            model.apply(variables, tokens.at[0, 6].set(bad))
        with pytest.raises(ValueError, match=rf"targets must hold ids in \[0, {vocabulary}\)"):
            model.apply(variables, tokens, tokens.at[0, 6].set(bad))
        logits = jax.jit(model.apply)(variables, tokens.at[0, 6].set(bad))
        # Causal: positions 0-5 of the row are finite (a NaN value with a masked weight of 0
        # reached every earlier position), the other row entirely.
        assert np.isfinite(logits[0, :6]).all() and np.isnan(logits[0, 6:]).all()
        assert np.isfinite(logits[1]).all()


def test_sinusoidal_positions_are_vaswanis():
    """sin and cos of p / 10000^(2i / D), i < D / 2, written out for D = 6."""
    positions = np.array([0, 1, 7, 300])
    got = np.asarray(sinusoidal_positions(jnp.asarray(positions), 6), np.float64)
    angles = positions[:, None] / 10_000.0 ** (np.arange(3)[None, :] * 2 / 6)
    np.testing.assert_allclose(got, np.concatenate([np.sin(angles), np.cos(angles)], -1), atol=2e-5)


def test_the_model_runs_the_implementation_it_is_given():
    """``PerformerLM(implementation=...)`` reaches every layer's ``favor_attention``: the fused
    kernels (in interpret mode here) where asked for, the XLA form otherwise (traced only)."""
    tokens = _tokens()

    def kernel_calls(implementation: str) -> int:
        model = _model("performer", implementation=implementation)
        params = jax.eval_shape(model.init, {"params": jax.random.key(0), **RNGS}, tokens)
        program = jax.make_jaxpr(lambda p: model.apply(p, tokens, rngs=RNGS))(params)
        return str(program).count("pallas_call")

    assert kernel_calls("pallas_triton_interpret") > 0 and kernel_calls("xla") == 0


def test_logits_are_the_tied_embedding_of_the_normalised_scaled_tokens_plus_positions():
    """No block: logits = LN(sqrt(D) E[token] + positions) E^T (Vaswani's scaled embedding,
    the final LayerNorm, the output tied to the embedding)."""
    model = PerformerLM(**(SIZES | dict(num_layers=0)), attention_kind="exact")
    tokens = _tokens(9)
    params = model.init(jax.random.key(1), tokens)["params"]
    norm = {"scale": 1.0 + jax.random.normal(jax.random.key(2), (16,)), "bias": jnp.ones(16)}
    params = {**params, "LayerNorm_0": norm}
    table = params["embed"]["embedding"]
    x = table[tokens] * 4.0 + sinusoidal_positions(jnp.arange(9), 16)
    mean = x.mean(-1, keepdims=True)
    normed = (x - mean) / jnp.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-6)
    expected = (normed * norm["scale"] + norm["bias"]) @ table.T
    logits = model.apply({"params": params}, tokens)
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def test_decoder_block_is_pre_norm_with_residuals():
    """From the recorded module calls: x + Attn(LN(x)), then x + Dense(gelu(Dense(LN(x))))."""
    model = PerformerLM(**(SIZES | dict(num_layers=1)), attention_kind="exact")
    tokens = _tokens(9)
    variables = model.init(jax.random.key(1), tokens)
    with recorded_calls() as calls:
        model.apply(variables, tokens)
    assert_pre_norm_block(calls, "_DecoderBlock_0", "MultiHeadDotProductAttention_0")
