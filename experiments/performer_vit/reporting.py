"""Performer-ViT's report: paired differences, tables, figures, verdicts and the summary."""

from __future__ import annotations

import math
import os
from typing import Any

import matplotlib
import ml_collections
import numpy as np

from experiments.core import outputs, plots, stats, tabulate, verdicts
from experiments.core.train import trainer as train
from experiments.performer_vit.task import (
    COMPARISONS,
    LABELS,
    METRICS,
    _label,
    is_redrawn_throughout,
    primary_metric,
    run_name,
    run_names,
)

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def seeds_at_3se(sd: float, target: float) -> int:
    """Paired seeds n at which ``target`` is 3 SE: n = (3 sd / target)^2, at least 2."""
    return max(2, math.ceil((3 * sd / target) ** 2))


def paired_row(
    runs: list[dict], metric: str, field: str, better: str, worse: str, config
) -> dict | None:
    """``better - worse`` in ``metric``, paired by seed (the arms named by ``field``): the
    estimate's fields (``stats.Estimate.as_dict``) and the seeds that would put
    ``config.target_difference`` at 3 SE; None where fewer than two seeds have both."""
    a, b = tabulate.paired_arms(runs, metric, field, better, worse)
    if len(a) < 2:
        return None
    difference = stats.paired_difference(a, b)
    return {
        **difference.as_dict(),
        "seeds_for_target_at_3se": seeds_at_3se(difference.sd, config.target_difference),
    }


def differences(runs: list[dict], config: ml_collections.ConfigDict) -> list[dict]:
    """Paired differences per protocol and metric: better - worse coupling, exact - each."""
    rows = []
    for protocol in config.protocols:
        pairs = [
            (run_name(a, protocol), run_name(b, protocol))
            for a, b in COMPARISONS
            if a in config.attentions and b in config.attentions
        ]
        if "exact" in config.attentions:
            pairs += [("exact", run_name(a, protocol)) for a in config.attentions if a != "exact"]
        for metric in METRICS:
            for better, worse in pairs:
                difference = paired_row(runs, metric, "run", better, worse, config)
                if difference is None:
                    continue
                rows.append(
                    {
                        "protocol": protocol,
                        "metric": metric,
                        "primary": metric == primary_metric(config, protocol),
                        "comparison": f"{_label(better.split('_')[-1])} - "
                        f"{_label(worse.split('_')[-1])}",
                        **difference,
                    }
                )
    return rows


def accuracy_table(runs: list[dict], config: ml_collections.ConfigDict) -> list[dict]:
    """Mean ± SE over seeds of both accuracies per run."""
    rows = []
    for name, attention, protocol in run_names(config):
        row: dict[str, Any] = {"protocol": protocol or "-", "attention": _label(attention)}
        for metric in METRICS:
            values = tabulate.seed_values(runs, metric, run=name)
            row[f"test accuracy, {METRICS[metric]}"] = tabulate.summarise(values)
        row["seeds"] = len(values)
        rows.append(row)
    return rows


def attention_error_rows(runs: list[dict], config: ml_collections.ConfigDict) -> list[dict]:
    """Per trained model: each coupling's attention error, mean ± SE over seeds, SimRF - ORF
    (paired by seed: the same queries and keys), the uniform matrix's error and the learned
    temperatures (where the records have them)."""
    couplings = [c for c in config.attentions if c != "exact"]
    rows = []
    for name, attention, protocol in run_names(config):
        mine = sorted((r for r in runs if r["run"] == name), key=lambda r: r["seed"])
        row: dict[str, Any] = {
            "queries and keys of": f"{protocol or ''} {_label(attention)}".strip()
        }
        errors = {c: np.array([r["attention_error"][c] for r in mine]) for c in couplings}
        for coupling in couplings:
            mean, se = (float(v) for v in stats.mean_se(errors[coupling]))
            row[_label(coupling)] = tabulate.plus_minus(mean, se)
            row[f"{coupling}_mean"] = mean
            row[f"{coupling}_se"] = se
        if {"simplex", "orthogonal"} <= set(couplings):
            row["SimRF / ORF"] = f"{errors['simplex'].mean() / errors['orthogonal'].mean():.3f}"
            row["SimRF - ORF"] = "-"
            if len(mine) > 1:  # paired by model: both couplings see the same queries and keys
                diff = stats.paired_difference(errors["simplex"], errors["orthogonal"])
                row["SimRF - ORF"] = tabulate.plus_minus(diff.mean, diff.se, "+.4f")
        if all("uniform_attention_error" in r for r in mine):
            row["uniform 1/S"] = tabulate.summarise(
                np.array([r["uniform_attention_error"] for r in mine])
            )
        if all(r.get("temperatures") for r in mine):
            row["learned tau (min-max)"] = _range([t for r in mine for t in r["temperatures"]])
        rows.append(row)
    return rows


