"""The IAP + ES study's report: paired return differences, verdicts, the inference-swap and
kind tables, the endpoint noise, figures and summary.
"""

from __future__ import annotations

import math
import os
from typing import Any

import matplotlib
import ml_collections
import numpy as np

from experiments.core import outputs, plots, stats, tabulate, verdicts
from experiments.iap_es.kinds import run_name

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _per_seed(runs: list[dict], kind: str, seeds, name: str = "final_return") -> np.ndarray:
    """``kind``'s ``name`` at ``seeds``, in that order (every seed must have a run)."""
    values = tabulate.by_seed(runs, name, kind=kind)
    return np.array([values[seed] for seed in seeds])


def _pm(values: np.ndarray) -> str:
    return tabulate.summarise(values, ".3f")


def _difference(estimate: stats.Estimate) -> str:
    return tabulate.plus_minus(estimate.mean, estimate.se, "+.3f")


def judge(results: dict, config: ml_collections.ConfigDict) -> verdicts.Verdicts:
    """Equal quality of the claim kind and the reference, in training (final returns, paired by
    seed) and at inference (the same trained policies played with either attention, paired by
    run), each as equivalence within the declared fraction of the reference's return."""
    judge, values = verdicts.Verdicts(config), claim_differences(results, config)
    labels = {kind: info["label"] for kind, info in results["kinds"].items()}
    judge.check_training(checked_runs(results), "kind", label=labels.__getitem__)
    effect = f"{labels[config.claim_kind]} - {labels[config.reference]}"
    for name, difference, reference, text, units in (
        ("equal_quality", "claim", "reference_final", "final return, paired by seed", "seeds"),
        (
            "equal_at_inference",
            "inference_claim",
            "reference_played",
            "return played by the same trained policies, paired by run",
            "runs",
        ),
    ):
        judge.effect(
            name,
            values[difference],
            effect=f"{effect} {text}",
            units=units,
            reference=values[reference],
            arms=[labels[config.claim_kind], labels[config.reference]],
        )
    return judge


def checked_runs(results: dict) -> list[dict]:
    """The runs with the training check's trivial model beside each: the return of the same
    policy before ES (its evaluation at generation 0: its random initialisation)."""
    return [
        {**run, "initial_return": run["return"][0] if run["generation"][0] == 0 else None}
        for run in results["runs"]
    ]


# --------------------------------------------------------------------------- report


def inference_rows(runs: list[dict], kinds: dict) -> list[dict]:
    """The inference-swap table: trained kind x played kind, mean ± SE over seeds."""
    rows = []
    for trained, info in kinds.items():
        played_by = [r["inference_return"] for r in runs if r["kind"] == trained]
        row = {"trained with": info["label"]}
        for played, other in kinds.items():
            row[f"plays with {other['label']}"] = _pm(np.array([p[played] for p in played_by]))
        rows.append(row)
    return rows


def _band(axis, x, runs, color, label, keep):
    values = np.array([r["return"] for r in runs])[:, keep]
    plots.mean_se_band(axis, x[keep], values, color=color, label=label)


def _plot(results: dict, config, path_generations: str, path_flops: str) -> None:
    figures = {name: plt.subplots(figsize=(6.5, 4)) for name in ("generation", "attention_flops")}
    for i, (kind, info) in enumerate(results["kinds"].items()):
        runs = [r for r in results["runs"] if r["kind"] == kind]
        for name, (_, axis) in figures.items():
            x = np.mean([r[name] for r in runs], axis=0)
            keep = x >= 0 if name == "generation" else x > 0  # log axis: from the first update
            _band(axis, x, runs, f"C{i}", info["label"], keep)
    seeds = len(config.seeds)
    title = f"IAP + ES on {config.env} (mean over {seeds} seeds, band +-1 SE)"
    figures["generation"][1].set(xlabel="generation", ylabel="evaluation return", title=title)
    figures["attention_flops"][1].set(
        xlabel="cumulative attention FLOPs in training (mean over seeds)",
        ylabel="evaluation return",
        xscale="log",
        title=title,
    )
    for name, path in (("generation", path_generations), ("attention_flops", path_flops)):
        figure, axis = figures[name]
        axis.legend(fontsize=8)
        outputs.save_figure(figure, path)


