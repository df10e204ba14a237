"""The Pallas kernels of fused FAVOR attention (``_fused``): one chunk (or a group of chunks) of
one head per program, the affine feature map computed from the rows inside the kernel, blocks of
``LOG_BLOCK`` positions read from the refs (Triton cannot slice values), products accumulated in
float32. The computation per chunk is ``_log_prefix``'s; see ``_fused`` for the passes."""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from rfjax.attention._checks import log_floor
from rfjax.attention._log_prefix import LOG_BLOCK

CHUNK = 64  # positions per chunk: 4 blocks of LOG_BLOCK


# ------------------------------------------------------------------------ in-kernel pieces


@dataclasses.dataclass(frozen=True)
class AffineSpec:
    """The affine log-features l(x) = x W^T + b + g |x|^2 (FAVOR+, its antithetic variant,
    OPRF): parameters W ``(m, H)`` and b ``(1, m)``, width m, factors 1; rows normalised by
    their largest term (as the XLA form's per-feature shifts)."""

    norm_weight: float
    per_row_units: typing.ClassVar[bool] = False

    def width(self, weights: jax.Array, aux: jax.Array) -> int:
        return weights.shape[0]

    def padded_aux(self, aux: jax.Array, head_dim: int) -> jax.Array:
        """b ``(m,)`` -> ``(1, m)``, float32."""
        del head_dim
        return aux[None, :].astype(jnp.float32)

    def unpadded_aux(self, grad: jax.Array, aux: jax.Array) -> jax.Array:
        return grad[0].astype(aux.dtype)

    def load(self, weights_ref, aux_ref) -> _AffineForm:
        return _AffineForm(weights_ref, aux_ref, self.norm_weight, jnp.float32)


@dataclasses.dataclass(frozen=True)
class AngularHybridSpec:
    """The angular hybrid (HRF Eq. 12, variant II): parameters the base projection W
    ``(m, H)`` and the sign projection T ``(n, H)``; width (n + 1) 4m (Lemma 2.3's flat
    features, in channels l = 0..n of [positive 2m, trigonometric 2m]); rows normalised as the
    XLA form's per-row key shift does (``per_row_units``)."""

    per_row_units: typing.ClassVar[bool] = True

    def width(self, weights: jax.Array, aux: jax.Array) -> int:
        return (aux.shape[0] + 1) * 4 * weights.shape[0]

    def padded_aux(self, aux: jax.Array, head_dim: int) -> jax.Array:
        """T ``(n, H)`` -> ``(n, H')``, zeros in the new columns."""
        return jnp.pad(aux, ((0, 0), (0, head_dim - aux.shape[1])))

    def unpadded_aux(self, grad: jax.Array, aux: jax.Array) -> jax.Array:
        return grad[:, : aux.shape[1]].astype(aux.dtype)

    def load(self, weights_ref, aux_ref) -> _AngularHybridForm:
        return _AngularHybridForm(weights_ref, aux_ref)


Spec = AffineSpec | AngularHybridSpec  # how the kernels read a map's parameters


def _times(factor: jax.Array | None, x: jax.Array) -> jax.Array:
    """factor * x, with ``None`` for factors of 1 (the affine maps: x unchanged)."""
    return x if factor is None else factor * x


