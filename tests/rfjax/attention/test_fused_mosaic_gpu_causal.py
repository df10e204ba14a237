"""Causal FAVOR's forward pass in Mosaic GPU's idiom (``_fused_mosaic_gpu_causal``;
``implementation="pallas_mosaic_gpu"`` with ``causal=True``) on CPU: the sums in Mosaic GPU's
interpret mode against float64 where the heads are tame, the bound on the row shifts that
makes them so checked against the exact row maxima (with masks that start chunks with padding
and leave holes), the fallback to the generic kernels at norm 120 (and what goes wrong without
it), values and gradients against the XLA form, and the lowering for an abstract H100 (the
backward's kernels alone: ``test_fused_mosaic_gpu_causal_grads``).

Tolerances: bfloat16 products as ``test_fused_mosaic_gpu`` takes them (5 u max|v| plus the
output's rounding, u = 2^-8; the denominators' factors enter the products in bfloat16, 2u
each), beside the float32 rounding of the log-features (``test_large_norms.exact``'s)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import attention, features
from rfjax.attention import _favor, _fused, _fused_mosaic_gpu
from rfjax.attention import _fused_mosaic_gpu_causal as causal_kernels
from tests.rfjax.attention.test_fused import _assert_gpu_close, _on_the_gpu, operands
from tests.rfjax.attention.test_fused_mosaic_gpu import (
    _sm90,
    folded,
    lowered_for_h100,
    pass_arguments,
)
from tests.rfjax.attention.test_large_norms import exact, inputs
from tests.support.interpret_mode import INTERPRET_MODE
from tests.support.tools import load_tool

EPS32 = float(np.finfo(np.float32).eps)
U = 2.0**-8  # bfloat16's unit roundoff
TOOL = load_tool("triton_kernels")
HEAD_DIM, FEATURES, LENGTH = 64, 128, 192  # three chunks
NORM_WEIGHT = folded(jnp.zeros((1, HEAD_DIM)))[1]  # g s^2, s = H^-1/4


def _rows(seed: int, scale: float, valid: np.ndarray):
    """Two heads' query and key (bfloat16 x with x' = x H^-1/4 ~ ``scale`` times standard
    normal), values (bfloat16, zero where not valid), valid, and W (orthogonal rows of norm
    ~sqrt(H)) with the data normaliser folded in (``folded``: the map takes x as l(x'))."""
    keys = jax.random.split(jax.random.key(seed), 4)
    rows = (scale * HEAD_DIM**0.25 * jax.random.normal(x, (2, LENGTH, HEAD_DIM)) for x in keys[:2])
    q, k = (x.astype(jnp.bfloat16) for x in rows)
    v = jax.random.normal(keys[2], (2, LENGTH, HEAD_DIM)).astype(jnp.bfloat16)
    valid = jnp.asarray(valid)
    weights = folded(attention.draw_projection(keys[3], HEAD_DIM, FEATURES).matrix())[0]
    return q, k, jnp.where(valid[..., None], v, 0), valid, weights


def _float64_sums(q, k, v, valid, weights):
    """Per head: (causal numerators, denominators, row maxima M_t), each relative to M_t."""
    q64, k64, w64 = (np.asarray(x, np.float64) for x in (q, k, weights))
    la = q64 @ w64.T + NORM_WEIGHT * np.sum(q64 * q64, -1, keepdims=True)
    lb = k64 @ w64.T + NORM_WEIGHT * np.sum(k64 * k64, -1, keepdims=True)
    pairs = la[:, :, None, :] + lb[:, None, :, :]  # (N, t, j, m)
    counted = np.tril(np.ones((LENGTH, LENGTH), bool))[None] & np.asarray(valid)[:, None, :]
    pairs = np.where(counted[..., None], pairs, -np.inf)
    top = pairs.max(axis=(2, 3))
    scores = np.exp(pairs - top[..., None, None]).sum(-1)
    return scores @ np.asarray(v, np.float64), scores.sum(-1), top


def _masks() -> np.ndarray:
    """Head 0: every key but a hole; head 1: padding first (its first chunk starts with 20
    invalid keys, its second with valid ones after a hole at its start)."""
    valid = np.ones((2, LENGTH), bool)
    valid[0, 100:110] = False
    valid[1, :20] = False
    valid[1, 64:70] = False
    return valid


@INTERPRET_MODE
def test_tame_sums_match_float64():
    """|q|, |k| ~ 2.8 (LayerNorm'd rows at H = 64 times H^-1/4), two heads with holes and
    leading padding: every head tame; each row's shift S_t at least its largest exponent M_t
    and within the gap ``chunk_gaps`` allows; denominators relative to M_t within the
    bfloat16 factors' rounding; outputs within the products' bound."""
    q, k, v, valid, weights = _rows(0, 0.35, _masks())
    bias = jnp.zeros(FEATURES)
    num, den, shift, excess = causal_kernels.causal_sums(
        weights, bias, q, k, v, valid, norm_weight=NORM_WEIGHT, interpret=True
    )
    assert np.all(np.asarray(excess) <= 0)  # tame
    want_num, want_den, top = _float64_sums(q, k, v, valid, weights)
    attended = np.isfinite(top)  # head 1's first 20 rows attend to no key
    assert np.all(np.asarray(den)[~attended] == 0)
    over = np.asarray(shift, np.float64)[attended] - top[attended]
    delta = 16 * EPS32 * 10  # float32 log-features of magnitude < 10 here
    assert over.min() >= -delta
    assert over.max() <= causal_kernels.tame_bound(FEATURES, LENGTH)
    relative = np.asarray(den, np.float64)[attended] * np.exp(over) / want_den[attended]
    assert np.abs(relative - 1).max() <= 4 * U
    out = np.asarray(num, np.float64)[attended] / np.asarray(den, np.float64)[attended, None]
    want = want_num[attended] / want_den[attended, None]
    assert np.abs(out - want).max() <= 5 * U * np.abs(np.asarray(v, np.float32)).max()


@INTERPRET_MODE
def test_the_row_shifts_lie_within_their_bounds():
    """With the masks' holes and padding, at |x| ~ 8 and ~ 40 before the H^-1/4 scale: on
    every row that attends to a key, R_t <= M_t <= S_t (the kernel's lower bound and row shift
    against the exact largest exponent), the bounds the fallback rests on; a head is tame
    exactly where max_t (S_t - R_t) is within ``tame_bound``: both heads at the smaller norm,
    neither at the larger."""
    for scale, tame_heads in ((1.0, [True, True]), (5.0, [False, False])):
        q, k, v, valid, weights = _rows(1, scale, _masks())
        bias = jnp.zeros(FEATURES)
        run = jax.jit(_readout_bounds, static_argnames="norm_weight")
        shift, lower, tame = run(weights, bias, q, k, v, valid, norm_weight=NORM_WEIGHT)
        _, _, top = _float64_sums(q, k, v, valid, weights)
        attended = np.isfinite(top)
        delta = 16 * EPS32 * np.abs(top[attended]).max()
        shift, lower = (np.asarray(x, np.float64)[attended] for x in (shift, lower))
        assert np.all(lower <= top[attended] + delta) and np.all(top[attended] <= shift + delta)
        spread = np.where(attended, np.asarray(_padded(shift - lower, attended)), 0).max(axis=1)
        bound = causal_kernels.tame_bound(FEATURES, LENGTH)
        assert np.asarray(tame).tolist() == tame_heads == (spread <= bound).tolist(), spread


def _padded(values: np.ndarray, where: np.ndarray) -> np.ndarray:
    """``values`` (the entries of ``where``) back in ``where``'s shape, 0 elsewhere."""
    full = np.zeros(where.shape)
    full[where] = values
    return full


def _readout_bounds(weights, bias, query, key, value, valid, *, norm_weight):
    """(S, R, tame) of ``causal_sums``'s kernels (interpret mode)."""
    keys = causal_kernels.augmented_rows(key, norm_weight)
    values = causal_kernels._padded_columns(value)
    keep = valid.astype(jnp.float32)
    augmented = causal_kernels.augmented_weights(weights, bias)
    summaries = causal_kernels.key_summaries(keys, values, keep, augmented, interpret=True)
    chunks = causal_kernels.references(summaries, key, valid, weights, bias, norm_weight)
    queries = causal_kernels.augmented_rows(query, norm_weight)
    _, _, shift, lower = causal_kernels.causal_readout(
        queries, keys, values, keep, augmented, chunks, interpret=True
    )
    excess = causal_kernels.causal_sums(
        weights, bias, query, key, value, valid, norm_weight=norm_weight, interpret=True
    )[3]
    return shift, lower, excess <= 0


def _traced_again() -> None:
    """Clears the caches of ``favor_attention``'s jitted body and of ``causal_sums``, so that
    the next call traces them again under a patched constant (``jax.clear_caches`` would also
    drop programs that later tests in the worker count on being compiled already)."""
    _favor._favor_attention.clear_cache()
    causal_kernels.causal_sums.clear_cache()


@INTERPRET_MODE
def test_norm_120_falls_back_to_the_generic_kernels(monkeypatch):
    """|q| = |k| = 120: chunks are not tame, so ``favor_attention`` runs the generic
    kernels, forward (matching float64, ``test_large_norms.exact``) and backward (the
    gradients of ``pallas_triton_interpret``, equal); with the bound lifted (every head taken
    as tame) the Mosaic GPU kernel's rows are far off: the fallback carries it."""
    q, k, v = inputs(120, jnp.bfloat16, length=128)
    projection = attention.draw_projection(jax.random.key(3), HEAD_DIM, FEATURES)
    want, tolerance = exact(q, k, v, np.asarray(projection.matrix()), antithetic=False, causal=True)
    bound = tolerance + 5 * U * np.abs(np.asarray(v, np.float32)).max()
    weights = jax.random.normal(jax.random.key(5), v.shape)

    def run(implementation: str):
        _traced_again()  # with the bound in force
        attend = functools.partial(
            attention.favor_attention,
            projection=projection,
            causal=True,
            implementation=implementation,
        )
        out = jax.jit(attend)(q, k, v)

        def loss(*rows):
            return jnp.sum(attend(*rows).astype(jnp.float32) * weights)

        grads = jax.jit(jax.grad(loss, (0, 1, 2)))(q, k, v)
        error = np.abs(np.asarray(out[0, :, 0], np.float64) - want).max()
        return error, [np.asarray(g, np.float32) for g in grads]

    error, grads = run("pallas_mosaic_gpu_interpret")
    assert error <= bound
    for grad, generic in zip(grads, run("pallas_triton_interpret")[1], strict=True):
        np.testing.assert_array_equal(grad, generic)
    monkeypatch.setattr(causal_kernels, "tame_bound", lambda *_: np.inf)
    assert not run("pallas_mosaic_gpu_interpret")[0] <= bound  # NaN or far off


@INTERPRET_MODE
def test_matches_the_xla_form_values_and_gradients():
    """bfloat16 inputs with a mask, 2 heads, T = 80 (a chunk and a partial one), m = 64:
    outputs (not differentiated: the forward kernel) and gradients (the backward's kernels)
    within the bound of the XLA form's (``test_fused._assert_gpu_close``)."""
    q, k, v, mask, projection = operands(3, dtype=jnp.bfloat16, features=64)
    weights = jax.random.normal(jax.random.key(9), v.shape)

    def loss(q, k, v, implementation):
        out = attention.favor_attention(
            q, k, v, projection, mask=mask, causal=True, implementation=implementation
        )
        return jnp.sum(out.astype(jnp.float32) * weights), out

    def results(implementation: str):
        grads = jax.jit(jax.grad(loss, (0, 1, 2), has_aux=True), static_argnums=3)(
            q, k, v, implementation
        )[0]
        forward = jax.jit(loss, static_argnums=3)(q, k, v, implementation)[1]
        return np.asarray(forward, np.float32), [np.asarray(g, np.float32) for g in grads]

    mosaic, xla = results("pallas_mosaic_gpu_interpret"), results("xla")
    _assert_gpu_close(mosaic, xla, U, np.asarray(v, np.float32))


def _kernel_calls(lowered) -> tuple[int, int]:
    """(Mosaic GPU kernels, Triton kernels) in a lowered module."""
    text = lowered.as_text()
    return text.count("custom_call @mosaic_gpu_v2("), text.count(f"{TOOL.TRITON_CALL}(")


def test_both_passes_lower_for_h100(monkeypatch):
    """Lowered for an abstract H100 (B = 2, 2 heads of 64, T = 256, m = 256, bfloat16): the
    forward pass holds the two Mosaic GPU kernels (the key summaries and the read-out) and the
    fallback's, the Triton kernels of ``"pallas_triton"``'s forward pass (a ``cond`` lowers
    both branches); its gradient holds six Mosaic GPU kernels (those two, and the backward's
    key summaries, query summaries, queries' and keys' kernels) and the fallback's, the Triton
    kernels of ``"pallas_triton"``'s gradient."""
    q = jax.ShapeDtypeStruct((2, 256, 2, 64), jnp.bfloat16)
    projection = attention.draw_projection(jax.random.key(0), 64, 256)

    def calls(implementation: str) -> list[tuple[int, int]]:
        def forward(q, k, v):
            return attention.favor_attention(
                q, k, v, projection, causal=True, implementation=implementation
            )

        def loss(q, k, v):
            return jnp.sum(forward(q, k, v).astype(jnp.float32))

        def gradient(q, k, v):
            return jax.grad(loss, (0, 1, 2))(q, k, v)

        return [_kernel_calls(lowered_for_h100(f, (q, q, q))) for f in (forward, gradient)]

    # favor_attention refuses the GPU's implementations off a GPU: here it takes the lowering's
    monkeypatch.setattr(_favor.jax, "default_backend", lambda: "gpu")
    (mosaic, mosaic_gradient), (triton, triton_gradient) = map(
        calls, ("pallas_mosaic_gpu", "pallas_triton")
    )
    assert triton[0] == 0 and triton[1] > 0 and triton_gradient[0] == 0
    assert mosaic == (2, triton[1])
    assert mosaic_gradient == (6, triton_gradient[1])


def test_both_passes_lower_inside_shard_map(monkeypatch):
    """Inside ``shard_map`` (the batch split over ``"data"``, as the long-context LM's training
    step runs), a gradient through ``favor_attention(implementation="pallas_mosaic_gpu",
    causal=True)`` lowers for an abstract H100 with its six Mosaic GPU kernels (and the
    fallback's Triton kernels); ``fused_attention_sums``, one head, refuses causal attention
    under Mosaic GPU (its fallback is decided over all heads)."""
    monkeypatch.setattr(_favor.jax, "default_backend", lambda: "gpu")
    projection = attention.draw_projection(jax.random.key(0), 64, 128)

    def loss(q, k, v):
        out = attention.favor_attention(
            q, k, v, projection, causal=True, implementation="pallas_mosaic_gpu"
        )
        return jnp.sum(out.astype(jnp.float32))

    spec = jax.sharding.PartitionSpec("data")
    device = jax.sharding.AbstractDevice(**TOOL.H100)
    mesh = jax.sharding.AbstractMesh(
        (1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,), abstract_device=device
    )
    step = jax.shard_map(
        jax.grad(loss, (0, 1, 2)), mesh=mesh, in_specs=(spec,) * 3, out_specs=(spec,) * 3
    )
    rows = jax.ShapeDtypeStruct((2, 256, 2, 64), jnp.bfloat16)
    with jax.sharding.use_abstract_mesh(mesh):
        lowered = jax.jit(step).trace(rows, rows, rows).lower(lowering_platforms=("cuda",))
    assert _kernel_calls(lowered)[0] == 6 and _kernel_calls(lowered)[1] > 0
    form = features.AffineLogForm(projection.matrix(), jnp.zeros(128), -0.5)
    row = jnp.zeros((64, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match="runs through fused_attention"):
        _fused.fused_attention_sums(
            form,
            row,
            row,
            row,
            jnp.ones(64, bool),
            causal=True,
            backend=_fused.Backend("mosaic_gpu"),
        )


@pytest.mark.skipif(not _sm90(), reason="compiles the Mosaic GPU kernels for an sm90+ GPU")
def test_pallas_mosaic_gpu_causal_on_the_gpu_matches_the_xla_form():
    """Causal attention compiled by Mosaic GPU (``benchmarks.gpu_run``'s tests step) against
    the XLA form on the device: B = 2, T = 1,000 (16 chunks, one partial), 4 heads of 64,
    m = 128, masked, bfloat16 (standard normal rows, |x'| ~ 2.8, are tame:
    ``test_the_row_shifts_lie_within_their_bounds``); the output not differentiated (the
    forward kernel alone), and the output and gradients of ``value_and_grad`` (both passes),
    within ``test_fused``'s GPU bound."""
    keys = jax.random.split(jax.random.key(6), 5)
    shape = (2, 1000, 4, 64)
    q, k, v = (jax.random.normal(x, shape).astype(jnp.bfloat16) for x in keys[:3])
    mask = jax.random.uniform(keys[3], shape[:2]) > 0.1
    projection = attention.draw_projection(keys[4], 64, 128)

    def run(implementation: str) -> np.ndarray:
        attend = functools.partial(
            attention.favor_attention,
            projection=projection,
            causal=True,
            mask=mask,
            implementation=implementation,
        )
        return np.asarray(jax.jit(attend)(q, k, v), np.float32)

    out, want = run("pallas_mosaic_gpu"), run("xla")
    largest = np.abs(np.asarray(v, np.float32)).max()
    assert np.abs(out - want).max() <= 10 * U * largest + U * np.abs(want).max()
    both, u, values = _on_the_gpu(True, jnp.bfloat16)
    _assert_gpu_close(both("pallas_mosaic_gpu"), both("xla"), u, values)


@pytest.mark.parametrize("head_dim, value_width", _fused_mosaic_gpu.FITTING_WIDTHS)
def test_the_kernels_lower_at_the_widest_widths_they_take(head_dim, value_width):
    """At each pair of ``FITTING_WIDTHS`` (T = 128, m = 128) the causal forward's two kernels
    lower for an abstract H100: within its shared memory."""
    sums = functools.partial(causal_kernels.causal_sums, norm_weight=-0.5)
    lowered = lowered_for_h100(sums, pass_arguments(head_dim, value_width)[:6])
    assert _kernel_calls(lowered) == (2, 0)
