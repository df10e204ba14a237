"""The arguments of ``PerformerAttention`` (``rfjax.nn._attention_arguments``): it takes every
argument of the installed Flax's multi-head attention (linen and NNX) with its position, default
and meaning (issue 33, point 2).

The signature tests walk ``inspect.signature`` of Flax's classes: an argument that a Flax
upgrade adds fails them until PerformerAttention takes it. The other tests check the meaning:
the exact kind against Flax's own module with the same parameters, the Performer against
itself where FAVOR applies an argument (normalised q/k, grouped key/value heads, precision,
rotary positions), and a ``ValueError`` naming the argument where it cannot apply.
"""

from __future__ import annotations

import functools
import inspect

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rfjax.nn import PerformerAttention
from rfjax.nn import nnx as rnnx

BATCH, LENGTH, WIDTH, HEADS = 2, 6, 16, 4
# Arguments of Flax's classes that are not attention arguments (linen's module plumbing).
PLUMBING = ("self", "parent", "name")


def _same_default(ours: object, flax: object) -> bool:
    if ours is flax:
        return True
    try:
        return bool(ours == flax)
    except Exception:  # arrays and other values without a truth value
        return False


def _check_signature(ours, flax) -> None:
    """Every argument of ``flax`` is one of ``ours``, of the same kind and default, and Flax's
    positional arguments come first in ``ours``, in Flax's order."""
    ours_parameters = inspect.signature(ours).parameters
    flax_parameters = {
        name: p for name, p in inspect.signature(flax).parameters.items() if name not in PLUMBING
    }
    missing = sorted(set(flax_parameters) - set(ours_parameters))
    assert not missing, f"{ours.__qualname__} lacks Flax's {missing}"
    for name, flax_parameter in flax_parameters.items():
        parameter = ours_parameters[name]
        assert parameter.kind == flax_parameter.kind, name
        assert _same_default(parameter.default, flax_parameter.default), (
            f"{name}: default {parameter.default!r}, Flax's {flax_parameter.default!r}"
        )
    positional = [
        name
        for name, p in flax_parameters.items()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    ours_positional = [name for name in ours_parameters if name not in PLUMBING]
    assert ours_positional[: len(positional)] == positional


@pytest.mark.parametrize(
    "flax_class", [nn.MultiHeadDotProductAttention, nn.MultiHeadAttention], ids=lambda c: c.__name__
)
@pytest.mark.parametrize("method", ["__init__", "__call__"])
def test_linen_takes_every_argument_of_flax_attention(flax_class, method):
    ours = PerformerAttention if method == "__init__" else PerformerAttention.__call__
    _check_signature(ours, flax_class if method == "__init__" else getattr(flax_class, method))


@pytest.mark.parametrize("method", ["__init__", "__call__", "init_cache", "set_view"])
def test_nnx_takes_every_argument_of_flax_attention(method):
    ours, flax = rnnx.PerformerAttention, nnx.MultiHeadAttention
    _check_signature(getattr(ours, method), getattr(flax, method))


def _inputs(seed: int = 0) -> jax.Array:
    return 0.5 * jax.random.normal(jax.random.key(seed), (BATCH, LENGTH, WIDTH))


# ----------------------------------------------------------------------------------- linen


def _linen_pair(**kwargs):
    """Flax's module and ours (exact) with the same arguments, and Flax's parameters."""
    flax_module = nn.MultiHeadDotProductAttention(num_heads=HEADS, **kwargs)
    ours = PerformerAttention(num_heads=HEADS, attention_kind="exact", **kwargs)
    return flax_module, ours, flax_module.init(jax.random.key(1), _inputs())


@pytest.mark.parametrize(
    "kwargs",
    [
        {"normalize_qk": True},
        {"precision": "highest"},
        {"out_kernel_init": nn.initializers.normal(3.0), "out_bias_init": nn.initializers.ones},
        {"force_fp32_for_softmax": True, "dtype": jnp.bfloat16},
        {"qkv_features": 8, "out_features": 12},
    ],
    ids=["normalize_qk", "precision", "out_inits", "force_fp32", "features"],
)
def test_linen_exact_kind_is_flax_attention_with_flax_arguments(kwargs):
    flax_module, ours, params = _linen_pair(**kwargs)
    x = _inputs()
    ours_params = ours.init(jax.random.key(1), x)
    assert jax.tree.structure(ours_params) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(ours_params), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)  # the same initialisers, the same draws
    np.testing.assert_allclose(
        ours.apply(params, x).astype(jnp.float32),
        flax_module.apply(params, x).astype(jnp.float32),
        rtol=1e-5,
        atol=1e-6,
    )


