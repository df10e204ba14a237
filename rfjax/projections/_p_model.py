"""The P-model of Choromanski & Fagan: structured Gaussian matrices from a budget of randomness.

A P-model (arXiv:1604.07356, Sec. 2.2, Eq. 3; docs/maths/structured.md) draws a budget of randomness
g ~ N(0, I_t) and builds the rows of a k x n block from fixed matrices P_0..P_{k-1} in R^{t x n}:

    a^i = g^T P_i,    i = 0..k-1.

Two conditions make it a drop-in for an unstructured Gaussian matrix:

* normalisation (Sec. 2.2): every column of every P_i has unit norm, so every entry of a^i is
  N(0, 1);
* orthogonality (Lemma of Sec. 3, Eq. 14): the columns of each P_i are mutually orthogonal, so
  every row is exactly N(0, I_n) and every estimator that is linear in the rows' features stays
  unbiased. Rows of one block share g and are dependent.

A structured family is one ``PModel``: its budget length t(n), how many rows a block has, the
random parameters of its P_i if they are random (the h vectors of low displacement rank), and a
fast ``apply`` of a block to inputs. Nothing else: the dense P_i (``PModel.matrices``) follow from
``apply`` by linearity in g, and from them the conditions are checked (``p_model_violations``) and
the coherence graphs are built (``rfjax.theory.coherence_graphs``). ``p_model`` turns a family,
or P_i given densely, into a ``Projection``; circulant, skew-circulant, Toeplitz, Hankel and
low-displacement-rank couplings are instances.

Blocks and preprocessing: ceil(m / k) independent blocks (independent budgets) are drawn and the
last one is truncated. With ``preprocess=True`` inputs are zero-padded to p = 2^ceil(log2 d) and
rotated by one shared x -> H D_3 H D_2 H D_1 x first (Step 1 of the paper's algorithm, Eq. 12),
so W = (A R_HD)[:, :d]; rows stay exactly N(0, I_d) (a Gaussian row times a fixed orthogonal
matrix) and blocks stay independent.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from collections.abc import Callable
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike, DTypeLike

from rfjax._random import flat
from rfjax._validation import check_array_size, check_bool, check_int, check_real, is_concrete
from rfjax.projections._base import Projection
from rfjax.projections._dense import _compute_dtype, _num_blocks, _validate
from rfjax.projections._structured import (
    _jit_apply,
    _output_dtype,
    _pad_last,
    _stack_rows,
    apply_hd,
    next_power_of_two,
)

CONDITION_TOLERANCE = 1e-4
"""Absolute tolerance of the normalisation and orthogonality checks (P from float32 FFTs)."""

_CHECK_ENTRIES = 1 << 18
"""A generator is checked at the requested n when its P_i have at most this many entries."""

_CHECK_SIZE = 16
"""... and otherwise at this block size (the structure of a family does not depend on n)."""

ROW_BLOCK_ENTRIES = 1 << 20
"""On CPU, a batch of inputs is applied in blocks of rows whose transforms hold about this many
entries (``PModel.row_workspace`` per row): 4-8 MiB of FFT buffers, which stay in cache and in
the allocator's heap. One batched FFT of every row instead maps fresh pages from the operating
system on every call once its buffers pass glibc's mmap threshold (at most 32 MiB): at d = 512,
batch 4096, half the Toeplitz map's time went to page faults (``benchmarks.structured``)."""