class _AffineForm:
    """The affine log-features inside a kernel: l(x) = x W^T + b + g |x|^2 from refs, factors
    1 (``None``)."""

    def __init__(self, weights_ref, bias_ref, norm_weight: float, dtype):
        self.weights = weights_ref[...].astype(dtype)
        self.bias = bias_ref[...].astype(dtype)  # (1, m)
        self.norm_weight = norm_weight
        self.dtype = dtype

    def features(self, rows: jax.Array, side: str) -> tuple[jax.Array, None]:
        """(log-features ``(B, m)``, factors ``None``)."""
        del side  # symmetric
        rows = rows.astype(self.dtype)
        squared = jnp.sum(rows * rows, axis=1, keepdims=True)
        projected = jnp.dot(rows, self.weights.T, preferred_element_type=self.dtype)
        return projected + self.bias + self.norm_weight * squared, None

    def backward(self, rows, grad_logs, grad_factors, side):
        """(d rows, dW, db) of sum(grad_logs * l(rows)): dx = grad_logs W + 2 g (sum_i
        grad_logs_i) rows, dW = grad_logs^T rows, db = sum_t grad_logs_t."""
        del grad_factors, side
        rows = rows.astype(self.dtype)
        total = jnp.sum(grad_logs, axis=1, keepdims=True)
        back = jnp.dot(grad_logs, self.weights, preferred_element_type=self.dtype)
        grad_rows = back + 2.0 * self.norm_weight * total * rows
        grad_weights = jnp.dot(grad_logs.T, rows)
        return grad_rows, grad_weights, jnp.sum(grad_logs, axis=0, keepdims=True)


class _AngularHybridForm:
    """The angular hybrid's features inside a kernel, from z = x W^T and the signs
    sigma = sgn(x T^T) / sqrt(2n) (``rfjax.features.angular_hybrid_features``, variant II):
    feature f = factor_f exp(l_f) in channels l = 0..n of [positive 2m, trigonometric 2m],

    * logs: [z, -z] - |x|^2/2 - log(2m)/2 (positive), |x|^2/2 - log(m)/2 (trigonometric, the
      same for its 2m features), repeated over the channels;
    * factors: the channel's coefficient, times [sin z, cos z] in the trigonometric block;
      query coefficients [1/2, sigma] in both blocks (a = 1/2, rho = sigma), key coefficients
      [1, -sigma] (positive: eta = -sigma) and [1, sigma] (trigonometric: -eta).

    sum_f factor_f(q) factor_f(k) exp(l_f(q) + l_f(k)) is Lemma 2.3's Psi(q) . Psi'(k): the
    hybrid estimate lambda-hat SM-hat^{++} + (1 - lambda-hat) SM-hat^{trig}. The signs are
    piecewise constant: no gradient reaches T or the rows through them."""

    def __init__(self, weights_ref, signs_ref):
        self.weights = weights_ref[...].astype(jnp.float32)  # (m, H)
        self.signs = signs_ref[...].astype(jnp.float32)  # (n, H)
        self.dtype = jnp.float32

    def _projections(self, rows):
        rows = rows.astype(jnp.float32)
        z = jnp.dot(rows, self.weights.T, preferred_element_type=jnp.float32)
        squared = jnp.sum(rows * rows, axis=1, keepdims=True)
        return rows, z, squared

    def _coefficients(self, rows, side):
        """(positive, trigonometric) channel coefficients ``(B, n + 1)``."""
        count = self.signs.shape[0]
        projected = jnp.dot(rows, self.signs.T, preferred_element_type=jnp.float32)
        sigma = jnp.sign(projected) * (1.0 / math.sqrt(2.0 * count))
        if side == "query":
            both = jnp.concatenate([jnp.full_like(sigma[:, :1], 0.5), sigma], axis=1)
            return both, both
        ones = jnp.ones_like(sigma[:, :1])
        return jnp.concatenate([ones, -sigma], axis=1), jnp.concatenate([ones, sigma], axis=1)

    def features(self, rows: jax.Array, side: str) -> tuple[jax.Array, jax.Array]:
        """(log-features, factors), each ``(B, (n + 1) 4m)``."""
        rows, z, squared = self._projections(rows)
        m = z.shape[1]
        positive = jnp.concatenate([z, -z], axis=1) - 0.5 * squared - 0.5 * math.log(2 * m)
        trigonometric = jnp.broadcast_to(0.5 * squared - 0.5 * math.log(m), positive.shape)
        logs = jnp.concatenate([positive, trigonometric], axis=1)
        sin_cos = jnp.concatenate([jnp.sin(z), jnp.cos(z)], axis=1)
        positive_coefficients, trigonometric_coefficients = self._coefficients(rows, side)
        channels = []
        for c in range(positive_coefficients.shape[1]):
            channels.append(jnp.broadcast_to(positive_coefficients[:, c : c + 1], sin_cos.shape))
            channels.append(trigonometric_coefficients[:, c : c + 1] * sin_cos)
        return jnp.concatenate([logs] * positive_coefficients.shape[1], axis=1), jnp.concatenate(
            channels, axis=1
        )

    def backward(self, rows, grad_logs, grad_factors, side):
        """(d rows, dW, dT = 0) of sum(grad_logs * logs + grad_factors * factors)."""
        rows, z, squared = self._projections(rows)
        del squared
        m = z.shape[1]
        _, trigonometric_coefficients = self._coefficients(rows, side)
        channels = trigonometric_coefficients.shape[1]
        grad_positive = jnp.zeros((rows.shape[0], 2 * m), jnp.float32)
        grad_scale = jnp.zeros((rows.shape[0], 1), jnp.float32)
        grad_sin_cos = jnp.zeros((rows.shape[0], 2 * m), jnp.float32)
        for c in range(channels):
            block = grad_logs[:, c * 4 * m : (c + 1) * 4 * m]
            grad_positive = grad_positive + block[:, : 2 * m]
            grad_scale = grad_scale + jnp.sum(block[:, 2 * m :], axis=1, keepdims=True)
            factor_block = grad_factors[:, c * 4 * m + 2 * m : (c + 1) * 4 * m]
            grad_sin_cos = grad_sin_cos + trigonometric_coefficients[:, c : c + 1] * factor_block
        grad_z = grad_positive[:, :m] - grad_positive[:, m:]
        grad_z = grad_z + grad_sin_cos[:, :m] * jnp.cos(z) - grad_sin_cos[:, m:] * jnp.sin(z)
        total = grad_scale - jnp.sum(grad_positive, axis=1, keepdims=True)
        grad_rows = jnp.dot(grad_z, self.weights, preferred_element_type=jnp.float32)
        grad_rows = grad_rows + total * rows
        return grad_rows, jnp.dot(grad_z.T, rows), jnp.zeros_like(self.signs)


