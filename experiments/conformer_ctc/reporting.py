"""Conformer-CTC's report: the gated paired comparisons, verdicts, tables, figures and summary."""

from __future__ import annotations

import math
import os

import matplotlib
import ml_collections
import numpy as np

from experiments.conformer_ctc.task import (
    HYBRIDS,
    SIGNIFICANCE,
    TRIGONOMETRIC_KINDS,
    _label,
    digit_error_rate,
)
from experiments.core import outputs, plots, stats, tabulate, verdicts
from rfjax.nn import conformer_attentions

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _gate(runs: list[dict]) -> stats.Estimate:
    """FAVOR+ - exact test DER, paired by seed: does this task resolve attention kinds?"""
    return stats.paired_difference(
        tabulate.seed_values(runs, "digit_error_rate", attention="positive"),
        tabulate.seed_values(runs, "digit_error_rate", attention="exact"),
    )


def comparisons(runs: list[dict], attentions) -> list[dict]:
    """The gated paired differences: FAVOR+ - exact first, then every other kind - FAVOR+."""
    pairs = []
    if "exact" in attentions and "positive" in attentions:
        pairs.append(("positive", "exact"))
    if "positive" in attentions:
        pairs += [(a, "positive") for a in attentions if a not in ("exact", "positive")]
    if set(HYBRIDS) <= set(attentions):
        pairs.append(("cluster_hybrid", "angular_hybrid"))
    return [
        {
            "kind": kind,
            "reference": reference,
            **stats.paired_difference(
                tabulate.seed_values(runs, "digit_error_rate", attention=kind),
                tabulate.seed_values(runs, "digit_error_rate", attention=reference),
            ).as_dict(),
        }
        for kind, reference in pairs
    ]


def _format_difference(row: dict) -> str:
    shown = tabulate.plus_minus(row["mean"], row["se"], "+.4f")
    return f"{shown} (t = {row['t']:.2f}, p = {row['p']:.3g})"


# claim -> (the claimed-worse kinds, the claimed-better kinds): each claim is an intersection
# over pairs, one cell per (claimed-better, claimed-worse) kind, the effect the claimed-worse
# kind's test DER minus the claimed-better one's, per seed (positive where the claim shows).
ORDERINGS = {
    "hybrid_ordering": (("positive",), HYBRIDS),
    "hybrids_beat_trigonometric": (("trigonometric",), HYBRIDS),
    "cluster_best": (("angular_hybrid",), ("cluster_hybrid",)),
}


def ordering_cells(runs: list[dict], worse: tuple[str, ...], better: tuple[str, ...]) -> dict:
    """One cell per (claimed-better, claimed-worse) pair: the paired difference in test DER
    (worse - better) over seeds."""
    return {
        f"{_label(b)} vs {_label(w)}": stats.paired_difference(
            tabulate.seed_values(runs, "digit_error_rate", attention=w),
            tabulate.seed_values(runs, "digit_error_rate", attention=b),
        )
        for b in better
        for w in worse
    }


def judge(results: dict, config: ml_collections.ConfigDict) -> verdicts.Verdicts:
    """The paper's orderings (``ORDERINGS``), each an intersection over its pairs of kinds
    (``Verdicts.every``: a paired test over seeds per pair, holding only where every pair does).
    With ``config.gate_first`` they are tested only where the task resolves attention kinds
    (the gate: FAVOR+ - exact). Every ordering's test uses its kinds and the exact-attention
    models (the task's reference: if they do not use their attention, no ordering of
    approximations of it is testable); an ordering using a kind that failed the declared
    training check (``config.trained_check``) is not tested."""
    judge = verdicts.Verdicts(config)
    runs = results["runs"]
    judge.check_training(runs, "attention", label=_label, remedy=lambda arms: _remedy(arms, config))
    trained = {r["attention"] for r in runs}
    why_not = _gate_failure(runs, trained) if config.gate_first else None
    for name, (worse, better) in ORDERINGS.items():
        if name not in judge.claims:
            continue
        missing = [a for a in ("exact", *worse, *better) if a not in trained]
        if why_not or missing:
            judge.not_tested(name, why_not or f"not trained: {', '.join(map(_label, missing))}")
            continue
        judge.every(
            name,
            ordering_cells(runs, worse, better),
            effect="test DER of the claimed-worse kind - the claimed-better kind's, paired by seed",
            cell_name="pairs",
            units="seeds",
            number=".4f",
            arms=[_label(a) for a in ("exact", *worse, *better)],
        )
    return judge


