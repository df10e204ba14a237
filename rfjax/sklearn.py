"""A scikit-learn front door: ``RandomFeatures``, a drop-in transformer for ``RBFSampler``.

``RandomFeatures`` draws a coupled projection (any name in ``rfjax.projections.available()``)
in ``fit`` and maps inputs to random features in ``transform``, so that Z(X) Z(Y)^T estimates
the Gaussian kernel exp(-gamma |x - y|^2) (or the softmax kernel exp(2 gamma x.y)). It passes
``sklearn.utils.estimator_checks.check_estimator`` and can replace
``sklearn.kernel_approximation.RBFSampler`` in a ``Pipeline``.

Example:
  >>> from sklearn.pipeline import make_pipeline
  >>> from sklearn.linear_model import RidgeClassifier
  >>> from rfjax.sklearn import RandomFeatures
  >>> model = make_pipeline(RandomFeatures(gamma=0.01, random_state=0), RidgeClassifier())
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from rfjax import features as _features
from rfjax import projections as _projections

Kernel = Literal["gaussian", "softmax"]
KERNELS: tuple[Kernel, ...] = ("gaussian", "softmax")


def feature_names() -> tuple[str, ...]:
    """The ``features`` that ``RandomFeatures`` takes: the registered symmetric feature maps of
    the softmax or Gaussian kernel (``rfjax.features.available()``)."""
    return tuple(
        name
        for name in _features.available()
        if _features.info(name).kernel in KERNELS and _features.get(name)().symmetric
    )


@functools.partial(jax.jit, static_argnames=("lengthscale", "kernel", "native_kernel"))
def _transform(
    x: jax.Array,
    projection: _projections.Projection,
    feature_map: _features.FeatureMap,
    lengthscale: float,
    kernel: Kernel,
    native_kernel: Kernel,
) -> jax.Array:
    """The features of ``RandomFeatures.transform``, compiled once per shape and option.

    With u = x / l, a map of ``kernel`` gives its features of u. A map of the softmax kernel
    gives the Gaussian kernel through K(x, y) = e^{-|u|^2/2} exp(u.v) e^{-|v|^2/2}: its log-space
    form (psi, s) becomes psi exp(s - |u|^2/2), which never overflows for positive features.
    """
    u = x / jnp.asarray(lengthscale, x.dtype)
    if kernel == native_kernel:
        return feature_map.features(u, projection, side="query")
    psi, log_scale = feature_map.scaled_features(u, projection, side="query")
    return psi * jnp.exp(log_scale - 0.5 * jnp.sum(u * u, axis=-1))[..., None]


class RandomFeatures(ClassNamePrefixFeaturesOutMixin, TransformerMixin, BaseEstimator):
    """Random features for the Gaussian (RBF) or softmax kernel with a coupled projection.

    Kernels (as in ``RBFSampler``, with lengthscale l = 1 / sqrt(2 gamma)):

      ``kernel="gaussian"``: K(x, y) = exp(-gamma |x - y|^2) = exp(-|x - y|^2 / (2 l^2)),
      ``kernel="softmax"``:  K(x, y) = exp(2 gamma x.y) = exp(x.y / l^2) (positive features
      only; computed as the softmax kernel of the rescaled inputs x / l).

    Feature maps (``Z = transform(X)``, with ``Z @ Z.T`` an unbiased estimate of the kernel matrix
    for every coupling whose rows are marginally N(0, I); see ``rfjax.projections``): any name in
    ``feature_names()``, the symmetric maps of ``rfjax.features`` for the softmax or Gaussian
    kernel, applied to u = x / l. A softmax-kernel map gives the Gaussian kernel through
    K(x, y) = e^{-|u|^2/2} exp(u.v) e^{-|v|^2/2}; a Gaussian-kernel map gives only that kernel.
    The number of projection vectors m is ``n_components`` divided by the map's width per
    vector, e.g.

      ``features="positive"``: ``rfjax.features.positive_features`` with m = ``n_components``
      projection vectors; every feature is positive (FAVOR+).
      ``features="fourier"``: ``rfjax.features.fourier_features``, [sin(W x / l), cos(W x / l)]
      / sqrt(m), with m = ``n_components / 2`` projection vectors, so ``n_components`` must be
      even (``RBFSampler`` instead uses ``n_components`` cosines with random offsets).

    Randomness: ``fit`` draws one integer ``seed = check_random_state(random_state).randint(2**31
    - 1)`` and samples the projection from ``jax.random.key(seed)``. A fixed ``random_state``
    therefore gives the same features on every fit; ``None`` gives fresh features each fit.

    Precision: when JAX runs with 64-bit floats enabled (``jax_enable_x64``) and the input is
    float64, features are computed in float64; otherwise in float32. The output has the dtype of
    the validated input (float64 or float32; other inputs are converted to float64), as for
    ``RBFSampler``.

    One input feature: couplings that need at least two input dimensions (``min_dim`` in
    ``rfjax.projections.info``: the simplex couplings) fall back to the ``gaussian`` (i.i.d.)
    coupling for one-dimensional inputs, which is what any coupling of a single direction
    amounts to.

    Parameters:
      kernel: ``"gaussian"`` (default) or ``"softmax"``.
      coupling: a name from ``rfjax.projections.available()``; default ``"simplex"``.
      features: a name from ``feature_names()``: ``"positive"`` (default), ``"fourier"``
        (Gaussian kernel only), ``"positive_antithetic"``, ``"trigonometric"``...
      n_components: output width (default 100); a multiple of the map's width per projection
        vector (even for ``"fourier"``).
      gamma: kernel parameter gamma > 0 (default 1.0).
      random_state: ``None``, an int or a ``numpy.random.RandomState`` (see Randomness).

    Attributes:
      projection_: the drawn ``rfjax.projections.Projection`` (a pytree; ``.matrix()`` gives the
        dense weight matrix of shape ``(num_vectors, n_features_in_)``).
      feature_map_: the ``rfjax.features.FeatureMap`` with its parameters.
      n_features_in_: number of input features seen in ``fit``.
      feature_names_in_: input feature names, when ``X`` had string column names.
    """

    def __init__(
        self,
        kernel: Kernel = "gaussian",
        coupling: str = "simplex",
        features: str = "positive",
        n_components: int = 100,
        gamma: float = 1.0,
        random_state: int | np.random.RandomState | None = None,
    ):
        self.kernel = kernel
        self.coupling = coupling
        self.features = features
        self.n_components = n_components
        self.gamma = gamma
        self.random_state = random_state

    def _validate_params(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {self.kernel!r}")
        if not isinstance(self.coupling, str) or self.coupling not in _projections.available():
            raise ValueError(
                f"coupling must be one of {_projections.available()}, got {self.coupling!r}"
            )
        names = feature_names()
        if not isinstance(self.features, str) or self.features not in names:
            raise ValueError(f"features must be one of {names}, got {self.features!r}")
        native_kernel = _features.info(self.features).kernel
        if native_kernel == "gaussian" and self.kernel != "gaussian":
            raise ValueError(
                f"features={self.features!r} only supports kernel='gaussian' (it estimates the "
                f"Gaussian kernel), got kernel={self.kernel!r}"
            )
        n = self.n_components
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"n_components must be an integer >= 1, got {n!r}")
        g = self.gamma
        if isinstance(g, bool) or not isinstance(g, numbers.Real) or not math.isfinite(g) or g <= 0:
            raise ValueError(f"gamma must be a finite real number > 0, got {g!r}")

    def _num_vectors(self, feature_map: _features.FeatureMap, dim: int) -> int:
        """m, the projection vectors for ``n_components`` outputs (width per vector from a
        one-vector probe)."""
        probe = _projections.gaussian(jax.random.key(0), dim, 1)
        shape = jax.ShapeDtypeStruct((1, dim), jnp.float32)
        per_vector = jax.eval_shape(
            lambda x: feature_map.features(x, probe, side="query"), shape
        ).shape[-1]
        if self.n_components % per_vector:
            raise ValueError(
                f"n_components must be a multiple of {per_vector} for features="
                f"{self.features!r} ({per_vector} outputs per projection vector), got "
                f"{self.n_components}"
            )
        return self.n_components // per_vector

    def fit(self, X, y=None):
        """Validates the parameters and ``X`` and draws the projection.

        Args:
          X: array-like of shape ``(n_samples, n_features)``; only its width is used (and, for a
            feature map with data-fitted parameters, its rows).
          y: ignored.

        Returns:
          self.

        Raises:
          ValueError: for an invalid parameter (the message names it) or invalid ``X``.
        """
        self._validate_params()
        X = validate_data(self, X, dtype=[np.float64, np.float32])
        dim = X.shape[1]
        seed = int(check_random_state(self.random_state).randint(2**31 - 1))
        self._compute_dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
        key = jax.random.key(seed)
        feature_map = _features.get(self.features)().init(
            jax.random.fold_in(key, 1), dim, dtype=self._compute_dtype
        )
        if feature_map.fitted_fields:
            u = jnp.asarray(X, self._compute_dtype) / self._lengthscale()
            feature_map = feature_map.fit(jax.random.fold_in(key, 2), u, u)
        coupling = self.coupling
        if dim < _projections.info(coupling).min_dim:
            coupling = "gaussian"
        self.feature_map_ = feature_map
        self.projection_ = _projections.get(coupling)(
            key, dim, self._num_vectors(feature_map, dim), dtype=self._compute_dtype
        )
        self._n_features_out = self.n_components
        return self

    def _lengthscale(self) -> float:
        return 1.0 / math.sqrt(2.0 * float(self.gamma))

    def transform(self, X):
        """Maps ``X`` to random features.

        Args:
          X: array-like of shape ``(n_samples, n_features_in_)``.

        Returns:
          A numpy array of shape ``(n_samples, n_components)``, float32 for float32 input,
          float64 otherwise.
        """
        check_is_fitted(self)
        X = validate_data(self, X, dtype=[np.float64, np.float32], reset=False)
        out_dtype = X.dtype
        compute_dtype = self._compute_dtype if X.dtype == np.float64 else jnp.float32
        x = jnp.asarray(X, dtype=compute_dtype)
        z = _transform(
            x,
            self.projection_,
            self.feature_map_,
            self._lengthscale(),
            self.kernel,
            _features.info(self.features).kernel,
        )
        return np.asarray(z, dtype=out_dtype)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags


__all__ = ["KERNELS", "RandomFeatures", "feature_names"]