def _dot(a: jax.Array, b: jax.Array, matmul_dtype, *, transpose_b: bool = False) -> jax.Array:
    """a b (or a b^T) with operands in ``matmul_dtype``, accumulated in float32 (or wider)."""
    accumulate = jnp.promote_types(jnp.float32, a.dtype)
    b = b.T if transpose_b else b
    return jnp.dot(
        a.astype(matmul_dtype), b.astype(matmul_dtype), preferred_element_type=accumulate
    )


def _causal_mask(block: int) -> jax.Array:
    rows = jax.lax.broadcasted_iota(jnp.int32, (block, block), 0)
    return (jax.lax.broadcasted_iota(jnp.int32, (block, block), 1) <= rows)[:, :, None]


def _block_weights(la: jax.Array, lb: jax.Array, row_shift: jax.Array) -> jax.Array:
    """exp(la_ti + lb_ji - M_t) for j <= t, 0 for j > t: ``(B, B, F)``."""
    pairs = la[:, None, :] + lb[None, :, :]
    return jnp.exp(jnp.where(_causal_mask(la.shape[0]), pairs, -jnp.inf) - row_shift[:, :, None])


def _pair_terms(weights: jax.Array, fa, fb) -> jax.Array:
    """The pairs' terms fa_ti fb_ji exp(la_ti + lb_ji - M_t) ``(B, B, F)`` from
    ``_block_weights`` (factors ``None``: 1)."""
    if fa is None:
        return weights
    return weights * (fa[:, None, :] * fb[None, :, :])


