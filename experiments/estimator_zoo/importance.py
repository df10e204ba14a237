"""Importance-sampling checks of the positive features' closed forms, where plain Monte Carlo
cannot estimate their variance.

The squared error of positive (FAVOR+) features is heavy-tailed: rare projections carry most of
its expectation, so a plain Monte Carlo mean and its SE fall short of it (the zoo's rows where
Monte Carlo falls > 4 SE short of the closed form). Importance sampling draws those projections
often and reweights them.

Reduction. For a pair (x, y) with z = x + y, v = |z|, c = exp(-(|x|^2 + |y|^2) / 2) and
s_i = w_i . z / v, the estimate depends on the projection only through the s_i:
c/m sum_i e^{v s_i} (positive features) or c/(2m) sum_i (e^{v s_i} + e^{-v s_i}) (antithetic).
Every coupling's rows are marginally N(0, I_d) (s_i ~ N(0, 1)) and the estimate is unbiased
(E = exp(x.y) = c e^{v^2/2}), so

  positive:    MSE = c^2/m (E e^{2 v s} - e^{v^2}) + c^2 S/m^2 (rho - e^{v^2}),
  antithetic:  MSE = (c^2/4 E (e^{v s} + e^{-v s})^2 - c^2 e^{v^2}) / m      (i.i.d. rows),

with S = sum_b b (b - 1) over the blocks of ``rfjax.theory.block_sizes`` (0 for i.i.d. rows)
and rho = E exp(v (s_i + s_j)) for two rows of one block (the RF-conformity). Each expectation
is estimated by importance sampling, not by the closed forms' algebra:

* E e^{2 v s} and E (e^{v s} + e^{-v s})^2 (``second_moment_draws``): s from a mixture of
  N(2v, 1), N(-2v, 1) and N(0, 1), the optimal shifts of the terms e^{2vs}, e^{-2vs} and 2
  (N(2v, 1) alone would make E e^{2 v s} exact in every draw, a check with no spread; without
  N(0, 1) the constant term's weights would be log-normal, heavy-tailed again); every
  weighted draw is bounded, so the SE is reliable.
* rho (``conformity_draws``): two rows of one block are w_i = r_i R a_i with unit directions
  a_1, a_2 (cosine gamma: 0 for orthogonal rows, -1/(d-1) for simplex ones; taken from a draw of
  the coupling itself), a uniform rotation R and independent chi_d norms r_i. By rotation
  invariance rho = E exp(v (r_1 a_1 + r_2 a_2) . u) with u uniform on the sphere. Proposal: u
  the direction of N(beta b, I_d), b = (a_1 + a_2) / |a_1 + a_2| (a shifted Gaussian; the
  weight of its direction against the uniform one is Gamma(d/2) 2^{d/2 - 1} e^{beta^2 / 2} /
  J_d(beta u.b), J_d(s) = int_0^inf r^{d-1} e^{-r^2/2 + s r} dr by quadrature,
  ``log_radial_integral``), and r_i from N(r*, 1) (weight chi_d(r) / N(r; r*, 1), 0 for
  r <= 0). The shifts put the proposal's mode at the integrand's (``proposal``).

Validated against plain Monte Carlo where it works and against quadrature
(``experiments/estimator_zoo/test_estimator_zoo.py``). Per row (data set, map, coupling) the
check is the mean over draws of the row's MSE assembled from one importance draw per pair (the
same standard normals for every pair: common random numbers), so its SE is over draws.
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np
from scipy import special

from rfjax import projections, theory

# (feature map, coupling) pairs checked here: every closed form of positive features.
CHECKED = (
    ("positive", "gaussian"),
    ("positive", "orthogonal"),
    ("positive", "simplex"),
    ("positive_antithetic", "gaussian"),
)
MIN_DIM = 3  # the conformity proposal's direction law needs d >= 3 (u . b has a density)
PAIRS_PER_CHUNK = 256  # pairs per vectorised chunk (memory ~ 5 arrays of chunk x draws)


def _log_cosh(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    return x + np.log1p(np.exp(-2.0 * x)) - math.log(2.0)


# The second moments' proposal: s = shift 2v + N(0, 1), the shift +1, -1 or 0 with these
# probabilities (the optimal shifts of the two exponential tails and of the constant term of
# (e^{vs} + e^{-vs})^2 = e^{2vs} + e^{-2vs} + 2, each with a fixed share, so that every weighted
# term is bounded).
SHIFT_PROBABILITIES = {1.0: 0.4, -1.0: 0.4, 0.0: 0.2}


def second_moment_draws(v: np.ndarray, normals: np.ndarray, shifts: np.ndarray):
    """Importance draws of E e^{2 v s} and E (e^{v s} + e^{-v s})^2 for s ~ N(0, 1), per pair
    ``v`` (P,) and draw: ``normals`` (N,) standard normals and ``shifts`` (N,) in {1, -1, 0}
    drawn with ``SHIFT_PROBABILITIES``; the proposal is s = shifts 2 v + normals, a mixture of
    N(2v, 1), N(-2v, 1) and N(0, 1), and the weight N(0, 1) / mixture is
    1 / (0.8 e^{-2 v^2} cosh(2 v s) + 0.2). Returns two arrays (P, N) whose means over draws
    estimate the moments; each weighted draw is bounded (by e^{2v^2} / 0.4 and
    10 + 2 e^{2v^2} / 0.8)."""
    tails, still = SHIFT_PROBABILITIES[1.0] + SHIFT_PROBABILITIES[-1.0], SHIFT_PROBABILITIES[0.0]
    s = shifts[None] * 2.0 * v[:, None] + normals[None]
    x = 2.0 * v[:, None] * s
    # mixture / N(0, 1) = (tails / 2) (e^{x - 2v^2} + e^{-x - 2v^2}) + still (the tails' shares
    # are equal)
    log_weight = -np.logaddexp(
        math.log(tails) - 2.0 * v[:, None] ** 2 + _log_cosh(x), math.log(still)
    )
    positive = np.exp(x + log_weight)
    log_terms = np.logaddexp(math.log(2.0), math.log(2.0) + _log_cosh(x))  # 2 + 2 cosh(x)
    antithetic = np.exp(log_terms + log_weight)
    return positive, antithetic


RADIAL_LIMIT = 64.0  # |s| covered by the table of log J_d(s)


@functools.lru_cache(maxsize=8)
def _radial_table(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """log J_d(s) on a grid of s in [-RADIAL_LIMIT, RADIAL_LIMIT] by the trapezoid rule in log
    space on 1,401 nodes within 14 widths of the peak of r^{d-1} e^{-r^2/2 + s r}, at
    r^ = (s + sqrt(s^2 + 4 (d - 1))) / 2 with width (1 + (d - 1) / r^2)^{-1/2}."""
    s = np.linspace(-RADIAL_LIMIT, RADIAL_LIMIT, 12_801)
    offsets = np.linspace(-14.0, 14.0, 1_401)
    values = np.empty_like(s)
    for start in range(0, len(s), 1_000):
        part = s[start : start + 1_000]
        peak = _radius_mode(dim, part)
        width = 1.0 / np.sqrt(1.0 + (dim - 1) / peak**2)
        r = peak[:, None] + width[:, None] * offsets[None]
        inside = r > 0
        safe = np.where(inside, r, 1.0)
        log_integrand = np.where(
            inside, (dim - 1) * np.log(safe) - safe * safe / 2.0 + part[:, None] * safe, -np.inf
        )
        top = log_integrand.max(axis=1, keepdims=True)
        step = width * (offsets[1] - offsets[0])
        total = np.sum(np.exp(log_integrand - top), axis=1) * step
        values[start : start + 1_000] = np.log(total) + top[:, 0]
    return s, values


def log_radial_integral(dim: int, s: np.ndarray) -> np.ndarray:
    """log J_d(s), J_d(s) = int_0^inf r^{d-1} exp(-r^2 / 2 + s r) dr (|s| <= 64), from a
    quadrature table. J_d(0) = 2^{d/2 - 1} Gamma(d/2); J_d(s) / J_d(0) is the chi_d MGF."""
    grid, values = _radial_table(dim)
    if np.any(np.abs(s) > RADIAL_LIMIT):
        raise ValueError(f"|s| must be <= {RADIAL_LIMIT:g}, got {np.max(np.abs(s))}")
    return np.interp(s, grid, values)


def _bisect(function, low: np.ndarray, high: np.ndarray, steps: int = 60) -> np.ndarray:
    """The root of ``function`` (vectorised) between ``low`` and ``high``, by bisection, for a
    function that changes sign once there: function(low) >= 0 >= function(high)."""
    for _ in range(steps):
        middle = (low + high) / 2.0
        positive = function(middle) >= 0
        low, high = np.where(positive, middle, low), np.where(positive, high, middle)
    return (low + high) / 2.0


def _radius_mode(dim: int, tilt: np.ndarray) -> np.ndarray:
    """The mode of r^{d-1} e^{-r^2/2 + tilt r}: (tilt + sqrt(tilt^2 + 4 (d - 1))) / 2."""
    return (tilt + np.sqrt(tilt * tilt + 4.0 * (dim - 1))) / 2.0


def proposal(dim: int, cosine: float, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(beta, r*) per v: the proposal's shift of the direction and centre of the norms.

    At the integrand's mode u lies along b, t = u . b, both norms at r(t) = the mode of
    chi_d(r) e^{v h t r} (h = a_i . b = sqrt((1 + cosine) / 2)) and
    (d - 3) t / (1 - t^2) = 2 v h r(t) (the density of t is proportional to
    (1 - t^2)^{(d-3)/2}). beta puts the mode of the proposal's t there: for g ~ N(beta b, I)
    the log density of t has slope -(d - 3) t / (1 - t^2) + beta r^(beta t), so
    beta r^(beta t*) = 2 v h r(t*)."""
    h = math.sqrt((1.0 + cosine) / 2.0)

    def slope(t):
        return 2.0 * v * h * _radius_mode(dim, v * h * t) * (1.0 - t * t) - (dim - 3) * t

    zero, one = np.zeros_like(v), np.full_like(v, 1.0 - 1e-9)
    t = _bisect(slope, zero, one) if dim > 3 else one * 0.999
    radius = _radius_mode(dim, v * h * t)
    target = 2.0 * v * h * radius

    def shift_slope(beta):
        return target - beta * _radius_mode(dim, beta * t)

    beta = _bisect(shift_slope, zero, np.full_like(v, RADIAL_LIMIT))
    return beta, radius


