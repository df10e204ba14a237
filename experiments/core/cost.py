"""What a computation costs, as XLA counts it."""

from __future__ import annotations

from collections.abc import Callable

import jax


def compiled_flops(function: Callable, *args) -> float:
    """The FLOPs of ``function(*args)`` by XLA's cost analysis of the compiled program (arrays
    or ``jax.ShapeDtypeStruct`` shapes as ``args``).

    Raises:
      RuntimeError: if the backend gives no cost analysis.
    """
    analysis = jax.jit(function).lower(*args).compile().cost_analysis()
    analysis = analysis[0] if isinstance(analysis, list) else analysis
    if analysis is None or "flops" not in analysis:
        raise RuntimeError("XLA gave no FLOP count for this program")
    return float(analysis["flops"])
