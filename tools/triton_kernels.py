"""Compiles the fused FAVOR kernels (``implementation="pallas_triton"``) for NVIDIA GPUs without
one: each kernel's shared memory per block against the GPU's limit, and its registers and
spills.

  python tools/triton_kernels.py --triton-python PATH [--archs 80 90] [--features 128 256]
      [--maps affine angular_hybrid] [--ptxas] [--warps N ...]
      [--diagonal-forms chunk factored pairs] [--json PATH]

Step 1 (this interpreter, with JAX): the forward and backward passes of
``rfjax.attention._fused.fused_attention_sums`` (the benchmark's head: H = H_v = 64, T = 256,
bfloat16 products), causal and bidirectional, lowered for an abstract A100 (sm80) or H100
(sm90) as in ``tests/rfjax/attention/test_fused.py``. Each Triton kernel is the ``ir`` of a
``__gpu$xla.gpu.triton`` custom call (MLIR bytecode, with its ``num_warps`` and
``num_stages``); it is printed as text with jaxlib's Triton dialect.

Step 2 (``--triton-python``: an interpreter with the ``triton`` package, run as a separate
process, since two copies of LLVM must not share one): triton's CUDA backend compiles each text
to TTGIR, LLVM IR and PTX with the kernel's ``num_warps`` and ``num_stages``; the LLVM stage
gives the shared memory per block, and the PTX the number of matrix-multiply instructions of each
kind (``matrix_instructions``). With ``--ptxas`` the PTX goes through the ``ptxas`` that the
triton wheel bundles: registers per thread and spill stores. The Triton that XLA uses on a GPU
is the one built into jaxlib's CUDA plugin, not this one, so the figures are those of the same
TTIR under triton's own passes (checked with triton 3.5.0 and jaxlib 0.12.0.1).

A kernel whose shared memory exceeds the GPU's opt-in limit per block (``SHARED_LIMIT``) does
not launch there. The JSON (``--json``) holds one row per kernel, case and GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

# Opt-in shared memory per block (bytes): A100 (sm80) 163 KiB, H100/H200 (sm90) 227 KiB.
SHARED_LIMIT = {80: 166_912, 90: 232_448}
DEVICE_KIND = {80: "NVIDIA A100-SXM4-80GB", 90: "NVIDIA H100 80GB HBM3"}
TRITON_CALL = "__gpu$xla.gpu.triton"


# ------------------------------------------------------------------ step 1: JAX lowering


H100 = dict(device_kind=DEVICE_KIND[90], platform="gpu", num_cores=132)


def fused_gradients(fmap: str, causal: bool, backend: str, rows=lambda x: x):
    """``gradients(w, b, q, k, v, valid)``: the gradients of sum(num) + sum(den) of
    ``rfjax.attention._fused.fused_attention_sums`` (bfloat16 products) with respect to the
    map's parameters and the rows, for ``fmap`` "affine" (FAVOR+'s form; b its bias) or
    "angular_hybrid" (b its sign projection); ``rows`` takes one sequence from each row
    argument (the identity, or ``x[0]`` for a shard of a batch)."""
    import functools

    import jax
    import jax.numpy as jnp

    from rfjax import features as rf_features
    from rfjax.attention import _fused

    def make(weights, aux):
        if fmap == "affine":
            return rf_features.AffineLogForm(weights, aux, -0.5)
        return _fused.AngularHybridForm(weights, aux)

    fused = functools.partial(
        _fused.fused_attention_sums,
        causal=causal,
        backend=_fused.Backend(backend),
        matmul_dtype=jnp.bfloat16,
    )

    def gradients(w, b, q, k, v, valid):
        def loss(w, b, q, k, v):
            num, den = fused(make(w, b), *map(rows, (q, k, v, valid)))
            return jnp.sum(num) + jnp.sum(den)

        return jax.grad(loss, argnums=(0, 1, 2, 3, 4))(w, b, q, k, v)

    return gradients


def argument_shapes(
    fmap: str, features: int, batch: tuple[int, ...] = (), backend: str = "triton"
) -> list:
    """The arguments of ``fused_gradients``'s function: the benchmark's head (H = H_v = 64),
    T = 256, queries and keys as ``favor_attention`` passes bfloat16 inputs' to ``backend``'s
    kernels (float32, scaled; bfloat16 for ``"mosaic_gpu"``: ``_fused._head_rows``), bfloat16
    values, ``batch`` leading the rows."""
    import jax
    import jax.numpy as jnp

    head, length, signs = 64, 256, 8
    aux = (features,) if fmap == "affine" else (signs, head)
    shapes = [jax.ShapeDtypeStruct(s, jnp.float32) for s in [(features, head), aux]]
    rows = (*batch, length, head)
    row_dtype = jnp.bfloat16 if backend == "mosaic_gpu" else jnp.float32
    shapes += [jax.ShapeDtypeStruct(rows, row_dtype)] * 2
    shapes += [jax.ShapeDtypeStruct(rows, jnp.bfloat16)]
    return [*shapes, jax.ShapeDtypeStruct((*batch, length), bool)]


def lowered_program(fmap, features, causal, *, backend="triton", platform="cuda", device=H100):
    """``fused_gradients`` jitted and lowered for an abstract ``device`` (keyword arguments
    of ``jax.sharding.AbstractDevice``) on ``platform``: nothing is compiled for it."""
    import jax

    gradients = fused_gradients(fmap, causal, backend)
    mesh = jax.sharding.AbstractMesh((), (), abstract_device=jax.sharding.AbstractDevice(**device))
    with jax.sharding.use_abstract_mesh(mesh):
        shapes = argument_shapes(fmap, features)
        return jax.jit(gradients).trace(*shapes).lower(lowering_platforms=(platform,))


def lowered_module(arch: int, fmap: str, features: int, causal: bool):
    """The forward and backward passes lowered for an abstract A100 (80) or H100 (90)."""
    device = {"device_kind": DEVICE_KIND[arch], "platform": "gpu", "num_cores": 132}
    if arch == 80:
        device["num_cores"] = 108
    return lowered_program(fmap, features, causal, device=device)


def triton_kernels(lowered) -> list[dict]:
    """Every Triton kernel of a lowered program, in program order: name, num_warps,
    num_stages and the module as text (jaxlib's Triton dialect)."""
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib.mlir import ir
    from jaxlib.triton import dialect

    kernels = []

    def visit(operation) -> None:
        for region in operation.regions:
            for block in region.blocks:
                for inner in block.operations:
                    attributes = inner.operation.attributes
                    is_call = inner.operation.name == "stablehlo.custom_call"
                    if is_call and attributes["call_target_name"].value == TRITON_CALL:
                        kernels.append(_kernel(attributes["mhlo.backend_config"]))
                    visit(inner.operation)

    def _kernel(config) -> dict:
        context = jax_mlir.make_ir_context()
        dialect.register_dialect(context)
        with context:
            module = ir.Module.parse(config["ir"].value_bytes)
            text = module.operation.get_asm(enable_debug_info=False)
        return {
            "kernel": config["name"].value,
            "num_warps": int(config["num_warps"].value),
            "num_stages": int(config["num_stages"].value),
            "ttir": text,
        }

    visit(lowered.compiler_ir("stablehlo").operation)
    return kernels


# ------------------------------------------------------- step 2: triton (separate process)


def compile_kernels(folder: str, arch: int, ptxas: bool) -> list[dict]:
    """Worker, run by the interpreter with ``triton``: every ``*.json`` kernel in ``folder``
    compiled for sm_``arch``."""
    from triton._C.libtriton import ir  # type: ignore[import-not-found]
    from triton.backends.compiler import GPUTarget, Language  # type: ignore[import-not-found]
    from triton.backends.nvidia.compiler import (  # type: ignore[import-not-found]
        CUDABackend,
        get_ptxas,
    )

    backend = CUDABackend(GPUTarget("cuda", arch, 32))
    rows = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        with open(os.path.join(folder, name)) as file:
            kernel = json.load(file)
        options = backend.parse_options(
            {"num_warps": kernel["num_warps"], "num_stages": kernel["num_stages"]}
        )
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        path = os.path.join(folder, name.replace(".json", ".ttir"))
        with open(path, "w") as file:
            file.write(kernel["ttir"])
        module = ir.parse_mlir_module(path, context)
        module.context = context
        stages: dict = {}
        backend.add_stages(stages, options, Language.TRITON)
        metadata: dict = {}
        source = module
        for stage in ("ttir", "ttgir", "llir", "ptx"):
            source = stages[stage](source, metadata)
        row = {"file": name, "shared_bytes": metadata["shared"], **matrix_instructions(source)}
        if ptxas:
            row.update(_ptxas(get_ptxas().path, source, arch))
        rows.append(row)
    return rows


def matrix_instructions(ptx: str) -> dict:
    """The kernel's matrix-multiply instructions in its PTX (static counts, not executions):
    Hopper's warpgroup ``wgmma.mma_async`` (products of 64 rows per warpgroup and more) and the
    warp-level ``mma.sync`` (16 rows per warp), which is all an sm80 has."""
    return {
        "wgmma": len(re.findall(r"\bwgmma\.mma_async\b", ptx)),
        "mma_sync": len(re.findall(r"\bmma\.sync\b", ptx)),
    }


def _ptxas(binary: str, ptx: str, arch: int) -> dict:
    """Registers per thread and spill stores (bytes) from ``ptxas -v``."""
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "kernel.ptx")
        with open(source, "w") as file:
            file.write(ptx)
        gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
        command = [binary, "-v", f"--gpu-name={gpu}", source, "-o", os.path.join(folder, "k.o")]
        done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        return {"ptxas_error": done.stderr[-500:]}
    registers = re.search(r"Used (\d+) registers", done.stderr)
    spills = re.search(r"(\d+) bytes spill stores", done.stderr)
    return {
        "registers": int(registers.group(1)) if registers else None,
        "spill_store_bytes": int(spills.group(1)) if spills else 0,
    }