def _row_shift(la: jax.Array, lb: jax.Array, block_start: jax.Array) -> jax.Array:
    """M_t ``(B, 1)``: max(max_i (la_ti + E_i), max_{j <= t, i} (la_ti + lb_ji))."""
    pairs = jnp.where(_causal_mask(la.shape[0]), la[:, None, :] + lb[None, :, :], -jnp.inf)
    own = jnp.max(jnp.max(pairs, axis=2), axis=1, keepdims=True)
    return jnp.maximum(own, jnp.max(la + block_start, axis=1, keepdims=True))


class _ChunkRows:
    """One chunk's blocks read from refs at row ``offset``: log-features and factors of queries
    and keys (keys left out: lb at the log floor, factors and values 0), values, and the block
    maxima e and the running maxima at block starts E (from the chunk's start)."""

    def __init__(self, form, refs, offset, blocks: int, start, *, queries: bool = True):
        q_ref, k_ref, v_ref, valid_ref = refs
        floor = log_floor(form.dtype)
        self.la, self.lb, self.v, self.valid, self.q, self.k = [], [], [], [], [], []
        self.fa, self.fb = [], []  # factors (None: 1)
        self.ones = []  # (1, B): 1 for the keys that count (the denominator's column)
        for s in range(blocks):
            rows = pl.ds(offset + s * LOG_BLOCK, LOG_BLOCK)
            valid = valid_ref[rows, :] > 0
            k = k_ref[rows, :]
            if queries:
                q = q_ref[rows, :]
                self.q.append(q)
                la, fa = form.features(q, "query")
                self.la.append(la)
                self.fa.append(fa)
            self.k.append(k)
            self.valid.append(valid)
            self.ones.append(valid.astype(form.dtype).T)
            lb, fb = form.features(k, "key")
            self.lb.append(jnp.where(valid, lb, floor))
            self.fb.append(None if fb is None else jnp.where(valid, fb, 0))
            self.v.append(jnp.where(valid, v_ref[rows, :].astype(form.dtype), 0))
        self.block_max = [jnp.max(lb, axis=0, keepdims=True) for lb in self.lb]
        self.block_start = [start]
        for block_max in self.block_max[:-1]:
            self.block_start.append(jnp.maximum(self.block_start[-1], block_max))


# -------------------------------------------------------------------------------- kernels


def key_summary_kernel(
    k_ref, v_ref, valid_ref, w_ref, b_ref, max_ref, sum_ref, count_ref, *, spec, matmul_dtype
):
    """A chunk's key maximum d ``(1, F)``, sum_j f_j exp(lb_j - d) v_j^T ``(F, P)`` and
    sum_j f_j exp(lb_j - d) ``(1, F)`` (f the key factors)."""
    form = spec.load(w_ref, b_ref)
    valid = valid_ref[...] > 0
    logs, fb = form.features(k_ref[...], "key")
    lb = jnp.where(valid, logs, log_floor(jnp.float32))
    top = jnp.max(lb, axis=0, keepdims=True)
    factors = jnp.where(valid, _times(fb, jnp.exp(lb - top)), 0)
    values = jnp.where(valid, v_ref[...].astype(jnp.float32), 0)
    max_ref[...] = top
    sum_ref[...] = _dot(factors.T, values, matmul_dtype)
    count_ref[...] = jnp.sum(factors, axis=0, keepdims=True)


def _key_row_scales(x: _ChunkRows, start: jax.Array) -> list[jax.Array]:
    """c_t ``(B, 1)`` per block: the running maximum over the keys j <= t (from the chunk's
    ``start``) of their largest log-feature max_i lb_ji, the per-key shift of the XLA form."""
    running = jnp.max(start, axis=1, keepdims=True)  # (1, 1)
    scales = []
    for lb in x.lb:
        own = jnp.max(lb, axis=1, keepdims=True).T  # (1, B)
        before = jnp.where(_causal_mask(lb.shape[0])[:, :, 0], own, -jnp.inf)
        scales.append(jnp.maximum(jnp.max(before, axis=1, keepdims=True), running))
        running = jnp.maximum(running, jnp.max(own, axis=1, keepdims=True))
    return scales


