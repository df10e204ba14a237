"""The Pallas kernels of ``rfjax.ops`` on CPU: Mosaic TPU and Mosaic GPU, in interpret mode and
lowered for the real devices.

* Interpret mode (``implementation="pallas_tpu_interpret"`` / ``"mosaic_gpu_interpret"``): Pallas
  simulates the device (VMEM or shared memory, the grid, DMA/TMA copies, barriers, MMAs) and the
  results are compared with the dense float64 product, for every length and dtype the kernels
  take (TPU: n = 2^0 ... 2^14; Mosaic GPU: 2^4 ... 2^14; float16, bfloat16, float32). That grid
  costs about a second per case, so CI runs a sample (every regime and dtype at least once;
  its integration tier, ``tests/support/interpret_mode.py``) and ``--runslow`` the whole grid.
* Lowering: ``jit(...).trace(...).lower(lowering_platforms=("tpu",))`` runs the Pallas-to-Mosaic
  TPU lowering (block shapes, supported operations) and ``("cuda",)`` for an abstract H100 runs the
  Mosaic GPU lowering with its layout inference and shared-memory budget. Neither compiles for or
  runs on the device: that needs a TPU or a GPU.

Tolerances: float32 |y - H x| <= 4 eps32 (1 + log2 n) ||x||_2 per vector (see ``test_ops``);
half types are accumulated in float32 and rounded once: 2 ulps of the vector's largest entry.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import projections
from rfjax._tensor_cores import bfloat16_parts
from rfjax.ops import (
    _fwht_mosaic_gpu,
    _fwht_tpu,
    chain_reference,
    fwht,
    fwht_backend,
    fwht_backends,
    hd_chain,
)
from rfjax.ops._fwht_xla import hadamard_matrix
from tests.support.interpret_mode import INTERPRET_MODE

DTYPES = (jnp.float16, jnp.bfloat16, jnp.float32)
EPS32 = float(np.finfo(np.float32).eps)
TPU_LENGTHS = tuple(range(15))
GPU_LENGTHS = tuple(range(4, 15))
H100 = jax.sharding.AbstractDevice(
    device_kind="NVIDIA H100 80GB HBM3", platform="gpu", num_cores=132
)


def _grid(lengths):
    """Every (log2 n, dtype); without ``--runslow`` one dtype per length, rotating."""
    cases = []
    for i, k in enumerate(lengths):
        for j, dtype in enumerate(DTYPES):
            marks = () if j == i % len(DTYPES) else (pytest.mark.slow,)
            cases.append(pytest.param(k, dtype, marks=marks, id=f"n{1 << k}-{dtype.__name__}"))
    return cases


def _sample(cases, keep):
    """``cases`` with all but the ``keep`` ids marked slow (interpret mode is ~1-3 s a case); the
    ``keep`` ids run without ``--runslow`` whatever ``_grid`` marked them (it kept their slow
    mark, so that n = 1024 in float32 and the three Mosaic GPU cases never ran)."""
    assert keep <= {case.id for case in cases}, keep - {case.id for case in cases}
    out = []
    for case in cases:
        marks = () if case.id in keep else (pytest.mark.slow,)
        out.append(pytest.param(*case.values, marks=marks, id=case.id))
    return out


def _dense(x: np.ndarray) -> np.ndarray:
    """H_n x along the last axis in float64 (split once above 4096 to keep H small)."""
    n = x.shape[-1]
    if n > 4096:
        first, second = _dense(x[..., : n // 2]), _dense(x[..., n // 2 :])
        return np.concatenate([first + second, first - second], axis=-1)
    return x @ hadamard_matrix(n).astype(np.float64)


def _assert_close(y, x, normalize: bool) -> None:
    x64 = np.asarray(jnp.asarray(x, jnp.float32), np.float64)
    n = x64.shape[-1]
    ref = _dense(x64) / (math.sqrt(n) if normalize else 1.0)
    y = np.asarray(jnp.asarray(y, jnp.float32), np.float64)
    if jnp.dtype(x.dtype) == jnp.float32:
        norm = np.linalg.norm(x64, axis=-1, keepdims=True) / (math.sqrt(n) if normalize else 1)
        tol = 4 * EPS32 * (1 + math.log2(n)) * norm
    else:
        tol = 2 * float(jnp.finfo(x.dtype).eps) * np.abs(ref).max(axis=-1, keepdims=True)
    err = np.abs(y - ref)
    assert np.all(err <= tol), f"max error {(err / tol).max():.3g} x tolerance, n={n}"


def _input(k: int, dtype, rows: int = 11) -> jax.Array:
    rng = np.random.default_rng(100 + k)
    return jnp.asarray(rng.standard_normal((rows, 1 << k)), dtype)


# --- Mosaic TPU ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "k, dtype",
    _sample(_grid(TPU_LENGTHS), {"n1-float16", "n128-bfloat16", "n512-float16", "n1024-float32"}),
)
@INTERPRET_MODE
def test_tpu_kernel_matches_dense_hadamard(k, dtype):
    x = _input(k, dtype, rows=37 if k < 10 else 9)  # 37 rows: a partial last tile below n = 1024
    normalize = k % 2 == 1
    y = jax.jit(lambda v: fwht(v, normalize=normalize, implementation="pallas_tpu_interpret"))(x)
    assert y.dtype == dtype and y.shape == x.shape
    _assert_close(y, x, normalize)


@pytest.mark.parametrize("k, dtype", _grid(TPU_LENGTHS))
def test_tpu_kernel_lowers_to_mosaic(k, dtype):
    x = jax.ShapeDtypeStruct((40, 1 << k), dtype)
    text = (
        jax.jit(lambda v: _fwht_tpu.fwht_rows(v, True))
        .trace(x)
        .lower(lowering_platforms=("tpu",))
        .as_text()
    )
    assert "tpu_custom_call" in text


def _assert_nan_stays_in_its_vector(implementation: str, rows: int) -> None:
    x = np.random.default_rng(0).standard_normal((rows, 256)).astype(np.float32)
    x[2, 17] = np.nan
    y = np.asarray(fwht(x, implementation=implementation))
    assert np.all(np.isnan(y[2]))
    finite = np.delete(np.arange(rows), 2)
    _assert_close(y[finite], jnp.asarray(x[finite]), False)


@INTERPRET_MODE
def test_tpu_kernel_keeps_a_nan_in_its_own_vector():
    # 300 rows of 256: a partial last tile, whose missing rows the simulator fills with NaN.
    _assert_nan_stays_in_its_vector("pallas_tpu_interpret", 300)


def test_tpu_kernel_rejects_what_it_does_not_take():
    with jax.enable_x64(True), pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        fwht(jnp.zeros((2, 8), jnp.float64), implementation="pallas_tpu_interpret")
    with pytest.raises(ValueError, match="up to 16384"):
        fwht(jnp.zeros((1, 1 << 15)), implementation="pallas_tpu_interpret")
    with pytest.raises(ValueError, match="runs on tpu"):
        jax.jit(lambda v: fwht(v, implementation="pallas_tpu"))(jnp.zeros((2, 8)))


def _chain_case(p: int, dtype, num_blocks: int = 3, rows: int = 13):
    rng = np.random.default_rng(p)
    x = jnp.asarray(rng.standard_normal((rows, p)), dtype)
    signs = jnp.asarray(rng.choice([-1.0, 1.0], (num_blocks, 3, p)), dtype)
    norms = jnp.asarray(rng.uniform(0.5, 2.0, (num_blocks, p)), dtype)
    return x, signs, norms


def _chain_oracle(x, signs, norms, simplex: bool) -> np.ndarray:
    x, signs, norms = (
        np.asarray(jnp.asarray(a, jnp.float32), np.float64) for a in (x, signs, norms)
    )
    p = x.shape[-1]
    y = np.broadcast_to(x[:, None, :], (x.shape[0], signs.shape[0], p))
    for stage in range(signs.shape[1]):
        y = _dense(y * signs[None, :, stage]) / math.sqrt(p)
    if simplex:
        head = y[..., :-1]
        sigma = head.sum(-1, keepdims=True)
        scaled = math.sqrt(p / (p - 1)) * head - (math.sqrt(p) + 1) / (p - 1) ** 1.5 * sigma
        y = np.concatenate([scaled, sigma / math.sqrt(p - 1)], axis=-1)
    return y * norms


def _chain_grid():
    cases = []
    for k in TPU_LENGTHS:
        for simplex in (False, True) if k > 0 else (False,):
            for dtype in DTYPES:
                cases.append(
                    pytest.param(
                        k,
                        simplex,
                        dtype,
                        id=f"p{1 << k}-{'simplex' if simplex else 'hd'}-{dtype.__name__}",
                    )
                )
    return _sample(cases, {"p64-simplex-float32", "p256-hd-float16", "p1024-hd-bfloat16"})


@pytest.mark.parametrize("k, simplex, dtype", _chain_grid())
@INTERPRET_MODE
def test_fused_chain_matches_the_composition(k, simplex, dtype):
    """The fused TPU chain (3 rotations, simplex or not, norms) against the float64 oracle."""
    p = 1 << k
    x, signs, norms = _chain_case(p, dtype)
    y = jax.jit(
        functools.partial(hd_chain, simplex=simplex, implementation="pallas_tpu_interpret")
    )(x, signs, norms)
    assert y.shape == (13, 3, p) and y.dtype == dtype
    ref = _chain_oracle(x, signs, norms, simplex)
    # Three normalised rotations in float32, each within the fwht tolerance of its (unit-norm)
    # input; the simplex map and the norms (<= 2) scale the error by at most 2 (sqrt(p/(p-1)) +
    # ...) x 2. Half types are rounded once at the end: at most half an ulp, eps/2 relative, of
    # a value within that float32 bound of the reference. (A bound of eps(dtype) in place of
    # eps32 exceeded every entry in bfloat16 at p = 1024: a kernel that skipped H_128 passed.)
    scale = np.linalg.norm(np.asarray(jnp.asarray(x, jnp.float32), np.float64), axis=-1)
    tol = 3 * 4 * EPS32 * (1 + k) * 8 * scale[:, None, None]
    if jnp.dtype(dtype) != jnp.float32:
        tol = 2 * tol + float(jnp.finfo(dtype).eps) * np.abs(ref)
    assert np.all(np.abs(np.asarray(jnp.asarray(y, jnp.float32), np.float64) - ref) <= tol)


@INTERPRET_MODE
def test_fused_chain_gradients_and_vmap_match_the_composition():
    x, signs, norms = _chain_case(16, jnp.float32, num_blocks=2, rows=3)

    def loss(implementation, v, s, nrm):
        y = hd_chain(v, s, nrm, simplex=True, implementation=implementation)
        return jnp.sum(jnp.sin(y))

    fused = jax.jit(jax.grad(functools.partial(loss, "pallas_tpu_interpret"), argnums=(0, 2)))
    plain = jax.jit(jax.grad(functools.partial(loss, "xla"), argnums=(0, 2)))
    for got, want in zip(fused(x, signs, norms), plain(x, signs, norms), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    batched = jax.jit(
        jax.vmap(lambda s: hd_chain(x, s, norms, implementation="pallas_tpu_interpret"))
    )(jnp.stack([signs, -signs]))
    np.testing.assert_allclose(
        batched[1], chain_reference(x, -signs, norms, simplex=False), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("name", ["hd_orthogonal", "fast_simplex"])
def test_structured_couplings_use_the_fused_kernel_on_tpu(name):
    projection = projections.get(name)(jax.random.key(0), 100, 300)
    x = jax.ShapeDtypeStruct((8, 100), jnp.float32)
    apply = jax.jit(lambda v: projection(v))
    tpu = apply.trace(x).lower(lowering_platforms=("tpu",)).as_text()
    assert tpu.count("tpu_custom_call") == 1  # the whole chain: one kernel
    cpu = apply.trace(x).lower(lowering_platforms=("cpu",)).as_text()
    assert "tpu_custom_call" not in cpu


# --- Mosaic GPU -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "k, dtype", _sample(_grid(GPU_LENGTHS), {"n32-float32", "n2048-float16", "n4096-bfloat16"})
)
@INTERPRET_MODE
def test_mosaic_gpu_kernel_matches_dense_hadamard(k, dtype):
    x = _input(k, dtype, rows=7)  # 7 rows: padded up to a whole tile
    normalize = k % 2 == 0
    y = jax.jit(lambda v: fwht(v, normalize=normalize, implementation="mosaic_gpu_interpret"))(x)
    assert y.dtype == dtype and y.shape == x.shape
    _assert_close(y, x, normalize)


@pytest.mark.parametrize(
    "k, dtype",
    _sample(
        _grid(GPU_LENGTHS),
        {"n16-float16", "n256-float32", "n2048-bfloat16", "n8192-float32", "n16384-float16"},
    ),
)
def test_mosaic_gpu_kernel_lowers_for_h100(k, dtype):
    # 64 vectors: several tiles per program in the pipelined launch at every n
    x = jax.ShapeDtypeStruct((64, 1 << k), dtype)
    mesh = jax.sharding.AbstractMesh((), (), abstract_device=H100)
    for launch in (_fwht_mosaic_gpu.fwht_rows, _fwht_mosaic_gpu.fwht_rows_pipelined):
        with jax.sharding.use_abstract_mesh(mesh):
            lowered = jax.jit(lambda v, launch=launch: launch(v, True)).trace(x)
            text = lowered.lower(lowering_platforms=("cuda",)).as_text()
        assert "mosaic_gpu" in text


# The pipelined launch (several tiles per program, two input buffers): rows for which a
# program takes more than one tile, in each regime: stage 1 only (n <= 128), stage 2 with a < 64
# (a vector's product through its own buffer) and with a >= 64 (through the input's buffer), a
# float32 input split into parts and a half type entering as it is. The other cases: --runslow.
PIPELINED_ROWS = {5: 200, 8: 70, 10: 37, 12: 20, 13: 9, 14: 3}
slow = pytest.mark.slow


@pytest.mark.parametrize(
    "k, dtype",
    [
        pytest.param(k, dtype, id=f"n{1 << k}-{dtype.__name__}", marks=() if keep else slow)
        for k in PIPELINED_ROWS
        for dtype in DTYPES
        for keep in [(k, dtype) in {(5, jnp.float32), (10, jnp.bfloat16), (13, jnp.float32)}]
    ],
)
@INTERPRET_MODE
def test_mosaic_gpu_pipelined_launch_matches_dense_hadamard(k, dtype):
    rows = PIPELINED_ROWS[k]
    plan = _fwht_mosaic_gpu._Plan(rows, 1 << k, dtype, pipelined=True)
    assert plan.tiles_per_program > 1 and plan.num_programs * plan.tiles_per_program == (
        plan.num_tiles
    )
    x = _input(k, dtype, rows=rows)
    normalize = k % 2 == 0
    y = jax.jit(
        lambda v: fwht(v, normalize=normalize, implementation="mosaic_gpu_pipelined_interpret")
    )(x)
    assert y.dtype == dtype and y.shape == x.shape
    _assert_close(y, x, normalize)


def test_mosaic_gpu_pipelined_launch_takes_two_buffers_where_they_fit(monkeypatch):
    """Two input buffers wherever a program's shared memory (``_Plan.shared_bytes``, the count
    the Mosaic GPU lowering checks: its error at n = 2^14 in float32 names the same bytes) holds
    them, one elsewhere; one tile per program and one buffer for the unpipelined launch."""
    for k in GPU_LENGTHS:
        for dtype in DTYPES:
            plan = _fwht_mosaic_gpu._Plan(64 * 64, 1 << k, dtype, pipelined=True)
            fits = plan.shared_bytes(2) <= _fwht_mosaic_gpu.SHARED_MEMORY_BYTES
            assert plan.stages == (2 if fits else 1)
            assert plan.shared_bytes(plan.stages) <= _fwht_mosaic_gpu.SHARED_MEMORY_BYTES
            single = _fwht_mosaic_gpu._Plan(64 * 64, 1 << k, dtype, pipelined=False)
            assert (single.tiles_per_program, single.stages) == (1, 1)
    plan = _fwht_mosaic_gpu._Plan(64, 1 << 14, jnp.float32, pipelined=True)
    assert plan.stages == 1
    monkeypatch.setattr(_fwht_mosaic_gpu, "SHARED_MEMORY_BYTES", 1 << 30)  # two, regardless
    x = jax.ShapeDtypeStruct((64, 1 << 14), jnp.float32)
    mesh = jax.sharding.AbstractMesh((), (), abstract_device=H100)
    with (
        jax.sharding.use_abstract_mesh(mesh),
        pytest.raises(Exception, match=f"smem_bytes={plan.shared_bytes(2)} > max_smem_bytes"),
    ):
        jax.jit(lambda v: _fwht_mosaic_gpu.fwht_rows_pipelined(v, True)).trace(x).lower(
            lowering_platforms=("cuda",)
        )


def test_mosaic_gpu_kernel_limits():
    with pytest.raises(ValueError, match=r"16 \.\.\. 16384"):
        fwht(jnp.zeros((2, 8)), implementation="mosaic_gpu_interpret")
    with jax.enable_x64(True), pytest.raises(TypeError, match="float16, bfloat16 or float32"):
        fwht(jnp.zeros((2, 64), jnp.float64), implementation="mosaic_gpu_interpret")


@INTERPRET_MODE
def test_mosaic_gpu_kernel_keeps_a_nan_in_its_own_vector():
    _assert_nan_stays_in_its_vector("mosaic_gpu_interpret", 9)


def test_mosaic_gpu_split_is_exact():
    x = jnp.asarray(np.random.default_rng(2).standard_normal((64, 64)) * 1e3, jnp.float32)
    parts = bfloat16_parts(x)
    total = sum(np.asarray(p, np.float64) for p in parts)
    np.testing.assert_array_equal(total, np.asarray(x, np.float64))


@pytest.mark.parametrize(
    "implementation", [name for name in fwht_backends() if fwht_backend(name).simulated]
)
@INTERPRET_MODE
def test_kernels_follow_the_primitive_rules(implementation):
    """vmap (batch axis at the transformed position), JVP and VJP through the kernels."""
    x = jnp.asarray(np.random.default_rng(4).standard_normal((3, 64)), jnp.float32)

    def f(v, impl):
        return jnp.sin(fwht(v, axis=0, normalize=True, implementation=impl))

    both = jax.jit(
        lambda v, t: (
            jax.vmap(lambda row: fwht(row, implementation=implementation), in_axes=1)(v.T),
            jax.jvp(functools.partial(f, impl=implementation), (v.T,), (t.T,))[1],
            jax.grad(lambda u: f(u, implementation).sum())(v.T),
        )
    )
    reference = jax.jit(
        lambda v, t: (
            jax.vmap(lambda row: fwht(row, implementation="xla"), in_axes=1)(v.T),
            jax.jvp(functools.partial(f, impl="xla"), (v.T,), (t.T,))[1],
            jax.grad(lambda u: f(u, "xla").sum())(v.T),
        )
    )
    for got, want in zip(both(x, 2 * x), reference(x, 2 * x), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
