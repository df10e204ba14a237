"""Run 4 (2026-11-27, H200): greedy decoding tokens/s after the decode cache keeps the drawn
projection (``kept_draw``), with the baseline (exact attention's key/value cache) measured in the
same run. Untrained parameters of ``configs/performer_lm.py``'s default model (decoding speed
does not depend on their values); 64 tokens per call, median of 7 calls after one warm-up.
Run from the repository root with ``PYTHONPATH=.`` (it was run as ``tmp_decode_gpu.py``)."""

import json
import time

import jax
import jax.numpy as jnp

from configs.performer_lm import get_config
from experiments import performer_lm

config = get_config(None)
rngs = {"projection": performer_lm.projection_rng(performer_lm.train_rng(config))}
out = {"device": jax.devices()[0].device_kind, "jax": jax.__version__}
for kind, length in (("performer", 1), ("exact", 4096), ("exact", 65536)):
    model = performer_lm.make_model(config, kind, 10000, decode=True)
    variables = model.init(jax.random.key(0), jnp.zeros((1, length), jnp.int32))
    params = {k: v for k, v in variables.items() if k != "cache"}

    def generate(cache, model=model, params=params):
        def one(carry, _):
            cache, token = carry
            logits, updated = model.apply(
                {**params, "cache": cache},
                token,
                rngs=rngs,
                projection_step=250,
                mutable=["cache"],
            )
            following = jnp.argmax(logits[:, -1], axis=-1)[:, None].astype(jnp.int32)
            return (updated["cache"], following), following[0, 0]

        start = (cache, jnp.zeros((1, 1), jnp.int32))
        return jax.lax.scan(one, start, None, length=64)[1]

    run = jax.jit(generate)
    cache = variables["cache"]
    if kind == "exact":
        cache = jax.tree.map(jnp.zeros_like, cache)
    jax.block_until_ready(run(cache))
    times = []
    for _ in range(7):
        started = time.perf_counter()
        jax.block_until_ready(run(cache))
        times.append(time.perf_counter() - started)
    times.sort()
    out[f"{kind}_cache{length}_tokens_per_s"] = 64 / times[3]
    print(kind, length, f"{64 / times[3]:.0f} tokens/s", flush=True)
print(json.dumps(out))
