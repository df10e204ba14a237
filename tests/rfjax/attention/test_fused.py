"""The fused Pallas kernels of FAVOR attention (``implementation="pallas_..."``) on CPU: in
interpret mode against the XLA form (values and gradients of queries, keys, values and the
projection, with masks, padding to whole chunks and per-head projections), against the float64
log-space reference at |q| = |k| = 120, bfloat16 and OPRF (the angular hybrid's kernels:
``test_fused_hybrid.py``); every kernel lowered for Triton on an abstract H100
and for TPUs (Mosaic), which compiles nothing for the devices; and the errors for what the
kernels do not take. The checks in interpret mode run in CI's integration tier
(``tests/support/interpret_mode.py``); the lowering and the errors in the default suite.

Tolerances: the kernels and the XLA form sum the same terms in different orders, in float32:
each output is a ratio of sums of non-negative terms each carried to a few ulps, so outputs and
gradients agree to 1e-5 relative to their largest entry (64 eps32: the terms' rounding, 16
per product chain, and the sums' reordering)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import attention, features, projections
from rfjax.attention import _fused, _fused_kernels, _implementations, _kernel_settings
from tests.rfjax.attention.test_large_norms import exact, inputs
from tests.support.interpret_mode import INTERPRET_MODE
from tests.support.primitives import equations
from tests.support.representatives import representatives
from tests.support.tools import load_tool

EPS32 = float(np.finfo(np.float32).eps)
TOLERANCE = 64 * EPS32
BATCH, LENGTH, HEADS, HEAD_DIM, VALUE_DIM, NUM_FEATURES = 1, 80, 2, 8, 4, 16  # 2 chunks, 1 partial


def operands(seed=0, scale=1.0, dtype=jnp.float32, features=NUM_FEATURES, length=LENGTH):
    k = jax.random.split(jax.random.key(seed), 5)
    shape = (BATCH, length, HEADS, HEAD_DIM)
    q, kk = (scale * jax.random.normal(x, shape) for x in k[:2])
    v = jax.random.normal(k[2], (BATCH, length, HEADS, VALUE_DIM))
    mask = jax.random.uniform(k[3], (BATCH, length)) > 0.25
    projection = attention.draw_projection(
        k[4], HEAD_DIM, features, coupling="orthogonal", num_heads=HEADS
    )
    return (*(x.astype(dtype) for x in (q, kk, v)), mask, projection)


def assert_close(got, want, tolerance=TOLERANCE):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = np.abs(want).max()
    assert np.abs(got - want).max() <= tolerance * scale, np.abs(got - want).max() / scale


def fused_and_xla(q, k, v, projection, weights, fused="pallas_triton_interpret", **options):
    """The outputs and the gradients of sum(out * weights) with respect to q, k, v and the
    projection, ``((outputs, gradients) of the kernels (``fused``: in interpret mode by
    default), those of the XLA form)``, each computed by one program (eagerly, the forward and
    the backward pass would compile apart)."""

    def loss(q, k, v, projection, implementation):
        out = attention.favor_attention(
            q, k, v, projection, implementation=implementation, **options
        )
        return jnp.sum(out * weights), out

    gradients = jax.jit(
        jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True), static_argnums=4
    )
    return [
        (out, grads)
        for (_, out), grads in (
            gradients(q, k, v, projection, implementation) for implementation in (fused, "xla")
        )
    ]


@pytest.mark.parametrize(
    "causal, diagonal_form",
    [(True, "pairs"), (True, "factored"), (True, "chunk"), (False, "pairs")],
    ids=["causal", "causal-factored", "causal-chunk", "bidirectional"],
)
@INTERPRET_MODE
def test_kernels_match_the_xla_form_values_and_gradients(causal, diagonal_form):
    """m = 40: the causal kernels' diagonal blocks in five tiles of 8 features
    (``_fused_kernels.tile_width``: every feature in a whole tile; Triton takes powers of two
    only, in tiles of ``FEATURE_TILE``, ``COTANGENT_TILE`` and ``PRODUCT_TILE``), per pair,
    factored (these inputs are within ``factored_bound``) or in the chunk form (the first
    chunk, whose first key is masked, by blocks; the second as one product)."""
    q, k, v, mask, projection = operands(1, scale=2.0, features=40)
    weights = jax.random.normal(jax.random.key(9), v.shape)
    with attention.fused_kernel_settings(diagonal_form=diagonal_form):
        fused, xla = fused_and_xla(q, k, v, projection, weights, causal=causal, mask=mask)
    for got, want in zip(jax.tree.leaves(fused), jax.tree.leaves(xla), strict=True):
        assert_close(got, want)


@pytest.mark.parametrize("implementation", ["xla", "pallas_triton_interpret"])
def test_float32_matmul_precision_reaches_every_product(implementation):
    """Under ``jax.default_matmul_precision("float32")`` every product of the forward and
    backward passes, causal and bidirectional, runs in float32 (``Precision.HIGHEST``): the
    setting that docs/maths/attention.md gives for float32 accuracy on GPUs and TPUs, whose
    default float32 products are TF32 or one bfloat16 pass (traced, not run)."""
    q, k, v, mask, projection = operands(1)
    highest = (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
    for causal in (True, False):

        def loss(q, k, v, causal=causal):
            out = attention.favor_attention(
                q, k, v, projection, causal=causal, mask=mask, implementation=implementation
            )
            return jnp.sum(out)

        with jax.default_matmul_precision("float32"):
            jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v).jaxpr
        products = [e for e in equations(jaxpr) if e.primitive.name == "dot_general"]
        assert len(products) >= 4, len(products)
        assert {e.params["precision"] for e in products} == {highest}


@pytest.mark.parametrize(  # the bidirectional kernels' values: the test above
    "causal", representatives([True, False], [True]), ids=["causal", "bidirectional"]
)
@INTERPRET_MODE
def test_kernels_at_norm_120_match_float64(causal):
    """|q| = |k| = 120 (H = 64, m = 128): the kernels' per-feature shifts keep every row's
    largest term, as the XLA form's do (tolerance: ``test_attention_large_norms.exact``).
    (The factored diagonal blocks at this norm: the next test.)"""
    check_norm_120(causal)


@INTERPRET_MODE
def test_a_block_beyond_the_factored_bound_is_formed_per_pair():
    """``diagonal_form="factored"`` with the inputs of key 4 at |q| = |k| = 120: the first
    block's largest exponent x is 94.5, past float32's largest exponential (88.7), so its
    factored form would overflow; formed per pair (the other blocks, x of 0 and 24, factored),
    the outputs match float64 and the gradients are finite."""
    with attention.fused_kernel_settings(diagonal_form="factored"):
        check_norm_120(True, key=4)


@INTERPRET_MODE
def test_the_chunk_form_at_norm_120_matches_float64():
    """``diagonal_form="chunk"`` at |q| = |k| = 120: the blocks whose keys are tame relative to
    the chunk's first key as one product, the others by blocks; the outputs match float64 and
    the gradients are finite."""
    with attention.fused_kernel_settings(diagonal_form="chunk"):
        check_norm_120(True, key=4)


@INTERPRET_MODE
def test_the_chunk_form_takes_one_product_where_every_key_is_tame(monkeypatch):
    """Under ``diagonal_form="chunk"`` with every key counted (small norms: every key tame) no
    block is formed by blocks: with ``_block_sums`` (the output kernel's) and
    ``_diagonal_cotangents`` (the cotangent kernel's) made to return NaN, the outputs and the
    gradients still match the XLA form's. With the first key left out, the first chunk has no
    reference (r = the log floor), so its blocks are formed by blocks: there the outputs are
    NaN, and the second chunk's rows are not."""

    def poisoned(function):
        def nan(*args, **kwargs):
            return jax.tree.map(lambda x: x * jnp.nan, function(*args, **kwargs))

        return nan

    for name in ("_block_sums", "_diagonal_cotangents"):
        monkeypatch.setattr(_fused_kernels, name, poisoned(getattr(_fused_kernels, name)))
    # m = 24, which no other test takes: favor_attention's programs are cached by shapes and
    # settings, so a program traced with the kernels as they are must not be reused here, nor
    # one traced here elsewhere (clearing JAX's caches instead cost the file's other tests
    # about 30 CPU s of compilations).
    q, k, v, _, projection = operands(1, scale=2.0, features=24)
    weights = jax.random.normal(jax.random.key(9), v.shape)
    every = jnp.ones((BATCH, LENGTH), bool)
    first_left_out = every.at[:, 0].set(False)
    options = dict(causal=True, implementation="pallas_triton_interpret")
    with attention.fused_kernel_settings(diagonal_form="chunk"):
        fused, xla = fused_and_xla(q, k, v, projection, weights, causal=True, mask=every)
        partly = attention.favor_attention(q, k, v, projection, mask=first_left_out, **options)
    for got, want in zip(jax.tree.leaves(fused), jax.tree.leaves(xla), strict=True):
        assert_close(got, want)
    rows = np.isnan(np.asarray(partly)).any(axis=(0, 2, 3))
    assert rows[:64].all() and not rows[64:].any()


@pytest.mark.parametrize(
    "norm, alone, first", [(20.0, False, 0), (50.0, False, 0), (50.0, True, 0), (50.0, True, 64)]
)
@INTERPRET_MODE
def test_the_chunk_form_takes_its_reference_from_the_first_key(norm, alone, first):
    """``diagonal_form="chunk"`` with the first key of norm 20 or 50 (counted, as the second
    is; the others about 3): its log-features are 70 to 440 below the others', so relative to
    the chunk's reference r = max(C^s, lb_0) the later keys are past ``factored_bound`` (43.7)
    and the first chunk goes by blocks, its values and gradients the XLA form's. A reference
    from another key (the second's: the first row's factor exp(la_0 + r - M_0) overflows,
    times the first key's 0) or a bound checked loosely (the keys' factors clamped at e^bound)
    changes them. ``alone``: the first block's other keys left out, so that the first block is
    tame and its queries' cotangents read every key of the chunk, the later ones (e^440 past r)
    clamped before their products with the queries' zeros for j > t (inf x 0 is NaN).
    ``first`` 64: the far key first in the second chunk, 440 below the first chunk's running
    maximum C^s, which r must take (from lb_0, the state's factor exp(C^s - r) overflows and
    the rows' exp(la + r - M) underflows)."""
    q, k, v, mask, projection = operands(1, features=32)
    direction = jax.random.normal(jax.random.key(13), (HEADS, HEAD_DIM))
    far = norm * direction / jnp.linalg.norm(direction, axis=1, keepdims=True)
    k = k.at[0, first].set(far)
    mask = mask.at[0, first : first + 2].set(True)
    if alone:
        mask = mask.at[0, first + 1 : first + 16].set(False)
    weights = jax.random.normal(jax.random.key(9), v.shape)
    with attention.fused_kernel_settings(diagonal_form="chunk"):
        fused, xla = fused_and_xla(q, k, v, projection, weights, causal=True, mask=mask)
    for got, want in zip(jax.tree.leaves(fused), jax.tree.leaves(xla), strict=True):
        assert_close(got, want)


def check_norm_120(causal, key=None):
    """The kernels' outputs at |q| = |k| = 120 (``inputs``' ``key``) within the float64
    reference's tolerance, and their gradients finite."""
    q, k, v = inputs(120, jnp.float32, length=48, key=key)
    projection = projections.orthogonal(jax.random.key(3), 64, 128)
    out = attention.favor_attention(
        q, k, v, projection, causal=causal, implementation="pallas_triton_interpret"
    )
    want, tolerance = exact(
        q, k, v, np.asarray(projection.matrix()), antithetic=False, causal=causal
    )
    assert np.abs(np.asarray(out, np.float64)[0, :, 0] - want).max() <= tolerance

    def loss(q, k, v):
        out = attention.favor_attention(
            q, k, v, projection, causal=causal, implementation="pallas_triton_interpret"
        )
        return jnp.sum(jnp.sin(out))

    for grad in jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v):
        assert np.all(np.isfinite(np.asarray(grad)))


@pytest.mark.statistical  # the TPU simulator: the same kernels as pallas_triton_interpret
@INTERPRET_MODE
def test_tpu_interpret_mode_and_oprf():
    """The TPU simulator (VMEM, the grid) runs the same kernels; OPRF fitted per head."""
    q, k, v, mask, projection = operands(2)
    fitted = features.get("oprf")().fit(jax.random.key(4), q[0, :, 0], k[0, :, 0])
    options = dict(feature_map=fitted, causal=True, mask=mask)
    fused = attention.favor_attention(
        q, k, v, projection, implementation="pallas_tpu_interpret", **options
    )
    assert_close(
        fused, attention.favor_attention(q, k, v, projection, implementation="xla", **options)
    )


@INTERPRET_MODE
def test_an_oprf_fitted_per_head_by_name_is_fused():
    """feature_map="oprf", bidirectional: favor_attention fits one map per head (a PerHead),
    which the kernels take head by head (check_fusable read the stacked map as one and
    raised)."""
    q, k, v, mask, projection = operands(5)
    options = dict(feature_map="oprf", mask=mask)
    fused = attention.favor_attention(
        q, k, v, projection, implementation="pallas_triton_interpret", **options
    )
    assert_close(
        fused, attention.favor_attention(q, k, v, projection, implementation="xla", **options)
    )


@pytest.mark.parametrize("diagonal_form", ["pairs", "chunk"])
@INTERPRET_MODE
def test_bfloat16_inputs_take_bfloat16_products(diagonal_form):
    """bfloat16 rows: the products' operands in bfloat16 (accumulated in float32), within the
    XLA form's own bfloat16 bound of the float32 result (``test_attention.test_bfloat16_inputs``:
    5u max|v| plus the output's rounding u, u = 2^-8); per pair, and in the chunk form (the
    tame keys' factors up to e^43.7 rounded to bfloat16 as the XLA form's are)."""
    q, k, v, mask, projection = operands(3, dtype=jnp.bfloat16)
    with attention.fused_kernel_settings(diagonal_form=diagonal_form):
        out = attention.favor_attention(
            q, k, v, projection, causal=True, mask=mask, implementation="pallas_triton_interpret"
        )
    assert out.dtype == jnp.bfloat16
    wide = attention.favor_attention(
        *(x.astype(jnp.float32) for x in (q, k, v)), projection, causal=True, mask=mask
    )
    error = np.abs(np.asarray(out, np.float32) - wide) - 2.0**-8 * np.abs(wide)
    bound = 5 * 2.0**-8 * np.abs(np.asarray(v, np.float32)).max(axis=1, keepdims=True)
    assert np.all(error <= bound)


@INTERPRET_MODE
def test_non_finite_rows_stay_in_the_rows_that_read_them():
    q, k, v, mask, projection = operands(4)
    mask = jnp.ones_like(mask)
    q = q.at[0, 5, 0, 0].set(jnp.nan)
    k = k.at[0, 40, 1, 0].set(jnp.inf)
    out = np.asarray(
        attention.favor_attention(
            q, k, v, projection, causal=True, mask=mask, implementation="pallas_triton_interpret"
        )
    )
    assert np.all(np.isnan(out[0, 5, 0])) and np.all(np.isfinite(np.delete(out[0, :, 0], 5, 0)))
    assert np.all(np.isfinite(out[0, :40, 1])) and np.all(np.isnan(out[0, 40:, 1]))


def test_errors_name_what_the_kernels_take():
    q, k, v, _, projection = operands(5)
    for name, kind in (("relu", "ReluFeatureMap"), ("gaussian_hybrid", "GaussianHybridFeatureMap")):
        fmap = features.get(name)().init(jax.random.key(0), HEAD_DIM)
        supported = "'positive', 'positive_antithetic', 'oprf' .* and 'angular_hybrid'"
        with pytest.raises(ValueError, match=f"{supported}; {kind} is not one"):
            attention.favor_attention(
                q, k, v, projection, feature_map=fmap, implementation="pallas_triton_interpret"
            )
    with pytest.raises(ValueError, match="no sign projection"):
        attention.favor_attention(
            q,
            k,
            v,
            projection,
            feature_map=features.AngularHybridFeatureMap(),
            implementation="pallas_triton_interpret",
        )
    with pytest.raises(ValueError, match="stabilize=False"):
        attention.favor_attention(
            q, k, v, projection, stabilize=False, implementation="pallas_triton_interpret"
        )
    # float64 computed in float32 by the kernels, silently (errors 6e-8 where XLA's are 3e-16)
    with jax.enable_x64(True):
        wide = [x.astype(jnp.float64) for x in (q, k, v)]
        for args in (
            (*wide, projection),
            (q, k, v, jax.tree.map(lambda w: w.astype(jnp.float64), projection)),
        ):
            with pytest.raises(ValueError, match=r"computes in float32 .* float64 inputs or proj"):
                attention.favor_attention(*args, implementation="pallas_triton_interpret")
    with pytest.raises(ValueError, match="compiles for gpu, not for platform 'cpu'"):
        attention.favor_attention(q, k, v, projection, implementation="pallas_triton")
    with pytest.raises(ValueError, match="implementation must be one of"):
        attention.favor_attention(q, k, v, projection, implementation="mosaic")
    with pytest.raises(ValueError, match="with sequence_axis use implementation='xla'"):
        attention.favor_attention(
            q, k, v, projection, sequence_axis="seq", implementation="pallas_triton_interpret"
        )


TOOL = load_tool("triton_kernels")  # lowers the kernels for an abstract device
DEVICES = {
    "triton": ("cuda", TOOL.H100),
    "tpu": ("tpu", dict(device_kind="TPU v5 lite", platform="tpu", num_cores=1)),
}


def lowered_kernels(backend, causal, fmap):
    """The Pallas kernels' calls in the forward and backward pass lowered for ``backend`` on
    an abstract device (nothing compiled for it): the benchmark's head (H = 64, H_v = 64),
    T = S = 256, m = 128, bfloat16 products (``tools/triton_kernels.py``)."""
    platform, device = DEVICES[backend]
    lowered = TOOL.lowered_program(
        fmap, 128, causal, backend=backend, platform=platform, device=device
    )
    return lowered.as_text().count("xla.gpu.triton" if backend == "triton" else "tpu_custom_call")


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
@pytest.mark.parametrize("backend", ["triton", "tpu"])
@pytest.mark.parametrize("fmap", ["affine", "angular_hybrid"])
def test_kernels_lower_for_gpu_and_tpu(fmap, backend, causal):
    """Forward and backward lowered by Pallas for Triton (an abstract H100) and for Mosaic TPU
    (an abstract TPU v5e), for FAVOR+/OPRF's affine form (m = 128) and the angular hybrid
    (m = 128, n = 8): what each backend's lowering rules take (block shapes, operations);
    neither compiles for or runs on the device. Causal: forward (key summaries, outputs) and
    backward (key summaries, query summaries, cotangents); bidirectional: forward (key
    summaries, read-out) and backward (key summaries, query summaries, the queries' and the
    keys' cotangents)."""
    assert lowered_kernels(backend, causal, fmap) == (5 if causal else 6)


@pytest.mark.parametrize("diagonal_form", ["factored", "chunk"])
def test_branching_diagonal_forms_lower_for_gpu_and_tpu(diagonal_form):
    """Under ``diagonal_form="factored"`` and ``"chunk"`` the causal output and cotangent
    kernels branch per block (``lax.cond``: an ``scf.if`` in Triton's IR, one per block of the
    output kernel and one per loop over blocks of the cotangent kernel, none per pair): factored
    or per pair, the chunk's product or by blocks. The forward and backward passes lower for
    Triton and for Mosaic TPU."""
    platform, device = DEVICES["triton"]

    def branches():
        lowered = TOOL.lowered_program(
            "affine", 128, True, backend="triton", platform=platform, device=device
        )
        return {k["kernel"]: k["ttir"].count("scf.if") for k in TOOL.triton_kernels(lowered)}

    pairs = branches()
    with attention.fused_kernel_settings(diagonal_form=diagonal_form):
        taken = branches()
        assert lowered_kernels("tpu", True, "affine") == 5
    assert taken["rfjax_favor_causal_output"] - pairs["rfjax_favor_causal_output"] == 4
    assert taken["rfjax_favor_causal_cotangents"] - pairs["rfjax_favor_causal_cotangents"] == 2


@pytest.mark.parametrize(
    "causal, backend, calls",
    [(True, "triton", (5, 0)), (False, "triton", (6, 0)), (False, "mosaic_gpu", (0, 6))],
    ids=["causal", "bidirectional", "bidirectional-mosaic_gpu"],
)
def test_kernels_lower_for_gpus_inside_shard_map(causal, backend, calls):
    """Inside ``shard_map`` (rows split over ``"data"``, the map's parameters replicated) the
    kernels' operands and outputs carry the mesh axes they vary over and the parameters'
    cotangents are summed over the devices: forward and backward lower for Triton (an abstract
    H100), as in the long-context LM's training step; and under ``"pallas_mosaic_gpu"``, the
    forward's two Mosaic GPU kernels and the backward's four. Until 2026-11-28
    the kernels' outputs had no such type and the step did not compile."""
    platform, device = DEVICES["triton"]
    mesh = jax.sharding.AbstractMesh(
        (1,),
        ("data",),
        axis_types=(jax.sharding.AxisType.Auto,),
        abstract_device=jax.sharding.AbstractDevice(**device),
    )
    gradients = TOOL.fused_gradients("affine", causal, backend, rows=lambda x: x[0])

    spec = jax.sharding.PartitionSpec
    split = jax.shard_map(
        gradients,
        mesh=mesh,
        in_specs=(spec(), spec()) + (spec("data"),) * 4,
        out_specs=(spec(), spec()) + (spec("data"),) * 3,
    )
    shapes = TOOL.argument_shapes("affine", 128, batch=(1,), backend=backend)
    with jax.sharding.use_abstract_mesh(mesh):
        text = jax.jit(split).trace(*shapes).lower(lowering_platforms=(platform,)).as_text()
    assert (text.count("xla.gpu.triton"), text.count("custom_call @mosaic_gpu_v2(")) == calls


def _on_the_gpu(causal, dtype):
    """``run(implementation)``: the output and the gradients (q, k, v) of FAVOR on the device,
    B = 2, T = 1,000 (16 chunks, one partial), 4 heads of 64, m = 128, masked; and the inputs'
    rounding unit u (TF32 for float32 inputs, JAX's default precision on the device) and v."""
    k = jax.random.split(jax.random.key(6), 5)
    shape = (2, 1000, 4, 64)
    q, kk, v = (jax.random.normal(x, shape).astype(dtype) for x in k[:3])
    mask = jax.random.uniform(k[3], shape[:2]) > 0.1
    projection = projections.orthogonal(k[4], 64, 128)

    def run(implementation):
        def f(q, kk, v):
            out = attention.favor_attention(
                q, kk, v, projection, causal=causal, mask=mask, implementation=implementation
            )
            return jnp.sum(out.astype(jnp.float32) ** 2), out

        (_, out), grads = jax.value_and_grad(f, argnums=(0, 1, 2), has_aux=True)(q, kk, v)
        return np.asarray(out, np.float32), [np.asarray(g, np.float32) for g in grads]

    u = 2.0**-8 if dtype == jnp.bfloat16 else 2.0**-11
    return run, u, np.asarray(v, np.float32)


def _assert_gpu_close(got, want, u, v):
    """Within 2 x 5u max|v| plus the output's rounding u for the outputs, 64u of the largest
    entry for the gradients (``test_pallas_triton_on_the_gpu_matches_the_xla_form``)."""
    (out, grads), (want_out, want_grads) = got, want
    assert np.abs(out - want_out).max() <= 10 * u * np.abs(v).max() + u * np.abs(want_out).max()
    for grad, want_grad in zip(grads, want_grads, strict=True):
        assert np.abs(grad - want_grad).max() <= 64 * u * np.abs(want_grad).max()


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="compiles the kernels for a GPU")
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_pallas_triton_on_the_gpu_matches_the_xla_form(causal, dtype):
    """The kernels compiled by Triton (``benchmarks.gpu_run``'s tests step) against the XLA
    form on the device. Tolerance: the products' operands are rounded to TF32 (float32 inputs,
    u = 2^-11) or bfloat16 (u = 2^-8) in both, so each output is within 2 x 5u max|v| of the
    other (``test_bfloat16_inputs_take_bfloat16_products``'s bound, once per computation),
    plus the output's rounding u."""
    run, u, v = _on_the_gpu(causal, dtype)
    _assert_gpu_close(run("pallas_triton"), run("xla"), u, v)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="compiles the kernels for a GPU")
