"""Flax attention masks read as FAVOR's key padding and causality (``favor_mask``), with the
checks of their form (``MASK_FORMS``) and values (``MASK_VALUES``)."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rfjax._validation import is_concrete

MASK_FORMS = (
    "FAVOR applies a key padding mask and causality only: mask must be a key padding mask "
    "(B, S), or a Flax mask broadcastable to (B, N, T, S) that is key padding, query padding "
    "and/or causal (nn.make_attention_mask(q_pad, k_pad), nn.make_causal_mask(x), "
    "nn.combine_masks of them), the same for every head"
)


MASK_VALUES = (
    "FAVOR applies boolean masks (True = attend) and Flax's 0/1 masks (1 = attend, as "
    "nn.make_attention_mask gives them); it cannot apply an additive mask (0 = attend, -inf or a "
    "large negative number = masked) nor weights: pass mask == 0 of an additive mask, or a "
    "boolean key padding mask (B, S)"
)


class FavorMask(NamedTuple):
    """A Flax attention mask as FAVOR applies it.

    Attributes:
      key_padding: ``(B, S)`` bool, True = attend (``None``: every key).
      causal: a Python bool when known at trace time, else a traced bool scalar (a traced mask
        whose causality is read from its values).
    """

    key_padding: jax.Array | None
    causal: bool | jax.Array


def favor_mask(
    mask: jax.Array | None,
    *,
    batch_shape: tuple[int, ...],
    num_heads: int,
    query_length: int,
    key_length: int,
    causal: bool,
) -> FavorMask:
    """Reads a Flax attention mask as key padding and causality (see ``MASK_FORMS``).

    A mask M (True or non-zero = attend) broadcastable to ``batch_shape + (N, T, S)`` is
    accepted when, with q_t = any_s M_ts and k_s = any_{n, t} M_ts, it equals
    q_t k_s (padding) or q_t k_s [s <= t] (causal, T = S): exactly the masks that
    ``nn.make_attention_mask``, ``nn.make_causal_mask`` and their ``nn.combine_masks`` give
    (the decomposition is exact for them). Query padding needs nothing from FAVOR (a query row
    never affects another), so only k and causality are kept; the rows of padded queries attend
    to the unpadded keys where Flax's own attention averages all values (both are padding).
    A 2-D mask is a key padding mask ``(B, S)``. Masks are boolean or hold only 0 and 1 (Flax's
    float masks); other values (an additive mask) raise ``ValueError`` (``MASK_VALUES``).

    A concrete mask that is neither raises ``ValueError`` here; a traced one (inside ``jit``)
    has its causality chosen at run time (``FavorMask.causal`` traced) and raises at run time
    (through ``jax.debug.callback``, a ``JaxRuntimeError`` carrying the message). A traced
    mask thus costs an O(B N T S) check, a host callback and both FAVOR variants compiled (one
    runs) per call: pass the key padding mask ``(B, S)`` and ``causal`` instead to avoid them.
    """
    if mask is None:
        return FavorMask(None, causal)
    shape = (*batch_shape, num_heads, query_length, key_length)
    mask = batched_mask(_check_mask_values(jnp.asarray(mask)), shape, forms=MASK_FORMS)
    _, heads, rows, _ = mask.shape
    if heads == 1 and rows == 1:
        return FavorMask(mask[:, 0, 0], causal)
    query_any = jnp.any(mask, axis=-1, keepdims=True)
    key_padding = jnp.any(mask, axis=(1, 2))
    padding = query_any & key_padding[:, None, None, :]
    is_padding = jnp.all(mask == padding)
    can_be_causal = rows == key_length  # a cross-attention mask (T != S) is padding or raises
    is_causal = can_be_causal and jnp.all(mask == (padding & jnp.tri(rows, dtype=bool)))
    if is_concrete(mask):
        padding_form, causal_form = bool(is_padding), bool(is_causal)
        if not (padding_form or causal_form):
            raise ValueError(f"{MASK_FORMS}; got a mask that is neither")
        return FavorMask(key_padding, causal or (causal_form and not padding_form))
    jax.debug.callback(_raise_unless_supported, is_padding | is_causal)
    if causal or not can_be_causal:
        return FavorMask(key_padding, causal)
    return FavorMask(key_padding, is_causal & ~is_padding)


def batched_mask(mask: jax.Array, shape: tuple[int, ...], *, forms: str = "") -> jax.Array:
    """A Flax attention mask over one flattened batch axis: ``(B, N or 1, T or 1, S)`` with
    B the product of ``shape``'s batch axes, ``shape = batch_shape + (N, T, S)``.

    A 2-D mask is a key padding mask ``(B, S)`` (or broadcastable to it), for both kinds of
    ``PerformerAttention`` (Flax would broadcast it as ``(T, S)``: pass such a mask with its
    batch and head axes, ``mask[None, None]``); any other is broadcast as Flax broadcasts
    it, against ``shape``, keeping a head or query axis of 1. A mask that does not broadcast
    so raises ``ValueError`` naming both shapes (after ``forms``, what the caller takes)."""
    *batch_shape, _, _, key_length = shape
    batch = math.prod(batch_shape)
    target: tuple[int, ...]
    if mask.ndim == 2:
        target = (batch, key_length)
        wanted = "a key padding mask (B, S) (a 2-D mask; pass a (T, S) mask as mask[None, None])"
    else:
        target, wanted = shape, "a mask broadcastable to batch_shape + (N, T, S)"
    try:
        fits = mask.ndim <= len(target) and jnp.broadcast_shapes(mask.shape, target) == target
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            f"{forms}{'; ' if forms else ''}mask must be {wanted} = {target}; got mask of "
            f"shape {mask.shape}"
        )
    if mask.ndim == 2:
        return jnp.broadcast_to(mask, target)[:, None, None, :]
    heads, rows = (1 if mask.ndim < n or mask.shape[-n] == 1 else shape[-n] for n in (3, 2))
    mask = jnp.broadcast_to(mask, (*batch_shape, heads, rows, key_length))
    return mask.reshape(batch, heads, rows, key_length)


def _raise_unless_supported(supported: np.ndarray) -> None:
    if not bool(supported):
        raise ValueError(f"{MASK_FORMS}; got a mask that is neither")


def _check_mask_values(mask: jax.Array) -> jax.Array:
    """``mask`` as bools, if it is boolean or holds only 0 and 1 (Flax's float masks); other
    values (an additive mask) raise ``ValueError`` (``MASK_VALUES``): here for a concrete mask,
    at run time (``jax.debug.callback``) for a traced one, at the cost of a host callback
    (boolean masks cost nothing)."""
    if mask.dtype == jnp.bool_:
        return mask
    binary = jnp.all((mask == 0) | (mask == 1))
    if is_concrete(binary):
        _raise_unless_binary(binary, mask.dtype)
    else:
        jax.debug.callback(functools.partial(_raise_unless_binary, dtype=mask.dtype), binary)
    return mask != 0


def _raise_unless_binary(binary: np.ndarray | jax.Array, dtype: object) -> None:
    if not bool(binary):
        raise ValueError(f"{MASK_VALUES}; got a {dtype} mask with values other than 0 and 1")