class PModel(abc.ABC):
    """A structured family in P-model form: how one block of rows is built from its budget g.

    Subclasses are frozen dataclasses (hashable: a projection keeps its family as static pytree
    metadata) and define ``budget_size`` and ``apply``; where needed also ``num_rows`` (blocks
    that are not n x n) and ``draw_parameters`` (random P_i). ``p_model`` checks a family's P_i
    (read off ``apply``) against the normalisation and orthogonality conditions.

    Examples:
      A family whose rows are the circulant's rows in reverse order, in four lines:

      >>> import dataclasses, jax
      >>> from typing import ClassVar
      >>> @dataclasses.dataclass(frozen=True)
      ... class ReversedCirculant(PModel):
      ...     name: ClassVar[str] = "reversed_circulant"
      ...     def budget_size(self, n):
      ...         return n
      ...     def apply(self, budget, x, parameters):
      ...         return Circulant().apply(budget, x, parameters)[..., ::-1]
      >>> w = p_model(jax.random.key(0), 6, 6, generator=ReversedCirculant())
      >>> w.block_matrices().shape  # P_0..P_5, each t x n
      (6, 6, 6)
    """

    name: ClassVar[str]

    @abc.abstractmethod
    def budget_size(self, n: int) -> int:
        """t, the length of the budget of randomness of one block acting on R^n."""

    def num_rows(self, n: int) -> int:
        """k, the rows of one block acting on R^n (n unless a family says otherwise)."""
        return n

    def check_size(self, n: int) -> None:
        """Raises ``ValueError`` if the family has no block acting on R^n (an argument that
        does not fit n, naming it); nothing for the families that fit every n."""
        del n

    def parameter_shape(self, n: int, num_blocks: int) -> tuple[int, ...] | None:
        """The shape of ``draw_parameters``' result (for the size cap); ``None`` for none."""
        del n, num_blocks
        return None

    def draw_parameters(
        self, key: jax.Array, n: int, num_blocks: int, dtype: jnp.dtype
    ) -> jax.Array | None:
        """Random parameters of the P_i, leading axis one per block; ``None`` for fixed P_i."""
        del key, n, num_blocks, dtype
        return None

    def block_parameters(self, parameters: jax.Array | None, block: int) -> jax.Array | None:
        """The parameters of block ``block`` (leading axis of length 1), as ``apply`` takes them."""
        return None if parameters is None else parameters[block : block + 1]

    def row_workspace(self, n: int) -> int:
        """Entries of the transforms that one input row takes in one block of ``apply``: how
        many rows a CPU computation takes at a time (``ROW_BLOCK_ENTRIES``); 0 for a family
        applied as a matrix product (no row blocks). 2n by default, one real FFT of length 2n
        (a linear convolution)."""
        return 2 * n

    @abc.abstractmethod
    def apply(self, budget: jax.Array, x: jax.Array, parameters: jax.Array | None) -> jax.Array:
        """Every block applied to ``x``: budget ``(B, t)``, x ``(..., n)`` -> ``(..., B, k)``.

        Row i of block b is ``budget[b] @ P_i`` (the P_i of block b); inputs are in at least
        float32. Must not form the k x n block when a fast product exists.
        """

    def matrices(self, n: int, parameters: jax.Array | None = None) -> np.ndarray:
        """P_0..P_{k-1} of one block, ``(k, t, n)`` float64, read off ``apply`` by linearity.

        Args:
          n: the block's input size.
          parameters: that block's parameters (``block_parameters``), ``None`` for fixed P_i.

        Raises:
          ValueError: if the k x t x n matrices pass ``rfjax._validation.MAX_ARRAY_BYTES``
            (n = 4096 for a circulant: 512 GiB), before anything compiles.
        """
        shape = (self.num_rows(n), self.budget_size(n), n)
        check_array_size("the P-model matrices P_0..P_{k-1} (k, t, n)", shape, np.float64, {"n": n})
        jacobian = _run_compiled(functools.partial(_block_jacobian, self, n), parameters)
        return np.transpose(np.asarray(jacobian, np.float64), (1, 2, 0))  # from (n, k, t)


def _require_parameters(model: PModel, parameters: jax.Array | None) -> jax.Array:
    """The random parameters a family with random P_i needs in ``apply``."""
    if parameters is None:
        raise ValueError(
            f"{type(model).__name__}.apply needs the parameters of its P_i (from draw_parameters "
            "or the dense matrices), got None"
        )
    return parameters


def _run_compiled(function, *args):
    """``function(*args)`` for concrete ``args`` as one compiled program, run at once even inside
    a trace (an ahead-of-time compiled executable is not traced; ``jax.ensure_compile_time_eval``
    would run it op by op, compiling each operation: 37 programs for a circulant's check)."""
    return jax.jit(function).lower(*args).compile()(*args)


def _block_jacobian(model: PModel, n: int, parameters: jax.Array | None) -> jax.Array:
    """d(A_ij)/d(g_s) of one block, ``(n, k, t)``: entry [j, i, s] = (P_i)_sj (A is linear in g)."""
    eye = jnp.eye(n, dtype=jnp.float32)

    def rows(budget):  # (t,) -> (n, k): entry [j, i] = A_ij = sum_s g_s (P_i)_sj
        return model.apply(budget[None], eye, parameters)[:, 0, :]

    return jax.jacfwd(rows)(jnp.zeros(model.budget_size(n), jnp.float32))


def _spectra(budget: jax.Array, x: jax.Array, length: int) -> tuple[jax.Array, jax.Array]:
    """Real FFTs of length ``length``: budget ``(B, t)`` and x ``(..., n)`` -> ``(..., 1, f)``."""
    return jnp.fft.rfft(budget, n=length, axis=-1), jnp.fft.rfft(x, n=length, axis=-1)[..., None, :]


def negacyclic_convolution(vectors: jax.Array, x: jax.Array) -> jax.Array:
    """Z_{-1}(v) x for the skew-circulant Z_{-1}(v) with first column v, by one FFT of length 2n.

    (Z_{-1}(v) x)_i = sum_{j <= i} v_{i-j} x_j - sum_{j > i} v_{i-j+n} x_j: the linear
    convolution folded with a minus sign. ``vectors`` ``(..., n)`` and ``x`` ``(..., n)``
    broadcast against each other.
    """
    n = x.shape[-1]
    full = jnp.fft.irfft(
        jnp.fft.rfft(vectors, n=2 * n, axis=-1) * jnp.fft.rfft(x, n=2 * n, axis=-1),
        n=2 * n,
        axis=-1,
    )
    return full[..., :n] - full[..., n:]


