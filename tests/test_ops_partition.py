"""``rfjax.ops._partition``'s one private JAX name fails loudly, not silently.

``_partition`` imports ``jax._src.dispatch.prim_requires_devices_during_lowering`` behind a
guard: on a JAX without it, ``AUTO_PARTITIONING`` turns False and an ``fwht`` under automatic
sharding falls back to XLA's default (an all-gather of the operand) without a word. These tests
fail instead, on the JAX installed: the guarded import works, automatic partitioning is on, and
JAX's lowering sees rfjax's primitives in the registry it reads (the same check that hands
``custom_partitioning`` its devices). A failure here after a JAX upgrade means: find JAX's new
mechanism for a primitive that lowers through ``custom_partitioning`` before anything else.
"""

import jax
import jax.numpy as jnp

from rfjax.ops import _partition, fwht, fwht_p, hd_chain, hd_chain_p


def test_the_guarded_private_import_works_on_this_jax():
    from jax._src import dispatch  # the import rfjax/ops/_partition.py guards

    assert isinstance(dispatch.prim_requires_devices_during_lowering, set)
    assert _partition.AUTO_PARTITIONING, (
        f"jax {jax.__version__}: rfjax.ops._partition could not import "
        "jax._src.dispatch.prim_requires_devices_during_lowering, so fwht under automatic "
        "sharding gathers its operand on every device"
    )


def test_jax_lowering_sees_rfjax_primitives_as_needing_devices():
    from jax._src import dispatch

    registry = dispatch.prim_requires_devices_during_lowering
    assert {fwht_p, hd_chain_p} <= registry
    x = jnp.ones((4, 3, 16))
    signs, norms = jnp.ones((2, 3, 16)), jnp.ones((2, 16))
    for function in (fwht, lambda v: hd_chain(v, signs, norms)):
        jaxpr = jax.make_jaxpr(function)(x).jaxpr
        assert dispatch.jaxpr_has_prim_requiring_devices(jaxpr), jaxpr
