"""A scikit-learn front door: ``RandomFeatures``, a drop-in transformer for ``RBFSampler``.

``RandomFeatures`` draws a coupled projection (any name in ``rfjax.projections.available()``)
in ``fit`` and maps inputs to random features in ``transform``, so that Z(X) Z(Y)^T estimates
the Gaussian kernel exp(-gamma |x - y|^2) (or the softmax kernel exp(2 gamma x.y)). It passes
``sklearn.utils.estimator_checks.check_estimator`` (with the default Fourier features, odd
widths included, and with positive features) and can replace
``sklearn.kernel_approximation.RBFSampler`` in a ``Pipeline``.

Example:
  >>> from sklearn.pipeline import make_pipeline
  >>> from sklearn.linear_model import RidgeClassifier
  >>> from rfjax.sklearn import RandomFeatures
  >>> model = make_pipeline(RandomFeatures(gamma=0.01, random_state=0), RidgeClassifier())
  >>> import numpy as np
  >>> RandomFeatures(n_components=5, random_state=0).fit_transform(np.ones((3, 2))).shape
  (3, 5)
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import warnings
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike
from sklearn.base import BaseEstimator, ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from rfjax import features as _features
from rfjax import projections as _projections
from rfjax._validation import check_array_size, check_representable

Kernel = Literal["gaussian", "softmax"]
KERNELS: tuple[Kernel, ...] = ("gaussian", "softmax")
# What ``features="auto"`` means per kernel (see ``RandomFeatures``, "Which features").
AUTO_FEATURES: dict[Kernel, str] = {"gaussian": "fourier", "softmax": "positive"}


def feature_names() -> tuple[str, ...]:
    """The ``features`` that ``RandomFeatures`` takes: the registered symmetric feature maps of
    the softmax or Gaussian kernel (``rfjax.features.available()``)."""
    return tuple(
        name
        for name in _features.available()
        if _features.info(name).kernel in KERNELS and _features.get(name)().symmetric
    )


# ``transform`` runs on blocks of this many rows (the last block zero-padded, the padding rows
# dropped): one compiled shape per fitted estimator and input dtype, whatever n_samples is.
BLOCK_ROWS = 1024
# The features estimate k(x, x) (1 for the Gaussian kernel, exp(2 gamma |x|^2) for the softmax
# kernel) by |z(x)|^2; ``fit`` warns when that estimate is below this fraction of k(x, x) on at
# least half of the fit rows (the features then carry almost no information about the kernel).
DEGENERATE_FEATURES = 1e-2


# ``fit`` runs a sampler once per setting, so its XLA program is compiled for compile time, not
# run time: backend optimisation level 0 (LLVM's cheap pipeline) about halves a cold fit, where
# compilation is nearly all the time (issue 20, item 3); the draw is the same up to rounding.
FAST_COMPILE = {"xla_backend_optimization_level": 0}


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class OddCosine:
    """The odd feature of an odd ``n_components`` with ``features="fourier"``: sqrt(2) cos(w.u
    + b) with its own i.i.d. w ~ N(0, I_d) and b ~ U[0, 2 pi) (``rfjax.features.cosine_features``).

    Attributes:
      projection: the one-row projection w.
      offsets: b, shape ``(1,)``.
    """

    projection: _projections.Projection
    offsets: jax.Array


@functools.partial(
    jax.jit,
    static_argnames=("features", "coupling", "dim", "num_vectors", "odd", "dtype"),
    compiler_options=FAST_COMPILE,
)
def _draw(
    seed: jax.Array,
    *,
    features: str,
    coupling: str,
    dim: int,
    num_vectors: int,
    odd: bool,
    dtype: jnp.dtype,
) -> tuple[_features.FeatureMap, _projections.Projection | None, OddCosine | None, jax.Array]:
    """Everything ``fit`` draws from ``jax.random.key(seed)``, as one program compiled with
    ``FAST_COMPILE`` (one compilation per setting instead of one per key derivation, sampler
    and offset): the feature map's initial parameters (key folded with 1), the projection of
    ``coupling`` (the key itself; None for no vectors), the odd cosine feature (key folded with
    3) and the key for fitting a data-fitted map (folded with 2)."""
    key = jax.random.key(seed)
    feature_map = _features.get(features)().init(jax.random.fold_in(key, 1), dim, dtype=dtype)
    projection = (
        _projections.get(coupling)(key, dim, num_vectors, dtype=dtype) if num_vectors else None
    )
    odd_feature = None
    if odd:
        odd_key = jax.random.fold_in(key, 3)
        odd_feature = OddCosine(
            _projections.gaussian(odd_key, dim, 1, dtype=dtype),
            _features.random_offsets(jax.random.fold_in(odd_key, 1), 1, dtype=dtype),
        )
    return feature_map, projection, odd_feature, jax.random.fold_in(key, 2)


class TransformOptions(NamedTuple):
    """The static settings of ``_transform_block`` that a ``RandomFeatures.fit`` fixes."""

    lengthscale: float
    kernel: Kernel
    native_kernel: Kernel | None


@functools.partial(jax.jit, static_argnames=("lengthscale", "kernel", "native_kernel"))
def _transform_block(
    x: jax.Array,
    projection: _projections.Projection | None,
    feature_map: _features.FeatureMap,
    odd: OddCosine | None,
    lengthscale: float,
    kernel: Kernel,
    native_kernel: Kernel,
) -> jax.Array:
    """The features of ``RandomFeatures.transform`` for one block of ``BLOCK_ROWS`` rows.

    With u = x / l, a map of ``kernel`` gives its features of u. A map of the softmax kernel
    gives the Gaussian kernel (``rfjax.features.gaussian_kernel_features``).
    With an odd feature (n = 2m + 1 outputs), the m sin/cos pairs and the cosine are averaged
    with weights 2m/n and 1/n, each an unbiased estimate of K.
    """
    u = x / jnp.asarray(lengthscale, x.dtype)
    blocks = []
    if projection is not None:
        if kernel == native_kernel:
            z = feature_map.features(u, projection, side="query")
        else:
            z = _features.gaussian_kernel_features(feature_map, u, projection)
        blocks.append(z)
    if odd is not None:
        blocks.append(_features.cosine_features(u, odd.projection, odd.offsets))
    if len(blocks) == 1:
        return blocks[0]
    pairs = blocks[0].shape[-1] // 2
    width = 2 * pairs + 1
    return jnp.concatenate(
        [blocks[0] * math.sqrt(2 * pairs / width), blocks[1] * math.sqrt(1 / width)], axis=-1
    )


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

      ``features="fourier"``: ``rfjax.features.fourier_features``, [sin(W u), cos(W u)] / sqrt(m)
      with m = ``n_components // 2`` projection vectors. An odd ``n_components`` = 2m + 1 adds
      one cosine feature sqrt(2) cos(w.u + b) (``rfjax.features.cosine_features``, with its own
      i.i.d. w and offset b ~ U[0, 2 pi), ``odd_feature_``), the two estimates weighted 2m/n and
      1/n: Z = sqrt(2/n) [sin(W u), cos(W u), cos(w.u + b)], still unbiased. With
      ``n_components=1`` this is exactly ``RBFSampler``'s single feature.
      ``features="positive"``: ``rfjax.features.positive_features`` with m = ``n_components``
      projection vectors; every feature is positive (FAVOR+).
      ``features="auto"`` (default): ``"fourier"`` for ``kernel="gaussian"``, ``"positive"`` for
      ``kernel="softmax"`` (the only maps of that kernel here are the positive and trigonometric
      ones).

    Which features (the drop-in default): on standardised data, Fourier features with an
    orthogonal coupling approximate the RBF Gram matrix better than ``RBFSampler``, positive
    features worse (``benchmarks/sklearn_gram_error.py``: 300 standardised digits, d = 64,
    gamma = 1/d, 512 components, relative Frobenius error |Z Z^T - K|_F / |K|_F, mean +- 1 SE
    over 10 paired seeds: ``RBFSampler`` 0.151 +- 0.003; Fourier with i.i.d. 0.147 +- 0.003,
    orthogonal 0.108 +- 0.001 (the default), simplex 0.109 +- 0.001; positive with simplex
    0.42 +- 0.16, heavy-tailed). Positive features are the better choice when the features must
    be positive (attention-style normalisers, sampled softmax, non-negative models) and for the
    softmax kernel; for the Gaussian kernel they need small inputs: their variance per feature,
    exp(2 |u + v|^2 - 2 |u|^2 - 2 |v|^2) - K^2 with u = x / l, grows with the inputs' norms,
    and for gamma |x|^2 >> 1 they underflow (``fit`` warns when the features' estimate
    |z(x)|^2 of k(x, x) is at most ``DEGENERATE_FEATURES`` = 0.01 of it on half of the fit rows).

    Couplings: ``"orthogonal"`` and ``"simplex"`` (exactly N(0, I) rows, coupled in blocks of d)
    lower the error against ``"gaussian"`` (i.i.d.), as measured above. ``"halton"``
    (randomised quasi-Monte Carlo) helps only in low input dimension: on the same digits
    projected to their first 8 principal components (d = 8) Fourier/Halton has 0.102 +- 0.001
    against i.i.d.'s 0.133 +- 0.005 (orthogonal 0.104 +- 0.003), but at d = 64 it has
    0.38 +- 0.01, 2.6x the i.i.d. error (the Halton coordinates of large prime bases are
    strongly correlated over the first m points). Use it for d of about 10 or less, not for d
    in the tens or more.

    Randomness: ``fit`` draws one integer ``seed = check_random_state(random_state).randint(2**31
    - 1)`` and samples the projection from ``jax.random.key(seed)``. A fixed ``random_state``
    therefore gives the same features on every fit; ``None`` gives fresh features each fit.

    Precision: when JAX runs with 64-bit floats enabled (``jax_enable_x64``) and the input is
    float64, features are computed in float64; otherwise in float32. The output has the dtype of
    the validated input (float64 or float32; other inputs are converted to float64), as for
    ``RBFSampler``. Float64 input whose scaled values X / lengthscale lie beyond the compute
    dtype's range raises a ``ValueError`` (in float32 they would become infinite, the features
    NaN).

    One input feature: couplings that need at least two input dimensions (``min_dim`` in
    ``rfjax.projections.info``: the simplex couplings) fall back to the ``gaussian`` (i.i.d.)
    coupling for one-dimensional inputs, which is what any coupling of a single direction
    amounts to.

    Speed: ``transform`` runs in blocks of ``BLOCK_ROWS`` rows through one compiled function, so a
    new ``n_samples`` compiles nothing. A cold ``fit`` + ``transform`` compiles two programs, once
    per setting and process: everything ``fit`` draws (key derivations, the coupling's sampler,
    the map's initial parameters), compiled at XLA's backend optimisation level 0
    (``FAST_COMPILE``: it runs once per fit, so compile time matters more than run time), and the
    block function. A second ``fit`` with the same ``features``, ``coupling``, ``n_components``,
    input width and dtype, whatever its ``random_state``, compiles nothing;
    ``benchmarks/sklearn_transform.py`` measures both against ``RBFSampler``.

    Parameters:
      kernel: ``"gaussian"`` (default) or ``"softmax"``.
      coupling: a name from ``rfjax.projections.available()``; default ``"orthogonal"``.
      features: ``"auto"`` (default, see above) or a name from ``feature_names()``:
        ``"fourier"`` (Gaussian kernel only), ``"positive"``, ``"positive_antithetic"``,
        ``"trigonometric"``...
      n_components: output width (default 100); a multiple of the map's width per projection
        vector, except for ``"fourier"``, which takes any width >= 1.
      gamma: kernel parameter gamma > 0 (default 1.0).
      random_state: ``None``, an int or a ``numpy.random.RandomState`` (see Randomness).

    Attributes:
      projection_: the drawn ``rfjax.projections.Projection`` (a pytree; ``.matrix()`` gives the
        dense weight matrix of shape ``(num_vectors, n_features_in_)``).
      odd_feature_: the ``OddCosine`` of an odd ``n_components`` with ``"fourier"``, else None
        (``projection_`` is None when ``n_components == 1``).
      features_: the feature map's name (``features`` with ``"auto"`` resolved).
      feature_map_: the ``rfjax.features.FeatureMap`` with its parameters.
      n_features_in_: number of input features seen in ``fit``.
      feature_names_in_: input feature names, when ``X`` had string column names.
    """

    def __init__(
        self,
        kernel: Kernel = "gaussian",
        coupling: str = "orthogonal",
        features: str = "auto",
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
        names = ("auto", *feature_names())
        if not isinstance(self.features, str) or self.features not in names:
            raise ValueError(f"features must be one of {names}, got {self.features!r}")
        native_kernel = _features.info(self._resolved_features()).kernel
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

    def _resolved_features(self) -> str:
        """The feature map's name: ``features``, with ``"auto"`` resolved by the kernel."""
        if self.features == "auto":
            return AUTO_FEATURES[self.kernel]
        return self.features

    def _layout(self, dim: int) -> tuple[int, bool]:
        """(m, odd): the projection vectors for ``n_components`` outputs, and whether one odd
        cosine feature completes an odd width (``features="fourier"`` only). The width per
        vector comes from tracing the map's initialisation and features on a one-vector
        projection (nothing is compiled)."""

        def width(x):
            key = jax.random.key(0)
            feature_map = _features.get(self.features_)().init(key, dim, dtype=x.dtype)
            return feature_map.features(x, _projections.gaussian(key, dim, 1), side="query")

        shape = jax.ShapeDtypeStruct((1, dim), jnp.float32)
        per_vector = jax.eval_shape(width, shape).shape[-1]
        num_vectors, rest = divmod(self.n_components, per_vector)
        if rest and self.features_ != "fourier":
            raise ValueError(
                f"n_components must be a multiple of {per_vector} for features="
                f"{self.features_!r} ({per_vector} outputs per projection vector), got "
                f"{self.n_components}"
            )
        return num_vectors, bool(rest)

    def fit(self, X: ArrayLike, y: object = None) -> RandomFeatures:
        """Validates the parameters and ``X`` and draws the projection.

        Args:
          X: array-like of shape ``(n_samples, n_features)``; only its width is used (and, for a
            feature map with data-fitted parameters, its rows), and its first ``BLOCK_ROWS``
            rows for the degenerate-feature check.
          y: ignored.

        Returns:
          self.

        Raises:
          ValueError: for an invalid parameter (the message names it) or invalid ``X``, or an
            ``n_components`` whose features of one block of ``BLOCK_ROWS`` rows exceed
            ``rfjax._validation.MAX_ARRAY_BYTES`` (2^19 components in float32), refused before
            anything compiles (XLA's CPU runtime aborts the interpreter on an allocation it
            cannot make).

        Warns:
          UserWarning: if the median over the first ``BLOCK_ROWS`` rows of ``X`` of |z(x)|^2,
            the features' estimate of k(x, x), over k(x, x) is at most ``DEGENERATE_FEATURES`` (e.g.
            positive features with a ``gamma`` too large for the scale of ``X``): the features
            then carry almost no information about the kernel.
        """
        self._validate_params()
        data: np.ndarray = validate_data(self, X, dtype=[np.float64, np.float32])
        dim = data.shape[1]
        seed = int(check_random_state(self.random_state).randint(2**31 - 1))
        self._compute_dtype = jnp.float64 if jax.config.jax_enable_x64 else jnp.float32
        self.features_ = self._resolved_features()
        coupling = self.coupling
        if dim < _projections.info(coupling).min_dim:
            coupling = "gaussian"
        num_vectors, odd = self._layout(dim)
        check_array_size(
            "the features of a transform block",
            (BLOCK_ROWS, self.n_components),
            self._compute_dtype,
            {"n_components": self.n_components},
        )
        feature_map, self.projection_, self.odd_feature_, fit_key = _draw(
            np.int32(seed),
            features=self.features_,
            coupling=coupling,
            dim=dim,
            num_vectors=num_vectors,
            odd=odd,
            dtype=self._compute_dtype,
        )
        check_representable(data, self._compute_dtype, lengthscale=self._lengthscale())
        if feature_map.fitted_fields:
            u = jnp.asarray(data, self._compute_dtype) / self._lengthscale()
            feature_map = feature_map.fit(fit_key, u, u)
        self.feature_map_ = feature_map
        # What transform applies: the settings of this fit, not parameters set after it.
        self._n_features_out = self.n_components
        self._transform_options = TransformOptions(
            self._lengthscale(), self.kernel, _features.info(self.features_).kernel
        )
        self._warn_if_degenerate(data[:BLOCK_ROWS])
        return self

    def _warn_if_degenerate(self, X: np.ndarray) -> None:
        if not len(X):
            return
        squared_norms = np.sum(X * X, axis=1)
        log_kernel_diagonal = 2.0 * float(self.gamma) * squared_norms * (self.kernel == "softmax")
        with np.errstate(divide="ignore"):
            log_estimate = np.log(np.sum(np.square(self.transform(X)), axis=1))
        ratio = float(np.exp(np.median(log_estimate - log_kernel_diagonal)))
        if not ratio > DEGENERATE_FEATURES:
            scale = float(np.median(squared_norms)) * float(self.gamma)
            warnings.warn(
                f"RandomFeatures(features={self.features_!r}, gamma={self.gamma}): the features' "
                f"estimate |z(x)|^2 of k(x, x) is a fraction {ratio:.1e} of it (median over the "
                f"fit data), so the features carry almost no information about the kernel (the "
                f"median gamma |x|^2 is {scale:.3g}; positive features decay like "
                f"exp(-gamma |x|^2)). Use features='fourier', a smaller gamma, or rescale X",
                UserWarning,
                stacklevel=3,
            )

    def _lengthscale(self) -> float:
        return 1.0 / math.sqrt(2.0 * float(self.gamma))

    def transform(self, X: ArrayLike) -> np.ndarray:
        """Maps ``X`` to random features.

        The rows go through one compiled function in blocks of ``BLOCK_ROWS`` (the last block
        zero-padded, its padding dropped), so a new ``n_samples`` compiles nothing and every
        row's features are those of the row alone.

        Args:
          X: array-like of shape ``(n_samples, n_features_in_)``.

        Returns:
          A numpy array of shape ``(n_samples, n_components)``, float32 for float32 input,
          float64 otherwise. The features are those of the last ``fit``: parameters set after
          it (``set_params``) take effect at the next ``fit``, as for ``RBFSampler``.
        """
        check_is_fitted(self)
        data: np.ndarray = validate_data(self, X, dtype=[np.float64, np.float32], reset=False)
        compute_dtype = self._compute_dtype if data.dtype == np.float64 else jnp.float32
        options = self._transform_options
        check_representable(data, compute_dtype, lengthscale=options.lengthscale)
        out = np.empty((data.shape[0], self._n_features_out), data.dtype)
        for start in range(0, data.shape[0], BLOCK_ROWS):
            rows = data[start : start + BLOCK_ROWS]
            block = np.zeros((BLOCK_ROWS, data.shape[1]), compute_dtype)
            block[: len(rows)] = rows
            z = _transform_block(
                block,  # a NumPy block goes to the device with the call (no staging program)
                self.projection_,
                self.feature_map_,
                self.odd_feature_,
                **options._asdict(),
            )
            out[start : start + len(rows)] = np.asarray(z)[: len(rows)]
        return out

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags


__all__ = [
    "AUTO_FEATURES",
    "BLOCK_ROWS",
    "DEGENERATE_FEATURES",
    "FAST_COMPILE",
    "KERNELS",
    "OddCosine",
    "RandomFeatures",
    "feature_names",
]