def _range(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def _performer_runs(runs: list[dict]) -> list[dict]:
    return [r for r in runs if r["attention"] != "exact"]


def attention_error_difference(
    runs: list[dict], config: ml_collections.ConfigDict
) -> stats.Estimate | None:
    """SimRF - ORF attention error, one paired test over every trained model (each model's
    queries and keys estimated by both couplings); None if either coupling was not drawn."""
    if not {"simplex", "orthogonal"} <= set(config.attentions):
        return None
    errors = {c: [r["attention_error"][c] for r in runs] for c in ("simplex", "orthogonal")}
    return stats.paired_difference(errors["simplex"], errors["orthogonal"])


def random_feature_gap(runs: list[dict]) -> stats.Estimate:
    """Own-projection minus fresh-draw accuracy, paired by run over every Performer run: near 0
    for a random-feature model, large for one co-adapted to its projection."""
    performers = _performer_runs(runs)
    return stats.paired_difference(
        [r["accuracy_own"] for r in performers], [r["accuracy_fresh"] for r in performers]
    )


# --------------------------------------------------------------------------- report


def _plot_differences(rows: list[dict], config, path: str) -> None:
    """Forest plot: paired differences of each protocol's primary accuracy, 95% t intervals."""
    shown = [r for r in rows if r["primary"]]
    fig, ax = plt.subplots(figsize=(6.5, 0.45 * len(shown) + 2.2))
    labels = [f"{r['protocol']} ({METRICS[r['metric']]}): {r['comparison']}" for r in shown]
    plots.forest(
        ax,
        [r["mean"] for r in shown],
        [[r["mean"] - r["low"] for r in shown], [r["high"] - r["mean"] for r in shown]],
        labels,
        color="C0",
        top_down=True,
        label="mean paired difference, 95% t interval",
        fontsize=8,
    )
    ax.axvline(
        config.target_difference,
        color="C3",
        linestyle="--",
        linewidth=0.8,
        label=f"paper's SimRF - ORF gain ({100 * config.target_difference:+.1f} points)",
    )
    ax.set_xlabel("test accuracy difference, paired by seed (percentage points)")
    ax.xaxis.set_major_formatter(lambda value, _: f"{100 * value:+.1f}")
    # Above the axes: inside, it would cover the points of the lowest rows.
    ax.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    outputs.save_figure(fig, path)


def _plot_curves(curves: dict, config, path: str) -> None:
    """Train loss and test accuracy (own projection) vs step: mean over seeds, ±1 SE band."""
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for index, (name, attention, protocol) in enumerate(run_names(config)):
        style = "--" if protocol == "redraw" else "-"
        label = f"{protocol or ''} {_label(attention)}".strip()
        for axis, (split, metric) in zip(
            axes, (("train", "loss"), ("eval", "accuracy")), strict=True
        ):
            steps, values = plots.logged_series(curves[name], split, metric)
            plots.mean_se_band(axis, steps, values, color=f"C{index}", label=label, style=style)
    for axis in axes:
        if "redraw" in config.protocols:
            axis.axvline(config.redraw_until_step, color="grey", linewidth=0.8, linestyle=":")
    axes[0].set(xlabel="step", ylabel="train loss", yscale="log", title="training loss")
    axes[1].set(
        xlabel="step",
        ylabel="test accuracy (own projection)",
        title="test accuracy; dotted: last redraw",
    )
    axes[1].legend(fontsize=7, title="mean over seeds, band ±1 SE", title_fontsize=7)
    outputs.save_figure(figure, path)


def _plot_attention_error(rows: list[dict], config, path: str) -> None:
    """Relative attention-matrix error per coupling on each trained model's q, k (±2 SE bars)."""
    couplings = [c for c in config.attentions if c != "exact"]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows)), 3.8))
    width = 0.8 / len(couplings)
    x = np.arange(len(rows))
    for index, coupling in enumerate(couplings):
        ax.bar(
            x + (index - (len(couplings) - 1) / 2) * width,
            [r[f"{coupling}_mean"] for r in rows],
            width,
            yerr=[2 * r[f"{coupling}_se"] for r in rows],
            capsize=2,
            color=f"C{index}",
            label=_label(coupling),
        )
    ax.set_xticks(x, [r["queries and keys of"] for r in rows], fontsize=7, rotation=20)
    ax.set_ylabel("|A_hat - A|_F / |A|_F")
    ax.set_title(
        f"FAVOR+ attention-matrix error, m = {config.model.num_features} (bars ±2 SE over seeds)",
        fontsize=9,
    )
    ax.legend(fontsize=7, title="coupling", title_fontsize=7)
    outputs.save_figure(fig, path)