def kind_rows(results: dict, config: ml_collections.ConfigDict) -> list[dict]:
    """One row per attention kind: FLOPs, top-k agreement, final return, paired difference with
    the reference and the difference detectable with 80% power."""
    seeds, runs = list(config.seeds), results["runs"]
    reference = _per_seed(runs, config.reference, seeds)
    rows = []
    for kind, info in results["kinds"].items():
        finals = _per_seed(runs, kind, seeds)
        paired = stats.paired_difference(finals, reference)
        is_reference = kind == config.reference
        rows.append(
            {
                "kind": info["label"],
                "attention FLOPs / forward": info["importance_flops"],
                "XLA FLOPs / forward": int(info["xla_importance_flops"]),
                "top-k agreement with exact": _pm(_per_seed(runs, kind, seeds, "mask_agreement")),
                "final return (mean ± SE)": _pm(finals),
                "minus reference (paired ± SE)": "reference"
                if is_reference
                else _difference(paired),
                "detectable (80%)": ""
                if is_reference
                else f"{stats.detectable_difference(paired):.3f}",
            }
        )
    return rows


def claim_differences(results: dict, config: ml_collections.ConfigDict) -> dict[str, Any]:
    """The claim kind minus the reference, paired: final returns by seed (``claim``) and the
    returns played by the same trained policies by run (``inference_claim``), with the
    reference's means."""
    seeds, runs = list(config.seeds), results["runs"]
    pair = (config.claim_kind, config.reference)
    finals = [_per_seed(runs, kind, seeds) for kind in pair]
    inference = [np.array([r["inference_return"][k] for r in runs]) for k in pair]
    return {
        "claim": stats.paired_difference(*finals),
        "inference_claim": stats.paired_difference(*inference),
        "reference_final": float(finals[1].mean()),
        "reference_played": float(inference[1].mean()),
    }


def claim_values(results: dict, config: ml_collections.ConfigDict) -> dict[str, Any]:
    """``claim_differences``, the FLOPs ratio of the reference to the claim kind, the margin and
    the top-k agreement of the two kinds by seed."""
    kinds, values = results["kinds"], claim_differences(results, config)
    pair = (config.claim_kind, config.reference)
    return {
        **values,
        "flops_ratio": kinds[config.reference]["importance_flops"]
        / kinds[config.claim_kind]["importance_flops"],
        "margin": config.equivalence_margin * abs(values["reference_final"]),
        "agreement": [
            _per_seed(results["runs"], kind, list(config.seeds), "mask_agreement") for kind in pair
        ],
    }


def endpoint_noise(results: dict, config: ml_collections.ConfigDict) -> dict[str, Any]:
    """How much of the paired training difference's variance a lower-variance endpoint (more
    evaluation episodes per policy, common random numbers across the arms) could remove.

    Per run, the final return and the same policy's return with its own attention over
    ``inference_episodes`` other episodes measure one policy with independent episode noise:
    the variance of their difference bounds the noise variance of either, so the paired
    difference of two runs carries at most twice it. What remains lies between trained
    policies, which no number of episodes removes. Returns that bound's share of the variance,
    the paired sd without it (a lower bound on any endpoint of these policies), the seeds that
    sd would need to resolve the margin at the observed mean (90% interval) and to show
    equivalence with 80% power if the true difference were 0, and the two arms' correlation
    across seeds (what common random numbers could exploit)."""
    seeds, runs = list(config.seeds), results["runs"]
    pair = (config.claim_kind, config.reference)
    values = claim_differences(results, config)
    claim, margin = values["claim"], config.equivalence_margin * abs(values["reference_final"])
    table = {(r["kind"], r["seed"]): r for r in runs}
    finals = [_per_seed(runs, kind, seeds) for kind in pair]
    played = [np.array([table[kind, s]["inference_return"][kind] for s in seeds]) for kind in pair]
    gaps = np.concatenate([f - p for f, p in zip(finals, played, strict=True)])
    noise = float(np.var(gaps, ddof=1))
    variance = claim.sd**2
    free_sd = math.sqrt(max(variance - 2 * noise, 0.0))
    free = stats.Estimate(claim.mean, free_sd / math.sqrt(claim.n), claim.n, claim.df)
    return {
        "sd": claim.sd,
        "noise_share": min(2 * noise / variance, 1.0) if variance > 0 else math.nan,
        "run_noise": noise,
        "free_sd": free_sd,
        "seeds_to_resolve": stats.units_to_resolve(free, math.copysign(margin, claim.mean), 0.90),
        "seeds_for_equivalence": stats.units_for_equivalence(free_sd, margin),
        "correlation": float(np.corrcoef(finals[0], finals[1])[0, 1]),
    }


