"""Input checks shared by the public API.

Every public function validates its arguments with these helpers, so that bad input raises a
``ValueError``/``TypeError`` naming the argument, the value received and what is allowed.
Checks only look at static information (Python values, shapes, dtypes) unless stated otherwise,
so they are safe under ``jit``.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

FLOAT_DTYPES = (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)

MAX_ARRAY_BYTES = 2**31
"""The largest array (2 GiB) that a constructor of ``rfjax.projections`` or ``rfjax.features``
draws, stores or checks. Arguments that imply a larger one (a dimension of 10^9, a rank of
10^6) are refused with a ``ValueError`` before anything compiles: XLA's CPU runtime aborts the
interpreter on an allocation it cannot make and on some shapes past 2^31 elements, which no
``try`` can catch. 2 GiB holds a float32 projection of 2^27 rows of 4 entries, or 2^14 rows of
2^15."""
ARCCOS_ORDERS = (0, 1, 2)


def check_int(name: str, value: object, *, minimum: int) -> int:
    """Returns ``value`` as an ``int`` if it is an integer ``>= minimum``, else raises."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"{name} must be an integer >= {minimum}, got {value!r} of type {type(value).__name__}"
        )
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return int(value)


def _bytes_text(size: int) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size} bytes"


def check_array_size(
    what: str, shape: Iterable[int], dtype: DTypeLike, arguments: Mapping[str, object]
) -> None:
    """Raises ``ValueError`` if the array ``what`` of ``shape`` and ``dtype``, which
    ``arguments`` imply, exceeds ``MAX_ARRAY_BYTES``; the message names the arguments, the
    array, its size and the cap. Python integers throughout: no overflow.

    Examples:
      >>> try:
      ...     check_array_size("W", (10**9, 4), "float32", {"num_features": 10**9})
      ... except ValueError as error:
      ...     for part in str(error).split("; "):
      ...         print(part)
      num_features=1000000000 implies W of shape (1000000000, 4) in float32 (14.9 GiB)
      the cap is 2 GiB per array (rfjax._validation.MAX_ARRAY_BYTES)
    """
    shape = tuple(int(n) for n in shape)
    size = math.prod(shape) * np.dtype(dtype).itemsize
    if size > MAX_ARRAY_BYTES:
        given = ", ".join(f"{name}={value!r}" for name, value in arguments.items())
        verb = "implies" if len(arguments) == 1 else "imply"
        raise ValueError(
            f"{given} {verb} {what} of shape {shape} in {np.dtype(dtype).name} "
            f"({_bytes_text(size)}); the cap is {_bytes_text(MAX_ARRAY_BYTES)} per array "
            "(rfjax._validation.MAX_ARRAY_BYTES)"
        )


MAX_ITERATIONS = 100_000
"""The most iterations of a loop that a constructor runs (Gauss-Seidel sweeps, k-means
iterations): a count of 10^9 would run for days rather than fail, so it is refused."""


def check_iterations(name: str, value: int) -> int:
    """Returns ``value`` if it is at most ``MAX_ITERATIONS``, else raises ``ValueError``
    naming ``name`` and the cap (``value`` already checked as an int)."""
    if value > MAX_ITERATIONS:
        raise ValueError(
            f"{name}={value} iterations exceeds the cap of {MAX_ITERATIONS} "
            "(rfjax._validation.MAX_ITERATIONS)"
        )
    return value


def check_bool(name: str, value: object) -> bool:
    """``value`` as a ``bool``: a Python or NumPy bool only (not 0/1, not a string), else
    raises ``TypeError`` naming ``name``."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r} of type {type(value).__name__}")
    return bool(value)


def check_real(name: str, value: object, *, positive: bool = False) -> float:
    """Returns ``value`` as a finite ``float`` (and ``> 0`` if ``positive``), else raises."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a real number, got {value!r} of type {type(value).__name__}"
        )
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


def check_choice[T](name: str, value: object, allowed: Iterable[T]) -> T:
    """Returns ``value`` if it is one of ``allowed``, else raises naming them.

    The result has the type of ``allowed``'s elements: with ``allowed`` typed as a tuple of a
    ``Literal`` (``MODES: tuple[Mode, ...] = ("a", "b")``), it is a ``Mode``.
    """
    choices = tuple(allowed)
    for choice in choices:
        if value == choice and type(value) is type(choice):
            return choice
    raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")


