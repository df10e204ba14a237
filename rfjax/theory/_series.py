"""Hypergeometric series as JAX functions: summed term by term, log-scaled and compensated.

Every series here is sum_k t_k with t_{k+1} = r_k t_k. It is summed in a ``jax.lax.while_loop``
that stops as soon as a rigorous bound on the dropped tail is below the rounding of the sum, so
the number of terms adapts to the argument (about y + 10 sqrt(y) for 1F1(.; .; y)) while memory
stays that of a few arrays of the input's shape, whatever the argument. The running values are
kept as mantissas times a common power of two, rescaled exactly whenever a term grows large, so
nothing overflows (log 1F1(d; d/2; y) ~ y for y in the thousands is fine); the sum is
Kahan-compensated, so a positive series is accurate to a few ulp however many terms it has.
(``log_hyp0f1`` with a static bound on its argument sums a fixed number of terms instead.)

A while loop has no reverse-mode derivative, so the public functions carry ``jax.custom_jvp``
rules from the contiguous relations (d/dy 1F1(a; b; y) = (a/b) 1F1(a+1; b+1; y), d/dz 0F1(; b; z)
= 0F1(; b+1; z)/b): ``jax.grad``, ``jax.jacfwd`` and higher derivatives all work.

Precision: the series run in the dtype of their argument (the public functions pass float64 when
``jax_enable_x64`` is on and float32 otherwise); the loop's tolerance is that dtype's epsilon.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero
from numpy.typing import ArrayLike

from rfjax._validation import check_real, is_concrete
from rfjax.theory import _inputs
from rfjax.theory._bucketing import call_bucketed

MAX_TERMS = 1 << 15
"""Cap on the terms of one series: enough for 1F1(.; .; y) with y up to about 30,000. A series
that has not converged within it returns NaN (``_inputs`` rejects such arguments up front)."""


class _State(NamedTuple):
    k: jax.Array  # index of the current term t_k (a scalar: every element steps together)
    term: jax.Array  # t_k / 2^exponent
    total: jax.Array  # sum_{i <= k} t_i / 2^exponent
    compensation: jax.Array  # Kahan compensation of total
    magnitude: jax.Array  # sum_{i <= k} |t_i| / 2^exponent
    exponent: jax.Array  # binary scale of the four values above (an integer)
    aux: jax.Array  # series-specific state (see ``_sum_series``)
    done: jax.Array  # the tail bound is below tolerance (stays so: it only decreases)


StepFn = Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
TailFn = Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def _sum_series(
    first: jax.Array, aux_first: jax.Array, step: StepFn, tail: TailFn
) -> tuple[jax.Array, jax.Array]:
    """log|sum_k t_k| and its sign, elementwise; NaN where ``MAX_TERMS`` terms do not converge.

    Args:
      first: t_0 (a moderate, non-zero number), any shape.
      aux_first: series state at k = 0, same shape.
      step: ``(k, aux) -> (r_k, aux')`` with t_{k+1} = r_k t_k (signed ratio).
      tail: ``(k, |t_k|, aux) -> B_k`` with B_k >= sum_{i > k} |t_i| in the same scale as |t_k|
        (+inf while no bound is known yet).

    The loop stops when B_k <= eps/4 * sum_{i <= k} |t_i|: a positive series is then accurate to
    a few ulp (compensated sum), a signed one to a few ulp of sum |t_i| (absolute). Values are
    kept as mantissas times a common power of two, rescaled exactly (``ldexp``) whenever a term
    outgrows 2^limit, so no term overflows and no transcendental function runs in the loop.
    """
    dtype = first.dtype
    tolerance = jnp.finfo(dtype).eps / 4
    limit = jnp.finfo(dtype).maxexp // 4  # 2^256 in float64, 2^32 in float32

    def converged(state: _State) -> jax.Array:
        k = jnp.broadcast_to(state.k, state.term.shape)
        return tail(k, jnp.abs(state.term), state.aux) <= tolerance * state.magnitude

    zero = jnp.zeros_like(first)
    start = _State(
        k=jnp.zeros((), dtype),
        term=first,
        total=first,
        compensation=zero,
        magnitude=jnp.abs(first),
        exponent=jnp.zeros(first.shape, jnp.int32),
        aux=aux_first,
        done=jnp.zeros(first.shape, bool),
    )
    start = start._replace(done=converged(start))

    def add_term(state: _State) -> _State:
        ratio, aux = step(state.k, state.aux)
        term = state.term * ratio
        shift = jnp.frexp(term)[1]
        shift = jnp.where(shift > limit, shift, 0)
        term = jnp.ldexp(term, -shift)
        total = jnp.ldexp(state.total, -shift)
        compensation = jnp.ldexp(state.compensation, -shift)
        corrected = term - compensation
        new_total = total + corrected
        return _State(
            k=state.k + 1,
            term=term,
            total=new_total,
            compensation=(new_total - total) - corrected,
            magnitude=jnp.ldexp(state.magnitude, -shift) + jnp.abs(term),
            exponent=state.exponent + shift,
            aux=aux,
            done=state.done,
        )

    def body(state: _State) -> _State:
        # Elements that have converged keep adding terms below the tolerance: harmless, and
        # cheaper than selecting between old and new state.
        state = add_term(state)
        return state._replace(done=converged(state))

    def keep_going(state: _State) -> jax.Array:
        return ~jnp.all(state.done) & (state.k < MAX_TERMS)

    final = jax.lax.while_loop(keep_going, body, start)
    log_abs = jnp.log(jnp.abs(final.total)) + final.exponent.astype(dtype) * math.log(2.0)
    return jnp.where(final.done, log_abs, jnp.nan), jnp.sign(final.total)


def _monotone_from(a: jax.Array, b: jax.Array) -> jax.Array:
    """Smallest k from which |(a + k) / ((b + k)(k + 1))| is non-increasing (b > 0), elementwise.

    a >= b or a >= 1: from k = 0 ((a + k)/(b + k), resp. (a + k)/(k + 1), is non-increasing).
    a <= 0: |k + a| / ((k + b)(k + 1)) peaks at k = -a + sqrt(a^2 - a (b + 1) + b).
    0 < a < 1: the log-derivative is <= 0 once (1 - a)(b + k) <= (a + k)(k + 1).
    """
    negative = jnp.ceil(-a + jnp.sqrt(jnp.maximum(a * a - a * (b + 1) + b, 0.0)))
    small = jnp.ceil(0.5 * (-a + jnp.sqrt(jnp.maximum(a * a + 4 * (1 - a) * b, 0.0))))
    return jnp.where((a >= b) | (a >= 1), 0.0, jnp.where(a <= 0, negative, jnp.maximum(small, 0.0)))


def _geometric_tail(term: jax.Array, ratio: jax.Array, valid: jax.Array) -> jax.Array:
    """|t_k| rho / (1 - rho), rho = |r_k|: the tail bound when the later ratios are <= rho."""
    rho = jnp.abs(ratio)
    bound = jnp.where(valid & (rho < 1), term * rho / (1 - rho), jnp.inf)
    return jnp.where(term == 0, 0.0, bound)  # a terminated series (ratio 0) has no tail


def _log_hyp1f1_series(a: jax.Array, b: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """log|1F1(a; b; y)| and sign by the power series, y >= 0 (a, b broadcast against y)."""
    monotone_from = _monotone_from(a, b)

    def ratio(k: jax.Array) -> jax.Array:
        return y * (a + k) / ((b + k) * (k + 1))

    def step(k: jax.Array, aux: jax.Array) -> tuple[jax.Array, jax.Array]:
        return ratio(k), aux

    def tail(k: jax.Array, term: jax.Array, aux: jax.Array) -> jax.Array:
        return _geometric_tail(term, ratio(k), k >= monotone_from)

    return _sum_series(jnp.ones_like(y), jnp.zeros_like(y), step, tail)


def _log_hyp1f1_any_sign(a: jax.Array, b: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """log|1F1(a; b; x)| and sign for real x; Kummer's transform for x < 0.

    For x < 0 the series alternates; 1F1(a; b; x) = e^x 1F1(b - a; b; -x) (Kummer) is summed
    instead, whose terms are bounded by |x|^k / k! when |b - a| <= b: after the factor e^x the
    absolute error is a few ulp of 1.
    """
    negative = x < 0
    y = jnp.abs(x)
    log_abs, sign = _log_hyp1f1_series(jnp.where(negative, b - a, a), b, y)
    return jnp.where(negative, log_abs - y, log_abs), sign


def _shifted_pair(
    a: jax.Array, b: jax.Array, x: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(a, a+1), (b, b+1) and (x, x) stacked on a new leading axis: the derivative rules need
    both series, and summing them in one loop halves the work of compiling and running them."""
    shape = jnp.broadcast_shapes(jnp.shape(a), jnp.shape(b), jnp.shape(x))
    pair = [jnp.stack([jnp.broadcast_to(p, shape), jnp.broadcast_to(p + 1, shape)]) for p in (a, b)]
    return pair[0], pair[1], jnp.stack([jnp.broadcast_to(x, shape)] * 2)


def _constant_parameters(tangents: tuple) -> None:
    """The parameters of 1F1 and 0F1 are constants here: derivatives in them are not provided."""
    if not all(isinstance(t, SymbolicZero) for t in tangents):
        raise NotImplementedError("derivatives of 1F1 / 0F1 with respect to their parameters")


@jax.custom_jvp
def log_hyp1f1(a: jax.Array, b: jax.Array, y: jax.Array) -> jax.Array:
    """log 1F1(a; b; y) (Kummer's M) for y >= 0, a >= 0, b > 0: a sum of positive terms.

    Differentiable in y (d/dy 1F1(a; b; y) = (a/b) 1F1(a+1; b+1; y)); a and b are parameters
    (arrays, so that one compilation serves every dimension) without derivatives.
    """
    return _log_hyp1f1_any_sign(a, b, y)[0]


@jax.custom_jvp
def hyp1f1(a: jax.Array, b: jax.Array, x: jax.Array) -> jax.Array:
    """1F1(a; b; x) for real x of either sign (used where the value is bounded, x <= 0)."""
    log_abs, sign = _log_hyp1f1_any_sign(a, b, x)
    return sign * jnp.exp(log_abs)


Slope = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]


