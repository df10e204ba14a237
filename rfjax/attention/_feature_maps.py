"""Feature maps for FAVOR attention: ``(x, projection) -> features`` on ``(T, H) -> (T, width)``.

A feature map for attention is any callable ``phi(x, projection)`` returning non-negative
features whose inner products phi(q) . phi(k) are the (unnormalised) attention scores. Maps
whose features are exponentials, phi(x) = exp(l(x)), subclass ``ExponentialFeatureMap`` and
expose the log-features l(x): only those can be stabilised (a shift of l before the ``exp``).
"""

from __future__ import annotations

import abc
import dataclasses
import math

import jax
import jax.numpy as jnp

from rfjax._validation import check_real
from rfjax.features._common import project


def data_normalizer(head_dim: int) -> float:
    """H^{-1/4}: with q, k scaled by it, exp(q'.k') = exp(q.k / sqrt(H)) (EQUATIONS Eq. 5)."""
    return head_dim**-0.25


class ExponentialFeatureMap(abc.ABC):
    """A feature map phi(x) = exp(l(x)) given by its log-features l (stabilisable).

    Subclasses implement ``log_features``; calling the map returns ``exp(log_features)``.
    ``favor_attention`` shifts l by per-row and running maxima before exponentiating (see its
    docstring); the shifts cancel in normalised attention. Subclasses should be hashable
    (frozen dataclasses), since they are static arguments of the jitted kernels.
    """

    @abc.abstractmethod
    def log_features(self, x: jax.Array, projection: object) -> jax.Array:
        """l(x), shape ``(..., width)`` for ``x`` of shape ``(..., H)``."""

    def __call__(self, x: jax.Array, projection: object) -> jax.Array:
        return jnp.exp(self.log_features(x, projection))


@dataclasses.dataclass(frozen=True)
class SoftmaxFeatureMap(ExponentialFeatureMap):
    """Positive (FAVOR+) features for the attention kernel exp(q . k / sqrt(H)).

    With x' = H^{-1/4} x (if ``normalize``) and z = W x',

      l(x) = z - |x'|^2 / 2 - log(m) / 2,   so E[exp(l(q)) . exp(l(k))] = exp(q.k / sqrt(H))

    (EQUATIONS Eq. 5-6). ``antithetic=True`` uses [z, -z] and width 2m (log(2m) / 2).
    This equals ``rfjax.features.positive_features`` of x', computed in log space.

    Attributes:
      antithetic: use the pairs +w_i, -w_i (width 2m).
      normalize: scale inputs by H^{-1/4} (the Performer ``data_normalizer``); ``False``
        estimates exp(q . k).

    References:
      Choromanski et al., "Rethinking Attention with Performers", arXiv:2009.14794, Lemma 1.
    """

    antithetic: bool = False
    normalize: bool = True

    def log_features(self, x: jax.Array, projection: object) -> jax.Array:
        if self.normalize:
            x = x * jnp.asarray(data_normalizer(x.shape[-1]), x.dtype)
        x, projected = project(x, projection)
        if self.antithetic:
            projected = jnp.concatenate([projected, -projected], axis=-1)
        return projected - (
            0.5 * jnp.sum(x * x, axis=-1, keepdims=True) + 0.5 * math.log(projected.shape[-1])
        )


@dataclasses.dataclass(frozen=True)
class ReluFeatureMap:
    """Generalised-attention ReLU features phi(x) = (relu(W x') + eps) / sqrt(m).

    x' = H^{-1/4} x if ``normalize``. The scores phi(q) . phi(k) estimate, without bias,
    kappa(q, k) = E_w[(relu(w.q') + eps)(relu(w.k') + eps)] = arccos_1(q', k') / 2 + ...
    (the arc-cosine kernel of order 1 plus eps terms), which is not the softmax kernel:
    "generalized attention" of the Performer paper (its ``kernel_epsilon`` = 1e-3). The 1/sqrt(m)
    scale makes the estimate converge as m grows; eps > 0 keeps every score positive.

    Attributes:
      eps: the additive constant, > 0.
      normalize: scale inputs by H^{-1/4}.

    References:
      Choromanski et al., arXiv:2009.14794, Sec. 2.2 and App. (generalized attention).
    """

    eps: float = 1e-3
    normalize: bool = True

    def __post_init__(self):
        check_real("eps", self.eps, positive=True)

    def __call__(self, x: jax.Array, projection: object) -> jax.Array:
        if self.normalize:
            x = x * jnp.asarray(data_normalizer(x.shape[-1]), x.dtype)
        _, projected = project(x, projection)
        scale = 1.0 / math.sqrt(projected.shape[-1])
        return scale * (jax.nn.relu(projected) + self.eps)


FEATURE_MAPS = {
    "softmax": SoftmaxFeatureMap(),
    "softmax_antithetic": SoftmaxFeatureMap(antithetic=True),
    "relu": ReluFeatureMap(),
}
