"""Performer-ViT with FAVOR+, FAVOR++ (OPRF) and FAVOR# (SADERF) features: do the optimised maps
train better Performers? (arXiv:2205.15317, arXiv:2302.00787; issue 16)

Runs: for every feature map of ``config.feature_maps``, ``experiments.performer_vit.measure_run``
trains and evaluates the Performer-ViT of ``config.vit`` with that map and ``config.coupling``
(fixed projection protocol, ``num_seeds`` seeds from ``config.vit.train.seed`` on, as
performer_vit's), one core sweep cell per run in
``workdir/runs/<map>_seed<k>`` (resumable, extendable by seeds).
The seeds are paired across maps: the same initialisation and batches (the maps have no trained
parameters), so a paired difference isolates the features.

Reported (``summary.md``, ``verdicts.json``, ``runs.csv``, ``paired_differences.png``): per map,
test accuracy with the run's own projection (the primary metric, as in performer_vit) and
averaged over fresh projections, and the attention-matrix error of the map on the run's own
trained queries and keys; paired differences map - baseline with Student-t 95% intervals and
verdicts; the seeds that would put ``target_difference`` at 3 SE.
"""

from __future__ import annotations

import copy
import os

import matplotlib
import matplotlib.ticker
import ml_collections

from experiments import performer_vit
from experiments.core import outputs, plots, records, stats, sweep, tabulate, verdicts
from experiments.core.study import Study
from experiments.core.validate import require_names, require_no_repeats, require_positive
from rfjax import features, projections

matplotlib.use("Agg")
import matplotlib.pyplot as plt

STUDY = Study(
    paper="Beyond SimRF: OPRF (FAVOR++), DERF (FAVOR#) and norm-coupled features (issue 16)",
    order=170,
    reproduces=(
        "Issue 16: Performer-ViT with FAVOR+, FAVOR++ (OPRF) and FAVOR# (SADERF) features: "
        "do the optimised maps train better Performers?"
    ),
)

PROTOCOL = "fixed"
METRICS = {
    "accuracy_own": "test accuracy, own projection",
    "accuracy_fresh": "test accuracy, fresh draws",
    "attention_error": "attention error on own queries/keys",
}


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks the map and coupling names, the seeds and the Performer-ViT settings.

    Raises:
      ValueError: naming the field, the value and what is allowed.
    """
    require_no_repeats(config, "feature_maps")
    require_names(config, "feature_maps", features.available(kernel="softmax"))
    require_names(config, "baseline", tuple(config.feature_maps))
    require_names(config, "coupling", projections.available())
    require_positive(config, "num_seeds", "target_difference")
    performer_vit.validate_config(
        map_config(config, config.baseline, config.num_seeds), prefix="config.vit"
    )


def map_config(
    config: ml_collections.ConfigDict, feature_map: str, num_seeds: int
) -> ml_collections.ConfigDict:
    """The performer_vit config of one map's runs on ``num_seeds`` seeds (``run_seeds``)."""
    vit = copy.deepcopy(config.vit)
    vit.model.feature_map = feature_map
    vit.attentions = (config.coupling,)
    vit.protocols = (PROTOCOL,)
    vit.num_seeds = ml_collections.ConfigDict({PROTOCOL: num_seeds})
    vit.reference_attentions = ()
    vit.num_reference_seeds = 0
    vit.target_difference = config.target_difference
    return vit


# Fields of a map's performer_vit config that name or count the runs (what only the report reads
# or only speeds a run up, ``records.settings`` leaves out itself).
RUN_INDEPENDENT = ("variant", "num_seeds")


def run_settings(vit: ml_collections.ConfigDict) -> dict:
    """What a run of the map config ``vit`` (``map_config``) depends on: a stored run whose
    settings differ is measured again (``core.sweep``), so a new target difference or cache
    folder keeps the runs."""
    return records.settings(vit, exclude=RUN_INDEPENDENT)


