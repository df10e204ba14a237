"""The backward pass of causal FAVOR in Mosaic GPU's idiom
(``rfjax.attention._fused_mosaic_gpu_causal_grads``) on CPU: its cotangents in Mosaic GPU's
interpret mode against the VJP of the sums, and the widths its kernels take, lowered for an
abstract H100. Through ``favor_attention`` (values and gradients against the XLA form, the
fallback, both passes lowered): ``test_fused_mosaic_gpu_causal``."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax.attention import _fused_mosaic_gpu
from rfjax.attention import _fused_mosaic_gpu_causal as causal_kernels
from rfjax.attention import _fused_mosaic_gpu_causal_grads as causal_grads
from tests.rfjax.attention.test_fused_mosaic_gpu import lowered_for_h100, pass_arguments
from tests.rfjax.attention.test_fused_mosaic_gpu_causal import (
    EPS32,
    FEATURES,
    LENGTH,
    NORM_WEIGHT,
    U,
    _kernel_calls,
    _masks,
    _rows,
)
from tests.support.interpret_mode import INTERPRET_MODE


@INTERPRET_MODE
def test_cotangents_match_the_vjp_of_the_sums():
    """``causal_cotangents`` (interpret mode) against the VJP of the sums formed directly in
    float32 from the kernel's own row shifts (two tame heads, the masks' holes and padding,
    |x'| ~ 2.8, m = 128: three chunks). The kernels round to bfloat16 the factors, G, the
    states and D (and the scores A): each term of a cotangent carries at most about 4 such
    roundings (u = 2^-8 each), so every cotangent lies within 4u of the same computation on
    the terms' magnitudes (|G|, |g|, |v|; |W|, |x| in the pullback), beside float32's 64 eps of
    it. Measured: within 0.94u of the largest entry (bfloat16 rows, 2026-12-01)."""
    q, k, v, valid, weights = _rows(4, 0.35, _masks())
    bias = 0.1 * jax.random.normal(jax.random.key(5), (FEATURES,))
    grad = jax.random.normal(jax.random.key(6), v.shape)
    grad_den = jax.random.normal(jax.random.key(7), valid.shape)
    shift = causal_kernels.causal_sums(
        weights, bias, q, k, v, valid, norm_weight=NORM_WEIGHT, interpret=True
    )[2]
    got = causal_grads.causal_cotangents(
        weights,
        bias,
        q,
        k,
        v,
        valid,
        shift,
        grad,
        grad_den,
        norm_weight=NORM_WEIGHT,
        interpret=True,
    )
    want, magnitude = _direct_cotangents(q, k, v, valid, weights, bias, shift, grad, grad_den)
    for name, a, b, size in zip(("dW", "db", "dq", "dk", "dv"), got, want, magnitude, strict=True):
        error = np.abs(np.asarray(a, np.float64) - b)
        assert np.all(error <= (4 * U + 64 * EPS32) * size), name


def _direct_cotangents(q, k, v, valid, weights, bias, shift, grad, grad_den):
    """(dW, db, dq, dk, dv) of the causal sums relative to ``shift``, by ``jax.vjp`` of their
    direct float32 form in the log-features, and the same on the terms' magnitudes."""
    mask = np.tril(np.ones((LENGTH, LENGTH), bool))[None] & np.asarray(valid)[:, None, :]

    def sums(la, lb, values):
        exponents = la[:, :, None, :] + lb[:, None, :, :] - shift[:, :, None, None]
        scores = jnp.where(mask, jnp.sum(jnp.exp(exponents), -1), 0)
        return scores @ values, jnp.sum(scores, -1)

    def logs(x):
        return x @ weights.T + bias + NORM_WEIGHT * jnp.sum(x * x, -1, keepdims=True)

    q, k, values = (x.astype(jnp.float32) for x in (q, k, v))
    _, pull = jax.vjp(sums, logs(q), logs(k), values)
    _, pull_magnitude = jax.vjp(sums, logs(q), logs(k), jnp.abs(values))
    signed = pull((grad, grad_den))
    sizes = pull_magnitude((jnp.abs(grad), jnp.abs(grad_den)))
    results = []
    for (dla, dlb, dv), absolute in ((signed, False), (sizes, True)):
        w, x, y = (jnp.abs(a) if absolute else a for a in (weights, q, k))
        norm = 2 * (-NORM_WEIGHT if absolute else NORM_WEIGHT)
        dq = dla @ w + norm * jnp.sum(dla, -1, keepdims=True) * x
        dk = dlb @ w + norm * jnp.sum(dlb, -1, keepdims=True) * y
        dw = jnp.einsum("ntm,nth->nmh", dla, x) + jnp.einsum("ntm,nth->nmh", dlb, y)
        db = jnp.sum(dla, 1) + jnp.sum(dlb, 1)
        results.append([np.asarray(a, np.float64) for a in (dw, db, dq, dk, dv)])
    return results


@pytest.mark.parametrize(
    "head_dim, value_width", [*_fused_mosaic_gpu.FITTING_WIDTHS, (256, 64), (128, 256)]
)
def test_the_backward_kernels_take_every_width_the_forward_does(head_dim, value_width, monkeypatch):
    """At each pair of ``FITTING_WIDTHS`` the backward's four kernels lower for an abstract
    H100 (T = 128, m = 128): within the shared memory, whose phases the key kernel and the
    query kernel scope apart (``pl.run_scoped``: without that, (128, 128) exceeded it by
    22,624 bytes); past them ``causal_cotangents`` refuses the widths before compiling, and
    without that check the lowering finds a kernel past the shared memory (at (128, 256) the
    bidirectional passes would fit, the causal ones do not: ``check_rows`` refuses it for all,
    2026-12-01)."""

    def lowered():
        cotangents = functools.partial(causal_grads.causal_cotangents, norm_weight=-0.5)
        return lowered_for_h100(cotangents, pass_arguments(head_dim, value_width))

    if (head_dim, value_width) in _fused_mosaic_gpu.FITTING_WIDTHS:
        assert _kernel_calls(lowered()) == (4, 0)
        return
    with pytest.raises(ValueError, match=f"head_dim = {head_dim} .* value width {value_width}"):
        lowered()
    monkeypatch.setattr(_fused_mosaic_gpu, "FITTING_WIDTHS", ((1 << 20, 1 << 20),))
    with pytest.raises(Exception, match="exceeds available shared memory"):
        lowered()