def check_float_dtype(name: str, dtype: DTypeLike | None) -> jnp.dtype:
    """Returns ``dtype`` as a canonical JAX floating dtype, else raises.

    float64 is only honoured when ``jax_enable_x64`` is on (JAX's usual rule); otherwise it is
    canonicalised to float32 with a ``UserWarning`` naming the argument, as JAX warns when an
    array is asked for in a dtype it does not have. ``None`` is rejected: rfjax's defaults are
    written out (``dtype=jnp.float32``), and ``jnp.dtype(None)`` would silently mean float64 with
    x64 on and float32 without, so a ``None`` passed on from a config or wrapper is a mistake to
    report.
    """
    if dtype is None:
        raise TypeError(
            f"{name} must be a floating dtype (float16, bfloat16, float32, float64), got None; "
            f"pass the dtype explicitly (the default is float32)"
        )
    try:
        dt = jnp.dtype(dtype)
    except TypeError as err:
        raise TypeError(f"{name} must be a floating dtype, got {dtype!r}") from err
    if not jnp.issubdtype(dt, jnp.floating):
        raise TypeError(
            f"{name} must be a floating dtype (float16, bfloat16, float32, float64), got {dt}"
        )
    canonical = jax.dtypes.canonicalize_dtype(dt)
    if canonical != dt:
        warnings.warn(
            f"{name}={dt} is not available without jax_enable_x64 and is truncated to "
            f"{canonical}, as JAX does; set jax_enable_x64 to compute in {dt}",
            UserWarning,
            stacklevel=3,
        )
    return canonical


def check_key(name: str, key: object) -> jax.Array:
    """Returns ``key`` if it is a JAX PRNG key (typed, or a legacy uint32[2]), else raises."""
    if isinstance(key, jax.Array):
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) and key.shape == ():
            return key
        if key.dtype == jnp.uint32 and key.shape == (2,):
            return key
    raise TypeError(
        f"{name} must be a single JAX PRNG key (jax.random.key(seed)), got "
        f"{type(key).__name__} with shape {getattr(key, 'shape', None)} and dtype "
        f"{getattr(key, 'dtype', None)}"
    )


def as_array(name: str, x: object) -> jax.Array:
    """``jnp.asarray(x)``, with an error naming ``name`` for what JAX cannot convert."""
    try:
        return jnp.asarray(x)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"{name} must be a numeric array, got {type(x).__name__} ({str(x)[:40]!r})"
        ) from err


def check_ids(name: str, ids: object, count: int) -> jax.Array:
    """Returns ``ids`` as an integer array, else raises: ``TypeError`` naming ``name`` for
    other dtypes, and ``ValueError`` for concrete ids outside ``[0, count)`` (JAX's indexing
    would clamp them; traced ids are for the caller to gather with ``mode="fill"``)."""
    ids = as_array(name, ids)
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise TypeError(f"{name} must be an integer array of ids, got dtype {ids.dtype}")
    if not is_concrete(ids):
        return ids
    found = np.asarray(ids)  # in NumPy: inside a caller's jit, jnp would stage the test
    if found.size and not np.all((found >= 0) & (found < count)):
        raise ValueError(
            f"{name} must hold ids in [0, {count}); got values from {found.min()} to {found.max()}"
        )
    return ids


def vocabulary_ids(name: str, ids: object, count: int) -> jax.Array:
    """``check_ids``, with ids outside ``[0, count)`` mapped to ``count``: out of bounds, so
    that JAX's gathers (``nn.Embed``, ``take_along_axis``: mode ``"fill"``) read NaN for them
    inside ``jit``, where they are unknown, rather than wrap a negative id to a class."""
    ids = check_ids(name, ids, count)
    return jnp.where((ids >= 0) & (ids < count), ids, count)