def output_kernel(
    q_ref,
    k_ref,
    v_ref,
    valid_ref,
    w_ref,
    b_ref,
    start_ref,
    state_ref,
    count_ref,
    num_ref,
    den_ref,
    shift_ref,
    scale_ref,
    *,
    spec,
    matmul_dtype,
):
    """One chunk's numerator ``(C, P)``, denominator ``(C, 1)``, row shifts M_t ``(C, 1)`` and
    the XLA form's row scales max_i la_ti + c_t ``(C, 1)`` (``_key_row_scales``)."""
    form = spec.load(w_ref, b_ref)
    start, state, count = start_ref[...], state_ref[...], count_ref[...]
    blocks = q_ref.shape[0] // LOG_BLOCK
    x = _ChunkRows(form, (q_ref, k_ref, v_ref, valid_ref), 0, blocks, start)
    key_scales = _key_row_scales(x, start)
    for s in range(blocks):
        la, fa = x.la[s], x.fa[s]
        row_shift = _row_shift(la, x.lb[s], x.block_start[s])
        terms = _pair_terms(_block_weights(la, x.lb[s], row_shift), fa, x.fb[s])
        weights = jnp.sum(terms, axis=2)
        num = jnp.dot(weights, x.v[s], preferred_element_type=jnp.float32)
        den = jnp.sum(weights * x.ones[s], axis=1, keepdims=True)
        for earlier in range(s):
            reference = x.block_max[earlier]
            query = _times(fa, jnp.exp(la + reference - row_shift))
            key = _times(x.fb[earlier], jnp.exp(x.lb[earlier] - reference))
            scores = _dot(query, key, matmul_dtype, transpose_b=True)
            num = num + _dot(scores, x.v[earlier], matmul_dtype)
            den = den + jnp.sum(scores * x.ones[earlier], axis=1, keepdims=True)
        query = _times(fa, jnp.exp(la + start - row_shift))
        num = num + _dot(query, state, matmul_dtype)
        den = den + jnp.sum(query * count, axis=1, keepdims=True)
        rows = pl.ds(s * LOG_BLOCK, LOG_BLOCK)
        num_ref[rows, :] = num
        den_ref[rows, :] = den
        shift_ref[rows, :] = row_shift
        scale_ref[rows, :] = jnp.max(la, axis=1, keepdims=True) + key_scales[s]


def query_summary_kernel(
    q_ref,
    w_ref,
    b_ref,
    reference_ref,
    shift_ref,
    grad_ref,
    grad_den_ref,
    sum_ref,
    count_ref,
    *,
    spec,
    matmul_dtype,
):
    """sum_t f_t exp(la_t + r - M_t) [G_t, g_t]^T over a chunk's rows (f the query factors),
    for a reference r ``(1, F)``: ``(F, P)`` and ``(1, F)``."""
    form = spec.load(w_ref, b_ref)
    la, fa = form.features(q_ref[...], "query")
    factors = _times(fa, jnp.exp(la + reference_ref[...] - shift_ref[...]))
    sum_ref[...] = _dot(factors.T, grad_ref[...], matmul_dtype)
    count_ref[...] = jnp.sum(factors * grad_den_ref[...], axis=0, keepdims=True)