def test_linen_exact_kind_applies_broadcast_dropout_as_flax():
    kwargs = {"dropout_rate": 0.5, "broadcast_dropout": False, "deterministic": False}
    flax_module, ours, params = _linen_pair(**kwargs)
    rngs = {"dropout": jax.random.key(5)}
    x = _inputs()
    np.testing.assert_allclose(
        ours.apply(params, x, rngs=rngs), flax_module.apply(params, x, rngs=rngs), rtol=1e-6
    )


def test_linen_performer_normalises_queries_and_keys_as_flax():
    x = _inputs()
    flax_params = nn.MultiHeadDotProductAttention(num_heads=HEADS, normalize_qk=True).init(
        jax.random.key(1), x
    )
    layer = PerformerAttention(num_heads=HEADS, num_features=8, normalize_qk=True)
    assert jax.tree.structure(layer.init(jax.random.key(1), x)) == jax.tree.structure(flax_params)
    _, state = layer.apply(
        flax_params, x, rngs={"projection": jax.random.key(2)}, mutable=["intermediates"]
    )
    (query,) = state["intermediates"]["query_heads"]
    # LayerNorm over each head (scale 1 at initialisation): zero mean, unit variance.
    np.testing.assert_allclose(jnp.mean(query, axis=-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(jnp.var(query, axis=-1), 1.0, rtol=1e-3)


def _dot_precisions(fn, *args) -> list[str]:
    """The precision of every dot_general in ``fn``'s jaxpr, nested ones included."""
    found = []

    def walk(jaxpr):
        for equation in jaxpr.eqns:
            if equation.primitive.name == "dot_general":
                found.append(str(equation.params["precision"]))
            for param in equation.params.values():
                for sub in param if isinstance(param, (tuple, list)) else (param,):
                    if isinstance(sub, jax.extend.core.ClosedJaxpr):
                        walk(sub.jaxpr)
                    elif isinstance(sub, jax.extend.core.Jaxpr):
                        walk(sub)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


def test_linen_performer_runs_every_product_at_the_given_precision():
    x = _inputs()
    rngs = {"projection": jax.random.key(2)}
    layer = PerformerAttention(num_heads=HEADS, num_features=8, precision="highest")
    params = layer.init(jax.random.key(1), x)
    precisions = _dot_precisions(lambda v: layer.apply(params, v, rngs=rngs), x)
    assert len(precisions) >= 6  # q, k, v, out, the features and FAVOR's contractions
    assert all("HIGHEST" in p for p in precisions), precisions
    default = PerformerAttention(num_heads=HEADS, num_features=8)
    assert not any(
        "HIGHEST" in p for p in _dot_precisions(lambda v: default.apply(params, v, rngs=rngs), x)
    )
    with pytest.raises(ValueError, match="precision as a pair"):
        PerformerAttention(num_heads=HEADS, precision=("highest", "default")).init(
            jax.random.key(1), x
        )


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("attention_fn", lambda q, k, v, **kwargs: v),
        ("qk_attn_weights_einsum_cls", lambda: jnp.einsum),
        ("attn_weights_value_einsum_cls", lambda: jnp.einsum),
    ],
)
def test_linen_performer_names_the_flax_argument_it_cannot_apply(argument, value):
    layer = PerformerAttention(num_heads=HEADS, **{argument: value})
    with pytest.raises(ValueError, match=f"^{argument}"):
        layer.init(jax.random.key(1), _inputs())
    # The exact kind takes it, as Flax does (which takes the einsum overrides in pairs).
    both = {"qk_attn_weights_einsum_cls": value, "attn_weights_value_einsum_cls": value}
    kwargs = both if "einsum" in argument else {argument: value}
    PerformerAttention(num_heads=HEADS, attention_kind="exact", **kwargs).init(
        jax.random.key(1), _inputs()
    )


# ------------------------------------------------------------------------------------- NNX


def test_nnx_positional_order_is_flax_order():
    layer = rnnx.PerformerAttention(4, 32, 32, 32, 2, rngs=nnx.Rngs(0))
    flax_layer = nnx.MultiHeadAttention(4, 32, 32, 32, 2, rngs=nnx.Rngs(0))
    assert layer.num_kv_heads == flax_layer.num_kv_heads == 2
    assert layer.key.kernel.shape == flax_layer.key.kernel.shape == (32, 2, 8)
    x = jax.random.normal(jax.random.key(0), (2, 5, 32))
    assert layer(x).shape == (2, 5, 32)
    with pytest.raises(ValueError, match=r"num_heads \(4\) must be divisible by num_kv_heads"):
        rnnx.PerformerAttention(4, 32, num_kv_heads=3, rngs=nnx.Rngs(0))


