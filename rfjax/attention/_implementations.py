"""Which computation ``favor_attention(..., implementation=...)`` runs: one table, one entry per
implementation (where it compiles, and how), and ``"auto"``'s choice.

* ``"xla"``: the XLA form (every feature map, sequence parallelism, every platform);
* ``"pallas_triton"``: the fused Pallas kernels (``_fused``) compiled by Triton, for NVIDIA GPUs
  of compute capability 8.0 and newer (JAX's Pallas Triton backend; sm90 runs it too);
* ``"pallas_tpu"``: the same kernels compiled by Mosaic for TPUs;
* ``"pallas_mosaic_gpu"``: kernels in Mosaic GPU's idiom, sm90+: bidirectional attention
  (forward ``_fused_mosaic_gpu``, backward ``_fused_mosaic_gpu_grads``) and causal attention
  (``_fused_mosaic_gpu_causal``, ``_fused_mosaic_gpu_causal_grads``: where every head's row
  shifts are within reach, else the Triton kernels, both passes); bfloat16 inputs and the
  affine maps with m a multiple of 64 only (``check_fusable`` says so for the rest), heads of
  H <= 64 with values up to 256 wide or H <= 128 with values up to 128 (shared memory:
  ``_fused_mosaic_gpu.check_rows``). Not yet timed on a GPU, so ``"auto"`` never picks it;
* ``"pallas_triton_interpret"``, ``"pallas_tpu_interpret"``, ``"pallas_mosaic_gpu_interpret"``:
  the kernels in Pallas' interpret mode on any platform (the TPU's simulator for the second,
  Mosaic GPU's for the third's forward pass), how they are tested on CPU; the names follow
  ``rfjax.ops.fwht``'s backends (``"<backend>_interpret"``).

The fused kernels take the maps whose log-features are affine in the rows plus a multiple of
|x|^2 (``ExponentialFeatureMap.affine_log_form``: FAVOR+, its antithetic variant, OPRF) and
the angular hybrid (``AngularHybridFeatureMap``: its positive and trigonometric bases and sign
channels formed inside the kernels); any other map, a sequence split over devices, or
``stabilize=False`` raise ``ValueError`` naming the map and the maps the kernels take.

``"auto"`` picks from ``AUTO``, a measured table of (platform, mode, dtype) -> implementation
filled from benchmark runs on that platform (``benchmarks/attention_gpu.py``, raw figures under
``benchmarks/gpu_runs/``), and ``"xla"`` where nothing was measured or where the measured
implementation does not take the call (a map the kernels do not fuse, heads or values wider
than they take, ``sequence_axis``, ``stabilize=False``; ``favor_attention`` asks
``_fused.fusable``). The GPU entries were measured on
an H200 and are taken on compute capability 9.0 and newer only (``AUTO_MIN_CAPABILITY``).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

from rfjax.attention._fused import Backend

Implementation = Literal[
    "auto",
    "xla",
    "pallas_triton",
    "pallas_tpu",
    "pallas_mosaic_gpu",
    "pallas_triton_interpret",
    "pallas_tpu_interpret",
    "pallas_mosaic_gpu_interpret",
]
IMPLEMENTATIONS: tuple[str, ...] = typing.get_args(Implementation)


@dataclasses.dataclass(frozen=True)
class Entry:
    """One implementation: the platforms it compiles for (``()``: any) and the fused kernels'
    backend (``None``: the XLA form)."""

    platforms: tuple[str, ...]
    backend: Backend | None


TABLE: dict[str, Entry] = {
    "xla": Entry((), None),
    "pallas_triton": Entry(("gpu",), Backend("triton")),  # jax.default_backend() of CUDA
    "pallas_tpu": Entry(("tpu",), Backend("tpu")),
    "pallas_mosaic_gpu": Entry(("gpu",), Backend("mosaic_gpu")),
    "pallas_triton_interpret": Entry((), Backend(None)),
    "pallas_tpu_interpret": Entry((), Backend(None, interpret="tpu")),
    "pallas_mosaic_gpu_interpret": Entry((), Backend(None, interpret="mosaic_gpu")),
}

# (platform, "causal" or "bidirectional", compute dtype) -> what ``"auto"`` picks, from measured
# runs only. ``benchmarks/gpu_runs/2026-11-30-h200`` (H200, B = 8, 8 heads x 64, m = 256 FAVOR+
# features, T = 4k ... 64k, bfloat16): bidirectional, the fused kernels took 0.47-0.57x the XLA
# form's time forward and 0.72-0.78x forward + backward at every T; causal, 1.3-1.4x (the XLA
# form stays). float32 and other GPUs were not measured.
AUTO: dict[tuple[str, str, str], str] = {
    ("gpu", "bidirectional", "bfloat16"): "pallas_triton",
}
# The oldest CUDA compute capability the GPU entries of ``AUTO`` hold for (they were measured on
# sm90; Triton's kernels compile from sm80, but nothing older than sm90 was measured).
AUTO_MIN_CAPABILITY = (9, 0)


def auto_choice(
    platform: str, *, causal: bool, dtype: str, capability: tuple[int, int] | None = None
) -> str:
    """What ``"auto"`` picks on ``platform`` for a call of ``dtype`` (its inputs' dtype's name),
    before asking whether the kernels take the call: ``AUTO``'s measured entry, else ``"xla"``.
    ``capability``: the CUDA device's (major, minor) on ``platform="gpu"``."""
    mode = "causal" if causal else "bidirectional"
    choice = AUTO.get((platform, mode, dtype), "xla")
    if platform == "gpu" and (capability is None or capability < AUTO_MIN_CAPABILITY):
        return "xla"
    return choice


def resolve(implementation: object, platform: str) -> Entry:
    """The ``Entry`` of ``implementation`` on ``platform``; ``"auto"`` is the XLA form's entry
    here (``auto_choice`` and ``favor_attention`` pick a measured fused entry per call).

    Raises:
      ValueError: for an unknown name, or an implementation that does not compile for
        ``platform``.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"implementation must be one of {', '.join(map(repr, IMPLEMENTATIONS))}; got "
            f"{implementation!r}"
        )
    entry = TABLE["xla" if implementation == "auto" else str(implementation)]
    if entry.platforms and platform not in entry.platforms:
        raise ValueError(
            f"implementation={implementation!r} compiles for {', '.join(entry.platforms)}, not "
            f"for platform {platform!r}; use implementation='auto' (or "
            f"'pallas_triton_interpret' to run the kernels in interpret mode)"
        )
    return entry
