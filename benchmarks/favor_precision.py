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

``--matmul-precision float32`` runs the float32 and bfloat16 computations under
``jax.default_matmul_precision`` (JAX's default otherwise: TF32 products on GPUs, one bfloat16
pass on TPUs); the file name says which (``<backend>_<precision>.json``).

``--projection-rounding`` (no FAVOR code runs): the float64 estimator with the operands of the
log-features' projection x' W^T rounded to TF32 (10 mantissa bits) or bfloat16 (7), against the
same estimator without rounding, |x'|^2 unrounded, on the first head and ``--length`` 256 by
default: what a one-pass reduced-precision float32 product does to the exponents. Written to
``projection_rounding.json``.
"""

from __future__ import annotations

import argparse
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from scipy.special import logsumexp

from benchmarks.timing import save_json
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


ROUNDINGS = {"tf32": 10, "bfloat16": 7}  # mantissa bits kept


def rounded(x: np.ndarray, bits: int) -> np.ndarray:
    """float32 values rounded to ``bits`` mantissa bits (to nearest, ties away from zero)."""
    if bits >= 23:  # float32's own
        return np.asarray(x, np.float32)
    raw = np.asarray(x, np.float32).view(np.uint32)
    drop = np.uint32(23 - bits)
    return (((raw + (np.uint32(1) << (drop - np.uint32(1)))) >> drop) << drop).view(np.float32)


def estimator(q, k, v, weights, causal: bool, bits: int | None) -> np.ndarray:
    """FAVOR+ in float64 from its log-features l(x) = x' W^T - |x'|^2 / 2 (x' = x H^-1/4),
    the projection's operands rounded to ``bits`` mantissa bits (None: not rounded)."""
    scale = HEAD_DIM**-0.25

    def logs(x):
        x = x * scale
        if bits is None:
            return x @ weights.T - 0.5 * np.sum(x * x, -1, keepdims=True)
        narrow = rounded(x, bits).astype(np.float64) @ rounded(weights, bits).astype(np.float64).T
        return narrow - 0.5 * np.sum(x * x, -1, keepdims=True)

    # Each score in log space, logsumexp_i(l_i(q_t) + l_i(k_j)): nothing under- or overflows.
    scores = logsumexp(logs(q)[:, None, :] + logs(k)[None, :, :], axis=-1)
    if causal:
        scores = np.where(np.tril(np.ones(scores.shape, bool)), scores, -np.inf)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    return (scores / scores.sum(-1, keepdims=True)) @ v


def projection_rounding(length: int, norm: float, causal: bool) -> dict:
    q, k, v = (x[0, :, 0] for x in inputs(length, norm, "float32"))
    projection = draw_projection(jax.random.key(7), HEAD_DIM, NUM_FEATURES, coupling="orthogonal")
    weights = np.asarray(projection.matrix(), np.float64)
    ref = estimator(q, k, v, weights, causal, None)
    row = {"norm": norm, "mode": "causal" if causal else "bidirectional"}
    for name, bits in ROUNDINGS.items():
        out = estimator(q, k, v, weights, causal, bits)
        row[f"{name}_max_error_over_max_value"] = float(np.abs(out - ref).max() / np.abs(v).max())
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--length", type=int, default=None, help="T (default 1024; 256 with --projection-rounding)"
    )
    parser.add_argument("--out", default=str(RESULTS))
    parser.add_argument("--matmul-precision", choices=("default", "float32"), default="default")
    parser.add_argument("--projection-rounding", action="store_true")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.projection_rounding:
        _report_projection_rounding(args.length or 256, out)
        return
    length = args.length or 1024
    precision = None if args.matmul_precision == "default" else args.matmul_precision
    with jax.default_matmul_precision(precision):
        rows = [
            errors(length, norm, dtype, causal)
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
    report = {"jax": jax.__version__, "device": jax.devices()[0].device_kind, "rows": rows}
    report["length"] = length
    report["matmul_precision"] = args.matmul_precision
    report["load_average"] = os.getloadavg()[0]
    name = jax.default_backend() + ("" if precision is None else f"_{precision}")
    save_json(out / f"{name}.json", report, settings=vars(args))


def _report_projection_rounding(length: int, out: pathlib.Path) -> None:
    rows = [projection_rounding(length, norm, causal) for causal in (True, False) for norm in NORMS]
    print(f"{'mode':14} {'|q|':>5} " + " ".join(f"{name:>10}" for name in ROUNDINGS))
    for row in rows:
        errors_ = " ".join(f"{row[f'{name}_max_error_over_max_value']:10.2e}" for name in ROUNDINGS)
        print(f"{row['mode']:14} {row['norm']:5.0f} {errors_}")
    report = {"length": length, "head_dim": HEAD_DIM, "features": NUM_FEATURES, "rows": rows}
    save_json(out / "projection_rounding.json", report, settings={"length": length})


if __name__ == "__main__":
    main()
