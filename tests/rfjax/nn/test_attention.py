"""rfjax.nn: PerformerAttention (drop-in for Flax multi-head attention) and PerformerViT."""

import functools
import inspect
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.nn import LSTMLanguageModel, PerformerAttention, PerformerViT

BATCH, LENGTH, WIDTH, HEADS = 2, 12, 16, 2  # head dim 8


def _inputs(seed=0, scale=0.5):
    q, kv = jax.random.normal(jax.random.key(seed), (2, BATCH, LENGTH, WIDTH)) * scale
    return q, kv


# Modules' init and apply compiled as one program each (eagerly, each primitive compiles apart).
@functools.partial(jax.jit, static_argnums=0)
def _init(module, *args):
    return module.init(*args)


@functools.partial(jax.jit, static_argnums=0)
def _apply(module, variables, *args, **kwargs):
    return module.apply(variables, *args, **kwargs)


def _mha_params():
    """Parameters of Flax's own multi-head attention: PerformerAttention must accept them."""
    q, kv = _inputs()
    return _init(nn.MultiHeadDotProductAttention(num_heads=HEADS), jax.random.key(1), q, kv)


def _projection(module, variables, step, rng):
    _, state = module.apply(
        variables,
        _inputs()[0],
        projection_step=step,
        rngs={"projection": rng},
        mutable=["intermediates"],
    )
    return np.asarray(state["intermediates"]["projection"][0])


def test_call_signature_matches_flax_multi_head_attention():
    ours = inspect.signature(PerformerAttention.__call__).parameters
    flax_params = inspect.signature(nn.MultiHeadDotProductAttention.__call__).parameters
    for name in ("inputs_q", "inputs_k", "inputs_v", "mask", "deterministic", "dropout_rng"):
        assert ours[name].kind == flax_params[name].kind, name
    fields = PerformerAttention.__dataclass_fields__
    for name in ("num_heads", "qkv_features", "out_features", "dropout_rate", "dtype"):
        assert name in fields, name
    assert "param_dtype" in fields


