"""The primitives of a traced program, for the tests that check what a decode step runs (no
draws, no key derivations, no ``cond`` per token)."""

from __future__ import annotations

import jax
import jax.extend

DRAWS = frozenset({"qr", "random_bits"})
# What a decode step that reads the cache's projection must not run: draws, key derivations and
# the key comparison's cond.
KEYS = DRAWS | {"cond", "random_fold_in", "random_split", "random_wrap", "threefry2x32"}


def _sub_jaxprs(equation) -> list[jax.extend.core.Jaxpr]:
    found = []
    for param in equation.params.values():
        for sub in param if isinstance(param, (tuple, list)) else (param,):
            if isinstance(sub, jax.extend.core.ClosedJaxpr):
                found.append(sub.jaxpr)
            elif isinstance(sub, jax.extend.core.Jaxpr):
                found.append(sub)
    return found


def primitives(jaxpr: jax.extend.core.Jaxpr) -> tuple[set[str], set[str]]:
    """The names of the primitives of ``jaxpr`` (nested jaxprs included) outside any ``cond``
    and inside one."""
    outside: set[str] = set()
    inside: set[str] = set()

    def walk(jaxpr, found):
        for equation in jaxpr.eqns:
            found.add(equation.primitive.name)
            within = inside if equation.primitive.name == "cond" else found
            for sub in _sub_jaxprs(equation):
                walk(sub, within)

    walk(jaxpr, outside)
    return outside, inside


def equations(jaxpr: jax.extend.core.Jaxpr) -> list[jax.extend.core.JaxprEqn]:
    """The equations of ``jaxpr``, nested jaxprs' included."""
    found = []
    for equation in jaxpr.eqns:
        found.append(equation)
        for sub in _sub_jaxprs(equation):
            found += equations(sub)
    return found


def traced_primitives(fn, *args) -> tuple[set[str], set[str]]:
    """``primitives`` of ``fn``'s program for ``args``."""
    return primitives(jax.make_jaxpr(fn)(*args).jaxpr)