def _contiguous_jvp(function: Callable[..., jax.Array], slope: Slope) -> Callable:
    """The JVP rule of ``function(a, b, x)`` (1F1 or its log) from the contiguous relation
    d/dx 1F1(a; b; x) = (a/b) 1F1(a+1; b+1; x): ``slope(a, b, value, shifted)`` with
    ``shifted = function(a+1, b+1, x)``; both series are summed in one loop (stacked)."""

    def rule(primals: tuple, tangents: tuple) -> tuple[jax.Array, jax.Array]:
        (a, b, x), (a_dot, b_dot, x_dot) = primals, tangents
        _constant_parameters((a_dot, b_dot))
        if isinstance(x_dot, SymbolicZero):
            value = function(a, b, x)
            return value, jnp.zeros_like(value)
        value, shifted = function(*_shifted_pair(a, b, x))
        return value, slope(a, b, value, shifted) * x_dot

    return rule


log_hyp1f1.defjvp(
    _contiguous_jvp(log_hyp1f1, lambda a, b, value, shifted: a / b * jnp.exp(shifted - value)),
    symbolic_zeros=True,
)
hyp1f1.defjvp(
    _contiguous_jvp(hyp1f1, lambda a, b, value, shifted: a / b * shifted), symbolic_zeros=True
)


