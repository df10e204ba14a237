"""The kernel-regression classification experiment on the UCI sets (SimRF Fig. 8, Tables 2-3);
the loader's own tests are in ``tests/rfjax/data/test_uci.py``."""

import json

import jax
import numpy as np
import pytest

from configs import uci_classification as uci_config
from experiments import uci_classification as uci
from experiments.core import kernel_classifier, verdicts
from experiments.core.outputs import read_csv
from experiments.core.verdicts import Outcome
from rfjax import data, features, projections
from tests.support.studies import quick_run_fixture


def test_authors_split_of_banknote_uses_1370_rows_and_another_test_set():
    x, y = data.load_uci("banknote", rows="authors")
    x_train, _, x_test, _ = uci.split_and_scale(
        x, y, sigma=1.0, test_fraction=0.05, seed=42, split="authors"
    )
    assert (len(x_train), len(x_test)) == (1302, 68)  # int(0.95 n) + int(0.05 n) of n = 1,371
    x_all, y_all = data.load_uci("banknote")
    _, _, x_test_all, _ = uci.split_and_scale(x_all, y_all, sigma=1.0, test_fraction=0.05, seed=42)
    assert len(x_test_all) == 68 and not np.allclose(x_test, x_test_all)
    with pytest.raises(ValueError, match="split must be one of"):
        uci.split_and_scale(x, y, sigma=1.0, test_fraction=0.05, seed=42, split="theirs")


def _banknote_split():
    x, y = data.load_uci("banknote")
    x_train, y_train, x_test, y_test = uci.split_and_scale(
        x, y, sigma=data.UCI_BANDWIDTHS["banknote"], test_fraction=0.05, seed=42
    )
    return x_train, np.eye(2, dtype=np.float32)[y_train], x_test, y_test