def _log_chi_density(dim: int, r: np.ndarray) -> np.ndarray:
    """log of the chi_d density at r > 0."""
    return (
        (dim - 1) * np.log(r) - r * r / 2.0 - (dim / 2 - 1) * math.log(2) - special.gammaln(dim / 2)
    )


def conformity_draws(dim: int, cosine: float, v: np.ndarray, normals: np.ndarray) -> np.ndarray:
    """Importance draws of rho = E exp(v (s_i + s_j)) for two rows of one block at ``cosine``,
    per pair ``v`` (P,) and draw: ``normals`` (N, 5) standard normals and a chi^2_{d-2} in its
    last column (the direction's components along b, across b in the pair's plane and its
    squared norm outside the plane; the two norms). Returns (P, N)."""
    if dim < MIN_DIM:
        raise ValueError(f"dim must be >= {MIN_DIM}, got {dim}")
    beta, radius = proposal(dim, cosine, v)
    h, k = math.sqrt((1.0 + cosine) / 2.0), math.sqrt((1.0 - cosine) / 2.0)
    along = beta[:, None] + normals[None, :, 0]
    across = normals[None, :, 1]
    length = np.sqrt(along * along + across * across + normals[None, :, 4])
    t_b, t_perp = along / length, across / length
    t1, t2 = h * t_b + k * t_perp, h * t_b - k * t_perp  # u . a_1, u . a_2
    r1 = radius[:, None] + normals[None, :, 2]
    r2 = radius[:, None] + normals[None, :, 3]
    positive = (r1 > 0) & (r2 > 0)
    r1, r2 = np.where(positive, r1, 1.0), np.where(positive, r2, 1.0)
    log_direction = (
        special.gammaln(dim / 2)
        + (dim / 2 - 1) * math.log(2)
        + beta[:, None] ** 2 / 2
        - log_radial_integral(dim, beta[:, None] * t_b)
    )
    log_norms = sum(
        _log_chi_density(dim, r) + (r - radius[:, None]) ** 2 / 2 + 0.5 * math.log(2 * math.pi)
        for r in (r1, r2)
    )
    log_value = v[:, None] * (r1 * t1 + r2 * t2) + log_direction + log_norms
    return np.where(positive, np.exp(log_value), 0.0)


