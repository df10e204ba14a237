"""FAVOR attention on a GPU against exact attention and a linear-attention peer
(``python -m benchmarks.attention_gpu``).

For B = 1 and 8, 8 heads of dimension 64, m = 256 random features (orthogonal projection shared
by the heads), T = 1,024 ... 65,536, bfloat16 and float32, bidirectional and causal, the jitted
forward and forward + backward (``value_and_grad`` of the sum of the outputs for q, k, v) of

* ``favor``: ``rfjax.attention.favor_attention(..., implementation="xla")`` (FAVOR+
  ``"positive"`` features, stabilised; causal with the default chunk size), end to end from q,
  k, v;
* ``favor_pallas``: the same with ``implementation="pallas_triton"``, the fused Pallas kernels
  (the feature map computed inside them);
* ``favor_mosaic``: the same with ``implementation="pallas_mosaic_gpu"`` (sm90+), bfloat16 only
  (float32 is recorded as not compiled, with the reason): kernels in Mosaic GPU's idiom for
  both passes of bidirectional and causal attention (causal: where every head's row shifts are
  within reach, ``_fused_mosaic_gpu_causal``; the benchmark's inputs are);
* ``cudnn``: ``jax.nn.dot_product_attention(..., implementation="cudnn")`` (flash attention),
  where cuDNN takes the dtype (bfloat16; float32 is reported as not compiled);
* ``xla``: ``jax.nn.dot_product_attention(..., implementation="xla")`` (materialises the T x T
  scores), up to ``--xla-limit-gb`` of temporaries: where exact attention stops fitting;
* ``fla`` (causal only): flash-linear-attention's chunked linear attention
  (``fla.ops.linear_attn.chunk_linear_attn``, normalised, Triton kernels, PyTorch) on the same
  feature-mapped inputs phi(q), phi(k) (B, T, 8, 256) and v, handed over by DLPack; it starts from
  the features, so ``features`` (the jitted map q, k -> phi(q), phi(k) alone) is timed beside it.

Time: medians over interleaved repeats (``benchmarks.timing.time_interleaved``; the PyTorch calls
end with ``torch.cuda.synchronize``). Memory: a JAX program's compiled temporaries plus outputs
(``memory_analysis``); PyTorch's peak allocation above the inputs during the call. Both count what
the call adds to the inputs. The programs of one case are compiled in parallel threads.

Roofline (``measure_peaks``, in every run beside the cases): the dense matrix-product rate
(8192^3, bfloat16, and float32 at JAX's default precision) and the copy bandwidth. FAVOR's
products take the inputs' dtype (bfloat16 operands accumulated in float32 for bfloat16 inputs),
so its compute roof is the rate of that dtype. Model FLOPs per batch and head, causal, chunk
C = ``CHUNK``: T (4 H m + 2 C m + 2 C (H_v + 1) + 4 m (H_v + 1)) forward (features, the
chunk's quadratic form, the carried state's read-out and update), 3x that for forward +
backward; bidirectional T (4 H m + 4 m (H_v + 1)). The share of the roofline is
max(FLOPs / compute roof, minimal bytes / bandwidth) / time; XLA's own cost analysis (flops,
bytes accessed) is recorded beside it.

Summary: per dtype, B, mode and pass and per FAVOR implementation, the crossover (the first T at
which FAVOR is faster than exact attention: cuDNN, or XLA where cuDNN does not run), FAVOR's
growth from T to 2T, and FAVOR over the peers, among them ``fla+features`` (causal: the
linear-attention peer's time plus the feature map's, what FAVOR does end to end).
``--profile`` adds the GPU kernels of causal FAVOR forward + backward (the fused kernels' and
the XLA form's) from JAX's profiler (time per kernel name), to name what to optimise next.
``--triton-warps N`` compiles the fused kernels with N warps, ``--cotangent-features N`` runs
their cotangent kernels per tile of N features, ``--diagonal-form F`` forms the causal kernels'
diagonal blocks as ``F`` (``pairs``, the default, per pair; ``factored`` or ``chunk`` as products
of factors where exact: ``rfjax.attention.fused_kernel_settings``; all recorded in the JSON).
``--budget-s`` starts no new case after that many seconds; the JSON is written after every case.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import itertools
import tempfile
import time
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import save_json, time_interleaved
from rfjax import features
from rfjax.attention import (
    data_normalizer,
    draw_projection,
    favor_attention,
    fused_kernel_settings,
)

BATCHES = (8, 1)
HEADS, HEAD_DIM, NUM_FEATURES = 8, 64, 256
LENGTHS = tuple(1 << k for k in range(10, 17))
DTYPES = ("bfloat16", "float32")
MODES = ("bidirectional", "causal")
PASSES = ("forward", "forward_backward")
Method = Literal["favor", "favor_pallas", "favor_mosaic", "cudnn", "xla"]  # what _forward builds
METHODS: tuple[Method, ...] = ("favor", "favor_pallas", "favor_mosaic", "cudnn", "xla")
FAVOR_METHODS = {  # -> implementation
    "favor": "xla",
    "favor_pallas": "pallas_triton",
    "favor_mosaic": "pallas_mosaic_gpu",
}
CHUNK = 64  # the model FLOPs' chunk length (the fused kernels')


# --- the programs -----------------------------------------------------------------------------


def _forward(method: Method, causal: bool):
    if method in FAVOR_METHODS:
        implementation = FAVOR_METHODS[method]
        return lambda q, k, v, p: favor_attention(
            q, k, v, p, causal=causal, implementation=implementation
        )
    exact: Literal["cudnn", "xla"] = "cudnn" if method == "cudnn" else "xla"
    return lambda q, k, v, p: jax.nn.dot_product_attention(
        q, k, v, is_causal=causal, implementation=exact
    )


def _with_grad(forward):
    def loss(q, k, v, p):
        return jnp.sum(forward(q, k, v, p).astype(jnp.float32))

    return jax.value_and_grad(loss, argnums=(0, 1, 2))


def feature_map_program(q, k, p):
    """phi(q), phi(k) (B, T, N, m) in the input dtype: the FAVOR+ features of q H^-1/4."""
    fmap = features.get("positive")()

    def phi(x, side):
        rows = (x.astype(jnp.float32) * data_normalizer(x.shape[-1])).reshape(-1, x.shape[-1])
        return fmap.features(rows, p, side=side).reshape(*x.shape[:-1], -1).astype(x.dtype)

    return phi(q, "query"), phi(k, "key")


def _compile(fn, args):
    """(compiled, memory, cost) or (None, reason, None)."""
    try:
        compiled = jax.jit(fn).lower(*args).compile()
    except Exception as error:  # e.g. cuDNN without support for the dtype
        return None, f"{type(error).__name__}: {str(error)[:300]}", None
    analysis = compiled.memory_analysis()
    memory = (
        None
        if analysis is None
        else int(analysis.temp_size_in_bytes) + int(analysis.output_size_in_bytes)
    )
    try:
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        cost = {key: float(cost[key]) for key in ("flops", "bytes accessed") if key in cost}
    except Exception:  # cost analysis is best effort
        cost = None
    return compiled, memory, cost


# --- the PyTorch peer -------------------------------------------------------------------------


def _fla_functions(phi_q, phi_k, v):
    """flash-linear-attention's causal chunked kernel, forward and forward + backward, or the
    reason it cannot run."""
    try:
        import torch
        from fla.ops.linear_attn import chunk_linear_attn
    except Exception as error:
        return None, f"{type(error).__name__}: {error}"
    q, k, val = (torch.from_dlpack(x) for x in (phi_q, phi_k, v))

    def forward():
        out, _ = chunk_linear_attn(q, k, val, scale=1.0, normalize=True)
        torch.cuda.synchronize()
        return out

    grads = [t.detach().clone().requires_grad_(True) for t in (q, k, val)]

    def forward_backward():
        for t in grads:
            t.grad = None
        out, _ = chunk_linear_attn(*grads, scale=1.0, normalize=True)
        out.float().sum().backward()
        torch.cuda.synchronize()

    return {"forward": forward, "forward_backward": forward_backward}, None


def _torch_peak(fn) -> int:
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    return int(torch.cuda.max_memory_allocated() - base)


# --- one case ---------------------------------------------------------------------------------


def _inputs(batch: int, length: int, dtype: str):
    keys = jax.random.split(jax.random.key(length + batch), 4)
    shape = (batch, length, HEADS, HEAD_DIM)
    q, k, v = (jax.random.normal(key, shape, dtype) for key in keys[:3])
    projection = draw_projection(keys[3], HEAD_DIM, NUM_FEATURES, coupling="orthogonal")
    return q, k, v, projection


def benchmark(
    batch: int, length: int, dtype: str, repeats: int, xla_limit_bytes: float, check: bool
) -> list[dict]:
    args = _inputs(batch, length, dtype)
    jobs = {}
    for mode, method in itertools.product(MODES, METHODS):
        forward = _forward(method, mode == "causal")
        jobs[(mode, method, "forward")] = forward
        jobs[(mode, method, "forward_backward")] = _with_grad(forward)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        compiled = dict(
            zip(jobs, pool.map(lambda fn: _compile(fn, args), jobs.values()), strict=True)
        )
        features_compiled = pool.submit(_compile, feature_map_program, (args[0], args[1], args[3]))
    rows: list[dict[str, Any]] = []
    functions: dict[int, Callable[..., Any]] = {}  # zero-argument calls (lambda defaults)
    base: dict[str, Any] = {"length": length, "batch": batch, "dtype": dtype}
    for (mode, method, name), (fn, memory, cost) in compiled.items():
        row = base | {"mode": mode, "method": method, "pass": name, "median_s": None}
        if fn is None:
            row["skipped"] = memory
        elif method == "xla" and memory is not None and memory > xla_limit_bytes:
            row["skipped"] = f"temporaries {memory / 1e9:.1f} GB > limit"
        else:
            row |= {"memory_bytes": memory, "xla_cost": cost}
            functions[len(rows)] = lambda fn=fn: fn(*args)
        rows.append(row)
    feature_fn, feature_memory, _ = features_compiled.result()
    try:
        peers = _peer_rows(base, args, feature_fn, feature_memory, compiled, check)
    except Exception as error:  # the peer must not cost the JAX measurements
        peers = [
            (base | {"method": "fla", "error": f"{type(error).__name__}: {error}"[:400]}, None)
        ]
    for row, fn in peers:
        if fn is not None:
            functions[len(rows)] = fn
        rows.append(row)
    for index, fn in list(functions.items()):
        try:  # once before timing: a program that compiled can still fail on the device
            jax.block_until_ready(fn())
        except Exception as error:  # e.g. a kernel's launch: the other programs are timed
            del functions[index]
            reason = f"fails at run time: {type(error).__name__}: {str(error)[:300]}"
            rows[index]["skipped"] = reason
    count = max(3, min(repeats, repeats * 4096 // length))
    timings = time_interleaved({str(i): fn for i, fn in functions.items()}, repeats=count)
    for index in functions:
        rows[index] |= {"median_s": timings[str(index)]["median_s"], "repeats": count}
        rows[index] |= {key: timings[str(index)][key] for key in ("q25_s", "q75_s")}
    return rows


def _peer_rows(base, args, feature_fn, feature_memory, compiled, check) -> list[tuple]:
    """(row, function to time or None) for the feature map alone and for flash-linear-attention
    on its output (causal), and the check of FLA against FAVOR (``check``)."""
    if feature_fn is None:
        return []
    phi_q, phi_k = feature_fn(args[0], args[1], args[3])
    row = base | {"mode": "causal", "method": "features", "pass": "forward", "median_s": None}
    out: list[tuple[dict[str, Any], Callable[[], Any] | None]] = [
        (row | {"memory_bytes": feature_memory}, lambda: feature_fn(args[0], args[1], args[3]))
    ]
    fla, reason = _fla_functions(phi_q, phi_k, args[2])
    for name in PASSES:
        row = base | {"mode": "causal", "method": "fla", "pass": name, "median_s": None}
        if fla is None:
            out.append((row | {"skipped": reason}, None))
            continue
        try:
            out.append((row | {"memory_bytes": _torch_peak(fla[name])}, fla[name]))
        except Exception as error:  # e.g. a Triton compile failure
            out.append((row | {"skipped": f"{type(error).__name__}: {str(error)[:300]}"}, None))
    if check and fla is not None:
        favor = compiled[("causal", "favor", "forward")][0]
        out.append((base | _check_fla(fla, favor, args), None))
    return out


def _check_fla(fla, favor_forward, args) -> dict:
    """FLA's output against FAVOR's on the same inputs: max |difference| / max |FAVOR|."""
    ours = np.asarray(jnp.asarray(favor_forward(*args), jnp.float32))
    theirs = fla["forward"]().float().cpu().numpy()
    error = float(np.abs(theirs - ours).max() / np.abs(ours).max())
    return {"method": "fla_vs_favor", "max_relative_difference": error}


# --- peaks, roofline, summary -----------------------------------------------------------------


def measure_peaks() -> dict:
    """Dense matrix-product rates (bfloat16; float32 at default and highest precision) and the
    copy bandwidth of this device, measured now."""
    n = 8192
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    programs = {
        "matmul_bfloat16": (jax.jit(lambda x: x @ x), a.astype(jnp.bfloat16)),
        "matmul_float32_default": (jax.jit(lambda x: x @ x), a),
        "matmul_float32_highest": (
            jax.jit(lambda x: jnp.matmul(x, x, precision=jax.lax.Precision.HIGHEST)),
            a,
        ),
    }
    big = jnp.zeros((1 << 29,), jnp.float32)  # 2 GiB
    copy = jax.jit(lambda x: x + jnp.ones((), x.dtype))
    functions: dict[str, Callable[..., Any]] = {  # zero-argument calls (lambda defaults)
        name: (lambda f=f, x=x: f(x)) for name, (f, x) in programs.items()
    }
    functions["copy"] = lambda: copy(big)
    timings = time_interleaved(functions, repeats=10)
    peaks = {name: 2 * n**3 / timings[name]["median_s"] for name in programs}
    peaks = {f"{name}_flop_per_s": value for name, value in peaks.items()}
    peaks["copy_bytes_per_s"] = 2 * big.nbytes / timings["copy"]["median_s"]
    return peaks


def model_flops(row: dict) -> float:
    """Model FLOPs of FAVOR for a row (see the module docstring)."""
    t, h, m, hv = row["length"], HEAD_DIM, NUM_FEATURES, HEAD_DIM
    if row["mode"] == "causal":
        chunk = min(CHUNK, t)
        per_token = 4 * h * m + 2 * chunk * m + 2 * chunk * (hv + 1) + 4 * m * (hv + 1)
    else:
        per_token = 4 * h * m + 4 * m * (hv + 1)
    flops = row["batch"] * HEADS * t * per_token
    return flops * (3 if row["pass"] == "forward_backward" else 1)


def minimal_bytes(row: dict) -> float:
    """Reads of q, k, v and writes of the output (forward) or of the three gradients."""
    itemsize = jnp.dtype(row["dtype"]).itemsize
    per_token = 4 * HEAD_DIM if row["pass"] == "forward" else 6 * HEAD_DIM
    return row["batch"] * HEADS * row["length"] * per_token * itemsize


def add_roofline(rows: list[dict], peaks: dict) -> None:
    for row in rows:
        if row.get("method") not in FAVOR_METHODS or not row.get("median_s"):
            continue
        flops, nbytes = model_flops(row), minimal_bytes(row)
        roof = "bfloat16" if row["dtype"] == "bfloat16" else "float32_default"
        compute = flops / peaks[f"matmul_{roof}_flop_per_s"]
        memory = nbytes / peaks["copy_bytes_per_s"]
        row["roofline"] = {
            "model_flops": flops,
            "minimal_bytes": nbytes,
            "achieved_flop_per_s": flops / row["median_s"],
            "bound": "compute" if compute >= memory else "memory",
            "share": max(compute, memory) / row["median_s"],
        }


def summarize(rows: list[dict]) -> dict:
    """Crossover T, growth from T to 2T and ratios to the peers per (dtype, B, mode, pass)."""
    times = {
        (r["dtype"], r["batch"], r["mode"], r["pass"], r["method"], r["length"]): r["median_s"]
        for r in rows
        if r.get("median_s")
    }
    summary = {}
    cases = itertools.product(DTYPES, BATCHES, MODES, PASSES, FAVOR_METHODS)
    for dtype, batch, mode, name, method in cases:
        case = (dtype, batch, mode, name)
        lengths = sorted({key[-1] for key in times if key[:4] == case})
        if not lengths:
            continue
        # Any: the rows' untyped times, or None where the method has none (tested before use)
        favor: dict[int, Any] = {t: times.get((*case, method, t)) for t in lengths}
        exact: dict[int, Any] = {
            t: times.get((*case, "cudnn", t)) or times.get((*case, "xla", t)) for t in lengths
        }
        beaten = [t for t in lengths if favor[t] and exact[t] and favor[t] < exact[t]]
        fits = [t for t in lengths if times.get((*case, "xla", t))]
        peers: dict[str, dict[int, float]] = {
            peer: {t: times[(*case, peer, t)] for t in lengths if times.get((*case, peer, t))}
            for peer in ("cudnn", "xla", "fla")
        }
        feature_times = {
            t: times[(dtype, batch, "causal", "forward", "features", t)]
            for t in lengths
            if times.get((dtype, batch, "causal", "forward", "features", t))
        }
        peers["fla+features"] = {
            t: fla + feature_times[t] for t, fla in peers["fla"].items() if t in feature_times
        }
        ratios = {
            f"{method}/{peer}": {t: favor[t] / peer_times[t] for t in peer_times if favor[t]}
            for peer, peer_times in peers.items()
        }
        summary[f"{dtype} B={batch} {mode} {name} {method}"] = {
            "crossover_T": beaten[0] if beaten else None,
            "exact_wins_at": [t for t in lengths if favor[t] and exact[t] and t not in beaten],
            "xla_exact_fits_up_to_T": max(fits) if fits else None,
            "favor_growth": {
                f"{a}->{b}": favor[b] / favor[a]
                for a, b in itertools.pairwise(lengths)
                if favor[a] and favor[b]
            },
            "ratios": {key: value for key, value in ratios.items() if value},
        }
    return summary


# --- profile ----------------------------------------------------------------------------------


def profile(batch: int, length: int, dtype: str, method: Method, top: int = 15) -> dict:
    """GPU time per kernel name of causal FAVOR forward + backward (JAX's profiler, 5 calls)."""
    from jax.profiler import ProfileData

    args = _inputs(batch, length, dtype)
    fn = jax.jit(_with_grad(_forward(method, True)))
    jax.block_until_ready(fn(*args))
    calls = 5
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder):
            for _ in range(calls):
                jax.block_until_ready(fn(*args))
        path = glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)[0]
        data = ProfileData.from_file(path)
        lines = {}
        for plane in data.planes:
            if not plane.name.startswith("/device:GPU"):
                continue
            for line in plane.lines:
                totals: dict[str, float] = {}
                for event in line.events:
                    totals[event.name] = totals.get(event.name, 0.0) + event.duration_ns
                if totals:
                    ranked = sorted(totals.items(), key=lambda item: -item[1])
                    lines[f"{plane.name} {line.name}"] = {
                        "total_ms_per_call": sum(totals.values()) / calls / 1e6,
                        "top_ms_per_call": {k: v / calls / 1e6 for k, v in ranked[:top]},
                    }
    return {
        "method": method,
        "batch": batch,
        "length": length,
        "dtype": dtype,
        "calls": calls,
        "lines": lines,
    }