def test_auto_on_the_gpu_runs_its_measured_choice():
    """``"auto"`` on the device, bidirectional and bfloat16 (``AUTO``'s measured entry): the
    Triton kernels on sm90+ (a ``pallas_call`` in its program; before 2b510ca the table was read
    at the compute dtype and never applied), the XLA form on older GPUs, and either way within
    the kernels' tolerance of the XLA form."""
    from rfjax._devices import cuda_capability

    choice = _implementations.auto_choice(
        "gpu", causal=False, dtype="bfloat16", capability=cuda_capability()
    )
    q = jnp.ones((1, 64, 2, 64), jnp.bfloat16)
    projection = projections.orthogonal(jax.random.key(0), 64, 128)
    program = str(jax.make_jaxpr(lambda: attention.favor_attention(q, q, q, projection))())
    assert ("pallas_call" in program) == (choice != "xla")
    run, u, v = _on_the_gpu(False, jnp.bfloat16)
    _assert_gpu_close(run("auto"), run("xla"), u, v)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="compiles the kernels for a GPU")
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_pallas_triton_chunk_form_on_the_gpu_matches_the_xla_form(dtype):
    """``diagonal_form="chunk"`` (8 warps, as the lease's ``chunk8`` arm) compiled by Triton
    against the XLA form on the device, causal (the bound of the test above)."""
    run, u, v = _on_the_gpu(True, dtype)
    with attention.fused_kernel_settings(diagonal_form="chunk", num_warps=8):
        got = run("pallas_triton")
    _assert_gpu_close(got, run("xla"), u, v)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="compiles the kernels for a GPU")
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "bidirectional"])
def test_pallas_triton_segments_on_the_gpu_match_one_segment(causal, monkeypatch):
    """The segments' scans around the Triton kernels compiled on the device: 16 chunks in 4
    segments give one segment's outputs and gradients (bfloat16; the bound of the test above)."""
    run, u, v = _on_the_gpu(causal, jnp.bfloat16)
    whole = run("pallas_triton")
    monkeypatch.setattr(_fused, "_segment_chunks", lambda width, value_width: 4)
    _assert_gpu_close(run("pallas_triton"), whole, u, v)