class _Gradients:
    """Cotangents of one side's log-features and factors, per block: a term f exp(l) with the
    cotangent dterm gives l the cotangent f exp(l) dterm and f the cotangent exp(l) dterm
    (factors ``None``: l's only)."""

    def __init__(self, logs: list[jax.Array], factors: list):
        self.logs = [jnp.zeros_like(x) for x in logs]
        self.factors: list[Any] = [None if f is None else jnp.zeros_like(f) for f in factors]

    def add(self, s: int, factor, exponential: jax.Array, grad_term: jax.Array) -> None:
        """Block s's term ``factor * exponential`` (``(B, F)``) gets the cotangent
        ``grad_term``."""
        scaled = exponential * grad_term
        self.logs[s] = self.logs[s] + _times(factor, scaled)
        if factor is not None:
            self.factors[s] = self.factors[s] + scaled

    def add_pairs(self, s: int, weights, own, other, products, axis: int) -> None:
        """Block s's share of the within-block terms ``_pair_terms(weights, ...)`` ``(B, B, F)``
        with cotangents ``products`` ``(B, B)``: summed over ``axis`` (1 for the queries, whose
        factors are ``own``, 0 for the keys); ``other`` is the other side's factors."""
        weighted = weights * (products[:, :, None])
        if own is None:
            self.logs[s] = self.logs[s] + jnp.sum(weighted, axis=axis)
            return
        other = other[None, :, :] if axis == 1 else other[:, None, :]
        scaled = jnp.sum(weighted * other, axis=axis)
        self.logs[s] = self.logs[s] + own * scaled
        self.factors[s] = self.factors[s] + scaled


def cotangent_kernel(
    q_ref,
    k_ref,
    v_ref,
    valid_ref,
    w_ref,
    b_ref,
    start_ref,
    end_ref,
    state_ref,
    count_ref,
    later_ref,
    later_count_ref,
    shift_ref,
    grad_ref,
    grad_den_ref,
    dq_ref,
    dk_ref,
    dv_ref,
    dw_ref,
    db_ref,
    *,
    spec,
    matmul_dtype,
):
    """The cotangents of a group of chunks: rows (dq, dk ``(C, H)``, dv ``(C, P)`` per chunk)
    and the map's parameters' (dW, and db or dT, summed over the group)."""
    form = spec.load(w_ref, b_ref)
    blocks = CHUNK // LOG_BLOCK
    chunks = q_ref.shape[0] // CHUNK

    def chunk_step(c, totals):
        offset = c * CHUNK
        start, end = start_ref[c], end_ref[c]  # (1, F)
        x = _ChunkRows(form, (q_ref, k_ref, v_ref, valid_ref), offset, blocks, start)
        grads, grads_den, shifts = [], [], []
        for s in range(blocks):
            rows = pl.ds(offset + s * LOG_BLOCK, LOG_BLOCK)
            grads.append(grad_ref[rows, :].astype(jnp.float32))
            grads_den.append(grad_den_ref[rows, :].astype(jnp.float32))
            shifts.append(shift_ref[rows, :])
        grad_a = _Gradients(x.la, x.fa)
        grad_b = _Gradients(x.lb, x.fb)
        grad_v = [jnp.zeros_like(v) for v in x.v]
        state, count = state_ref[c], count_ref[c]
        later, later_count = later_ref[c], later_count_ref[c]
        for s in range(blocks):
            la, fa, grad, grad_den, row_shift = x.la[s], x.fa[s], grads[s], grads_den[s], shifts[s]
            # D_tj = G_t . [v_j, 1] within the block (1 for the keys that count).
            products = jnp.dot(grad, x.v[s].T, preferred_element_type=jnp.float32)
            products = products + grad_den * x.ones[s]
            # Selected for j <= t: a later key's product (huge or inf, e.g. the floored
            # normaliser's cotangent of a row without keys) never meets its 0 weight.
            products = jnp.where(_causal_mask(LOG_BLOCK)[:, :, 0], products, 0)
            weights = _block_weights(la, x.lb[s], row_shift)
            terms = _pair_terms(weights, fa, x.fb[s])
            grad_a.add_pairs(s, terms if fa is None else weights, fa, x.fb[s], products, 1)
            grad_b.add_pairs(s, terms if fa is None else weights, x.fb[s], fa, products, 0)
            grad_v[s] = grad_v[s] + jnp.dot(
                jnp.sum(terms, axis=2).T, grad, preferred_element_type=jnp.float32
            )
            for earlier in range(s):
                reference = x.block_max[earlier]
                query_exp = jnp.exp(la + reference - row_shift)
                key_exp = jnp.exp(x.lb[earlier] - reference)
                query, key = _times(fa, query_exp), _times(x.fb[earlier], key_exp)
                products = _dot(grad, x.v[earlier], matmul_dtype, transpose_b=True)
                products = products + grad_den * x.ones[earlier]
                scores = _dot(query, key, matmul_dtype, transpose_b=True)
                grad_a.add(s, fa, query_exp, _dot(products, key, matmul_dtype))
                grad_b.add(earlier, x.fb[earlier], key_exp, _dot(products.T, query, matmul_dtype))
                grad_v[earlier] = grad_v[earlier] + _dot(scores.T, grad, matmul_dtype)
            read = _dot(grad, state, matmul_dtype, transpose_b=True) + grad_den * count
            grad_a.add(s, fa, jnp.exp(la + start - row_shift), read)
        grad_w, grad_aux = totals
        for s in range(blocks):
            key_exp = jnp.exp(x.lb[s] - end)
            key = _times(x.fb[s], key_exp)
            read = _dot(x.v[s], later, matmul_dtype, transpose_b=True) + later_count * x.ones[s].T
            grad_b.add(s, x.fb[s], key_exp, read)
            grad_v[s] = jnp.where(x.valid[s], grad_v[s] + _dot(key, later, matmul_dtype), 0)
            grad_lb = jnp.where(x.valid[s], grad_b.logs[s], 0)
            grad_fb = None if x.fb[s] is None else jnp.where(x.valid[s], grad_b.factors[s], 0)
            dq, dw_q, daux_q = form.backward(x.q[s], grad_a.logs[s], grad_a.factors[s], "query")
            dk, dw_k, daux_k = form.backward(x.k[s], grad_lb, grad_fb, "key")
            rows = pl.ds(offset + s * LOG_BLOCK, LOG_BLOCK)
            dq_ref[rows, :] = dq.astype(dq_ref.dtype)
            dk_ref[rows, :] = dk.astype(dk_ref.dtype)
            dv_ref[rows, :] = grad_v[s].astype(dv_ref.dtype)
            grad_w = grad_w + dw_q + dw_k
            grad_aux = grad_aux + daux_q + daux_k
        return grad_w, grad_aux

    zeros = (jnp.zeros(dw_ref.shape, jnp.float32), jnp.zeros(db_ref.shape, jnp.float32))
    grad_w, grad_aux = jax.lax.fori_loop(0, chunks, chunk_step, zeros)
    dw_ref[...] = grad_w
    db_ref[...] = grad_aux