def flops_text(results: dict, config: ml_collections.ConfigDict) -> str:
    """The FLOP argument in numbers: the reference's cost over the claim kind's (analytic and
    XLA's count), exact attention's cost beside both, and where the random features would
    start to save FLOPs against exact attention."""
    counts = results["flops"]
    exact = counts["exact"]
    claim_kind, reference = counts[config.claim_kind], counts[config.reference]

    def ratio(a: dict, b: dict) -> str:
        return (
            f"{a['importance_flops'] / b['importance_flops']:.2f}x (analytic) and "
            f"{a['xla_importance_flops'] / b['xla_importance_flops']:.2f}x (XLA)"
        )

    return (
        f"Per patch-importance computation (T = {exact['num_patches']} patches), "
        f"{reference['label']} costs {ratio(reference, claim_kind)} the FLOPs of "
        f"{claim_kind['label']} ({reference['importance_flops']:,} / "
        f"{int(reference['xla_importance_flops']):,} against {claim_kind['importance_flops']:,} / "
        f"{int(claim_kind['xla_importance_flops']):,}, analytic / XLA). Exact softmax attention "
        f"costs {exact['importance_flops']:,} / {int(exact['xla_importance_flops']):,}: "
        f"{reference['label']} costs {ratio(reference, exact)} as much, {claim_kind['label']} "
        f"{ratio(claim_kind, exact)}. By the analytic count the random features cost fewer "
        f"FLOPs than exact attention only from T = {reference['crossover_patches']} patches "
        f"({reference['label']}) and T = {claim_kind['crossover_patches']} "
        f"({claim_kind['label']}): at this T the FLOP saving holds against FAVOR+, not "
        "against exact attention"
    )


def report(results: dict, config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Tables, figures, ``summary.md`` and ``verdicts.json`` from ``measure``'s records."""
    kinds, runs = results["kinds"], results["runs"]
    rows, values = kind_rows(results, config), claim_values(results, config)
    claim, agreement = values["claim"], values["agreement"]
    _plot(
        results,
        config,
        os.path.join(workdir, "return_vs_generation.png"),
        os.path.join(workdir, "return_vs_flops.png"),
    )
    summary = verdicts.write_summary(
        workdir,
        "iap_es",
        judge(results, config),
        config,
        kinds=", ".join(info["label"] for info in kinds.values()),
        seeds=len(config.seeds),
        patches=_patch_text(config),
        table=outputs.markdown_table(rows),
        reference=kinds[config.reference]["label"],
        claim_kind=kinds[config.claim_kind]["label"],
        flops=flops_text(results, config),
        **_endpoint_values(endpoint_noise(results, config)),
        margin_fraction=f"{config.equivalence_margin:.0%}",
        detectable=f"{stats.detectable_difference(claim):.3f}",
        seeds_for_equivalence=stats.units_for_equivalence(claim.sd, values["margin"]),
        runs=len(runs),
        inference_table=outputs.markdown_table(inference_rows(runs, kinds)),
        agreement_claim=_pm(agreement[0]),
        agreement_reference=_pm(agreement[1]),
        agreement_difference=_difference(stats.paired_difference(*agreement)),
        minutes=f"{results['seconds'] / 60:.1f}",
    )
    outputs.write_csv(os.path.join(workdir, "results.csv"), _run_rows(runs))
    print(summary)
    return {"rows": rows, **values}


def _endpoint_values(noise: dict[str, Any]) -> dict[str, object]:
    return {
        "noise_share": f"{noise['noise_share']:.1%}",
        "endpoint_sd": f"{noise['sd']:.3f}",
        "run_noise": f"{noise['run_noise']:.4f}",
        "correlation": f"{noise['correlation']:+.2f}",
        "free_sd": f"{noise['free_sd']:.3f}",
        "seeds_to_resolve": noise["seeds_to_resolve"],
        "free_seeds_for_equivalence": noise["seeds_for_equivalence"],
    }


def _run_rows(runs: list[dict]) -> list[dict]:
    return [
        {
            "kind": r["kind"],
            "seed": r["seed"],
            "final_return": r["final_return"],
            "initial_return": r["return"][0],
            "mask_agreement": r["mask_agreement"],
            **{
                f"inference_return_{run_name(kind)}": value
                for kind, value in r["inference_return"].items()
            },
            "forward_passes": r["forward_passes"][-1],
            "attention_flops": r["attention_flops"][-1],
            "seconds_this_invocation": r["seconds"],
            "cpu_seconds_this_invocation": r["cpu_seconds"],
        }
        for r in runs
    ]


def _patch_text(config: ml_collections.ConfigDict) -> str:
    policy = config.policy
    return (
        f"{policy.patch_size}x{policy.patch_size} patches, top {policy.num_kept} kept, "
        f"query/key width {policy.embed_dim}, temperature {policy.temperature}, controller "
        f"hidden {tuple(policy.hidden_sizes)}"
    )
