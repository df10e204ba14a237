"""Argument checks for the closed forms (NumPy float64 values, messages that name the argument)."""

from __future__ import annotations

import numpy as np

from rfjax._validation import check_choice, check_finite, check_inputs, check_int

COUPLINGS = ("gaussian", "orthogonal", "simplex")


def real_array(name: str, value: object) -> np.ndarray:
    """``value`` as a float64 array of finite reals (any shape), else raises naming ``name``."""
    if isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be a real number or array of reals, got a bool")
    try:
        array = np.asarray(value)
    except Exception as err:  # pragma: no cover - exotic objects
        raise TypeError(f"{name} must be a real number or array of reals, got {value!r}") from err
    if array.dtype == bool or not (
        np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)
    ):
        raise TypeError(f"{name} must be a real number or array of reals, got dtype {array.dtype}")
    array = array.astype(np.float64)
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must contain only finite values (no NaN or inf), got {value!r}")
    return array


def point_pair(x: object, y: object) -> tuple[np.ndarray, np.ndarray]:
    """Validates inputs ``x``, ``y`` of shape ``(..., d)``; returns them as float64 arrays.

    The dtype/shape rules are those of ``rfjax._validation.check_inputs`` (floating arrays with at
    least one axis); the values are then read in float64. The batch shapes must broadcast and the
    last axes must agree.
    """
    check_finite("x", check_inputs("x", x))
    check_finite("y", check_inputs("y", y))
    x64 = np.asarray(x, dtype=np.float64)
    y64 = np.asarray(y, dtype=np.float64)
    if x64.shape[-1] != y64.shape[-1]:
        raise ValueError(
            f"x and y must have the same last axis (the input dimension d), got "
            f"x.shape={x64.shape} and y.shape={y64.shape}"
        )
    try:
        np.broadcast_shapes(x64.shape, y64.shape)
    except ValueError as err:
        raise ValueError(
            f"the batch shapes of x {x64.shape} and y {y64.shape} do not broadcast"
        ) from err
    return x64, y64


def coupling_name(coupling: object) -> str:
    """``coupling`` if it is one of the couplings with closed forms, else raises listing them."""
    return check_choice("coupling", coupling, COUPLINGS)


def dimension(dim: object, coupling: str = "gaussian") -> int:
    """Validates ``dim`` (>= 1, and >= 2 for the simplex coupling)."""
    return check_int("dim", dim, minimum=2 if coupling == "simplex" else 1)


def feature_count(num_features: object, *, minimum: int = 1) -> int:
    """Validates ``num_features``."""
    return check_int("num_features", num_features, minimum=minimum)


def single_block(num_features: int, dim: int, what: str) -> None:
    """Raises unless ``num_features <= dim`` (the statement holds for one block only)."""
    if num_features > dim:
        raise ValueError(
            f"{what} holds for a single block, num_features <= dim; got "
            f"num_features={num_features} > dim={dim}"
        )