def _find(rows: list[dict], protocol: str, comparison: str) -> dict:
    """The row of ``comparison`` on ``protocol``'s primary metric ({} if not measured)."""
    for row in rows:
        if (row["protocol"], row["comparison"]) == (protocol, comparison) and row["primary"]:
            return row
    return {}


def _difference(row: dict) -> stats.Estimate:
    return stats.Estimate(row["mean"], row["se"], row["n"], row["n"] - 1)


def judge(diff_rows: list[dict], runs: list[dict], config) -> verdicts.Verdicts:
    """The verdicts on the claims ``config`` declares, each over the runs (arms) its test uses
    after the declared training check: the primary accuracy differences per protocol (pooled
    over protocols, or every protocol for "never worse"), SimRF - ORF attention error in one
    paired test over every trained model, and own - fresh accuracy over every Performer run
    (the model is a random-feature model)."""
    judge = verdicts.Verdicts(config)
    judge.check_training(runs, "run")
    for name, comparison in (("simrf_beats_orf", "SimRF - ORF"), ("orf_beats_iid", "ORF - IID")):
        cells = {
            p: _difference(row)
            for p in config.protocols
            if (row := _find(diff_rows, p, comparison))
        }
        if not cells:
            judge.not_tested(name, f"no {comparison} pair with two or more seeds was trained")
            continue
        judge.ordering(
            name,
            cells,
            effect=f"{comparison} test accuracy ({_primary_text(config)}), paired by seed",
            cell_name="protocols",
            units="seeds",
            number=".4f",
            arms=_comparison_runs(runs, cells, comparison),
        )
    never_worse = {
        p: _difference(row) for p in config.protocols if (row := _find(diff_rows, p, "SimRF - ORF"))
    }
    judge.every(
        "simrf_never_worse",
        never_worse,
        effect=f"SimRF - ORF test accuracy ({_primary_text(config)}), paired by seed",
        cell_name="protocols",
        units="seeds",
        number=".4f",
        arms=_comparison_runs(runs, never_worse, "SimRF - ORF") or None,
    )
    error = attention_error_difference(runs, config) if len(runs) > 1 else None
    if error is None:
        judge.not_tested(
            "attention_error", "fewer than two models with ORF and SimRF attention estimated"
        )
    else:
        judge.effect(
            "attention_error",
            error,
            effect="SimRF - ORF attention error, paired on each trained model's queries and keys",
            units="models",
            number=".4f",
            arms=sorted({r["run"] for r in runs}),
        )
    if len(_performer_runs(runs)) > 1:
        judge.effect(
            "random_feature_model",
            random_feature_gap(runs),
            effect="own-projection - fresh-draw test accuracy, paired by Performer run",
            units="runs",
            number=".4f",
            arms=sorted({r["run"] for r in _performer_runs(runs)}),
        )
    else:
        judge.not_tested("random_feature_model", "fewer than two Performers were trained")
    return judge