def profile_or_reason(batch: int, length: int, dtype: str, method: Method) -> dict:
    """``profile``'s result, or the case and the error that stopped it (a kernel that does not
    compile for this GPU or these settings): the cases are still measured, as ``_compile``
    records a program that does not compile."""
    try:
        return profile(batch, length, dtype, method)
    except Exception as error:
        reason = f"{type(error).__name__}: {str(error)[:300]}"
        return {"method": method, "batch": batch, "length": length, "dtype": dtype, "error": reason}


def case_order(dtypes, batches, lengths) -> list[tuple[str, int, int]]:
    """Every (dtype, B, T): first T = 1k, 4k, 16k, 64k for each B and dtype, then the lengths
    between, so that a run cut short by its budget has a coarse grid of every case."""
    coarse = [t for t in lengths if (t.bit_length() - 1) % 2 == 0]
    fine = [t for t in lengths if t not in coarse]
    return [(d, b, t) for ts in (coarse, fine) for b in batches for d in dtypes for t in ts]


# --- main -------------------------------------------------------------------------------------


def _write(report: dict, args: argparse.Namespace) -> None:
    """The report so far to ``args.json`` (atomically: a step cut short by its time limit
    leaves the last whole one), with the run's arguments and load (``save_json``)."""
    if args.json:
        save_json(args.json, report, settings=vars(args))


