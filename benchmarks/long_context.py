"""Long-context causal LM: FAVOR against exact attention in time, memory, perplexity and decoding.

  XLA_FLAGS=--xla_force_host_platform_device_count=4 python -m benchmarks.long_context \\
      --workdir workdirs/performer_lm --out benchmarks/results/long_context

The model is ``configs/performer_lm.py``'s (``rfjax.nn.PerformerLM``, vocabulary of PTB's
10,000 words), with causal FAVOR (``"performer"``) or exact causal softmax attention
(``"exact"``, ``jax.nn.dot_product_attention``). For each context length T (``--lengths``) and
device count D (``--device-counts``; D forced CPU devices split the window along T: the
experiment's ``shard_map`` over a ``"seq"`` axis of D devices, batch of one window):

* memory: XLA's compiled memory analysis of one device's training step (forward, backward and
  the AdamW update; arguments + outputs + temporaries), per device;
* time: median of ``--repeats`` training steps after one warm-up (interleaved), as training
  tokens per second, only where the D devices' memory together fits ``--memory-budget-gib`` (the
  forced CPU devices share one host's memory: 12 GiB by default; on an accelerator the default
  is one device's memory as its allocator reports it; the others are "does not fit");
* ``--crossover-lengths`` adds shorter windows on one device, to find where FAVOR's time
  crosses below exact attention's.

Perplexity: the experiment's trained checkpoints (``--workdir``: ``runs/performer_seed0`` and
``runs/exact_seed0``, trained at ``context_length``) evaluated on the validation stream in
windows of each T (every whole window of the split; at T = 65,536 the split holds one), on all
devices with the sequence split over them, where the exact model's forward pass fits.

Decoding: ``--decode-tokens`` N tokens generated greedily after a one-token prompt by
``rfjax.nn.generate`` (one compiled program per call: the cache created, then a ``lax.scan``
over the tokens; ``PerformerLM(decode=True)``: FAVOR's recurrent state with the projection
drawn once per call, against a key/value cache of T entries for exact attention; one device),
for a cache of each T: FAVOR and exact attention in turns, repeat by repeat, as tokens per
second of the whole call and per token of the loop alone (the time 2N tokens add to N, without
the call's fixed costs), FAVOR's over exact attention's in the same run, with the load and the
cache's size. The key/value cache attends over all T entries at every step (masked), so its
per-token cost is that of any position; FAVOR's state does not depend on T. The parameters
are the experiment's trained checkpoints where ``--workdir`` has them, else initialised ones
(decoding speed does not depend on their values; the row says which).

Writes ``results.json`` (every row, the machine's load and the command) and ``table.md`` into
``--out``. Reported, not asserted.

Its perplexity and decoding rows evaluate ``configs/performer_lm.py``'s trained checkpoints, so
it builds what the study builds from the same sources, imports no study module: the model from
the config's ``model`` fields (``lm``), the run's keys and projection stream from the trainer
(``experiments.core.train.trainer.run_keys``, ``fixed_stream``) and the validation windows from
``experiments.core.ptb``.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import platform
import sys
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from benchmarks.timing import time_interleaved
from experiments.core import ptb, sweep
from experiments.core.outputs import write_json, write_text
from experiments.core.train import trainer as train
from rfjax.data import load_ptb
from rfjax.nn import PerformerLM, generate

KINDS = ("performer", "exact")
AXIS = "seq"
GIB = 2**30


def sub_mesh(devices: int) -> Mesh:
    """The first ``devices`` devices as a ``"seq"`` axis (one window per step)."""
    return Mesh(np.array(jax.devices()[:devices]), (AXIS,), axis_types=(AxisType.Auto,))


def lm(config, kind: str, vocab: int, **options) -> PerformerLM:
    """The study's LM of ``kind``: ``PerformerLM`` with the config's ``model`` fields."""
    return PerformerLM(
        vocab_size=vocab,
        attention_kind=kind,  # type: ignore[arg-type]  # PerformerLM checks it
        **config.model.to_dict(),
        **options,
    )


def projection_key(config) -> jax.Array:
    """The constant ``"projection"`` stream of the config's run (the trainer's derivation)."""
    return train.fixed_stream(train.run_keys(config.train.seed)[1])


def nll_fn(config, kind: str, vocab: int, mesh: Mesh):
    """``(params, inputs, targets, rng, step) -> (1, T)`` token NLL, T split over the mesh."""
    split = mesh.size > 1
    model = lm(config, kind, vocab, sequence_axis=AXIS if split else None)

    def local(params, inputs, targets, rng, step):
        rngs = {"projection": train.fixed_stream(rng)}
        return model.apply(params, inputs, targets, rngs=rngs, projection_step=step)

    windows = P(None, AXIS)
    return jax.shard_map(
        local, mesh=mesh, in_specs=(P(), windows, windows, P(), P()), out_specs=windows
    )


def memory_analysis(compiled) -> Any:
    """XLA's memory analysis of a compiled program (raises if XLA gives none)."""
    analysis = compiled.memory_analysis()
    if analysis is None:
        raise RuntimeError("XLA gave no memory analysis")
    return analysis