def _comparison_runs(runs: list[dict], cells: dict, comparison: str) -> list[str]:
    """The runs (arms) of a "A - B" coupling comparison on the protocols of ``cells``."""
    names = {label: name for name, label in LABELS.items()}
    couplings = [names[part.strip()] for part in comparison.split(" - ")]
    return sorted(
        {r["run"] for r in runs if r["protocol"] in cells and r["attention"] in couplings}
    )


def _primary_text(config) -> str:
    """The primary metrics of the trained protocols, in words."""
    return ", ".join(f"{p}: {METRICS[primary_metric(config, p)]}" for p in config.protocols)


def difference_text(row: dict) -> str:
    if not row:
        return "not measured"
    return tabulate.estimate_text(
        row["mean"], row["se"], (row["low"], row["high"]), details=[f"{row['n']} seeds"]
    )


def _power_text(rows: list[dict], config) -> str:
    lines = []
    for protocol in config.protocols:
        row = _find(rows, protocol, "SimRF - ORF")
        if not row:
            continue
        lines.append(
            f"- {protocol}: sd of the paired SimRF - ORF difference {row['sd']:.4f}; with "
            f"{row['n']} seeds its SE is {row['se']:.4f}; "
            f"{stats.units_for_power(row['sd'], config.target_difference)} seeds give 80% "
            f"power at {config.target_difference} ({row['seeds_for_target_at_3se']} would put "
            "it at 3 SE)."
        )
    return "\n".join(lines) or "- not measured (no SimRF - ORF pair with two or more seeds)"


def _protocol_text(config) -> str:
    """One bullet per trained protocol."""
    texts = {"fixed": "**fixed**: one projection for the whole run"}
    if is_redrawn_throughout(config, "redraw"):
        texts["redraw"] = (
            "**redraw**: a new projection at every training step to the last, so no projection "
            "is seen twice and none can be co-adapted to"
        )
    else:
        steps_after = config.train.num_train_steps - config.redraw_until_step
        texts["redraw"] = (
            f"**redraw**: redrawn every {config.model.redraw_interval} steps up to step "
            f"{config.redraw_until_step}, then kept: the last {steps_after} steps train with "
            "the projection the model is evaluated with, starting at "
            f"{lr_fraction(config, config.redraw_until_step):.2f} of the peak learning rate"
        )
    return "\n".join(f"- {texts[p]};" for p in config.protocols)


def _scores_text(config) -> str:
    if config.model.get("query_key_norm", False):
        return (
            "normalised queries and keys (cosine scores tau q^.k^ with a learned per-head "
            f"temperature, initialised at {config.model.initial_temperature})"
        )
    return "scores q.k / sqrt(H) (queries and keys not normalised)"


def _timing_text(runs: list[dict]) -> str:
    if all("load_average" in r for r in runs):
        return outputs.timing_text(runs)
    minutes = sum(r["train_seconds"] for r in runs) / 60
    return f"{len(runs)} runs took {minutes:.1f} min wall clock of training (load not recorded)"


def _claim_values(diff_rows: list[dict], runs: list[dict], config) -> dict[str, object]:
    """The differences, errors and gaps the summary's claims quote."""
    values: dict[str, object] = {}
    for name, comparison in (("simrf_orf", "SimRF - ORF"), ("orf_iid", "ORF - IID")):
        texts = [
            f"{p} {difference_text(_find(diff_rows, p, comparison))}" for p in config.protocols
        ]
        values[name] = "; ".join(texts)
    couplings = [c for c in config.attentions if c != "exact"]
    errors = [
        f"{_label(c)} {tabulate.summarise(np.array([r['attention_error'][c] for r in runs]))}"
        for c in couplings
    ]
    if all("uniform_attention_error" in r for r in runs):
        uniform = np.array([r["uniform_attention_error"] for r in runs])
        errors.append(f"uniform 1/S {tabulate.summarise(uniform)}")
    values["mean_errors"] = ", ".join(errors) + f" ({len(runs)} models)"
    gaps = []
    for protocol in config.protocols:
        mine = [r for r in _performer_runs(runs) if r["protocol"] == protocol]
        if len(mine) > 1:
            gap = random_feature_gap(mine)
            gaps.append(
                f"{protocol} {tabulate.plus_minus(gap.mean, gap.se, '+.4f')} ({gap.n} runs)"
            )
    values["gap_by_protocol"] = "; ".join(gaps) or "not measured"
    return values