def _gate_failure(runs: list[dict], trained: set[str]) -> str | None:
    """Why the gate stops the orderings (None if it passes)."""
    if not {"exact", "positive"} <= trained:
        return "the gate needs exact and FAVOR+ runs"
    gate = _gate(runs)
    if gate.p < SIGNIFICANCE:
        return None
    shown = tabulate.estimate_text(
        gate.mean, gate.se, gate.interval(), details=[f"p = {gate.p:.2g}", f"{gate.n} paired seeds"]
    )
    return (
        f"this task does not resolve attention kinds: FAVOR+ - exact test DER = {shown}, so any "
        "ordering of the hybrids would be noise"
    )


def trigonometric_relative_sd(temperature: float, num_features: int) -> float:
    """Standard deviation over draws of the trigonometric estimate of the cosine-attention
    kernel exp(tau q^.k^) at orthogonal unit q, k, relative to the kernel's value (1): with
    q' = sqrt(tau) q^, k' = sqrt(tau) k^ the estimate is e^tau times the mean over m i.i.d.
    Gaussian w of cos(w.(q' - k')), |q' - k'|^2 = 2 tau, whose variance is
    ((1 + e^{-4 tau}) / 2 - e^{-2 tau}) / m."""
    variance = (1 + math.exp(-4 * temperature)) / 2 - math.exp(-2 * temperature)
    return math.exp(temperature) * math.sqrt(variance / num_features)


def _remedy(untrained: list[str], config) -> str:
    """What would test a claim whose kinds ``untrained`` (labels) failed the training check."""
    tau, m = config.model.initial_temperature, config.model.num_features
    kinds = {_label(a): a for a in conformer_attentions()}
    signed = [kinds[a] for a in untrained if kinds.get(a) in TRIGONOMETRIC_KINDS]
    others = [kinds.get(a, a) for a in untrained if kinds.get(a) not in TRIGONOMETRIC_KINDS]
    parts = []
    if signed:
        parts.append(
            f"a variant in which {' and '.join(map(_label, signed))} "
            f"train{'s' if len(signed) == 1 else ''}, e.g. with a lower "
            f"initial temperature (model.initial_temperature, {tau:g} here) for every kind: at "
            f"tau = {tau:g} the trigonometric estimate of the kernel exp(tau q^.k^) of "
            f"orthogonal unit q, k has a standard deviation "
            f"{trigonometric_relative_sd(tau, m):.3g} times the kernel's value (m = {m} i.i.d. "
            f"projections; {trigonometric_relative_sd(1.0, m):.2g} times at tau = 1)"
        )
    if others:
        parts.append(
            f"a task in which {' and '.join(map(_label, others))} "
            f"use{'s' if len(others) == 1 else ''} its attention and read"
            f"{'s' if len(others) == 1 else ''} the digits (e.g. attention as the only mixing "
            "across frames, as in attention_context, and more than "
            f"{config.train.num_train_steps} steps)"
        )
    follow_up = config.get("follow_up")
    if follow_up:  # the variant declared to do it
        return (
            f"{'; '.join(parts)}: the variant {follow_up} does this "
            f"(results/conformer_ctc_{follow_up})"
        )
    return "(not run) " + "; ".join(parts)


def _mean_der(runs: list[dict], kinds: tuple[str, ...]) -> np.ndarray:
    """Per seed, the mean test DER over ``kinds``."""
    return np.mean(
        [tabulate.seed_values(runs, "digit_error_rate", attention=a) for a in kinds], axis=0
    )


def _kinds_text(kinds: tuple[str, ...]) -> str:
    names = [_label(a) for a in kinds]
    return names[0] if len(names) == 1 else f"mean of {', '.join(names)}"


# --------------------------------------------------------------------------- report


def _summary_rows(results: dict, attentions, judge: verdicts.Verdicts) -> list[dict]:
    runs, rows = results["runs"], []
    for attention in attentions:
        rates = tabulate.seed_values(runs, "digit_error_rate", attention=attention)
        train_logs = [
            [r["loss"] for r in c if r["split"] == "train"] for c in results["curves"][attention]
        ]
        row = {
            "attention": _label(attention),
            "seeds": len(rates),
            "test DER (mean ± 1 SE)": tabulate.summarise(rates),
            "utterances fully correct": float(
                np.mean(tabulate.seed_values(runs, "utterance_accuracy", attention=attention))
            ),
            "test CTC loss": float(
                np.mean(tabulate.seed_values(runs, "test_ctc_loss", attention=attention))
            ),
            "train CTC loss, first -> last log": f"{np.mean([c[0] for c in train_logs]):.4g} -> "
            f"{np.mean([c[-1] for c in train_logs]):.4g}",
            "learned tau (mean)": float(
                np.mean(tabulate.seed_values(runs, "mean_temperature", attention=attention))
            ),
        }
        checked = judge.arm_checks.get(_label(attention))
        check = judge.trained_check
        row["training check"] = (
            checked.outcome(check) if checked is not None and check else "not checked"
        )
        rows.append(row)
    return rows


