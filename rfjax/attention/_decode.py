"""Causal FAVOR for decoding: the recurrent ``DecodeState``, the state after a prompt in one
chunked call (``favor_prefill``), and the token-by-token steps (``favor_decode_step``)."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from rfjax._validation import as_array, check_int
from rfjax.attention._causal import map_log_features, uses_log_space_prefix
from rfjax.attention._checks import (
    FeatureMapSpec,
    HeadAxes,
    ProjectionSpec,
    check_mask,
    check_projection,
    check_qkv,
    compute_dtype,
    default_eps,
    log_floor,
    resolve_feature_map,
    resolve_stabilize,
    unwrap_projection,
)
from rfjax.attention._data_fitted import check_fitted
from rfjax.attention._favor import DEFAULT_CHUNK_SIZE, favor_attention
from rfjax.attention._head_features import (
    feature_logs,
    finite_rows,
    floored_ratio,
    has_feature_logs,
    has_signed_features,
    key_features,
    normalise,
)
from rfjax.attention._log_prefix import key_state
from rfjax.attention._prefix import weighted_outer_sum
from rfjax.features import FeatureMap
from rfjax.projections import Projection


class DecodeState(NamedTuple):
    """Recurrent state of causal FAVOR attention after t tokens (per batch and head).

    With the key features phi(k_j) = f_j exp(g_j) entrywise (for exponential maps f = 1 and g
    the log-features; otherwise f = psi and g = mu, the per-key log-scale) and the running key
    maximum c = max_{j < t} g_j (per feature for exponential maps, see ``favor_attention``):

    Attributes:
      kv_sum: S = sum_{j < t} phi(k_j) v_j^T exp(-c), shape ``(B, N, width, H_v)``, float32+.
      k_sum: z = sum_{j < t} phi(k_j) exp(-c), shape ``(B, N, width)``.
      log_offset: c, shape ``(B, N, width)`` for exponential maps (one shift per feature), else
        ``(B, N, 1)`` (a large negative stand-in before the first key; 0 for unstabilised maps).
    """

    kv_sum: jax.Array
    k_sum: jax.Array
    log_offset: jax.Array


def favor_decode_init(
    batch_size: int,
    num_heads: int,
    value_dim: int,
    projection: ProjectionSpec,
    *,
    feature_map: FeatureMapSpec = "positive",
    dtype: DTypeLike = jnp.float32,
) -> DecodeState:
    """The empty decode state (no tokens yet) for ``favor_decode_step``.

    Args:
      batch_size: B >= 1.
      num_heads: N >= 1.
      value_dim: H_v >= 1.
      projection: the projection that the steps will use (its key features fix the width).
      feature_map: as in ``favor_attention`` (its key features fix the width); decoding is
        causal, so a data-fitted map (``"oprf"``, ``"derf_*"``, ``"saderf"``) must come fitted
        on a calibration sample (``fmap.fit(key, queries, keys)``).
      dtype: accumulation dtype (float32 or float64; lower precisions become float32).

    Returns:
      A ``DecodeState`` of zeros with ``log_offset`` at the masked-key floor.

    Raises:
      ValueError: for sizes < 1, or an unfitted data-fitted ``feature_map``.
    """
    batch_size = check_int("batch_size", batch_size, minimum=1)
    num_heads = check_int("num_heads", num_heads, minimum=1)
    value_dim = check_int("value_dim", value_dim, minimum=1)
    dtype = compute_dtype(jnp.zeros((), dtype))
    projection, projection_axis = unwrap_projection(projection, num_heads)
    fmap, map_axis = resolve_feature_map(feature_map, num_heads)
    check_fitted(fmap)
    width = _key_width(projection, projection_axis, fmap, map_axis, dtype)
    return DecodeState(
        kv_sum=jnp.zeros((batch_size, num_heads, width, value_dim), dtype),
        k_sum=jnp.zeros((batch_size, num_heads, width), dtype),
        log_offset=jnp.full(
            (batch_size, num_heads, _offset_width(fmap, width)), log_floor(dtype), dtype
        ),
    )


def _head_zero(value, axis: int | None):
    """Head 0 of a per-head pytree (axis 0), or the shared value."""
    return value if axis is None else jax.tree.map(lambda leaf: leaf[0], value)


def _key_width(
    projection: Projection,
    projection_axis: int | None,
    fmap: FeatureMap,
    map_axis: int | None,
    dtype: jnp.dtype,
) -> int:
    """The width of the key features (the state's feature axis), from shapes only."""
    single_projection = _head_zero(projection, projection_axis)
    single_map = _head_zero(fmap, map_axis)
    probe = jax.ShapeDtypeStruct((1, projection.dim), dtype)
    return jax.eval_shape(
        lambda x: single_map.features(x, single_projection, side="key"), probe
    ).shape[-1]


def _offset_width(fmap: FeatureMap, width: int) -> int:
    """The width of ``log_offset``: one shift per feature (exponential maps) or per head."""
    return width if has_feature_logs(fmap) else 1


def _check_state(
    state: DecodeState, shape: tuple[int, int, int, int], fmap: FeatureMap
) -> DecodeState:
    """The state's arrays must have the shapes ``favor_decode_init`` gives for (B, N, width,
    H_v) = ``shape`` and ``fmap``."""
    offset = (*shape[:2], _offset_width(fmap, shape[2]))
    expected = (shape, shape[:3], offset)  # kv_sum, k_sum, log_offset
    actual = tuple(jnp.shape(x) for x in state)
    if actual != expected:
        raise ValueError(
            f"state does not match this step: (B, N, width, H_v) = {shape} (batch, heads, key "
            f"feature width of the projection and feature map, value dim) needs shapes "
            f"kv_sum {expected[0]}, k_sum {expected[1]}, log_offset "
            f"{expected[2]}; got {actual[0]}, {actual[1]}, {actual[2]} "
            f"(make it with favor_decode_init and the same projection and feature_map)"
        )
    return state


def favor_prefill(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    projection: ProjectionSpec,
    *,
    feature_map: FeatureMapSpec = "positive",
    mask: jax.Array | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    stabilize: bool | None = None,
    eps: float | None = None,
    implementation: str = "auto",
) -> tuple[jax.Array, DecodeState]:
    """Causal FAVOR over a prompt and the ``DecodeState`` after it, in one chunked pass.

    The output is ``favor_attention(..., causal=True)``'s (the chunked causal form, not a step
    per token). The state is the sum over the T prompt tokens, with phi_K(k_j) = f_j exp(g_j)
    (``DecodeState``) and the shift c = max_{j < T} g_j over the unmasked keys (per feature for
    exponential maps):

      S = sum_j f_j exp(g_j - c) v_j^T,   z = sum_j f_j exp(g_j - c),

    summed chunk by chunk (exponential maps: ``_log_prefix.key_state``, the features formed
    per chunk from the keys; others: ``_prefix.weighted_outer_sum``). ``favor_decode_step``
    continues from it: T steps from ``favor_decode_init`` reach the same state up to rounding,
    and a step after the prompt equals position T of causal FAVOR over prompt and token. An
    unmasked key or value that is not finite makes the state NaN (every later output attends
    to it, as in ``favor_attention``). The state is for decoding, not differentiated.

    Args:
      query: ``(B, T, N, H)``.
      key: ``(B, T, N, H)``.
      value: ``(B, T, N, H_v)``.
      projection: as in ``favor_attention`` (the steps that follow must use the same one).
      feature_map: as in ``favor_decode_init`` (data-fitted maps fitted beforehand).
      mask: key padding mask ``(B, T)`` (or ``(B, 1, 1, T)``), True = attend: masked keys
        enter neither the outputs nor the state.
      chunk_size: as in ``favor_attention``.
      stabilize: as in ``favor_attention``.
      eps: as in ``favor_attention``.
      implementation: as in ``favor_attention`` (the output's; the state is the XLA form's).

    Returns:
      ``(out, state)``: ``out`` of shape ``(B, T, N, H_v)`` in the inputs' dtype, and the
      ``DecodeState`` after the T tokens, accumulated in the computation dtype (float32 for
      float32 and lower precisions, float64 for float64 inputs), as ``favor_decode_init``'s.

    Raises:
      TypeError, ValueError: for arguments as in ``favor_attention`` (``causal=True``), and
        query, key and value that are not ``(B, T, N, H)``.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from rfjax import attention, projections
      >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 2, 9, 4, 8))
      >>> w = projections.orthogonal(jax.random.key(1), 8, 32)
      >>> out, state = attention.favor_prefill(q[:, :8], k[:, :8], v[:, :8], w)
      >>> _, last = attention.favor_decode_step(state, q[:, 8], k[:, 8], v[:, 8], w)
      >>> full = attention.favor_attention(q, k, v, w, causal=True)
      >>> bool(jnp.allclose(last, full[:, 8], atol=1e-5))
      True

    References:
      Choromanski et al., "Rethinking Attention with Performers", arXiv:2009.14794, App. B.1
      (the causal prefix sums whose last state this is).
    """
    if jnp.ndim(query) != 4:
        raise ValueError(
            f"favor_prefill takes batched (B, T, N, H) arrays (the state is per batch "
            f"element); got query of shape {jnp.shape(query)}"
        )
    out = favor_attention(
        query,
        key,
        value,
        projection,
        feature_map=feature_map,
        causal=True,
        mask=mask,
        chunk_size=chunk_size,
        stabilize=stabilize,
        eps=eps,
        implementation=implementation,
    )
    batch, length, num_heads, head_dim = jnp.shape(key)
    if length == 0:  # no keys: the empty state
        dtype = compute_dtype(jnp.asarray(key), jnp.asarray(value))
        return out, favor_decode_init(
            batch, num_heads, jnp.shape(value)[-1], projection, feature_map=feature_map, dtype=dtype
        )
    projection, projection_axis = check_projection(projection, head_dim, num_heads)
    fmap, map_axis = resolve_feature_map(feature_map, num_heads)
    state = _prefill_state(
        key,
        value,
        check_mask(mask, batch, length),
        projection,
        fmap,
        axes=(projection_axis, map_axis),
        stabilize=resolve_stabilize(stabilize, fmap),
        chunk_size=check_int("chunk_size", chunk_size, minimum=1),
    )
    return out, state


@functools.partial(jax.jit, static_argnames=("axes", "stabilize", "chunk_size"))
def _prefill_state(
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array,
    projection: Projection,
    fmap: FeatureMap,
    *,
    axes: HeadAxes,
    stabilize: bool,
    chunk_size: int,
) -> DecodeState:
    dtype = compute_dtype(key, value)
    floor = log_floor(dtype)

    def head(k, v, valid, proj, f):
        # k: (T, H), v: (T, H_v), valid: (T,) -> kv_sum (width, H_v), k_sum (width,), offset.
        k, v = normalise(k.astype(dtype)), v.astype(dtype)
        usable = valid & finite_rows(k) & finite_rows(v)
        # The denominator's column: 1 for the keys that count.
        counted = jnp.concatenate(
            [jnp.where(usable[:, None], v, 0), usable[:, None].astype(dtype)], axis=-1
        )
        if uses_log_space_prefix(f, stabilize):  # one shift per feature, c = max_j l(k_j)
            k = jnp.where(usable[:, None], k, 0)
            sums, offset = key_state(
                (proj, f), k, counted, usable, log_features=map_log_features, chunk=chunk_size
            )
        else:  # one shift per key: phi(k_j) = psi_j exp(mu_j), c = max_j mu_j
            factor, log = key_features(k, usable, proj, f, stabilize, floor, per_feature=False)
            offset = jax.lax.stop_gradient(jnp.max(log, axis=0, initial=floor))
            sums = weighted_outer_sum(factor, counted, log[:, 0] - offset[0], chunk_size)
        # An unmasked key or value that is not finite makes every later output NaN, as in
        # favor_attention: the state after it is NaN.
        sums = jnp.where(jnp.any(valid & ~usable), jnp.nan, sums)
        width = _offset_width(f, sums.shape[0])
        return sums[:, :-1], sums[:, -1], jnp.broadcast_to(offset, (width,))

    over_heads = jax.vmap(head, in_axes=(1, 1, None, *axes))
    over_batch = jax.vmap(over_heads, in_axes=(0, 0, 0, None, None))
    return DecodeState(*over_batch(key, value, mask, projection, fmap))


def favor_decode_step(
    state: DecodeState,
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    projection: ProjectionSpec,
    *,
    feature_map: FeatureMapSpec = "positive",
    mask: jax.Array | None = None,
    stabilize: bool | None = None,
    eps: float | None = None,
) -> tuple[DecodeState, jax.Array]:
    """One step of causal FAVOR attention: add token t's key/value, attend with its query.

    With phi_K(k_t) = f_t exp(g_t) entrywise (``DecodeState``; unstabilised f = phi and g = 0),
    c' = max(c, g_t) (entrywise) and M_t the largest entry of log phi(q_t) + c' (a shift that
    cancels; for maps with one shift per head, phi(q_t) is the query's stabilised features):

      S' = exp(c - c') S + f_t exp(g_t - c') v_t^T,   z' = exp(c - c') z + f_t exp(g_t - c'),
      out_t = a_t S' / max(a_t . z', eps),   a_t = phi(q_t) exp(c' - M_t),

    which equals position t of ``favor_attention(..., causal=True)`` over the whole sequence, up
    to rounding (the summation order differs).

    Args:
      state: the ``DecodeState`` after tokens < t (``favor_decode_init`` for t = 0).
      query: ``(B, N, H)``, the query of token t.
      key: ``(B, N, H)``.
      value: ``(B, N, H_v)``.
      projection: as in ``favor_attention`` (the same one at every step).
      feature_map: as in ``favor_decode_init`` (data-fitted maps fitted beforehand).
      mask: ``(B,)`` bool, whether token t's key is attended to (False: the state is unchanged).
      stabilize: as in ``favor_attention``.
      eps: as in ``favor_attention``.

    Returns:
      ``(new_state, out_t)`` with ``out_t`` of shape ``(B, N, H_v)`` in the inputs' dtype.

    Raises:
      TypeError: for a ``state`` that is not a ``DecodeState``, or arguments as in
        ``favor_attention``.
      ValueError: for a ``state`` whose shapes do not match the batch, heads, key feature
        width and value dim of this step (naming expected and actual shapes), an unfitted
        data-fitted ``feature_map``, or arguments as in ``favor_attention``.
    """
    if not isinstance(state, DecodeState):
        raise TypeError(f"state must be a DecodeState, got {type(state).__name__}")
    query, key, value, _ = check_qkv(query[:, None], key[:, None], value[:, None], causal=True)
    batch, _, num_heads, head_dim = key.shape
    if mask is not None:
        mask = as_array("mask", mask)
        if mask.ndim != 1:
            raise ValueError(f"mask must be a (B,) = ({batch},) bool array; got shape {mask.shape}")
    mask = check_mask(None if mask is None else mask[:, None], batch, 1)[:, 0]
    projection, projection_axis = check_projection(projection, head_dim, num_heads)
    fmap, map_axis = resolve_feature_map(feature_map, num_heads)
    check_fitted(fmap)
    width = _key_width(projection, projection_axis, fmap, map_axis, state.kv_sum.dtype)
    state = _check_state(state, (batch, num_heads, width, value.shape[-1]), fmap)
    return _favor_decode_step(
        state,
        query[:, 0],
        key[:, 0],
        value[:, 0],
        mask,
        projection,
        fmap,
        axes=(projection_axis, map_axis),
        stabilize=resolve_stabilize(stabilize, fmap),
        eps=default_eps(eps, state.kv_sum.dtype, signed=has_signed_features(fmap)),
    )


@functools.partial(jax.jit, static_argnames=("axes", "stabilize", "eps"))
def _favor_decode_step(
    state: DecodeState,
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    mask: jax.Array,
    projection: Projection,
    fmap: FeatureMap,
    *,
    axes: HeadAxes,
    stabilize: bool,
    eps: float,
) -> tuple[DecodeState, jax.Array]:
    out_dtype = jnp.result_type(query.dtype, key.dtype, value.dtype)
    dtype = state.kv_sum.dtype
    floor = log_floor(dtype)

    def head(kv_sum, k_sum, offset, q, k, v, valid, proj, f):
        # q, k: (H,), v: (H_v,), kv_sum: (m, H_v), k_sum: (m,), offset: (m,) or (1,), valid: ().
        q, k = normalise(q.astype(dtype)), normalise(k.astype(dtype))
        v = v.astype(dtype)
        query_factor, query_log = feature_logs(
            q[None], proj, f, stabilize, has_feature_logs(f), "query"
        )
        key_factor, key_log = key_features(
            k[None], valid[None], proj, f, stabilize, floor, per_feature=has_feature_logs(f)
        )
        v = jnp.where(valid, v, 0)
        new_offset = jnp.maximum(offset, key_log[0])
        old_factor = jnp.exp(offset - new_offset)
        key_features_t = key_factor[0] * jnp.exp(key_log[0] - new_offset)
        kv_sum = old_factor[:, None] * kv_sum + key_features_t[:, None] * v[None, :]
        k_sum = old_factor * k_sum + key_features_t
        log = query_log[0] + new_offset
        phi_q = query_factor[0] * jnp.exp(log - jax.lax.stop_gradient(jnp.max(log)))
        out = floored_ratio(phi_q @ kv_sum, phi_q @ k_sum, eps)
        return kv_sum, k_sum, new_offset, out

    over_heads = jax.vmap(head, in_axes=(0, 0, 0, 0, 0, 0, None, *axes))
    over_batch = jax.vmap(over_heads, in_axes=(0, 0, 0, 0, 0, 0, 0, None, None))
    kv_sum, k_sum, offset, out = over_batch(
        state.kv_sum, state.k_sum, state.log_offset, query, key, value, mask, projection, fmap
    )
    return DecodeState(kv_sum, k_sum, offset), out.astype(out_dtype)