@dataclasses.dataclass(frozen=True)
class Circulant(PModel):
    """Eq. 7-8: A_ij = g_{(j - i) mod n}, row i is g cyclically shifted right by i; t = n.

    P_i is a cyclic permutation matrix; (A x)_i = sum_s g_s x_{(s + i) mod n} by FFT.
    """

    name: ClassVar[str] = "circulant"

    def budget_size(self, n: int) -> int:
        return n

    def row_workspace(self, n: int) -> int:
        return n  # a real FFT of length n

    def apply(self, budget: jax.Array, x: jax.Array, parameters: jax.Array | None) -> jax.Array:
        n = x.shape[-1]
        spectrum_g, spectrum_x = _spectra(budget, x, n)
        return jnp.fft.irfft(jnp.conj(spectrum_g) * spectrum_x, n=n, axis=-1)


@dataclasses.dataclass(frozen=True)
class SkewCirculant(PModel):
    """The skew-circulant Z_{-1}(g) (first column g; Sec. 2.2, item 4); t = n.

    A_ij = g_{i-j} for j <= i and -g_{i-j+n} for j > i: every row is a signed permutation of g,
    so P_i is a signed permutation matrix (normalised, orthogonal). Applied as a negacyclic
    convolution in O(n log n). This class is the whole definition of the family.
    """

    name: ClassVar[str] = "skew_circulant"

    def budget_size(self, n: int) -> int:
        return n

    def apply(self, budget: jax.Array, x: jax.Array, parameters: jax.Array | None) -> jax.Array:
        return negacyclic_convolution(budget, x[..., None, :])


@dataclasses.dataclass(frozen=True)
class Hankel(PModel):
    """Sec. 2.2 item 3: A_ij = g_{i+j}, constant along anti-diagonals; t = 2n - 1.

    (A x)_i = sum_j g_{i+j} x_j, a correlation by FFT of length 2n.
    """

    name: ClassVar[str] = "hankel"

    def budget_size(self, n: int) -> int:
        return 2 * n - 1

    def apply(self, budget: jax.Array, x: jax.Array, parameters: jax.Array | None) -> jax.Array:
        n = x.shape[-1]
        spectrum_g, spectrum_x = _spectra(budget, x, 2 * n)
        return jnp.fft.irfft(spectrum_g * jnp.conj(spectrum_x), n=2 * n, axis=-1)[..., :n]


@dataclasses.dataclass(frozen=True)
class Toeplitz(PModel):
    """Eq. 9-10: A_ij = g_{j-i+n-1}, constant along diagonals; t = 2n - 1.

    The row-reversed Hankel matrix: A_ij = H_{n-1-i, j}.
    """

    name: ClassVar[str] = "toeplitz"

    def budget_size(self, n: int) -> int:
        return 2 * n - 1

    def apply(self, budget: jax.Array, x: jax.Array, parameters: jax.Array | None) -> jax.Array:
        return Hankel().apply(budget, x, parameters)[..., ::-1]


@dataclasses.dataclass(frozen=True)
class LowDisplacementRank(PModel):
    """Eq. 11: M = sum_{r<R} Z_1(g_r) Z_{-1}(h_r), circulant times skew-circulant, by FFT.

    Z_1(v) is the circulant and Z_{-1}(v) the skew-circulant matrix with first column v
    (Sindhwani et al. 2015). As in the paper, the budget is g = (g_0, ..., g_{R-1}) (t = R n)
    and the h_r define the P_i: row i of M is sum_r (row i of Z_1(g_r)) Z_{-1}(h_r), and row i of
    Z_1(g_r) is a permutation of g_r, so (P_i)_{(r, u), :} = Z_{-1}(h_r)_{(i - u) mod n, :}.

    Normalisation and orthogonality of the P_i both read sum_r Z_{-1}(h_r)^T Z_{-1}(h_r) = I.
    Z_{-1}(h) is diagonalised by the twisted Fourier transform, with eigenvalues
    lambda = FFT(omega^j h_j), omega = exp(i pi / n), so the condition is sum_r |lambda_r|^2 = 1
    at every frequency. Gaussian h_r are therefore rescaled jointly, frequency by frequency, to
    meet it (the rescaling respects the conjugate symmetry, so h_r stay real); then every row
    of M is exactly N(0, I_n) given the h_r, hence unconditionally. Gaussian h_r rescaled only
    to unit column norm (the paper's normalisation alone) fail the orthogonality condition.

    Applying costs O(R n log n) per block and input: one FFT of length 2n per r for the
    negacyclic convolutions, one inverse FFT of length n for the sum of the circulant ones.

    Attributes:
      rank: R, 1 <= R <= n, the number of terms (the paper's displacement rank r).
    """

    rank: int = 1
    name: ClassVar[str] = "low_displacement_rank"

    def __post_init__(self):
        check_int("rank", self.rank, minimum=1)

    def budget_size(self, n: int) -> int:
        return self.rank * n

    def row_workspace(self, n: int) -> int:
        return 2 * n * self.rank  # a negacyclic convolution (length 2n) per r

    def check_size(self, n: int) -> None:
        if self.rank > n:
            raise ValueError(
                f"rank={self.rank} must be <= n = {n}, the block input size (dim, or the padded "
                "p with preprocess): a displacement rank above n adds no structure"
            )

    def parameter_shape(self, n: int, num_blocks: int) -> tuple[int, ...] | None:
        return (num_blocks, self.rank, n)

    def draw_parameters(
        self, key: jax.Array, n: int, num_blocks: int, dtype: jnp.dtype
    ) -> jax.Array | None:
        h = flat(jax.random.normal, key, (num_blocks, self.rank, n), _compute_dtype(dtype))
        return orthonormalise_skew_circulants(h).astype(dtype)

    def apply(self, budget: jax.Array, x: jax.Array, parameters: jax.Array | None) -> jax.Array:
        n = x.shape[-1]
        h = _require_parameters(self, parameters).astype(x.dtype)  # (B, R, n)
        inner = negacyclic_convolution(h, x[..., None, None, :])  # (..., B, R, n)
        g = budget.reshape(*budget.shape[:-1], self.rank, n)  # (B, R, n)
        spectrum = jnp.sum(jnp.fft.rfft(g, axis=-1) * jnp.fft.rfft(inner, axis=-1), axis=-2)
        return jnp.fft.irfft(spectrum, n=n, axis=-1)