def _plot_error_rates(runs, tests, attentions, path: str) -> None:
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    seeds = sorted({r["seed"] for r in runs})
    for i, attention in enumerate(attentions):
        mean, se = stats.mean_se(
            tabulate.seed_values(runs, "digit_error_rate", attention=attention)
        )
        left.bar(i, mean, yerr=np.nan_to_num(se), capsize=4, color=f"C{i}", alpha=0.7)
    per_seed = np.array(
        [tabulate.seed_values(runs, "digit_error_rate", attention=a) for a in attentions]
    )
    for k in range(len(seeds)):
        left.plot(range(len(attentions)), per_seed[:, k], "k.-", lw=0.5, ms=4, alpha=0.6)
    left.set_xticks(range(len(attentions)), [_label(a) for a in attentions], rotation=20)
    left.set(
        ylabel="test digit error rate",
        title=f"test DER: mean ± 1 SE over {len(seeds)} seeds (lines: paired seeds)",
    )
    labels = [f"{_label(t['kind'])}\n- {_label(t['reference'])}" for t in tests]
    plots.forest(
        right,
        [t["mean"] for t in tests],
        [2 * t["se"] for t in tests],
        labels,
        color="C0",
        capsize=4,
        fontsize=8,
    )
    right.set(xlabel="paired difference in test DER", title="paired differences, ± 2 SE")
    outputs.save_figure(figure, path)


def _plot_curves(curves: dict, attentions, path: str) -> None:
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, attention in enumerate(attentions):
        for axis, split, value in ((left, "eval", digit_error_rate), (right, "train", "loss")):
            steps, series = plots.logged_series(curves[attention], split, value)
            plots.mean_se_band(axis, steps, series, color=f"C{i}", label=_label(attention))
    left.set(xlabel="step", ylabel="test digit error rate", title="test DER (band: ± 1 SE)")
    right.set(
        xlabel="step", ylabel="train CTC loss", yscale="log", title="train loss (band: ± 1 SE)"
    )
    left.legend(fontsize=8)
    outputs.save_figure(figure, path)


def _setup_text(config, info) -> str:
    m = config.model
    if config.split == "recordings":
        split = (
            f"test recordings: index >= {config.first_test_index} of every speaker and digit "
            f"({info['test_recordings']} recordings of the training speakers "
            f"{', '.join(info['train_speakers'])}; {info['train_recordings']} for training)"
        )
    else:
        split = (
            f"held-out speaker(s) {', '.join(info['test_speakers'])}; training speakers "
            f"{', '.join(info['train_speakers'])}"
        )
    return (
        f"Utterances of {config.min_digits}-{config.max_digits} concatenated recordings (each cut "
        f"to {config.max_samples_per_digit} samples), {config.num_train_utterances} for training "
        f"and {config.num_test_utterances} for testing; {split}. {config.num_mels} log-mel bins "
        f"(25 ms / 10 ms), padded to {info['max_frames']} frames (mean "
        f"{info['mean_frames']:.0f}), {info['max_frames'] // 4} after 4x subsampling. Conformer: "
        f"{m.num_layers} blocks, width {m.model_dim}, {m.num_heads} heads, conv kernel "
        f"{m.kernel_size}; cosine scores tau q^.k^ with a learned per-head temperature "
        f"initialised at tau = {m.initial_temperature}; m = {m.num_features} projections per "
        f"head ({m.coupling}, redrawn every {m.redraw_interval} steps), angular hybrid n = "
        f"{m.num_sign_features}, cluster hybrid {m.num_clusters} x {m.num_clusters} clusters per "
        "head (k-means on the initial model's queries and keys, then frozen), denominator floor "
        f"{m.hybrid_eps} for the signed kinds. Training: {config.train.num_train_steps} steps of "
        f"batch {config.train.batch_size}, {config.train.optimizer}, lr "
        f"{config.train.learning_rate} ({config.train.lr_schedule}); seeds "
        f"{tuple(config.seeds)}, paired across kinds."
    )


