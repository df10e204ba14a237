"""Cold start: import and first calls of rfjax against JAX, Flax and scikit-learn (issue 33).

  python -m benchmarks.cold_start [--repeats 3] [--out benchmarks/results/cold_start]

Every measurement runs in a fresh Python process (``python -c`` from the repository root, no
persistent compilation cache unless the case sets one), so it includes everything a new
session pays: importing, tracing, compiling and running. Each process times only its measured
statement (its set-up, e.g. importing the libraries before a first call, is not timed) and
reports CPU time (user + system of all its threads, ``resource.getrusage``), wall time, and the
XLA compilations inside the measured statement (``jax.monitoring``: count and seconds). The
cases run round-robin ``--repeats`` times; the table gives medians and the ratio of rfjax to its
peer, in CPU time (less sensitive to the machine's load than wall time) and in wall time.

Pairs (rfjax against its peer, same machine, same run):

* import: ``import rfjax`` and rfjax's array packages (``projections``, ``features``,
  ``kernels``, ``attention``, ``theory``) against ``import jax``; ``rfjax.nn`` against
  ``jax`` + ``flax.linen``; ``rfjax.nn.nnx`` against ``jax`` + ``flax.nnx``. Target: <= 1.3x.
* first draw: ``projections.orthogonal(key, 64, 128)`` (two Haar 64 x 64 blocks with chi
  norms) against ``jax.random.orthogonal(key, 64, (2,))`` (two Haar blocks), both to the
  array. Target: <= 1.5x.
* scikit-learn: a cold ``fit`` of ``make_pipeline(features, RidgeClassifier())`` on the digits
  (1,797 x 64, scaled to [0, 1]; 512 features, gamma = 0.05), rfjax's ``RandomFeatures``
  against the equivalent JAX call (the same random Fourier features written in ``jax.numpy``
  under one ``jax.jit``, to NumPy, then ``RidgeClassifier``). Target: <= 1.5x. Beside it, for
  reference (no target), scikit-learn's ``RBFSampler`` (NumPy: it compiles nothing) and rfjax's
  fit in a process whose persistent compilation cache an earlier process filled.
* NNX training: a model of an embedding, one attention layer (4 heads, width 64), a LayerNorm
  and a linear head on (8, 64, 16) inputs, ``nnx.Optimizer`` with Adam: building the model and
  optimizer and the first ``nnx.jit`` training step, with ``rfjax.nn.nnx.PerformerAttention``
  (orthogonal coupling, 64 features, redrawn by step) against ``flax.nnx.MultiHeadAttention``.
  Target: <= 1.5x. Beside it (no target): the same step with the Gaussian coupling (i.i.d.
  rows: no QR, no chi norms), which shows how much of the excess is the orthogonal draw that
  the step makes (the features are redrawn inside the jitted step, from the step's key), and
  the Performer's first step in a process whose persistent compilation cache
  (``jax_compilation_cache_dir``) an earlier process filled.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "cold_start"

CHILD = """
import json, resource, sys, time


def _cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


