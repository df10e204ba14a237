"""Feature maps f(W x) with a pointwise f: arc-cosine (step), angular (sign), linear (JL), ReLU.

These are the kernel case of Choromanski & Fagan's Eq. 2, Lambda_f(x, y) = E[f(w.x) f(w.y)],
estimated by (1/m) f(W x).f(W y); each is unbiased for every coupling whose rows are
marginally N(0, I_d).

Conventions at zero: step(0) = 1/2 and sign(0) = 0, so that at a zero input the features
estimate the kernels' zero-vector values (``rfjax.kernels``: angle pi/2) without bias.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from rfjax._validation import check_order, check_real
from rfjax.features._common import pointwise_features
from rfjax.features._protocol import FeatureMap, Side
from rfjax.projections import Projection


def arccos_features(x: jax.Array, projection: Projection, *, order: int) -> jax.Array:
    """Arc-cosine features: phi(x) = sqrt(2/m) step(W x) (W x)^n.

    E[phi(x).phi(y)] = 2 E[step(w.x) step(w.y) (w.x)^n (w.y)^n] = (1/pi) |x|^n |y|^n J_n(theta),
    the arc-cosine kernel ``rfjax.kernels.arccos`` of Cho & Saul (n = 1 is the ReLU kernel).

    Args:
      x: inputs, shape ``(..., d)``, floating.
      projection: a drawn ``Projection`` with ``dim == d`` and m rows.
      order: n in {0, 1, 2}.

    Returns:
      Features of shape ``(..., m)``.

    Raises:
      TypeError: if ``x`` is not floating or ``projection`` is not a ``Projection``.
      ValueError: if ``order`` is not 0, 1 or 2, or ``x.shape[-1] != projection.dim``.

    References:
      Cho & Saul, "Kernel Methods for Deep Learning", NeurIPS 2009; Choromanski & Fagan,
      structured matrices, Eq. 2 examples.
    """
    order = check_order(order)

    def step_power(z: jax.Array) -> jax.Array:
        step = jnp.where(z > 0, 1.0, jnp.where(z == 0, 0.5, 0.0)).astype(z.dtype)
        step = jnp.where(jnp.isnan(z), z, step)  # NaN stays NaN (NaN**0 is 1)
        return step * z**order

    return pointwise_features(x, projection, step_power, multiplier=2.0)


def angular_features(x: jax.Array, projection: Projection) -> jax.Array:
    """Angular (sign) features: phi(x) = sign(W x) / sqrt(m).

    E[phi(x).phi(y)] = E[sign(w.x) sign(w.y)] = 1 - 2 theta / pi, the angular kernel
    ``rfjax.kernels.angular``.

    Args:
      x: inputs, shape ``(..., d)``, floating.
      projection: a drawn ``Projection`` with ``dim == d`` and m rows.

    Returns:
      Features in {-1, 0, 1}/sqrt(m), shape ``(..., m)``.

    Raises:
      TypeError: if ``x`` is not floating or ``projection`` is not a ``Projection``.
      ValueError: if ``x.shape[-1] != projection.dim``.

    References:
      Charikar, "Similarity Estimation Techniques from Rounding Algorithms", STOC 2002;
      Choromanski & Fagan, structured matrices, Eq. 2 (f = sgn).
    """
    return pointwise_features(x, projection, jnp.sign)


def linear_features(x: jax.Array, projection: Projection) -> jax.Array:
    """Johnson-Lindenstrauss features: phi(x) = W x / sqrt(m), so E[phi(x).phi(y)] = x . y.

    Args:
      x: inputs, shape ``(..., d)``, floating.
      projection: a drawn ``Projection`` with ``dim == d`` and m rows.

    Returns:
      Features of shape ``(..., m)``.

    Raises:
      TypeError: if ``x`` is not floating or ``projection`` is not a ``Projection``.
      ValueError: if ``x.shape[-1] != projection.dim``.

    References:
      Johnson & Lindenstrauss 1984; Choromanski & Fagan, structured matrices, Eq. 2
      (identity f).
    """
    return pointwise_features(x, projection, lambda z: z)


def relu_features(x: jax.Array, projection: Projection, *, eps: float = 1e-3) -> jax.Array:
    """Generalised-attention ReLU features: phi(x) = (relu(W x) + eps) / sqrt(m).

    phi(x).phi(y) estimates, without bias, kappa(x, y) = E_w[(relu(w.x) + eps)(relu(w.y) + eps)]
    = arccos_1(x, y) / 2 + eps (E relu(w.x) + E relu(w.y)) + eps^2 (the arc-cosine kernel of
    order 1 plus eps terms), which is not the softmax kernel: the "generalized attention" of the
    Performer paper (its ``kernel_epsilon`` = 1e-3). eps > 0 keeps every feature positive.

    Args:
      x: inputs, shape ``(..., d)``, floating.
      projection: a drawn ``Projection`` with ``dim == d`` and m rows.
      eps: the additive constant, > 0.

    Returns:
      Positive features of shape ``(..., m)``.

    Raises:
      TypeError: if ``x`` is not floating or ``projection`` is not a ``Projection``.
      ValueError: if ``eps <= 0`` or ``x.shape[-1] != projection.dim``.

    References:
      Choromanski et al., arXiv:2009.14794, Sec. 2.2 and App. (generalized attention).
    """
    eps = check_real("eps", eps, positive=True)
    return pointwise_features(x, projection, lambda z: jax.nn.relu(z) + eps)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ReluFeatureMap(FeatureMap):
    """``relu_features`` as a ``FeatureMap`` (both sides). Registered as ``"relu"``.

    Attributes:
      eps: the additive constant, > 0.
    """

    eps: float = dataclasses.field(default=1e-3, metadata={"static": True})

    def __post_init__(self):
        check_real("eps", self.eps, positive=True)

    def features(self, x: jax.Array, projection: Projection, *, side: Side) -> jax.Array:
        del side  # symmetric
        return relu_features(x, projection, eps=self.eps)