def _swap_text(runs: list[dict], attentions) -> str:
    """Each kind's models re-evaluated with uniform attention swapped in (the training check's
    trivial model), and the exact models with FAVOR+ features: mean test DER and the paired
    change against the model as trained."""
    rows = []
    for attention in attentions:
        mine = [r for r in runs if r["attention"] == attention]
        own = np.array([r["digit_error_rate"] for r in mine])
        swaps = [("der_uniform_attention", "uniform weights (tau -> 0)")]
        if attention == "exact":
            swaps.append(("der_favor_swap", "FAVOR+ features"))
        for name, label in swaps:
            if not mine or any(r.get(name) is None for r in mine):
                rows.append(
                    {
                        "trained with": _label(attention),
                        "attention at inference": label,
                        "test DER (mean ± 1 SE)": "not measured (runs made before the swap "
                        "was measured for every kind)",
                        "paired change": "—",
                    }
                )
                continue
            values = np.array([r[name] for r in mine])
            change = stats.paired_difference(values, own)
            rows.append(
                {
                    "trained with": _label(attention),
                    "attention at inference": label,
                    "test DER (mean ± 1 SE)": tabulate.summarise(values),
                    "paired change": tabulate.plus_minus(change.mean, change.se, "+.4f"),
                }
            )
    return outputs.markdown_table(rows) if rows else "not run."


def _pair_tables(runs: list[dict], judge: verdicts.Verdicts, attentions) -> str:
    """Every ordering's per-pair table (``Verdicts.cell_rows``), for the kinds trained."""
    parts = []
    for name, (worse, better) in ORDERINGS.items():
        if name not in judge.claims or not set((*worse, *better)) <= set(attentions):
            continue
        rows = judge.cell_rows(
            name, ordering_cells(runs, worse, better), cell_name="pair", units="seeds", number=".4f"
        )
        parts.append(f"*{name}*:\n\n{outputs.markdown_table(rows)}")
    return "\n\n".join(parts) if parts else "none (the kinds of no ordering were all trained)"


def comparison_rows(tests: list[dict]) -> list[dict]:
    """The paired comparisons as shown in the summary."""
    return [
        {
            "difference": f"{_label(t['kind'])} - {_label(t['reference'])}",
            "mean ± 1 SE": tabulate.plus_minus(t["mean"], t["se"], "+.4f"),
            "t": t["t"],
            "p (two-sided)": t["p"],
        }
        for t in tests
    ]


def _gate_text(tests: list[dict], config) -> str:
    gate = next((t for t in tests if t["reference"] == "exact"), None)
    if gate is None:
        return "not run (exact or FAVOR+ missing)"
    rule = (
        f"the other kinds are trained if p < {SIGNIFICANCE:g}"
        if config.gate_first
        else "no gate in this variant: the orderings are tested whatever it says"
    )
    return f"FAVOR+ - exact = {_format_difference(gate)} over {gate['n']} paired seeds ({rule})"


def _design_text(config) -> str:
    if config.gate_first:
        return (
            "A claim about attention kinds needs a task where the kind of attention changes "
            "the error, so the analysis is gated: first the paired difference FAVOR+ - exact "
            "over seeds (two-sided paired t-test); the hybrids' ordering against FAVOR+ is "
            "tested only if that gate is significant."
        )
    return (
        "The orderings are claims about models trained with each kind, tested directly: each "
        "is one paired t-test over seeds, refuted only beyond its declared margin. No gate: "
        "FAVOR+- and exact-trained models may reach the same error (each adapts to its "
        "attention) while the kind of attention still matters to a trained model (the swap "
        "below)."
    )


def report(results: dict, config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Tables, figures, the summary and the verdicts of ``measure``'s records."""
    runs, info = results["runs"], results["info"]
    attentions = tuple(a for a in config.attentions if a in results["curves"])
    tests = comparisons(runs, attentions)
    judged = judge(results, config)
    _plot_error_rates(runs, tests, attentions, os.path.join(workdir, "digit_error_rate.png"))
    _plot_curves(results["curves"], attentions, os.path.join(workdir, "learning_curves.png"))
    text = verdicts.write_summary(
        workdir,
        "conformer_ctc",
        judged,
        config,
        setup=_setup_text(config, info),
        table=outputs.markdown_table(_summary_rows(results, attentions, judged)),
        pair_tables=_pair_tables(runs, judged, attentions),
        comparisons=outputs.markdown_table(comparison_rows(tests)) if tests else "none",
        design=_design_text(config),
        gate=_gate_text(tests, config),
        skipped=(
            "Not trained, because of the gate (`gate_first`): "
            + ", ".join(_label(a) for a in results["skipped"])
            + "."
            if results["skipped"]
            else ""
        ),
        swaps=_swap_text(runs, attentions),
        timing=outputs.timing_text(runs),
    )
    outputs.write_csv(os.path.join(workdir, "results.csv"), runs)
    print(text)
    return {"runs": runs, "comparisons": tests, "skipped": results["skipped"], **info}