# ----------------------------------------------------------------------------------- main


def measure(args) -> list[dict]:
    """Every kernel's row for each of ``args.warps`` and ``args.diagonal_forms`` (the kernels'
    own settings without them)."""
    from rfjax.attention import fused_kernel_settings

    rows = []
    for warps in args.warps or [None]:
        for form in args.diagonal_forms or [None]:
            with fused_kernel_settings(num_warps=warps, diagonal_form=form):
                rows += _measure(args)
    return rows


def _measure(args) -> list[dict]:
    from rfjax.attention import _kernel_settings

    diagonal_form = _kernel_settings.IN_FORCE.diagonal_form
    rows = []
    for arch in args.archs:
        with tempfile.TemporaryDirectory() as folder:
            cases = {}
            for fmap in args.maps:
                for features in args.features if fmap == "affine" else [128]:
                    for causal in (True, False):
                        lowered = lowered_module(arch, fmap, features, causal)
                        for index, kernel in enumerate(triton_kernels(lowered)):
                            mode = "causal" if causal else "bidirectional"
                            stem = f"{fmap}_{features}_{mode}_{index}"
                            case = {"map": fmap, "features": features, "mode": mode}
                            case |= {"arch": arch, "diagonal_form": diagonal_form}
                            cases[stem + ".json"] = {**case, **kernel}
                            with open(os.path.join(folder, stem + ".json"), "w") as file:
                                json.dump(kernel, file)
            command = [args.triton_python, os.path.abspath(__file__), "--worker", folder]
            command += ["--worker-arch", str(arch)] + (["--ptxas"] if args.ptxas else [])
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            for compiled in json.loads(done.stdout.splitlines()[-1]):
                case = cases[compiled.pop("file")]
                del case["ttir"]
                limit = SHARED_LIMIT[arch]
                rows.append({**case, **compiled, "shared_limit": limit})
                rows[-1]["fits"] = compiled["shared_bytes"] <= limit
                print(_line(rows[-1]), flush=True)
    return rows


