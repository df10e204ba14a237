"""Interleaved A/B of causal FAVOR, forward and forward + backward: the current rfjax against
another commit's, compiled side by side in one process and called in alternating order.

The other commit is imported as a package of another name:

    mkdir -p /tmp/base /tmp/basepkg
    git archive f4e5595 rfjax | tar -x -C /tmp/base
    mv /tmp/base/rfjax /tmp/basepkg/rfjax_base
    grep -rl rfjax /tmp/basepkg/rfjax_base \\
        | xargs sed -i 's/\\brfjax\\b\\([.a-z_]*\\)/rfjax_base\\1/g'
    python interleaved_ab.py /tmp/basepkg 512,1024,2048,4096,16384 101
    python interleaved_ab.py /tmp/basepkg 65536 5 7

benchmarks/attention.py's setting: B = 1, 4 heads of 64, m = 128, orthogonal projection, chunk
64, loss sum(out). Prints, per pass and T, the median and quartiles of the per-pair time ratios
(current / other) and both programs' XLA temporaries.
"""

import json
import os
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, sys.argv[1])
import rfjax_base.attention as old  # type: ignore[import-not-found]

import rfjax.attention as new

LENGTHS = [int(t) for t in sys.argv[2].split(",")]
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 15


def build(module, name, args):
    def forward(q, k, v, p):
        return module.favor_attention(q, k, v, p, causal=True, chunk_size=64)

    if name == "fwdbwd":
        fn = jax.value_and_grad(lambda *a: jnp.sum(forward(*a)), argnums=(0, 1, 2))
    else:
        fn = forward
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, compiled.memory_analysis().temp_size_in_bytes


for length in LENGTHS:
    keys = jax.random.split(jax.random.key(length), 4)
    q, k, v = (jax.random.normal(key, (1, length, 4, 64)) for key in keys[:3])
    projections = [m.draw_projection(keys[3], 64, 128, coupling="orthogonal") for m in (new, old)]
    for name in ("fwd", "fwdbwd"):
        (c_new, m_new), (c_old, m_old) = (
            build(m, name, (q, k, v, p)) for m, p in zip((new, old), projections, strict=True)
        )
        args = [(q, k, v, p) for p in projections]
        calls = [(c_new, args[0]), (c_old, args[1])]
        for compiled, arguments in calls:
            jax.block_until_ready(compiled(*arguments))
        pairs = ROUNDS if len(sys.argv) > 4 else max(5, ROUNDS * 4096 // max(length, 4096))
        pairs = int(sys.argv[4]) if len(sys.argv) > 4 else pairs
        ratios = []
        for i in range(pairs):
            times = {}
            for which in (0, 1) if i % 2 == 0 else (1, 0):
                start = time.perf_counter()
                compiled, arguments = calls[which]
                jax.block_until_ready(compiled(*arguments))
                times[which] = time.perf_counter() - start
            ratios.append(times[0] / times[1])
        ratios.sort()
        row = dict(
            ratio_median=ratios[len(ratios) // 2],
            q1=ratios[len(ratios) // 4],
            q3=ratios[3 * len(ratios) // 4],
            n=pairs,
            temp_new_MiB=m_new / 2**20,
            temp_old_MiB=m_old / 2**20,
        )
        print(name, length, json.dumps(row), "load", os.getloadavg()[0], flush=True)