def run(args: argparse.Namespace, settings: dict[str, int | str]) -> dict[str, Any]:
    """The peaks, the profiles and every case of ``args`` under the fused kernels' ``settings``
    (``fused_kernel_settings``), the JSON written after each case."""
    started = time.monotonic()
    report: dict[str, Any] = {
        "device": str(jax.devices()[0].device_kind),
        "jax": jax.__version__,
        "shape": {"heads": HEADS, "head_dim": HEAD_DIM, "num_features": NUM_FEATURES},
        "kernel_settings": settings,
        "peaks": measure_peaks(),
        "rows": [],
        "not_measured": [],
    }
    print(f"peaks: {report['peaks']}", flush=True)
    if args.profile:
        batch, length = args.profile  # nargs=2: exactly B and T
        report["profiles"] = [
            profile_or_reason(batch, length, "bfloat16", method)
            for method in ("favor_pallas", "favor")
        ]
        _write(report, args)
    cases = case_order(args.dtypes, args.batches, args.lengths)
    for dtype, batch, length in cases:
        if args.budget_s is not None and time.monotonic() - started > args.budget_s:
            report["not_measured"].append(f"{dtype} B={batch} T={length}")
            continue
        check = length == min(args.lengths)
        report["rows"] += benchmark(
            batch, length, dtype, args.repeats, 1e9 * args.xla_limit_gb, check
        )
        add_roofline(report["rows"], report["peaks"])
        report["summary"] = summarize(report["rows"])
        print(
            f"  {dtype} B={batch} T={length} done ({time.monotonic() - started:.0f} s)", flush=True
        )
        _write(report, args)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--xla-limit-gb", type=float, default=32.0)
    parser.add_argument("--budget-s", type=float, default=None, help="start no case after this")
    parser.add_argument("--profile", type=int, nargs=2, metavar=("B", "T"), default=None)
    parser.add_argument("--json", type=str, default=None, help="write the results here")
    # The fused kernels' launch (default: theirs; rfjax.attention.fused_kernel_settings).
    parser.add_argument("--triton-warps", type=int, help="num_warps of the fused kernels")
    parser.add_argument("--cotangent-features", type=int, help="features per cotangent call")
    parser.add_argument("--diagonal-form", help="the causal kernels' diagonal blocks")
    args = parser.parse_args()
    if jax.default_backend() != "gpu":
        raise SystemExit(
            f"benchmarks.attention_gpu needs a GPU; the backend is {jax.default_backend()}"
        )
    with fused_kernel_settings(
        num_warps=args.triton_warps,
        cotangent_features=args.cotangent_features,
        diagonal_form=args.diagonal_form,
    ) as settings:
        report = run(args, settings)
    _write(report, args)  # with the cases the budget left out
    for row in report["rows"]:
        if "median_s" not in row:
            print(row)
            continue
        shown = f"{1e3 * row['median_s']:.3f} ms" if row["median_s"] else row.get("skipped")
        print(
            f"{row['dtype']:9s} B={row['batch']} T={row['length']:6d} {row['mode']:13s} "
            f"{row['pass']:16s} {row['method']:12s} {shown}"
        )
    for case, values in report.get("summary", {}).items():
        print(f"{case}: crossover T = {values['crossover_T']}, ratios {values['ratios']}")


if __name__ == "__main__":
    main()