def standard_draws(seed: int, num_draws: int, dim: int) -> dict[str, np.ndarray]:
    """The common random numbers of every pair: normals and shifts of the second-moment draws,
    normals (and a chi^2_{d-2}) of the conformity draws."""
    rng = np.random.default_rng(seed)
    conformity = rng.standard_normal((num_draws, 5))
    conformity[:, 4] = rng.chisquare(max(dim - 2, 1), num_draws) if dim > 2 else 0.0
    shifts = np.array(list(SHIFT_PROBABILITIES))
    return {
        "normals": rng.standard_normal(num_draws),
        "shifts": rng.choice(shifts, num_draws, p=list(SHIFT_PROBABILITIES.values())),
        "conformity": conformity,
    }


def pair_cosine(coupling: str, dim: int, seed: int) -> float:
    """The cosine between two rows of one block as the coupling draws them (rows 0 and 1 of a
    draw of 2 rows, normalised)."""
    rows = np.asarray(projections.get(coupling)(jax.random.key(seed), dim, 2).matrix(), np.float64)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return float(rows[0] @ rows[1])


def mse_draws(
    x: np.ndarray,
    y: np.ndarray,
    num_features: int,
    draws: dict[str, np.ndarray],
    cosines: dict[str, float],
) -> dict[tuple[str, str], np.ndarray]:
    """Per (map, coupling) of ``CHECKED`` (those whose coupling has a cosine in ``cosines``, or
    i.i.d.), the importance draws of the softmax-kernel MSE of every pair x[p], y[p]: (P, N)."""
    dim, m = x.shape[-1], num_features
    v = np.linalg.norm(x + y, axis=-1)
    c2 = np.exp(-np.sum(x * x, -1) - np.sum(y * y, -1))[:, None]
    iid = np.exp(v * v)[:, None]  # e^{v^2} = exp(x.y)^2 / c^2
    positive, antithetic = second_moment_draws(v, draws["normals"], draws["shifts"])
    out = {
        ("positive", "gaussian"): c2 / m * (positive - iid),
        ("positive_antithetic", "gaussian"): (c2 / 4 * antithetic - c2 * iid) / m,
    }
    for coupling, cosine in cosines.items():
        same = sum(b * (b - 1) for b in theory.block_sizes(dim, m))
        rho = conformity_draws(dim, cosine, v, draws["conformity"])
        out[("positive", coupling)] = c2 / m * (positive - iid) + c2 * same / m**2 * (rho - iid)
    return out


