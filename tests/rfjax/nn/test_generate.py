"""``rfjax.nn.generate``: a prompt prefilled, then a compiled loop over new tokens, for
``PerformerLM`` with FAVOR's state and with exact attention's key/value cache: its tokens and
logits against the causal forward pass and the token-by-token path, its program (compiled
once, no key or draw per token), sampling and its argument checks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.nn import FEATURE_MAP_COLLECTION, PerformerLM, generate
from tests.support.compile_counts import count_programs
from tests.support.primitives import DRAWS, KEYS, equations, primitives
from tests.support.representatives import representatives
from tests.support.sampled_softmax_checks import assert_frequencies_match

SIZES = dict(vocab_size=37, num_layers=2, embed_dim=16, num_heads=2, mlp_dim=24, num_features=8)
RNGS = {"projection": jax.random.key(3)}
STEP = 5
PROMPT, NEW = 7, 6


def _model(kind: str, **options) -> PerformerLM:
    return PerformerLM(**SIZES, attention_kind=kind, chunk_size=4, **options)


def _setup(kind: str):
    model = _model(kind)
    prompt = jax.random.randint(jax.random.key(0), (2, PROMPT), 0, SIZES["vocab_size"])
    params = jax.jit(model.init)(jax.random.key(1), prompt)["params"]
    return model, params, prompt


def _forward(model, params, sequence, rngs=RNGS, projection_step=STEP):
    """The causal forward pass's logits (B, T, V), compiled (as ``generate`` is)."""
    return jax.jit(
        lambda params, sequence: model.apply(
            {"params": params}, sequence, rngs=rngs, projection_step=projection_step
        )
    )(params, sequence)


def _one_call_per_token(model, params, tokens):
    """The token-by-token path: a cache from ``init``, then one ``apply`` per token with the
    projection stream (the decode calls of ``PerformerLM``'s docstring); logits ``(B, T, V)``."""
    decoder = model.clone(decode=True)
    cache = jax.jit(decoder.init)(jax.random.key(1), tokens)["cache"]
    step = jax.jit(
        lambda cache, token: decoder.apply(
            {"params": params, "cache": cache},
            token,
            rngs=RNGS,
            projection_step=STEP,
            mutable=["cache"],
        )
    )
    logits = []
    for t in range(tokens.shape[1]):
        out, state = step(cache, tokens[:, t : t + 1])
        cache = state["cache"]
        logits.append(out)
    return jnp.concatenate(logits, axis=1)


@pytest.mark.parametrize(  # exact attention's cache: test_one_token_prompt, by default
    "kind", representatives(["performer", "exact"], ["performer"])
)
def test_greedy_tokens_and_logits_are_the_causal_forward_pass(kind):
    model, params, prompt = _setup(kind)
    generated = generate(model, params, prompt, NEW, rngs=RNGS, projection_step=STEP)
    assert generated.tokens.shape == (2, NEW) and generated.tokens.dtype == jnp.int32
    sequence = jnp.concatenate([prompt, generated.tokens], axis=1)
    parallel = _forward(model, params, sequence)
    # Token i is chosen from the logits at position PROMPT - 1 + i.
    np.testing.assert_allclose(generated.logits, parallel[:, PROMPT - 1 : -1], atol=1e-5)
    np.testing.assert_array_equal(generated.tokens, jnp.argmax(parallel[:, PROMPT - 1 : -1], -1))
    stepped = _one_call_per_token(model, params, sequence[:, :-1])
    np.testing.assert_allclose(generated.logits, stepped[:, PROMPT - 1 :], atol=1e-5)
    assert len(set(np.asarray(generated.tokens).ravel().tolist())) > 1  # not one token repeated


def test_sampling_with_a_key_is_reproducible_and_its_logits_are_the_forward_pass():
    model, params, prompt = _setup("performer")
    options = dict(rngs=RNGS, projection_step=STEP, temperature=2.0)
    first = generate(model, params, prompt, NEW, key=jax.random.key(7), **options)
    again = generate(model, params, prompt, NEW, key=jax.random.key(7), **options)
    other = generate(model, params, prompt, NEW, key=jax.random.key(8), **options)
    np.testing.assert_array_equal(first.tokens, again.tokens)
    assert not np.array_equal(first.tokens, other.tokens)
    sequence = jnp.concatenate([prompt, first.tokens], axis=1)
    parallel = _forward(model, params, sequence)
    np.testing.assert_allclose(first.logits, parallel[:, PROMPT - 1 : -1], atol=1e-5)


