"""Fast operators as XLA ops: the fast Walsh-Hadamard transform, the structured-coupling chain
built on it, and a vectorised cosine.

``fwht(x, axis=-1, normalize=False)`` computes H_n x along one axis in O(n log n), where H_n is
the Sylvester-Hadamard matrix (H_1 = 1, H_2n = [[H_n, H_n], [H_n, -H_n]]), unnormalised or scaled
by 1/sqrt(n) (then orthogonal). It works under ``jit``, ``vmap``, ``grad``/``vjp``/``jvp`` and on
sharded arrays (per shard, no gather); the kernel behind it is chosen per platform (see
``implementation``) from one table of backends: ``fwht_backends()`` lists them, ``fwht_backend``
gives an entry, ``resolve_fwht`` says what ``"auto"`` picks.

``hd_chain(x, signs, norms)`` is N_b [S] (H D_{b,k}) ... (H D_{b,1}) x for every block b, the map
of the fast ORF / fast SimRF couplings, fused into one kernel where the backend has one (the C++
kernel on CPU, Pallas TPU on TPU).

``shifted_cos(t, s)`` = cos(t - s pi/2) in fused, vectorisable arithmetic (XLA:CPU's own sin/cos
run element by element), and ``sin_cos(t)`` = [sin t, cos t] from one reduction of each element
(the sin/cos pair of random Fourier features in one pass).

``symmetric_rank_update(c, a)`` = c + a^T a in the lower triangle (BLAS ``syrk`` on CPU: half
the work of ``a.T @ a``), the Gram matrix of streamed row blocks (``rfjax.linear_models``).
"""

from __future__ import annotations

import operator
from typing import SupportsIndex

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from rfjax._validation import check_bool
from rfjax.ops._chain import apply_simplex, chain_reference, hd_chain_p
from rfjax.ops._cos import shifted_cos, sin_cos
from rfjax.ops._fwht import fwht_p
from rfjax.ops._fwht_backends import (
    FusedChain,
    FwhtBackend,
    check_implementation,
    fwht_backend,
    fwht_backends,
    resolve_fwht,
)
from rfjax.ops._fwht_xla import kronecker_factors, kronecker_matmul, xla_butterfly
from rfjax.ops._syrk import symmetric_rank_update

SUPPORTED_DTYPES = (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)


def is_power_of_two(n: int) -> bool:
    """Whether the integer ``n`` is 1, 2, 4, 8, ..."""
    return n >= 1 and (n & (n - 1)) == 0


def _normalize_axis(axis: SupportsIndex, ndim: int) -> int:
    """``axis`` as an index in [0, ndim): any integer (Python or NumPy), not a bool or a float."""
    if isinstance(axis, (bool, np.bool_)):
        raise TypeError(f"axis must be an integer, got {axis!r}")
    try:
        axis = operator.index(axis)
    except TypeError:
        raise TypeError(f"axis must be an integer, got {axis!r}") from None
    if not -ndim <= axis < ndim:
        raise ValueError(
            f"axis must be in [{-ndim}, {ndim - 1}] for an input of rank {ndim}, got {axis}"
        )
    return axis % ndim


def _check_operand(name: str, x: ArrayLike) -> jax.Array:
    x = jnp.asarray(x)
    if x.dtype not in [jnp.dtype(t) for t in SUPPORTED_DTYPES]:
        raise TypeError(
            f"{name} must have dtype float16, bfloat16, float32 or float64, got {x.dtype}"
        )
    if x.ndim == 0:
        raise ValueError(f"{name} must have at least one axis, got a scalar")
    return x


def _check_length(n: int, where: str, shape) -> None:
    if not is_power_of_two(n):
        raise ValueError(
            f"the length of {where} must be a power of two, got {n} (shape {tuple(shape)}); "
            "pad with rfjax.ops.pad_to_power_of_two"
        )


