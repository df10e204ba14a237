"""The fused kernels of FAVOR attention on shapes no other test takes, against the XLA form
(values and gradients), in interpret mode: CI's statistical tier. A differential run over odd
shapes found the tiles that dropped features (fixed in b44b12e) and the NaN in dW that a fully
masked sequence put there through the bidirectional keys' cotangents (98ec218). A file of its
own, with its own CPU budget (``tests/cpu_budgets.json``), beside ``test_fused.py``; tolerances
as there."""

import jax
import jax.numpy as jnp
import pytest

from rfjax import attention, features
from tests.rfjax.attention.test_fused import assert_close, fused_and_xla
from tests.support.interpret_mode import INTERPRET_MODE

ODD_SHAPES = [  # (map, B, T, heads, H, H_v, m, causal, mask)
    ("positive_antithetic", 2, 65, 3, 20, 5, 24, True, "random"),
    ("positive", 2, 150, 1, 3, 1, 6, False, "first sequence"),
    ("oprf", 1, 130, 2, 8, 5, 40, True, None),
    ("positive", 2, 63, 3, 20, 5, 12, True, "first sequence"),
]


@pytest.mark.statistical
@pytest.mark.parametrize(
    ("name", "batch", "length", "heads", "dim", "value_dim", "count", "causal", "masked"),
    ODD_SHAPES,
    ids=[f"{case[0]}-T{case[2]}-H{case[4]}-m{case[6]}" for case in ODD_SHAPES],
)
@INTERPRET_MODE
def test_odd_shapes_match_the_xla_form(
    name, batch, length, heads, dim, value_dim, count, causal, masked
):
    """Lengths that are no multiple of a chunk (63, 65, 130, 150), heads of 3 and 20, values of
    1 and 5, m of 6 ... 40 (tiles of 2 ... 8 features), a random mask and a fully masked
    sequence (its rows' denominators floored at the smallest normal number: their cotangents
    reach 1e38, and must not reach dW through the keys' zero factors): values and gradients
    of the rows and the projection as the XLA form's."""
    keys = jax.random.split(jax.random.key(length + count), 5)
    q, k = (1.5 * jax.random.normal(x, (batch, length, heads, dim)) for x in keys[:2])
    v = jax.random.normal(keys[2], (batch, length, heads, value_dim))
    mask = {
        None: None,
        "random": jax.random.uniform(keys[3], (batch, length)) > 0.3,
        "first sequence": jnp.ones((batch, length), bool).at[0].set(False),
    }[masked]
    projection = attention.draw_projection(keys[4], dim, count, num_heads=heads)
    fmap = features.get(name)().init(jax.random.key(1), dim)
    if name == "oprf":
        fmap = features.get(name)().fit(jax.random.key(1), q[0, :, 0], k[0, :, 0])
    weights = jax.random.normal(jax.random.key(2), v.shape)
    options = dict(feature_map=fmap, causal=causal, mask=mask)
    fused, xla = fused_and_xla(q, k, v, projection, weights, **options)
    for got, want in zip(jax.tree.leaves(fused), jax.tree.leaves(xla), strict=True):
        assert_close(got, want)
