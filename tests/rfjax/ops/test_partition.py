"""``rfjax.ops._partition``'s one private JAX name fails loudly, not silently.

``_partition`` imports ``jax._src.dispatch.prim_requires_devices_during_lowering`` behind a
guard: on a JAX without it, ``AUTO_PARTITIONING`` turns False and an ``fwht`` under automatic
sharding falls back to XLA's default (an all-gather of the operand) without a word. These tests
fail instead, on the JAX installed: the guarded import works, automatic partitioning is on, and
JAX's lowering sees rfjax's primitives in the registry it reads (the same check that hands
``custom_partitioning`` its devices). A failure here after a JAX upgrade means: find JAX's new
mechanism for a primitive that lowers through ``custom_partitioning`` before anything else.

The end-to-end check of what the partitioning rules buy (every implementation on 4 forced CPU
devices: per shard, no gather, same results) runs here too, in a subprocess.
"""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest

from rfjax.ops import _partition, fwht, fwht_backend, fwht_backends, fwht_p, hd_chain, hd_chain_p

# The backends the sharding check runs: every registered one that runs on CPU here (a new one
# joins without an edit), but the simulators (Pallas' TPU and Mosaic GPU interpret modes, about
# a second per call), of which the script checks one by name.
SHARDED_BACKENDS = [
    name
    for name in fwht_backends(platform="cpu")
    if not fwht_backend(name).simulated and fwht_backend(name).available()
]


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


_SHARDING_SCRIPT = textwrap.dedent(
    """
    import functools, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P
    from rfjax import projections
    from rfjax.ops import _partition, chain_reference, fwht, hd_chain

    assert len(jax.devices()) == 4, jax.devices()
    COLLECTIVES = ("all-gather", "all-to-all", "all-reduce", "collective-permute")
    x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    rng = np.random.default_rng(2)
    CHAIN_X = rng.standard_normal((8, 3, 64)).astype(np.float32)
    SIGNS = rng.choice([-1.0, 1.0], size=(2, 3, 64)).astype(np.float32)
    NORMS = np.abs(rng.standard_normal((2, 64))).astype(np.float32)

    def compiled_ops(f, arg):
        text = f.lower(arg).compile().as_text()
        return {op for op in COLLECTIVES if op in text}

    # Results equal the unsharded op up to float32 rounding (XLA may block a dot differently for
    # a shard's shape; the C++ kernel and the butterfly give the same bits).
    def check(f, arg, reference, *, allowed=(), tol=1e-6):
        found = compiled_ops(f, arg)
        assert found <= set(allowed), found
        y = f(arg)
        assert y.sharding.is_equivalent_to(arg.sharding, arg.ndim), (y.sharding, arg.sharding)
        err = np.abs(np.asarray(y, np.float64) - np.asarray(reference, np.float64)).max()
        assert err <= tol * np.abs(np.asarray(reference)).max(), err
        return found

    explicit = jax.make_mesh((4,), ("x",), axis_types=(AxisType.Explicit,))
    grid = jax.make_mesh((2, 2), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    # Automatic axes, as a plain Mesh has them: the partitioner decides after tracing.
    auto = Mesh(np.array(jax.devices()), ("x",))
    auto_grid = Mesh(np.array(jax.devices()).reshape(2, 2), ("x", "y"))
    assert all(t == AxisType.Auto for t in auto.axis_types + auto_grid.axis_types)
    for impl in sys.argv[1:]:
        transform = lambda v, impl=impl: fwht(v, normalize=True, implementation=impl)
        unsharded = transform(x)
        # Rows sharded, explicit or automatic axes (plain jit, no out_shardings): per shard, no
        # collective, same bits as one device.
        for mesh in (explicit, auto):
            rows = jax.device_put(x, NamedSharding(mesh, P("x")))
            check(jax.jit(transform), rows, unsharded)
        rows = jax.device_put(x, NamedSharding(auto_grid, P("y")))
        check(jax.jit(transform), rows, unsharded)
        # The transformed axis sharded over 4 devices, and over a 2 x 2 mesh with rows on x:
        # a distributed transform, blocks exchanged by collective permutes, nothing gathered.
        for flat, square in ((explicit, grid), (auto, auto_grid)):
            for sharding in (NamedSharding(flat, P(None, "x")), NamedSharding(square, P("x", "y")),
                             NamedSharding(square, P(None, ("x", "y")))):
                cols = jax.device_put(x, sharding)
                found = check(jax.jit(transform), cols, unsharded, allowed=("collective-permute",))
                assert found == {"collective-permute"}, found
        # Inside shard_map (over every axis, or over y alone with x automatic) the op is local.
        # (Pallas' HLO interpreter fails shard_map's varying-axes check inside its while loop,
        # a JAX limitation independent of fwht: check_vma=False for it.)
        vma = impl != "pallas_triton_interpret"
        rows = jax.device_put(x, NamedSharding(explicit, P("x")))
        body = jax.shard_map(transform, mesh=explicit, in_specs=P("x"), out_specs=P("x"),
                             check_vma=vma)
        check(jax.jit(body), rows, unsharded)
        partial = jax.shard_map(transform, mesh=auto_grid, in_specs=P(), out_specs=P(),
                                axis_names={"y"}, check_vma=vma)
        check(jax.jit(partial), jax.device_put(x, NamedSharding(auto_grid, P("x"))), unsharded)
        grad = jax.jit(jax.shard_map(jax.grad(lambda v: (transform(v) ** 2).sum()),
                                     mesh=explicit, in_specs=P("x"), out_specs=P("x"),
                                     check_vma=vma))
        np.testing.assert_allclose(np.asarray(grad(rows)), 2 * x, rtol=1e-5, atol=1e-5)
        # Under automatic axes, the gradient and vmap stay per shard too.
        rows = jax.device_put(x, NamedSharding(auto, P("x")))
        check(jax.jit(jax.grad(lambda v: (transform(v) ** 2).sum())), rows, 2 * x, tol=1e-5)
        check(jax.jit(jax.vmap(transform)), rows, unsharded)
        # hd_chain (the fast couplings' map) with this implementation, rows sharded.
        chain = lambda v, impl=impl: hd_chain(v, SIGNS, NORMS, simplex=True, implementation=impl)
        reference = chain(CHAIN_X)
        for mesh in (explicit, auto):
            check(jax.jit(chain), jax.device_put(CHAIN_X, NamedSharding(mesh, P("x"))), reference,
                  tol=1e-5)

    # Pallas' TPU interpret mode (a simulator with ordered host callbacks): per shard under
    # explicit axes; under automatic axes custom_partitioning cannot carry its effects, and XLA
    # gathers its operand (the result is still right).
    simulated = lambda v: fwht(v, normalize=True, implementation="pallas_tpu_interpret")
    reference = simulated(x)
    check(jax.jit(simulated), jax.device_put(x, NamedSharding(explicit, P("x"))), reference)
    rows = jax.device_put(x, NamedSharding(auto, P("x")))
    np.testing.assert_allclose(np.asarray(jax.jit(simulated)(rows)), reference, rtol=1e-6,
                               atol=1e-6)

    # The structured couplings built on fwht (three transforms in a row, with products between):
    # per shard of the batch, no collective, under explicit and automatic axes.
    inputs = np.random.default_rng(1).standard_normal((16, 100)).astype(np.float32)
    for name in ("hd_orthogonal", "fast_simplex"):
        projection = projections.get(name)(jax.random.key(0), 100, 300)
        unsharded = projection(inputs)
        apply = jax.jit(lambda v, projection=projection: projection(v))
        for mesh in (explicit, auto):
            check(apply, jax.device_put(inputs, NamedSharding(mesh, P("x"))), unsharded)
    # A fused chain kernel (compiled Pallas TPU on a TPU) is partitioned by auto_rows: checked
    # here with the reference composition in its place.
    fused = _partition.auto_rows(
        functools.partial(chain_reference, simplex=True, implementation="xla"),
        "... p, b k p, b p -> ... b p")
    reference = chain_reference(CHAIN_X, SIGNS, NORMS, simplex=True, implementation="xla")
    check(jax.jit(lambda v: fused(v, SIGNS, NORMS)),
          jax.device_put(CHAIN_X, NamedSharding(auto, P("x"))), reference, tol=1e-5)
    print("OK")
    """
)


