"""How far FAVOR attention is from softmax attention, against the input norm and the width m.

  python -m benchmarks.favor_error [--seeds 4] [--out benchmarks/results/favor_error]

Accuracy, not speed: the table behind docs/maths/attention.md ("How large the error is").
Queries and keys have i.i.d. N(0, sigma^2) entries, values N(0, 1) (B = 1, T = S = 256, N = 4
heads, H = 64): a query's rescaled squared norm |q'|^2 = |q|^2 / sqrt(H) is then about
r^2 = sigma^2 sqrt(H) (r^2 = 8 at sigma = 1, the scale of q = x W for a unit-variance x and
Flax's default lecun_normal W). Each cell is the mean over ``--seeds`` projections (per-head
orthogonal draws) of the relative error |FAVOR - softmax|_F / |softmax|_F of the bidirectional
output, with its standard error. Rows:

* ``positive`` (FAVOR+), ``oprf`` (FAVOR++, arXiv:2205.15317) and ``saderf`` (arXiv:2302.00787),
  the last two fitted to the queries and keys (``favor_attention`` fits them when given
  without statistics), on the raw inputs;
* ``positive`` on normalised queries and keys with temperature tau (q, k scaled to
  |q'|^2 = |k'|^2 = tau, as ``PerformerAttention(query_key_norm=True)`` makes them; the exact
  attention compared is then the softmax of the same normalised scores tau cos(q, k)).
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.timing import save_json
from rfjax.attention import draw_projection, favor_attention, softmax_attention

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "favor_error"
LENGTH, HEADS, HEAD_DIM = 256, 4, 64
WIDTHS = (64, 256, 1024, 4096)
SIGMAS = (0.25, 0.5, 0.75, 1.0)  # r^2 = sigma^2 sqrt(H) = 0.5, 2, 4.5, 8
TEMPERATURES = (1.0, 4.0)
MAPS = ("positive", "oprf", "saderf")


def inputs(seed: int, sigma: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    shape = (1, LENGTH, HEADS, HEAD_DIM)
    return (
        sigma * jax.random.normal(kq, shape),
        sigma * jax.random.normal(kk, shape),
        jax.random.normal(kv, shape),
    )


def normalised(x: jax.Array, temperature: float) -> jax.Array:
    """x scaled to |x'|^2 = |x|^2 / sqrt(H) = temperature (unit direction)."""
    unit = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    return unit * math.sqrt(temperature) * HEAD_DIM**0.25


def relative_error(feature_map: str, num_features: int, seeds: int, q, k, v) -> list[float]:
    exact = softmax_attention(q, k, v)

    @jax.jit
    def one(key):
        projection = draw_projection(
            key, HEAD_DIM, num_features, coupling="orthogonal", num_heads=HEADS
        )
        out = favor_attention(q, k, v, projection, feature_map=feature_map)
        return jnp.linalg.norm(out - exact) / jnp.linalg.norm(exact)

    return [float(one(jax.random.key(1000 + s))) for s in range(seeds)]


def measure(seeds: int) -> list[dict]:
    rows = []
    for sigma in SIGMAS:
        q, k, v = inputs(0, sigma)
        r2 = float(jnp.mean(jnp.sum(q * q, axis=-1))) / math.sqrt(HEAD_DIM)
        for feature_map in MAPS:
            rows.append(
                {"inputs": f"sigma = {sigma}", "r2": r2, "map": feature_map}
                | cells(feature_map, seeds, q, k, v)
            )
    q, k, v = inputs(0, 1.0)
    for temperature in TEMPERATURES:
        qn, kn = normalised(q, temperature), normalised(k, temperature)
        rows.append(
            {"inputs": f"normalised, tau = {temperature}", "r2": temperature}
            | {"map": "positive"}
            | cells("positive", seeds, qn, kn, v)
        )
    return rows


def cells(feature_map: str, seeds: int, q, k, v) -> dict:
    out = {}
    for m in WIDTHS:
        errors = np.array(relative_error(feature_map, m, seeds, q, k, v))
        out[f"m={m}"] = [float(errors.mean()), float(errors.std(ddof=1) / math.sqrt(seeds))]
    return out


def markdown(rows: list[dict], seeds: int, stamp: str) -> str:
    lines = [
        f"FAVOR vs softmax attention, relative error of the output (mean +- SE over {seeds} "
        f"projections; T = {LENGTH}, N = {HEADS}, H = {HEAD_DIM}; {stamp}):",
        "",
        "| inputs | mean \\|q'\\|^2 | map | " + " | ".join(f"m = {m}" for m in WIDTHS) + " |",
        "|---|---|---|" + "---|" * len(WIDTHS),
    ]
    for row in rows:
        values = " | ".join(f"{row[f'm={m}'][0]:.3f} +- {row[f'm={m}'][1]:.3f}" for m in WIDTHS)
        lines.append(f"| {row['inputs']} | {row['r2']:.2f} | {row['map']} | {values} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.seeds < 2:  # the standard error needs two (one wrote NaN into the JSON)
        parser.error(f"--seeds must be >= 2, got {args.seeds}")
    start = time.perf_counter()
    rows = measure(args.seeds)
    stamp = (
        f"jax {jax.__version__}, {time.perf_counter() - start:.0f} s at load "
        f"{os.getloadavg()[0]:.1f}"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    save_json(
        args.out / "favor_error.json",
        {"seeds": args.seeds, "rows": rows, "run": stamp},
        settings=vars(args),
    )
    table = markdown(rows, args.seeds, stamp)
    (args.out / "favor_error.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