def orthonormalise_skew_circulants(h: jax.Array) -> jax.Array:
    """Rescales h ``(..., R, n)`` so that sum_r Z_{-1}(h_r)^T Z_{-1}(h_r) = I_n.

    Divides the twisted-Fourier eigenvalues lambda_r = FFT(omega^j h_r) (omega = e^{i pi/n}) by
    sqrt(sum_r |lambda_r|^2) at each frequency. Real inputs give real outputs: lambda_k and
    lambda_{n+1-k} are conjugate, and so are their rescaled values.
    """
    n = h.shape[-1]
    twist = jnp.exp(1j * jnp.pi * jnp.arange(n) / n).astype(jnp.result_type(h, jnp.complex64))
    eigenvalues = jnp.fft.fft(h * twist, axis=-1)
    scale = jnp.sqrt(jnp.sum(jnp.abs(eigenvalues) ** 2, axis=-2, keepdims=True))
    return jnp.real(jnp.fft.ifft(eigenvalues / scale, axis=-1) * jnp.conj(twist)).astype(h.dtype)


@dataclasses.dataclass(frozen=True)
class IndependentRows(PModel):
    """The unstructured end of the P-model: every row has its own n budget entries; t = n^2.

    P_i selects block i of g, so rows are independent N(0, I_n) and every coherence graph is
    edgeless. Applying is a dense O(n^2) product; ``projections.gaussian`` draws the same law.
    """

    name: ClassVar[str] = "independent_rows"

    def budget_size(self, n: int) -> int:
        return n * n

    def row_workspace(self, n: int) -> int:
        return 0  # a matrix product

    def apply(self, budget: jax.Array, x: jax.Array, parameters: jax.Array | None) -> jax.Array:
        n = x.shape[-1]
        weights = budget.reshape(*budget.shape[:-1], n, n)  # (B, k, n)
        return jnp.einsum("...j,bij->...bi", x, weights)