def test_split_is_standardised_on_train():
    x, y = data.load_uci("cmc")
    x_train, _, x_test, _ = uci.split_and_scale(x, y, sigma=0.5, test_fraction=0.05, seed=1)
    assert len(x_test) == int(len(x) * 0.05) and len(x_train) + len(x_test) == len(x)
    np.testing.assert_allclose(x_train.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(x_train.std(axis=0), 0.5, rtol=1e-4)
    with pytest.raises(ValueError, match="test_fraction"):
        uci.split_and_scale(x, y, sigma=0.5, test_fraction=1.5, seed=1)


def test_exact_kernel_classifier_beats_the_majority_class():
    x_train, onehot_train, x_test, y_test = _banknote_split()
    majority = np.bincount(y_test).max() / len(y_test)
    accuracy = uci.exact_accuracy(x_train, onehot_train, x_test, y_test, test_batch=32)
    assert accuracy >= 0.9 > majority + 0.2
    # The same scores in float64 NumPy, by brute force.
    kernel = np.exp(-0.5 * ((x_test[:, None, :] - x_train[None]) ** 2).sum(-1).astype(np.float64))
    brute = np.mean(np.argmax(kernel @ onehot_train, axis=1) == y_test)
    assert accuracy == pytest.approx(brute)


@pytest.mark.parametrize("coupling", ["gaussian", "simplex"])
def test_prefix_scores_match_a_projection_with_fewer_blocks(coupling):
    x_train, onehot_train, x_test, _ = _banknote_split()
    key = jax.random.key(3)
    scores = kernel_classifier.random_feature_scores(
        key, coupling, (1, 3), x_train, onehot_train, x_test
    )
    scores = np.asarray(scores)
    weights = projections.get(coupling)(key, 4, 12).matrix()
    for index, blocks in enumerate((1, 3)):
        prefix = projections.DenseProjection(weights[: 4 * blocks], block_size=4)
        phi_train = features.positive_features(x_train, prefix, kernel="gaussian")
        phi_test = features.positive_features(x_test, prefix, kernel="gaussian")
        direct = np.asarray(phi_test @ (onehot_train.T @ phi_train).T)
        # Equal up to one positive factor per test point (normalisation, row stabiliser).
        np.testing.assert_allclose(
            scores[index] / scores[index].sum(-1, keepdims=True),
            direct / direct.sum(-1, keepdims=True),
            rtol=2e-4,
        )


quick_run = quick_run_fixture(uci_config)


@pytest.mark.integration
def test_quick_run_writes_outputs(quick_run):
    config, workdir, _ = quick_run
    for name in ("results.csv", "datasets.csv", "tables.json", "summary.md", "config.json"):
        assert (workdir / name).stat().st_size > 0, name
    assert (workdir / "accuracy_vs_features.png").stat().st_size > 10_000
    rows = read_csv(workdir / "results.csv")
    main = [r for r in rows if r["split"] == config.split]
    fig8 = [r for r in main if r["table"] == "fig8"]
    fast = [r for r in main if r["table"] == "fast"]
    dims = {name: data.load_uci(name)[0].shape[1] for name in config.datasets}
    assert len(fig8) == len(config.couplings) * sum(
        len(uci.ratios_for(config, dim)) for dim in dims.values()
    )
    assert {int(r["ratio"]) for r in fig8 if r["dataset"] == "banknote"} == {1, 10, 100}
    assert len(fast) == len(config.datasets) * len(config.fast_couplings) * len(config.fast_ratios)
    approach = [r for r in main if r["table"] == "approach"]
    assert {(r["dataset"], int(r["ratio"])) for r in approach} == {("banknote", 300)}
    tables = json.loads((workdir / "tables.json").read_text())
    for split in config.table2_splits:  # Table 2 on both splits
        assert [r["dataset"] for r in tables[f"table2_{split}"]] == list(config.datasets)
    assert tables["table2_authors"][0]["rows used"] == 1370  # banknote, as the authors' script
    assert tables["table2_all_rows"][0]["rows used"] == 1372
    assert len(tables["table3"]) == len(config.datasets) * len(config.fast_ratios)
    summary = (workdir / "summary.md").read_text()
    assert summary.startswith("# ") and "](accuracy_vs_features.png)" in summary
    assert "## Claims, our numbers, verdicts" in summary
    assert "0.7229" in summary  # the paper's Table 2 value for banknote beside ours
    stored = verdicts.read(str(workdir))
    assert set(stored) == set(config.claims)
    assert all(v.sentence() in summary for v in stored.values())
    # The quick variant is not sized to refute a claim.
    assert all(v.outcome != Outcome.DOES_NOT_HOLD for v in stored.values())
    for row in rows:
        assert 0.0 <= float(row["accuracy"]) <= 1.0 and float(row["accuracy_se"]) > 0
    # With d = p the regular couplings of Table 3 are the Fig. 8 draws, reported in both.
    shared = {(r["dataset"], r["coupling"], r["ratio"]): r["accuracy"] for r in fig8}
    for row in fast:
        if row["coupling"] in config.couplings:
            assert row["accuracy"] == shared[row["dataset"], row["coupling"], row["ratio"]]


@pytest.mark.integration
def test_quick_random_features_approach_the_exact_kernel(quick_run):
    config, _, result = quick_run
    exact = {
        f["dataset"]: f["exact_accuracy"] for f in result["facts"] if f["split"] == config.split
    }
    fig8 = {
        (r["dataset"], r["coupling"], r["ratio"]): r
        for r in result["rows"]
        if r["table"] == "fig8" and r["split"] == config.split
    }
    for name in config.datasets:
        ratios = sorted(r for (d, c, r) in fig8 if d == name and c == "gaussian")
        for coupling in config.couplings:
            low, high = fig8[name, coupling, ratios[0]], fig8[name, coupling, ratios[-1]]
            gap = high["accuracy"] - low["accuracy"]
            # Independent-draw SE; the prefixes are positively correlated, so this is wider.
            se = np.hypot(low["accuracy_se"], high["accuracy_se"])
            assert gap > 2 * se, (name, coupling, gap, se)
            assert abs(exact[name] - high["accuracy"]) < abs(exact[name] - low["accuracy"])


@pytest.mark.integration
def test_quick_simrf_beats_iid_with_few_features_on_banknote(quick_run):
    _, _, result = quick_run
    cells = {
        r["coupling"]: r
        for r in result["rows"]
        if r["table"] == "fig8"
        and r["split"] == "all_rows"
        and r["dataset"] == "banknote"
        and r["ratio"] == 1
    }
    gap = cells["simplex"]["accuracy"] - cells["gaussian"]["accuracy"]
    assert gap > 2 * np.hypot(cells["simplex"]["accuracy_se"], cells["gaussian"]["accuracy_se"])


def test_config_variants_and_bad_config():
    full, quick = uci_config.get_config(), uci_config.get_config("quick")
    assert tuple(full.datasets) == data.UCI_DATASETS and tuple(full.ratios) == (1, 2, 4, 10)
    assert max(uci.ratios_for(full, 4)) == 100 and max(uci.ratios_for(full, 21)) == 10
    assert set(full.table2_splits) == set(uci.SPLITS)
    assert len(quick.datasets) == 2
    with pytest.raises(ValueError, match="config variant"):
        uci_config.get_config("huge")
    bad = uci_config.get_config("quick")
    bad.datasets = ("banknote", "iris")
    with pytest.raises(ValueError, match=r"config\.datasets: 'iris' is not one of \("):
        uci.validate_config(bad)
    bad = uci_config.get_config("quick")
    bad.split = "theirs"
    with pytest.raises(ValueError, match=r"config\.split: 'theirs' is not one of \("):
        uci.validate_config(bad)
    bad = uci_config.get_config("quick")
    bad.couplings = ("simplex", "nope")
    with pytest.raises(ValueError, match=r"config\.couplings: 'nope' is not one of \("):
        uci.validate_config(bad)
    bad = uci_config.get_config("quick")
    bad.fast_ratios = (1, 0)
    with pytest.raises(ValueError, match=r"config\.fast_ratios must be an int >= 1, got \(1, 0\)"):
        uci.validate_config(bad)
    for field, value, message in (
        ("test_fraction", float("nan"), r"config\.test_fraction must be finite and in \(0, 1\)"),
        ("exact_tolerance", float("nan"), r"config\.exact_tolerance must be finite and in"),
        ("split_seed", -1, r"config\.split_seed must be an int >= 0, got -1"),
        ("approach_repetitions", 0, r"config\.approach_repetitions must be an int >= 1, got 0"),
        ("memory_mb", 0, r"config\.memory_mb must be finite and > 0, got 0"),
    ):
        bad = uci_config.get_config("quick")
        bad[field] = value
        with pytest.raises(ValueError, match=message):
            uci.validate_config(bad)
    bad = uci_config.get_config("quick")
    bad.repetitions.yeast = 0
    with pytest.raises(ValueError, match=r"config\.repetitions\.yeast must be an int >= 1, got 0"):
        uci.validate_config(bad)
    bad = uci_config.get_config("quick")
    bad.table2_ratio = 3
    with pytest.raises(ValueError, match=r"config\.table2_ratio: 3 is not one of \(1, 10\)"):
        uci.validate_config(bad)


def test_typical_norm_of_sum_pairs_two_independent_rows():
    # |x_i + x_j| is 2 when both picks are the same row and 0 otherwise: 1 on average over random
    # pairs (2 if each row were paired with itself). SE of the mean: 1 / sqrt(20,000).
    x = np.array([[1.0, 0.0], [-1.0, 0.0]])
    assert uci.typical_norm_of_sum(x) == pytest.approx(1.0, abs=4 / np.sqrt(20_000))


def test_prepare_states_the_exact_accuracy_and_majority_rate_of_the_test_split():
    prepared = uci.prepare("banknote", uci_config.get_config("quick"), "all_rows")
    facts, (x_train, onehot_train, x_test, y_test) = prepared["facts"], prepared["split"]
    assert facts["num_test"] == len(y_test) == 68
    assert facts["exact_accuracy"] == uci.exact_accuracy(x_train, onehot_train, x_test, y_test)
    assert facts["majority_rate"] == np.bincount(y_test).max() / len(y_test)


def test_draw_accuracies_keep_the_first_draws_when_the_last_chunk_is_filled_up():
    split = uci.prepare("banknote", uci_config.get_config("quick"), "all_rows")["split"]
    keys = jax.random.split(jax.random.key(0), 2)
    per_draw = 4 * len(split[0]) * (2 * 4 * 2) * 2  # as repetition_batch: m = 2 d per coupling
    args = (keys, ("gaussian", "simplex"), (1, 2), split, 3)
    two_per_chunk = 2.5 * per_draw / 2**20  # 3 draws in 2 chunks of 2: one filler draw
    assert uci.task.repetition_batch(len(split[0]), 16, two_per_chunk, 3) == 2
    np.testing.assert_array_equal(
        uci.draw_accuracies(*args, two_per_chunk, "test"), uci.draw_accuracies(*args, 100.0, "test")
    )


def test_measure_dataset_draws_each_split_and_coupling_apart_and_summarises_its_draws(
    monkeypatch,
):
    seen, values = [], np.array([[0.5, 0.6], [0.7, 0.7], [0.9, 0.8]])  # 3 draws, 2 ratios

    def fake(keys, couplings, num_blocks, split, repetitions, memory_mb, description):
        seen.extend(jax.random.key_data(keys).reshape(len(couplings), -1).tolist())
        return np.stack([values] * len(couplings))

    monkeypatch.setattr(uci.task, "draw_accuracies", fake)
    config = uci_config.get_config("quick")
    rows = []
    for split in uci.SPLITS:
        prepared = uci.prepare("banknote", config, split)
        tables = {"fig8": (("gaussian", "simplex"), (1, 2), False, 3)}
        rows += uci.measure_dataset(0, prepared, config, tables)
    # Couplings are compared as independent samples, and the two splits' Table 2 cells too.
    assert len(seen) == 4 and len({tuple(k) for k in seen}) == 4
    assert len(rows) == 8
    for row in rows:
        draws = values[:, row["ratio"] - 1]
        assert row["num_features"] == row["ratio"] * 4 and row["repetitions"] == 3
        assert row["accuracy"] == pytest.approx(draws.mean())
        assert row["accuracy_se"] == pytest.approx(draws.std(ddof=1) / np.sqrt(3))


def _cell(split, table, coupling, ratio, accuracy):
    return {
        "dataset": "banknote",
        "split": split,
        "table": table,
        "coupling": coupling,
        "ratio": ratio,
        "repetitions": 400,
        "accuracy": accuracy,
        "accuracy_se": 0.002,
    }


def test_judge_reads_each_claim_from_its_own_cells_and_split():
    config = uci_config.get_config(
        "datasets=(banknote,),ratios=(1,10),approach_ratios=(300,),approach_couplings=(simplex,)"
    )
    fig8 = {
        ("gaussian", 1): 0.80,
        ("gaussian", 10): 0.90,
        ("orthogonal", 1): 0.83,
        ("orthogonal", 10): 0.91,
        ("simplex", 1): 0.86,
        ("simplex", 10): 0.92,
        ("simplex_plus", 1): 0.864,
        ("simplex_plus", 10): 0.924,
    }
    fast = {"orthogonal": 0.85, "hd_orthogonal": 0.854, "simplex": 0.86, "fast_simplex": 0.864}
    rows = [_cell("all_rows", "fig8", c, r, a) for (c, r), a in fig8.items()]
    rows += [_cell("all_rows", "approach", "simplex", 300, 0.95)]
    rows += [_cell("all_rows", "fast", c, 1, a) for c, a in fast.items()]
    # The authors' split at the paper's Table 2 SimRF value; the all_rows split 0.14 above it.
    rows += [_cell("authors", "fig8", "simplex", 1, 0.7229)]
    rows += [_cell("authors", "fig8", "simplex_plus", 1, 0.7269)]
    facts = [{"dataset": "banknote", "split": s, "exact_accuracy": 0.952} for s in uci.SPLITS]
    given = uci.judge({"rows": rows, "facts": facts}, config).given
    assert {name: str(v.outcome) for name, v in given.items()} == dict.fromkeys(
        config.claims, "holds"
    )
    evidence = {name: v.evidence for name, v in given.items()}
    assert "SimRF - ORF, mean over 2 (data set, m/d)" in evidence["simrf_orf"]
    assert "= +0.02 ±" in evidence["simrf_orf"] and "= +0.02 ±" in evidence["orf_iid"]
    # From the largest Fig. 8 m/d (0.92) to the largest approach m/d (0.95), exact 0.952.
    assert (
        "at m/d = 300 - at m/d = 10, mean over 1 data sets = +0.03 ±" in evidence["approach_trend"]
    )
    assert "(banknote) = +0.002 ±" in evidence["approach_within"]
    assert "over 2 (split, data set) = +0.004 ±" in evidence["simrf_plus_marginal"]
    assert "= +0.004 ±" in evidence["fast_regular"]
    assert "(banknote) = +0 ±" in evidence["reproduces_paper"]


def test_tables_state_differences_their_ses_and_the_distance_from_the_paper():
    config = uci_config.get_config(
        "datasets=(banknote,yeast),ratios=(1,),couplings=(orthogonal,simplex,simplex_plus),"
        "approach_ratios=(300,),approach_couplings=(simplex,)"
    )
    # Each difference has SE 0.002 sqrt(2) = 0.0028. SimRF - ORF: +0.0275 on banknote, +0.004
    # (1.4 SE) on yeast; SimRF+ - SimRF: +0.006 (2.1 SE) on banknote, 0 on yeast.
    accuracy = {
        ("banknote", "orthogonal"): 0.70,
        ("banknote", "simplex"): 0.7275,
        ("banknote", "simplex_plus"): 0.7335,
        ("yeast", "orthogonal"): 0.50,
        ("yeast", "simplex"): 0.504,
        ("yeast", "simplex_plus"): 0.504,
    }
    rows = [{**_cell("all_rows", "fig8", c, 1, a), "dataset": d} for (d, c), a in accuracy.items()]
    rows += [{**_cell("all_rows", "approach", "simplex", 300, 0.975), "dataset": "banknote"}]
    facts = [
        {
            "dataset": d,
            "split": "all_rows",
            "exact_accuracy": 0.95,
            "dim": 4,
            "num_train": 1,
            "num_test": 1,
            "norm_of_sum": 2.0,
        }
        for d in config.datasets
    ]
    (simrf_orf, plus) = uci.orderings(rows, config)
    se = np.hypot(0.002, 0.002)
    assert simrf_orf["comparison"] == "SimRF >= ORF" and simrf_orf["cells"] == 2
    assert (simrf_orf["ahead"], simrf_orf["significant_ahead"]) == (2, 1)
    assert (plus["ahead"], plus["significant_ahead"], plus["significant_behind"]) == (2, 1, 0)
    mean, average_se = simrf_orf["_average_1"]
    assert mean == pytest.approx((0.0275 + 0.004) / 2) and average_se == pytest.approx(
        se / np.sqrt(2)
    )
    (banknote, _) = uci.table2(rows, facts, config, "all_rows")
    assert banknote["SimRF+ - SimRF"].startswith("+0.0060")
    # 0.0046 above the paper's 0.7229 ± 0.0012: 0.0046 / hypot(0.002, 0.0012) = 1.97 SE.
    assert banknote["SimRF - paper (SE)"] == "+2.0"
    (approach,) = uci.approach_table(rows, facts, config)
    assert approach["SimRF within 0.02"] is False  # 0.025 above the exact kernel