def _line(row: dict) -> str:
    verdict = "fits" if row["fits"] else "OVER"
    text = (
        f"sm{row['arch']} {row['map']:>14} m={row['features']:<4} {row['mode']:>13} "
        f"{row['kernel']:<32} {row['diagonal_form']:>8} warps {row['num_warps']} "
        f"stages {row['num_stages']} "
        f"shared {row['shared_bytes']:>7} / {row['shared_limit']} {verdict}  "
        f"wgmma {row['wgmma']} mma.sync {row['mma_sync']}"
    )
    if "registers" in row:
        text += f"  registers {row['registers']} spills {row['spill_store_bytes']} B"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--triton-python", default=sys.executable)
    parser.add_argument("--archs", type=int, nargs="+", default=[80, 90])
    parser.add_argument("--features", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--maps", nargs="+", default=["affine", "angular_hybrid"])
    parser.add_argument("--ptxas", action="store_true", help="also registers and spills")
    parser.add_argument(
        "--warps", type=int, nargs="+", default=None, help="num_warps (default: the kernels')"
    )
    parser.add_argument(
        "--diagonal-forms",
        nargs="+",
        default=None,
        help="the causal kernels' diagonal_forms (fused_kernel_settings checks them; default: "
        "the kernels')",
    )
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker-arch", type=int, default=90, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(compile_kernels(args.worker, args.worker_arch, args.ptxas)))
        return
    rows = measure(args)
    if args.json:
        import jax
        import jaxlib

        versions = subprocess.run(
            [args.triton_python, "-c", "import triton; print(triton.__version__)"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        report = {
            "commit": commit,
            "jax": jax.__version__,
            "jaxlib": jaxlib.__version__,
            "triton": versions,
            "rows": rows,
        }
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as file:
            json.dump(report, file, indent=1)
        print(f"written: {args.json}")


if __name__ == "__main__":
    main()