@dataclasses.dataclass(frozen=True)
class DenseMatrices(PModel):
    """P_0..P_{k-1} given densely ``(k, t, n)`` (stored as the projection's parameters).

    For small or exploratory P-models: applying costs O(k t n) per block and input.

    Attributes:
      rows: k (static; the matrices themselves are an array leaf of the projection).
      budget_length: t.
    """

    rows: int
    budget_length: int
    name: ClassVar[str] = "dense_matrices"

    def __post_init__(self):
        check_int("rows", self.rows, minimum=1)
        check_int("budget_length", self.budget_length, minimum=1)

    def budget_size(self, n: int) -> int:
        return self.budget_length

    def num_rows(self, n: int) -> int:
        return self.rows

    def row_workspace(self, n: int) -> int:
        return 0  # a matrix product

    def block_parameters(self, parameters: jax.Array | None, block: int) -> jax.Array | None:
        return parameters  # one set of P_i shared by every block

    def apply(self, budget: jax.Array, x: jax.Array, parameters: jax.Array | None) -> jax.Array:
        matrices = _require_parameters(self, parameters).astype(x.dtype)
        return jnp.einsum("bs,isj,...j->...bi", budget, matrices, x)

    def matrices(self, n: int, parameters: jax.Array | None = None) -> np.ndarray:
        return np.asarray(parameters, np.float64)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PModelProjection(Projection):
    """A drawn P-model: blocks of rows a^i = g_b^T P_i, applied without forming W.

    Attributes:
      budget: the budgets of randomness g_b, shape ``(num_blocks, t)``.
      parameters: the random parameters of the P_i (``model.draw_parameters``), the dense P_i
        of ``DenseMatrices``, or ``None``.
      signs: the preprocessing diagonals D_1, D_2, D_3, shape ``(3, p)``, or ``None``.
      input_dim: d, also ``dim`` (static).
      output_dim: m, also ``num_features`` (static); the last block is truncated.
      model: the family (static).
    """

    budget: jax.Array
    parameters: jax.Array | None
    signs: jax.Array | None
    input_dim: int = dataclasses.field(metadata={"static": True})
    output_dim: int = dataclasses.field(metadata={"static": True})
    model: PModel = dataclasses.field(metadata={"static": True})

    @property
    def dim(self) -> int:
        return self.input_dim

    @property
    def num_features(self) -> int:
        return self.output_dim

    @property
    def block_dim(self) -> int:
        """n, the input size of a block: d, or p = 2^ceil(log2 d) with preprocessing."""
        return self.input_dim if self.signs is None else self.signs.shape[-1]

    @property
    def block_size(self) -> int:
        return self.model.num_rows(self.block_dim)

    def preprocess(self, x: jax.Array) -> jax.Array:
        """Step 1 of the algorithm: ``(..., d) -> (..., n)``, x -> H D_3 H D_2 H D_1 pad(x).

        The identity without preprocessing. The structured blocks act on its output.
        """
        if self.signs is None:
            return x
        return apply_hd(_pad_last(x, self.block_dim), self.signs.astype(x.dtype))

    def _apply(self, x: jax.Array) -> jax.Array:
        return _jit_apply(self, x)

    def _apply_unjitted(self, x: jax.Array) -> jax.Array:
        out_dtype = _output_dtype(x, self.budget)
        fft_dtype = jnp.promote_types(out_dtype, jnp.float32)  # no half-precision FFT
        blocks = _in_row_blocks(self._blocks, x.astype(fft_dtype), self.rows_per_block)
        return _stack_rows(blocks, self.num_features).astype(out_dtype)

    def _blocks(self, x: jax.Array) -> jax.Array:
        """Every block applied to the inputs ``x`` ``(..., d)``: ``(..., num_blocks, k)``."""
        budget = self.budget.astype(x.dtype)
        return self.model.apply(budget, self.preprocess(x), self.parameters)

    @property
    def rows_per_block(self) -> int | None:
        """Inputs applied at a time on CPU (``ROW_BLOCK_ENTRIES`` over the transforms' entries
        per input row); ``None``: all at once (a family applied as a matrix product)."""
        per_row = self.model.row_workspace(self.block_dim) * self.budget.shape[0]
        return max(1, ROW_BLOCK_ENTRIES // per_row) if per_row > 0 else None

    def matrix(self) -> jax.Array:
        return self._apply(jnp.eye(self.dim, dtype=self.budget.dtype)).T

    def block_matrices(self, block: int = 0) -> np.ndarray:
        """The P-model matrices P_0..P_{k-1} of one block, ``(k, t, n)`` float64.

        The rows are those of the structured matrix A before preprocessing: with
        ``preprocess=True`` the block of W is ``A R_HD`` restricted to the first d columns.
        Only the first ``block_sizes()[block]`` rows are used by the projection.

        Raises:
          ValueError: for a ``block`` out of range, or matrices past
            ``rfjax._validation.MAX_ARRAY_BYTES`` (their size is checked before anything
            compiles: at n = 4096 a circulant's are 512 GiB, which aborted the interpreter).
        """
        check_int("block", block, minimum=0)
        if block >= self.budget.shape[0]:
            raise ValueError(f"block must be < {self.budget.shape[0]} (the blocks), got {block}")
        parameters = self.model.block_parameters(self.parameters, block)
        return self.model.matrices(self.block_dim, parameters)


def _in_row_blocks(
    apply: Callable[[jax.Array], jax.Array], x: jax.Array, rows_per_block: int | None
) -> jax.Array:
    """``apply(x)`` for inputs ``x`` ``(..., d)`` and a row-wise ``apply``; compiled for CPU,
    in blocks of ``rows_per_block`` rows one after the other (``lax.map``; the last block may
    be shorter), on other platforms at once. Rows never mix, so a non-finite row stays in its
    own outputs."""
    rows = x.reshape(-1, x.shape[-1])
    if rows_per_block is None or rows.shape[0] <= rows_per_block:
        return apply(x)

    def in_blocks(rows: jax.Array) -> jax.Array:
        return jax.lax.map(apply, rows, batch_size=rows_per_block)

    out = jax.lax.platform_dependent(rows, cpu=in_blocks, default=apply)
    return out.reshape(*x.shape[:-1], *out.shape[1:])


def p_model_violations(matrices: ArrayLike, *, tolerance: float = CONDITION_TOLERANCE) -> tuple:
    """The P-model conditions that ``matrices`` fails, as messages (empty if it meets both).

    Args:
      matrices: P_0..P_{k-1}, shape ``(k, t, n)``.
      tolerance: absolute tolerance on column norms and on inner products of columns, a
        finite number > 0.

    Returns:
      A tuple of strings, one per failed condition: the normalisation (every column of every P_i
      has unit norm, Sec. 2.2) and the orthogonality condition (the columns of each P_i are
      mutually orthogonal, Lemma of Sec. 3 / Eq. 14), each with its worst offender.

    Raises:
      TypeError: if ``tolerance`` is not a real number.
      ValueError: for ``matrices`` that are not ``(k, t, n)`` or not finite, or a
        ``tolerance`` that is not finite and > 0.

    Examples:
      >>> import numpy as np
      >>> p_model_violations(np.eye(3)[None])
      ()
      >>> p_model_violations(np.ones((1, 2, 2)) / np.sqrt(2))[0][:40]
      'orthogonality condition (Eq. 14) fails: '
    """
    tolerance = check_real("tolerance", tolerance, positive=True)
    p = np.asarray(matrices, np.float64)
    if p.ndim != 3 or 0 in p.shape:
        raise ValueError(f"matrices must have shape (k, t, n) with k, t, n >= 1, got {p.shape}")
    if not np.all(np.isfinite(p)):
        raise ValueError("matrices must contain only finite values")
    gram = np.einsum("ksj,ksl->kjl", p, p)  # (k, n, n): column inner products of each P_i
    norms = np.sqrt(np.diagonal(gram, axis1=-2, axis2=-1))
    violations = []
    norm_error = np.abs(norms - 1.0)
    if norm_error.max() > tolerance:
        i, j = np.unravel_index(np.argmax(norm_error), norm_error.shape)
        violations.append(
            f"normalisation (unit-norm columns) fails: column {j} of P_{i} has norm "
            f"{norms[i, j]:.6g}, must be 1"
        )
    off_diagonal = np.abs(gram) * (1.0 - np.eye(p.shape[-1]))
    if off_diagonal.max() > tolerance:
        i, j, k = np.unravel_index(np.argmax(off_diagonal), off_diagonal.shape)
        violations.append(
            f"orthogonality condition (Eq. 14) fails: columns {j} and {k} of P_{i} have inner "
            f"product {gram[i, j, k]:.6g}, must be 0 (rows would not be N(0, I_n))"
        )
    return tuple(violations)


def _check_size_of(model: PModel, n: int) -> int:
    """The block size at which ``model`` is checked: n itself when its P_i have at most
    ``_CHECK_ENTRIES`` entries, else ``_CHECK_SIZE``."""
    return n if model.num_rows(n) * model.budget_size(n) * n <= _CHECK_ENTRIES else _CHECK_SIZE


@functools.cache
def _generator_violations(model: PModel, n: int) -> tuple:
    """``p_model_violations`` of ``model``'s block at n (reference parameters drawn with key 0),
    once per family and size."""
    size = _check_size_of(model, n)
    parameters = _run_compiled(
        lambda: model.draw_parameters(jax.random.key(0), size, 1, jnp.dtype(jnp.float32))
    )
    return size, p_model_violations(model.matrices(size, parameters))


def _raise_if_violated(violations: tuple, what: str) -> None:
    if violations:
        raise ValueError(f"{what} is not a valid P-model: " + "; ".join(violations))


def _check_generator(generator: object, n: int) -> PModel:
    if not isinstance(generator, PModel):
        raise TypeError(
            f"generator must be a rfjax.projections.PModel, got {type(generator).__name__}"
        )
    try:
        hash(generator)
    except TypeError as error:
        raise TypeError(f"generator must be hashable (a frozen dataclass): {error}") from None
    generator.check_size(n)
    size = _check_size_of(generator, n)
    check_array_size(
        f"the P-model matrices checked at n = {size}",
        (generator.num_rows(size), generator.budget_size(size), size),
        np.float64,
        {"generator": generator, "n": n},
    )
    _, violations = _generator_violations(generator, n)
    _raise_if_violated(violations, f"generator {generator!r} (checked at n = {size})")
    return generator


def _check_matrices(matrices: object, n: int, dtype: jnp.dtype) -> jax.Array:
    if not is_concrete(matrices):
        raise TypeError("matrices must be a concrete array (not traced), to be checked")
    array = np.asarray(matrices)
    if not jnp.issubdtype(array.dtype, jnp.floating):  # NumPy's own does not know bfloat16
        raise TypeError(f"matrices must be a floating array, got dtype {array.dtype}")
    if array.ndim == 3:
        check_array_size(
            "the Gram matrices of the P_i's columns",
            (array.shape[0], array.shape[-1], array.shape[-1]),
            np.float64,
            {"matrices.shape": array.shape},
        )
    _raise_if_violated(p_model_violations(array), "matrices")
    if array.shape[-1] != n:
        raise ValueError(
            f"matrices must act on the block input size n = {n} (d, or the padded p with "
            f"preprocess), got n = {array.shape[-1]} in shape {array.shape}"
        )
    return jnp.asarray(array, dtype)


def _check_budget(budget: object, shape: tuple[int, int], dtype: jnp.dtype) -> jax.Array:
    given = budget.dtype if hasattr(budget, "dtype") else np.asarray(budget).dtype
    if given != dtype:
        raise TypeError(f"budget must have dtype {dtype} (the dtype argument), got {given}")
    array = jnp.asarray(budget)
    if array.shape != shape:
        raise ValueError(f"budget must have shape (num_blocks, t) = {shape}, got {array.shape}")
    if is_concrete(array) and not bool(jnp.all(jnp.isfinite(array))):
        raise ValueError("budget must contain only finite values")
    return array


def _check_draw_sizes(
    model: PModel, dim: int, num_features: int, n: int, num_blocks: int, dtype: jnp.dtype
) -> None:
    """The size caps on what ``_draw`` draws: the budgets and the random parameters."""
    arguments = {"dim": dim, "num_features": num_features}
    check_array_size(
        "the budgets of randomness", (num_blocks, model.budget_size(n)), dtype, arguments
    )
    shape = model.parameter_shape(n, num_blocks)
    if shape is not None:
        check_array_size(f"the parameters of {model!r}", shape, dtype, arguments)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5))
