"""FAVOR attention: bidirectional, causal (chunked prefix sums), padding masks, decoding."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rfjax._validation import check_int, check_key, check_real
from rfjax.attention._feature_maps import (
    FEATURE_MAPS,
    ExponentialFeatureMap,
)
from rfjax.attention._prefix import causal_prefix
from rfjax.features._common import check_projection
from rfjax.projections import Projection
from rfjax.projections import get as get_coupling

FeatureMap = Callable[[jax.Array, Projection], jax.Array]
FeatureMapSpec = str | FeatureMap | tuple[FeatureMap | str, FeatureMap | str]

DEFAULT_CHUNK_SIZE = 128
# Positions per block of the bidirectional path (keys and queries); see _bidirectional_attention.
BIDIRECTIONAL_BLOCK = 512


# --------------------------------------------------------------------------- argument checks


def _resolve_map(name: str, spec: object) -> FeatureMap:
    if isinstance(spec, str):
        if spec not in FEATURE_MAPS:
            raise ValueError(
                f"{name} must be one of {', '.join(map(repr, FEATURE_MAPS))} or a callable "
                f"(x, projection) -> features; got {spec!r}"
            )
        return FEATURE_MAPS[spec]
    if not callable(spec):
        raise TypeError(
            f"{name} must be a name, a callable (x, projection) -> features, or a pair "
            f"(query_map, key_map); got {type(spec).__name__}"
        )
    return spec


def _resolve_maps(feature_map: object) -> tuple[FeatureMap, FeatureMap]:
    if isinstance(feature_map, tuple):
        if len(feature_map) != 2:
            raise ValueError(
                f"feature_map as a tuple must be (query_map, key_map), got {len(feature_map)} "
                "entries"
            )
        return (
            _resolve_map("feature_map[0]", feature_map[0]),
            _resolve_map("feature_map[1]", feature_map[1]),
        )
    fmap = _resolve_map("feature_map", feature_map)
    return fmap, fmap


def _resolve_stabilize(stabilize: object, maps: tuple[FeatureMap, FeatureMap]) -> tuple[bool, bool]:
    """(stabilise queries, stabilise keys)."""
    exponential = tuple(isinstance(f, ExponentialFeatureMap) for f in maps)
    if stabilize is None:
        return exponential  # type: ignore[return-value]
    if not isinstance(stabilize, bool):
        raise TypeError(f"stabilize must be None or a bool, got {stabilize!r}")
    if stabilize and not all(exponential):
        raise ValueError(
            "stabilize=True needs exponential feature maps (ExponentialFeatureMap, e.g. "
            "'softmax'); got " + ", ".join(type(f).__name__ for f in maps)
        )
    return stabilize, stabilize


def _check_array(name: str, x: object) -> jax.Array:
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating array, got dtype {x.dtype}")
    return x


def _check_qkv(
    query: object, key: object, value: object, *, causal: bool
) -> tuple[jax.Array, jax.Array, jax.Array, bool]:
    """Validates BTNH query/key/value (or TNH, given a batch axis); returns them and 'unbatched'."""
    query, key, value = (
        _check_array(n, x) for n, x in (("query", query), ("key", key), ("value", value))
    )
    ndims = {query.ndim, key.ndim, value.ndim}
    if len(ndims) != 1 or ndims.pop() not in (3, 4):
        raise ValueError(
            "query, key and value must all have shape (B, T, N, H) or all (T, N, H); got "
            f"{query.shape}, {key.shape}, {value.shape}"
        )
    unbatched = query.ndim == 3
    if unbatched:
        query, key, value = query[None], key[None], value[None]
    batch, length, heads, head_dim = query.shape
    if key.shape[0] != batch or key.shape[2:] != (heads, head_dim):
        raise ValueError(
            f"key must have shape (B, S, N, H) = ({batch}, S, {heads}, {head_dim}) to match "
            f"query {query.shape}; got {key.shape}"
        )
    if value.shape[:3] != key.shape[:3]:
        raise ValueError(
            f"value must have shape (B, S, N, H_v) with (B, S, N) = {key.shape[:3]} as key; "
            f"got {value.shape}"
        )
    if causal and key.shape[1] != length:
        raise ValueError(
            f"causal attention needs as many keys as queries; got query length {length} and "
            f"key length {key.shape[1]}"
        )
    return query, key, value, unbatched


def _check_mask(mask: object, batch: int, length: int) -> jax.Array:
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        raise TypeError(f"mask must be a boolean array (True = attend), got dtype {mask.dtype}")
    if mask.shape != (batch, length):
        raise ValueError(
            f"mask must be a key padding mask of shape (B, S) = ({batch}, {length}); got "
            f"{mask.shape}"
        )
    return mask


def _matrix_shape(projection: Projection, *, over_heads: bool) -> tuple[int, ...] | None:
    """Shape of ``matrix()`` (vmapped over the leaves' leading axis if ``over_heads``), traced
    only; ``None`` if the projection does not have that layout."""

    def matrix(p: Projection) -> jax.Array:
        return p.matrix()

    try:
        return jax.eval_shape(jax.vmap(matrix) if over_heads else matrix, projection).shape
    except (TypeError, ValueError):
        return None


def _projection_per_head(projection: object, head_dim: int, num_heads: int) -> bool:
    """Whether ``projection`` is shared (W: (m, H)) or per head (N draws stacked by vmap).

    Per head: every leaf has a leading axis N and one head's matrix is (m, H) (this also covers
    structured projections, whose ``matrix()`` does not broadcast over stacked leaves).
    """
    projection = check_projection(projection)
    stacked = _matrix_shape(projection, over_heads=True)
    if stacked is not None and len(stacked) == 3 and stacked[0] == num_heads:
        if stacked[-1] != head_dim:
            raise ValueError(
                f"projection must have dim == head_dim H = {head_dim}; got per-head matrices "
                f"of shape {stacked}"
            )
        return True
    shared = _matrix_shape(projection, over_heads=False)
    if shared is not None and len(shared) == 2:
        if shared[-1] != head_dim:
            raise ValueError(
                f"projection must have dim == head_dim H = {head_dim}; got a projection of "
                f"shape {shared}"
            )
        return False
    raise ValueError(
        f"projection must be shared over heads (matrix (m, H)) or one per head (N = "
        f"{num_heads} draws stacked with jax.vmap, matrix (N, m, H)); got matrix shape "
        f"{shared or stacked}"
    )


def _compute_dtype(*arrays: jax.Array) -> jnp.dtype:
    """At least float32: low-precision inputs are accumulated in float32."""
    return jnp.result_type(jnp.float32, *(x.dtype for x in arrays))


def _log_floor(dtype: jnp.dtype) -> float:
    """A finite stand-in for -inf log-scales (masked keys); differences never overflow."""
    return -0.25 * float(jnp.finfo(dtype).max)


def _default_eps(eps: float | None, dtype: jnp.dtype) -> float:
    if eps is None:
        return float(jnp.finfo(dtype).tiny)
    return check_real("eps", eps, positive=True)


# --------------------------------------------------------------------------- per-head pieces


def _query_features(
    query: jax.Array, projection: Projection, fmap: FeatureMap, stabilize: bool
) -> jax.Array:
    """phi(q) (T, m); stabilised: exp(l(q) - max_i l_i(q)), largest entry exactly 1."""
    if not stabilize:
        return fmap(query, projection)
    logs = fmap.log_features(query, projection)  # type: ignore[attr-defined]
    return jnp.exp(logs - jax.lax.stop_gradient(jnp.max(logs, axis=-1, keepdims=True)))


def _key_features(
    key: jax.Array,
    valid: jax.Array,
    projection: Projection,
    fmap: FeatureMap,
    stabilize: bool,
    floor: float,
) -> tuple[jax.Array, jax.Array]:
    """(psi (S, m), mu (S,)) with phi(k_j) = psi_j exp(mu_j); masked keys: psi = 0, mu = floor.

    Stabilised, mu_j = max_i l_i(k_j) (a constant under differentiation) and the largest entry of
    psi_j is 1; otherwise psi = phi and mu = 0. Masked keys are zeroed before the map, so padding
    holding garbage cannot create NaNs (not even in gradients).
    """
    key = jnp.where(valid[:, None], key, 0)
    if stabilize:
        logs = fmap.log_features(key, projection)  # type: ignore[attr-defined]
        mu = jax.lax.stop_gradient(jnp.max(logs, axis=-1))
        psi = jnp.exp(logs - mu[:, None])
    else:
        psi = fmap(key, projection)
        mu = jnp.zeros(psi.shape[:-1], psi.dtype)
    psi = jnp.where(valid[:, None], psi, 0)
    return psi, jnp.where(valid, mu, floor)


def _normalise(numerator_and_denominator: jax.Array, eps: float) -> jax.Array:
    numerator, denominator = (
        numerator_and_denominator[..., :-1],
        numerator_and_denominator[..., -1:],
    )
    return numerator / jnp.maximum(denominator, eps)


def _head_attention(query, key, value, valid, projection, *, maps, stabilize, chunk_size, eps):
    """One head, causal: query (T, H), key (T, H), value (T, H_v), valid (T,) -> (T, H_v)."""
    floor = _log_floor(query.dtype)
    phi_q = _query_features(query, projection, maps[0], stabilize[0])
    psi_k, mu = _key_features(key, valid, projection, maps[1], stabilize[1], floor)
    value = jnp.where(valid[:, None], value, 0)  # NaN/inf padding must not reach 0 * v
    value_ones = jnp.concatenate([value, jnp.ones((*value.shape[:-1], 1), value.dtype)], axis=-1)
    running_max = jax.lax.cummax(mu, axis=0)
    out = causal_prefix(phi_q, psi_k, value_ones, mu, running_max, chunk_size)
    return _normalise(out, eps)


def _rowwise(fn, x, projection, per_head):
    """fn (rows, H) -> (rows, width) on BTNH ``x`` without leaving its layout: one call on the
    flattened rows (shared projection) or one per head (vmapped over N)."""
    batch, length, heads, dim = x.shape
    if per_head:
        out = jax.vmap(fn, in_axes=(1, 0), out_axes=1)(x.reshape(-1, heads, dim), projection)
    else:
        out = fn(x.reshape(-1, dim), projection)
    return out.reshape(batch, length, heads, -1)


def _in_blocks(x: jax.Array, block: int, fill: object = 0) -> jax.Array:
    """(B, T, ...) -> (T'/block, B, block, ...), T padded with ``fill`` to a multiple T'."""
    batch, length = x.shape[:2]
    padded = -(-length // block) * block
    widths = [(0, 0), (0, padded - length)] + [(0, 0)] * (x.ndim - 2)
    x = jnp.pad(x, widths, constant_values=fill)
    return x.reshape(batch, padded // block, block, *x.shape[2:]).swapaxes(0, 1)


def _key_value_summary(key, value, mask, projection, *, fmap, stabilize, per_head, block):
    """(S = sum_j psi_j v_j^T (B, N, m, H_v), z = sum_j psi_j (B, N, m)), one block of keys at a
    time (a scan), so each block's features are contracted while they are in cache.

    Stabilised, psi_j = exp(l(k_j) - c) with c the running maximum of l over the keys seen so
    far (per batch and head, a constant under differentiation); when c grows, the carried sums
    are rescaled by exp(c_old - c_new) <= 1, as in online softmax. At the end c is the maximum
    over all unmasked keys, the Performer's global key shift. Masked keys are zeroed before the
    map and get psi = 0, so garbage padding cannot create NaNs.
    """
    batch, _, heads, _ = key.shape
    floor = _log_floor(key.dtype)

    def step(carry, blocks):
        kv, k_sum, shift = carry
        k, v, valid = blocks
        valid = valid[:, :, None, None]
        k = jnp.where(valid, k, 0)
        v = jnp.where(valid, v, 0)  # NaN/inf padding must not reach 0 * v
        if stabilize:
            logs = jnp.where(valid, _rowwise(fmap.log_features, k, projection, per_head), floor)
            new_shift = jax.lax.stop_gradient(jnp.maximum(shift, jnp.max(logs, axis=(1, 3))))
            rescale = jnp.exp(shift - new_shift)
            kv, k_sum = kv * rescale[..., None, None], k_sum * rescale[..., None]
            psi = jnp.exp(logs - new_shift[:, None, :, None])
        else:
            psi, new_shift = _rowwise(fmap, k, projection, per_head), shift
        psi = jnp.where(valid, psi, 0)
        kv = kv + jnp.einsum("bcnm,bcnh->bnmh", psi, v)
        return (kv, k_sum + jnp.sum(psi, axis=1), new_shift), None

    width = jax.eval_shape(lambda k: _rowwise(fmap, k, projection, per_head), key[:, :1]).shape
    init = (
        jnp.zeros((batch, heads, width[-1], value.shape[-1]), key.dtype),
        jnp.zeros((batch, heads, width[-1]), key.dtype),
        jnp.full((batch, heads), floor, key.dtype),
    )
    xs = (_in_blocks(key, block), _in_blocks(value, block), _in_blocks(mask, block, False))
    (kv, k_sum, _), _ = jax.lax.scan(step, init, xs)
    return kv, k_sum


def _bidirectional_attention(
    query, key, value, mask, projection, *, maps, stabilize, eps, per_head, block
):
    """All heads, BTNH in and out: phi_Q(Q) (psi_K(K)^T V) / phi_Q(Q) (psi_K(K)^T 1).

    Keys and queries are processed in blocks of ``block`` positions (the key sums by a scan,
    see ``_key_value_summary``; the read-out by ``lax.map`` over query blocks), contracting in
    BTNH layout: on CPU this keeps each block's features in cache instead of streaming (T, N, m)
    tensors through memory three times.
    """
    kv, k_sum = _key_value_summary(
        key,
        value,
        mask,
        projection,
        fmap=maps[1],
        stabilize=stabilize[1],
        per_head=per_head,
        block=block,
    )

    def read_out(q):
        phi_q = _rowwise(
            lambda x, p: _query_features(x, p, maps[0], stabilize[0]), q, projection, per_head
        )
        numerator = jnp.einsum("btnm,bnmh->btnh", phi_q, kv)
        denominator = jnp.einsum("btnm,bnm->btn", phi_q, k_sum)
        return numerator / jnp.maximum(denominator, eps)[..., None]

    batch, length = query.shape[:2]
    out = jax.lax.map(read_out, _in_blocks(query, block))
    return out.swapaxes(0, 1).reshape(batch, -1, *out.shape[3:])[:, :length]


def _over_batch_and_heads(fn, per_head: bool, num_args: int):
    """vmaps a per-head fn(q, k, v, valid, projection) over B (axis 0) and N (axis 1 of TNH)."""
    head_axes = (1,) * (num_args - 2) + (None, 0 if per_head else None)
    over_heads = jax.vmap(fn, in_axes=head_axes, out_axes=1)
    return jax.vmap(over_heads, in_axes=(0,) * (num_args - 1) + (None,))


@functools.partial(
    jax.jit,
    static_argnames=("maps", "stabilize", "causal", "chunk_size", "eps", "per_head"),
)
def _favor_attention(
    query, key, value, mask, projection, *, maps, stabilize, causal, chunk_size, eps, per_head
):
    out_dtype = jnp.result_type(query.dtype, key.dtype, value.dtype)
    dtype = _compute_dtype(query, key, value)
    query, key, value = (x.astype(dtype) for x in (query, key, value))
    if not causal:
        return _bidirectional_attention(
            query,
            key,
            value,
            mask,
            projection,
            maps=maps,
            stabilize=stabilize,
            eps=eps,
            per_head=per_head,
            block=min(BIDIRECTIONAL_BLOCK, max(query.shape[1], key.shape[1])),
        ).astype(out_dtype)
    head = functools.partial(
        _head_attention,
        maps=maps,
        stabilize=stabilize,
        chunk_size=chunk_size,
        eps=eps,
    )
    return _over_batch_and_heads(head, per_head, 5)(query, key, value, mask, projection).astype(
        out_dtype
    )


# --------------------------------------------------------------------------- public API


def favor_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    projection: Projection,
    *,
    feature_map: FeatureMapSpec = "softmax",
    causal: bool = False,
    mask: jax.Array | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    stabilize: bool | None = None,
    eps: float | None = None,
) -> jax.Array:
    """FAVOR linear attention: softmax-like attention through random features in O(T m).

    For each batch b and head n, with feature maps phi_Q, phi_K (``feature_map``),

      out_t = sum_{j in A(t)} s_tj v_j / sum_{j in A(t)} s_tj,   s_tj = phi_Q(q_t) . phi_K(k_j),

    where A(t) is every unmasked key (bidirectional) or every unmasked key j <= t (``causal``).
    The default map makes phi(q) . phi(k) an unbiased estimate of exp(q . k / sqrt(H)), so the
    output approximates ``softmax_attention`` with an error falling like 1/sqrt(m). Bidirectional
    attention computes phi_Q(Q) (phi_K(K)^T [V, 1]) in blocks of ``BIDIRECTIONAL_BLOCK``
    positions (a scan over key blocks accumulating the sums, then the read-out per query block),
    in O(block (m + H_v) + m H_v) temporary memory per head for the forward pass; causal
    attention runs chunked prefix sums (a scan over chunks of ``chunk_size`` carrying
    S = sum phi_K(k_j) v_j^T and z = sum phi_K(k_j), a masked C x C quadratic form within each
    chunk), in O(T (m + H_v) + C^2) memory per head,
    and a custom VJP that recomputes chunk by chunk in reverse keeps the backward pass within the
    same bound.

    Stabiliser (exponential maps only, on by default for them): the features exp(l) are formed
    as exp(l - shift) with shifts that cancel exactly in the normalised output:

    * queries: shift = max_i l_i(q_t), the row's own maximum (its largest feature becomes 1);
    * keys, bidirectional: one constant, the maximum of l over all unmasked keys of the
      sequence (as in the Performer code), reached online: the sums carried over key blocks are
      rescaled by exp(c_old - c_new) <= 1 whenever a block raises the running maximum;
    * keys, causal: the running maximum c_t = max_{j <= t} max_i l_i(k_j), applied online: the
      carried state (S, z) is kept relative to the running maximum and rescaled by
      exp(c_old - c_new) <= 1 when it grows (as in online softmax), and each key is stored as
      psi_j = exp(l(k_j) - mu_j) with its own maximum mu_j and the exact factor
      exp(mu_j - c_t) <= 1. Output t therefore depends only on positions <= t: perturbing later
      tokens leaves it bit-identical (the Performer's global key maximum would leak the future).

    Each shift is a single constant for all keys of one output row, so it cancels between
    numerator and denominator; the shifts are constants under differentiation (stop_gradient),
    which keeps gradients exact. Nothing overflows (every exponent is <= 0); keys whose scores are
    below exp(-87) (float32) of the running maximum underflow to 0, as in every stabilised
    Performer. Raw kernel estimates are not exposed here, so the stabiliser biases nothing.

    The denominator is clamped below at ``eps`` (default: the smallest normal number of the
    computation dtype), which only acts when it underflows, e.g. a query whose keys are all
    masked gets an output of 0.

    Args:
      query: ``(B, T, N, H)`` (or ``(T, N, H)``), floating.
      key: ``(B, S, N, H)``; S == T if ``causal``.
      value: ``(B, S, N, H_v)``.
      projection: a drawn ``rfjax.projections.Projection`` with ``dim == H`` and m rows, from any
        coupling. Shared by all heads (``matrix()`` of shape ``(m, H)``), or one per head: N
        draws stacked with ``jax.vmap(sampler)`` over N keys (every leaf has a leading axis N;
        see ``draw_projection``). Per-head projections cost the same and decorrelate the heads'
        errors. It is an argument, never drawn here: redraw it with ``redraw_key``.
      feature_map: ``"softmax"`` (positive features, ``SoftmaxFeatureMap()``),
        ``"softmax_antithetic"`` (width 2m), ``"relu"`` (``ReluFeatureMap()``, generalised
        attention), any callable ``(x, projection) -> features`` on ``(T, H) -> (T, width)``
        returning non-negative features, or a pair ``(query_map, key_map)`` for asymmetric maps
        (e.g. the HRF pairs ``TrigonometricFeatureMap``, ``AngularHybridFeatureMap``,
        ``ClusterHybridFeatureMap``). Signed maps can make a row's denominator <= 0: give them
        a working ``eps`` (e.g. 1e-3), which biases only the rows below it, and bounded scores
        (unit queries and keys, as ``rfjax.nn.PerformerAttention(query_key_norm=True)`` gives
        them); with raw scores about half the rows can be <= 0 (``tests/test_conformer_ctc``).
        The built-in maps scale inputs by H^{-1/4}. Maps are static arguments of the compiled
        kernel: reuse one object (not a fresh lambda per call).
      causal: attend only to keys j <= t.
      mask: key padding mask ``(B, S)`` (or ``(S,)`` if unbatched), bool, True = attend. Masked
        keys contribute nothing (their features are zeroed).
      chunk_size: chunk length C of the causal prefix sums (clipped to T).
      stabilize: ``None`` (stabilise every exponential map), ``True`` (require it) or ``False``.
      eps: floor of the denominator (> 0), default the smallest normal number.

    Returns:
      ``(B, T, N, H_v)`` (or ``(T, N, H_v)``), in the inputs' result dtype. Low-precision inputs
      (bfloat16, float16) are computed and accumulated in float32 and the output is cast back.

    Raises:
      TypeError: for non-floating inputs, a non-bool mask, a non-Projection ``projection`` or
        a feature map that is not a name or callable.
      ValueError: for mismatched shapes, an unknown feature-map name, ``stabilize=True`` with a
        non-exponential map, or ``chunk_size < 1``.

    Examples:
      >>> import jax
      >>> from rfjax import attention, projections
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 16, 4, 8))
      >>> w = projections.orthogonal(jax.random.key(1), 8, 64)
      >>> attention.favor_attention(q, k, v, w, causal=True).shape
      (2, 16, 4, 8)

    References:
      Choromanski et al., "Rethinking Attention with Performers", ICLR 2021, arXiv:2009.14794
      (FAVOR+, Sec. 2-3 and App. B.1 prefix sums); Reid et al., "Simplex Random Features", ICML
      2023, arXiv:2301.13856, Sec. 5.4 (SimRF in Performers).
    """
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    query, key, value, unbatched = _check_qkv(query, key, value, causal=causal)
    batch, key_length, num_heads, head_dim = key.shape
    if mask is None:
        mask = jnp.ones((batch, key_length), dtype=bool)
    else:
        mask = _check_mask(mask[None] if unbatched else mask, batch, key_length)
    chunk_size = check_int("chunk_size", chunk_size, minimum=1)
    maps = _resolve_maps(feature_map)
    stabilize_sides = _resolve_stabilize(stabilize, maps)
    per_head = _projection_per_head(projection, head_dim, num_heads)
    eps = _default_eps(eps, _compute_dtype(query, key, value))
    out = _favor_attention(
        query,
        key,
        value,
        mask,
        projection,
        maps=maps,
        stabilize=stabilize_sides,
        causal=causal,
        chunk_size=chunk_size if causal else 0,  # unused: one compilation for all values
        eps=eps,
        per_head=per_head,
    )
    return out[0] if unbatched else out


def favor_attention_weights(
    query: jax.Array,
    key: jax.Array,
    projection: Projection,
    *,
    feature_map: FeatureMapSpec = "softmax",
    causal: bool = False,
    mask: jax.Array | None = None,
    stabilize: bool | None = None,
    eps: float | None = None,
) -> jax.Array:
    """The attention matrix that ``favor_attention`` applies implicitly, formed explicitly.

    A_tj = phi_Q(q_t) . phi_K(k_j) / sum_{l in A(t)} phi_Q(q_t) . phi_K(k_l) for j in A(t), else
    0, with the same features and stabiliser as ``favor_attention`` (the key shift of row t is
    the maximum over A(t)). O(T S) memory: for analysis and tests (``favor_attention(q, k, v)``
    equals ``A @ v`` up to rounding).

    Args:
      query: ``(B, T, N, H)``.
      key: ``(B, S, N, H)``; S == T if ``causal``.
      projection: as in ``favor_attention``.
      feature_map: as in ``favor_attention``.
      causal: attend only to keys j <= t.
      mask: key padding mask ``(B, S)``, bool.
      stabilize: as in ``favor_attention``.
      eps: as in ``favor_attention``.

    Returns:
      Row-stochastic weights ``(B, N, T, S)`` in the computation dtype (at least float32), as
      ``jax.nn.dot_product_attention`` uses them; rows with no key are 0.
    """
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    query, key, _, unbatched = _check_qkv(query, key, key[..., :1], causal=causal)
    if unbatched:
        raise ValueError("favor_attention_weights needs batched (B, T, N, H) inputs")
    batch, key_length, num_heads, head_dim = key.shape
    if mask is None:
        mask = jnp.ones((batch, key_length), dtype=bool)
    else:
        mask = _check_mask(mask, batch, key_length)
    maps = _resolve_maps(feature_map)
    stabilize_sides = _resolve_stabilize(stabilize, maps)
    per_head = _projection_per_head(projection, head_dim, num_heads)
    eps = _default_eps(eps, _compute_dtype(query, key))
    return _favor_attention_weights(
        query,
        key,
        mask,
        projection,
        maps=maps,
        stabilize=stabilize_sides,
        causal=causal,
        eps=eps,
        per_head=per_head,
    )


@functools.partial(jax.jit, static_argnames=("maps", "stabilize", "causal", "eps", "per_head"))
def _favor_attention_weights(
    query, key, mask, projection, *, maps, stabilize, causal, eps, per_head
):
    dtype = _compute_dtype(query, key)
    floor = _log_floor(dtype)

    def head(q, k, valid, proj):
        phi_q = _query_features(q, proj, maps[0], stabilize[0])
        psi_k, mu = _key_features(k, valid, proj, maps[1], stabilize[1], floor)
        allowed = jnp.broadcast_to(valid[None, :], (q.shape[0], k.shape[0]))
        if causal:
            allowed = allowed & jnp.tril(jnp.ones(allowed.shape, dtype=bool))
        shift = jnp.max(jnp.where(allowed, mu[None, :], floor), axis=1, keepdims=True)
        factor = jnp.exp(jnp.where(allowed, mu[None, :] - shift, -jnp.inf))
        scores = (phi_q @ psi_k.T) * factor
        return scores / jnp.maximum(jnp.sum(scores, axis=1, keepdims=True), eps)

    fn = jax.vmap(
        jax.vmap(head, in_axes=(1, 1, None, 0 if per_head else None)), in_axes=(0, 0, 0, None)
    )
    return fn(query.astype(dtype), key.astype(dtype), mask, projection)


def softmax_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    *,
    causal: bool = False,
    mask: jax.Array | None = None,
) -> jax.Array:
    """Exact softmax attention softmax(q k^T / sqrt(H)) v: the reference for FAVOR.

    Same conventions as ``favor_attention`` (BTNH shapes, key padding mask, causal), computed in
    at least float32; a query with no unmasked key gets 0.

    Args:
      query: ``(B, T, N, H)``.
      key: ``(B, S, N, H)``.
      value: ``(B, S, N, H_v)``.
      causal: attend only to keys j <= t.
      mask: key padding mask ``(B, S)``, bool, True = attend.

    Returns:
      ``(B, T, N, H_v)`` in the inputs' result dtype.
    """
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    query, key, value, unbatched = _check_qkv(query, key, value, causal=causal)
    batch, key_length = key.shape[:2]
    if mask is None:
        mask = jnp.ones((batch, key_length), dtype=bool)
    else:
        mask = _check_mask(mask[None] if unbatched else mask, batch, key_length)
    out = _softmax_attention(query, key, value, mask, causal=causal)
    return out[0] if unbatched else out


@functools.partial(jax.jit, static_argnames=("causal",))
def _softmax_attention(query, key, value, mask, *, causal):
    out_dtype = jnp.result_type(query.dtype, key.dtype, value.dtype)
    dtype = _compute_dtype(query, key, value)
    query, key, value = (x.astype(dtype) for x in (query, key, value))
    logits = jnp.einsum("btnh,bsnh->bnts", query, key) / math.sqrt(query.shape[-1])
    allowed = jnp.broadcast_to(mask[:, None, None, :], logits.shape)
    if causal:
        allowed = allowed & jnp.tril(jnp.ones(logits.shape[-2:], dtype=bool))
    logits = jnp.where(allowed, logits, -jnp.inf)
    shift = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    scores = jnp.where(allowed, jnp.exp(logits - jnp.where(allowed, shift, 0)), 0)
    weights = scores / jnp.maximum(jnp.sum(scores, axis=-1, keepdims=True), 1.0e-30)
    return jnp.einsum("bnts,bsnh->btnh", weights, value).astype(out_dtype)


# --------------------------------------------------------------------------- decoding


class DecodeState(NamedTuple):
    """Recurrent state of causal FAVOR attention after t tokens (per batch and head).

    With the running key maximum c = max_{j < t} mu_j (see ``favor_attention``):

    Attributes:
      kv_sum: S = sum_{j < t} phi(k_j) v_j^T exp(-c), shape ``(B, N, width, H_v)``, float32+.
      k_sum: z = sum_{j < t} phi(k_j) exp(-c), shape ``(B, N, width)``.
      log_offset: c, shape ``(B, N)`` (a large negative stand-in before the first key; 0 for
        unstabilised maps).
    """

    kv_sum: jax.Array
    k_sum: jax.Array
    log_offset: jax.Array


def favor_decode_init(
    batch_size: int,
    num_heads: int,
    value_dim: int,
    projection: Projection,
    *,
    feature_map: FeatureMapSpec = "softmax",
    dtype: object = jnp.float32,
) -> DecodeState:
    """The empty decode state (no tokens yet) for ``favor_decode_step``.

    Args:
      batch_size: B >= 1.
      num_heads: N >= 1.
      value_dim: H_v >= 1.
      projection: the projection that the steps will use (its key features fix the width).
      feature_map: as in ``favor_attention`` (the key map fixes the width).
      dtype: accumulation dtype (float32 or float64; lower precisions become float32).

    Returns:
      A ``DecodeState`` of zeros with ``log_offset`` at the masked-key floor.
    """
    batch_size = check_int("batch_size", batch_size, minimum=1)
    num_heads = check_int("num_heads", num_heads, minimum=1)
    value_dim = check_int("value_dim", value_dim, minimum=1)
    maps = _resolve_maps(feature_map)
    dtype = _compute_dtype(jnp.zeros((), dtype))
    check_projection(projection)
    head_dim = projection.dim
    per_head = _projection_per_head(projection, head_dim, num_heads)
    probe = jax.ShapeDtypeStruct((1, head_dim), dtype)
    single = jax.tree.map(lambda x: x[0], projection) if per_head else projection
    width = jax.eval_shape(maps[1], probe, single).shape[-1]
    return DecodeState(
        kv_sum=jnp.zeros((batch_size, num_heads, width, value_dim), dtype),
        k_sum=jnp.zeros((batch_size, num_heads, width), dtype),
        log_offset=jnp.full((batch_size, num_heads), _log_floor(dtype), dtype),
    )


def favor_decode_step(
    state: DecodeState,
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    projection: Projection,
    *,
    feature_map: FeatureMapSpec = "softmax",
    mask: jax.Array | None = None,
    stabilize: bool | None = None,
    eps: float | None = None,
) -> tuple[DecodeState, jax.Array]:
    """One step of causal FAVOR attention: add token t's key/value, attend with its query.

    With mu = max_i l_i(k_t) and c' = max(c, mu) (stabilised; else mu = c = 0):

      S' = exp(c - c') S + exp(l(k_t) - c') v_t^T,   z' = exp(c - c') z + exp(l(k_t) - c'),
      out_t = phi(q_t) S' / max(phi(q_t) . z', eps),

    which equals position t of ``favor_attention(..., causal=True)`` over the whole sequence, up
    to rounding (the summation order differs).

    Args:
      state: the ``DecodeState`` after tokens < t (``favor_decode_init`` for t = 0).
      query: ``(B, N, H)``, the query of token t.
      key: ``(B, N, H)``.
      value: ``(B, N, H_v)``.
      projection: as in ``favor_attention`` (the same one at every step).
      feature_map: as in ``favor_attention``.
      mask: ``(B,)`` bool, whether token t's key is attended to (False: the state is unchanged).
      stabilize: as in ``favor_attention``.
      eps: as in ``favor_attention``.

    Returns:
      ``(new_state, out_t)`` with ``out_t`` of shape ``(B, N, H_v)`` in the inputs' dtype.
    """
    if not isinstance(state, DecodeState):
        raise TypeError(f"state must be a DecodeState, got {type(state).__name__}")
    query, key, value, _ = _check_qkv(query[:, None], key[:, None], value[:, None], causal=True)
    batch, _, num_heads, head_dim = key.shape
    if state.kv_sum.shape[:2] != (batch, num_heads) or state.kv_sum.shape[-1] != value.shape[-1]:
        raise ValueError(
            f"state of shape {state.kv_sum.shape} does not match batch {batch}, heads "
            f"{num_heads} and value dim {value.shape[-1]}"
        )
    mask = (
        jnp.ones((batch,), dtype=bool)
        if mask is None
        else _check_mask(mask[:, None], batch, 1)[:, 0]
    )
    maps = _resolve_maps(feature_map)
    stabilize_sides = _resolve_stabilize(stabilize, maps)
    per_head = _projection_per_head(projection, head_dim, num_heads)
    eps = _default_eps(eps, state.kv_sum.dtype)
    return _favor_decode_step(
        state,
        query[:, 0],
        key[:, 0],
        value[:, 0],
        mask,
        projection,
        maps=maps,
        stabilize=stabilize_sides,
        eps=eps,
        per_head=per_head,
    )


@functools.partial(jax.jit, static_argnames=("maps", "stabilize", "eps", "per_head"))
def _favor_decode_step(
    state, query, key, value, mask, projection, *, maps, stabilize, eps, per_head
):
    out_dtype = jnp.result_type(query.dtype, key.dtype, value.dtype)
    dtype = state.kv_sum.dtype
    floor = _log_floor(dtype)

    def head(kv_sum, k_sum, offset, q, k, v, valid, proj):
        # q, k: (H,), v: (H_v,), kv_sum: (m, H_v), k_sum: (m,), offset, valid: ().
        q, k, v = (x.astype(dtype) for x in (q, k, v))
        phi_q = _query_features(q[None], proj, maps[0], stabilize[0])[0]
        psi_k, mu = _key_features(k[None], valid[None], proj, maps[1], stabilize[1], floor)
        v = jnp.where(valid, v, 0)
        new_offset = jnp.maximum(offset, mu[0])
        old_factor = jnp.exp(offset - new_offset)
        key_features = psi_k[0] * jnp.exp(mu[0] - new_offset)
        kv_sum = old_factor * kv_sum + key_features[:, None] * v[None, :]
        k_sum = old_factor * k_sum + key_features
        out = (phi_q @ kv_sum) / jnp.maximum(phi_q @ k_sum, eps)
        return kv_sum, k_sum, new_offset, out

    over_heads = jax.vmap(head, in_axes=(0, 0, 0, 0, 0, 0, None, 0 if per_head else None))
    over_batch = jax.vmap(over_heads, in_axes=(0, 0, 0, 0, 0, 0, 0, None))
    kv_sum, k_sum, offset, out = over_batch(
        state.kv_sum, state.k_sum, state.log_offset, query, key, value, mask, projection
    )
    return DecodeState(kv_sum, k_sum, offset), out.astype(out_dtype)


# --------------------------------------------------------------------------- projections


def draw_projection(
    key: jax.Array,
    head_dim: int,
    num_features: int,
    *,
    coupling: str = "orthogonal",
    num_heads: int | None = None,
    dtype: object = jnp.float32,
) -> Projection:
    """Draws the projection for ``favor_attention``: shared, or one per head.

    Args:
      key: a PRNG key (e.g. from ``redraw_key``).
      head_dim: H, the projection's input dimension.
      num_features: m.
      coupling: a name from ``rfjax.projections.available()`` ("gaussian", "orthogonal",
        "simplex", "simplex_plus", ...).
      num_heads: ``None`` for one projection shared by all heads; N for independent projections
        per head (drawn with ``jax.vmap`` over ``jax.random.split(key, N)``).
      dtype: floating dtype of the projection.

    Returns:
      A ``Projection``: shared (``matrix()`` of shape ``(m, H)``), or N stacked draws (every
      leaf with a leading axis N) that ``favor_attention`` applies one per head.
    """
    check_key("key", key)
    sampler = get_coupling(coupling)
    head_dim = check_int("head_dim", head_dim, minimum=1)
    num_features = check_int("num_features", num_features, minimum=1)
    if num_heads is None:
        return sampler(key, head_dim, num_features, dtype=dtype)
    num_heads = check_int("num_heads", num_heads, minimum=1)
    keys = jax.random.split(key, num_heads)
    return jax.vmap(lambda k: sampler(k, head_dim, num_features, dtype=dtype))(keys)


def redraw_key(rng: jax.Array, step: jax.Array | int, *, redraw_interval: int) -> jax.Array:
    """The projection key for training step ``step``: fold_in(rng, step // redraw_interval).

    Features are redrawn every ``redraw_interval`` steps without hidden state: the key is a pure
    function of the base ``rng`` and the step (which may be traced), so a jitted train step can
    call ``draw_projection(redraw_key(rng, step, redraw_interval=k), ...)``.

    Args:
      rng: the base PRNG key of the attention layer.
      step: the training step, an integer (Python or array).
      redraw_interval: redraw every this many steps (>= 1).

    Returns:
      A PRNG key, constant within each interval.
    """
    check_key("rng", rng)
    redraw_interval = check_int("redraw_interval", redraw_interval, minimum=1)
    return jax.random.fold_in(rng, jnp.asarray(step) // redraw_interval)