@INTERPRET_MODE
def test_layers_take_the_implementation():
    """``rfjax.nn.PerformerAttention(implementation=...)`` (linen; NNX and PerformerLM pass it
    on alike) runs the kernels for a causal layer: the same output as the XLA form."""
    from rfjax.nn import PerformerAttention

    x = jax.random.normal(jax.random.key(7), (1, 40, 16))
    rngs = {"projection": jax.random.key(8)}
    layers = {
        name: PerformerAttention(
            num_heads=2, num_features=16, causal=True, implementation=name, coupling="gaussian"
        )
        for name in ("xla", "pallas_triton_interpret")
    }
    params = jax.jit(layers["xla"].init)({"params": jax.random.key(9), **rngs}, x, x)
    outs = {name: jax.jit(layer.apply)(params, x, x, rngs=rngs) for name, layer in layers.items()}
    assert_close(outs["pallas_triton_interpret"], outs["xla"])


def test_mosaic_gpu_falls_back_to_the_generic_kernels_compiled_as_it_is():
    """Where Mosaic GPU's causal kernels cannot take a call, the generic kernels run: Triton's
    where Mosaic GPU compiles, interpret mode where it is interpreted (a CPU cannot compile
    Triton's); the other backends are their own generic backend."""
    table = _implementations.TABLE
    assert table["pallas_mosaic_gpu"].backend.generic == table["pallas_triton"].backend
    generic = table["pallas_mosaic_gpu_interpret"].backend.generic
    assert generic == table["pallas_triton_interpret"].backend
    for name in ("pallas_triton", "pallas_tpu", "pallas_triton_interpret", "pallas_tpu_interpret"):
        assert table[name].backend.generic == table[name].backend