def _draw(key, model, n, num_blocks, dtype, preprocess):
    budget_key, sign_key, parameter_key = jax.random.split(key, 3)
    shape = (num_blocks, model.budget_size(n))
    budget = flat(jax.random.normal, budget_key, shape, _compute_dtype(dtype)).astype(dtype)
    signs = flat(jax.random.rademacher, sign_key, (3, n), dtype) if preprocess else None
    return budget, signs, model.draw_parameters(parameter_key, n, num_blocks, dtype)


def p_model(
    key: jax.Array,
    dim: int,
    num_features: int,
    *,
    matrices: ArrayLike | None = None,
    generator: PModel | None = None,
    budget: ArrayLike | None = None,
    preprocess: bool = False,
    dtype: DTypeLike = jnp.float32,
) -> PModelProjection:
    """A projection from a budget of Gaussian randomness and P-model matrices (Eq. 3).

    Each block draws g ~ N(0, I_t) and has rows a^i = g^T P_i (i < k); ceil(m / k) independent
    blocks are stacked and the last one truncated. The P_i come either densely (``matrices``,
    for small cases: O(k t n) per input) or from a structured family (``generator``, a
    ``PModel`` with a fast product such as ``Circulant()`` or ``LowDisplacementRank(rank=2)``).
    Both are checked against the paper's normalisation (unit-norm columns) and orthogonality
    condition (orthogonal columns, Eq. 14); a failure raises ``ValueError`` naming the failed
    condition and its worst column. Meeting both, every row is exactly N(0, I_d).

    Args:
      key: a PRNG key (budgets, preprocessing signs, random parameters of the P_i).
      dim: input dimension d >= 1.
      num_features: number of rows m >= 1.
      matrices: P_0..P_{k-1}, ``(k, t, n)``, n = d (or p = 2^ceil(log2 d) with ``preprocess``).
      generator: a ``PModel`` family instead of ``matrices`` (exactly one of the two). A
        generator is checked once per family and block size (at n itself when its P_i have at
        most 2^18 entries, otherwise at n = 16), with parameters drawn from a fixed key.
      budget: the budgets g to use instead of drawing them, ``(num_blocks, t)`` of ``dtype``
        (e.g. to reproduce a figure with a given g, or to pair families on one g).
      preprocess: zero-pad to p and rotate by H D_3 H D_2 H D_1 first (Step 1, Eq. 12).
      dtype: floating dtype of the budget and parameters.

    Returns:
      A ``PModelProjection`` with ``block_size == k``.

    Raises:
      ValueError: for a P-model that fails a condition, shapes that do not fit, or a
        non-finite budget.
      TypeError: for a generator that is not a hashable ``PModel``, non-floating matrices or a
        budget of another dtype.

    Examples:
      >>> import jax, numpy as np
      >>> cyclic = np.stack([np.roll(np.eye(4), i, axis=1) for i in range(3)])  # P_i, Eq. 8
      >>> w = p_model(jax.random.key(0), 4, 3, matrices=cyclic)
      >>> w.matrix().shape, w.block_size
      ((3, 4), 3)
      >>> fast = p_model(jax.random.key(0), 4, 3, generator=Circulant(), budget=w.budget)
      >>> bool(np.allclose(fast.matrix(), w.matrix(), atol=1e-6))
      True

    References:
      Choromanski & Fagan, "Fast nonlinear embeddings via structured matrices",
      arXiv:1604.07356, Sec. 2.2 (Eq. 3, normalisation), Sec. 3 (Lemma, Eq. 14), Eq. 12.
    """
    dim, num_features, dtype = _validate(key, dim, num_features, dtype)
    preprocess = check_bool("preprocess", preprocess)
    if (matrices is None) == (generator is None):
        raise ValueError("give exactly one of matrices (dense P_i) and generator (a PModel)")
    n = next_power_of_two(dim) if preprocess else dim
    parameters = None
    if matrices is not None:
        parameters = _check_matrices(matrices, n, dtype)
        model: PModel = DenseMatrices(rows=parameters.shape[0], budget_length=parameters.shape[1])
    else:
        model = _check_generator(generator, n)
    num_blocks = _num_blocks(model.num_rows(n), num_features)
    _check_draw_sizes(model, dim, num_features, n, num_blocks, dtype)
    drawn, signs, drawn_parameters = _draw(key, model, n, num_blocks, dtype, preprocess)
    if budget is not None:
        drawn = _check_budget(budget, drawn.shape, dtype)
    return PModelProjection(
        drawn,
        drawn_parameters if parameters is None else parameters,
        signs,
        dim,
        num_features,
        model,
    )


