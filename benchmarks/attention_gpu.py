"""FAVOR attention against cuDNN flash attention on a GPU (``python -m benchmarks.attention_gpu``).

For T = 1,024 ... 65,536, B = 4, 8 heads of dimension 64, m = 128 random features (orthogonal
projection shared by the heads), in bfloat16 and float32, bidirectional and causal: the jitted
forward and the jitted forward + backward (``value_and_grad`` of the sum of the outputs for q, k,
v) of

* ``favor``: ``rfjax.attention.favor_attention`` (softmax features, stabilised; causal with the
  default chunk size);
* ``cudnn``: ``jax.nn.dot_product_attention(..., implementation="cudnn")`` (flash attention),
  where cuDNN supports the dtype (float16/bfloat16; float32 is reported as unsupported);
* ``xla``: ``jax.nn.dot_product_attention(..., implementation="xla")`` (materialises the T x T
  scores), up to ``--xla-limit-gb`` of temporaries.

Times are medians over interleaved repeats (``benchmarks.timing``), fewer repeats at long T.
Reported: every time, the crossover per dtype, mode and pass (the first T at which FAVOR is
faster than cuDNN, or than XLA where cuDNN does not run), and FAVOR's growth from T to 2T
(linear attention: about 2).
"""

from __future__ import annotations

import argparse
import itertools
import json

import jax
import jax.numpy as jnp

from benchmarks.timing import time_interleaved
from rfjax.attention import draw_projection, favor_attention

BATCH, HEADS, HEAD_DIM, NUM_FEATURES = 4, 8, 64, 128
LENGTHS = tuple(1 << k for k in range(10, 17))
DTYPES = ("bfloat16", "float32")
MODES = ("bidirectional", "causal")
PASSES = ("forward", "forward_backward")


def _forward(method: str, causal: bool):
    if method == "favor":
        return lambda q, k, v, p: favor_attention(q, k, v, p, causal=causal)
    return lambda q, k, v, p: jax.nn.dot_product_attention(
        q, k, v, is_causal=causal, implementation=method
    )


def _with_grad(forward):
    def loss(q, k, v, p):
        return jnp.sum(forward(q, k, v, p).astype(jnp.float32))

    return jax.value_and_grad(loss, argnums=(0, 1, 2))


def _compile(fn, args):
    """The compiled function and its temporaries, or None and the reason it does not compile."""
    try:
        compiled = jax.jit(fn).lower(*args).compile()
    except Exception as error:  # e.g. cuDNN without support for the dtype
        return None, f"{type(error).__name__}: {str(error)[:200]}"
    analysis = compiled.memory_analysis()
    return compiled, None if analysis is None else int(analysis.temp_size_in_bytes)


def benchmark(length: int, dtype: str, repeats: int, xla_limit_bytes: float) -> list[dict]:
    keys = jax.random.split(jax.random.key(length), 4)
    shape = (BATCH, length, HEADS, HEAD_DIM)
    q, k, v = (jax.random.normal(key, shape, dtype) for key in keys[:3])
    projection = draw_projection(keys[3], HEAD_DIM, NUM_FEATURES, coupling="orthogonal")
    args = (q, k, v, projection)
    rows, functions = [], {}
    for mode in MODES:
        for method in ("favor", "cudnn", "xla"):
            forward = _forward(method, mode == "causal")
            for name, fn in (("forward", forward), ("forward_backward", _with_grad(forward))):
                row = {"length": length, "dtype": dtype, "mode": mode, "method": method}
                row |= {"pass": name, "median_s": None, "skipped": None}
                compiled, info = _compile(fn, args)
                if compiled is None:
                    row["skipped"] = info
                elif method == "xla" and info is not None and info > xla_limit_bytes:
                    row["skipped"] = f"temporaries {info / 1e9:.1f} GB > limit"
                else:
                    row["temp_bytes"] = info
                    functions[len(rows)] = lambda compiled=compiled: compiled(*args)
                rows.append(row)
    count = max(3, min(repeats, repeats * 4096 // length))
    timings = time_interleaved({str(i): fn for i, fn in functions.items()}, repeats=count)
    for index in functions:
        rows[index]["median_s"] = timings[str(index)]["median_s"]
        rows[index]["repeats"] = count
    return rows


def summarize(rows: list[dict]) -> dict:
    """Crossover T and FAVOR's growth from T to 2T per (dtype, mode, pass)."""
    times = {
        (r["dtype"], r["mode"], r["pass"], r["method"], r["length"]): r["median_s"] for r in rows
    }
    summary = {}
    for dtype in DTYPES:
        lengths = sorted({r["length"] for r in rows if r["dtype"] == dtype})
        for mode in MODES:
            for name in PASSES:
                case = (dtype, mode, name)
                favor = {t: times.get((*case, "favor", t)) for t in lengths}
                peer = {
                    t: times.get((*case, "cudnn", t)) or times.get((*case, "xla", t))
                    for t in lengths
                }
                beaten = [t for t in lengths if favor[t] and peer[t] and favor[t] < peer[t]]
                growth = {
                    f"{a}->{b}": favor[b] / favor[a]
                    for a, b in itertools.pairwise(lengths)
                    if favor[a] and favor[b]
                }
                summary[" ".join(case)] = {
                    "crossover_T": beaten[0] if beaten else None,
                    "growth": growth,
                }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--xla-limit-gb", type=float, default=16.0)
    parser.add_argument("--json", type=str, default=None, help="write the results here")
    args = parser.parse_args()
    if jax.default_backend() != "gpu":
        raise SystemExit(
            f"benchmarks.attention_gpu needs a GPU; the backend is {jax.default_backend()}"
        )
    rows = []
    for dtype in args.dtypes:
        for length in args.lengths:
            rows += benchmark(length, dtype, args.repeats, 1e9 * args.xla_limit_gb)
            print(f"  {dtype} T={length} done", flush=True)
    summary = summarize(rows)
    for row in rows:
        shown = (
            "skipped: " + row["skipped"] if row["skipped"] else f"{1e3 * row['median_s']:.2f} ms"
        )
        print(
            f"{row['dtype']:9s} T={row['length']:6d} {row['mode']:13s} {row['pass']:16s} "
            f"{row['method']:6s} {shown}"
        )
    for case, values in summary.items():
        print(f"{case}: crossover T = {values['crossover_T']}, FAVOR growth {values['growth']}")
    if args.json:
        report = {"device": str(jax.devices()[0].device_kind), "jax": jax.__version__}
        with open(args.json, "w") as f:
            json.dump(report | {"rows": rows, "summary": summary}, f, indent=2)


if __name__ == "__main__":
    main()