@jax.custom_jvp
def _log_hyp0f1(b: jax.Array, z: jax.Array) -> jax.Array:
    """log 0F1(; b; z), z >= 0; b is a parameter (an array) without derivative."""

    def ratio(k: jax.Array) -> jax.Array:
        return z / ((b + k) * (k + 1))

    def step(k: jax.Array, aux: jax.Array) -> tuple[jax.Array, jax.Array]:
        return ratio(k), aux

    def tail(k: jax.Array, term: jax.Array, aux: jax.Array) -> jax.Array:
        return _geometric_tail(term, ratio(k), jnp.ones(k.shape, bool))

    return _sum_series(jnp.ones_like(z), jnp.zeros_like(z), step, tail)[0]


@functools.partial(_log_hyp0f1.defjvp, symbolic_zeros=True)
def _log_hyp0f1_jvp(primals: tuple, tangents: tuple) -> tuple[jax.Array, jax.Array]:
    (b, z), (b_dot, z_dot) = primals, tangents
    _constant_parameters((b_dot,))
    if isinstance(z_dot, SymbolicZero):
        value = _log_hyp0f1(b, z)
        return value, jnp.zeros_like(value)
    b_pair, _, z_pair = _shifted_pair(b, b, z)
    value, shifted = _log_hyp0f1(b_pair, z_pair)
    return value, jnp.exp(shifted - value) / b * z_dot