_FAMILY_DOC = """Gaussian {title} projections by FFT (Choromanski & Fagan {where}).

    The P-model family ``{model}``: blocks of n rows (n = d, or n = p = 2^ceil(log2 d) with
    ``preprocess``), each built from its own budget g ~ N(0, I_t), t = {budget}: {formula}.
    Blocks are independent and the last one is truncated. Every P_i meets the normalisation and
    orthogonality conditions, so every row is exactly N(0, I_d); rows within a block share g and
    are dependent. Applying costs {cost} per block and input (``jnp.fft``, in at least
    float32); storage O(t) per block. ``p_model(key, dim, num_features, generator={model})``
    draws the same projection.

    With ``preprocess=True`` inputs are zero-padded to p and first rotated by one
    H D_3 H D_2 H D_1 (Step 1 of the algorithm, Eq. 12), shared by all blocks; rows stay exactly
    N(0, I_d) and blocks stay independent.

    Args:
      key: a PRNG key.
      dim: input dimension d >= 1.
      num_features: number of rows m >= 1.{extra_args}
      dtype: floating dtype of the budget.
      preprocess: apply the HD rotation first (then the block size is p).

    Returns:
      A ``PModelProjection`` whose ``model`` is ``{model}``.

    Examples:
      >>> import jax
      >>> w = {function}(jax.random.key(0), 5, 12{example_args})
      >>> w.matrix().shape, w.block_sizes()
      ((12, 5), (5, 5, 2))

    References:
      Choromanski & Fagan, "Fast nonlinear embeddings via structured matrices",
      arXiv:1604.07356, Eq. 3, {where}, 12-13.{extra_references}
    """