def run_seeds(config: ml_collections.ConfigDict) -> range:
    """The runs' seeds: ``num_seeds`` from ``config.vit.train.seed`` on (performer_vit's rule)."""
    first = config.vit.train.seed
    return range(first, first + config.num_seeds)


def measure(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Trains and evaluates every (map, seed) with the core sweep (every map's seed k before
    any map's seed k + 1, so that a run stopped early leaves complete pairs): one record per
    run."""
    configs = {m: map_config(config, m, config.num_seeds) for m in config.feature_maps}
    arrays = performer_vit.load_arrays(configs[config.baseline])
    performer_vit.train.enable_compilation_cache(workdir, config.vit.compilation_cache_dir)

    def measure_run(feature_map: str, seed: int, _) -> dict:
        record = performer_vit.measure_run(
            configs[feature_map], arrays, feature_map, config.coupling, PROTOCOL, seed, workdir
        )
        own_error = record["attention_error"][config.coupling]
        return {**record, "feature_map": feature_map, "attention_error": own_error}

    cells = sweep.run(
        workdir,
        list(config.feature_maps),
        run_seeds(config),
        measure_run,
        lambda m: run_settings(configs[m]),
    )
    runs = [{k: v for k, v in c.items() if k not in ("curve", "arm", "seconds")} for c in cells]
    # The machine's 1-min load average when the sweep ended: its share of the 2 cores.
    return {
        "runs": runs,
        "num_test": len(arrays["test"]["label"]),
        "load_average": os.getloadavg()[0],
    }


def accuracy_rows(runs: list[dict], config: ml_collections.ConfigDict) -> list[dict]:
    """Mean ± SE over seeds of every metric, per map."""
    rows = []
    for feature_map in config.feature_maps:
        row: dict = {"feature map": features.info(feature_map).label}
        for metric, label in METRICS.items():
            values = tabulate.seed_values(runs, metric, feature_map=feature_map)
            row[label] = tabulate.summarise(values)
        row["seeds"] = len(values)
        rows.append(row)
    return rows


def differences(runs: list[dict], config: ml_collections.ConfigDict) -> list[dict]:
    """Paired differences map - baseline per metric (seeds both have), with the seeds needed
    to put ``target_difference`` at 3 SE."""
    rows = []
    for feature_map in (m for m in config.feature_maps if m != config.baseline):
        for metric in METRICS:
            difference = performer_vit.paired_row(
                runs, metric, "feature_map", feature_map, config.baseline, config
            )
            if difference is None:
                continue
            rows.append(
                {
                    "feature_map": feature_map,
                    "metric": metric,
                    "comparison": f"{features.info(feature_map).label} - "
                    f"{features.info(config.baseline).label}",
                    **difference,
                }
            )
    return rows


def judge(
    rows: list[dict], runs: list[dict], config: ml_collections.ConfigDict
) -> verdicts.Verdicts:
    """The optimised maps against the baseline: accuracy (better) and attention error (lower),
    each a claim over several maps, so an intersection: one paired test per map, holding only
    where every map's does; every map's runs after the declared training check."""
    judge = verdicts.Verdicts(config)
    judge.check_training(runs, "feature_map", label=lambda m: features.info(m).label)
    for name, metric, effect in (
        ("better_accuracy", "accuracy_own", "test accuracy (own projection)"),
        ("lower_attention_error", "attention_error", "attention error on own queries and keys"),
    ):
        cells = {
            features.info(r["feature_map"]).label: stats.Estimate(
                r["mean"], r["se"], r["n"], r["n"] - 1
            )
            for r in rows
            if r["metric"] == metric
        }
        judge.every(
            name,
            cells,
            effect=f"map - {features.info(config.baseline).label} {effect}, paired by seed",
            cell_name="maps",
            units="seeds",
            number=".4f",
            arms=[features.info(m).label for m in config.feature_maps],
        )
    return judge


def power_lines(rows: list[dict], config: ml_collections.ConfigDict) -> str:
    """One line per map: the power of its paired accuracy difference."""
    return "\n".join(
        f"- {features.info(r['feature_map']).label}: sd of the paired accuracy difference "
        f"{r['sd']:.4f}; {r['n']} seeds give SE {r['se']:.4f} (3 SE = {3 * r['se']:.4f}); "
        f"{r['seeds_for_target_at_3se']} seeds would put {config.target_difference:+.3f} at 3 SE."
        for r in rows
        if r["metric"] == "accuracy_own"
    )


def plot_differences(rows: list[dict], config: ml_collections.ConfigDict, path: str) -> None:
    """Paired accuracy differences (own projection) with their 95% intervals."""
    shown = [r for r in rows if r["metric"] == "accuracy_own"]
    fig, axis = plt.subplots(figsize=(7, 1.2 + 0.7 * max(len(shown), 1)))
    plots.forest(
        axis,
        [r["mean"] for r in shown],
        [[r["mean"] - r["low"] for r in shown], [r["high"] - r["mean"] for r in shown]],
        [features.info(r["feature_map"]).label for r in shown],
        color=None,
        capsize=4,
        zero_color="grey",
        zero_width=1,
    )
    axis.axvline(config.target_difference, color="tab:red", ls="--", lw=1, label="target gain")
    axis.set_ylim(-0.6, len(shown) - 0.4)
    axis.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(5))
    axis.set_xlabel(
        f"test accuracy minus {features.info(config.baseline).label}'s, paired by seed\n"
        "(mean and Student-t 95% interval)"
    )
    axis.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    outputs.save_figure(fig, path)


def timing_text(runs: list[dict], load_average: float) -> str:
    """The runs' training wall time (the trainer's ``train_seconds``, first-run compilation
    included), and the machine's 1-min load average when the sweep ended."""
    minutes = sum(r["train_seconds"] for r in runs) / 60
    return (
        f"{len(runs)} runs, {minutes:.1f} min of training wall time in all (each map's first run "
        "includes most of the compilation: later runs read the JAX compilation cache); the "
        f"machine's 2 CPU cores were shared with other jobs (1-min load average "
        f"{load_average:.1f} when the sweep ended)"
    )


def difference_table(rows: list[dict]) -> list[dict]:
    """The paired differences as shown in the summary."""
    return [
        {
            "comparison": r["comparison"],
            "metric": METRICS[r["metric"]],
            "difference": tabulate.plus_minus(r["mean"], r["se"], "+.4f"),
            "95% CI": f"[{r['low']:+.4f}, {r['high']:+.4f}]",
            "seeds": r["n"],
        }
        for r in rows
    ]


def report(results: dict, config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Tables, the figure and the summary from ``measure``'s results."""
    runs = results["runs"]
    rows = differences(runs, config)
    table = accuracy_rows(runs, config)
    outputs.write_csv(
        os.path.join(workdir, "runs.csv"),
        [{k: v for k, v in r.items() if k != "accuracy_draws"} for r in runs],
    )
    if rows:
        plot_differences(rows, config, os.path.join(workdir, "paired_differences.png"))
    verdicts.write_summary(
        workdir,
        "performer_vit_maps",
        judge(rows, runs, config),
        config,
        maps=", ".join(features.info(m).label for m in config.feature_maps),
        num_test=results["num_test"],
        first_seed=run_seeds(config)[0],
        last_seed=run_seeds(config)[-1],
        target=f"{config.target_difference:+.3f}",
        power=power_lines(rows, config),
        accuracy_table=outputs.markdown_table(table),
        difference_table=outputs.markdown_table(difference_table(rows)),
        timing=timing_text(runs, results["load_average"]),
    )
    print(outputs.markdown_table(table))
    return {"runs": runs, "differences": rows}
