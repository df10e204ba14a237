"""The inputs and output of every Flax linen module call in an ``apply``, by module path."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import flax.linen as nn
import jax
import numpy as np


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


def assert_pre_norm_block(calls: dict[str, Call], block: str, attention: str) -> None:
    """The recorded ``block`` is a pre-norm transformer block: x + Attn(LN(x)), then
    x + Dense(gelu(Dense(LN(x)))) (``attention``: the attention module's name in the block)."""

    def call(name: str) -> Call:
        return calls[f"{block}/{name}"]

    def close(a, b) -> None:
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)

    x = calls[block].args[0]
    close(call("LayerNorm_0").args[0], x)
    close(call(attention).args[0], call("LayerNorm_0").output)
    x = x + call(attention).output
    close(call("LayerNorm_1").args[0], x)
    close(call("Dense_0").args[0], call("LayerNorm_1").output)
    close(call("Dense_1").args[0], jax.nn.gelu(call("Dense_0").output))
    close(calls[block].output, x + call("Dense_1").output)