{setup}
_compiles = []
_listening = "jax" in sys.modules  # compilations are counted after a set-up that imports JAX
if _listening:
    import jax

    def _listen(event, duration, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            _compiles.append(duration)

    jax.monitoring.register_event_duration_secs_listener(_listen)
_cpu0, _wall0 = _cpu(), time.perf_counter()
{timed}
_cpu1, _wall1 = _cpu(), time.perf_counter()
print(json.dumps({{"cpu_s": _cpu1 - _cpu0, "wall_s": _wall1 - _wall0,
                  "compiles": len(_compiles) if _listening else None,
                  "compile_s": sum(_compiles)}}))
"""

PERSISTENT_CACHE = """
import jax
jax.config.update("jax_compilation_cache_dir", {path!r})
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
"""

DRAW_SETUP = """
import jax, jax.numpy as jnp
from rfjax import projections
key = jax.random.key(0)
jax.block_until_ready(jax.random.split(key))  # the key machinery, the same for both
"""

SKLEARN_SETUP = """
import jax, jax.numpy as jnp, numpy as np
from sklearn.datasets import load_digits
from sklearn.kernel_approximation import RBFSampler
from sklearn.linear_model import RidgeClassifier
from sklearn.pipeline import make_pipeline
from rfjax.sklearn import RandomFeatures
X, y = load_digits(return_X_y=True)
X = X / 16.0


@jax.jit
def fourier_features(key, x):  # the equivalent JAX call: random Fourier features, 512 wide
    weights_key, offsets_key = jax.random.split(key)
    weights = jax.random.normal(weights_key, (x.shape[1], 512)) * jnp.sqrt(2 * 0.05)
    offsets = jax.random.uniform(offsets_key, (512,), maxval=2 * jnp.pi)
    return jnp.sqrt(2 / 512) * jnp.cos(x @ weights + offsets)
"""

NNX_SETUP = """
import jax, jax.numpy as jnp, optax
from flax import nnx
from rfjax.nn import nnx as rnnx

KIND, COUPLING = {kind!r}, {coupling!r}
BATCH, LENGTH, WIDTH, HEADS = 8, 64, 64, 4


class Model(nnx.Module):
    def __init__(self, rngs):
        self.embed = nnx.Linear(16, WIDTH, rngs=rngs)
        if KIND == "flax":
            self.attention = nnx.MultiHeadAttention(HEADS, WIDTH, decode=False, rngs=rngs)
        else:
            self.attention = rnnx.PerformerAttention(
                HEADS, WIDTH, num_features=64, coupling=COUPLING, rngs=rngs
            )
        self.norm = nnx.LayerNorm(WIDTH, rngs=rngs)
        self.head = nnx.Linear(WIDTH, 10, rngs=rngs)

    def __call__(self, x, step):
        extra = {{}} if KIND == "flax" else {{"projection_step": step}}
        h = self.embed(x)
        h = h + self.attention(h, **extra)
        return self.head(jnp.mean(self.norm(h), axis=1))


@nnx.jit
def train_step(model, optimizer, x, y, step):
    def loss_fn(model):
        logits = model(x, step)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


x = jax.random.normal(jax.random.key(0), (BATCH, LENGTH, 16))
y = jnp.arange(BATCH) % 10
jax.block_until_ready((x, y))
"""

COLD_FIT = (
    "make_pipeline(RandomFeatures(n_components=512, gamma=0.05, random_state=0),"
    " RidgeClassifier()).fit(X, y)"
)


def nnx_setup(kind: str, coupling: str = "orthogonal") -> str:
    """The NNX case's set-up: ``kind`` "flax" (MultiHeadAttention) or "performer"."""
    return NNX_SETUP.format(kind=kind, coupling=coupling)


NNX_STEP = """
model = Model(nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
loss = float(train_step(model, optimizer, x, y, 0))
"""


@dataclass(frozen=True)
class Case:
    """One measured statement: ``setup`` (not timed), then ``timed``, in a fresh process."""

    name: str
    timed: str
    setup: str = ""
    warm_cache: bool = False  # run once untimed first, filling a persistent compilation cache


CASES = (
    Case("import jax", "import jax"),
    Case("import rfjax", "import rfjax"),
    Case(
        "import rfjax array packages",
        "import rfjax.projections, rfjax.features, rfjax.kernels, rfjax.attention, rfjax.theory",
    ),
    Case("import jax, flax.linen", "import jax, flax.linen"),
    Case("import rfjax.nn", "import rfjax.nn"),
    Case("import jax, flax.nnx", "import jax, flax.nnx"),
    Case("import rfjax.nn.nnx", "import rfjax.nn.nnx"),
    Case(
        "first draw: jax.random.orthogonal",
        "jax.block_until_ready(jax.random.orthogonal(key, 64, (2,)))",
        DRAW_SETUP,
    ),
    Case(
        "first draw: rfjax orthogonal",
        "jax.block_until_ready(projections.orthogonal(key, 64, 128).matrix())",
        DRAW_SETUP,
    ),
    Case(
        "cold fit: RBFSampler + RidgeClassifier",
        "make_pipeline(RBFSampler(n_components=512, gamma=0.05, random_state=0),"
        " RidgeClassifier()).fit(X, y)",
        SKLEARN_SETUP,
    ),
    Case(
        "cold fit: jax.jit Fourier features + RidgeClassifier",
        "RidgeClassifier().fit(np.asarray(fourier_features(jax.random.key(0), X)), y)",
        SKLEARN_SETUP,
    ),
    Case("cold fit: RandomFeatures + RidgeClassifier", COLD_FIT, SKLEARN_SETUP),
    Case(
        "cold fit: RandomFeatures + RidgeClassifier, warm persistent cache",
        COLD_FIT,
        SKLEARN_SETUP,
        warm_cache=True,
    ),
    Case("NNX first step: nnx.MultiHeadAttention", NNX_STEP, nnx_setup("flax")),
    Case("NNX first step: PerformerAttention", NNX_STEP, nnx_setup("performer")),
    Case(
        "NNX first step: PerformerAttention, Gaussian coupling",
        NNX_STEP,
        nnx_setup("performer", coupling="gaussian"),
    ),
    Case(
        "NNX first step: PerformerAttention, warm persistent cache",
        NNX_STEP,
        nnx_setup("performer"),
        warm_cache=True,
    ),
)

# (rfjax case, peer case, target ratio or None).
PAIRS = (
    ("import rfjax", "import jax", 1.3),
    ("import rfjax array packages", "import jax", 1.3),
    ("import rfjax.nn", "import jax, flax.linen", 1.3),
    ("import rfjax.nn.nnx", "import jax, flax.nnx", 1.3),
    ("first draw: rfjax orthogonal", "first draw: jax.random.orthogonal", 1.5),
    (
        "cold fit: RandomFeatures + RidgeClassifier",
        "cold fit: jax.jit Fourier features + RidgeClassifier",
        1.5,
    ),
    ("cold fit: RandomFeatures + RidgeClassifier", "cold fit: RBFSampler + RidgeClassifier", None),
    (
        "cold fit: RandomFeatures + RidgeClassifier, warm persistent cache",
        "cold fit: RBFSampler + RidgeClassifier",
        None,
    ),
    ("NNX first step: PerformerAttention", "NNX first step: nnx.MultiHeadAttention", 1.5),
    (
        "NNX first step: PerformerAttention, Gaussian coupling",
        "NNX first step: nnx.MultiHeadAttention",
        None,
    ),
    (
        "NNX first step: PerformerAttention, warm persistent cache",
        "NNX first step: nnx.MultiHeadAttention",
        None,
    ),
)


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("JAX_COMPILATION_CACHE_DIR", "XLA_FLAGS", "PYTHONPATH"):
        env.pop(name, None)  # no cache, no test flags; the checkout's rfjax (cwd)
    return env


def run_case(case: Case, cache_dir: str | None) -> dict[str, float]:
    """One fresh process: the case's measurements (see ``CHILD``)."""
    setup = textwrap.dedent(case.setup)
    if cache_dir is not None:
        setup = PERSISTENT_CACHE.format(path=cache_dir) + setup
    code = CHILD.format(setup=setup, timed=textwrap.dedent(case.timed))
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=_environment(),
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode:
        raise RuntimeError(f"case {case.name!r} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def measure(repeats: int) -> dict:
    """Every case ``repeats`` times, round-robin; the samples and the machine's state."""
    import importlib.metadata

    samples: dict[str, list[dict[str, float]]] = {case.name: [] for case in CASES}
    load_before = _load()
    start = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    with tempfile.TemporaryDirectory() as cache_root:
        for case in CASES:  # fill the persistent caches first (not timed)
            if case.warm_cache:
                run_case(case, os.path.join(cache_root, str(CASES.index(case))))
        for _ in range(repeats):
            for index, case in enumerate(CASES):
                cache = os.path.join(cache_root, str(index)) if case.warm_cache else None
                samples[case.name].append(run_case(case, cache))
    versions = {
        name: importlib.metadata.version(name)
        for name in ("jax", "jaxlib", "flax", "scikit-learn", "numpy")
    }
    return {
        "started": start,
        "load_average_before": load_before,
        "load_average_after": _load(),
        "cpus": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "versions": versions,
        "repeats": repeats,
        "samples": samples,
    }


def _median(samples: list[dict], field: str) -> float:
    return statistics.median(s[field] for s in samples)


def summarise(run: dict) -> list[dict]:
    """Per pair: medians, ratios (CPU, wall) and whether the target is met (on CPU time)."""
    rows = []
    for ours, peer, target in PAIRS:
        a, b = run["samples"][ours], run["samples"][peer]
        cpu_ratio = _median(a, "cpu_s") / _median(b, "cpu_s")
        rows.append(
            {
                "rfjax": ours,
                "peer": peer,
                "rfjax_cpu_s": _median(a, "cpu_s"),
                "peer_cpu_s": _median(b, "cpu_s"),
                "cpu_ratio": cpu_ratio,
                "rfjax_wall_s": _median(a, "wall_s"),
                "peer_wall_s": _median(b, "wall_s"),
                "wall_ratio": _median(a, "wall_s") / _median(b, "wall_s"),
                "rfjax_compiles": a[0]["compiles"],
                "peer_compiles": b[0]["compiles"],
                "target": target,
                "met": None if target is None else cpu_ratio <= target,
            }
        )
    return rows


def markdown(run: dict, rows: list[dict]) -> str:
    def compiles(n):
        return "" if n is None else str(n)

    lines = [
        "# Cold start: rfjax against JAX, Flax and scikit-learn (`benchmarks/cold_start.py`)",
        "",
        f"Run {run['started']}: {run['repeats']} fresh processes per case, round-robin; "
        f"medians. Machine: {run['cpus']} CPUs ({run['cpu_model']}), load average "
        f"{run['load_average_before']} before and {run['load_average_after']} after (1, 5, 15 "
        f"min). Python {run['python']}, "
        + ", ".join(f"{k} {v}" for k, v in run["versions"].items())
        + ". CPU = user + system time of the process's threads in the measured statement; "
        "compilations = XLA programs compiled in it. Target met on the CPU ratio.",
        "",
        "| rfjax | peer | rfjax CPU s | peer CPU s | CPU ratio | rfjax wall s | peer wall s | "
        "wall ratio | compilations (rfjax / peer) | target | met |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        target = "" if r["target"] is None else f"<= {r['target']}x"
        met = "" if r["met"] is None else ("yes" if r["met"] else "**no**")
        lines.append(
            f"| {r['rfjax']} | {r['peer']} | {r['rfjax_cpu_s']:.3f} | {r['peer_cpu_s']:.3f} | "
            f"{r['cpu_ratio']:.2f} | {r['rfjax_wall_s']:.3f} | {r['peer_wall_s']:.3f} | "
            f"{r['wall_ratio']:.2f} | {compiles(r['rfjax_compiles'])} / "
            f"{compiles(r['peer_compiles'])} | {target} | {met} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    run = measure(args.repeats)
    rows = summarise(run)
    args.out.mkdir(parents=True, exist_ok=True)
    from benchmarks.timing import save_json  # here: the parent process stays without JAX

    save_json(args.out / "cold_start.json", {**run, "pairs": rows}, settings=vars(args))
    table = markdown(run, rows)
    (args.out / "cold_start.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
