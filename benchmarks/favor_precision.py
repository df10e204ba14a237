"""How far FAVOR computed in float32 and bfloat16 is from the same estimator in float64.

  python -m benchmarks.favor_precision [--length 1024] [--out benchmarks/results/favor_precision]

Accuracy of the computation, not of the estimator (``benchmarks.favor_error`` is the estimator's
distance to softmax attention): for inputs rounded to each dtype, the output of
``favor_attention`` in that dtype against ``favor_attention`` on the same rounded inputs and the
same projection in float64 (``jax.enable_x64``), FAVOR+ (``"positive"``), causal and
bidirectional, B = 1, T = ``--length``, 4 heads of H = 64, m = 128 (orthogonal, shared), values
N(0, 1), queries and keys with i.i.d. N(0, sigma^2) entries for |q| = |k| about 1, 4, 30 and 120
(sigma = |q| / sqrt(H)). Two errors per case: the largest |out - ref| over all entries divided by
the largest |value| (the scale of the products' rounding: a causal bfloat16 product term carries
at most 3u, u = 2^-8, see ``tests/rfjax/attention/test_favor.py::test_bfloat16_inputs``), and the
relative Frobenius error |out - ref|_F / |ref|_F. The table is in docs/maths/attention.md
("Precision").
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from rfjax.attention import draw_projection, favor_attention

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "favor_precision"
HEADS, HEAD_DIM, NUM_FEATURES = 4, 64, 128
NORMS = (1.0, 4.0, 30.0, 120.0)
DTYPES = ("float32", "bfloat16")


def inputs(length: int, norm: float, dtype: str) -> tuple[np.ndarray, ...]:
    """q, k, v rounded to ``dtype``, returned as float64 arrays (the values that dtype holds)."""
    keys = jax.random.split(jax.random.key(int(norm * 10) + length), 3)
    sigma = norm / np.sqrt(HEAD_DIM)
    shape = (1, length, HEADS, HEAD_DIM)
    q, k = (sigma * jax.random.normal(key, shape) for key in keys[:2])
    v = jax.random.normal(keys[2], shape)
    return tuple(np.asarray(x.astype(dtype).astype(jnp.float32), np.float64) for x in (q, k, v))


def errors(length: int, norm: float, dtype: str, causal: bool) -> dict:
    q, k, v = inputs(length, norm, dtype)
    projection = draw_projection(jax.random.key(7), HEAD_DIM, NUM_FEATURES, coupling="orthogonal")
    narrow = [jnp.asarray(x, dtype) for x in (q, k, v)]
    computed = favor_attention(narrow[0], narrow[1], narrow[2], projection, causal=causal)
    out = np.asarray(computed.astype(jnp.float32), np.float64)
    with jax.enable_x64(True):
        wide = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), projection)
        q64, k64, v64 = (jnp.asarray(x) for x in (q, k, v))
        ref = np.asarray(favor_attention(q64, k64, v64, wide, causal=causal))
    difference = np.abs(out - ref)
    return {
        "dtype": dtype,
        "norm": norm,
        "mode": "causal" if causal else "bidirectional",
        "max_error_over_max_value": float(difference.max() / np.abs(v).max()),
        "relative_frobenius": float(np.linalg.norm(out - ref) / np.linalg.norm(ref)),
        "finite": bool(np.all(np.isfinite(out))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args()
    rows = [
        errors(args.length, norm, dtype, causal)
        for dtype in DTYPES
        for causal in (True, False)
        for norm in NORMS
    ]
    print(f"{'dtype':9} {'mode':14} {'|q|':>5} {'max err / max|v|':>17} {'rel. Frobenius':>15}")
    for row in rows:
        print(
            f"{row['dtype']:9} {row['mode']:14} {row['norm']:5.0f} "
            f"{row['max_error_over_max_value']:17.2e} {row['relative_frobenius']:15.2e}"
        )
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"jax": jax.__version__, "device": jax.devices()[0].device_kind, "rows": rows}
    report["length"] = args.length
    report["load_average"] = os.getloadavg()[0]
    (out / f"{jax.default_backend()}.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
