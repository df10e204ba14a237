"""The backward pass of the Mosaic GPU kernels of bidirectional FAVOR
(``rfjax.attention._fused_mosaic_gpu_grads``) on CPU: where its cotangent kernel finds the
rows and W's parts (no kernel), and its cotangents in Mosaic GPU's interpret mode against the
float64 VJP of the sums (CI's integration tier). Its lowering for an H100 and its values and
gradients through ``favor_attention``: ``test_fused_mosaic_gpu.py``."""

import jax
import jax.numpy as jnp
import numpy as np

from rfjax.attention import _fused_mosaic_gpu, _fused_mosaic_gpu_grads
from tests.support.interpret_mode import INTERPRET_MODE

EPS32 = float(np.finfo(np.float32).eps)
U = 2.0**-8  # bfloat16's unit roundoff


def test_the_cotangent_kernel_finds_every_part_and_pairs_them_to_float32():
    """The backward's pullbacks are float32 only if they take every part: the blocks where
    ``_Layout`` looks hold x (block 0) and W's parts (block j: their sum is W exactly), and the
    products it sums with W are every pair of dl's three parts with them whose orders add up
    to at most 2 (the 4u bound of the next test cannot see a part missing: it costs u); the
    row sums' column of W_aug holds ones."""
    x = jax.random.normal(jax.random.key(0), (3, 16)).astype(jnp.bfloat16)
    w = jax.random.normal(jax.random.key(1), (64, 16))
    layout = _fused_mosaic_gpu_grads._Layout(16)
    rows = np.asarray(_fused_mosaic_gpu.augmented_rows(x, -0.5), np.float64)
    weights = np.asarray(_fused_mosaic_gpu.augmented_weights(w, jnp.zeros(64)), np.float64)

    def block(a, index):
        columns = layout.columns(index)
        return a[:, columns.start : columns.start + 16]

    np.testing.assert_array_equal(block(rows, 0), np.asarray(x, np.float64))
    weight_sum = sum(block(weights, j) for j in range(3))
    np.testing.assert_array_equal(weight_sum, np.asarray(w, np.float64))
    everything = {(i, j) for i in range(3) for j in range(3) if i + j <= 2}
    assert set(layout.weight_products) == everything
    # the row sums of dl come from the products with W_aug's last block, in its column of ones
    ones = layout.last_columns().start + _fused_mosaic_gpu.ONES_COLUMN
    np.testing.assert_array_equal(weights[:, ones], 1)


@INTERPRET_MODE
def test_cotangents_match_float64_within_the_bfloat16_operands_bound():
    """``bidirectional_cotangents`` (interpret mode) against the float64 VJP of the sums, from
    the kernels' own row shifts, bfloat16 rows (|x| about 4 and a masked key), H = 16, P = 16,
    m = 192 (three tiles of features), two chunks. The kernels round to bfloat16 the cotangents
    G and the state S in G S^T (and the state's factors), the query factors and G in dS, dS
    again in dS v^T, the key factors and dS in dv: each a relative u (2^-8), so every
    cotangent lies within 4u of the same computation on the entries' magnitudes (``|.|``
    throughout), beside float32's 64 eps of it; the pullbacks through W and the rows are
    float32 (their parts: the test above). Measured: within 0.47u (bfloat16 rows)."""
    keys = jax.random.split(jax.random.key(7), 7)
    length, head, width, count = 128, 16, 16, 192
    q, k = (jax.random.normal(key, (length, head)).astype(jnp.bfloat16) for key in keys[:2])
    v = jax.random.normal(keys[2], (length, width)).astype(jnp.bfloat16)
    valid = jnp.arange(length) != 5
    v = jnp.where(valid[:, None], v, 0)
    weights = jax.random.normal(keys[3], (count, head))
    bias = 0.1 * jax.random.normal(keys[4], (count,))
    grad = jax.random.normal(keys[5], (length, width))
    grad_den = jax.random.normal(keys[6], (length,))
    args = (weights, bias, q[None], k[None], v[None], valid[None])
    _, _, shift = _fused_mosaic_gpu.bidirectional_sums(*args, norm_weight=-0.5, interpret=True)
    got = _fused_mosaic_gpu_grads.bidirectional_cotangents(
        *args, shift, grad[None], grad_den[None], norm_weight=-0.5, interpret=True
    )
    x = [np.asarray(a, np.float64) for a in (q, k, v, weights, bias, grad, grad_den)]
    rows_shift = np.asarray(shift[0], np.float64)
    want, magnitude = (
        _cotangents_64(*x, np.asarray(valid), rows_shift, magnitudes) for magnitudes in (0, 1)
    )
    for name, g, w, a in zip(("dW", "db", "dq", "dk", "dv"), got, want, magnitude, strict=True):
        error = np.abs(np.asarray(g[0], np.float64) - w)
        assert np.all(error <= (4 * U + 64 * EPS32) * a), (name, np.max(error / a))


def _cotangents_64(q, k, v, w, b, grad, grad_den, valid, shift, magnitudes):
    """The float64 VJP of the bidirectional sums from row shifts ``shift`` (dW, db, dq, dk,
    dv), or with ``magnitudes`` the same computation on the entries' magnitudes."""
    f = np.abs if magnitudes else (lambda a: a)
    la = q @ w.T + b - 0.5 * np.sum(q * q, -1, keepdims=True)
    lb = k @ w.T + b - 0.5 * np.sum(k * k, -1, keepdims=True)
    c = np.max(np.where(valid[:, None], lb, -np.inf), axis=0)
    key = np.where(valid[:, None], np.exp(lb - c), 0)
    query = np.exp(la + c - shift[:, None])
    state, count = key.T @ f(v), key.sum(0)
    grad_state, grad_count = query.T @ f(grad), query.T @ f(grad_den)
    grad_la = query * (f(grad) @ state.T + f(grad_den)[:, None] * count)
    grad_lb = key * (f(v) @ grad_state.T + grad_count)
    norm = -1.0  # 2 g, g = -1/2 (FAVOR+)
    dq = grad_la @ f(w) + f(norm * np.sum(grad_la, -1, keepdims=True)) * f(q)
    dk = grad_lb @ f(w) + f(norm * np.sum(grad_lb, -1, keepdims=True)) * f(k)
    dw = grad_la.T @ f(q) + grad_lb.T @ f(k)
    return dw, grad_la.sum(0) + grad_lb.sum(0), dq, dk, key @ grad_state
