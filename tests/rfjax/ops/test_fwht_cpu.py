"""The C++ CPU kernel of fwht (rfjax.ops._fwht_cpu): agreement with dense Hadamard products,
every compiled instruction set, and a portable build."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

from rfjax.ops import _fwht_cpu, fwht, sin_cos
from rfjax.ops._cos import _xla_sin_cos
from tests.support import ROOT

built = pytest.mark.skipif(not _fwht_cpu.is_available(), reason="the C++ FWHT kernel was not built")


def _reference(x: np.ndarray, normalize: bool) -> np.ndarray:
    """x @ H_n (H symmetric) in float64, n the last dimension, with scipy's dense H.

    Above n = 1024, H_n = H_a (x) H_b (Kronecker, Sylvester order) is applied as two dense
    products, which avoids an n x n matrix.
    """
    n = x.shape[-1]
    x = x.astype(np.float64)
    if n <= 1024:
        y = x @ scipy.linalg.hadamard(n).astype(np.float64)
    else:
        b = 1 << (n.bit_length() // 2)
        a = n // b
        ha, hb = (scipy.linalg.hadamard(m).astype(np.float64) for m in (a, b))
        y = np.swapaxes(x.reshape(*x.shape[:-1], a, b) @ hb, -1, -2) @ ha
        y = np.swapaxes(y, -1, -2).reshape(x.shape)
    return y / np.sqrt(n) if normalize else y


def _close(y, ref, dtype) -> None:
    y = np.asarray(y, dtype=np.float64)
    n = ref.shape[-1]
    # error of log2(n) rounded additions, relative to the largest entries, plus the float64
    # reference's own (dense sums of up to n terms)
    eps = float(jnp.finfo(dtype).eps)
    scale = np.abs(ref).max(initial=1.0)
    tol = eps * (2 + np.log2(max(n, 2))) * scale + 4 * 2.0**-52 * np.sqrt(n) * scale
    np.testing.assert_allclose(y, ref, rtol=0, atol=tol)


@built
@pytest.mark.parametrize("k", range(17))
def test_matches_hadamard_float32(k):
    """n = 2^k, k = 0..16 (odd and even log2, n below, at and above the L1 chunk), many rows."""
    n = 1 << k
    rows = max(3, min(257, (1 << 17) // n))  # odd row counts exercise the last partial task
    x = np.random.default_rng(k).standard_normal((rows, n)).astype(np.float32)
    for normalize in (False, True):
        y = jax.jit(lambda v, nz=normalize: fwht(v, normalize=nz, implementation="cpu"))(x)
        assert y.dtype == jnp.float32 and y.shape == x.shape
        _close(y, _reference(x, normalize), np.float32)


@built
def test_large_batch_uses_threads_and_matches_xla():
    """A batch large enough for the thread pool; compared with the pure-XLA butterfly."""
    x = np.random.default_rng(1).standard_normal((4097, 256)).astype(np.float32)
    y = jax.jit(lambda v: fwht(v, implementation="cpu"))(x)
    z = jax.jit(lambda v: fwht(v, implementation="xla"))(x)
    np.testing.assert_allclose(np.asarray(y), np.asarray(z), rtol=0, atol=1e-4)


@built
@pytest.mark.parametrize("k", [0, 1, 3, 4, 7, 10, 13, 14])
def test_matches_hadamard_float64(k):
    n = 1 << k
    x = np.random.default_rng(k).standard_normal((5, n))
    with jax.enable_x64(True):
        for normalize in (False, True):
            y = fwht(jnp.asarray(x, jnp.float64), normalize=normalize, implementation="cpu")
            assert y.dtype == jnp.float64
            _close(y, _reference(x, normalize), np.float64)


@built
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("normalize", [False, True])
def test_half_types_accumulate_in_float32(dtype, normalize):
    x = jnp.asarray(np.random.default_rng(2).standard_normal((7, 512)), dtype=dtype)
    y = fwht(x, normalize=normalize, implementation="cpu")
    assert y.dtype == dtype
    # accumulated in float32 and rounded once: equal to the rounded exact result (1 ulp)
    ref = _reference(np.asarray(x.astype(jnp.float32)), normalize)
    expected = np.asarray(jnp.asarray(ref, jnp.float32).astype(dtype), dtype=np.float64)
    ulp = float(jnp.finfo(dtype).eps) * np.abs(ref).max()
    np.testing.assert_allclose(np.asarray(y, dtype=np.float64), expected, rtol=0, atol=ulp)


@built
def test_leading_shapes_and_non_contiguous_inputs():
    """Any leading shape; transposed / strided inputs and other axes (XLA makes them dense)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 4, 5, 64)).astype(np.float32)
    np.testing.assert_allclose(
        np.asarray(fwht(x, implementation="cpu")), _reference(x, False), rtol=0, atol=1e-4
    )
    big = rng.standard_normal((64, 6, 32)).astype(np.float32)
    view = big.transpose(1, 2, 0)[:, ::2]  # (6, 16, 64), not contiguous in memory
    np.testing.assert_allclose(
        np.asarray(jax.jit(lambda v: fwht(v, implementation="cpu"))(view)),
        _reference(np.ascontiguousarray(view), True) * np.sqrt(64),
        rtol=0,
        atol=1e-4,
    )
    y = fwht(big, axis=0, normalize=True, implementation="cpu")
    np.testing.assert_allclose(
        np.asarray(y), np.moveaxis(_reference(np.moveaxis(big, 0, -1), True), -1, 0), atol=1e-5
    )
    vm = jax.vmap(lambda v: fwht(v, implementation="cpu"), in_axes=1)(big)
    np.testing.assert_allclose(
        np.asarray(vm), _reference(np.moveaxis(big, 1, 0), False), rtol=0, atol=1e-4
    )


