"""Tests of ``rfjax.attention._kernel_settings``: ``fused_kernel_settings`` reaches every
Triton kernel of the programs traced inside its block and only those, names the values it
takes, and makes ``favor_attention`` compile a call under other settings afresh (interpret
mode for the last)."""

import numpy as np
import pytest

from rfjax import attention
from tests.rfjax.attention.test_fused import DEVICES, TOOL, assert_close, operands
from tests.support.interpret_mode import INTERPRET_MODE


def test_kernel_settings_reach_every_triton_kernel_inside_the_block_only():
    """``attention.fused_kernel_settings`` (what ``benchmarks.attention_gpu --triton-warps`` and
    ``--cotangent-features`` set): programs traced inside the block launch every Triton kernel
    with its warps and run the cotangent kernels per tile of its features (m = 128 in tiles of
    64: two calls in the backward pass); after it the defaults are back, also after an error."""
    platform, device = DEVICES["triton"]

    def kernels():
        lowered = TOOL.lowered_program(
            "affine", 128, True, backend="triton", platform=platform, device=device
        )
        return TOOL.triton_kernels(lowered)

    with attention.fused_kernel_settings(num_warps=8, cotangent_features=64) as settings:
        inside = kernels()
    assert settings == {
        "num_warps": 8,
        "num_stages": 1,
        "cotangent_features": 64,
        "diagonal_form": "pairs",
    }
    assert {k["num_warps"] for k in inside} == {8}
    # One pipeline stage always: with two, the causal cotangent kernel at m = 128 needs more
    # shared memory than an H100 has (``KernelSettings.num_stages``).
    assert {k["num_stages"] for k in inside} == {1}
    assert [k["kernel"] for k in inside].count("rfjax_favor_causal_cotangents") == 2
    with pytest.raises(RuntimeError), attention.fused_kernel_settings(num_warps=2):
        raise RuntimeError
    after = kernels()
    assert {k["num_warps"] for k in after} == {4}
    assert {k["num_stages"] for k in after} == {1}
    assert [k["kernel"] for k in after].count("rfjax_favor_causal_cotangents") == 1
    with pytest.raises(ValueError, match="num_warps must be one of 1, 2, 4, 8, 16; got 3"):
        attention.fused_kernel_settings(num_warps=3).__enter__()
    with pytest.raises(ValueError, match="cotangent_features must be one of 16, 32"):
        attention.fused_kernel_settings(cotangent_features=100).__enter__()
    with pytest.raises(
        ValueError, match="diagonal_form must be one of 'chunk', 'factored', 'pairs'"
    ):
        attention.fused_kernel_settings(diagonal_form="pair").__enter__()


@INTERPRET_MODE
def test_calls_under_other_kernel_settings_compile_afresh():
    """``favor_attention`` compiles its program once per set of arguments; the kernel settings
    are one of them, so a call inside ``fused_kernel_settings`` does not reuse a program
    compiled outside it (until 2026-11-30 it did, and took the outside's settings). The two
    forms of the diagonal blocks round differently, so the outputs differ in their last bits
    (each within the tolerance of the XLA form's); after the block the first program is back."""
    q, k, v, mask, projection = operands(2, scale=2.0)

    def attend(implementation="pallas_triton_interpret"):
        return np.asarray(
            attention.favor_attention(
                q, k, v, projection, causal=True, mask=mask, implementation=implementation
            )
        )

    pairs = attend()
    with attention.fused_kernel_settings(diagonal_form="factored"):
        factored = attend()
    assert not np.array_equal(factored, pairs)
    np.testing.assert_array_equal(attend(), pairs)
    for out in (factored, pairs):
        assert_close(out, attend("xla"))