@pytest.mark.parametrize(
    ("name", "count", "fits"),
    [
        ("positive", 128, True),
        ("positive", 16, True),  # the smallest: MIN_WIDTH
        ("positive", 8, False),
        ("positive", 24, False),
        ("angular_hybrid", 8, True),  # 2m = 16, one tile
        ("angular_hybrid", 40, True),  # 2m = 80, five tiles
        ("angular_hybrid", 32, True),
        ("angular_hybrid", 96, True),
        ("angular_hybrid", 12, False),
        ("angular_hybrid", 48, True),
        ("angular_hybrid", 36, False),
    ],
)
def test_triton_names_the_feature_counts_it_takes(name, count, fits):
    """Triton forms power-of-two blocks only: ``pallas_triton`` checks m before compiling
    (the affine maps' m, the hybrid's 2m in tiles of 16) and says what to use instead."""
    fmap = features.get(name)().init(jax.random.key(0), 64)
    projection = projections.orthogonal(jax.random.key(1), 64, count)
    check = functools.partial(
        _fused.check_fusable,
        fmap,
        projection,
        "pallas_triton",
        dtype=jnp.float32,
        widths=(64, 64),
    )
    if fits:
        check()
    else:
        with pytest.raises(ValueError, match=f"got m = {count}: use implementation='xla'"):
            check()


