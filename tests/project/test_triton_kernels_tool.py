"""``tools/triton_kernels.py`` up to its compile step: the Triton kernels of the fused FAVOR
passes, lowered for an abstract A100 or H100, each read back from its ``xla.gpu.triton`` call as
TTIR text with its launch parameters. The compile step needs the ``triton`` package, which the
test environment does not install; its figures are committed under
``benchmarks/results/triton_kernels/``."""

import pytest

from tests.support.tools import load_tool

CAUSAL = ["key_summary", "causal_output", "key_summary", "query_summary", "causal_cotangents"]
BIDIRECTIONAL = [
    *("key_summary", "readout", "key_summary", "query_summary"),
    *("query_cotangents", "key_cotangents"),
]


@pytest.mark.parametrize(
    ("arch", "fmap", "causal", "names"),
    [(90, "affine", True, CAUSAL), (80, "angular_hybrid", False, BIDIRECTIONAL)],
    ids=["sm90-affine-causal", "sm80-hybrid-bidirectional"],
)
def test_every_kernel_is_read_back_as_ttir_with_its_launch_parameters(arch, fmap, causal, names):
    tool = load_tool("triton_kernels")
    kernels = tool.triton_kernels(tool.lowered_module(arch, fmap, 128, causal))
    assert [kernel["kernel"] for kernel in kernels] == [f"rfjax_favor_{n}" for n in names]
    for kernel in kernels:
        assert kernel["ttir"].startswith(f"module @{kernel['kernel']}")
        assert f"tt.func public @{kernel['kernel']}" in kernel["ttir"]
        assert (kernel["num_warps"], kernel["num_stages"]) == (4, 1)


def test_matrix_instructions_are_counted_by_kind():
    """The PTX's warpgroup and warp-level products told apart (the tool's rows say which kind
    of tensor-core instruction each kernel's products became)."""
    ptx = "\n".join(
        [
            "wgmma.fence.sync.aligned;",
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%f1}, %rd1, %rd2;",
            "wgmma.commit_group.sync.aligned;",
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f2}, {%r1}, {%r2}, {%f3};",
            "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%f4}, {%r3}, {%r4}, {%f5};",
            "fma.rn.f32 %f6, %f7, %f8, %f9;",
        ]
    )
    assert load_tool("triton_kernels").matrix_instructions(ptx) == {"wgmma": 1, "mma_sync": 2}
