"""Implicit Attention Policy (IAP): patches, self-attention importance, top-k masking, controller.

An IAP (Choromanski et al., "Unlocking Pixels for Reinforcement Learning via Implicit
Attention", arXiv:2102.04353) reads an image as patches, scores them by how much self-attention
they receive, keeps the k most important ones (the masking variant) and feeds only those to a
small controller. The attention is exact softmax or a random-feature estimate (FAVOR+, or the
HRF estimators: Choromanski et al., "Hybrid Random Features", arXiv:2110.04367, Sec. 4.4,
App. K), so the importance costs O(T w) instead of O(T^2 d) for T patches.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from rfjax import features
from rfjax._validation import check_choice, check_int, check_key, check_real
from rfjax.attention import draw_projection
from rfjax.features import FeatureMap
from rfjax.nn._patch_importance import (
    random_feature_importance,
    softmax_importance,
)
from rfjax.projections import Projection
from rfjax.projections import available as available_couplings

# "exact" and the registered maps of the softmax kernel that need no fitting to data.
IAP_ATTENTIONS: tuple[str, ...] = (
    "exact",
    *(
        name
        for name in features.available(kernel="softmax")
        if not features.get(name)().fitted_fields
    ),
)


class AttentionDraw(NamedTuple):
    """The random part of a random-feature attention, drawn from one key.

    Attributes:
      projection: the m base projection vectors.
      feature_map: the ``rfjax.features.FeatureMap`` with its random parameters (the hybrids'
        n coefficient vectors).
    """

    projection: Projection
    feature_map: FeatureMap


# --------------------------------------------------------------------------- patches, top-k


def image_patches(image: jax.Array, patch_size: int) -> jax.Array:
    """Non-overlapping square patches of an image, flattened, in row-major patch order.

    Args:
      image: ``(..., H, W, C)`` with H and W multiples of ``patch_size``.
      patch_size: P >= 1.

    Returns:
      ``(..., T, P * P * C)`` with T = (H / P)(W / P); patch (i, j) is row i (W / P) + j.

    Examples:
      >>> import jax.numpy as jnp
      >>> image_patches(jnp.arange(16.0).reshape(4, 4, 1), 2)[1].tolist()
      [2.0, 3.0, 6.0, 7.0]
    """
    patch_size = check_int("patch_size", patch_size, minimum=1)
    image = jnp.asarray(image)
    if image.ndim < 3:
        raise ValueError(f"image must have shape (..., H, W, C), got {image.shape}")
    *batch, height, width, channels = image.shape
    if height % patch_size or width % patch_size:
        raise ValueError(
            f"image height and width ({height}, {width}) must be multiples of patch_size "
            f"{patch_size}"
        )
    rows, cols = height // patch_size, width // patch_size
    patches = image.reshape(*batch, rows, patch_size, cols, patch_size, channels)
    patches = jnp.moveaxis(patches, -4, -3)  # (..., rows, cols, P, P, C)
    return patches.reshape(*batch, rows * cols, patch_size * patch_size * channels)


def patch_centres(height: int, width: int, patch_size: int) -> jax.Array:
    """Centres of the patches of ``image_patches`` as (row, column) in [-1, 1], ``(T, 2)``."""
    rows, cols = height // patch_size, width // patch_size

    def axis(n: int) -> jax.Array:
        return (jnp.arange(n) + 0.5) / n * 2.0 - 1.0

    grid = jnp.stack(jnp.meshgrid(axis(rows), axis(cols), indexing="ij"), axis=-1)
    return grid.reshape(rows * cols, 2)


def top_k_patches(importance: jax.Array, k: int) -> jax.Array:
    """Indices of the k most important patches, in decreasing importance.

    Ties are broken towards the lower patch index (``jax.lax.top_k``).

    Args:
      importance: ``(..., T)``.
      k: 1 <= k <= T.

    Returns:
      int32 ``(..., k)``.
    """
    importance = jnp.asarray(importance)
    k = check_int("k", k, minimum=1)
    if importance.ndim < 1 or k > importance.shape[-1]:
        raise ValueError(
            f"k must be <= the number of patches T = {importance.shape[-1:]}, got k = {k}"
        )
    return jax.lax.top_k(importance, k)[1]


def top_k_mask(importance: jax.Array, k: int) -> jax.Array:
    """The masking variant's mask: True for the k most important patches (``top_k_patches``).

    For distinct importances the mask is permutation-equivariant over patches:
    ``top_k_mask(c[perm], k) == top_k_mask(c, k)[perm]``.

    Args:
      importance: ``(..., T)``.
      k: 1 <= k <= T.

    Returns:
      Boolean ``(..., T)`` with exactly k True entries per row.

    Examples:
      >>> import jax.numpy as jnp
      >>> top_k_mask(jnp.array([0.1, 3.0, 2.0, 0.5]), 2).tolist()
      [False, True, True, False]
    """
    kept = top_k_patches(importance, k)
    hits = jax.nn.one_hot(kept, jnp.shape(importance)[-1], dtype=jnp.int32)
    return jnp.sum(hits, axis=-2) > 0


# --------------------------------------------------------------------------- the policy


class ImplicitAttentionPolicy(nn.Module):
    """An IAP, masking variant: image -> patch attention -> top-k patches -> MLP -> logits.

    For an observation of shape ``image_shape`` = (H, W, C):

    1. patches: T = (H / P)(W / P) non-overlapping P x P patches, each a token x_t = [patch
       pixels (P^2 C), patch centre (row, col) in [-1, 1]];
    2. queries q_t = W_q x_t + b_q and keys k_t = W_k x_t + b_k (width d = ``embed_dim``),
       scaled to unit length and then by sqrt(tau sqrt(d)), so q.k / sqrt(d) = tau cos(q, k):
       bounded scores, as in HRF App. K ("queries and keys of L2-norm equal to one");
    3. importance c = column sums of the (estimated) attention matrix A = rownorm(K(q_t, k_j))
       with K the softmax kernel exp(q.k / sqrt(d)): exact (``softmax_importance``, O(T^2 d))
       or random features (``random_feature_importance``, O(T w));
    4. masking: the k patches of largest importance (``top_k_mask``); the controller reads
       every patch's pixels in its place, those of the T - k others zeroed (T P^2 C numbers;
       the patch centres enter the queries and keys only);
    5. controller: an MLP (tanh hidden layers ``hidden_sizes``) to ``num_actions`` logits.

    The random projection and the map's random parameters are not parameters: draw them with
    ``draw_projection(key)`` (an ``AttentionDraw``) and pass it to every call, so the policy is
    the pure function (params, observation, key) -> ``apply(params, observation,
    draw_projection(key))`` (exact attention takes ``None``).
    Parameters form a small pytree; ``jax.flatten_util.ravel_pytree`` turns it into the flat
    vector that evolution strategies perturb. The importance and the kept patches' mask are
    sown into ``"intermediates"`` (``"importance"``, ``"mask"``).

    Attributes:
      image_shape: (H, W, C) of an observation.
      num_actions: number of output logits.
      patch_size: P; H and W must be multiples of it.
      num_kept: k, patches kept by the mask (1 <= k <= T).
      embed_dim: d, width of queries and keys.
      hidden_sizes: the controller's hidden widths.
      attention: one of ``IAP_ATTENTIONS``: ``"exact"`` (softmax) or a feature map of
        ``rfjax.features``, e.g. ``"positive"`` (FAVOR+, width m), ``"trigonometric"`` (HRF
        Eq. 2, width 2m), ``"angular_hybrid"`` (HRF Eq. 12, width 4m(n + 1)) or
        ``"gaussian_hybrid"`` (HRF Eq. 20, width 4m(2n + 1), bandwidth and radius
        sqrt(tau), the length of the scaled queries and keys).
      coupling: how the m base projection vectors are drawn (``rfjax.projections``); the
        hybrids' n coefficient vectors are i.i.d. Gaussian (drawn by the map's ``init``).
      num_features: m.
      num_sign_features: n (hybrids only: the angular hybrid's sign vectors, the Gaussian
        hybrid's coefficient vectors).
      temperature: tau > 0 (fixed: the Gaussian hybrid needs the input radius sqrt(tau)).
      eps: floor of the estimated row normalisers (signed maps can estimate them as <= 0).

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> policy = ImplicitAttentionPolicy(
      ...     image_shape=(4, 4, 1), num_actions=3, num_kept=2, attention="positive",
      ...     num_features=8)
      >>> projection = policy.draw_projection(jax.random.key(1))
      >>> image = jnp.ones((4, 4, 1))
      >>> params = policy.init(jax.random.key(0), image, projection)
      >>> policy.apply(params, image, projection).shape
      (3,)

    References:
      Choromanski et al., arXiv:2102.04353, Sec. 3 (IAP, masking); Choromanski et al.,
      arXiv:2110.04367, Sec. 4.4 and App. K.1 (HRF in IAPs); Tang et al., arXiv:2003.08165.
    """

    image_shape: tuple[int, int, int]
    num_actions: int
    patch_size: int = 1
    num_kept: int = 6
    embed_dim: int = 8
    hidden_sizes: tuple[int, ...] = (16,)
    attention: str = "positive"
    coupling: str = "orthogonal"
    num_features: int = 256
    num_sign_features: int = 8
    temperature: float = 1.0
    eps: float = 1e-6

    # ----------------------------------------------------------------- static structure

    def num_patches(self) -> int:
        """T, after checking ``image_shape``, ``patch_size``, ``num_kept``, ``attention`` and
        ``temperature``."""
        shape = tuple(self.image_shape)
        if len(shape) != 3 or any(
            isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in shape
        ):
            raise ValueError(
                f"image_shape must be (H, W, C) of positive ints, got {self.image_shape!r}"
            )
        patch = check_int("patch_size", self.patch_size, minimum=1)
        if shape[0] % patch or shape[1] % patch:
            raise ValueError(
                f"image_shape {shape} must have H and W multiples of patch_size {patch}"
            )
        count = (shape[0] // patch) * (shape[1] // patch)
        kept = check_int("num_kept", self.num_kept, minimum=1)
        if kept > count:
            raise ValueError(
                f"num_kept must be <= the number of patches T = {count} (image_shape {shape}, "
                f"patch_size {patch}); got num_kept = {kept}"
            )
        check_choice("attention", self.attention, IAP_ATTENTIONS)
        check_real("temperature", self.temperature, positive=True)  # every kind scales by it
        if self.attention != "exact":
            check_choice("coupling", self.coupling, available_couplings())
        return count

    def feature_map(self) -> FeatureMap:
        """The feature map of a random-feature ``attention``, without its random parameters."""
        radius = math.sqrt(check_real("temperature", self.temperature, positive=True))
        if self.attention not in IAP_ATTENTIONS[1:]:
            raise ValueError(
                f"attention must be one of {IAP_ATTENTIONS[1:]} to have a feature map; got "
                f"{self.attention!r}"
            )
        n = check_int("num_sign_features", self.num_sign_features, minimum=1)
        return features.build(
            self.attention,
            num_sign_features=n,
            num_coefficient_features=n,
            bandwidth=radius,
            radius=radius,
        )

    def draw_projection(self, key: jax.Array) -> AttentionDraw | None:
        """The random draw of ``attention`` from ``key`` (``None`` for exact attention).

        m base vectors of ``coupling`` (shared by a hybrid's base estimators) from one half of
        the key, the map's random parameters (the hybrids' n independent Gaussian coefficient
        vectors) from the other.
        """
        self.num_patches()
        if self.attention == "exact":
            return None
        check_key("key", key)
        d = check_int("embed_dim", self.embed_dim, minimum=1)
        m = check_int("num_features", self.num_features, minimum=1)
        base_key, extra_key = jax.random.split(key)
        base = draw_projection(base_key, d, m, coupling=self.coupling)
        return AttentionDraw(base, self.feature_map().init(extra_key, d))

    # ----------------------------------------------------------------- forward

    def _check_observation(self, observation: jax.Array) -> jax.Array:
        observation = jnp.asarray(observation)
        shape = tuple(self.image_shape)
        if observation.shape[-3:] != shape:
            raise ValueError(
                f"observation must have shape (..., H, W, C) = (..., {', '.join(map(str, shape))})"
                f" (image_shape); got {observation.shape}"
            )
        if not (jnp.issubdtype(observation.dtype, jnp.number) or observation.dtype == jnp.bool_):
            raise TypeError(f"observation must be numeric or boolean, got {observation.dtype}")
        return observation

    def _unit_scaled(self, x: jax.Array) -> jax.Array:
        scale = math.sqrt(self.temperature * math.sqrt(self.embed_dim))
        return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + 1e-12) * scale

    def patch_importance(
        self, query: jax.Array, key: jax.Array, projection: AttentionDraw | None
    ) -> jax.Array:
        """Column sums of the attention matrix of ``attention``: ``(..., T, d)`` -> ``(..., T)``."""
        if self.attention == "exact":
            return softmax_importance(query, key)
        if projection is None:
            raise ValueError(
                f"projection must be drawn with draw_projection(key) for attention = "
                f"{self.attention!r}; got None"
            )
        return random_feature_importance(
            query, key, projection.projection, feature_map=projection.feature_map, eps=self.eps
        )

    @nn.compact
    def __call__(self, observation: jax.Array, projection: AttentionDraw | None) -> jax.Array:
        """Action logits for one observation (or a batch).

        Args:
          observation: ``(..., H, W, C)`` (``image_shape``), numeric or boolean; converted to
            float32 (booleans to 0/1).
          projection: ``draw_projection(key)`` (``None`` for exact attention).

        Returns:
          ``(..., num_actions)`` logits.
        """
        self.num_patches()
        observation = self._check_observation(observation).astype(jnp.float32)
        height, width, _ = self.image_shape
        patches = image_patches(observation, self.patch_size)
        centres = jnp.broadcast_to(
            patch_centres(height, width, self.patch_size), (*patches.shape[:-1], 2)
        )
        tokens = jnp.concatenate([patches, centres], axis=-1)  # (..., T, P^2 C + 2)
        query = self._unit_scaled(nn.Dense(self.embed_dim, name="query")(tokens))
        key = self._unit_scaled(nn.Dense(self.embed_dim, name="key")(tokens))
        importance = self.patch_importance(query, key, projection)
        mask = top_k_mask(importance, self.num_kept)
        self.sow("intermediates", "importance", importance)
        self.sow("intermediates", "mask", mask)
        masked = jnp.where(mask[..., None], patches, 0.0)  # (..., T, P^2 C)
        hidden = masked.reshape(*masked.shape[:-2], -1)
        for i, size in enumerate(self.hidden_sizes):
            hidden = jnp.tanh(nn.Dense(size, name=f"controller_{i}")(hidden))
        return nn.Dense(self.num_actions, name="logits")(hidden)