def _nnx_pair(**kwargs):
    flax_layer = nnx.MultiHeadAttention(HEADS, WIDTH, decode=False, rngs=nnx.Rngs(3), **kwargs)
    ours = rnnx.PerformerAttention(HEADS, WIDTH, attention_kind="exact", rngs=nnx.Rngs(3), **kwargs)
    return flax_layer, ours


@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_kv_heads": 2},
        {"normalize_qk": True},
        {"precision": "highest", "out_kernel_init": nnx.initializers.normal(2.0)},
        {"attention_fn": functools.partial(nnx.dot_product_attention_with_rope, rope=nnx.RoPE())},
    ],
    ids=["num_kv_heads", "normalize_qk", "precision_inits", "rope"],
)
def test_nnx_exact_kind_is_flax_attention_with_flax_arguments(kwargs):
    flax_layer, ours = _nnx_pair(**kwargs)
    flax_params, ours_params = nnx.state(flax_layer, nnx.Param), nnx.state(ours, nnx.Param)
    assert jax.tree.structure(ours_params) == jax.tree.structure(flax_params)
    for a, b in zip(jax.tree.leaves(ours_params), jax.tree.leaves(flax_params), strict=True):
        np.testing.assert_array_equal(a, b)
    x = _inputs()
    np.testing.assert_allclose(ours(x, is_causal=True), flax_layer(x, is_causal=True), rtol=1e-5)


def _flat_params(layer: nnx.Module) -> dict[tuple, nnx.Variable]:
    return dict(nnx.to_flat_state(nnx.state(layer, nnx.Param)))


def test_nnx_projections_are_built_and_applied_as_flax_builds_them():
    """``qkv_features``, ``out_features``, ``in_kv_features``, ``out_bias_init``, the
    metadata of each projection and LayerNorm: the same parameters (values and metadata) as
    Flax's; with every parameter set at random, the same outputs on cross inputs."""
    tags = ("kernel", "out_kernel", "bias", "out_bias", "query_ln_scale", "key_ln_scale")
    kwargs = {
        "qkv_features": 8,
        "out_features": 12,
        "in_kv_features": 8,
        "normalize_qk": True,
        "out_bias_init": nnx.initializers.ones,
        **{f"{tag}_metadata": {"tag": tag} for tag in tags},
    }
    flax_layer, ours = _nnx_pair(**kwargs)
    flax_params, ours_params = _flat_params(flax_layer), _flat_params(ours)
    assert list(ours_params) == list(flax_params)
    for path, variable in ours_params.items():
        np.testing.assert_array_equal(variable[...], flax_params[path][...], err_msg=str(path))
        assert variable.get_metadata() == flax_params[path].get_metadata(), path
    keys = jax.random.split(jax.random.key(7), len(ours_params))
    for key, (path, variable) in zip(keys, ours_params.items(), strict=True):
        value = jax.random.normal(key, variable.shape)
        variable[...] = flax_params[path][...] = value
    x, k, v = _inputs(), _inputs(1)[..., :8], _inputs(2)[..., :8]
    out = ours(x, k, v, is_causal=True)
    assert out.shape == (BATCH, LENGTH, 12)
    np.testing.assert_allclose(out, flax_layer(x, k, v, is_causal=True), rtol=1e-5, atol=1e-5)


def test_nnx_exact_kind_applies_dropout_as_flax():
    """Dropout by the call's ``deterministic`` over the layer's, from the call's ``rngs`` over
    the layer's kept stream, with ``broadcast_dropout``: Flax's outputs; the kept stream (no
    call ``rngs``) drops too; without one (``keep_rngs=False``) the call raises naming
    ``rngs``, and without ``deterministic`` (call or layer) naming ``deterministic``."""
    kwargs = {"dropout_rate": 0.5, "broadcast_dropout": False, "deterministic": True}
    flax_layer, ours = _nnx_pair(**kwargs)
    x = _inputs()
    undropped = ours(x)
    np.testing.assert_array_equal(undropped, flax_layer(x))
    dropped = ours(x, deterministic=False, rngs=nnx.Rngs(dropout=5))
    np.testing.assert_allclose(
        dropped, flax_layer(x, deterministic=False, rngs=nnx.Rngs(dropout=5)), rtol=1e-6
    )
    assert not np.allclose(dropped, undropped)
    kept = ours(x, deterministic=False)  # the kept stream: another draw than Flax's (the
    assert not np.allclose(kept, undropped)  # projection key is drawn before it is forked)
    _, ours_unkept = _nnx_pair(keep_rngs=False, **kwargs)
    with pytest.raises(ValueError, match=r"^rngs must be given"):
        ours_unkept(x, deterministic=False)
    _, undecided = _nnx_pair(dropout_rate=0.5)  # deterministic neither made nor called
    with pytest.raises(ValueError, match=r"^deterministic must be given"):
        undecided(x)