@built
def test_involution_and_empty_batch():
    x = np.random.default_rng(4).standard_normal((9, 1 << 15)).astype(np.float32)
    y = fwht(fwht(x, normalize=True, implementation="cpu"), normalize=True, implementation="cpu")
    np.testing.assert_allclose(np.asarray(y), x, rtol=0, atol=1e-5)
    empty = fwht(np.zeros((0, 8), np.float32), implementation="cpu")
    assert empty.shape == (0, 8)


@built
def test_auto_picks_the_kernel_and_no_temporaries():
    x = jnp.ones((16, 1024), jnp.float32)
    text = jax.jit(lambda v: fwht(v)).lower(x).as_text()
    assert "rfjax_fwht_f32" in text
    analysis = jax.jit(lambda v: fwht(v)).lower(x).compile().memory_analysis()
    if analysis is not None:
        assert analysis.temp_size_in_bytes <= 1024  # nothing beyond the output


@built
def test_the_call_names_every_axis_but_the_transformed_one_a_batch_axis():
    """XLA may split a batch-partitionable call along the axes ``num_batch_dims`` names (the
    leading ones): the transformed (last) axis must not be one of them."""
    text = jax.jit(lambda v: fwht(v, implementation="cpu")).lower(jnp.zeros((2, 3, 8))).as_text()
    assert 'num_batch_dims = "2"' in text


def _entry_text(fn, x) -> str:
    text = fn.lower(x).compile().as_text()
    return text[text.index("ENTRY") :]


@built
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_out_of_place_on_a_kept_argument_in_place_otherwise(dtype):
    """An argument the caller keeps is read by the kernel's first pass into the output (no copy
    of it first, no aliasing); a donated argument and an intermediate are transformed in place
    (the output aliases them); all three give the same values."""
    with jax.enable_x64(dtype == jnp.float64):
        x = np.random.default_rng(8).standard_normal((64, 1024)).astype(dtype)
        kept = jax.jit(lambda v: fwht(v, implementation="cpu"))
        donated = jax.jit(lambda v: fwht(v, implementation="cpu"), donate_argnums=0)
        intermediate = jax.jit(lambda v: fwht(v * 1.0 + 0.0, implementation="cpu"))
        text = _entry_text(kept, x)
        assert "output_to_operand_aliasing" not in text and " copy(" not in text
        assert "output_to_operand_aliasing" in _entry_text(donated, x)
        assert "output_to_operand_aliasing" in _entry_text(intermediate, x)
        expected = np.asarray(kept(x))
        np.testing.assert_array_equal(np.asarray(donated(jnp.array(x, copy=True))), expected)
        np.testing.assert_array_equal(np.asarray(intermediate(x)), expected)
        _close(expected, _reference(x, False), dtype)


def _supported_isas() -> list[str]:
    """The compiled instruction sets this CPU runs (``select_isa`` refuses the others)."""
    supported = []
    for name in _fwht_cpu.compiled_isas():
        try:
            _fwht_cpu.select_isa(name)
        except ValueError:
            continue
        supported.append(name)
    return supported


# Compiled once for all instruction sets: the program calls the kernel, which dispatches to the
# selected instruction set when it runs.
_KERNEL_SIN_COS = jax.jit(functools.partial(sin_cos, scale=0.5))
_XLA_SIN_COS = jax.jit(functools.partial(_xla_sin_cos, scale=0.5))