def train_step_program(config, kind: str, vocab: int, length: int, devices: int):
    """The compiled training step at T = ``length`` on ``devices`` devices, its arguments and
    its per-device memory (bytes)."""
    mesh = sub_mesh(devices)
    nll = nll_fn(config, kind, vocab, mesh)
    optimizer, _ = train.make_optimizer(config.train)
    model = lm(config, kind, vocab)
    params = model.init(jax.random.key(0), jnp.zeros((1, 128), jnp.int32))
    replicated, windows = NamedSharding(mesh, P()), NamedSharding(mesh, P(None, AXIS))
    params = jax.device_put(params, replicated)
    opt_state = jax.device_put(optimizer.init(params), replicated)
    tokens = jax.random.randint(jax.random.key(1), (1, length + 1), 0, vocab)
    inputs = jax.device_put(tokens[:, :-1], windows)
    targets = jax.device_put(tokens[:, 1:], windows)
    rng = jax.random.key(2)

    def step(params, opt_state, inputs, targets):
        loss, grads = jax.value_and_grad(
            lambda p: jnp.mean(nll(p, inputs, targets, rng, jnp.int32(0)))
        )(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    compiled = jax.jit(step).lower(params, opt_state, inputs, targets).compile()
    analysis = memory_analysis(compiled)
    memory = int(
        analysis.argument_size_in_bytes
        + analysis.output_size_in_bytes
        + analysis.temp_size_in_bytes
    )
    return compiled, (params, opt_state, inputs, targets), memory


def step_rows(
    config, vocab: int, lengths, device_counts, repeats: int, budget: float
) -> Iterator[list[dict]]:
    """Memory (and time where it fits) of every (T, D, kind) training step: the rows of each
    (T, D), one list at a time (the caller writes them as they come)."""
    for length in lengths:
        for devices in device_counts:
            functions, found, rows = {}, [], []
            for kind in KINDS:
                row = {"length": length, "devices": devices, "kind": kind}
                try:
                    compiled, args, memory = train_step_program(
                        config, kind, vocab, length, devices
                    )
                except Exception as error:
                    row.update(status=f"does not compile: {type(error).__name__}: {error}"[:300])
                    rows.append(row)
                    continue
                row["memory_per_device_bytes"] = memory
                if memory * devices > budget:
                    row["status"] = (
                        f"does not fit: {devices} x {memory / GIB:.1f} GiB > memory budget "
                        f"{budget / GIB:.0f} GiB"
                    )
                else:
                    row["status"] = "timed"
                    functions[kind] = lambda c=compiled, a=args: c(*a)
                found.append(row)
                rows.append(row)
                print(f"  T={length} D={devices} {kind}: {row['status']}", flush=True)
            for row in found:
                try:  # once before timing: a program that compiled can still fail on the device
                    if row["kind"] in functions:
                        jax.block_until_ready(functions[row["kind"]]())
                except Exception as error:  # e.g. out of memory: the other kind is timed
                    del functions[row["kind"]]
                    row["status"] = f"fails at run time: {type(error).__name__}: {error}"[:300]
            if functions:
                timings = time_interleaved(functions, repeats=repeats, warmup=1)
                for row in found:
                    if row["kind"] in timings:
                        timing = timings[row["kind"]]
                        row.update(
                            median_s=timing["median_s"],
                            min_s=timing["min_s"],
                            tokens_per_second=length / timing["median_s"],
                        )
            print(f"T={length} D={devices} done (load {os.getloadavg()[0]:.1f})", flush=True)
            yield rows


def trained(workdir: str, kind: str, config) -> tuple[dict, int] | None:
    """The parameters and final step of the experiment's seed-0 run of ``kind``, if any."""
    run_dir = sweep.run_dir(workdir, kind, 0)
    if not os.path.isdir(os.path.join(run_dir, "checkpoints")):
        return None
    params = train.final_params(run_dir)
    with open(os.path.join(run_dir, "metrics.jsonl")) as handle:
        step = max(json.loads(line)["step"] for line in handle if line.strip())
    return params, step


def perplexity_rows(config, vocab: int, workdir: str, lengths, budget: float) -> list:
    """Validation perplexity of each trained kind in windows of each T, on all devices."""
    splits, _ = load_ptb()
    devices = jax.device_count()
    mesh = sub_mesh(devices)
    rows = []
    for kind in KINDS:
        found = trained(workdir, kind, config)
        if found is None:
            continue
        params, step = found
        params = jax.device_put(params, NamedSharding(mesh, P()))
        for length in lengths:
            row = {"kind": kind, "length": length, "devices": devices, "trained_step": step}
            windows = ptb.windows(splits["valid"], length)
            nll = jax.jit(nll_fn(config, kind, vocab, mesh))
            place = NamedSharding(mesh, P(None, AXIS))
            shapes = [jax.ShapeDtypeStruct((1, length), jnp.int32, sharding=place)] * 2
            rng, at = train.run_keys(config.train.seed)[1], jnp.int32(step)
            try:
                analysis = memory_analysis(nll.lower(params, *shapes, rng, at).compile())
            except Exception as error:  # XLA's autotuner can run out of memory compiling
                row["status"] = f"does not compile: {type(error).__name__}: {error}"[:300]
                rows.append(row)
                continue
            memory = analysis.temp_size_in_bytes + analysis.argument_size_in_bytes
            row["memory_per_device_bytes"] = int(memory)
            if memory * devices > budget:
                row["status"] = f"does not fit: {devices} x {memory / GIB:.1f} GiB"
                rows.append(row)
                continue
            total, count = 0.0, 0
            for inputs, targets in zip(windows["inputs"], windows["targets"], strict=True):
                values = nll(
                    params,
                    jax.device_put(inputs[None], place),
                    jax.device_put(targets[None], place),
                    rng,
                    at,
                )
                total += float(jnp.sum(values))
                count += values.size
            row.update(status="evaluated", windows=len(windows["inputs"]), tokens=count)
            row["perplexity"] = float(np.exp(total / count))
            rows.append(row)
            print(f"  ppl {kind} T={length}: {row.get('perplexity')}", flush=True)
    return rows


def decode_parameters(config, kind: str, vocab: int, workdir: str) -> tuple[dict, int, str]:
    """The ``"params"`` of ``kind`` for the decoding rows, their projection step and where they
    come from: the experiment's trained seed-0 run, else freshly initialised (decoding speed
    does not depend on the values)."""
    found = trained(workdir, kind, config)
    if found is not None:
        params, step = found
        return params["params"], step, f"trained, step {step}"
    model = lm(config, kind, vocab)
    params = model.init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
    return params, 0, "initialised (no trained run in the workdir)"


def cache_bytes(model, params, rngs: dict, length: int) -> int:
    """The bytes of ``model``'s decode cache for ``length`` positions (from shapes only)."""
    cache = jax.eval_shape(
        lambda: model.clone(decode=True).apply(
            {"params": params}, jnp.zeros((1, length), jnp.int32), rngs=rngs, mutable=["cache"]
        )[1]
    )
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache)))