def test_nnx_exact_kind_passes_attention_fn_flax_arguments():
    """``attention_fn`` gets the arguments Flax passes it (``dtype``, ``precision``, dropout
    ones, ``is_causal``, the ``module`` to sow into, no mask, ``input_positions``), values as
    Flax's."""
    calls: list[dict] = []

    def spy(query, key, value, input_positions, **kwargs):
        calls.append({n: a for n, a in kwargs.items() if n != "module"})
        calls[-1]["module"] = kwargs["module"] is not None
        calls[-1]["input_positions"] = tuple(input_positions.tolist())
        return nnx.dot_product_attention(query, key, value, **kwargs)

    kwargs = {"attention_fn": spy, "dtype": jnp.bfloat16, "precision": "highest"}
    flax_layer, ours = _nnx_pair(**kwargs)
    positions = jnp.arange(LENGTH) + 3
    for layer in (flax_layer, ours):
        capture = nnx.capture(layer, nnx.Intermediate)
        capture(_inputs(), is_causal=True, sow_weights=True, input_positions=positions)
    assert calls[1] == calls[0]


def test_nnx_performer_runs_every_product_at_the_given_precision():
    layer = rnnx.PerformerAttention(
        HEADS, WIDTH, num_features=8, precision="highest", rngs=nnx.Rngs(0)
    )
    precisions = _dot_precisions(lambda v: layer(v), _inputs())
    assert len(precisions) >= 6  # q, k, v, out, the features and FAVOR's contractions
    assert all("HIGHEST" in p for p in precisions), precisions


def test_nnx_performer_grouped_heads_are_the_repeated_heads():
    x = _inputs()
    layer = functools.partial(rnnx.PerformerAttention, HEADS, WIDTH, num_features=8)
    grouped, full = layer(num_kv_heads=2, rngs=nnx.Rngs(3)), layer(rngs=nnx.Rngs(3))
    nnx.update(full, nnx.state(grouped, rnnx.ProjectionKey))
    full.query, full.out = grouped.query, grouped.out
    for name in ("key", "value"):  # (D, N_kv, H) -> (D, N, H): each kv head for its 2 q heads
        source, target = getattr(grouped, name), getattr(full, name)
        target.kernel[...] = jnp.repeat(source.kernel[...], 2, axis=1)
        target.bias[...] = jnp.repeat(source.bias[...], 2, axis=0)
    np.testing.assert_allclose(grouped(x, is_causal=True), full(x, is_causal=True), rtol=1e-5)


def test_nnx_performer_decodes_grouped_heads_with_rotary_positions():
    """Decoding one token at a time (its position as input_positions) equals causal attention
    over the sequence, with rotated queries and keys and grouped key/value heads."""
    rope = nnx.RoPE()  # positions from input_positions (default 0..T-1)
    kwargs = {
        "num_kv_heads": 2,
        "num_features": 8,
        "attention_fn": functools.partial(nnx.dot_product_attention_with_rope, rope=rope),
    }
    layer = rnnx.PerformerAttention(HEADS, WIDTH, rngs=nnx.Rngs(3), **kwargs)
    x = _inputs()
    expected = layer(x, is_causal=True)
    layer.init_cache(x.shape)
    steps = [
        layer(x[:, t : t + 1], decode=True, input_positions=jnp.array([float(t)]))
        for t in range(LENGTH)
    ]
    np.testing.assert_allclose(jnp.concatenate(steps, axis=1), expected, rtol=1e-4, atol=1e-5)
    # Positions matter: the rotation at other positions gives another result.
    shifted = layer(x, is_causal=True, input_positions=jnp.arange(LENGTH, dtype=jnp.float32) + 3)
    assert not np.allclose(shifted, expected, atol=1e-3)


def test_nnx_performer_names_the_flax_argument_it_cannot_apply():
    with pytest.raises(ValueError, match=r"^attention_fn"):
        rnnx.PerformerAttention(
            HEADS, WIDTH, attention_fn=lambda q, k, v, **kwargs: v, rngs=nnx.Rngs(0)
        )
    layer = rnnx.PerformerAttention(HEADS, WIDTH, num_features=8, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"^input_positions"):
        layer(_inputs(), input_positions=jnp.arange(LENGTH, dtype=jnp.float32))
