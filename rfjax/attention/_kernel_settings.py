"""The fused FAVOR kernels' settings (``fused_kernel_settings``): Triton's launch parameters,
the features per call of the affine maps' cotangent kernels, and how the causal kernels form
each block's weights against its own keys. ``IN_FORCE`` holds the settings that programs traced
now get: the kernels read it when they are traced, and ``favor_attention`` passes it to its
compiled program as a static argument, so that a call under other settings compiles afresh
rather than reuse a program traced under these."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Literal

from rfjax._validation import check_choice

DiagonalForm = Literal["chunk", "factored", "pairs"]
WARP_COUNTS = (1, 2, 4, 8, 16)  # what Triton takes as num_warps
FEATURE_TILE_CHOICES = (16, 32, 64, 128, 256, 512)  # cotangent_features: Triton's widths
DIAGONAL_FORMS: tuple[DiagonalForm, ...] = ("chunk", "factored", "pairs")


@dataclasses.dataclass(frozen=True)
class KernelSettings:
    """The fused kernels' settings.

    Attributes:
      num_warps: Triton warps per program. Four: at m = 256 on sm90 the causal output and
        cotangent kernels spill 1,524 and 1,296 bytes per thread with 4 warps, 108 and 424 with
        8 (benchmarks/results/triton_kernels/kernels_ptxas_diagonal_7ad0d0b.json); which is
        faster is a GPU's to measure (``benchmarks.attention_gpu --triton-warps``), so the
        kernels keep the warps they were measured with (benchmarks/gpu_runs/2026-11-30-h200).
      num_stages: Triton's pipeline stages. One: software pipelining's buffers took the causal
        cotangent kernel at m = 128 to 235,520 bytes of shared memory per block with two, over
        an H100's 232,448; with one, 147,456 (tools/triton_kernels.py, triton 3.5.0). Since
        that kernel holds one block at a time (102,400 bytes with one stage), every kernel fits
        on an H100 with two; whether two are faster is a GPU's to measure.
      cotangent_features: features per call of the affine maps' cotangent kernels. Their
        shared memory per block grows with the features (at m = 256 the causal one needed
        253,952 bytes with one stage, the bidirectional ones 245,760 and 278,528, over an
        H100's 232,448; at m = 128, 147,456 at most: tools/triton_kernels.py). Every term of
        the affine maps' cotangents is one feature's, or a sum over the features (the rows'
        cotangents), so wider maps run one call per tile of features.
      diagonal_form: how the affine maps' causal kernels form each block's weights against its
        own keys: ``"pairs"``, per pair (B m exponentials per row, B = 16); ``"factored"``, as
        products of a factor per row and one per key (2m exponentials per row and a B x m by
        m x B product) wherever that is exact (``_log_chunk.factored_bound``), else per
        pair: one branch per block. Both are exact to the same tolerance. Pairs: the kernels
        were measured so (benchmarks/gpu_runs/2026-11-30-h200). Which is faster is a GPU's to
        measure (``benchmarks.attention_gpu --diagonal-form``): at m = 256 on sm90 with 4
        warps the factored forms spill more in the output kernel (2,212 bytes per thread
        against 1,524) and about as much in the cotangent kernel (1,368 against 1,296;
        tools/triton_kernels.py, benchmarks/results/triton_kernels/). ``"chunk"``: the
        output kernel forms each block of rows against every key of its chunk up to the block's
        end and the earlier chunks' state as products of factors relative to the chunk's start
        and first key (2m exponentials per row and a B x m by m x C product, as the XLA form
        forms a chunk, ``_log_chunk.Tame``) wherever every such key is tame, else by blocks and
        per pair; the cotangent kernel forms each block of queries against the chunk's keys and
        each block of keys against the chunk's queries the same way, where that block's keys
        are tame (``_fused_kernels._ChunkCotangents``). At m = 256 on sm90 the output kernel
        spills 2,612 bytes per thread with 4 warps and 188 with 8, the cotangent kernel 1,656
        and 1,284 (both branches are in each kernel; tools/triton_kernels.py).
    """

    num_warps: int = 4
    num_stages: int = 1
    cotangent_features: int = 128
    diagonal_form: DiagonalForm = "pairs"

    @property
    def triton_parameters(self) -> dict[str, int]:
        """Triton's launch parameters: ``num_warps`` and ``num_stages``."""
        return {"num_warps": self.num_warps, "num_stages": self.num_stages}


IN_FORCE = KernelSettings()


@contextlib.contextmanager
def fused_kernel_settings(
    *,
    num_warps: int | None = None,
    cotangent_features: int | None = None,
    diagonal_form: DiagonalForm | None = None,
) -> Iterator[dict[str, int | str]]:
    """Settings of the fused FAVOR kernels (``implementation="pallas_..."``) for the calls made
    and the programs traced inside the ``with`` block, for tuning them on a GPU; outside it the
    defaults return. ``favor_attention`` compiles a call under other settings afresh; a
    function that calls it and was jitted before the block keeps the settings it was traced
    with.

    Args:
      num_warps: Triton warps per program (``WARP_COUNTS``; default 4, as the kernels were
        measured on GPUs).
      cotangent_features: features per call of the affine maps' cotangent kernels (a power of
        two from 16 to 512; default 128, whose shared memory fits every NVIDIA GPU from sm80).
      diagonal_form: how the affine maps' causal kernels form each block's weights against its
        own keys (``DIAGONAL_FORMS``): ``"pairs"`` (default) per pair; ``"factored"`` as
        products of a factor per row and one per key wherever that is exact, else per pair;
        ``"chunk"``, each block of rows against all its chunk's keys and the state (and in
        the backward pass each block of keys against all its chunk's queries) as one product
        of factors wherever that is exact, else by blocks. All are exact to the same
        tolerance (``KernelSettings``).

    Yields:
      The settings in force: ``num_warps``, ``num_stages``, ``cotangent_features`` and
      ``diagonal_form``.

    Raises:
      ValueError: for a value not among those allowed, naming them.

    Examples:
      >>> from rfjax import attention
      >>> with attention.fused_kernel_settings(num_warps=8) as settings:
      ...     settings["num_warps"], settings["cotangent_features"], settings["diagonal_form"]
      (8, 128, 'pairs')
    """
    global IN_FORCE
    changes: dict[str, int | str] = {}
    if num_warps is not None:
        changes["num_warps"] = check_choice("num_warps", num_warps, WARP_COUNTS)
    if cotangent_features is not None:
        changes["cotangent_features"] = check_choice(
            "cotangent_features", cotangent_features, FEATURE_TILE_CHOICES
        )
    if diagonal_form is not None:
        changes["diagonal_form"] = check_choice("diagonal_form", diagonal_form, DIAGONAL_FORMS)
    saved = IN_FORCE
    try:
        IN_FORCE = dataclasses.replace(saved, **changes)  # type: ignore[arg-type]
        yield dataclasses.asdict(IN_FORCE)
    finally:
        IN_FORCE = saved