def test_sampled_tokens_follow_the_softmax_of_the_logits_over_the_temperature():
    # 4,000 copies of one prompt: each draws its first token from softmax(logits / 2), the
    # frequencies checked by a chi-square and per token within 4.5 SE (logits * 2 or the
    # logits alone put 0.84 or 0.3 on the likeliest of 37 tokens, where this has 0.11).
    model, params, prompt = _setup("performer")
    copies = jnp.repeat(prompt[:1], 4000, axis=0)
    options = dict(rngs=RNGS, projection_step=STEP, key=jax.random.key(4), temperature=2.0)
    sampled = generate(model, params, copies, 1, **options)
    logits = sampled.logits[:, 0]
    np.testing.assert_allclose(logits, jnp.broadcast_to(logits[0], logits.shape), atol=1e-5)
    assert_frequencies_match(sampled.tokens.T, jax.nn.softmax(logits[:1] / 2.0))


def test_each_step_samples_with_its_own_key():
    # At temperature 100 every token is nearly uniform over the 37: the 4,000 tokens of 100
    # rows of 40 steps follow the mean of their softmax(logits / 100) only if the steps draw
    # independently (one key for every step repeats a row's token: counts 40 times as spread).
    model, params, prompt = _setup("performer")
    copies = jnp.repeat(prompt[:1], 100, axis=0)
    options = dict(rngs=RNGS, projection_step=STEP, key=jax.random.key(5), temperature=100.0)
    sampled = generate(model, params, copies, 40, **options)
    expected = jnp.mean(jax.nn.softmax(sampled.logits / 100.0), axis=(0, 1))
    assert_frequencies_match(sampled.tokens.reshape(1, -1), expected[None])


@pytest.mark.parametrize("kind, cache_length", [("performer", None), ("exact", 40)])
def test_one_token_prompt(kind, cache_length):
    # P = 1: no prefill, the loop from the cache's creation; exact attention's cache longer
    # than the tokens it is fed (masked).
    model, params, prompt = _setup(kind)
    generated = generate(
        model,
        params,
        prompt[:, :1],
        NEW,
        rngs=RNGS,
        projection_step=STEP,
        cache_length=cache_length,
    )
    sequence = jnp.concatenate([prompt[:, :1], generated.tokens], axis=1)
    parallel = _forward(model, params, sequence)
    np.testing.assert_allclose(generated.logits, parallel[:, :-1], atol=1e-5)
    np.testing.assert_array_equal(generated.tokens, jnp.argmax(parallel[:, :-1], -1))


def test_a_two_token_prompt_at_the_default_step():
    # P = 2: a prefill of one token, then the loop from the prompt's last; no projection_step:
    # step 0's projection, as the forward pass without one (redrawn at every step here, so
    # that another step's projection gives other logits).
    model = _model("performer", redraw_interval=1)
    prompt = jax.random.randint(jax.random.key(0), (2, 2), 0, SIZES["vocab_size"])
    params = jax.jit(model.init)(jax.random.key(1), prompt)["params"]
    generated = generate(model, params, prompt, NEW, rngs=RNGS)
    sequence = jnp.concatenate([prompt, generated.tokens], axis=1)
    parallel = _forward(model, params, sequence, projection_step=None)
    np.testing.assert_allclose(generated.logits, parallel[:, 1:-1], atol=1e-5)
    np.testing.assert_array_equal(generated.tokens, jnp.argmax(parallel[:, 1:-1], -1))


def test_one_program_compiled_once_per_number_of_tokens():
    model, params, prompt = _setup("performer")
    count = 3  # a number of tokens no other test generates: compiled here
    with count_programs() as first:
        generate(model, params, prompt, count, rngs=RNGS, projection_step=STEP)
    assert first[0] == 1  # the cache, the prefill and the loop in one program
    other_prompt = (prompt + 1) % SIZES["vocab_size"]
    with count_programs() as again:
        generate(model, params, other_prompt, count, rngs={"projection": jax.random.key(9)})
        generate(model, params, prompt, count, rngs=RNGS, projection_step=STEP + 1)
    assert again[0] == 0
    with count_programs() as sampled:
        for seed, temperature in ((1, 0.5), (2, 1.5)):
            key = jax.random.key(seed)
            generate(model, params, prompt, count, rngs=RNGS, key=key, temperature=temperature)
    assert sampled[0] == 1  # sampling is its own program, whatever the key and temperature


