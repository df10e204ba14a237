"""The headline results in one command: SimRF Fig. 6 (MSE ratios) and Fig. 8 (UCI classification).

Usage:
  python -m experiments.reproduce            # about 100 s on 2 CPU cores (README.md)
  python -m experiments.reproduce --full     # the full configs (tens of minutes)
  python -m experiments.reproduce --workdir=somewhere   # default workdirs/reproduce

Each experiment runs from its config (``configs/<name>.py``; a variant sized for a few minutes by
default, the full config with ``--full``) into ``<workdir>/<name>``; at the end the command
prints where each summary table and figure is. ``--full --workdir=results`` regenerates the
committed results that ``experiments.results_page`` collates into RESULTS.md.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import time

from absl import app, flags, logging

from experiments.main import SUMMARY_FILE, run_experiment

# (experiment, config variant for the default run, title); the full config of kernel_mse already
# takes about a minute, so it runs at full scale in both modes.
HEADLINE = (
    ("kernel_mse", None, "SimRF Fig. 6: MSE ratios to IID vs |x + y|, d = 64"),
    (
        "uci_classification",
        "reproduce",
        "SimRF Fig. 8: kernel regression on 8 UCI sets",
    ),
)

_FULL = flags.DEFINE_bool("full", False, "Run the full configs instead of the reproduce variant.")


def load_config(name: str, variant: str | None):
    """``configs.<name>.get_config(variant)``."""
    return importlib.import_module(f"configs.{name}").get_config(variant)


def summary_figures(summary: str) -> list[str]:
    """The figures ``summary`` (a summary.md) shows, as paths beside it, in its order: not every
    PNG in its folder, where an earlier run of another variant may have left others."""
    with open(summary, encoding="utf-8") as handle:
        targets = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", handle.read())
    folder = os.path.dirname(summary)
    return [os.path.join(folder, target) for target in dict.fromkeys(targets)]


def reproduce(workdir: str, full: bool) -> list[dict]:
    """Runs the headline experiments into ``workdir/<name>``; returns what each wrote."""
    written = []
    for name, quick_variant, title in HEADLINE:
        variant = None if full else quick_variant
        print(f"\n=== {title} ({variant or 'full'} config) ===", flush=True)
        start = time.perf_counter()
        experiment_dir = os.path.join(workdir, name)
        config_arg = f"configs/{name}.py" + (f":{variant}" if variant else "")
        command = ["python", "-m", "experiments.main", f"--config={config_arg}"]
        command += [f"--workdir={experiment_dir}"]
        run_experiment(load_config(name, variant), experiment_dir, command=command)
        summary = os.path.join(experiment_dir, SUMMARY_FILE)
        written.append(
            {
                "title": title,
                "summary": summary,
                "figures": summary_figures(summary),
                "seconds": time.perf_counter() - start,
            }
        )
    return written


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    logging.set_verbosity(logging.WARNING)
    # --workdir is experiments.main's flag (defined on import); here it is the output root.
    workdir = flags.FLAGS.workdir or os.path.join("workdirs", "reproduce")
    try:
        written = reproduce(workdir, _FULL.value)
    except KeyboardInterrupt:
        print("\ninterrupted (Ctrl-C); run the same command again to start over.", file=sys.stderr)
        sys.exit(130)
    print("\nDone. Results:")
    for item in written:
        print(f"- {item['title']} ({item['seconds']:.0f} s)")
        print(f"    summary table: {item['summary']}")
        for figure in item["figures"]:
            print(f"    figure:        {figure}")
    sys.stdout.flush()


if __name__ == "__main__":
    app.run(main)