def test_exact_kind_is_flax_attention_with_the_same_parameters():
    q, kv = _inputs()
    params = _mha_params()
    mask = nn.make_attention_mask(jnp.ones((BATCH, LENGTH)), jnp.arange(LENGTH) < 9)
    reference = _apply(nn.MultiHeadDotProductAttention(num_heads=HEADS), params, q, kv, mask=mask)
    exact = PerformerAttention(num_heads=HEADS, attention_kind="exact")
    np.testing.assert_allclose(
        _apply(exact, params, q, kv, mask=mask), reference, rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("kind", ["exact", "performer"])
def test_shapes(kind):
    # Shapes only, so traced abstractly (jax.eval_shape): nothing is compiled or run.
    q, kv = _inputs()
    module = PerformerAttention(
        num_heads=4,
        qkv_features=32,
        out_features=5,
        attention_kind=kind,
        coupling="gaussian",
        num_features=16,
    )
    variables = jax.eval_shape(module.init, jax.random.key(0), q, kv)
    assert variables["params"]["query"]["kernel"].shape == (WIDTH, 4, 8)
    rngs = {"projection": jax.random.key(2)}

    def shape(model, variables, *inputs):
        return jax.eval_shape(lambda v, *x: model.apply(v, *x, rngs=rngs), variables, *inputs).shape

    assert shape(module, variables, q, kv) == (BATCH, LENGTH, 5)
    assert shape(module, variables, q[0], kv[0]) == (LENGTH, 5)  # unbatched
    vit = PerformerViT(num_classes=7, attention_kind=kind, coupling="gaussian", num_features=8)
    images = jnp.zeros((3, 28, 28))
    for pooling in ("cls", "mean"):
        model = vit.clone(pooling=pooling)
        variables = jax.eval_shape(model.init, jax.random.key(0), images)
        assert shape(model, variables, images) == (3, 7)


def test_performer_approaches_exact_attention_as_features_grow():
    """RMS error falls like 1/sqrt(m): m = 64 -> 4096 should shrink it about 8 times."""
    q, kv = _inputs()
    params = _mha_params()
    exact = PerformerAttention(num_heads=HEADS, attention_kind="exact").apply(params, q, kv)
    errors = {}
    for m in (64, 4096):
        module = PerformerAttention(num_heads=HEADS, num_features=m, coupling="orthogonal")
        outputs = [
            module.apply(params, q, kv, rngs={"projection": jax.random.key(seed)})
            for seed in range(4)
        ]
        errors[m] = float(jnp.sqrt(jnp.mean((jnp.stack(outputs) - exact) ** 2)))
    scale = float(jnp.std(exact))
    assert errors[4096] < 0.05 * scale, (errors, scale)
    assert errors[64] / errors[4096] > 4.0, errors


def test_projection_redraws_every_interval_deterministically():
    module = PerformerAttention(
        num_heads=HEADS, num_features=8, coupling="gaussian", redraw_interval=5
    )
    variables = _mha_params()
    base = jax.random.key(7)
    at = {step: _projection(module, variables, step, base) for step in (0, 4, 5, 9, 10)}
    assert at[0].shape == (HEADS, 8, WIDTH // HEADS)
    np.testing.assert_array_equal(at[0], at[4])
    np.testing.assert_array_equal(at[5], at[9])
    assert not np.allclose(at[0], at[5]) and not np.allclose(at[5], at[10])
    np.testing.assert_array_equal(at[5], _projection(module, variables, 5, base))  # repeatable
    np.testing.assert_array_equal(  # a traced step gives the same draw
        at[5], _projection(module, variables, jnp.asarray(7, jnp.int32), base)
    )
    assert not np.allclose(at[5], _projection(module, variables, 5, jax.random.key(8)))
    assert not np.allclose(at[0][0], at[0][1])  # heads draw independently


@pytest.mark.parametrize("mask_rank", [2, 4])
def test_key_padding_mask_equals_dropping_the_padded_keys(mask_rank):
    q, kv = _inputs()
    valid = 7
    mask = jnp.broadcast_to(jnp.arange(LENGTH) < valid, (BATCH, LENGTH))
    if mask_rank == 4:
        mask = mask[:, None, None, :]
    garbage = kv.at[:, valid:].set(1e4)  # padded positions must not matter
    params = _mha_params()
    rngs = {"projection": jax.random.key(3)}
    module = PerformerAttention(num_heads=HEADS, num_features=32, coupling="gaussian")
    masked = module.apply(params, q, garbage, mask=mask, rngs=rngs)
    truncated = module.apply(params, q, kv[:, :valid], rngs=rngs)
    np.testing.assert_allclose(masked, truncated, rtol=1e-5, atol=1e-6)


def test_causal_performer_ignores_the_future():
    q, _ = _inputs()
    params = _mha_params()
    module = PerformerAttention(num_heads=HEADS, num_features=32, coupling="gaussian", causal=True)
    rngs = {"projection": jax.random.key(3)}
    out = module.apply(params, q, rngs=rngs)
    changed = module.apply(params, q.at[:, 8:].add(3.0), rngs=rngs)
    np.testing.assert_array_equal(out[:, :8], changed[:, :8])
    assert not np.allclose(out[:, 8:], changed[:, 8:])


def test_query_key_norm_is_cosine_attention_with_a_learned_temperature():
    """softmax(tau q^.k^) v per head, tau = exp(log_temperature), initialised as asked."""
    q, kv = _inputs(scale=2.0)
    module = PerformerAttention(
        num_heads=HEADS, attention_kind="exact", query_key_norm=True, initial_temperature=2.5
    )
    params = module.init(jax.random.key(1), q, kv)["params"]
    np.testing.assert_allclose(params["log_temperature"], np.full(HEADS, math.log(2.5)))
    params["log_temperature"] = jnp.log(jnp.array([0.5, 4.0]))  # a different tau per head

    def dense(name, x):
        return jnp.einsum("btd,dnh->btnh", x, params[name]["kernel"]) + params[name]["bias"]

    def unit(x):
        return x / jnp.linalg.norm(x, axis=-1, keepdims=True)

    scores = jnp.einsum("btnh,bsnh->bnts", unit(dense("query", q)), unit(dense("key", kv)))
    weights = jax.nn.softmax(jnp.array([0.5, 4.0])[:, None, None] * scores, axis=-1)
    heads = jnp.einsum("bnts,bsnh->btnh", weights, dense("value", kv))
    expected = jnp.einsum("btnh,nho->bto", heads, params["out"]["kernel"]) + params["out"]["bias"]
    got = module.apply({"params": params}, q, kv)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_errors_name_the_problem():
    q, kv = _inputs()
    params = _mha_params()
    module = PerformerAttention(num_heads=HEADS, num_features=8, coupling="gaussian")
    with pytest.raises(ValueError, match="RNG stream 'projection'"):
        module.apply(params, q, kv)
    with pytest.raises(ValueError, match="key padding mask and causality only"):
        mask = jax.random.bernoulli(jax.random.key(0), 0.5, (BATCH, 1, LENGTH, LENGTH))
        module.apply(params, q, kv, mask=mask, rngs={"projection": jax.random.key(0)})
    with pytest.raises(ValueError, match="coupling must be one of"):
        module.clone(coupling="sobol").init(jax.random.key(0), q)
    with pytest.raises(ValueError, match="dropout_rate must be 0"):
        module.clone(dropout_rate=0.1).init(jax.random.key(0), q)
    with pytest.raises(ValueError, match="attention_kind must be one of"):
        module.clone(attention_kind="linear").init(jax.random.key(0), q)
    with pytest.raises(ValueError, match="initial_temperature must be > 0"):
        module.clone(query_key_norm=True, initial_temperature=0.0).init(jax.random.key(0), q)
    # inf passed "> 0" and gave NaN outputs (log temperature inf); a string a comparison error
    with pytest.raises(ValueError, match="initial_temperature must be finite, got inf"):
        module.clone(query_key_norm=True, initial_temperature=np.inf).init(jax.random.key(0), q)
    with pytest.raises(TypeError, match="initial_temperature must be a real number"):
        module.clone(query_key_norm=True, initial_temperature="2").init(jax.random.key(0), q)
    # "yes" raised JAX's "Pred must be a scalar" (the exact kind took it as True), and 1
    # compiled both the causal and the bidirectional forms.
    for causal in ("yes", 1):
        for kind in ("performer", "exact"):
            with pytest.raises(TypeError, match="causal must be a bool"):
                module.clone(causal=causal, attention_kind=kind).init(jax.random.key(0), q)
    with pytest.raises(ValueError, match="pooling"):
        PerformerViT(num_classes=2, pooling="max").init(jax.random.key(0), jnp.ones((1, 28, 28)))


def test_sizes_that_are_not_positive_raise_naming_the_argument():
    x = jnp.ones((1, 8, 8))
    with pytest.raises(ValueError, match="num_heads must be an integer >= 1, got 0"):
        PerformerAttention(num_heads=0).init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="num_features must be an integer >= 1, got 0"):
        PerformerAttention(num_heads=2, num_features=0).init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="patch_size must be an integer >= 1, got 0"):
        PerformerViT(num_classes=2, patch_size=0).init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="num_classes must be an integer >= 1, got 0"):
        PerformerViT(num_classes=0).init(jax.random.key(0), x)
    with pytest.raises(ValueError, match="vocab_size must be an integer >= 1, got 0"):
        LSTMLanguageModel(vocab_size=0).init(jax.random.key(0), jnp.ones((1, 3), int), train=False)