def fwht(
    x: ArrayLike,
    *,
    axis: int = -1,
    normalize: bool = False,
    implementation: str = "auto",
) -> jax.Array:
    """Fast Walsh-Hadamard transform of ``x`` along ``axis``.

    y = H_n x along the axis, H_n the n x n Sylvester-Hadamard matrix (entries +-1, natural
    order, equal to ``scipy.linalg.hadamard(n)``), or y = H_n x / sqrt(n) when ``normalize``.
    H_n H_n = n I, so ``fwht(fwht(x)) == n * x`` and the normalised transform is its own inverse.
    Cost O(n log n) per vector.

    Half-precision inputs (float16, bfloat16) are accumulated in float32 and rounded once, so the
    result is the correctly computed transform rounded to the input dtype (relative error about
    one half-precision ulp of the output's largest entries).

    Sharding: under ``jit`` on an array sharded along other axes, every device transforms its own
    shard (no all-gather, the output sharded like the input), with explicit mesh axes
    (``jax.make_mesh``'s default) and automatic ones (a plain ``jax.sharding.Mesh``; a Shardy
    sharding rule through ``custom_partitioning``) alike. A sharded transformed axis works too,
    by a distributed transform (each device transforms its block, then log2(p) exchange stages
    between the p devices). Exception: Pallas' TPU and Mosaic GPU interpret modes (simulators
    with ordered host callbacks) have their operand gathered under automatic axes. See
    ``rfjax.ops._partition``.

    Implementations (``implementation=``): ``"auto"`` or a backend of ``fwht_backends()``, each
    one entry of one table (``fwht_backend(name)``: its platforms, lengths and dtypes):

    * ``"cpu"``: the C++ kernel (XLA FFI; SIMD chosen at load time), CPU only. It transforms
      in place what XLA can overwrite (an intermediate, a donated argument: ``jax.jit(...,
      donate_argnums=...)``) and out of place an argument the caller keeps (its first pass
      reads the argument and writes the output, with no copy before it);
    * ``"matmul"``: H_n as a Kronecker product of Hadamard factors of at most 128, applied as
      small dense contractions (matrix units on TPU/GPU; ``Precision.HIGHEST`` for float32),
      every backend;
    * ``"xla"``: a radix-2 butterfly in plain XLA, every backend;
    * ``"pallas_triton"`` / ``"pallas_triton_interpret"``: the Pallas Triton kernel for sm80+
      (Triton is deprecated by JAX; kept for GPUs Mosaic GPU does not support, and the fastest
      measured in bfloat16 up to n = 4096 on an H200), n <= 8192, or in Pallas' generic
      interpret mode on any platform (tests);
    * ``"pallas_tpu"`` / ``"pallas_tpu_interpret"``: the Pallas TPU (Mosaic) kernel, compiled for
      a TPU or run in Pallas' TPU interpret mode on CPU (tests); float16/bfloat16/float32,
      n <= 2^14;
    * ``"mosaic_gpu"`` / ``"mosaic_gpu_interpret"``: the Pallas Mosaic GPU kernel for sm90+,
      compiled or in Pallas' GPU interpret mode on CPU (tests); float16/bfloat16/float32,
      16 <= n <= 2^14;
    * ``"mosaic_gpu_pipelined"`` / ``"mosaic_gpu_pipelined_interpret"``: the same kernel with
      several tiles per program, the next tile loading while one is transformed; not yet
      timed on a GPU (``"auto"`` does not pick it until a run measures it);
    * ``"auto"``: on CPU the C++ kernel, or ``"matmul"`` when it was not built; on an sm90+ GPU
      the implementation measured fastest for the length and dtype (below), else ``"matmul"``;
      on TPU ``"matmul"``; elsewhere ``"xla"`` (``resolve_fwht`` says which).

    The choice on CPU, from ``benchmarks/fwht.py`` (one run, 2^22 elements per batch, n = 2^4 ...
    2^15, median time; a 2-core machine shared with other jobs, so single ratios are noisy):
    in float32 the C++ kernel took 1.05-3.0x the time of an XLA copy of the array, ``"matmul"``
    1.7-16x and ``"xla"`` 8-36x: the kernel is 1.3-9x faster than ``"matmul"``, which is
    1.8-5.5x faster than ``"xla"`` at every n; in bfloat16 (the kernel upcasts) the kernel is
    1.0-5x faster than ``"matmul"``, which is 2.1-3.8x faster than ``"xla"``. On an H200
    (2^24 elements, one run per dtype): in float32 (``benchmarks/gpu_runs/2026-11-26-h200``)
    the Mosaic GPU kernel was the fastest at n = 128 ... 2^14 (1.4-2.7x a device copy; 1.5-2.5x
    faster than ``"matmul"``), ``"matmul"`` at n = 64; in bfloat16
    (``benchmarks/gpu_runs/2026-11-27-h200``, after the Triton kernel's fix) the Triton kernel
    (``"pallas_triton"``) at n = 64 ... 4096 (0.98-1.58x a copy), Mosaic GPU at 8192 (1.07x)
    and 2^14 (1.23x; ``benchmarks/gpu_runs/2026-11-30-h200``, where ``"matmul"`` took 2.96x).
    ``"auto"`` picks those (``GPU_AUTO_SM90`` in ``rfjax.ops._fwht_backends``) and ``"matmul"``
    where only it compiles fast (n = 2^15: 2.8-3.0x a copy). On TPU ``"matmul"`` runs on the MXU;
    the TPU kernels have not run on a TPU.

    Args:
      x: floating array (float16, bfloat16, float32, float64) of any rank >= 1.
      axis: the axis to transform (a Python or NumPy integer); its length n must be a power of
        two (see ``pad_to_power_of_two``).
      normalize: scale by 1/sqrt(n) (a Python or NumPy bool).
      implementation: ``"auto"`` or a name of ``fwht_backends()``, see above.

    Returns:
      An array of the shape and dtype of ``x``.

    Raises:
      TypeError: for a non-floating ``x``, a non-integer ``axis``, a non-bool ``normalize``, or
        a dtype the chosen kernel does not take.
      ValueError: if the axis length is not a power of two, ``axis`` is out of range,
        ``implementation`` is unknown or cannot run on the platform.

    Examples:
      >>> import jax.numpy as jnp
      >>> fwht(jnp.array([1.0, 0.0, 0.0, 0.0]))
      Array([1., 1., 1., 1.], dtype=float32)

    References:
      Fino & Algazi, "Unified matrix treatment of the fast Walsh-Hadamard transform", 1976.
    """
    x = _check_operand("x", x)
    axis = _normalize_axis(axis, x.ndim)
    normalize = check_bool("normalize", normalize)
    check_implementation(implementation)
    _check_length(x.shape[axis], f"axis {axis}", x.shape)
    moved = jnp.moveaxis(x, axis, -1)
    y = fwht_p.bind(moved, normalize=normalize, implementation=implementation)
    return jnp.moveaxis(y, -1, axis)


