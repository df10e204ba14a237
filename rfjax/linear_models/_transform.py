"""``RandomFeatureTransform``: a projection and a feature map bound into phi(x), one pytree."""

from __future__ import annotations

import dataclasses
from typing import Literal, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from rfjax import features as _features
from rfjax import projections as _projections
from rfjax._validation import check_choice, check_real

Kernel = Literal["softmax", "gaussian"]
KERNELS: tuple[Kernel, ...] = ("softmax", "gaussian")


@runtime_checkable
class Featurizer(Protocol):
    """What a linear model needs of its features: a pytree (parameters as leaves, so it passes
    through ``jit``) mapping ``(..., dim) -> (..., width)`` in ``dtype``.
    ``RandomFeatureTransform`` is one; ``rfjax.sklearn``'s ridge estimators pass the features of
    ``RandomFeatures`` as another."""

    @property
    def dim(self) -> int: ...

    @property
    def width(self) -> int: ...

    @property
    def dtype(self) -> jnp.dtype: ...

    def __call__(self, x: jax.Array) -> jax.Array: ...


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RandomFeatureTransform:
    """phi(x): the features of a kernel K with Z(X) Z(Y)^T ~ K(X, Y), as one pytree.

    With u = x / l (``lengthscale``), a map of ``kernel`` gives its features of u,
    ``feature_map.features(u, projection, side="query")``. A softmax-kernel map also gives the
    Gaussian kernel through K(x, y) = e^{-|u|^2/2} exp(u.v) e^{-|v|^2/2} (Simplex Random Features,
    arXiv:2301.13856, Sec. 2): its log-space form (psi, s) becomes psi exp(s - |u|^2/2), which
    never overflows for positive features.

    Only symmetric maps (``feature_map.symmetric``) are accepted: a linear model on phi(x) is
    kernel ridge regression with the kernel phi(x).phi(y), which estimates K only when query and
    key features are the same function.

    The projection and the map's parameters are leaves (so the transform passes through ``jit``
    and is part of a fitted model's state); ``lengthscale`` and ``kernel`` are static.

    Attributes:
      projection: the drawn projection W, shape ``(m, d)`` (``rfjax.projections``).
      feature_map: a symmetric ``rfjax.features.FeatureMap`` (its ``init``/``fit`` done).
      lengthscale: l > 0; inputs are divided by it.
      kernel: ``"softmax"`` or ``"gaussian"``, the kernel the features estimate; ``"softmax"``
        needs a softmax-kernel map.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> from rfjax import features, projections
      >>> from rfjax.linear_models import RandomFeatureTransform
      >>> transform = RandomFeatureTransform(
      ...     projections.get("orthogonal")(jax.random.key(0), 3, 8),
      ...     features.get("positive")(), lengthscale=2.0, kernel="gaussian")
      >>> transform(jnp.ones((5, 3))).shape
      (5, 8)
    """

    projection: _projections.Projection
    feature_map: _features.FeatureMap
    lengthscale: float = dataclasses.field(default=1.0, metadata=dict(static=True))
    kernel: Kernel = dataclasses.field(default="softmax", metadata=dict(static=True))

    def __post_init__(self):
        if not isinstance(self.projection, _projections.Projection):
            raise TypeError(
                "projection must be an rfjax.projections.Projection, got "
                f"{type(self.projection).__name__}"
            )
        if not isinstance(self.feature_map, _features.FeatureMap):
            raise TypeError(
                "feature_map must be an rfjax.features.FeatureMap, got "
                f"{type(self.feature_map).__name__}"
            )
        if not self.feature_map.symmetric:
            raise ValueError(
                f"feature_map must be symmetric (the same features for queries and keys), got "
                f"{self.feature_map!r}: a linear model on its query features does not estimate "
                "its kernel"
            )
        check_real("lengthscale", self.lengthscale, positive=True)
        check_choice("kernel", self.kernel, KERNELS)
        if self.kernel == "softmax" and native_kernel(self.feature_map) == "gaussian":
            raise ValueError(
                f"kernel='softmax' needs a softmax-kernel feature map, got {self.feature_map!r} "
                "(it estimates the Gaussian kernel)"
            )

    @property
    def dim(self) -> int:
        """The input dimension d."""
        return self.projection.dim

    @property
    def width(self) -> int:
        """The number of features (e.g. 2m for sin/cos Fourier features)."""
        shape = jax.ShapeDtypeStruct((1, self.dim), self.dtype)
        return jax.eval_shape(self, shape).shape[-1]

    @property
    def dtype(self) -> jnp.dtype:
        """The dtype the features are computed in (the projection's)."""
        leaves = jax.tree_util.tree_leaves(self.projection)
        return jnp.result_type(*(x for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)))

    def __call__(self, x: jax.Array) -> jax.Array:
        """phi(x): ``(..., d) -> (..., width)``."""
        u = x / jnp.asarray(self.lengthscale, x.dtype)
        if self.kernel == native_kernel(self.feature_map):
            return self.feature_map.features(u, self.projection, side="query")
        return _features.gaussian_kernel_features(self.feature_map, u, self.projection)


def native_kernel(feature_map: _features.FeatureMap) -> Kernel:
    """The kernel ``feature_map`` estimates, from the registry entry of its class.

    Raises:
      ValueError: if no registered map has its class, or the registered one has no kernel.
    """
    for name in _features.available():
        info = _features.info(name)
        if type(info.factory()) is type(feature_map) and info.kernel is not None:
            return info.kernel
    raise ValueError(
        f"feature_map {feature_map!r} is not a registered map of the softmax or Gaussian kernel "
        f"(rfjax.features.available(): {_features.available()})"
    )
