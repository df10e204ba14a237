"""The ``Projection`` type: a drawn set of projection vectors w_1..w_m in R^d."""

from __future__ import annotations

import abc
import dataclasses

import jax
import jax.numpy as jnp

from rfjax._validation import check_finite, check_inputs


class Projection(abc.ABC):
    """A drawn projection W in R^{m x d}, applied as ``x -> x W^T``.

    Concrete projections are frozen dataclasses registered as pytrees: their arrays are leaves
    (so a projection passes through ``jit``/``vmap`` and can be drawn in a batch with
    ``jax.vmap(sampler)(keys)``), their shapes and block layout are static.

    Attributes:
      dim: input dimension d.
      num_features: number of projection vectors m.
      block_size: rows ``[k*block_size, (k+1)*block_size)`` form the k-th coupled block; rows in
        different blocks are independent. 1 for i.i.d. rows.
    """

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """Input dimension d."""

    @property
    @abc.abstractmethod
    def num_features(self) -> int:
        """Number of projection vectors m."""

    @property
    @abc.abstractmethod
    def block_size(self) -> int:
        """Number of rows per independent block."""

    @abc.abstractmethod
    def _apply(self, x: jax.Array) -> jax.Array:
        """``x W^T`` for validated ``x`` of shape ``(..., dim)``."""

    @abc.abstractmethod
    def matrix(self) -> jax.Array:
        """The dense matrix W of shape ``(num_features, dim)`` (for tests and analysis)."""

    def __call__(self, x: jax.Array) -> jax.Array:
        """Projects ``x``: ``(..., dim) -> (..., num_features)``, i.e. ``x W^T``.

        Outside ``jit``, inputs holding NaN or infinity are rejected; under ``jit`` the values are
        unknown and are not checked.

        Raises:
          TypeError: if ``x`` is not a floating array.
          ValueError: if the last axis of ``x`` is not ``dim``, or ``x`` is not finite.
        """
        x = check_inputs("x", x, dim=self.dim)
        return self._apply(check_finite("x", x))

    def block_sizes(self) -> tuple[int, ...]:
        """Sizes of the independent blocks, in row order (the last one may be partial)."""
        full, rest = divmod(self.num_features, self.block_size)
        return (self.block_size,) * full + ((rest,) if rest else ())


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DenseProjection(Projection):
    """A projection that stores W densely; ``x W^T`` costs O(m d) per input.

    Attributes:
      weights: W, shape ``(num_features, dim)``.
      block_size: rows per independent block (static).
    """

    weights: jax.Array
    block_size: int = dataclasses.field(default=1, metadata={"static": True})

    @property
    def dim(self) -> int:
        return self.weights.shape[-1]

    @property
    def num_features(self) -> int:
        return self.weights.shape[-2]

    def _apply(self, x: jax.Array) -> jax.Array:
        return jnp.matmul(x, jnp.swapaxes(self.weights, -1, -2))

    def matrix(self) -> jax.Array:
        return self.weights
