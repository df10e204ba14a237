"""The per-head draws of ``PerformerAttention`` (``rfjax.nn._attention_draws``): decoding keeps
the drawn projection: a generated token runs no draw (the orthogonal coupling's QR
decompositions, the random bits) unless its keys change (a new redraw period or projection key),
in linen's and NNX's ``PerformerAttention``; the output still equals causal FAVOR's with the
projection of the decoding step. A step that does not name its projection (linen: no
``"projection"`` stream; NNX: no ``projection_step``) reads the cache's: its program derives,
compares and draws no keys at all (no ``cond``), as in a compiled loop."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rfjax.nn import PerformerAttention
from rfjax.nn import nnx as rnnx
from rfjax.nn._attention_draws import draw_heads
from tests.support.primitives import DRAWS, KEYS, traced_primitives

BATCH, LENGTH, WIDTH, HEADS = 2, 6, 16, 2
STEP = 250  # a later redraw period than the cache's (redraw_interval 100): decoding redraws


def _inputs():
    return jax.random.normal(jax.random.key(0), (BATCH, LENGTH, WIDTH)) * 0.5


def _linen(**options) -> PerformerAttention:
    return PerformerAttention(
        num_heads=HEADS, num_features=16, coupling="orthogonal", redraw_interval=100, **options
    )


def _nnx() -> rnnx.PerformerAttention:
    return rnnx.PerformerAttention(
        HEADS,
        WIDTH,
        num_features=16,
        coupling="orthogonal",
        redraw_interval=100,
        decode=True,
        rngs=nnx.Rngs(0, projection=3),
    )


def _linen_steps(step, cache, x) -> jax.Array:
    """The outputs of ``step(cache, token) -> (out, {"cache": ...})`` jitted, token by token."""
    outputs = []
    for t in range(LENGTH):
        out, state = jax.jit(step)(cache, x[:, t : t + 1])
        cache = state["cache"]
        outputs.append(out)
    return jnp.concatenate(outputs, axis=1)


def test_linen_decoding_draws_only_when_the_keys_change():
    x = _inputs()
    module = _linen(decode=True)
    variables = module.init(jax.random.key(1), x)
    params, cache = {"params": variables["params"]}, variables["cache"]
    rngs = {"projection": jax.random.key(3)}

    def step(cache, token):
        return module.apply(
            {**params, "cache": cache}, token, rngs=rngs, projection_step=STEP, mutable=["cache"]
        )

    outside, inside = traced_primitives(step, cache, x[:, :1])
    assert not DRAWS & outside and inside >= DRAWS
    causal = _linen(causal=True)
    expected = causal.apply(params, x, rngs=rngs, projection_step=STEP)
    np.testing.assert_allclose(_linen_steps(step, cache, x), expected, rtol=1e-5, atol=1e-5)
    at_zero = causal.apply(params, x, rngs=rngs, projection_step=0)
    assert not np.allclose(at_zero, expected, atol=1e-3)  # the redraw mattered


def test_nnx_decoding_draws_only_when_the_keys_change():
    x = _inputs()
    layer = _nnx()
    expected = layer(x, is_causal=True, decode=False, projection_step=STEP)
    layer.init_cache(x.shape)  # drawn at step 0: the first token redraws

    @nnx.jit
    def step(layer, token):
        return layer(token, projection_step=STEP)

    graph, state = nnx.split(layer)
    outside, inside = traced_primitives(
        lambda state, token: nnx.merge(graph, state)(token, projection_step=STEP), state, x[:, :1]
    )
    assert not DRAWS & outside and inside >= DRAWS
    outputs = [step(layer, x[:, t : t + 1]) for t in range(LENGTH)]
    np.testing.assert_allclose(jnp.concatenate(outputs, axis=1), expected, rtol=1e-5, atol=1e-5)
    at_zero = layer(x, is_causal=True, decode=False, projection_step=0)
    assert not np.allclose(at_zero, expected, atol=1e-3)  # the redraw mattered
    kept = _nnx()  # the cache now keeps STEP's draw with its keys: later tokens draw nothing
    kept.init_cache(x.shape, projection_step=STEP)
    np.testing.assert_array_equal(layer.decode_draw_keys[...], kept.decode_draw_keys[...])


def test_linen_step_without_the_stream_reads_the_cached_projection():
    x = _inputs()
    module = _linen(decode=True)
    rngs = {"projection": jax.random.key(3)}
    variables = module.init({"params": jax.random.key(1), **rngs}, x, projection_step=STEP)
    params, cache = {"params": variables["params"]}, variables["cache"]

    def step(cache, token):
        return module.apply({**params, "cache": cache}, token, mutable=["cache"])

    outside, inside = traced_primitives(step, cache, x[:, :1])
    assert not KEYS & (outside | inside)
    expected = _linen(causal=True).apply(params, x, rngs=rngs, projection_step=STEP)
    np.testing.assert_allclose(_linen_steps(step, cache, x), expected, rtol=1e-5, atol=1e-5)


def test_nnx_step_without_a_projection_step_reads_the_cached_projection():
    x = _inputs()
    layer = _nnx()
    expected = layer(x, is_causal=True, decode=False, projection_step=STEP)
    layer.init_cache(x.shape, projection_step=STEP)
    graph, state = nnx.split(layer)
    outside, inside = traced_primitives(
        lambda state, token: nnx.merge(graph, state)(token), state, x[:, :1]
    )
    assert not KEYS & (outside | inside)
    step = nnx.jit(lambda layer, token: layer(token))
    outputs = [step(layer, x[:, t : t + 1]) for t in range(LENGTH)]
    np.testing.assert_allclose(jnp.concatenate(outputs, axis=1), expected, rtol=1e-5, atol=1e-5)


def test_each_head_draws_its_own_feature_map_parameters():
    """The angular hybrid's random sign projection, like the projection, is one independent
    draw per head (one key for every head gave every head the same signs)."""
    projection, feature_map = draw_heads(
        jax.random.key(1),
        jax.random.key(2),
        head_dim=4,
        num_heads=3,
        num_features=8,
        coupling="gaussian",
        feature_map="angular_hybrid",
    )
    (signs,) = jax.tree.leaves(feature_map)
    matrices = jax.vmap(lambda p: p.matrix())(projection.stacked)
    for per_head in (signs, matrices):
        assert per_head.shape[0] == 3
        for i, j in ((0, 1), (0, 2), (1, 2)):
            assert not np.allclose(per_head[i], per_head[j])