def all_pairs(queries: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every query with every key of its group: queries (..., T, d) and keys (..., S, d) ->
    x, y of shape (... T S, d), query-major within each group."""
    dim, count = queries.shape[-1], keys.shape[-2]
    x = np.repeat(queries, count, axis=-2).reshape(-1, dim)
    y = np.repeat(keys[..., None, :, :], queries.shape[-2], axis=-3).reshape(-1, dim)
    return x, y


def pair_average_draws(
    x: np.ndarray,
    y: np.ndarray,
    weights: np.ndarray,
    num_features: int,
    draws: dict[str, np.ndarray],
    cosines: dict[str, float],
) -> dict[tuple[str, str], np.ndarray]:
    """``mse_draws`` of the pairs x[p], y[p] averaged over the pairs with ``weights`` (the
    weighted sum over pairs divided by their number), per draw: (N,) per (map, coupling);
    computed ``PAIRS_PER_CHUNK`` pairs at a time."""
    totals: dict[tuple[str, str], np.ndarray] = {}
    for start in range(0, len(x), PAIRS_PER_CHUNK):
        part = slice(start, start + PAIRS_PER_CHUNK)
        for key, values in mse_draws(x[part], y[part], num_features, draws, cosines).items():
            totals[key] = totals.get(key, 0.0) + weights[part] @ values
    return {key: total / len(x) for key, total in totals.items()}


def summary(values: np.ndarray) -> dict:
    """Mean and SE over draws of per-draw values, and the number of draws."""
    return {
        "mse_is": float(np.mean(values)),
        "mse_is_se": float(np.std(values, ddof=1) / math.sqrt(len(values))),
        "is_draws": len(values),
    }


def check_set(pairs, num_features: int, num_draws: int, seed: int) -> dict[tuple[str, str], dict]:
    """Per (map, coupling) of ``CHECKED``: the importance-sampling estimate (``summary``) of the
    quantity the zoo measures on ``pairs`` (a ``PairSet``: on paired sets the softmax kernel's
    MSE, query t with key t; on the others the Gaussian kernel's, every query with every key,
    i.e. the softmax one times exp(-|q|^2 - |k|^2)), averaged over the pairs of a group and over
    the groups (of equal size). For the block couplings also the coupling term, their MSE minus
    the i.i.d. one, c^2 S/m^2 (rho - e^{v^2}) (``coupling_term_is`` ± ``coupling_term_is_se``,
    paired by the common draws): at large |x + y| it is a small part of the MSE, below the
    total's SE, and this checks the conformity's closed form on its own. The block couplings
    need d >= ``MIN_DIM`` (else only the i.i.d. rows are checked)."""
    queries, keys = np.asarray(pairs.queries, np.float64), np.asarray(pairs.keys, np.float64)
    dim = queries.shape[-1]
    if pairs.paired:
        x, y = queries.reshape(-1, dim), keys.reshape(-1, dim)
        weights = np.ones(len(x))
    else:
        x, y = all_pairs(queries, keys)
        weights = np.exp(-np.sum(x * x, -1) - np.sum(y * y, -1))
    cosines = (
        {c: pair_cosine(c, dim, seed) for c in ("orthogonal", "simplex")} if dim >= MIN_DIM else {}
    )
    draws = standard_draws(seed, num_draws, dim)
    averages = pair_average_draws(x, y, weights, num_features, draws, cosines)
    checks = {key: summary(values) for key, values in averages.items()}
    iid = averages[("positive", "gaussian")]
    for coupling in cosines:
        term = summary(averages[("positive", coupling)] - iid)
        checks[("positive", coupling)].update(
            coupling_term_is=term["mse_is"], coupling_term_is_se=term["mse_is_se"]
        )
    return checks