def per_token_rate(short: dict, long: dict, tokens: int) -> float:
    """Tokens/s of the loop alone: ``tokens`` more tokens over the time they add (medians of
    ``tokens`` and twice as many), without the call's fixed costs (the cache's creation, the
    projection's draw, dispatch); NaN if the difference is not positive (noise)."""
    added = long["median_s"] - short["median_s"]
    return tokens / added if added > 0 else float("nan")


def decode_rows(
    config, vocab: int, workdir: str, lengths, tokens: int, repeats: int
) -> Iterator[list[dict]]:
    """Greedy decoding tokens/s of FAVOR and exact attention with a cache of each T (one
    device), timed in turns (``rfjax.nn.generate``, one compiled program per call): the two
    rows of each T, one pair at a time."""
    rngs = {"projection": projection_key(config)}
    models = {kind: lm(config, kind, vocab) for kind in KINDS}
    parameters = {kind: decode_parameters(config, kind, vocab, workdir) for kind in KINDS}
    prompt = jnp.zeros((1, 1), jnp.int32)
    for length in lengths:
        rows = []
        # In turns FAVOR N, exact N, FAVOR 2N, exact 2N: every call of a kind follows one of
        # the other (kind by kind, FAVOR's N-token call followed exact attention's 2N-token one
        # and its 64k cache, and the per-token difference came out 10x its whole-call rate).
        functions = {}
        for count in (tokens, 2 * tokens):
            for kind in KINDS:
                params, step, _ = parameters[kind]
                functions[kind, count] = functools.partial(
                    generate,
                    models[kind],
                    params,
                    prompt,
                    count,
                    rngs=rngs,
                    projection_step=step,
                    cache_length=length,
                )
        timings = time_interleaved(
            {f"{kind} {count}": fn for (kind, count), fn in functions.items()},
            repeats=repeats,
            warmup=1,
        )
        load = os.getloadavg()
        for kind in KINDS:
            short, long = (timings[f"{kind} {count}"] for count in (tokens, 2 * tokens))
            params = parameters[kind][0]
            rows.append(
                {
                    "kind": kind,
                    "cache_length": length,
                    "tokens": tokens,
                    "parameters": parameters[kind][2],
                    "median_s": short["median_s"],
                    "median_s_twice_the_tokens": long["median_s"],
                    "tokens_per_second": tokens / short["median_s"],
                    "per_token_tokens_per_second": per_token_rate(short, long, tokens),
                    "cache_bytes": cache_bytes(models[kind], params, rngs, length),
                    "load_average": load,
                }
            )
        performer, exact = rows
        for name in ("tokens_per_second", "per_token_tokens_per_second"):
            ratio = performer[name] / exact[name]
            performer[f"favor_over_exact_{name}"] = exact[f"favor_over_exact_{name}"] = ratio
        print(
            f"  decode T={length}: FAVOR / exact tokens/s "
            f"{performer['favor_over_exact_tokens_per_second']:.2f}, per token "
            f"{performer['favor_over_exact_per_token_tokens_per_second']:.2f} "
            f"(load {load[0]:.1f})",
            flush=True,
        )
        yield rows