def _orthogonal_bracket(dim: jax.Array, index: int) -> jax.Array:
    """Q_index = 1 - prod_{j < index} (d + j)/(d + 2j) by the positive recurrence
    Q_{i+1} = (i + Q_i (d + i)) / (d + 2i), Q_0 = 0 (no cancellation)."""
    q = jnp.zeros_like(dim)
    for i in range(index):
        q = (i + q * (dim + i)) / (dim + 2 * i)
    return q


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def scaled_orthogonal_excess(
    shift: int, dim: jax.Array, w: jax.Array, log_scale: jax.Array
) -> jax.Array:
    """exp(log_scale) sum_k w^k / k! Q_{k + shift}, w >= 0, Q_i = 1 - prod_{j<i} (d+j)/(d+2j).

    With shift = 0 this is e^{w} - 1F1(d; d/2; w/2) (SimRF Eq. 25 with w = v^2): every term is
    positive (Eq. 70), so there is no cancellation even where the difference is tiny. Its
    derivative in w is the same series with shift + 1; ``log_scale`` is an additive log-prefactor
    applied before exponentiating, so that nothing overflows when the product is finite. ``dim``
    is an array parameter (one compilation serves every d) without derivative.
    """
    first = max(0, 2 - shift)  # Q_0 = Q_1 = 0: the first non-zero term
    q_first = jnp.broadcast_to(_orthogonal_bracket(dim, first + shift), w.shape)

    def step(k: jax.Array, q: jax.Array) -> tuple[jax.Array, jax.Array]:
        i = k + first + shift  # t_k carries Q_i, i.e. the power w^(k + first)
        q_next = (i + q * (dim + i)) / (dim + 2 * i)
        return w / (k + first + 1) * q_next / q, q_next

    def tail(k: jax.Array, term: jax.Array, q: jax.Array) -> jax.Array:
        # Q_j <= 1: the tail is at most that of w^j / j!, i.e. of the terms divided by Q_i.
        return _geometric_tail(term / q, w / (k + first + 1), jnp.ones(k.shape, bool))

    log_sum, _ = _sum_series(q_first / math.factorial(first), q_first, step, tail)
    log_power = first * jnp.log(w) if first else jnp.zeros_like(w)
    return jnp.exp(log_scale + log_power + log_sum)


@functools.partial(scaled_orthogonal_excess.defjvp, symbolic_zeros=True)
def _scaled_orthogonal_excess_jvp(
    shift: int, primals: tuple, tangents: tuple
) -> tuple[jax.Array, jax.Array]:
    (dim, w, log_scale), (dim_dot, w_dot, log_scale_dot) = primals, tangents
    _constant_parameters((dim_dot,))
    value = scaled_orthogonal_excess(shift, dim, w, log_scale)
    tangent = jnp.zeros_like(value)
    if not isinstance(w_dot, SymbolicZero):
        tangent = tangent + scaled_orthogonal_excess(shift + 1, dim, w, log_scale) * w_dot
    if not isinstance(log_scale_dot, SymbolicZero):
        tangent = tangent + value * log_scale_dot
    return value, tangent


MAX_HYP0F1_ARGUMENT = 1e8
"""Largest z accepted by ``log_hyp0f1`` (its series then needs about 2 sqrt(z) = 20,000 terms)."""