def hd_chain(
    x: ArrayLike,
    signs: ArrayLike,
    norms: ArrayLike,
    *,
    simplex: bool = False,
    implementation: str = "auto",
) -> jax.Array:
    """y_b = N_b [S] (H D_{b,k}) ... (H D_{b,1}) x for every block b: fast ORF / SimRF rows.

    H is the normalised p x p Hadamard matrix, D_{b,i} = diag(``signs[b, i]``), S the simplex
    map of SimRF Eq. 9 (``apply_simplex``; when ``simplex``) and N_b = diag(``norms[b]``). A
    backend with a fused kernel (``fwht_backend(name).chain``: the C++ kernel on CPU for float32
    and float64, Pallas TPU on TPU; ``"auto"`` takes the platform's) runs it where it takes the
    operand: one read of each input vector and one write of each output block. Otherwise it is
    k ``fwht`` calls with the products between them (``implementation`` is passed on to
    ``fwht``). The Pallas TPU kernel keeps every stage in float32 for half-precision inputs;
    the composition rounds between stages.

    Args:
      x: ``(..., p)``, p a power of two, floating.
      signs: ``(B, k, p)`` with B, k >= 1, the diagonals (normally +-1), D_{b,1} first; dtype
        of ``x``.
      norms: ``(B, p)``, the row norms; dtype of ``x``.
      simplex: apply S after the rotations (fast SimRF; needs p >= 2).
      implementation: as for ``fwht``.

    Returns:
      ``(..., B, p)`` in the dtype of ``x``.

    Raises:
      TypeError: for non-floating or mismatched dtypes, or a non-bool ``simplex``.
      ValueError: for mismatched shapes, no block or no diagonal (B or k = 0), or a p that
        is not a power of two.

    Examples:
      >>> import jax.numpy as jnp
      >>> hd_chain(jnp.array([1.0, 0.0]), jnp.ones((1, 1, 2)), jnp.ones((1, 2)))
      Array([[0.70710677, 0.70710677]], dtype=float32)

    References:
      Reid et al., "Simplex Random Features", ICML 2023, arXiv:2301.13856, Sec. 4.2, App. B.2,
      Eq. 89-90; Yu et al., "Orthogonal Random Features", NeurIPS 2016, arXiv:1610.09072.
    """
    x = _check_operand("x", x)
    signs, norms = jnp.asarray(signs), jnp.asarray(norms)
    simplex = check_bool("simplex", simplex)
    check_implementation(implementation)
    p = x.shape[-1]
    _check_length(p, "the last axis of x", x.shape)
    if signs.ndim != 3 or signs.shape[-1] != p or norms.shape != (signs.shape[0], p):
        raise ValueError(
            f"signs must have shape (B, k, {p}) and norms (B, {p}) for x of shape {x.shape}, "
            f"got {signs.shape} and {norms.shape}"
        )
    if 0 in signs.shape[:2]:
        raise ValueError(
            f"signs must hold at least one block and one diagonal (B, k >= 1), got shape "
            f"{signs.shape}"
        )
    if signs.dtype != x.dtype or norms.dtype != x.dtype:
        raise TypeError(
            f"signs and norms must have the dtype of x ({x.dtype}), got {signs.dtype} and "
            f"{norms.dtype}"
        )
    if simplex and p < 2:
        raise ValueError(f"simplex needs p >= 2, got p = {p}")
    return hd_chain_p.bind(x, signs, norms, simplex=simplex, implementation=implementation)


