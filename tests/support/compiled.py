"""One compiled program for a call that tests would otherwise run eagerly.

Called eagerly, a function compiles each primitive inside it as a program of its own (at the
suite's settings about 25 ms of XLA's time each, per shape and dtype); under ``jax.jit`` the call
is one program. That pays where a test's programs are its own (shapes no other test uses); where
many tests share shapes, the eager primitives are compiled once for all of them and can cost less.
"""

from __future__ import annotations

import functools

import jax


@functools.cache
def jitted(function):
    """``function`` as one program (called eagerly, each primitive compiles apart), cached per
    function: its string, number and ``None`` arguments static, the others (arrays, projections,
    fitted maps) operands."""

    @functools.partial(jax.jit, static_argnames="static")
    def run(args, kwargs, static):
        args, kwargs = list(args), dict(kwargs)
        for name, value in static:
            if isinstance(name, int):
                args[name] = value
            else:
                kwargs[name] = value
        return function(*args, **kwargs)

    def call(*args, **kwargs):
        given = [*enumerate(args), *kwargs.items()]
        static = tuple((k, v) for k, v in given if v is None or isinstance(v, (str, int, float)))
        names = {name for name, _ in static}
        args = tuple(None if i in names else x for i, x in enumerate(args))
        kwargs = {k: v for k, v in kwargs.items() if k not in names}
        return run(args, kwargs, static)

    return call
