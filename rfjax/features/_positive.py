"""Positive random features (FAVOR+) for the softmax and Gaussian kernels, plain and antithetic."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import jax
import jax.numpy as jnp

from rfjax._validation import check_bool, check_choice, check_real
from rfjax.features._common import project
from rfjax.features._protocol import AffineLogForm, ExponentialFeatureMap, Side
from rfjax.projections import Projection

PositiveKernel = Literal["softmax", "gaussian"]
POSITIVE_KERNELS: tuple[PositiveKernel, ...] = ("softmax", "gaussian")
STABILIZERS: tuple[Literal["row"] | None, ...] = (None, "row")

# phi(x) = exp(w.x - a |x|^2) / sqrt(width): a = 1/2 for softmax, 1 for Gaussian (Eq. 6-7).
_SQUARED_NORM_WEIGHT = {"softmax": 0.5, "gaussian": 1.0}


def positive_features(
    x: jax.Array,
    projection: Projection,
    *,
    kernel: PositiveKernel = "softmax",
    antithetic: bool = False,
    lengthscale: float = 1.0,
    stabilizer: Literal["row"] | None = None,
) -> jax.Array:
    """Positive random features for the softmax or Gaussian kernel.

    With u = x / l (l only for the Gaussian kernel) the features are, for i = 1..m,

      softmax:  phi_i(x) = exp(w_i.x - |x|^2/2) / sqrt(m)  ->  E[phi(x).phi(y)] = exp(x.y),
      gaussian: phi_i(u) = exp(w_i.u - |u|^2) / sqrt(m)    ->  E = exp(-|x - y|^2 / (2 l^2)),

    unbiased because E[exp(w.v)] = exp(|v|^2/2) for w ~ N(0, I_d) (every coupling here is
    marginally Gaussian). ``antithetic=True`` uses both w_i and -w_i (HRF Eq. 3):
    phi(x) = e^{-a|x|^2} / sqrt(2m) [exp(W x), exp(-W x)], width 2m (a = 1/2 for softmax, 1 for
    Gaussian). Features are computed in log space, exp(w.x - a|x|^2 - log sqrt(width)), so no
    intermediate overflows. The plain
    softmax estimate is exact when y = -x (every product is exp(-|x|^2)).

    Stabiliser: ``stabilizer="row"`` divides each input's features by their largest entry,
    phi_stab(x) = phi(x) / max_j phi_j(x) = phi(x) exp(-s(x)) with
    s(x) = max_j z_j - a|u|^2 - log sqrt(width) (z = W u, or [W u, -W u] if antithetic),
    done by subtracting s(x) in log space. The largest entry becomes exactly 1, so no row
    underflows to all zeros and none overflows in low precision. It uses only the same input
    row, so it is safe in causal attention (the Performer's global max over keys would leak
    across positions and is not offered). It biases raw kernel estimates:
    phi_stab(x).phi_stab(y) = exp(-s(x) - s(y)) phi(x).phi(y). In row-normalised attention
    sum_j phi(q).phi(k_j) v_j / sum_j phi(q).phi(k_j) the query factor exp(-s(q)) cancels, so
    stabilising the queries leaves attention unchanged; a key factor exp(-s(k_j)) differs per
    key and does not cancel: stabilising keys reweights them (unless undone). s(x) is treated as
    a constant under differentiation (``stop_gradient``), which gives exact gradients of
    quantities that do not depend on it. No epsilon is added.

    Args:
      x: inputs, shape ``(..., d)``, floating (for attention, scale by d^{-1/4} first).
      projection: a drawn ``Projection`` with ``dim == d`` and m rows.
      kernel: ``"softmax"`` (Eq. 6 softmax factor) or ``"gaussian"`` (Eq. 7).
      antithetic: use the pairs +w_i, -w_i (width 2m) instead of w_i (width m).
      lengthscale: l > 0 for ``kernel="gaussian"`` (inputs rescaled by 1/l). For the softmax
        kernel it must be 1: rescale the inputs yourself (exp(x.y / l^2) = SM(x/l, y/l)).
      stabilizer: ``None`` (unbiased features) or ``"row"`` (see above; for queries).

    Returns:
      Positive features of shape ``(..., m)``, or ``(..., 2m)`` if ``antithetic``.

    Raises:
      TypeError: if ``x`` is not floating, ``projection`` is not a ``Projection`` or
        ``antithetic`` is not a bool.
      ValueError: for an unknown ``kernel`` or ``stabilizer``, a lengthscale other than 1 with
        the softmax kernel, or ``x.shape[-1] != projection.dim``.

    Examples:
      >>> import jax
      >>> from rfjax import projections
      >>> w = projections.simplex(jax.random.key(0), 4, 8)
      >>> positive_features(jax.numpy.ones((3, 4)), w, antithetic=True).shape
      (3, 16)

    References:
      Choromanski et al., "Rethinking Attention with Performers", ICLR 2021, arXiv:2009.14794;
      Reid et al. 2023, arXiv:2301.13856, Eq. 6-7; Choromanski et al. 2022, arXiv:2110.04367,
      Eq. 3 (antithetic).
    """
    stabilizer = check_choice("stabilizer", stabilizer, STABILIZERS)
    log_features = positive_log_features(
        x, projection, kernel=kernel, antithetic=antithetic, lengthscale=lengthscale
    )
    if stabilizer == "row":
        log_features = log_features - jax.lax.stop_gradient(
            jnp.max(log_features, axis=-1, keepdims=True)
        )
    return jnp.exp(log_features)


def positive_log_features(
    x: jax.Array,
    projection: Projection,
    *,
    kernel: PositiveKernel = "softmax",
    antithetic: bool = False,
    lengthscale: float = 1.0,
) -> jax.Array:
    """The log of ``positive_features`` (no stabiliser): l(x) = z - a |u|^2 - log(width) / 2.

    z = W u, or [W u, -W u] if ``antithetic``; u = x / l; a = 1/2 (softmax) or 1 (Gaussian).
    ``positive_features`` is exp(l); computing l first lets callers shift it (stabilise) before
    the ``exp``, as ``PositiveFeatureMap`` and FAVOR attention do. Arguments, shapes and errors
    as for ``positive_features``.

    Examples:
      >>> import jax
      >>> from rfjax import projections
      >>> w = projections.gaussian(jax.random.key(0), 4, 8)
      >>> x = jax.numpy.ones((3, 4))
      >>> bool(jax.numpy.allclose(jax.numpy.exp(positive_log_features(x, w)),
      ...                         positive_features(x, w)))
      True
    """
    kernel = check_choice("kernel", kernel, POSITIVE_KERNELS)
    antithetic = check_bool("antithetic", antithetic)
    lengthscale = check_real("lengthscale", lengthscale, positive=True)
    if kernel == "softmax" and lengthscale != 1.0:
        raise ValueError(
            f"lengthscale is only used with kernel='gaussian'; got lengthscale="
            f"{lengthscale} with kernel='softmax' (rescale the inputs instead)"
        )
    u, projected = project(x, projection, lengthscale=lengthscale)
    if antithetic:
        projected = jnp.concatenate([projected, -projected], axis=-1)
    return projected - (
        _SQUARED_NORM_WEIGHT[kernel] * jnp.sum(u * u, axis=-1, keepdims=True)
        + 0.5 * math.log(projected.shape[-1])
    )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PositiveFeatureMap(ExponentialFeatureMap):
    """Positive (FAVOR+) features of the softmax kernel exp(x.y) as a ``FeatureMap``.

    log_features = ``positive_log_features(x, projection, antithetic=antithetic)`` on both sides
    (symmetric). Registered as ``"positive"`` and ``"positive_antithetic"``.

    Attributes:
      antithetic: use the pairs +w_i, -w_i (width 2m).

    References:
      Choromanski et al., "Rethinking Attention with Performers", arXiv:2009.14794, Lemma 1;
      Choromanski et al. 2022, arXiv:2110.04367, Eq. 3 (antithetic).
    """

    antithetic: bool = dataclasses.field(default=False, metadata={"static": True})

    def __post_init__(self):
        check_bool("antithetic", self.antithetic)  # at construction, not at the first call

    def log_features(self, x: jax.Array, projection: Projection, *, side: Side) -> jax.Array:
        del side  # symmetric
        return positive_log_features(x, projection, antithetic=self.antithetic)

    def affine_log_form(self, projection: Projection, *, side: Side) -> AffineLogForm:
        """W (or [W; -W]), b = -log(width) / 2, norm weight -1/2."""
        del side  # symmetric
        weights = projection.matrix()
        if self.antithetic:
            weights = jnp.concatenate([weights, -weights])
        bias = jnp.full(weights.shape[:1], -0.5 * math.log(weights.shape[0]), weights.dtype)
        return AffineLogForm(weights, bias, -_SQUARED_NORM_WEIGHT["softmax"])