def pad_to_power_of_two(x: ArrayLike, *, axis: int = -1) -> jax.Array:
    """Appends zeros along ``axis`` up to the next power of two (no copy if already one).

    Args:
      x: array of rank >= 1.
      axis: the axis to pad (a Python or NumPy integer).

    Returns:
      ``x`` with the axis length rounded up to a power of two, the new entries zero.

    Examples:
      >>> import jax.numpy as jnp
      >>> pad_to_power_of_two(jnp.array([1.0, 2.0, 3.0]))
      Array([1., 2., 3., 0.], dtype=float32)
    """
    x = jnp.asarray(x)
    if x.ndim == 0:
        raise ValueError("x must have at least one axis, got a scalar")
    axis = _normalize_axis(axis, x.ndim)
    n = x.shape[axis]
    target = 1 << max(n - 1, 0).bit_length()
    if target == n:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, target - n)
    return jnp.pad(x, widths)


__all__ = [
    "FusedChain",
    "FwhtBackend",
    "apply_simplex",
    "chain_reference",
    "fwht",
    "fwht_backend",
    "fwht_backends",
    "fwht_p",
    "hd_chain",
    "hd_chain_p",
    "is_power_of_two",
    "kronecker_factors",
    "kronecker_matmul",
    "pad_to_power_of_two",
    "resolve_fwht",
    "shifted_cos",
    "sin_cos",
    "symmetric_rank_update",
    "xla_butterfly",
]
