"""Which computation ``favor_attention(..., implementation=...)`` runs: one table, one entry per
implementation (where it compiles, and how), and ``"auto"``'s choice.

* ``"xla"``: the XLA form (every feature map, sequence parallelism, every platform);
* ``"pallas_triton"``: the fused Pallas kernels (``_fused``) compiled by Triton, for NVIDIA GPUs
  of compute capability 8.0 and newer (JAX's Pallas Triton backend; sm90 runs it too);
* ``"pallas_tpu"``: the same kernels compiled by Mosaic for TPUs;
* ``"pallas_triton_interpret"``, ``"pallas_tpu_interpret"``: the kernels in Pallas' interpret
  mode on any platform (the TPU's simulator for the second), how they are tested on CPU; the
  names follow ``rfjax.ops.fwht``'s backends (``"<backend>_interpret"``).

The fused kernels take the maps whose log-features are affine in the rows plus a multiple of
|x|^2 (``FeatureMap.affine_log_form``: FAVOR+, its antithetic variant, OPRF) and the angular
hybrid (``AngularHybridFeatureMap``: its positive and trigonometric bases and sign channels
formed inside the kernels); any other map, a sequence split over devices, or
``stabilize=False`` raise ``ValueError`` naming the map and the maps the kernels take.

``"auto"`` picks from ``AUTO``, measured tables of (platform, mode) -> implementation, filled from
a benchmark run on that platform (``benchmarks/attention_gpu.py``, raw figures under
``benchmarks/gpu_runs/``); where nothing has been measured it is ``"xla"``. No GPU or TPU run has
measured the kernels yet, so ``AUTO`` is empty.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

from rfjax.attention._fused import Backend

Implementation = Literal[
    "auto", "xla", "pallas_triton", "pallas_tpu", "pallas_triton_interpret", "pallas_tpu_interpret"
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
    "pallas_triton_interpret": Entry((), Backend(None)),
    "pallas_tpu_interpret": Entry((), Backend(None, interpret="tpu")),
}

# (platform, "causal" or "bidirectional") -> the implementation ``"auto"`` picks, from measured
# runs only (none yet).
AUTO: dict[tuple[str, str], str] = {}


def resolve(implementation: object, platform: str, *, causal: bool) -> Entry:
    """The ``Entry`` of ``implementation`` on ``platform`` (``"auto"`` resolved from ``AUTO``).

    Raises:
      ValueError: for an unknown name, or an implementation that does not compile for
        ``platform``.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"implementation must be one of {', '.join(map(repr, IMPLEMENTATIONS))}; got "
            f"{implementation!r}"
        )
    if implementation == "auto":
        mode = "causal" if causal else "bidirectional"
        implementation = AUTO.get((platform, mode), "xla")
    entry = TABLE[str(implementation)]
    if entry.platforms and platform not in entry.platforms:
        raise ValueError(
            f"implementation={implementation!r} compiles for {', '.join(entry.platforms)}, not "
            f"for platform {platform!r}; use implementation='auto' (or "
            f"'pallas_triton_interpret' to run the kernels in interpret mode)"
        )
    return entry