def check_rate(name: str, value: object) -> float:
    """A probability in ``[0, 1)`` (a dropout rate), else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")
    rate = float(value)
    if not 0 <= rate < 1:
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")
    return rate


def check_inputs(name: str, x: object, *, dim: int | None = None) -> jax.Array:
    """Returns ``x`` as a floating array of shape ``(..., dim)``, else raises.

    Integer inputs are rejected rather than silently cast. ``dim`` (if given) must match the last
    axis.
    """
    x = as_array(name, x)
    check_input_type(name, x.shape, x.dtype, dim=dim)
    return x


def check_input_type(name: str, shape: tuple[int, ...], dtype, *, dim: int | None = None) -> None:
    """``check_inputs``' checks of an array's shape and dtype, for an array that stays where it
    is (a NumPy array streamed through in blocks)."""
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating array, got dtype {dtype}")
    if len(shape) < 1:
        raise ValueError(f"{name} must have shape (..., dim) with at least one axis, got a scalar")
    if dim is not None and shape[-1] != dim:
        raise ValueError(
            f"{name} must have last axis of size dim={dim} (the projection's input "
            f"dimension), got shape {shape}"
        )


def is_concrete(x: object) -> bool:
    """Whether ``x`` holds known values (not a tracer inside ``jit``/``vmap``/``grad``)."""
    try:
        np.asarray(x)
    except jax.errors.TracerArrayConversionError:
        return False
    except jax.errors.ConcretizationTypeError:
        return False
    return True


def check_finite(name: str, x: jax.Array) -> jax.Array:
    """Raises if a concrete array holds NaN or infinity; a no-op on traced values.

    Under ``jit`` the values are unknown, so callers that need the check must call outside of
    ``jit`` (the public functions document this).
    """
    if not is_concrete(x):
        return x
    if not bool(np.all(np.isfinite(np.asarray(x, dtype=np.float64)))):
        raise ValueError(f"{name} must contain only finite values (no NaN or inf)")
    return x


def check_representable(
    data: np.ndarray,
    compute_dtype: DTypeLike,
    *,
    lengthscale: float = 1.0,
    name: str = "X",
    remedy: str = "enable float64 with jax.config.update('jax_enable_x64', True)",
) -> None:
    """Raises ``ValueError`` naming ``name`` if ``data`` / ``lengthscale`` holds finite values
    that the compute dtype cannot hold (float64 data beyond float32's range, computed in
    float32): they would become infinite, and the features or fit NaN, with no error. The
    message ends with ``remedy`` (besides rescaling)."""
    if not np.size(data) or np.dtype(compute_dtype).itemsize >= data.dtype.itemsize:
        return
    largest = float(np.max(np.abs(data))) / lengthscale
    limit = float(jnp.finfo(compute_dtype).max)
    if largest > limit:
        scaled = f"|{name}| / lengthscale" if lengthscale != 1.0 else f"|{name}|"
        raise ValueError(
            f"{name} holds values up to {scaled} = {largest:.3g} that "
            f"{np.dtype(compute_dtype).name}, the dtype rfjax computes in, cannot represent "
            f"(largest {limit:.3g}): rescale {name}, or {remedy}"
        )


def check_order(order: object) -> int:
    """Returns the arc-cosine ``order`` if it is the integer 0, 1 or 2, else raises
    ``ValueError`` (a float such as 1.0 too: nothing is silently cast)."""
    if (
        isinstance(order, bool)
        or not isinstance(order, numbers.Integral)
        or order not in ARCCOS_ORDERS
    ):
        raise ValueError(
            f"order must be one of {', '.join(map(str, ARCCOS_ORDERS))}; got {order!r}"
        )
    return int(order)


def check_coefficients(coefficients: object) -> tuple[float, ...]:
    """Returns polynomial ``coefficients`` c_1..c_l as floats, checking l >= 1 and c_i >= 0.

    ``coefficients`` must be concrete (a sequence of Python numbers or a NumPy array), since the
    degree l fixes the shape of the computation.
    """
    if isinstance(coefficients, jax.core.Tracer):
        raise TypeError("coefficients must be concrete (a sequence of numbers), not a traced array")
    try:
        values = np.asarray(coefficients, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"coefficients must be a sequence of real numbers, got {coefficients!r}"
        ) from err
    if values.ndim != 1 or values.size == 0:
        raise ValueError(
            f"coefficients must be a non-empty 1-D sequence (c_1, ..., c_l), got "
            f"shape {values.shape}"
        )
    if not np.all(np.isfinite(values)) or np.any(values < 0):
        raise ValueError(
            f"coefficients must be finite and >= 0 (a positive-definite "
            f"polynomial kernel), got {values.tolist()}"
        )
    return tuple(float(c) for c in values)