def _check_sin_cos_kernel(rng: np.random.Generator) -> None:
    """The sin/cos kernel of the selected instruction set against its XLA form (1 ulp), with
    rows of 1..70 elements (every vector tail) and values beyond the fast range."""
    for dtype in (np.float32, np.float64):
        with jax.enable_x64(dtype == np.float64):
            for m in (1, 3, 8, 17, 70):
                t = (30 * rng.standard_normal((5, m))).astype(dtype)
                t[0, 0] = 1e12
                kernel = np.asarray(_KERNEL_SIN_COS(t))
                xla = np.asarray(_XLA_SIN_COS(t))
                ulp = np.spacing(np.abs(xla)).astype(np.float64)
                assert np.all(np.abs(kernel.astype(np.float64) - xla) <= ulp), (dtype, m)


@built
def test_every_instruction_set_matches_hadamard():
    """Each compiled instruction set (AVX-512, AVX2, SSE2, scalar) that this CPU supports, for
    the FWHT and the sin/cos kernel."""
    default = _fwht_cpu.isa()
    compiled = _fwht_cpu.compiled_isas()
    assert compiled[-1] == "scalar"
    assert default == _supported_isas()[0]  # the best supported one is the default
    rng = np.random.default_rng(6)
    try:
        for name in _supported_isas():
            _fwht_cpu.select_isa(name)
            assert _fwht_cpu.isa() == name
            for k in (0, 1, 2, 3, 4, 5, 9, 13, 15):
                n = 1 << k
                x = rng.standard_normal((3, n)).astype(np.float32)
                y = jax.jit(lambda v: fwht(v, normalize=True, implementation="cpu"))(x)
                _close(y, _reference(x, True), np.float32)
                with jax.enable_x64(True):
                    z = rng.standard_normal((2, n))
                    _close(fwht(z, implementation="cpu"), _reference(z, False), np.float64)
            _check_sin_cos_kernel(rng)
    finally:
        _fwht_cpu.select_isa(default)
    with pytest.raises(ValueError, match="was not compiled"):
        _fwht_cpu.select_isa("neon")


@built
def test_settings_the_library_ignores_are_warned_of_naming_the_variable():
    """An unknown RFJAX_FWHT_CPU_ISA ran the best set without a word (select_isa raises), and
    a non-integer RFJAX_FWHT_CPU_THREADS read as 0 helper threads."""

    def loaded_with(isa: str, threads: str) -> tuple[str, str]:
        ran = subprocess.run(
            [
                sys.executable,
                "-W",
                "always",
                "-c",
                "from rfjax.ops import _fwht_cpu as f; print(f.isa())",
            ],
            env={**os.environ, "RFJAX_FWHT_CPU_ISA": isa, "RFJAX_FWHT_CPU_THREADS": threads},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return ran.stdout.strip(), ran.stderr

    in_use, warned = loaded_with("avx3", "abc")
    assert in_use == _supported_isas()[0]
    assert "RFJAX_FWHT_CPU_ISA='avx3' is ignored" in warned, warned
    assert "RFJAX_FWHT_CPU_THREADS='abc' is not an integer" in warned, warned
    in_use, warned = loaded_with("scalar", "1")
    assert in_use == "scalar" and "RFJAX_FWHT_CPU" not in warned, warned


@pytest.mark.integration
def test_scalar_path_compiles_without_simd_macros():
    """The portable scalar kernel (non-x86 targets) compiles: -fsyntax-only, SIMD macros off."""
    compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    undefined = ["-U__SSE__", "-U__SSE2__", "-U__AVX__", "-U__AVX2__", "-U__AVX512F__"]
    flags = ["-std=c++17", "-fsyntax-only", *undefined, "-U__FMA__", "-DRFJAX_ISA=portable"]
    result = subprocess.run(
        [compiler, *flags, "-Icsrc", "csrc/fwht_isa.cc"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.integration
@built
def test_library_has_no_host_specific_instructions():
    """Portability: only the AVX-512/AVX2 kernels use 256/512-bit registers (no -march=native)."""
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) is not installed")
    listing = subprocess.run(
        [objdump, "-d", "--no-show-raw-insn", "-C", _fwht_cpu.library_path()],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    wide = {"%zmm": ("avx512",), "%ymm": ("avx2", "avx512")}  # register -> allowed namespaces
    function, offenders = "", set()
    for line in listing.splitlines():
        if line.endswith(">:"):
            function = line
            continue
        for register, isas in wide.items():
            if register in line and not any(f"rfjax::{isa}::" in function for isa in isas):
                offenders.add(function)
    assert not offenders, sorted(offenders)[:5]
