"""Hybrid random features (HRF): mixtures of base estimators with linearisable coefficients.

The HRF estimator (Eq. 8) mixes p + 1 base estimators K-hat_k(x, y) = phi_k(x).psi_k(y) with
coefficient estimators lambda-hat_k(x, y) = a_k + rho_k(x).eta_k(y) (Eq. 9-10):

  K-hat_hyb = sum_{k<=p} lambda-hat_k K-hat_k + (1 - sum_{k<=p} lambda-hat_k) K-hat_{p+1}.

Lemma 2.3 (Eq. 11) writes it as one dot product Psi(x).Psi'(y) through Kronecker products of the
features, so it plugs into linear attention like any other feature map. The two sides differ
(the estimator is asymmetric): query features carry the offsets a_k, key features the signs.

References:
  Choromanski et al., "Hybrid Random Features", ICLR 2022, arXiv:2110.04367.
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Sequence
from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike

from rfjax._validation import check_choice, check_inputs, check_int, check_real
from rfjax.features._common import check_projection, merge_trailing_axes
from rfjax.features._complex_exponential import check_side
from rfjax.features._fourier import (
    LogScaledFeatureMap,
    exponentiated,
    fourier_features,
    shift_log_scale,
    trigonometric_parts,
)
from rfjax.features._pointwise import angular_features
from rfjax.features._positive import positive_features, positive_log_features
from rfjax.features._protocol import FeatureMap, ScaledFeatures, Side
from rfjax.projections import Projection, gaussian

CoefficientEstimator = Literal["trigonometric", "positive"]
COEFFICIENT_ESTIMATORS: tuple[CoefficientEstimator, ...] = ("trigonometric", "positive")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class FeaturePair:
    """Query-side and key-side features of an asymmetric estimator K-hat = query . key.

    Attributes:
      query: phi(x), shape ``(..., width)``.
      key: psi(y), shape ``(..., width)``.
    """

    query: jax.Array
    key: jax.Array

    def estimate(self) -> jax.Array:
        """Pairwise estimates sum_j query_j key_j (leading axes broadcast)."""
        return jnp.sum(self.query * self.key, axis=-1)


def _check_feature_list(name: str, values: object, count: int | None = None) -> list[jax.Array]:
    if isinstance(values, jax.Array) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of feature arrays, got {type(values).__name__}")
    arrays = [check_inputs(f"{name}[{i}]", value) for i, value in enumerate(values)]
    if count is not None and len(arrays) != count:
        raise ValueError(f"{name} must hold {count} arrays, got {len(arrays)}")
    return arrays


def _check_counts(base_features: object, coefficient_features: object) -> tuple[list, list]:
    bases = _check_feature_list("base_features", base_features)
    if not bases:
        raise ValueError("base_features must hold at least one array (p + 1 >= 1 estimators)")
    coefficients = _check_feature_list(
        "coefficient_features", coefficient_features, count=len(bases) - 1
    )
    return bases, coefficients


def _kron(a: jax.Array, b: jax.Array) -> jax.Array:
    """Vectorised outer product per input: (..., n) x (..., w) -> (..., n w), np.kron order."""
    batch = jnp.broadcast_shapes(a.shape[:-1], b.shape[:-1])
    outer = a[..., :, None] * b[..., None, :]
    return merge_trailing_axes(jnp.broadcast_to(outer, (*batch, *outer.shape[-2:])), 2)


def concatenate_blocks(blocks: list[jax.Array]) -> jax.Array:
    """Concatenates feature blocks along the last axis, broadcasting their leading axes."""
    batch = jnp.broadcast_shapes(*(block.shape[:-1] for block in blocks))
    dtype = jnp.result_type(*blocks)
    return jnp.concatenate(
        [jnp.broadcast_to(b, (*batch, b.shape[-1])).astype(dtype) for b in blocks], axis=-1
    )


def hybrid_query_features(
    base_features: Sequence[jax.Array],
    coefficient_features: Sequence[jax.Array],
    offsets: Sequence[float],
) -> jax.Array:
    """Query-side hybrid features Psi(x) of Lemma 2.3 (HRF Eq. 11).

    With base features phi_1..phi_{p+1}, coefficient features rho_1..rho_p and offsets a_k,

      Psi(x) = [a_k phi_k(x); rho_k(x) (x) phi_k(x)]_{k=1..p} ; (1 - sum_k a_k) phi_{p+1}(x) ;
               [rho_k(x) (x) phi_{p+1}(x)]_{k=1..p},

    where (x) is the vectorised Kronecker product (index l w + j holds rho_l phi_j). Paired with
    ``hybrid_key_features`` of the same bases and coefficients,
    Psi(x).Psi'(y) = sum_k lambda-hat_k K-hat_k + (1 - sum_k lambda-hat_k) K-hat_{p+1} exactly
    (Eq. 8), with lambda-hat_k = a_k + rho_k(x).eta_k(y) and K-hat_k = phi_k(x).psi_k(y).

    Args:
      base_features: phi_1(x), ..., phi_{p+1}(x), shapes ``(..., w_k)``.
      coefficient_features: rho_1(x), ..., rho_p(x), shapes ``(..., n_k)``.
      offsets: a_1, ..., a_p (static real numbers).

    Returns:
      Psi(x), shape ``(..., sum_{k<=p} w_k (1 + n_k) + w_{p+1} (1 + sum_k n_k))``.

    Raises:
      TypeError: if an entry is not a floating array or an offset is not a real number.
      ValueError: if the counts are not p + 1, p and p, or an offset is not finite.

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Lemma 2.3 (Eq. 9-11).
    """
    bases, coefficients = _check_counts(base_features, coefficient_features)
    if isinstance(offsets, jax.Array) or not isinstance(offsets, Sequence):
        raise TypeError(f"offsets must be a sequence of real numbers, got {type(offsets).__name__}")
    offsets = [check_real(f"offsets[{i}]", a) for i, a in enumerate(offsets)]
    if len(offsets) != len(coefficients):
        raise ValueError(
            f"offsets must hold one a_k per coefficient ({len(coefficients)}), got {len(offsets)}"
        )
    blocks = []
    for a, phi, rho in zip(offsets, bases[:-1], coefficients, strict=True):
        blocks += [a * phi, _kron(rho, phi)]
    blocks.append((1.0 - sum(offsets)) * bases[-1])
    blocks += [_kron(rho, bases[-1]) for rho in coefficients]
    return concatenate_blocks(blocks)


def hybrid_key_features(
    base_features: Sequence[jax.Array], coefficient_features: Sequence[jax.Array]
) -> jax.Array:
    """Key-side hybrid features Psi'(y) of Lemma 2.3 (HRF Eq. 11).

      Psi'(y) = [psi_k(y); eta_k(y) (x) psi_k(y)]_{k=1..p} ; psi_{p+1}(y) ;
                [-eta_k(y) (x) psi_{p+1}(y)]_{k=1..p}.

    See ``hybrid_query_features`` for the query side and the identity.

    Args:
      base_features: psi_1(y), ..., psi_{p+1}(y), shapes ``(..., w_k)`` (the widths of the
        query side).
      coefficient_features: eta_1(y), ..., eta_p(y), shapes ``(..., n_k)``.

    Returns:
      Psi'(y), of the width of ``hybrid_query_features``.

    Raises:
      TypeError: if an entry is not a floating array.
      ValueError: if the counts are not p + 1 and p.
    """
    bases, coefficients = _check_counts(base_features, coefficient_features)
    blocks = []
    for psi, eta in zip(bases[:-1], coefficients, strict=True):
        blocks += [psi, _kron(eta, psi)]
    blocks.append(bases[-1])
    blocks += [-_kron(eta, bases[-1]) for eta in coefficients]
    return concatenate_blocks(blocks)


def hybrid_features(
    bases: Sequence[FeaturePair], coefficients: Sequence[FeaturePair], offsets: Sequence[float]
) -> FeaturePair:
    """Both sides of the hybrid feature map (Lemma 2.3): ``FeaturePair(Psi(x), Psi'(y))``.

    Args:
      bases: p + 1 pairs ``FeaturePair(phi_k(x), psi_k(y))`` with K-hat_k = phi_k . psi_k.
      coefficients: p pairs ``FeaturePair(rho_k(x), eta_k(y))``, drawn independently of the
        bases, with lambda-hat_k = a_k + rho_k . eta_k.
      offsets: a_1..a_p.

    Returns:
      ``FeaturePair`` whose ``estimate()`` is the HRF estimate of Eq. 8.

    Raises:
      TypeError: if an entry of ``bases`` or ``coefficients`` is not a ``FeaturePair``.
      ValueError: as ``hybrid_query_features``.

    Examples:
      >>> import jax.numpy as jnp
      >>> base = FeaturePair(jnp.ones((2, 3)), jnp.ones((2, 3)))
      >>> coef = FeaturePair(jnp.full((2, 1), 0.5), jnp.full((2, 1), 0.5))
      >>> hybrid_features([base, base], [coef], [0.0]).estimate().tolist()
      [3.0, 3.0]

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Eq. 8-11.
    """
    for name, pairs in (("bases", bases), ("coefficients", coefficients)):
        for i, pair in enumerate(pairs):
            if not isinstance(pair, FeaturePair):
                raise TypeError(f"{name}[{i}] must be a FeaturePair, got {type(pair).__name__}")
    return FeaturePair(
        hybrid_query_features([b.query for b in bases], [c.query for c in coefficients], offsets),
        hybrid_key_features([b.key for b in bases], [c.key for c in coefficients]),
    )


def hybrid_estimate(
    base_estimates: Sequence[jax.Array], coefficient_estimates: Sequence[jax.Array]
) -> jax.Array:
    """The HRF estimate of Eq. 8 from base estimates K-hat_k and coefficient estimates.

      K-hat_hyb = sum_{k<=p} lambda-hat_k K-hat_k + (1 - sum_{k<=p} lambda-hat_k) K-hat_{p+1}.

    Unbiased for K when every K-hat_k is unbiased and the lambda-hat_k are unbiased and
    independent of the base estimators. ``hybrid_features`` gives the same value as a dot
    product of features (Lemma 2.3).

    Args:
      base_estimates: K-hat_1, ..., K-hat_{p+1}, arrays of broadcastable shapes.
      coefficient_estimates: lambda-hat_1, ..., lambda-hat_p.

    Returns:
      The hybrid estimate, of the broadcast shape.

    Raises:
      ValueError: if the counts are not p + 1 and p.

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Eq. 8.
    """
    bases = [jnp.asarray(k) for k in base_estimates]
    lambdas = [jnp.asarray(c) for c in coefficient_estimates]
    if not bases or len(lambdas) != len(bases) - 1:
        raise ValueError(
            f"need p + 1 >= 1 base estimates and p coefficient estimates, got "
            f"{len(bases)} and {len(lambdas)}"
        )
    total = sum((lam * k for lam, k in zip(lambdas, bases[:-1], strict=True)), jnp.zeros(()))
    return total + (1.0 - sum(lambdas, jnp.zeros(()))) * bases[-1]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class HybridParts:
    """One side of a hybrid estimator in log-space form, before Lemma 2.3's Kronecker products.

    The base features are scaled by the per-row e^s of ``log_scale`` (as ``ScaledFeatures``);
    the coefficient features are rho_k(x) on the query side and eta_k(y) on the key side, so
    that lambda-hat_k = a_k + rho_k(x).eta_k(y).

    Attributes:
      bases: the p + 1 scaled base features, shapes ``(..., w_k)``.
      coefficients: the p coefficient features, shapes ``(..., n_k)``.
      log_scale: s, shape ``(...)``.
      offsets: a_1..a_p (static).
      side: ``"query"`` or ``"key"`` (static).
    """

    bases: list[jax.Array]
    coefficients: list[jax.Array]
    log_scale: jax.Array
    offsets: tuple[float, ...] = dataclasses.field(metadata={"static": True})
    side: Side = dataclasses.field(metadata={"static": True})

    def scaled_features(self) -> ScaledFeatures:
        """The flat features of Lemma 2.3 (``hybrid_query_features`` or
        ``hybrid_key_features``) in log-space form."""
        if self.side == "query":
            flat = hybrid_query_features(self.bases, self.coefficients, list(self.offsets))
        else:
            flat = hybrid_key_features(self.bases, self.coefficients)
        return ScaledFeatures(flat, self.log_scale)


def hybrid_gram(query: HybridParts, key: HybridParts) -> jax.Array:
    """The hybrid estimates Psi(x_i).Psi'(y_j) of every query row and key row, ``(N, M)``,
    from the factors: Eq. 8 on the Gram matrices of the bases and coefficients, times
    e^(s_i + s_j).

    Equal to the flat features' ``Psi(X) @ Psi'(Y).T`` (Lemma 2.3) up to rounding, at a cost of
    N M (sum_k w_k + sum_k n_k) multiply-adds instead of N M sum_k w_k (1 + n): for the angular
    hybrid with m base projections and n signs, N M (4 m + n) instead of N M 4 m (n + 1).

    Args:
      query: ``HybridParts`` of side ``"query"`` for ``(N, d)`` inputs.
      key: ``HybridParts`` of side ``"key"`` for ``(M, d)`` inputs, of the same estimator.

    Returns:
      ``(N, M)`` estimates (+-inf where e^(s_i + s_j) overflows the dtype).

    Raises:
      ValueError: if the sides, counts, widths or offsets do not match, or an input is not
        a matrix of rows.

    Examples:
      >>> import jax
      >>> from rfjax import features, projections
      >>> fmap = features.AngularHybridFeatureMap(num_sign_features=3).init(jax.random.key(1), 4)
      >>> w = projections.gaussian(jax.random.key(0), 4, 8)
      >>> x, y = 0.5 * jax.random.normal(jax.random.key(2), (2, 5, 4))
      >>> gram = hybrid_gram(fmap.hybrid_parts(x, w, side="query"),
      ...                    fmap.hybrid_parts(y, w, side="key"))
      >>> flat = fmap.features(x, w, side="query") @ fmap.features(y, w, side="key").T
      >>> bool(jax.numpy.allclose(gram, flat, rtol=1e-5))
      True
    """
    if (query.side, key.side) != ("query", "key"):
        raise ValueError(f"need query-side and key-side parts, got {query.side!r}, {key.side!r}")
    if query.offsets != key.offsets or len(query.bases) != len(key.bases):
        raise ValueError("query and key parts must come from the same hybrid estimator")
    for a, b in zip(
        [*query.bases, *query.coefficients], [*key.bases, *key.coefficients], strict=True
    ):
        if a.ndim != 2 or b.ndim != 2 or a.shape[-1] != b.shape[-1]:
            raise ValueError(
                f"parts must be (rows, width) matrices of equal widths, got {a.shape}, {b.shape}"
            )
    bases = [a @ b.T for a, b in zip(query.bases, key.bases, strict=True)]
    pairs = zip(query.offsets, query.coefficients, key.coefficients, strict=True)
    lambdas = [offset + rho @ eta.T for offset, rho, eta in pairs]
    scaled = hybrid_estimate(bases, lambdas)
    scale = jnp.exp(query.log_scale)[:, None] * jnp.exp(key.log_scale)[None, :]
    return jnp.where(jnp.isinf(scale) & (scaled == 0), 0, scaled * scale)


def _check_base_projections(positive: object, trigonometric: object) -> None:
    positive = check_projection(positive, "positive_projection")
    trigonometric = check_projection(trigonometric, "trigonometric_projection")
    _check_same_dim("trigonometric_projection", trigonometric, positive)


def _check_same_dim(name: str, projection: Projection, positive: Projection) -> None:
    """``ValueError`` naming ``name`` when its input dimension is not the positive base's (the
    inputs' ``x`` is checked against the positive base: a mismatch here was blamed on x)."""
    if projection.dim != positive.dim:
        raise ValueError(
            f"{name} must have the input dimension of positive_projection, d = "
            f"{positive.dim}; got d = {projection.dim}"
        )


def _check_coefficient_projection(
    name: str, projection: Projection, *bases: Projection
) -> tuple[Projection, int]:
    projection = check_projection(projection, name)
    _check_same_dim(name, projection, bases[0])
    if any(projection is base for base in bases):
        raise ValueError(
            f"{name} must be drawn independently of the base projections (the coefficient "
            f"estimate must be independent of the base estimates); got the same projection"
        )
    if projection.num_features < 1:
        raise ValueError(
            f"{name} must have n >= 1 projection vectors, got n = {projection.num_features}"
        )
    return projection, projection.num_features


def angular_hybrid_features(
    x: jax.Array,
    positive_projection: Projection,
    trigonometric_projection: Projection,
    sign_projection: Projection,
    *,
    side: Side,
) -> jax.Array:
    """Angular hybrid (bipolar) features for the softmax kernel (HRF Eq. 12 and 19).

    The estimate Psi(x).Psi'(y) is

      lambda-hat SM-hat^{++}_m(x, y) + (1 - lambda-hat) SM-hat^{trig}_m(x, y),
      lambda-hat = 1/2 - (1/(2n)) sum_{l<=n} sgn(tau_l.x) sgn(tau_l.y),  E[lambda-hat] = theta/pi,

    with antithetic positive features (exact at theta = pi for equal norms) and trigonometric
    features (exact at theta = 0), so for inputs of equal norm the estimate has zero variance at
    both theta = 0 and theta = pi. Built by Lemma 2.3 with a = 1/2,
    rho(x) = sgn(T x)/sqrt(2n), eta(y) = -sgn(T y)/sqrt(2n).

    Variants (Theorem 3.1): pass two independently drawn projections as ``positive_projection``
    and ``trigonometric_projection`` for variant I (MSE of Eq. 22), or the *same* projection
    twice for variant II (shared w's, Eq. 23; lower MSE when |x| != |y|). ``sign_projection``
    must be independent of both. MSEs: ``rfjax.theory.angular_hybrid_mse``.

    Args:
      x: inputs, shape ``(..., d)``, floating.
      positive_projection: m_+ rows, for the antithetic positive base estimator.
      trigonometric_projection: m_t rows, for the trigonometric base estimator.
      sign_projection: n >= 1 rows tau_l, for the angular coefficient.
      side: ``"query"`` (Psi(x)) or ``"key"`` (Psi'(y)).

    Returns:
      Features of shape ``(..., (2 m_+ + 2 m_t)(n + 1))``: the positive block (2 m_+ and its
      Kronecker product with the n signs) then the trigonometric block (2 m_t and 2 m_t n).

    Raises:
      TypeError: if ``x`` is not floating or a projection is not a ``Projection``.
      ValueError: for a bad ``side``, a dimension mismatch, n < 1, or ``sign_projection`` being
        the same object as a base projection.

    Examples:
      >>> import jax
      >>> from rfjax import projections
      >>> k1, k2 = jax.random.split(jax.random.key(0))
      >>> w = projections.orthogonal(k1, 4, 8)
      >>> t = projections.gaussian(k2, 4, 3)
      >>> angular_hybrid_features(jax.numpy.ones((2, 4)), w, w, t, side="query").shape
      (2, 128)

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Eq. 12, 19, Theorem 3.1, Lemma 3.2.
    """
    scaled = _angular_hybrid_parts(
        x, positive_projection, trigonometric_projection, sign_projection, side=side
    ).scaled_features()
    return exponentiated(
        "angular_hybrid_features", scaled, x, trigonometric_projection.num_features
    )


def _scaled_bases(
    x: jax.Array, positive_projection: Projection, trigonometric_projection: Projection
) -> tuple[list[jax.Array], jax.Array]:
    """([psi_+, psi_trig], s): the hybrid maps' two base features, the antithetic positive
    (2 m_+) and the trigonometric ones (2 m_t), as psi e^s with one per-row log-scale
    s = max(max_i l_i, a) (a constant under differentiation; entries of psi at most 1), l the
    positive log-features and a = |x|^2/2 - log(m_t)/2 the trigonometric log-scale (HRF Eq. 2-3).
    Hybrid features (Lemma 2.3) are linear in the bases, so they share s; computed directly, the
    trigonometric block overflows (e^{|x|^2/2}) and the positive one underflows at large |x|."""
    log_positive = positive_log_features(x, positive_projection, antithetic=True)
    log_trigonometric, sin_cos = trigonometric_parts(x, trigonometric_projection)
    shift = jnp.maximum(jnp.max(log_positive, axis=-1), log_trigonometric)
    trigonometric, shift = shift_log_scale(log_trigonometric, sin_cos, shift)
    positive = jnp.exp(log_positive - shift[..., None])
    return [positive, trigonometric], shift


def _angular_hybrid_parts(
    x: jax.Array,
    positive_projection: Projection,
    trigonometric_projection: Projection,
    sign_projection: Projection,
    *,
    side: Side,
) -> HybridParts:
    """``angular_hybrid_features`` as ``HybridParts`` (same arguments and errors): a = 1/2,
    rho(x) = sgn(T x)/sqrt(2n), eta(y) = -sgn(T y)/sqrt(2n) on scaled bases."""
    side = check_side(side)
    _check_base_projections(positive_projection, trigonometric_projection)
    x = check_inputs("x", x, dim=positive_projection.dim)
    sign_projection, _ = _check_coefficient_projection(
        "sign_projection", sign_projection, positive_projection, trigonometric_projection
    )
    bases, log_scale = _scaled_bases(x, positive_projection, trigonometric_projection)
    signs = angular_features(x, sign_projection) * (1.0 / math.sqrt(2.0))  # sgn / sqrt(2n)
    coefficient = signs if side == "query" else -signs
    return HybridParts(bases, [coefficient], log_scale, (0.5,), side)


def gaussian_hybrid_features(
    x: jax.Array,
    positive_projection: Projection,
    trigonometric_projection: Projection,
    coefficient_projection: Projection,
    *,
    side: Side,
    bandwidth: float,
    radius: float,
    coefficient_estimator: CoefficientEstimator = "trigonometric",
) -> jax.Array:
    """Normalised bipolar Gaussian hybrid features for the softmax kernel (HRF Eq. 20, App. F).

    Reconstruction (HRF Eq. 20, docs/maths/hybrid.md; uncertain in the paper; this is the
    choice made): with bandwidth tau and the input length r (inputs on the sphere S(r)),

      lambda(x, y) = (exp(-|x + y|^2 / (2 tau^2)) - c) / (1 - c),   c = exp(-2 r^2 / tau^2),

    which is 0 at theta = 0 and 1 at theta = pi for |x| = |y| = r. The Gaussian factor is
    K_gauss(x/tau, -y/tau), estimated with n random features: ``"trigonometric"`` (Fourier
    sin/cos features of x/tau and -y/tau, the paper's choice; zero variance at theta = pi) or
    ``"positive"`` (positive Gaussian features; zero variance at theta = 0). Linearised as
    a = -c/(1-c), rho(x) = f(x)/sqrt(1-c), eta(y) = f(-y)/sqrt(1-c). The estimate is

      lambda-hat SM-hat^{++}(x, y) + (1 - lambda-hat) SM-hat^{trig}(x, y),

    unbiased for every input (lambda need not lie in [0, 1] off the sphere). For equal norms its
    variance vanishes at one end only (theta = pi with trigonometric coefficients); the angular
    hybrid vanishes at both. Projections: as ``angular_hybrid_features`` (same object twice for
    shared base projections); ``coefficient_projection`` independent of both.

    Args:
      x: inputs, shape ``(..., d)``, floating.
      positive_projection: m_+ rows, antithetic positive base estimator.
      trigonometric_projection: m_t rows, trigonometric base estimator.
      coefficient_projection: n >= 1 rows for the Gaussian coefficient.
      side: ``"query"`` or ``"key"``.
      bandwidth: tau > 0.
      radius: r > 0, the input length that fixes the normalisation c.
      coefficient_estimator: ``"trigonometric"`` or ``"positive"``.

    Returns:
      Features of shape ``(..., (2 m_+ + 2 m_t)(n_c + 1))`` with n_c = 2n (trigonometric
      coefficients) or n (positive).

    Raises:
      TypeError: if ``x`` is not floating or a projection is not a ``Projection``.
      ValueError: for a bad ``side`` or ``coefficient_estimator``, tau <= 0, r <= 0, a
        dimension mismatch, or ``coefficient_projection`` being a base projection.

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Eq. 20, App. F (Eq. 67-69).
    """
    scaled = _gaussian_hybrid_parts(
        x,
        positive_projection,
        trigonometric_projection,
        coefficient_projection,
        side=side,
        bandwidth=bandwidth,
        radius=radius,
        coefficient_estimator=coefficient_estimator,
    ).scaled_features()
    return exponentiated(
        "gaussian_hybrid_features", scaled, x, trigonometric_projection.num_features
    )


def _gaussian_hybrid_parts(
    x: jax.Array,
    positive_projection: Projection,
    trigonometric_projection: Projection,
    coefficient_projection: Projection,
    *,
    side: Side,
    bandwidth: float,
    radius: float,
    coefficient_estimator: CoefficientEstimator,
) -> HybridParts:
    """``gaussian_hybrid_features`` as ``HybridParts`` (same arguments and errors):
    a = -c/(1-c), rho(x) = f(x)/sqrt(1-c), eta(y) = f(-y)/sqrt(1-c) on scaled bases."""
    side = check_side(side)
    coefficient_estimator = check_choice(
        "coefficient_estimator", coefficient_estimator, COEFFICIENT_ESTIMATORS
    )
    bandwidth = check_real("bandwidth", bandwidth, positive=True)
    radius = check_real("radius", radius, positive=True)
    _check_base_projections(positive_projection, trigonometric_projection)
    x = check_inputs("x", x, dim=positive_projection.dim)
    coefficient_projection, _ = _check_coefficient_projection(
        "coefficient_projection",
        coefficient_projection,
        positive_projection,
        trigonometric_projection,
    )
    one_minus_c = -math.expm1(-2.0 * radius**2 / bandwidth**2)
    limit = float(jnp.finfo(x.dtype).max)
    if not one_minus_c > 0.0 or 1.0 / one_minus_c > limit:
        raise ValueError(
            f"radius / bandwidth = {radius / bandwidth:.3g} is too small: the normalisation "
            f"1 - exp(-2 r^2 / tau^2) = {one_minus_c:.3g} and the offset -c / (1 - c) are "
            f"beyond {jnp.dtype(x.dtype).name}'s range"
        )
    bases, log_scale = _scaled_bases(x, positive_projection, trigonometric_projection)
    u = x if side == "query" else -x
    if coefficient_estimator == "trigonometric":
        gauss = fourier_features(u, coefficient_projection, lengthscale=bandwidth)
    else:
        gauss = positive_features(
            u, coefficient_projection, kernel="gaussian", lengthscale=bandwidth
        )
    coefficient = gauss * (1.0 / math.sqrt(one_minus_c))
    offset = 1.0 - 1.0 / one_minus_c  # -c / (1 - c)
    return HybridParts(bases, [coefficient], log_scale, (offset,), side)


class HybridFeatureMap(LogScaledFeatureMap):
    """The hybrid maps' common part: the log-space form from the factors ``hybrid_parts``
    returns (the subclass's)."""

    @abc.abstractmethod
    def hybrid_parts(self, x: jax.Array, projection: Projection, *, side: Side) -> HybridParts:
        """The factors of ``scaled_features`` (for ``hybrid_gram``)."""

    def scaled_features(
        self, x: jax.Array, projection: Projection, *, side: Side
    ) -> ScaledFeatures:
        return self.hybrid_parts(x, projection, side=side).scaled_features()


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class AngularHybridFeatureMap(HybridFeatureMap):
    """``angular_hybrid_features`` as a ``FeatureMap``: variant II (the projection serves both
    base estimators) with its own sign projection (n rows, drawn by ``init``). Width
    (4 m)(n + 1). Registered as ``"angular_hybrid"``.

    The features are signed: in normalised attention a row's normaliser can be <= 0, and
    FAVOR's default floor for signed maps (``eps`` = 1e-3) clips such rows. Log-space
    form: both bases scaled by their common per-row log-scale s = max(max_i l_i, |x|^2/2 -
    log(m)/2) (l the positive log-features), so attention can shift the trigonometric base's
    e^{|x|^2/2} instead of overflowing; ``features`` (phi itself) is finite for |x| < 13.5
    (float32, m = 128: ``_fourier.representable_norm``) while the positive base, at most
    e^{|w_i|^2/2} over the rows w_i, is too (|w_i|^2 < 2 ln(max), 176 in float32, which
    Gaussian rows exceed from d of about 128), and raises where it is not outside ``jit``
    (safe ranges: docs/maths/attention.md).

    Attributes:
      num_sign_features: n >= 1, sign projections of the angular coefficient.
      sign_projection: the Gaussian (i.i.d.) sign projection tau_1..tau_n, drawn by ``init``
        independently of the base projection; ``None`` until then.

    Examples:
      >>> import jax
      >>> from rfjax import features, projections
      >>> fmap = features.AngularHybridFeatureMap(num_sign_features=3)
      >>> fmap = fmap.init(jax.random.key(1), 4)
      >>> w = projections.orthogonal(jax.random.key(0), 4, 8)
      >>> fmap.features(jax.numpy.ones((2, 4)), w, side="key").shape
      (2, 128)

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Eq. 12, 19, Theorem 3.1 (variant II).
    """

    num_sign_features: int = dataclasses.field(default=8, metadata={"static": True})
    sign_projection: Projection | None = None

    symmetric = False
    needs_denominator_floor = True

    def __post_init__(self):
        check_int("num_sign_features", self.num_sign_features, minimum=1)

    def init(self, key: jax.Array, dim: int, *, dtype: DTypeLike = jnp.float32) -> FeatureMap:
        return self.replace(sign_projection=gaussian(key, dim, self.num_sign_features, dtype=dtype))

    def hybrid_parts(self, x: jax.Array, projection: Projection, *, side: Side) -> HybridParts:
        """The factors of ``scaled_features`` (for ``hybrid_gram``)."""
        if self.sign_projection is None:
            raise ValueError(
                "AngularHybridFeatureMap has no sign projection: call .init(key, dim) first"
            )
        return _angular_hybrid_parts(x, projection, projection, self.sign_projection, side=side)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GaussianHybridFeatureMap(HybridFeatureMap):
    """``gaussian_hybrid_features`` as a ``FeatureMap``: the projection serves both base
    estimators, with its own coefficient projection (n rows, drawn by ``init``). Width
    4m(2n + 1) (trigonometric coefficient) or 4m(n + 1) (positive). Registered as
    ``"gaussian_hybrid"``.

    The normalisation assumes inputs on the sphere of radius ``radius`` (the estimate stays
    unbiased off it). The features are signed: in normalised attention a row's normaliser can be
    <= 0 (clipped by FAVOR's default floor for signed maps, 1e-3). Log-space form and the range
    of ``features``: as ``AngularHybridFeatureMap``'s (the bases' common log-scale).

    Attributes:
      num_coefficient_features: n >= 1, projection vectors of the Gaussian coefficient.
      bandwidth: tau > 0.
      radius: r > 0.
      coefficient_estimator: ``"trigonometric"`` or ``"positive"``.
      coefficient_projection: the Gaussian (i.i.d.) coefficient projection, drawn by ``init``
        independently of the base projection; ``None`` until then.

    References:
      Choromanski et al. 2022, arXiv:2110.04367, Eq. 20, App. F.
    """

    num_coefficient_features: int = dataclasses.field(default=8, metadata={"static": True})
    bandwidth: float = dataclasses.field(default=1.0, metadata={"static": True})
    radius: float = dataclasses.field(default=1.0, metadata={"static": True})
    coefficient_estimator: CoefficientEstimator = dataclasses.field(
        default="trigonometric", metadata={"static": True}
    )
    coefficient_projection: Projection | None = None

    symmetric = False
    needs_denominator_floor = True

    def __post_init__(self):
        check_int("num_coefficient_features", self.num_coefficient_features, minimum=1)
        check_real("bandwidth", self.bandwidth, positive=True)
        check_real("radius", self.radius, positive=True)
        check_choice("coefficient_estimator", self.coefficient_estimator, COEFFICIENT_ESTIMATORS)

    def init(self, key: jax.Array, dim: int, *, dtype: DTypeLike = jnp.float32) -> FeatureMap:
        coefficients = gaussian(key, dim, self.num_coefficient_features, dtype=dtype)
        return self.replace(coefficient_projection=coefficients)

    def hybrid_parts(self, x: jax.Array, projection: Projection, *, side: Side) -> HybridParts:
        """The factors of ``scaled_features`` (for ``hybrid_gram``)."""
        if self.coefficient_projection is None:
            raise ValueError(
                "GaussianHybridFeatureMap has no coefficient projection: call .init(key, dim) first"
            )
        return _gaussian_hybrid_parts(
            x,
            projection,
            projection,
            self.coefficient_projection,
            side=side,
            bandwidth=self.bandwidth,
            radius=self.radius,
            coefficient_estimator=self.coefficient_estimator,
        )