def test_the_loop_step_derives_no_keys_and_draws_nothing():
    # The scan body of the greedy program: the Performer reads its projection from the cache,
    # and the logits contract the embedding table without transposing it (a copy per token).
    model, params, prompt = _setup("performer")
    program = jax.make_jaxpr(
        lambda prompt: generate(model, params, prompt, NEW, rngs=RNGS, projection_step=STEP)
    )(prompt).jaxpr
    (jitted,) = [e for e in program.eqns if e.primitive.name == "jit"]  # generate's program
    (loop,) = [e for e in jitted.params["jaxpr"].jaxpr.eqns if e.primitive.name == "scan"]
    body = loop.params["jaxpr"].jaxpr
    outside, inside = primitives(body)
    assert not KEYS & (outside | inside)
    assert "dot_general" in outside  # it is the model's step
    table = (SIZES["vocab_size"], SIZES["embed_dim"])  # the logits' (V, D) table: not copied
    transposes = [
        e.invars[0].aval.shape for e in equations(body) if e.primitive.name == "transpose"
    ]
    assert table not in transposes
    assert primitives(program)[0] >= DRAWS  # the projection's draw, once, before the loop


def test_bad_arguments_raise_naming_them():
    model, params, prompt = _setup("performer")
    with pytest.raises(TypeError, match="prompt must hold integer tokens"):
        generate(model, params, prompt.astype(jnp.float32), NEW, rngs=RNGS)
    with pytest.raises(ValueError, match=r"prompt must have shape \(B, P\) with P >= 1"):
        generate(model, params, prompt[:, :0], NEW, rngs=RNGS)
    with pytest.raises(ValueError, match="num_tokens"):
        generate(model, params, prompt, 0, rngs=RNGS)
    with pytest.raises(ValueError, match=r"prompt must hold ids in \[0, "):  # NaN logits before
        generate(model, params, prompt.at[0, 1].set(model.vocab_size), NEW, rngs=RNGS)
    with pytest.raises(ValueError, match="cache_length"):
        generate(model, params, prompt, NEW, rngs=RNGS, cache_length=PROMPT + NEW - 2)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        generate(model, params, prompt, NEW, rngs=RNGS, key=jax.random.key(0), temperature=0.0)
    with pytest.raises(ValueError, match=r"temperature must be a scalar, got .* \(2,\)"):
        temperature = jnp.array([0.5, 1.0])  # raised NumPy's "only 0-dimensional arrays"
        generate(
            model, params, prompt, NEW, rngs=RNGS, key=jax.random.key(0), temperature=temperature
        )
    with pytest.raises(TypeError, match="temperature must be"):  # raised float()'s error
        generate(model, params, prompt, NEW, rngs=RNGS, key=jax.random.key(0), temperature="hot")
    with pytest.raises(TypeError, match="key must be a single JAX PRNG key"):
        generate(model, params, prompt, NEW, rngs=RNGS, key=0)
    with pytest.raises(ValueError, match="RNG stream 'projection'"):
        generate(model, params, prompt, NEW)
    with pytest.raises(TypeError, match="decode attribute"):
        generate(object(), params, prompt, NEW)  # type: ignore[arg-type]
    for reserved in ("params", "cache"):
        with pytest.raises(ValueError, match=f"collections .* got \\['{reserved}'\\]"):
            generate(model, params, prompt, NEW, rngs=RNGS, collections={reserved: {}})


@pytest.mark.parametrize("step", [1.5, jnp.float32(1.5), True, "1"])
def test_a_projection_step_that_is_not_an_integer_raises(step):
    """It was cast to int32 (1.5 and True gave step 1's projection, silently; "1" raised
    JAX's own conversion error), where the parallel model's redraw_key refuses it."""
    model, params, prompt = _setup("performer")
    with pytest.raises(TypeError, match="projection_step must be"):
        generate(model, params, prompt, NEW, rngs=RNGS, projection_step=step)


def test_a_fitted_feature_map_collection_enters_every_call():
    # The cluster hybrid's centres live in the "feature_map" collection (started by init, set by
    # a fit): without them generate could not run the model (Flax: the collection is empty);
    # with them its tokens and logits are the forward pass's over the same variables.
    model = _model("performer", feature_map="cluster_hybrid")
    prompt = jax.random.randint(jax.random.key(0), (2, PROMPT), 0, SIZES["vocab_size"])
    variables = jax.jit(model.init)(jax.random.key(1), prompt)
    centres = jax.tree.map(lambda c: c + 0.5, variables[FEATURE_MAP_COLLECTION])  # not init's
    collections = {FEATURE_MAP_COLLECTION: centres}
    generated = generate(
        model,
        variables["params"],
        prompt,
        2,
        rngs=RNGS,
        projection_step=STEP,
        collections=collections,
    )
    sequence = jnp.concatenate([prompt, generated.tokens], axis=1)
    parallel = jax.jit(
        lambda sequence: model.apply(
            {"params": variables["params"], **collections},
            sequence,
            rngs=RNGS,
            projection_step=STEP,
        )
    )(sequence)
    np.testing.assert_allclose(generated.logits, parallel[:, PROMPT - 1 : -1], atol=1e-5)
    np.testing.assert_array_equal(generated.tokens, jnp.argmax(parallel[:, PROMPT - 1 : -1], -1))