def status_cell(row: dict) -> str:
    """A row's status on one line of a markdown table (XLA's messages span lines)."""
    return " ".join(row["status"].split()).replace("|", "/")[:200]


def cell(row: dict, name: str, form: str) -> str:
    """``row[name]`` formatted, or ``--`` where the row has none."""
    return format(row[name], form) if name in row else "--"


def table(result: dict) -> str:
    """The markdown tables of a result: steps, perplexity, decoding."""
    lines = [
        "| T | devices | kind | MiB per device | tokens/s | FAVOR time / exact | "
        "memory / 1 device's |",
        "|---|---|---|---|---|---|---|",
    ]
    steps = result["steps"]
    index = {(r["length"], r["devices"], r["kind"]): r for r in steps}
    for row in steps:
        memory = row.get("memory_per_device_bytes")
        mib = f"{memory / 2**20:.0f}" if memory else "--"
        speed = (
            f"{row['tokens_per_second']:.0f}" if "tokens_per_second" in row else status_cell(row)
        )
        exact = index.get((row["length"], row["devices"], "exact"), {})
        ratio = "--"
        if row["kind"] == "performer" and "median_s" in row and "median_s" in exact:
            ratio = f"{row['median_s'] / exact['median_s']:.3f}"
        one = index.get((row["length"], 1, row["kind"]), {}).get("memory_per_device_bytes")
        scale = f"{memory / one:.3f}" if memory and one else "--"
        lines.append(
            f"| {row['length']} | {row['devices']} | {row['kind']} | {mib} | {speed} | {ratio} | "
            f"{scale} |"
        )
    lines += ["", "| kind | T | perplexity | windows | MiB per device |", "|---|---|---|---|---|"]
    for row in result["perplexity"]:
        value = f"{row['perplexity']:.1f}" if "perplexity" in row else status_cell(row)
        memory = row.get("memory_per_device_bytes")
        mib = f"{memory / 2**20:.0f}" if memory else "--"
        lines.append(
            f"| {row['kind']} | {row['length']} | {value} | {row.get('windows', '--')} | {mib} |"
        )
    # Runs before issue 42's measured only the whole call's rate: their table keeps its columns.
    ratios = any("per_token_tokens_per_second" in row for row in result["decode"])
    fields = (
        [
            ("tokens/s", "tokens_per_second", ".0f"),
            ("FAVOR / exact", "favor_over_exact_tokens_per_second", ".2f"),
            ("per-token tokens/s", "per_token_tokens_per_second", ".0f"),
            ("FAVOR / exact", "favor_over_exact_per_token_tokens_per_second", ".2f"),
        ]
        if ratios
        else [("tokens/s", "tokens_per_second", ".0f")]
    )
    heads = ["kind", "cache T", *(head for head, _, _ in fields), "cache KiB"]
    heads += ["load"] if ratios else []
    lines += ["", f"| {' | '.join(heads)} |", "|" + "---|" * len(heads)]
    for row in result["decode"]:
        cells = [cell(row, key, spec) for _, key, spec in fields]
        cells.append(f"{row['cache_bytes'] / 2**10:.0f}")
        if ratios:
            cells.append(f"{row['load_average'][0]:.1f}" if "load_average" in row else "--")
        lines.append(f"| {row['kind']} | {row['cache_length']} | {' | '.join(cells)} |")
    return "\n".join(lines)


