"""Sampled softmax with random-feature proposals (Rawat et al. 2019; HRF Sec. 4.2, App. I).

A sampled softmax replaces the normaliser Z = sum_i exp(o_i) of the cross-entropy over a
vocabulary of V classes (logits o_i = q.e_i of a query q and class embeddings e_i) by an
importance-sampled estimate from M negatives s_1..s_M ~ Q(. | q):

  loss = log(exp(o_t) + sum_j [s_j != t] exp(o_{s_j} - log(M Q(s_j | q)))) - o_t,

where t is the target. The log-proposal correction makes the bracket an unbiased estimate of
Z = exp(o_t) + sum_{i != t} exp(o_i) for every Q with Q(i) > 0, and "accidental hits"
(negatives equal to the target) are removed (their term is dropped, not resampled), so the
loss tends to the full cross-entropy as M grows.

Proposals (``proposals()``). ``"uniform"``: Q = 1/V. ``"exact"``: Q = softmax(o), the full
softmax of the loss logits (the ideal, O(V d) per query). ``"kernel"``: the kernel softmax
below computed exactly (O(V d) per query; the limit of infinitely many random features, a
control that separates the kernel's mismatch with the model from the random-feature error). The
four random-feature proposals follow Rawat et al.: an estimate K-hat(q, e) = phi(q).psi(e) of
the softmax kernel of the *normalised* vectors with temperature tau,

  K(q, e) = exp(q_bar.e_bar / tau) = SM(q_bar / sqrt(tau), e_bar / sqrt(tau)),  u_bar = u / |u|,

so all inputs lie on the sphere of radius r = 1/sqrt(tau). Feature maps: every map registered in
``rfjax.features`` as an estimator of the softmax kernel (``feature_proposals()``), e.g.
``"positive_antithetic"`` (FAVOR+, antithetic), ``"trigonometric"``, ``"angular_hybrid"`` and
``"gaussian_hybrid"`` (HRF Eq. 12, 19, 20). tau may be a traced scalar (chosen per step, or the
model's learned temperature). Whether K is consistent with the model depends on the logits: for
cosine logits o = q_bar.e_bar / tau (Rawat et al.) the kernel softmax *is* the model's softmax;
for raw logits o = q.e the kernel softmax only approximates it, best at the tau that minimises
the divergence between the two (``rfjax.nn.select_temperature``).

Two samplers (``SAMPLERS``) turn the features a = phi(q), B[i] = psi(e_i) into a proposal:

* ``"clipped"`` (default; the HRF paper's treatment of negative estimates): the estimate over
  the whole vocabulary, clipped at zero, normalised and mixed with a uniform floor eps,

    Q(i | q) = (1 - eps) max(K-hat_i, 0) / sum_j max(K-hat_j, 0) + eps / V

  (Q = 1/V for a query whose estimates are all <= 0). It costs O(V W) per query (the N x V
  estimate matrix, as much as a full softmax of width W), and it is the distribution the
  estimator actually proposes: for positive features it is the normalised kernel estimate
  (plus the floor). The floor bounds the importance weights exp(o_i) / (M Q(i)).
* ``"decomposition"`` (fast option): the mixture

    Q(i | q) = sum_k |a_k| |B_ik| / sum_k |a_k| S_k,   S_k = sum_i |B_ik|,

  sampled in two stages without forming the estimate: a feature k with probability
  |a_k| S_k / sum_l |a_l| S_l, then a class i with probability |B_ik| / S_k by binary search in
  per-feature cumulative tables of |B| (W x V, built once per call and shared by the batch):
  O(V W) per step plus O(W + M log V) per query. For positive features it equals the normalised
  kernel estimate (Rawat et al.'s sampler). For signed features it is *not* the clipped
  estimate: the |.| discards the signs that carry the kernel's shape, and for trigonometric
  features the mixture is nearly uniform.

Both samplers return the exact log-probability of the distribution they draw from, so the
importance correction is exact for the proposal used.

References:
  Rawat, Chen, Yu, Suresh and Kumar, "Sampled softmax with random Fourier features",
  NeurIPS 2019, arXiv:1907.10747; Choromanski et al., "Hybrid Random Features", ICLR 2022,
  arXiv:2110.04367, Sec. 4.2 and App. I; Bengio and Senecal 2008; Jean et al. 2015.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import jax
import jax.numpy as jnp

from rfjax import features, projections
from rfjax._validation import check_choice, check_inputs, check_int, check_real, is_concrete
from rfjax.features import (
    AngularHybridFeatureMap,
    FeatureMap,
    GaussianHybridFeatureMap,
    HybridParts,
    fourier_features,
    hybrid_gram,
    positive_features,
    trigonometric_features,
)
from rfjax.features._protocol import Side

PLAIN_PROPOSALS = ("uniform", "exact", "kernel")
SAMPLERS: tuple[Literal["clipped", "decomposition"], ...] = ("clipped", "decomposition")


def feature_proposals() -> tuple[str, ...]:
    """The random-feature proposals: every feature map registered in ``rfjax.features`` as an
    estimator of the softmax kernel (``features.available(kernel="softmax")``), so a newly
    registered map is a proposal too."""
    return features.available(kernel="softmax")


def proposals() -> tuple[str, ...]:
    """Every proposal ``sample_proposal`` takes: ``feature_proposals()`` and
    ``PLAIN_PROPOSALS``."""
    return (*feature_proposals(), *PLAIN_PROPOSALS)


Temperature = float | jax.Array


def _check_temperature(temperature: Temperature) -> Temperature:
    """A Python temperature must be a finite real > 0; an array must be a float scalar (its
    value is not checked: it may be traced)."""
    if isinstance(temperature, jax.Array):
        if temperature.shape != () or not jnp.issubdtype(temperature.dtype, jnp.floating):
            raise ValueError(
                f"temperature must be a positive float or a float scalar array, got an array of "
                f"shape {temperature.shape} and dtype {temperature.dtype}"
            )
        return temperature
    return check_real("temperature", temperature, positive=True)


def normalize_for_proposal(x: jax.Array, temperature: Temperature) -> jax.Array:
    """x / (|x| sqrt(tau)): rows on the sphere of radius 1/sqrt(tau), so that
    SM(q', e') = exp(q_bar.e_bar / tau). Zero rows stay zero."""
    temperature = _check_temperature(temperature)
    norms = jnp.linalg.norm(x, axis=-1, keepdims=True)
    return x / (jnp.maximum(norms, jnp.finfo(x.dtype).tiny) * jnp.sqrt(temperature))


def _gaussian_hybrid_on_sphere(
    x: jax.Array,
    radius: Temperature,
    base: projections.Projection,
    coefficient: projections.Projection,
    side: Side,
) -> HybridParts:
    """The ``HybridParts`` of ``gaussian_hybrid_features(x, base, base, coefficient, side=side,
    bandwidth=radius, radius=radius)`` for inputs x on the sphere of radius r, with r possibly
    traced (log-scale 0).

    With bandwidth = radius the coefficient exp(-|x + y|^2 / (2 r^2)) is a function of the unit
    vectors x / r, y / r only and c = exp(-2), so nothing needs r as a Python number.
    """
    positive = positive_features(x, base, antithetic=True)
    trigonometric = trigonometric_features(x, base)
    unit = x / radius
    one_minus_c = -math.expm1(-2.0)
    gauss = fourier_features(unit if side == "query" else -unit, coefficient)
    coefficient_features = gauss * (1.0 / math.sqrt(one_minus_c))
    return HybridParts(
        [positive, trigonometric],
        [coefficient_features],
        jnp.zeros(x.shape[:-1], x.dtype),
        (1.0 - 1.0 / one_minus_c,),
        side,
    )


def _draw_held_projections(
    feature_map: FeatureMap, key: jax.Array, sampler: Any, dtype: Any
) -> FeatureMap:
    """The map with every projection it holds (a hybrid's coefficient rows) redrawn with the
    proposal's coupling, from ``key`` (split when it holds several)."""
    leaves, tree = jax.tree.flatten(
        feature_map, is_leaf=lambda x: isinstance(x, projections.Projection)
    )
    held = [i for i, leaf in enumerate(leaves) if isinstance(leaf, projections.Projection)]
    keys = [key] if len(held) == 1 else list(jax.random.split(key, max(len(held), 1)))
    for i, k in zip(held, keys, strict=False):
        leaves[i] = sampler(k, leaves[i].dim, leaves[i].num_features, dtype=dtype)
    return jax.tree.unflatten(tree, leaves)


def proposal_features(
    key: jax.Array,
    queries: jax.Array,
    embeddings: jax.Array,
    *,
    proposal: str,
    num_features: int,
    num_coefficient_features: int = 8,
    temperature: Temperature = 1.0,
    coupling: str = "orthogonal",
) -> tuple[jax.Array, jax.Array]:
    """Random features of the proposal kernel exp(q_bar.e_bar / tau) for queries and classes.

    The estimate of the kernel is ``query_features @ class_features.T``. The map is the
    registered map ``proposal`` (``rfjax.features.build`` with ``num_sign_features`` and
    ``num_coefficient_features`` n, and bandwidth and radius 1/sqrt(tau)), its random parameters
    drawn by its ``init`` and every projection it holds redrawn with ``coupling``
    (``rfjax.projections.get``), data-fitted parameters fitted to the normalised queries and
    classes. m = ``num_features`` base rows (for the hybrids shared by the positive and
    trigonometric estimators, variant II of HRF Theorem 3.1; widths: antithetic positive and
    trigonometric 2m, angular hybrid 4m(n + 1), Gaussian hybrid 4m(2n + 1)). Inputs are
    normalised (``normalize_for_proposal``) and treated as constants (``stop_gradient``).
    Estimates grow like exp(1/tau): keep tau >= 1/80 in float32.

    Args:
      key: PRNG key for the projections.
      queries: ``(N, d)`` query vectors q.
      embeddings: ``(V, d)`` class embeddings e_i.
      proposal: one of ``feature_proposals()``.
      num_features: m >= 1.
      num_coefficient_features: n >= 1 (hybrids only).
      temperature: tau > 0, a Python float or a float scalar array (may be traced).
      coupling: coupling name for all projections.

    Returns:
      ``(query_features (N, W), class_features (V, W))``.

    Raises:
      TypeError, ValueError: for a bad argument (named in the message).

    Examples:
      >>> import jax
      >>> q, e = jax.random.normal(jax.random.key(0), (2, 5, 4))
      >>> a, b = proposal_features(jax.random.key(1), q, e, proposal="angular_hybrid",
      ...                          num_features=2, num_coefficient_features=3)
      >>> (a @ b.T).shape, a.shape[-1]
      ((5, 5), 32)
    """
    query_side, class_side = _proposal_sides(
        key,
        queries,
        embeddings,
        proposal=proposal,
        num_features=num_features,
        num_coefficient_features=num_coefficient_features,
        temperature=temperature,
        coupling=coupling,
    )
    return _flat(query_side), _flat(class_side)


def proposal_estimates(
    key: jax.Array,
    queries: jax.Array,
    embeddings: jax.Array,
    *,
    proposal: str,
    num_features: int,
    num_coefficient_features: int = 8,
    temperature: Temperature = 1.0,
    coupling: str = "orthogonal",
) -> jax.Array:
    """The kernel estimates K-hat(q_i, e_j) of every query and class, ``(N, V)``: the product
    ``query_features @ class_features.T`` of ``proposal_features`` (same arguments and
    errors), computed for the angular and Gaussian hybrids from their factors
    (``rfjax.features.hybrid_gram``: N V (4 m + n) multiply-adds for the angular hybrid
    instead of N V 4 m (n + 1)).

    Examples:
      >>> import jax
      >>> q, e = jax.random.normal(jax.random.key(0), (2, 5, 4))
      >>> options = dict(proposal="angular_hybrid", num_features=2, num_coefficient_features=3)
      >>> a, b = proposal_features(jax.random.key(1), q, e, **options)
      >>> estimates = proposal_estimates(jax.random.key(1), q, e, **options)
      >>> estimates.shape, bool(jax.numpy.allclose(estimates, a @ b.T, rtol=1e-4, atol=1e-5))
      ((5, 5), True)
    """
    query_side, class_side = _proposal_sides(
        key,
        queries,
        embeddings,
        proposal=proposal,
        num_features=num_features,
        num_coefficient_features=num_coefficient_features,
        temperature=temperature,
        coupling=coupling,
    )
    if isinstance(query_side, HybridParts) and isinstance(class_side, HybridParts):
        return hybrid_gram(query_side, class_side)
    return _flat(query_side) @ _flat(class_side).T


def _flat(side: jax.Array | HybridParts) -> jax.Array:
    """Flat features (Lemma 2.3 for ``HybridParts``)."""
    if isinstance(side, HybridParts):
        return side.scaled_features().unscaled()
    return side


def _proposal_sides(
    key: jax.Array,
    queries: jax.Array,
    embeddings: jax.Array,
    *,
    proposal: str,
    num_features: int,
    num_coefficient_features: int,
    temperature: Temperature,
    coupling: str,
) -> tuple[jax.Array | HybridParts, jax.Array | HybridParts]:
    """The query and class sides of ``proposal_features``: ``HybridParts`` for the angular and
    Gaussian hybrids, flat features for the other maps."""
    proposal = check_choice("proposal", proposal, feature_proposals())
    num_features = check_int("num_features", num_features, minimum=1)
    num_coefficient_features = check_int(
        "num_coefficient_features", num_coefficient_features, minimum=1
    )
    temperature = _check_temperature(temperature)
    queries = check_inputs("queries", queries)
    embeddings = check_inputs("embeddings", embeddings, dim=queries.shape[-1])
    sampler = projections.get(coupling)
    dim = queries.shape[-1]
    q, e = (
        normalize_for_proposal(jax.lax.stop_gradient(x), temperature) for x in (queries, embeddings)
    )
    traced = isinstance(temperature, jax.Array)
    radius = 1.0 if traced else 1.0 / math.sqrt(float(temperature))
    feature_map = features.build(
        proposal,
        num_sign_features=num_coefficient_features,
        num_coefficient_features=num_coefficient_features,
        bandwidth=radius,
        radius=radius,
    )
    base_key, map_key = jax.random.split(key)
    base = sampler(base_key, dim, num_features, dtype=queries.dtype)
    feature_map = feature_map.init(map_key, dim, dtype=queries.dtype)
    feature_map = _draw_held_projections(feature_map, map_key, sampler, queries.dtype)
    feature_map = feature_map.fit(map_key, q, e)
    if traced and isinstance(feature_map, GaussianHybridFeatureMap):
        # Its bandwidth and radius are static fields: the on-sphere form takes a traced radius.
        coefficient = feature_map.coefficient_projection
        assert coefficient is not None
        r = 1.0 / jnp.sqrt(temperature)
        return (
            _gaussian_hybrid_on_sphere(q, r, base, coefficient, "query"),
            _gaussian_hybrid_on_sphere(e, r, base, coefficient, "key"),
        )
    if isinstance(feature_map, (AngularHybridFeatureMap, GaussianHybridFeatureMap)):
        return (
            _checked_parts(feature_map.hybrid_parts(q, base, side="query")),
            _checked_parts(feature_map.hybrid_parts(e, base, side="key")),
        )
    return (
        feature_map.features(q, base, side="query"),
        feature_map.features(e, base, side="key"),
    )


def _checked_parts(parts: HybridParts) -> HybridParts:
    """``parts``, after checking (outside ``jit``) that its scale e^s is finite, as the maps'
    ``features`` check their output (``exp(1/tau)`` overflows the dtype for small tau)."""
    scale = jnp.exp(parts.log_scale)
    if is_concrete(scale) and not bool(jnp.all(jnp.isfinite(scale))):
        raise ValueError(
            "the proposal's features overflow the dtype: their scale e^(1/(2 tau)) is not "
            "finite; use a larger temperature (tau >= 1/80 in float32)"
        )
    return parts


def clipped_proposal_log_probabilities(
    query_features: jax.Array, class_features: jax.Array, uniform_floor: float = 0.01
) -> jax.Array:
    """log Q of the ``"clipped"`` sampler for every class, ``(N, V)`` (see the module docstring).

    Q(i) = (1 - eps) max(K-hat_i, 0) / sum_j max(K-hat_j, 0) + eps / V, or 1/V where every
    estimate of the row is <= 0. O(N V W).

    Args:
      query_features: ``(N, W)``.
      class_features: ``(V, W)``.
      uniform_floor: eps in (0, 1].

    Returns:
      ``(N, V)`` log-probabilities (each row's exponentials sum to one).
    """
    return clipped_log_probabilities(query_features @ class_features.T, uniform_floor)


def clipped_log_probabilities(estimates: jax.Array, uniform_floor: float = 0.01) -> jax.Array:
    """log Q of the ``"clipped"`` sampler from the kernel estimates ``(N, V)`` of every query and
    class (e.g. ``proposal_estimates``): Q(i) = (1 - eps) max(K-hat_i, 0) / sum_j max(K-hat_j,
    0) + eps / V, or 1/V where every estimate of the row is <= 0.

    Examples:
      >>> import jax.numpy as jnp
      >>> q = jnp.exp(clipped_log_probabilities(jnp.array([[3.0, -1.0, 1.0]]), 0.3))
      >>> [round(float(v), 3) for v in q[0]]
      [0.625, 0.1, 0.275]
    """
    uniform_floor = check_real("uniform_floor", uniform_floor, positive=True)
    if uniform_floor > 1:
        raise ValueError(f"uniform_floor must be in (0, 1], got {uniform_floor}")
    clipped = jnp.maximum(estimates, 0.0)
    total = jnp.sum(clipped, axis=-1, keepdims=True)
    vocabulary = estimates.shape[-1]
    shape = clipped / jnp.where(total > 0, total, 1.0)
    probabilities = jnp.where(
        total > 0, (1.0 - uniform_floor) * shape + uniform_floor / vocabulary, 1.0 / vocabulary
    )
    return jnp.log(probabilities)


def feature_proposal_probabilities(
    query_features: jax.Array,
    class_features: jax.Array,
    *,
    sampler: Literal["clipped", "decomposition"] = "clipped",
    uniform_floor: float = 0.01,
) -> jax.Array:
    """The proposal Q(i | q) of ``sampler`` for every class, ``(N, V)``.

    O(N V W): for tests and diagnostics (``"decomposition"`` never forms it when sampling).
    """
    sampler = check_choice("sampler", sampler, SAMPLERS)
    if sampler == "clipped":
        return jnp.exp(
            clipped_proposal_log_probabilities(query_features, class_features, uniform_floor)
        )
    weights = jnp.abs(query_features) @ jnp.abs(class_features).T
    return weights / jnp.sum(weights, axis=-1, keepdims=True)


def _inverse_cdf(key: jax.Array, probabilities: jax.Array, num_samples: int) -> jax.Array:
    """``num_samples`` draws per row of ``(N, V)`` probabilities by inverse CDF
    (O(V + M log V) per row); a zero-probability class is never drawn."""
    cdf = jnp.cumsum(probabilities, axis=-1)
    shape = (probabilities.shape[0], num_samples)
    # 1 - U lies in (0, 1]: the first class whose CDF reaches it has positive mass.
    u = (1.0 - jax.random.uniform(key, shape, cdf.dtype)) * cdf[:, -1:]
    return jnp.minimum(jax.vmap(jnp.searchsorted)(cdf, u), probabilities.shape[-1] - 1)


def _first_at_least(table: jax.Array, rows: jax.Array, values: jax.Array) -> jax.Array:
    """For each (row, value): the first column j with table[row, j] >= value (binary search,
    ceil(log2(V + 1)) gathers per query; ``table`` rows are non-decreasing)."""
    size = table.shape[-1]

    def body(_, bounds):
        low, high = bounds
        middle = (low + high) // 2
        below = (table[rows, middle] < values) & (low < high)
        above = (~below) & (low < high)
        return jnp.where(below, middle + 1, low), jnp.where(above, middle, high)

    low = jnp.zeros(values.shape, jnp.int32)
    high = jnp.full(values.shape, size - 1, jnp.int32)
    low, _ = jax.lax.fori_loop(0, max(1, math.ceil(math.log2(size + 1))), body, (low, high))
    return low


def _sample_decomposition(
    key: jax.Array, query_features: jax.Array, class_features: jax.Array, num_samples: int
) -> tuple[jax.Array, jax.Array]:
    """The |.| feature mixture by the two-stage decomposition (module docstring)."""
    weights_q = jnp.abs(query_features)
    weights_c = jnp.abs(class_features)
    tables = jnp.cumsum(weights_c, axis=0).T  # (W, V), row k ends with S_k
    feature_mass = weights_q * tables[:, -1]  # |a_k| S_k, (N, W)
    feature_key, class_key = jax.random.split(key)
    features = _inverse_cdf(feature_key, feature_mass, num_samples)
    shape = features.shape
    v = (1.0 - jax.random.uniform(class_key, shape, tables.dtype)) * tables[features, -1]
    samples = _first_at_least(tables, features, v)
    mass = jnp.einsum("nw,nmw->nm", weights_q, weights_c[samples])
    return samples, jnp.log(mass) - jnp.log(jnp.sum(feature_mass, axis=-1, keepdims=True))


def sample_from_features(
    key: jax.Array,
    query_features: jax.Array,
    class_features: jax.Array,
    num_samples: int,
    *,
    sampler: Literal["clipped", "decomposition"] = "clipped",
    uniform_floor: float = 0.01,
) -> tuple[jax.Array, jax.Array]:
    """Draws classes from the proposal of ``sampler`` (see the module docstring), with
    replacement, and returns the log-probabilities of the distribution the draws follow.

    Args:
      key: PRNG key.
      query_features: ``(N, W)`` features a of the queries (any sign).
      class_features: ``(V, W)`` features B of the classes (any sign).
      num_samples: M >= 1 draws per query.
      sampler: ``"clipped"`` (O(V W) per query) or ``"decomposition"`` (O(W + M log V) per
        query after an O(V W) table).
      uniform_floor: eps of the ``"clipped"`` sampler.

    Returns:
      ``(samples, log_probabilities)``: int32 ``(N, M)`` class ids and float ``(N, M)`` log Q.
    """
    num_samples = check_int("num_samples", num_samples, minimum=1)
    sampler = check_choice("sampler", sampler, SAMPLERS)
    if sampler == "decomposition":
        return _sample_decomposition(key, query_features, class_features, num_samples)
    log_q = clipped_proposal_log_probabilities(query_features, class_features, uniform_floor)
    samples = _inverse_cdf(key, jnp.exp(log_q), num_samples)
    return samples, jnp.take_along_axis(log_q, samples, axis=-1)


def sample_proposal(
    key: jax.Array,
    queries: jax.Array,
    embeddings: jax.Array,
    *,
    proposal: str,
    num_samples: int,
    sampler: Literal["clipped", "decomposition"] = "clipped",
    uniform_floor: float = 0.01,
    **feature_options: Any,
) -> tuple[jax.Array, jax.Array]:
    """Negatives for a sampled softmax: M classes per query and their log-proposal log Q.

    ``"uniform"``: Q = 1/V. ``"exact"``: Q = softmax(q.e) of the loss logits (categorical
    over V per query). ``"kernel"``: Q = softmax(q_bar.e_bar / tau) exactly (needs
    ``temperature`` in ``feature_options``). Random-feature proposals: ``proposal_features``
    (``feature_options`` are passed on) then ``sample_from_features`` with ``sampler``.
    Everything is computed on ``stop_gradient`` inputs.

    Args:
      key: PRNG key (projections and draws).
      queries: ``(N, d)``.
      embeddings: ``(V, d)``.
      proposal: one of ``proposals()``.
      num_samples: M >= 1.
      sampler: ``"clipped"`` or ``"decomposition"`` (kernel proposals only).
      uniform_floor: eps of the ``"clipped"`` sampler.
      **feature_options: ``num_features``, ``num_coefficient_features``, ``temperature`` and
        ``coupling`` of ``proposal_features`` (random-feature proposals; ``"kernel"`` reads
        ``temperature`` only).

    Returns:
      ``(samples, log_probabilities)`` of shape ``(N, M)``.
    """
    proposal = check_choice("proposal", proposal, proposals())
    num_samples = check_int("num_samples", num_samples, minimum=1)
    queries = jax.lax.stop_gradient(check_inputs("queries", queries))
    embeddings = jax.lax.stop_gradient(
        check_inputs("embeddings", embeddings, dim=queries.shape[-1])
    )
    shape = (queries.shape[0], num_samples)
    vocabulary = embeddings.shape[0]
    if proposal == "uniform":
        samples = jax.random.randint(key, shape, 0, vocabulary)
        return samples, jnp.full(shape, -math.log(vocabulary), queries.dtype)
    if proposal in ("exact", "kernel"):
        if proposal == "kernel":
            temperature = feature_options.get("temperature")
            if temperature is None:
                raise ValueError("proposal='kernel' needs a temperature")
            queries, embeddings = (
                normalize_for_proposal(x, temperature) for x in (queries, embeddings)
            )
        log_q = jax.nn.log_softmax(queries @ embeddings.T, axis=-1)
        samples = _inverse_cdf(key, jnp.exp(log_q), num_samples)
        return samples, jnp.take_along_axis(log_q, samples, axis=-1)
    projection_key, sample_key = jax.random.split(key)
    sampler = check_choice("sampler", sampler, SAMPLERS)
    if sampler == "decomposition":
        features = proposal_features(
            projection_key, queries, embeddings, proposal=proposal, **feature_options
        )
        return sample_from_features(sample_key, *features, num_samples, sampler=sampler)
    estimates = proposal_estimates(
        projection_key, queries, embeddings, proposal=proposal, **feature_options
    )
    log_q = clipped_log_probabilities(estimates, uniform_floor)
    samples = _inverse_cdf(sample_key, jnp.exp(log_q), num_samples)
    return samples, jnp.take_along_axis(log_q, samples, axis=-1)


def sampled_softmax_loss(
    queries: jax.Array,
    embeddings: jax.Array,
    targets: jax.Array,
    samples: jax.Array,
    log_proposal: jax.Array,
    *,
    remove_accidental_hits: bool = True,
) -> jax.Array:
    """Per-query sampled-softmax loss with the log-proposal correction.

      loss_n = log(exp(o_t) + sum_j [s_j != t] exp(o_{s_j} - log M - log Q(s_j))) - o_t,

    o_i = q_n.e_i (un-normalised). The bracket is an unbiased estimate of the full normaliser
    Z_n = sum_i exp(o_i) (with accidental hits removed; without removal, of Z_n + exp(o_t)), so
    exp(loss_n + o_t) averages to Z_n and loss_n tends to the full cross-entropy as M grows.
    Gradients flow through the logits only (the proposal is a constant).

    Args:
      queries: ``(N, d)``.
      embeddings: ``(V, d)``.
      targets: int ``(N,)`` target classes.
      samples: int ``(N, M)`` negatives drawn from Q.
      log_proposal: ``(N, M)`` log Q(s_j | q_n).
      remove_accidental_hits: drop negatives equal to the target.

    Returns:
      ``(N,)`` losses.
    """
    queries = check_inputs("queries", queries)
    embeddings = check_inputs("embeddings", embeddings, dim=queries.shape[-1])
    if samples.ndim != 2 or samples.shape[0] != queries.shape[0]:
        raise ValueError(f"samples must have shape (N, M) with N = {queries.shape[0]}")
    if log_proposal.shape != samples.shape or targets.shape != queries.shape[:1]:
        raise ValueError(
            f"log_proposal must match samples {samples.shape} and targets have shape "
            f"({queries.shape[0]},); got {log_proposal.shape} and {targets.shape}"
        )
    target_logits = jnp.sum(queries * embeddings[targets], axis=-1)
    sampled = jnp.einsum("nd,nmd->nm", queries, embeddings[samples])
    sampled = sampled - jax.lax.stop_gradient(log_proposal) - math.log(samples.shape[1])
    if remove_accidental_hits:
        sampled = jnp.where(samples == targets[:, None], -jnp.inf, sampled)
    all_logits = jnp.concatenate([target_logits[:, None], sampled], axis=-1)
    return jax.nn.logsumexp(all_logits, axis=-1) - target_logits