def _run_on_four_devices(script: str, *args: str) -> None:
    """Runs ``script`` in a subprocess with 4 forced CPU devices; it must print OK."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    ).strip()
    result = subprocess.run(
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]


@pytest.mark.integration
def test_sharded_transforms_run_per_shard():
    """4 forced CPU devices: no all-gather, output sharded like the input, results unchanged."""
    _run_on_four_devices(_SHARDING_SCRIPT, "auto", *SHARDED_BACKENDS)


_SHARDED_SIMPLEX_SCRIPT = textwrap.dedent(
    """
    import jax, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from rfjax.ops import chain_reference, hd_chain

    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    signs = rng.choice([-1.0, 1.0], size=(2, 3, 64)).astype(np.float32)
    norms = np.abs(rng.standard_normal((2, 64))).astype(np.float32)
    reference = np.asarray(chain_reference(x, signs, norms, simplex=True, implementation="xla"))
    grid = jax.make_mesh((2, 2), ("x", "y"))
    for spec in (P(None, ("x", "y")), P("x", "y")):
        sharded = jax.device_put(x, NamedSharding(grid, spec))
        y = jax.jit(lambda v: hd_chain(v, signs, norms, simplex=True))(sharded)
        assert y.sharding.spec == P(spec[0], None, spec[1]), y.sharding
        assert np.abs(np.asarray(y) - reference).max() <= 1e-5 * np.abs(reference).max()
    print("OK")
    """
)


@pytest.mark.integration
def test_a_sharded_transformed_axis_takes_the_simplex_map():
    """The fast SimRF chain (simplex=True) with p split over explicit mesh axes: S's slice of
    the first p - 1 entries raised a ShardingTypeError (63 entries over 4 devices); the mask
    keeps the axis sharded, and the result is the unsharded one's."""
    _run_on_four_devices(_SHARDED_SIMPLEX_SCRIPT)