@pytest.mark.parametrize("kind", ["exact", "performer"])
def test_empty_batches_give_empty_results(kind):
    module = PerformerAttention(num_heads=HEADS, num_features=8, attention_kind=kind)
    params = _mha_params()
    rngs = {"projection": jax.random.key(1)}
    for shape in ((0, LENGTH, WIDTH), (BATCH, 0, WIDTH)):
        assert _apply(module, params, jnp.ones(shape), rngs=rngs).shape == shape
    vit = PerformerViT(num_classes=3, num_features=8, attention_kind=kind)
    variables = _init(vit, jax.random.key(0), jnp.ones((1, 8, 8)))
    assert _apply(vit, variables, jnp.ones((0, 8, 8)), rngs=rngs).shape == (0, 3)


@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_the_layer_runs_the_implementation_it_is_given(causal):
    """``PerformerAttention(implementation=...)`` reaches ``favor_attention``: the fused kernels
    (in interpret mode here) where asked for, the XLA form otherwise (programs traced only)."""
    x = jnp.ones((BATCH, LENGTH, WIDTH))
    rngs = {"projection": jax.random.key(8)}

    def fused(implementation: str) -> bool:
        layer = PerformerAttention(
            num_heads=HEADS, num_features=16, causal=causal, implementation=implementation
        )
        params = jax.eval_shape(layer.init, {"params": jax.random.key(9), **rngs}, x, x)
        program = jax.make_jaxpr(lambda p: layer.apply(p, x, x, rngs=rngs))(params)
        return "pallas_call" in str(program)

    assert fused("pallas_triton_interpret") and not fused("xla")
