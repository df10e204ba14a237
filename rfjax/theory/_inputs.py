"""Argument checks for the closed forms (JAX arrays, messages that name the argument).

Static arguments (names, dimensions, feature counts) are checked always. Array arguments are
checked for dtype and shape always and for their values (finite, in range) when they are
concrete; under ``jit``/``vmap``/``grad`` values are unknown, and a value outside the supported
range gives NaN in that element instead (see ``guard_norm``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import ArrayLike

from rfjax._validation import check_choice, check_finite, check_inputs, check_int, is_concrete

Coupling = Literal["gaussian", "orthogonal", "simplex"]
"""Couplings with closed forms: i.i.d. (Eq. 19), orthogonal (Eq. 23), simplex (Eq. 24)."""

COUPLINGS: tuple[Coupling, ...] = ("gaussian", "orthogonal", "simplex")

_NO_CLOSED_FORM = {
    "simplex_plus": (
        "SimRF+ (SimRF paper Sec. 3.2, Eq. 16-17) has no closed-form conformity or MSE: its "
        "directions are re-optimised for every draw of the chi_d norms (vectors with larger "
        "norms subtend larger angles), so the pair angles are random and depend on the norms, "
        "and are only known as the output of an iterative optimisation, not as the single fixed "
        "angle that Eq. 21-24 integrate; estimate it by Monte Carlo "
        "(rfjax.theory.monte_carlo_conformity)"
    ),
}


def no_closed_form_reason(coupling: str) -> str:
    """Why ``coupling`` has no closed form in ``rfjax.theory`` ("" if it has one).

    Used in the errors of the closed forms and in the notes under experiment tables, whose theory
    columns are nan for such couplings.

    Examples:
      >>> no_closed_form_reason("simplex")
      ''
    """
    if coupling in COUPLINGS:
        return ""
    return _NO_CLOSED_FORM.get(
        coupling,
        f"{coupling!r} has no closed form in rfjax.theory, which covers i.i.d., orthogonal and "
        "simplex blocks (SimRF Eq. 19, 23, 24)",
    )


MAX_NORM_OF_SUM = 100.0
"""Largest |x + y| (or |x - y| for RFFs) the series-based closed forms accept: beyond it the
Kummer series needs more than ``_series.MAX_TERMS`` terms and float64 rounding of v^2 alone
costs ~eps v^2 of relative accuracy."""


def theory_dtype() -> jnp.dtype:
    """The closed forms' working dtype: float64 with ``jax_enable_x64``, else float32."""
    return jax.dtypes.canonicalize_dtype(jnp.float64)


def real_array(name: str, value: ArrayLike) -> jax.Array:
    """``value`` as an array of the working dtype (any shape), else raises naming ``name``.

    Integers and floats are accepted, bools and non-numeric dtypes are not; NaN or infinity
    raises when ``value`` is concrete.
    """
    if isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be a real number or array of reals, got a bool")
    try:
        array = jnp.asarray(value)
    except TypeError as err:
        raise TypeError(f"{name} must be a real number or array of reals, got {value!r}") from err
    if array.dtype == bool or not (
        jnp.issubdtype(array.dtype, jnp.integer) or jnp.issubdtype(array.dtype, jnp.floating)
    ):
        raise TypeError(f"{name} must be a real number or array of reals, got dtype {array.dtype}")
    if is_concrete(array) and not bool(jnp.all(jnp.isfinite(array))):
        raise ValueError(f"{name} must contain only finite values (no NaN or inf), got {value!r}")
    return array.astype(theory_dtype())


def host_real_array(name: str, value: ArrayLike) -> np.ndarray:
    """``value`` as a float64 NumPy array, validated as by ``real_array``.

    For the host-only functions (the structured bounds colour graphs with networkx), which keep
    float64 whatever JAX's working dtype is.
    """
    real_array(name, value)
    return np.asarray(value, dtype=np.float64)


def point_pair(x: ArrayLike, y: ArrayLike) -> tuple[jax.Array, jax.Array]:
    """Validates inputs ``x``, ``y`` of shape ``(..., d)``; returns them in the working dtype.

    The dtype/shape rules are those of ``rfjax._validation.check_inputs`` (floating arrays with at
    least one axis; finite when concrete). The batch shapes must broadcast and the last axes
    must agree.
    """
    x = check_finite("x", check_inputs("x", x))
    y = check_finite("y", check_inputs("y", y))
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(
            f"x and y must have the same last axis (the input dimension d), got "
            f"x.shape={x.shape} and y.shape={y.shape}"
        )
    try:
        jnp.broadcast_shapes(x.shape, y.shape)
    except ValueError as err:
        raise ValueError(
            f"the batch shapes of x {x.shape} and y {y.shape} do not broadcast"
        ) from err
    return x.astype(theory_dtype()), y.astype(theory_dtype())


def coupling_name(coupling: str) -> Coupling:
    """``coupling`` if it has a closed form; else raises, saying why (SimRF+) or listing them."""
    if isinstance(coupling, str) and coupling in _NO_CLOSED_FORM:
        raise ValueError(
            f"coupling={coupling!r} has no closed form. {_NO_CLOSED_FORM[coupling]}. The closed "
            f"forms cover coupling in {', '.join(map(repr, COUPLINGS))}"
        )
    return check_choice("coupling", coupling, COUPLINGS)


def dimension(dim: int, coupling: str = "gaussian") -> int:
    """Validates ``dim`` (>= 1, and >= 2 for the simplex coupling)."""
    return check_int("dim", dim, minimum=2 if coupling == "simplex" else 1)


def feature_count(num_features: int, *, minimum: int = 1) -> int:
    """Validates ``num_features``."""
    return check_int("num_features", num_features, minimum=minimum)


def single_block(num_features: int, dim: int, what: str) -> None:
    """Raises unless ``num_features <= dim`` (the statement holds for one block only)."""
    if num_features > dim:
        raise ValueError(
            f"{what} holds for a single block, num_features <= dim; got "
            f"num_features={num_features} > dim={dim}"
        )


def check_norm(name: str, squared: jax.Array, *, limit: float = MAX_NORM_OF_SUM) -> None:
    """Raises if a concrete squared norm exceeds ``limit``^2 (a no-op when traced)."""
    if not is_concrete(squared):
        return
    largest = math.sqrt(float(jnp.max(squared, initial=0.0)))
    if largest > limit:
        raise ValueError(
            f"{name} = {largest:.6g} is beyond the range {name} <= {limit:g} in which this "
            f"closed form is computed accurately (see the function's docstring); use "
            f"coupling='gaussian' or Monte Carlo there"
        )


def guard_norm(
    function: Callable[[jax.Array], jax.Array],
    squared: jax.Array,
    *,
    limit: float = MAX_NORM_OF_SUM,
) -> jax.Array:
    """``function(squared)``, NaN where ``squared`` exceeds ``limit``^2 (the traced twin of
    ``check_norm``: under ``jit`` an out-of-range element becomes NaN, and only that element).

    Out-of-range elements are replaced by 0 before ``function`` runs, so they cost nothing (a
    series at a huge argument would otherwise keep the whole batch's loop running).
    """
    inside = squared <= limit**2
    return jnp.where(inside, function(jnp.where(inside, squared, 0.0)), jnp.nan)
