"""The inputs and output of every Flax linen module call in an ``apply``, by module path."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import flax.linen as nn


@dataclasses.dataclass(frozen=True)
class Call:
    """One ``__call__`` of a module: its positional and keyword arguments and its output."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Any


@contextlib.contextmanager
def recorded_calls() -> Iterator[dict[str, Call]]:
    """Records every linen module's ``__call__`` made inside the block (run the model without
    ``jit``, so the values are concrete), keyed by the module's path joined by ``/`` (the
    top module: ``""``); a module called more than once keeps its last call."""
    calls: dict[str, Call] = {}

    def interceptor(next_fun, args, kwargs, context):
        output = next_fun(*args, **kwargs)
        if context.method_name == "__call__":
            calls["/".join(context.module.path)] = Call(args, kwargs, output)
        return output

    with nn.intercept_methods(interceptor):
        yield calls