@pytest.mark.parametrize(  # the bidirectional kernels' tiles: CI's statistical tier
    "causal", representatives([True, False], [True]), ids=["causal", "bidirectional"]
)
@INTERPRET_MODE
def test_wide_maps_run_the_cotangent_kernels_per_tile_of_features(causal, monkeypatch):
    """Past ``cotangent_features`` the affine maps' cotangent kernels run once per tile of
    features (their shared memory per block grows with the features): 16 features in tiles of
    8 give the gradients of one call, the rows' summed over the tiles and the map's joined."""
    q, k, v, mask, _ = operands(3, scale=2.0)
    projection = projections.orthogonal(jax.random.key(6), HEAD_DIM, NUM_FEATURES)
    form = _fused.kernel_form(projection, features.get("positive")())
    rows = (q[0, :, 0], k[0, :, 0], v[0, :, 0], mask[0])
    weights = jax.random.normal(jax.random.key(5), (LENGTH, VALUE_DIM))

    def loss(w, b, q, k, v, valid):
        num, den = _fused.fused_attention_sums(
            features.AffineLogForm(w, b, form.norm_weight),
            q,
            k,
            v,
            valid,
            causal=causal,
            backend=_fused.Backend(None),
        )
        return jnp.sum(num * weights) + jnp.sum(jnp.sin(den))

    def gradients():  # traced afresh: the settings are read when tracing
        grad = jax.grad(lambda *a: loss(*a), argnums=(0, 1, 2, 3, 4))
        kernel = "rfjax_favor_causal_cotangents" if causal else "rfjax_favor_key_cotangents"
        calls = str(jax.make_jaxpr(grad)(form.weights, form.bias, *rows)).count(kernel)
        return jax.jit(grad)(form.weights, form.bias, *rows), calls

    whole, calls = gradients()
    assert calls == 1
    tiles_of_8 = _kernel_settings.KernelSettings(cotangent_features=8)  # below Triton's 16
    monkeypatch.setattr(_kernel_settings, "IN_FORCE", tiles_of_8)
    tiled, calls = gradients()
    assert calls == NUM_FEATURES // 8
    for got, want in zip(tiled, whole, strict=True):
        assert_close(got, want)