def _write_files(results: dict, diff_rows: list, error_rows: list, config, workdir: str) -> None:
    """runs.csv, differences.csv, attention_error.csv and the three figures."""
    flat_runs = [
        {
            **{
                k: v
                for k, v in r.items()
                if k not in ("accuracy_draws", "attention_error", "temperatures")
            },
            **{f"attention_error_{c}": e for c, e in r["attention_error"].items()},
            **({"mean_temperature": np.mean(r["temperatures"])} if r.get("temperatures") else {}),
        }
        for r in results["runs"]
    ]
    outputs.write_csv(os.path.join(workdir, "runs.csv"), flat_runs)
    if diff_rows:
        outputs.write_csv(os.path.join(workdir, "differences.csv"), diff_rows)
        _plot_differences(diff_rows, config, os.path.join(workdir, "paired_differences.png"))
    outputs.write_csv(
        os.path.join(workdir, "attention_error.csv"),
        [{k: v for k, v in r.items() if not k.startswith("_")} for r in error_rows],
    )
    _plot_curves(results["curves"], config, os.path.join(workdir, "learning_curves.png"))
    _plot_attention_error(error_rows, config, os.path.join(workdir, "attention_error.png"))


def difference_table(diff_rows: list[dict], primary: bool) -> str:
    """The primary (SimRF - ORF) or secondary paired differences as a markdown table."""
    shown = [r for r in diff_rows if r["primary"] == primary]
    if not shown:
        return "(fewer than two paired seeds: no differences)"
    return outputs.markdown_table(
        [
            {
                "protocol": r["protocol"],
                "metric": METRICS[r["metric"]],
                "difference": r["comparison"],
                "mean ± SE": tabulate.plus_minus(r["mean"], r["se"], "+.4f"),
                "95% CI": f"[{r['low']:+.4f}, {r['high']:+.4f}]",
                "seeds": r["n"],
                "sd": f"{r['sd']:.4f}",
            }
            for r in shown
        ]
    )


def report(results: dict, config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Tables, figures and the summary from ``measure``'s results."""
    runs = results["runs"]
    diff_rows = differences(runs, config)
    accuracy_rows = accuracy_table(runs, config)
    error_rows = attention_error_rows(runs, config)
    _write_files(results, diff_rows, error_rows, config, workdir)
    verdicts.write_summary(
        workdir,
        "performer_vit",
        judge(diff_rows, runs, config),
        config,
        protocols=", ".join(config.protocols),
        head_dim=config.model.hidden_size // config.model.num_heads,
        scores=_scores_text(config),
        num_train=results["num_train"],
        num_test=results["num_test"],
        seeds=", ".join(f"{p} {config.num_seeds[p]}" for p in config.protocols),
        reference=" and ".join(_label(a) for a in config.reference_attentions) or "none",
        protocol_text=_protocol_text(config),
        primary=_primary_text(config),
        **_claim_values(diff_rows, runs, config),
        power=_power_text(diff_rows, config),
        accuracy_table=outputs.markdown_table(accuracy_rows),
        difference_table=difference_table(diff_rows, True),
        secondary_difference_table=difference_table(diff_rows, False),
        attention_table=outputs.markdown_table(
            [{k: v for k, v in r.items() if not k.endswith(("_mean", "_se"))} for r in error_rows]
        ),
        timing=_timing_text(runs),
    )
    print(outputs.markdown_table(accuracy_rows))
    print(difference_table(diff_rows, True))
    return {"runs": runs, "differences": diff_rows, "attention_error": error_rows}


def lr_fraction(config: ml_collections.ConfigDict, step: int) -> float:
    """The learning rate at ``step`` as a fraction of the peak."""
    _, schedule = train.make_optimizer(config.train)
    return float(schedule(step)) / config.train.learning_rate