def log_hyp0f1(b: float, z: ArrayLike, *, max_argument: float | None = None) -> jax.Array:
    """log 0F1(; b; z) for z >= 0: the confluent hypergeometric limit function, in log space.

    0F1(; b; z) = sum_k z^k / (k! (b)_k) = Gamma(b) z^{(1-b)/2} I_{b-1}(2 sqrt(z)). With b = d/2
    and z = v^2 |w|^2 / 4 it is the average of exp(w^T (x + y)) over a Haar rotation of w
    (SimRF Eq. 10, 31-33: the radial average behind RF-conformity).

    By default the positive series is summed term by term in a ``lax.while_loop`` (about
    2 sqrt(z) + 10 terms) until a geometric bound on the tail is below rounding, in scaled,
    compensated form: relative error of a few ulp for any z in [0, 1e8], no overflow
    (log 0F1 ~ 2 sqrt(z)). With a static bound ``max_argument`` it sums a fixed
    N = ceil(2 sqrt(max_argument)) + 30 terms as one vectorised log-sum-exp instead: past
    k = 2 sqrt(z) every term ratio z / ((b + k)(k + 1)) is below 1/4, so the dropped tail is
    below 4^-30 (1e-18) of the sum for every z <= max_argument, and elements above it are NaN.
    That form has no loop, which is faster inside a jitted, vmapped or scanned computation (an
    optimiser step).

    A JAX function of ``z`` (``jit``, ``vmap``; ``grad`` through the exact rule
    d/dz log 0F1(; b; z) = 0F1(; b+1; z) / (b 0F1(; b; z)), finite at z = 0). Float64 when
    ``jax_enable_x64`` is on, float32 otherwise.

    Args:
      b: the parameter b > 0 (a Python number: it is static).
      z: argument(s) z >= 0, any shape.
      max_argument: optional static bound on z (see above), in (0, 1e8].

    Returns:
      log 0F1(; b; z), shape of ``z``.

    Raises:
      ValueError: b <= 0, a bad ``max_argument``, or a concrete ``z`` that is negative (0F1
        oscillates there and its log is undefined), not finite, or above 1e8 (or above
        ``max_argument``).

    Examples:
      >>> round(float(log_hyp0f1(1.0, 0.25)), 6)  # log I_0(1)
      0.235914
      >>> round(float(log_hyp0f1(1.0, 0.25, max_argument=10.0)), 6)
      0.235914

    References:
      Reid et al. 2023, arXiv:2301.13856, Eq. 10 and 31-33; DLMF 10.39.9 (0F1 and Bessel I).
    """
    b = check_real("b", b, positive=True)
    largest = MAX_HYP0F1_ARGUMENT
    if max_argument is not None:
        largest = check_real("max_argument", max_argument, positive=True)
        if largest > MAX_HYP0F1_ARGUMENT:
            raise ValueError(f"max_argument must be <= {MAX_HYP0F1_ARGUMENT:g}, got {largest:g}")
    z = _inputs.real_array("z", z)
    if is_concrete(z) and (bool(jnp.any(z < 0)) or bool(jnp.any(z > largest))):
        raise ValueError(
            f"z must lie in [0, {largest:g}] (0F1(; b; z) oscillates for z < 0, so its log is "
            f"undefined there), got values in [{float(jnp.min(z))}, {float(jnp.max(z))}]"
        )
    if max_argument is None:
        return call_bucketed(_log_hyp0f1_jit, (jnp.asarray(b, z.dtype),), (z,))
    num_terms = math.ceil(2.0 * math.sqrt(largest)) + 30
    inside = (z >= 0) & (z <= largest)
    value = _log_hyp0f1_terms(num_terms, jnp.asarray(b, z.dtype), jnp.where(inside, z, 0.0))
    return jnp.where(inside, value, jnp.nan)


@jax.jit
def _log_hyp0f1_jit(b: jax.Array, z: jax.Array) -> jax.Array:
    inside = (z >= 0) & (z <= MAX_HYP0F1_ARGUMENT)
    return jnp.where(inside, _log_hyp0f1(b, jnp.where(inside, z, 0.0)), jnp.nan)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _log_hyp0f1_terms(num_terms: int, b: jax.Array, z: jax.Array) -> jax.Array:
    """log sum_{k < num_terms} z^k / (k! (b)_k) as one log-sum-exp (z >= 0, b a scalar)."""
    k = jnp.arange(num_terms, dtype=z.dtype)
    gammaln = jax.scipy.special.gammaln
    log_coefficients = gammaln(b) - gammaln(b + k) - gammaln(k + 1)
    # At z = 0 every term but the first is exp(-inf) = 0 (k log z with k = 0 taken as 0).
    log_powers = jax.scipy.special.xlogy(k, z[..., None])
    return jax.nn.logsumexp(log_coefficients + log_powers, axis=-1)


@functools.partial(_log_hyp0f1_terms.defjvp, symbolic_zeros=True)
def _log_hyp0f1_terms_jvp(
    num_terms: int, primals: tuple, tangents: tuple
) -> tuple[jax.Array, jax.Array]:
    (b, z), (b_dot, z_dot) = primals, tangents
    _constant_parameters((b_dot,))
    value = _log_hyp0f1_terms(num_terms, b, z)
    if isinstance(z_dot, SymbolicZero):
        return value, jnp.zeros_like(value)
    # The b + 1 series converges faster, so the same number of terms serves it.
    return value, jnp.exp(_log_hyp0f1_terms(num_terms, b + 1, z) - value) / b * z_dot