def _family_sampler(model: PModel) -> Callable[..., PModelProjection]:
    """The coupling ``(key, dim, num_features, *, dtype, preprocess)`` of a fixed family."""

    def sample(
        key: jax.Array,
        dim: int,
        num_features: int,
        *,
        dtype: DTypeLike = jnp.float32,
        preprocess: bool = False,
    ) -> PModelProjection:
        return p_model(key, dim, num_features, generator=model, preprocess=preprocess, dtype=dtype)

    sample.__name__ = sample.__qualname__ = model.name
    return sample


circulant = _family_sampler(Circulant())
skew_circulant = _family_sampler(SkewCirculant())
toeplitz = _family_sampler(Toeplitz())
hankel = _family_sampler(Hankel())


def low_displacement_rank(
    key: jax.Array,
    dim: int,
    num_features: int,
    *,
    rank: int = 1,
    dtype: DTypeLike = jnp.float32,
    preprocess: bool = False,
) -> PModelProjection:
    model = LowDisplacementRank(rank=rank)
    return p_model(key, dim, num_features, generator=model, preprocess=preprocess, dtype=dtype)


_FAMILIES = (
    (circulant, "circulant", "Circulant()", "Eq. 7-8", "n", "A_ij = g_{(j - i) mod n}"),
    (
        skew_circulant,
        "skew-circulant",
        "SkewCirculant()",
        "Sec. 2.2 item 4",
        "n",
        "A = Z_{-1}(g), A_ij = g_{i-j} (j <= i), -g_{i-j+n} (j > i)",
    ),
    (toeplitz, "Toeplitz", "Toeplitz()", "Eq. 9-10", "2n - 1", "A_ij = g_{j - i + n - 1}"),
    (hankel, "Hankel", "Hankel()", "Sec. 2.2 item 3", "2n - 1", "A_ij = g_{i + j}"),
    (
        low_displacement_rank,
        "low-displacement-rank",
        "LowDisplacementRank(rank)",
        "Eq. 11",
        "rank * n",
        "A = sum_r Z_1(g_r) Z_{-1}(h_r) with h_r rescaled to meet the orthogonality condition "
        "(see ``LowDisplacementRank``)",
    ),
)

for _function, _title, _model, _where, _budget, _formula in _FAMILIES:
    _ldr = _function is low_displacement_rank
    _function.__doc__ = _FAMILY_DOC.format(
        title=_title,
        model=_model,
        where=_where,
        budget=_budget,
        formula=_formula,
        cost="O(rank n log n)" if _ldr else "O(n log n)",
        function=_function.__name__,
        extra_args=("\n      rank: the number of terms r, 1 <= r <= n (t = r n)." if _ldr else ""),
        example_args=", rank=2" if _ldr else "",
        extra_references=(
            '\n      Sindhwani, Sainath, Kumar, "Structured transforms for small-footprint deep'
            '\n      learning", NeurIPS 2015, arXiv:1510.01722 (Z_1, Z_{-1}).'
            if _ldr
            else ""
        ),
    )
