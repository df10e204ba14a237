"""Projections for attention: shared by the heads or one per head (the ``PerHead`` marker),
drawn by coupling name and redrawn by step."""

from __future__ import annotations

import dataclasses
from typing import overload

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from rfjax._validation import check_int, check_key
from rfjax.projections import Projection
from rfjax.projections import get as get_coupling


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PerHead[T]:
    """Marks one value per attention head: every leaf of ``stacked`` has a leading axis N.

    ``favor_attention`` applies a ``PerHead`` projection (or feature map) head by head and an
    unmarked one to every head. Build it from N draws stacked with ``jax.vmap`` (as
    ``draw_projection(..., num_heads=N)`` does).

    Attributes:
      stacked: a pytree (a ``Projection`` or an ``rfjax.features.FeatureMap``) whose leaves all
        have a leading axis N.

    Examples:
      >>> import jax
      >>> from rfjax import attention, projections
      >>> keys = jax.random.split(jax.random.key(0), 4)
      >>> per_head = attention.PerHead(jax.vmap(lambda k: projections.gaussian(k, 8, 16))(keys))
      >>> per_head.num_heads, per_head.head(0).matrix().shape
      (4, (16, 8))
    """

    stacked: T

    @property
    def num_heads(self) -> int | None:
        """N, the leading axis of the leaves (``None`` if there are no leaves)."""
        leaves = jax.tree.leaves(self.stacked)
        return leaves[0].shape[0] if leaves else None

    def head(self, index: int) -> T:
        """The value of head ``index``."""
        return jax.tree.map(lambda leaf: leaf[index], self.stacked)


@overload
def draw_projection(
    key: jax.Array,
    head_dim: int,
    num_features: int,
    *,
    coupling: str = ...,
    num_heads: None = None,
    dtype: DTypeLike = ...,
) -> Projection: ...


@overload
def draw_projection(
    key: jax.Array,
    head_dim: int,
    num_features: int,
    *,
    coupling: str = ...,
    num_heads: int,
    dtype: DTypeLike = ...,
) -> PerHead[Projection]: ...


def draw_projection(
    key: jax.Array,
    head_dim: int,
    num_features: int,
    *,
    coupling: str = "orthogonal",
    num_heads: int | None = None,
    dtype: DTypeLike = jnp.float32,
) -> Projection | PerHead[Projection]:
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
      A ``Projection`` (``matrix()`` of shape ``(m, H)``) shared by the heads, or a
      ``PerHead`` of N stacked draws that ``favor_attention`` applies one per head.

    Examples:
      >>> import jax
      >>> from rfjax import attention
      >>> attention.draw_projection(jax.random.key(0), 8, 16, num_heads=4).num_heads
      4
    """
    check_key("key", key)
    sampler = get_coupling(coupling)
    head_dim = check_int("head_dim", head_dim, minimum=1)
    num_features = check_int("num_features", num_features, minimum=1)
    if num_heads is None:
        return sampler(key, head_dim, num_features, dtype=dtype)
    num_heads = check_int("num_heads", num_heads, minimum=1)
    keys = jax.random.split(key, num_heads)
    return PerHead(jax.vmap(lambda k: sampler(k, head_dim, num_features, dtype=dtype))(keys))


def redraw_key(rng: jax.Array, step: jax.Array | int, *, redraw_interval: int) -> jax.Array:
    """The projection key for training step ``step``: fold_in(rng, step // redraw_interval).

    Features are redrawn every ``redraw_interval`` steps without hidden state: the key is a pure
    function of the base ``rng`` and the step (which may be traced), so a jitted train step can
    call ``draw_projection(redraw_key(rng, step, redraw_interval=k), ...)``.

    Args:
      rng: the base PRNG key of the attention layer.
      step: the training step, an integer (a Python int or a scalar integer array, possibly
        traced).
      redraw_interval: redraw every this many steps (>= 1).

    Returns:
      A PRNG key, constant within each interval.

    Raises:
      TypeError: for a ``step`` that is not an integer (a float, a bool).
      ValueError: for a ``step`` that is not a scalar, or ``redraw_interval < 1``.
    """
    check_key("rng", rng)
    redraw_interval = check_int("redraw_interval", redraw_interval, minimum=1)
    step_array = jnp.asarray(step)
    if not jnp.issubdtype(step_array.dtype, jnp.integer) or isinstance(step, bool):
        raise TypeError(
            f"step must be an integer (a Python int or an integer array, possibly traced), got "
            f"{step!r} of dtype {step_array.dtype}"
        )
    if step_array.ndim != 0:
        raise ValueError(f"step must be a scalar, got an array of shape {step_array.shape}")
    return jax.random.fold_in(rng, step_array // redraw_interval)
