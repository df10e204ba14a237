"""Tests of ``rfjax.ops``: the fast Walsh-Hadamard transform and its implementations.

Every implementation is checked against the dense float64 product with ``scipy.linalg.hadamard``.

Tolerances. A float32 transform of x along an axis of length n = 2^k is compared per vector:
``|y - H x| <= 4 * eps32 * (1 + k) * ||x||_2`` (times 1/sqrt(n) when normalised). The butterfly
does k stages, each rounding entries of size about ||x|| (random x) by at most half an ulp, so
its error is about eps32 * ||x||, at worst k * eps32 * ||x|| per entry; the Pallas kernel's dot
products sum up to 128 terms sequentially, whose rounding errors (random walk) stay near
sqrt(128)/2 * eps32 * ||x|| < 6 eps32 ||x||. Half types (float16, bfloat16) are computed in
float32 and rounded once, so they are checked against the float64 oracle to two ulps of the
output dtype relative to the vector's largest entry: ``|y - H x| <= 2 * eps(dtype) * max|H x|``.
Integer-valued float64 inputs give exact results (every partial sum is an integer < 2^53).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from jax.test_util import check_grads

from rfjax.ops import (
    _fwht_cpu,
    _fwht_triton,
    _syrk,
    chain_reference,
    fwht,
    fwht_backend,
    fwht_backends,
    hd_chain,
    kronecker_factors,
    pad_to_power_of_two,
    shifted_cos,
    sin_cos,
    symmetric_rank_update,
)
from rfjax.ops._cos import _xla_sin_cos
from tests.support.interpret_mode import INTERPRET_MODE

PLATFORM = jax.default_backend()


def backend_param(name: str):
    """``name`` as a test case, skipped where its kernel cannot run (another platform's, or the
    C++ kernel when it was not built)."""
    backend = fwht_backend(name)
    runs = backend.runs_on(PLATFORM) and backend.available()
    reason = f"{name} runs on {', '.join(backend.platforms)}, not {PLATFORM}, or was not built"
    marks = [pytest.mark.skipif(not runs, reason=reason)]
    if backend.interprets is not None:  # a kernel in interpret mode: CI's tier
        marks.append(INTERPRET_MODE)
    return pytest.param(name, marks=marks)


# The backends every generic test runs: every entry of the registry (a new one joins without an
# edit here) and "auto", but the simulators (Pallas' TPU and Mosaic GPU interpret modes: about a
# second per call), which have their own tests in tests/rfjax/ops/test_pallas_kernels.py.
IMPLEMENTATIONS = [
    "auto",
    *(backend_param(name) for name in fwht_backends() if not fwht_backend(name).simulated),
]
EPS32 = float(np.finfo(np.float32).eps)


def skip_unsupported(implementation: str, *cases: tuple[int, object]) -> None:
    """Skips the test if the backend does not take one of the (n, dtype) ``cases``."""
    backend = None if implementation == "auto" else fwht_backend(implementation)
    for n, dtype in cases if backend is not None else ():
        try:
            backend.check(n, dtype)
        except (TypeError, ValueError) as error:
            pytest.skip(f"{implementation} does not take n = {n}, {jnp.dtype(dtype)}: {error}")


@functools.cache
def _dense_hadamard(n: int) -> np.ndarray:
    return scipy.linalg.hadamard(n).astype(np.float64)


def _oracle(x: np.ndarray, axis: int, normalize: bool = False) -> np.ndarray:
    """H_n x along ``axis`` in float64, from the dense Sylvester-Hadamard matrix.

    Lengths above 4096 (the kernel limit test) split once, H_2n = [[H_n, H_n], [H_n, -H_n]], to
    keep the dense matrix at 128 MiB.
    """
    n = x.shape[axis]
    moved = np.moveaxis(np.asarray(x, np.float64), axis, -1)
    if n > 4096:
        first, second = _oracle(moved[..., : n // 2], -1), _oracle(moved[..., n // 2 :], -1)
        y = np.concatenate([first + second, first - second], axis=-1)
    else:
        y = moved @ _dense_hadamard(n)
    if normalize:
        y = y / math.sqrt(n)
    return np.moveaxis(y, -1, axis)


def _assert_f32_close(y, x, axis, normalize, eps=EPS32):
    """|y - H x| <= 4 eps (1 + log2 n) ||x||_2 per vector along ``axis`` (see the docstring)."""
    n = x.shape[axis]
    ref = _oracle(x, axis, normalize)
    norm = np.linalg.norm(np.asarray(x, np.float64), axis=axis, keepdims=True)
    tol = 4 * eps * (1 + math.log2(n)) * norm / (math.sqrt(n) if normalize else 1.0)
    err = np.abs(np.asarray(y, np.float64) - ref)
    assert np.all(err <= tol), f"max error {(err / tol).max():.3g} x tolerance, n={n}"


def _case(k: int):
    """A fixed random input with transform length 2^k on a random axis of a random shape."""
    rng = np.random.default_rng(1000 + k)
    n = 2**k
    lead = [int(d) for d in rng.integers(1, 5, size=int(rng.integers(0, 3)))]
    if n >= 1024:  # keep the large cases small
        lead = lead[:1]
    axis = int(rng.integers(0, len(lead) + 1))
    shape = [*lead[:axis], n, *lead[axis:]]
    x = rng.standard_normal(shape).astype(np.float32)
    axis = axis - len(shape) if rng.integers(2) else axis  # negative axes too
    return x, axis


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("k", range(13))
def test_matches_dense_hadamard(implementation, k):
    skip_unsupported(implementation, (2**k, jnp.float32))
    x, axis = _case(k)

    @jax.jit
    def both(v):
        return (
            fwht(v, axis=axis, implementation=implementation),
            fwht(v, axis=axis, normalize=True, implementation=implementation),
        )

    y, y_normalized = both(x)
    assert y.shape == x.shape and y.dtype == jnp.float32
    _assert_f32_close(y, x, axis, normalize=False)
    _assert_f32_close(y_normalized, x, axis, normalize=True)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_inverse_and_involution(implementation):
    skip_unsupported(implementation, (8, jnp.float32), (256, jnp.float32))
    for k, shape, axis in [(3, (8, 5), 0), (8, (2, 256), 1)]:
        n = 2**k
        x = np.random.default_rng(k).standard_normal(shape).astype(np.float32)
        h = jax.jit(
            lambda v, a=axis, s=False: fwht(v, axis=a, normalize=s, implementation=implementation)
        )
        hn = jax.jit(
            lambda v, a=axis: fwht(v, axis=a, normalize=True, implementation=implementation)
        )
        scale = np.linalg.norm(x, axis=axis, keepdims=True)
        tol = 8 * EPS32 * (1 + k) * scale
        assert np.all(np.abs(np.asarray(h(h(x))) / n - x) <= tol)
        assert np.all(np.abs(np.asarray(hn(hn(x))) - x) <= tol)


def test_docstring_example():
    np.testing.assert_array_equal(fwht(jnp.array([1.0, 0.0, 0.0, 0.0])), np.ones(4))


def test_result_is_not_weakly_typed():
    # A weakly typed operand (from a Python scalar) gives a float32 result, which a float16 then
    # promotes to float32; a weakly typed result would yield to the float16.
    y = fwht(jnp.broadcast_to(1.0, (4,)), implementation="xla")
    assert not jax.typeof(y).weak_type
    assert (y + jnp.float16(1)).dtype == jnp.float32


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_gradients(implementation):
    skip_unsupported(implementation, (4, jnp.float64))
    transform = functools.partial(fwht, axis=0, normalize=True, implementation=implementation)
    with jax.enable_x64(True):
        rng = np.random.default_rng(7)
        x = jnp.asarray(rng.standard_normal((4, 3)))
        assert x.dtype == jnp.float64
        check_grads(lambda v: jnp.sin(transform(v)), (x,), order=2, modes=("fwd", "rev"))
        # The VJP of the (symmetric) transform is the transform, with the same scale.
        g = rng.standard_normal((4, 3))
        for normalize in (False, True):
            _, vjp = jax.vjp(functools.partial(transform, normalize=normalize), x)
            np.testing.assert_allclose(vjp(jnp.asarray(g))[0], _oracle(g, 0, normalize), rtol=1e-12)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_vmap_and_jit(implementation):
    skip_unsupported(implementation, (4, jnp.float32), (8, jnp.float32))
    x = np.random.default_rng(3).standard_normal((8, 6, 4)).astype(np.float32)

    def f(v, axis=-1):
        return fwht(v, axis=axis, implementation=implementation)

    # Batch axis in front of the transformed one.
    _assert_f32_close(jax.vmap(f)(x), x, -1, False)
    # in_axes pointing at the last axis: vmapped over the length-4 axis, transform over axis 0.
    y = jax.jit(jax.vmap(lambda v: f(v, axis=0), in_axes=2, out_axes=2))(x)
    _assert_f32_close(y, x, 0, False)
    # The primitive's operand batched at its transformed (last) position: the batching rule
    # must move the batch axis out of the way.
    y = jax.vmap(lambda v: f(v, axis=-1), in_axes=2, out_axes=2)(x[:, :4, :])
    _assert_f32_close(y, x[:, :4, :], 1, False)
    # Nested vmap, stripping both trailing axes, with jit outside: transforms axis 0.
    y = jax.jit(jax.vmap(jax.vmap(f, in_axes=1, out_axes=1), in_axes=1, out_axes=1))(x)
    _assert_f32_close(y, x, 0, False)
    # Batched and unbatched results agree.
    np.testing.assert_allclose(jax.vmap(f)(x), f(x), rtol=0, atol=0)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_half_precision(implementation, dtype):
    skip_unsupported(implementation, (16, dtype), (1024, dtype))
    rng = np.random.default_rng(11)
    for shape, axis in [((5, 16), -1), ((1024, 3), 0)]:
        x = jnp.asarray(rng.standard_normal(shape), dtype)

        @jax.jit
        def both(v, axis=axis):
            kwargs = dict(axis=axis, implementation=implementation)
            return fwht(v, **kwargs), fwht(v, normalize=True, **kwargs)

        for normalize, y in zip((False, True), both(x), strict=True):
            assert y.dtype == dtype
            ref = _oracle(np.asarray(x, np.float64), axis, normalize)
            tol = 2 * float(jnp.finfo(dtype).eps) * np.abs(ref).max(axis=axis, keepdims=True)
            assert np.all(np.abs(np.asarray(y, np.float64) - ref) <= tol)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_float64(implementation):
    skip_unsupported(implementation, (16, jnp.float64))
    with jax.enable_x64(True):
        rng = np.random.default_rng(5)
        for k, shape, axis in [(4, (16, 3), 0), (9, (2, 512), -1)]:
            ints = rng.integers(-1000, 1000, size=shape)
            y = fwht(jnp.asarray(ints, jnp.float64), axis=axis, implementation=implementation)
            assert y.dtype == jnp.float64
            moved = np.moveaxis(ints, axis, -1) @ scipy.linalg.hadamard(2**k)
            np.testing.assert_array_equal(np.asarray(y), np.moveaxis(moved, -1, axis))
            x = rng.standard_normal(shape)
            y = fwht(jnp.asarray(x), axis=axis, normalize=True, implementation=implementation)
            _assert_f32_close(y, x, axis, True, eps=float(np.finfo(np.float64).eps))


@pytest.mark.parametrize(
    "implementation", [backend_param("pallas_triton_interpret"), backend_param("pallas_triton")]
)
def test_triton_kernel_blocks_and_limits(implementation):
    # Partial last blocks (rows not a multiple of the block) in both kernel regimes. Compiled
    # for a GPU, also a grid of 625 programs; interpret mode runs a grid's programs one after
    # another (6.7 s for that one), so there the same regime takes 6 programs.
    rng = np.random.default_rng(2)
    many_programs = (45, 2048) if implementation.endswith("_interpret") else (5000, 2048)
    for shape in [(300, 128), (37, 512), (3, 8192), (1000, 16), many_programs]:
        x = rng.standard_normal(shape).astype(np.float32)
        _assert_f32_close(fwht(x, implementation=implementation), x, -1, False)
    with pytest.raises(ValueError, match="up to 8192"):
        fwht(jnp.zeros((1, 16384)), implementation=implementation)
    empty = fwht(jnp.zeros((0, 64)), implementation=implementation)
    assert empty.shape == (0, 64)
    assert fwht_backend("pallas_triton").max_n == 8192


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("simplex", [False, True])
def test_hd_chain_matches_the_reference(implementation, simplex):
    """The fast ORF / SimRF chain through each fwht implementation (on a GPU: the compiled
    kernels) against the composition in float64."""
    p, rows, blocks = 256, 5, 2
    skip_unsupported(implementation, (p, jnp.float32))
    rng = np.random.default_rng(21)
    x = rng.standard_normal((rows, p)).astype(np.float32)
    signs = rng.choice([-1.0, 1.0], size=(blocks, 3, p)).astype(np.float32)
    norms = np.abs(rng.standard_normal((blocks, p))).astype(np.float32)
    y = jax.jit(functools.partial(hd_chain, simplex=simplex, implementation=implementation))(
        x, signs, norms
    )
    with jax.enable_x64(True):
        ref = np.asarray(
            chain_reference(
                jnp.asarray(x, jnp.float64),
                jnp.asarray(signs, jnp.float64),
                jnp.asarray(norms, jnp.float64),
                simplex=simplex,
                implementation="xla",
            )
        )
    assert y.shape == (rows, blocks, p) and y.dtype == jnp.float32
    # Three normalised rotations of a vector of norm |x|, each within the fwht tolerance; the
    # simplex map and the norms scale the error by at most sqrt(p / (p - 1)) + 1 and max |norm|.
    scale = np.linalg.norm(x, axis=-1)[:, None, None] * norms.max() * 3
    tol = 3 * 4 * EPS32 * (1 + math.log2(p)) * scale
    assert np.all(np.abs(np.asarray(y, np.float64) - ref) <= tol)


CHAIN_KERNEL = pytest.mark.skipif(
    not _fwht_cpu.is_available("hd_chain") or jax.default_backend() != "cpu",
    reason="the C++ chain kernel is not built, or the backend is not CPU",
)


@CHAIN_KERNEL
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_hd_chain_fused_cpu_kernel_is_the_composition(dtype):
    """On CPU, hd_chain is one fused kernel (every stage of a row's block in L1) whose rotations
    and norms are the composition of fwht calls and products to the last bit, and whose simplex
    map (a pairwise sum against XLA's reduction) agrees to rounding; p from 2 to 2^14 (past the
    L1 chunk), one and several blocks and rotations."""
    rng = np.random.default_rng(22)
    eps = float(np.finfo(dtype).eps)
    with jax.enable_x64(dtype == np.float64):
        for p, blocks, rotations in [(2, 1, 1), (8, 3, 2), (256, 2, 3), (16384, 1, 3)]:
            x = rng.standard_normal((7, p)).astype(dtype)
            signs = rng.choice([-1.0, 1.0], size=(blocks, rotations, p)).astype(dtype)
            norms = rng.uniform(0.5, 2.0, (blocks, p)).astype(dtype)
            for simplex in (False, True):
                fused = jax.jit(functools.partial(hd_chain, simplex=simplex))
                text = fused.lower(x, signs, norms).as_text()
                assert "rfjax_hd_chain" in text and "rfjax_fwht" not in text
                composition = functools.partial(
                    chain_reference, simplex=simplex, implementation="cpu"
                )
                y = np.asarray(fused(x, signs, norms))
                z = np.asarray(jax.jit(composition)(x, signs, norms))
                if not simplex:
                    np.testing.assert_array_equal(y, z)
                else:
                    scale = np.abs(z).max()
                    assert np.abs(y - z).max() <= 8 * eps * (1 + math.log2(p)) * scale


@pytest.mark.skipif(
    not _fwht_cpu.is_available() or jax.default_backend() != "cpu",
    reason="the C++ FWHT kernel is not built, or the backend is not CPU",
)
def test_hd_chain_keeps_its_implementation_under_vmap_and_jvp_in_the_factors():
    """vmap over the signs (per-head projections) and a JVP in the norms run the composition;
    it ran with "auto" (the C++ kernel on CPU) whatever ``implementation`` said."""
    rng = np.random.default_rng(24)
    x = jnp.asarray(rng.standard_normal((3, 8)), jnp.float32)
    signs = jnp.asarray(rng.choice([-1.0, 1.0], size=(2, 1, 2, 8)), jnp.float32)
    norms = jnp.ones((1, 8), jnp.float32)

    def chain(signs, norms, implementation):
        return hd_chain(x, signs, norms, simplex=True, implementation=implementation)

    def batched(implementation):
        return jax.vmap(lambda s: chain(s, norms, implementation))

    def tangent(implementation):
        return lambda n: jax.jvp(lambda v: chain(signs[0], v, implementation), (n,), (n,))[1]

    for make in (batched, tangent):
        argument = signs if make is batched else norms
        assert "rfjax_fwht" in jax.jit(make("cpu")).lower(argument).as_text()
        assert "rfjax_fwht" not in jax.jit(make("xla")).lower(argument).as_text()
        np.testing.assert_allclose(make("xla")(argument), make("cpu")(argument), atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_symmetric_rank_update_adds_a_gram_matrix_to_the_lower_triangle(dtype):
    """c + a^T a below and on the diagonal, c above it, by BLAS syrk on CPU (when built) and
    by XLA (the fallback), for several shapes including one row and an empty block."""
    rng = np.random.default_rng(23)
    eps = float(np.finfo(dtype).eps)
    with jax.enable_x64(dtype == np.float64):
        for rows, m in [(1, 1), (5, 3), (300, 64), (0, 4)]:
            a = rng.standard_normal((rows, m)).astype(dtype)
            c = rng.standard_normal((m, m)).astype(dtype)
            exact = c.astype(np.float64) + a.T.astype(np.float64) @ a
            lower = np.tril(np.ones((m, m), bool))
            for update in (symmetric_rank_update, _syrk._xla_update):
                y = np.asarray(jax.jit(update)(c, a))
                assert y.dtype == dtype
                np.testing.assert_array_equal(y[~lower], c[~lower])
                size = np.abs(a).max(initial=0.0) ** 2 + np.abs(c).max()
                tolerance = 4 * eps * (rows + 1) * size
                assert np.abs(y[lower] - exact[lower]).max(initial=0.0) <= tolerance
    with pytest.raises(ValueError, match="c must be"):
        symmetric_rank_update(jnp.zeros((3, 3)), jnp.zeros((2, 4)))
    with pytest.raises(TypeError, match="must both be float32 or both float64"):
        symmetric_rank_update(jnp.zeros((2, 2)), jnp.zeros((3, 2), jnp.float16))


@pytest.mark.skipif(
    not _fwht_cpu.is_available("gram_update") or jax.default_backend() != "cpu",
    reason="the C++ Gram update is not built, or the backend is not CPU",
)
def test_symmetric_rank_update_calls_blas_syrk_on_cpu():
    text = jax.jit(symmetric_rank_update).lower(jnp.zeros((4, 4)), jnp.ones((3, 4))).as_text()
    assert "rfjax_gram_update_f32" in text and "dot_general" not in text


def _block_size(dim) -> int:
    """The length of one block dimension of a Pallas block mapping (a squeezed one is 1)."""
    return int(getattr(dim, "block_size", 1) or 1)


@pytest.mark.parametrize("rows, n", [(1, 16), (2, 64), (5, 16), (100, 128), (3, 512), (37, 512)])
def test_triton_kernel_sees_whole_blocks_only(rows, n):
    """Every block of the Triton kernel lies inside its (padded) operand: on an H200 a block
    taller than the array (1-5 rows in a block of 16) corrupted other outputs of the program."""
    x = jnp.zeros((rows, n), jnp.float32)
    jaxpr = jax.make_jaxpr(lambda v: _fwht_triton.fwht_rows_interpret(v, True))(x)
    calls = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "pallas_call"]
    assert len(calls) == 1
    for mapping in calls[0].params["grid_mapping"].block_mappings:
        blocks = [_block_size(dim) for dim in mapping.block_shape]
        assert all(
            size % block == 0 for size, block in zip(mapping.array_aval.shape, blocks, strict=True)
        )


def test_kronecker_factors_are_small_and_balanced():
    for k in range(18):
        factors = kronecker_factors(1 << k)
        assert math.prod(factors) == 1 << k and max(factors) <= 128
        assert max(factors) <= 2 * min(factors)  # as equal as powers of two allow
    assert kronecker_factors(1 << 15) == (32, 32, 32)


def test_matmul_is_exact_on_integers_and_full_precision_in_float32():
    # Precision.HIGHEST: no TF32 / single-pass bfloat16 products even where the backend would
    # use them by default; integer inputs below 2^24 / max(n) stay exact (n = 2^15: 3 factors).
    rng = np.random.default_rng(9)
    for n in (64, 256, 1 << 15):
        ints = rng.integers(-256, 256, size=(3, n))
        y = fwht(jnp.asarray(ints, jnp.float32), implementation="matmul")
        np.testing.assert_array_equal(np.asarray(y, np.int64), _oracle(ints, -1).astype(np.int64))


def test_numpy_scalars_are_accepted_as_axis_and_flags():
    # Regression: np.int64 axes and np.bool_ flags were rejected (issue 19, item 8).
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    y = fwht(x, axis=np.int64(0), normalize=np.bool_(True))
    _assert_f32_close(y, x, 0, True)
    np.testing.assert_array_equal(fwht(x, axis=np.int32(-1)), fwht(x, axis=-1))
    assert pad_to_power_of_two(np.ones((3, 5)), axis=np.int64(1)).shape == (3, 8)
    for bad in (np.float64(0.0), 1.0, True, np.bool_(False), "0"):
        with pytest.raises(TypeError, match="axis"):
            fwht(x, axis=bad)


# Run in a subprocess: XLA_FLAGS must be set before jax is imported, and the rest of the suite
# runs on one device.


def test_errors():
    x = jnp.zeros((4, 6))
    with pytest.raises(ValueError, match=r"axis 1 .*power of two.*pad_to_power_of_two"):
        fwht(x)
    with pytest.raises(ValueError, match="axis 1"):
        fwht(jnp.zeros((4, 6)), axis=-1)
    with pytest.raises(TypeError, match="dtype"):
        fwht(jnp.zeros((4, 8), jnp.int32))
    with pytest.raises(ValueError, match="axis"):
        fwht(jnp.zeros((4, 8)), axis=2)
    with pytest.raises(ValueError, match="axis"):
        fwht(jnp.zeros((4, 8)), axis=-3)
    with pytest.raises(TypeError, match="axis"):
        fwht(jnp.zeros((4, 8)), axis=1.0)
    with pytest.raises(ValueError, match="implementation"):
        fwht(jnp.zeros((4, 8)), implementation="cuda")
    # One name per backend: the Triton kernel is "pallas_triton" (its old name "pallas" is gone),
    # and an unknown name lists the allowed ones.
    with pytest.raises(ValueError, match=r"'auto', 'cpu', .*'pallas_triton', .*got 'pallas'"):
        fwht(jnp.zeros((4, 8)), implementation="pallas")
    with pytest.raises(ValueError, match="implementation must be one of"):
        hd_chain(jnp.zeros((4, 8)), jnp.ones((1, 1, 8)), jnp.ones((1, 8)), implementation="pallas")
    # k = 0 diagonals: the fused CPU kernel returned uninitialised memory (it copies x into the
    # output in its first rotation), the Pallas TPU one divided by zero; B = 0: an unrelated
    # Pallas slicing error.
    for shape in [(2, 0, 8), (0, 1, 8)]:
        for implementation in ("auto", "xla", "pallas_tpu_interpret"):
            with pytest.raises(ValueError, match=r"signs must hold at least one block and one"):
                hd_chain(
                    jnp.ones((4, 8)),
                    jnp.ones(shape),
                    jnp.ones((shape[0], 8)),
                    implementation=implementation,
                )
    # norms of another dtype (not cast), and the simplex map of one coordinate.
    with pytest.raises(TypeError, match=r"signs and norms must have the dtype of x \(float32\)"):
        hd_chain(jnp.ones((4, 8)), jnp.ones((1, 1, 8)), jnp.ones((1, 8), jnp.bfloat16))
    with pytest.raises(ValueError, match="simplex needs p >= 2, got p = 1"):
        hd_chain(jnp.ones((4, 1)), jnp.ones((1, 1, 1)), jnp.ones((1, 1)), simplex=True)
    for bad in (1, "yes", None):
        with pytest.raises(TypeError, match="normalize"):
            fwht(jnp.zeros((4, 8)), normalize=bad)
    with pytest.raises(ValueError, match="scalar"):
        fwht(jnp.zeros(()))


def test_pad_to_power_of_two():
    x = jnp.arange(15.0).reshape(5, 3)
    y = pad_to_power_of_two(x, axis=0)
    assert y.shape == (8, 3)
    np.testing.assert_array_equal(y[:5], x)
    np.testing.assert_array_equal(y[5:], 0)
    y = pad_to_power_of_two(x)
    assert y.shape == (5, 4)
    np.testing.assert_array_equal(y[:, :3], x)
    np.testing.assert_array_equal(y[:, 3], 0)
    z = jnp.ones((4, 8))
    assert pad_to_power_of_two(z) is z and pad_to_power_of_two(z, axis=0) is z
    assert pad_to_power_of_two(jnp.ones(1)).shape == (1,)
    assert pad_to_power_of_two(np.ones((2, 5, 3)), axis=1).shape == (2, 8, 3)
    # A padded vector transforms like the zero-extended one.
    v = np.random.default_rng(0).standard_normal(5).astype(np.float32)
    _assert_f32_close(
        fwht(pad_to_power_of_two(v)), np.concatenate([v, np.zeros(3, np.float32)]), 0, False
    )
    with pytest.raises(ValueError, match="axis"):
        pad_to_power_of_two(x, axis=2)
    with pytest.raises(ValueError, match="scalar"):
        pad_to_power_of_two(jnp.zeros(()))


# --- shifted_cos: cos(t - s pi/2) in vectorisable arithmetic ---------------------------------

_EXACT_SHIFTED_COS = (np.cos, np.sin, lambda t: -np.cos(t), lambda t: -np.sin(t))


@pytest.mark.parametrize(
    "dtype, bound, tolerance",
    [(np.float64, 1e6, 4e-16), (np.float32, 1.6e4, 3e-7)],
)
def test_shifted_cos_matches_numpy_for_every_quadrant_shift(dtype, bound, tolerance):
    t = np.random.default_rng(0).uniform(-bound, bound, 20_000).astype(dtype)
    t = np.concatenate([t, np.arange(-8, 9) * np.pi / 4]).astype(dtype)  # quadrant edges
    shifts = np.arange(-4, 5)
    with jax.enable_x64(dtype == np.float64):
        values = np.asarray(jax.jit(shifted_cos)(t[:, None], shifts), np.float64)
    for column, shift in enumerate(shifts):
        exact = _EXACT_SHIFTED_COS[shift % 4](t.astype(np.float64))
        assert np.abs(values[:, column] - exact).max() <= tolerance, shift


@pytest.mark.parametrize("dtype, tolerance", [(np.float64, 4e-16), (np.float32, 3e-7)])
def test_shifted_cos_is_accurate_over_the_whole_float_range(dtype, tolerance):
    # Regression: beyond the Cody-Waite range the reduction was silently wrong (|value| ~ 1e3 at
    # t ~ 1e6 in float32, inf from 1e12, NaN from 1e20) where jnp.cos is finite and correct.
    info = np.finfo(dtype)
    rng = np.random.default_rng(1)
    magnitude = np.exp(rng.uniform(np.log(1e3), np.log(float(info.max)), 10_000))
    t = (magnitude * rng.choice([-1.0, 1.0], magnitude.size)).astype(dtype)
    t = np.concatenate([t, [info.max, -info.max, info.max / 3]]).astype(dtype)
    with jax.enable_x64(dtype == np.float64):
        values = np.asarray(jax.jit(shifted_cos)(t[:, None], np.arange(4)), np.float64)
        assert np.all(np.isfinite(values))
        for shift in range(4):
            exact = _EXACT_SHIFTED_COS[shift](t.astype(np.float64))
            assert np.abs(values[:, shift] - exact).max() <= tolerance, shift
        # Non-finite inputs give NaN, and do not disturb their neighbours.
        mixed = np.array([np.nan, np.inf, -np.inf, 1e30, 0.5], dtype)
        value = np.asarray(jax.jit(shifted_cos)(mixed, 0), np.float64)
        assert np.all(np.isnan(value[:3]))
        np.testing.assert_allclose(value[3:], np.cos(mixed[3:].astype(np.float64)), atol=tolerance)
        grad = jax.jit(jax.grad(lambda u: shifted_cos(u, 0).sum()))(jnp.asarray(mixed[3:]))
        np.testing.assert_allclose(grad, -np.sin(mixed[3:].astype(np.float64)), atol=tolerance)


def test_shifted_cos_broadcasts_shifts_and_keeps_half_precision():
    t = jnp.linspace(-3.0, 3.0, 7, dtype=jnp.bfloat16)
    value = jax.jit(shifted_cos)(t[:, None], jnp.array([0, 1], jnp.int8))
    assert value.shape == (7, 2) and value.dtype == jnp.bfloat16
    exact = np.stack([np.cos(np.asarray(t, np.float64)), np.sin(np.asarray(t, np.float64))], -1)
    np.testing.assert_allclose(np.asarray(value, np.float64), exact, atol=1e-2)


def test_shifted_cos_gradient_is_minus_shifted_sin():
    t = jnp.linspace(-20.0, 20.0, 101)
    grad = jax.jit(jax.vmap(jax.grad(lambda u: shifted_cos(u, 0))))(t)
    np.testing.assert_allclose(grad, -np.sin(np.asarray(t, np.float64)), atol=2e-6)


# --- sin_cos: scale [sin t, cos t] in one pass (a C++ kernel on CPU, XLA elsewhere) ----------

SIN_COS_KERNEL = pytest.mark.skipif(
    not _fwht_cpu.is_available("sin_cos") or jax.default_backend() != "cpu",
    reason="the C++ sin/cos kernel is not built, or the backend is not CPU",
)


def _sin_cos_inputs(dtype) -> np.ndarray:
    """Rows of every kind: ordinary values, quadrant edges, values beyond the fast range, NaN,
    +-inf (rows of 37, not a multiple of any vector width)."""
    rng = np.random.default_rng(3)
    t = rng.uniform(-60.0, 60.0, (40, 37))
    t[0, :17] = np.arange(-8, 9) * np.pi / 4
    t[1, :6] = [np.nan, np.inf, -np.inf, 1e30, -3e9, 2.0**14 + 1]
    # the float32 path's worst cases, near the top of its fast range (an exhaustive search of
    # [2^13, 2^14]): 2.66e-7 from cos, 2.58e-7 from sin
    t[1, 6:10] = [15644.088, -15644.088, 13858.3545, -13858.3545]
    t[2] = np.exp(rng.uniform(np.log(1e3), np.log(1e300), 37)) * rng.choice([-1, 1], 37)
    with np.errstate(over="ignore"):
        return t.astype(dtype)


@pytest.mark.parametrize("dtype, tolerance", [(np.float64, 4e-16), (np.float32, 2.7e-7)])
def test_sin_cos_is_the_shifted_cos_pair_and_accurate(dtype, tolerance):
    """sin_cos(t, scale) is scale [shifted_cos(t, 1), shifted_cos(t, 0)] (to 1 ulp: XLA may fuse
    a multiply and an add that the kernel keeps apart), within the stated bound of NumPy's
    float64 sin and cos for every finite t, NaN for NaN and +-inf, on the kernel's path and on
    XLA's."""
    t = _sin_cos_inputs(dtype)
    scale = 0.75
    with jax.enable_x64(dtype == np.float64):
        kernel = np.asarray(jax.jit(lambda u: sin_cos(u, scale=scale))(t))
        xla = np.asarray(jax.jit(lambda u: _xla_sin_cos(u, scale))(t))
        pair = jax.jit(lambda u: shifted_cos(jnp.concatenate([u, u], -1), np.repeat([1, 0], 37)))
        expected = np.asarray(pair(t)) * dtype(scale)
    with np.errstate(invalid="ignore"):  # sin and cos of +-inf
        wide = t.astype(np.float64)
        exact = scale * np.concatenate([np.sin(wide), np.cos(wide)], -1)
    finite = np.isfinite(np.concatenate([t, t], -1))
    ulp = np.spacing(np.abs(expected).astype(dtype)).astype(np.float64)
    for values in (kernel, xla):
        assert values.dtype == dtype and values.shape == (40, 74)
        assert np.all(np.isnan(values[~finite]))
        assert np.all(np.abs(values[finite] - expected[finite]) <= ulp[finite] + 1e-300)
        assert np.abs(values[finite] - exact[finite]).max() <= scale * tolerance


def test_sin_cos_derivative_batching_and_half_precision():
    t = jnp.asarray(_sin_cos_inputs(np.float32)[3:6])
    check_grads(lambda u: sin_cos(u, scale=0.5), (t,), order=1, modes=("fwd", "rev"), atol=2e-2)
    grad = jax.grad(lambda u: sin_cos(u, scale=0.5).sum())(t)
    exact = 0.5 * (np.cos(np.asarray(t, np.float64)) - np.sin(np.asarray(t, np.float64)))
    np.testing.assert_allclose(grad, exact, atol=1e-6)
    mapped = jax.vmap(lambda u: sin_cos(u, scale=0.5), in_axes=1, out_axes=1)(t)
    np.testing.assert_array_equal(mapped, np.moveaxis(np.asarray(sin_cos(t.T, scale=0.5)), 0, 1))
    half = sin_cos(t.astype(jnp.bfloat16), scale=0.5)
    assert half.dtype == jnp.bfloat16 and half.shape == (3, 74)
    np.testing.assert_allclose(
        np.asarray(half, np.float64),
        0.5
        * np.concatenate(
            [
                np.sin(np.asarray(t.astype(jnp.bfloat16), np.float64)),
                np.cos(np.asarray(t.astype(jnp.bfloat16), np.float64)),
            ],
            -1,
        ),
        atol=4e-3,
    )
    assert sin_cos(jnp.zeros((0, 3))).shape == (0, 6)


@SIN_COS_KERNEL
def test_sin_cos_runs_the_kernel_on_cpu():
    text = jax.jit(lambda u: sin_cos(u, scale=2.0)).lower(jnp.ones((4, 8))).as_text()
    assert "rfjax_sin_cos_f32" in text
    assert "stablehlo.cosine" not in text and "stablehlo.sine" not in text


def test_sin_cos_rejects_bad_input():
    with pytest.raises(TypeError, match="t must be a floating"):
        sin_cos(jnp.arange(3))
    with pytest.raises(ValueError, match="rank >= 1"):
        sin_cos(jnp.ones(()))
    with pytest.raises(TypeError, match="scale must be a real number"):
        sin_cos(jnp.ones(3), scale="2")
    with pytest.raises(ValueError, match="scale must be finite"):
        sin_cos(jnp.ones(3), scale=float("nan"))


def test_shifted_cos_rejects_bad_input():
    with pytest.raises(TypeError, match="t must be a floating"):
        shifted_cos(jnp.arange(3), 0)
    with pytest.raises(TypeError, match="quarter_turns must be integers"):
        shifted_cos(jnp.ones(3), 0.5)