def memory_budget(gib: float | None) -> float:
    """The bytes the D devices' compiled programs may take together: ``gib`` when given, else
    12 GiB on CPU (forced devices share the host) and one device's memory on an accelerator."""
    if gib is not None:
        return gib * GIB
    device = jax.devices()[0]
    if device.platform == "cpu":
        return 12.0 * GIB
    stats = device.memory_stats() or {}
    if "bytes_limit" not in stats:
        raise SystemExit(f"{device.device_kind} reports no memory limit: pass --memory-budget-gib")
    return float(stats["bytes_limit"])


def write(result: dict, out: str) -> None:
    """``results.json`` and ``table.md`` of what is measured so far, each replaced atomically
    (after every case, so a run cut short keeps its finished cases)."""
    write_json(os.path.join(out, "results.json"), result)
    write_text(os.path.join(out, "table.md"), table(result) + "\n")


def parser() -> argparse.ArgumentParser:
    """The command line's parser (``benchmarks.gpu_run`` reads ``--lm-args`` with it)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", default="workdirs/performer_lm")
    parser.add_argument("--out", default="benchmarks/results/long_context")
    parser.add_argument("--config", default="", help="configs/performer_lm.py argument")
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--crossover-lengths", type=int, nargs="*", default=[512, 1024, 2048])
    parser.add_argument("--device-counts", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--memory-budget-gib",
        type=float,
        default=None,
        help="memory of the D devices together (default: 12 on CPU, one device's on accelerators)",
    )
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument(
        "--implementation",
        default="auto",
        help="FAVOR's implementation (favor_attention's: auto, xla, pallas_triton, ...)",
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=("steps", "perplexity", "decode"))
    return parser


def main() -> None:
    args = parser().parse_args()

    from configs.performer_lm import get_config

    config: ml_collections.ConfigDict = get_config(args.config or None)
    with config.unlocked():  # the benchmark's model only; the study's settings are unchanged
        config.model.implementation = args.implementation
    _, vocabulary = load_ptb()
    vocab = len(vocabulary)
    budget = memory_budget(args.memory_budget_gib)
    result: dict = {
        "command": " ".join(["python -m benchmarks.long_context", *sys.argv[1:]]),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {jax.device_count()} devices",
        "device_kind": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "load_average_start": os.getloadavg(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "model": config.model.to_dict(),
    }
    start = time.monotonic()
    result.update(steps=[], perplexity=[], decode=[])
    if "steps" not in args.skip:
        for rows in itertools.chain(
            step_rows(config, vocab, args.crossover_lengths, [1], args.repeats, budget),
            step_rows(config, vocab, args.lengths, args.device_counts, args.repeats, budget),
        ):
            result["steps"] += rows
            write(result, args.out)
    if "perplexity" not in args.skip:
        result["perplexity"] = perplexity_rows(config, vocab, args.workdir, args.lengths, budget)
        write(result, args.out)
    if "decode" not in args.skip:
        for rows in decode_rows(
            config, vocab, args.workdir, args.lengths, args.decode_tokens, args.repeats
        ):
            result["decode"] += rows
            write(result, args.out)
    result["load_average_end"] = os.getloadavg()
    result["wall_seconds"] = time.monotonic() - start
    write(result, args.out)
    print(table(result))


if __name__ == "__main__":
    main()