def readout_kernel(
    q_ref,
    w_ref,
    b_ref,
    shift_ref,
    state_ref,
    count_ref,
    num_ref,
    den_ref,
    row_shift_ref,
    scale_ref,
    *,
    spec,
    matmul_dtype,
):
    """Bidirectional read-out of a chunk of queries against the keys' state ``(F, P)``,
    ``(1, F)`` relative to their per-feature maximum c ``(1, F)``: numerator, denominator,
    row shifts M_t = max_i (la_ti + c_i) and the XLA form's row scales max_i la_ti + max_i c_i."""
    form = spec.load(w_ref, b_ref)
    la, fa = form.features(q_ref[...], "query")
    shift = shift_ref[...]
    logs = la + shift
    row_shift = jnp.max(logs, axis=1, keepdims=True)
    query = _times(fa, jnp.exp(logs - row_shift))
    num_ref[...] = _dot(query, state_ref[...], matmul_dtype)
    den_ref[...] = jnp.sum(query * count_ref[...], axis=1, keepdims=True)
    row_shift_ref[...] = row_shift
    scale_ref[...] = jnp.max(la, axis=1, keepdims=True) + jnp.max(shift, axis=1, keepdims=True)


def query_cotangent_kernel(
    q_ref,
    w_ref,
    b_ref,
    shift_ref,
    state_ref,
    count_ref,
    row_shift_ref,
    grad_ref,
    grad_den_ref,
    dq_ref,
    dw_ref,
    db_ref,
    *,
    spec,
    matmul_dtype,
):
    """Bidirectional queries' cotangents over a group of chunks: the term
    f_t exp(la_t + c - M_t) gets (S G_t + z g_t), pulled back to dq, and the map's parameters'
    summed over the group."""
    form = spec.load(w_ref, b_ref)
    shift, state, count = shift_ref[...], state_ref[...], count_ref[...]

    def chunk_step(c, totals):
        rows = pl.ds(c * CHUNK, CHUNK)
        q = q_ref[rows, :]
        la, fa = form.features(q, "query")
        query_exp = jnp.exp(la + shift - row_shift_ref[rows, :])
        grad, grad_den = grad_ref[rows, :], grad_den_ref[rows, :]
        read = _dot(grad, state, matmul_dtype, transpose_b=True) + grad_den * count
        grad_a = _Gradients([la], [fa])
        grad_a.add(0, fa, query_exp, read)
        dq, dw, daux = form.backward(q, grad_a.logs[0], grad_a.factors[0], "query")
        dq_ref[rows, :] = dq.astype(dq_ref.dtype)
        grad_w, grad_aux = totals
        return grad_w + dw, grad_aux + daux

    zeros = (jnp.zeros(dw_ref.shape, jnp.float32), jnp.zeros(db_ref.shape, jnp.float32))
    dw_ref[...], db_ref[...] = jax.lax.fori_loop(0, q_ref.shape[0] // CHUNK, chunk_step, zeros)


def key_cotangent_kernel(
    k_ref,
    v_ref,
    valid_ref,
    w_ref,
    b_ref,
    shift_ref,
    grad_state_ref,
    grad_count_ref,
    dk_ref,
    dv_ref,
    dw_ref,
    db_ref,
    *,
    spec,
    matmul_dtype,
):
    """Bidirectional keys' cotangents over a group of chunks, from the state's (dS ``(F, P)``,
    dz ``(1, F)``): the term f_j exp(lb_j - c) gets (dS v_j + dz), dv_j = dS^T f_j
    exp(lb_j - c), pulled back to dk, and the map's parameters' summed over the group."""
    form = spec.load(w_ref, b_ref)
    shift, grad_state, grad_count = shift_ref[...], grad_state_ref[...], grad_count_ref[...]

    def chunk_step(c, totals):
        rows = pl.ds(c * CHUNK, CHUNK)
        k, valid = k_ref[rows, :], valid_ref[rows, :] > 0
        lb, fb = form.features(k, "key")
        key_exp = jnp.where(valid, jnp.exp(lb - shift), 0)
        fb = None if fb is None else jnp.where(valid, fb, 0)
        key = _times(fb, key_exp)
        values = jnp.where(valid, v_ref[rows, :].astype(jnp.float32), 0)
        read = _dot(values, grad_state, matmul_dtype, transpose_b=True) + grad_count
        grad_b = _Gradients([lb], [fb])
        grad_b.add(0, fb, key_exp, read)
        dk, dw, daux = form.backward(k, grad_b.logs[0], grad_b.factors[0], "key")
        dk_ref[rows, :] = dk.astype(dk_ref.dtype)
        dv_ref[rows, :] = _dot(key, grad_state, matmul_dtype).astype(dv_ref.dtype)
        grad_w, grad_aux = totals
        return grad_w + dw, grad_aux + daux

    zeros = (jnp.zeros(dw_ref.shape, jnp.float32), jnp.zeros(db_ref.shape, jnp.float32))
    dw_ref[...], db_ref[...] = jax.lax.fori_loop(0, k_ref.shape[0] // CHUNK, chunk_step, zeros)
