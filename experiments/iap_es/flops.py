"""FLOP counts of one patch-importance computation of an implicit-attention policy (IAP,
arXiv:2102.04353, Sec. 3.1): the analytic count from the shapes (``importance_flops``, the
study's x axis) and a policy's count (``policy_importance_flops``). XLA's count of the compiled
computation is ``experiments.iap_es.xla_importance_flops``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from rfjax.nn import ImplicitAttentionPolicy
from rfjax.projections import Projection


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


def importance_flops(
    num_patches: int,
    dim: int,
    *,
    feature_width: int | None = None,
    projection_rows: int = 0,
) -> int:
    """Floating-point operations of one patch-importance computation, from the shapes.

    A multiply-add counts 2, any other elementwise operation 1. Exact softmax attention
    (``feature_width=None``): scores 2 T^2 d, then exp, row sums, normalisation and column
    sums, 4 T^2:

      F_exact = 2 T^2 d + 4 T^2.

    Random features of width w from r projection vectors (FAVOR+: w = r = m; trigonometric:
    w = 2m, r = m; angular hybrid: w = 4m(n + 1), r = m + n): projecting queries and keys
    4 T r d, one operation per feature entry and side 2 T w (exp, sin/cos or a Kronecker
    product), then ``random_feature_importance``'s key sum T w, normalisers 2 T w, weighted
    query sum 2 T w + T divisions and read-out 2 T w:

      F_rf = 4 T r d + 9 T w + T.

    Args:
      num_patches: T >= 1.
      dim: d >= 1, the query/key width.
      feature_width: w (``None`` for exact softmax attention).
      projection_rows: r, the projection vectors applied to each query and key.

    Returns:
      The count, an int.

    Examples:
      >>> importance_flops(100, 8)  # exact
      200000
      >>> importance_flops(100, 8, feature_width=256, projection_rows=256)  # FAVOR+, m = 256
      1049700
    """
    t = _positive_int("num_patches", num_patches)
    d = _positive_int("dim", dim)
    if feature_width is None:
        return 2 * t * t * d + 4 * t * t
    w = _positive_int("feature_width", feature_width)
    r = _positive_int("projection_rows", projection_rows)
    return 4 * t * r * d + 9 * t * w + t


def exact_crossover_patches(dim: int, *, feature_width: int, projection_rows: int) -> int:
    """The fewest patches T at which random features of width w from r projection vectors cost
    fewer ``importance_flops`` than exact softmax attention: the smallest T with
    2 T^2 d + 4 T^2 > 4 T r d + 9 T w + T, i.e. T > (4 r d + 9 w + 1) / (2 d + 4).

    Examples:
      >>> exact_crossover_patches(8, feature_width=256, projection_rows=256)  # FAVOR+, m = 256
      525
    """
    d = _positive_int("dim", dim)
    w = _positive_int("feature_width", feature_width)
    r = _positive_int("projection_rows", projection_rows)
    return (4 * r * d + 9 * w + 1) // (2 * d + 4) + 1


def policy_feature_shape(policy: ImplicitAttentionPolicy) -> tuple[int, int]:
    """``(feature_width, projection_rows)`` of a random-feature ``policy``'s estimate: the width
    w of its features and the projection vectors r applied to each query and key (the base
    vectors and those of projections the map holds)."""
    if policy.attention == "exact":
        raise ValueError("exact attention has no random features")
    drawn = jax.eval_shape(policy.draw_projection, jax.random.key(0))
    held = jax.tree.leaves(drawn.feature_map, is_leaf=lambda x: isinstance(x, Projection))
    rows = drawn.projection.num_features + sum(
        p.num_features for p in held if isinstance(p, Projection)
    )
    probe = jax.ShapeDtypeStruct((policy.num_patches(), policy.embed_dim), jnp.float32)
    width = jax.eval_shape(
        lambda x: drawn.feature_map.features(x, drawn.projection, side="query"), probe
    ).shape[-1]
    return width, rows


def policy_importance_flops(policy: ImplicitAttentionPolicy) -> int:
    """``importance_flops`` of one importance computation of ``policy``, from its shapes."""
    count = policy.num_patches()
    if policy.attention == "exact":
        return importance_flops(count, policy.embed_dim)
    width, rows = policy_feature_shape(policy)
    return importance_flops(count, policy.embed_dim, feature_width=width, projection_rows=rows)