@INTERPRET_MODE
def test_the_state_read_out_in_tiles_of_features_gives_the_outputs_of_one_tile(monkeypatch):
    """Past ``STATE_TILE`` features the causal output kernel reads the earlier chunks' state a
    tile of features at a time: 16 features in tiles of 8 give one tile's outputs (the
    numerator and denominator; the sums differ in order only)."""
    from rfjax.attention import _fused_kernels

    q, k, v, mask, _ = operands(4, scale=2.0)
    projection = projections.orthogonal(jax.random.key(7), HEAD_DIM, NUM_FEATURES)
    form = _fused.kernel_form(projection, features.get("positive")())
    rows = (q[0, :, 0], k[0, :, 0], v[0, :, 0], mask[0])

    def sums():  # traced afresh: STATE_TILE is read when tracing
        return jax.jit(
            lambda *rows: _fused.fused_attention_sums(
                form, *rows, causal=True, backend=_fused.Backend(None)
            )
        )(*rows)

    whole = sums()
    monkeypatch.setattr(_fused_kernels, "STATE_TILE", 8)
    for got, want in zip(sums(), whole, strict=True):
        assert_close(got, want)


@pytest.mark.parametrize(  # the segments are the maps' alike: the hybrid in CI's statistical tier
    "name, causal",
    representatives(
        [("positive", True), ("positive", False), ("angular_hybrid", True)],
        [("positive", True), ("positive", False)],
        unpack=True,
    ),
    ids=["causal", "bidirectional", "angular_hybrid-causal"],
)
@INTERPRET_MODE
def test_long_sequences_run_segment_by_segment_with_the_sums_of_one_segment(
    name, causal, monkeypatch
):
    """Past ``STATES_BYTES`` of one head's chunk states the passes run over segments of chunks,
    the causal ones carrying the running maximum and the state from segment to segment (the
    backward pass from a checkpoint at each segment's start), the bidirectional ones summing
    each segment's summaries: three chunks (the last partial) in segments of two (one chunk of
    padding) give the values and gradients of one segment."""
    length = 2 * 64 + 22
    k = jax.random.split(jax.random.key(7), 4)
    q, kk = (2.0 * jax.random.normal(x, (length, HEAD_DIM)) for x in k[:2])
    v = jax.random.normal(k[2], (length, VALUE_DIM))
    valid = jax.random.uniform(k[3], (length,)) > 0.25
    projection = projections.orthogonal(jax.random.key(6), HEAD_DIM, NUM_FEATURES)
    fmap = features.get(name)().init(jax.random.key(8), HEAD_DIM)
    form = _fused.kernel_form(projection, fmap)
    weights = jax.random.normal(jax.random.key(5), (length, VALUE_DIM))

    def loss(w, aux, q, k, v):
        num, den = _fused.fused_attention_sums(
            form._replace(weights=w, **{form._fields[1]: aux}),
            q,
            k,
            v,
            valid,
            causal=causal,
            backend=_fused.Backend(None),
        )
        return jnp.sum(num * weights) + jnp.sum(jnp.sin(den)), (num, den)

    def run():  # traced afresh: the segments are chosen when tracing
        grad = jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True)
        program = str(jax.make_jaxpr(grad)(*form[:2], q, kk, v))
        (_, sums), grads = jax.jit(grad)(*form[:2], q, kk, v)
        return (*sums, *grads), program.count("scan[")

    whole, whole_scans = run()
    monkeypatch.setattr(_fused, "_segment_chunks", lambda width, value_width: 2)
    segmented, scans = run()
    assert scans > whole_scans
    for got, want in zip(segmented, whole, strict=True):
        assert_close(got, want)


def test_segments_are_the_fewest_whose_states_fit_and_of_equal_length(monkeypatch):
    """At most ``STATES_BYTES`` of float32 states (F features, P + 1 columns) per segment, at
    least one chunk; the fewest such segments, of equal length, so that fewer chunks than
    segments are padding."""
    per_chunk = 4 * 64 * (16 + 1)
    for fit, most in [(0, 1), (1, 1), (112, 112)]:
        monkeypatch.setattr(_fused, "STATES_BYTES", fit * per_chunk + per_chunk // 2)
        assert _fused._segment_chunks(64, 16) == most
    for length, most, segments, segment in [
        (257 * 64, 112, 3, 86),  # 258 chunks: one of padding
        (224 * 64, 112, 2, 112),
        (225 * 64 - 5, 112, 3, 75),
        (100, None, 1, 2),
        (100, 1, 2, 1),
    ]:
        rows = _fused._Sequence(length, most)
        assert (rows.segments, rows.segment) == (segments, segment)
        assert rows.padded == segments * segment * 64 >= length
