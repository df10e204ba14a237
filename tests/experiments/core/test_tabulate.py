"""The report helpers every study shares: records pivoted by seed and paired
(experiments.core.tabulate), learning curves (experiments.core.plots) and PTB windows
(experiments.core.ptb)."""

import matplotlib
import numpy as np
import pytest

from experiments.core import plots, ptb, stats, tabulate

matplotlib.use("Agg")

RUNS = [
    {"seed": 2, "kind": "exact", "loss": 1.0},
    {"seed": 0, "kind": "exact", "loss": 3.0},
    {"seed": 1, "kind": "favor", "loss": 4.0},
    {"seed": 0, "kind": "favor", "loss": 5.0},
]


def test_an_arm_is_picked_by_its_fields_and_ordered_by_seed():
    assert tabulate.by_seed(RUNS, "loss", kind="exact") == {2: 1.0, 0: 3.0}
    np.testing.assert_array_equal(tabulate.seed_values(RUNS, "loss", kind="exact"), [3.0, 1.0])
    assert tabulate.seed_values(RUNS, "loss", kind="none").shape == (0,)


def test_an_arm_named_ambiguously_is_refused():
    with pytest.raises(ValueError, match="two runs with seed 0"):
        tabulate.by_seed(RUNS, "loss")  # both kinds have seed 0


def test_two_arms_are_paired_on_the_seeds_both_have():
    exact, favor = (tabulate.by_seed(RUNS, "loss", kind=k) for k in ("exact", "favor"))
    first, second = tabulate.paired(favor, exact)
    np.testing.assert_array_equal(first, [5.0])  # seed 0 only
    np.testing.assert_array_equal(second, [3.0])
    assert [a.size for a in tabulate.paired({1: 1.0}, {2: 2.0})] == [0, 0]
    by_field = tabulate.paired_arms(RUNS, "loss", "kind", "favor", "exact")
    np.testing.assert_array_equal(np.stack(by_field), [[5.0], [3.0]])


def test_an_estimate_is_written_one_way():
    assert tabulate.plus_minus(0.5, 0.01234) == "0.5000 ± 0.0123"
    assert tabulate.plus_minus(0.5, 0.01234, "+.3f") == "+0.500 ± 0.012"
    assert tabulate.plus_minus(1234.5, 12.0, ".4g", ".2g") == "1234 ± 12"
    assert tabulate.plus_minus(0.5, float("nan")) == "0.5000"  # one unit: no SE
    assert tabulate.plus_minus(0.5, float("inf"), ".3g", ".2g") == "0.5"  # a heavy tail
    assert tabulate.summarise([1.0, 3.0]) == "2.0000 ± 1.0000"
    assert tabulate.summarise([1.0]) == "1.0000"
    estimate = stats.paired_difference([3.0, 5.0, 4.0], [1.0, 2.0, 3.0])
    text = tabulate.estimate_text(
        estimate.mean, estimate.se, estimate.interval(), number=".2f", details=["3 seeds"]
    )
    low, high = estimate.interval()
    assert text == f"+2.00 ± 0.58 (95% CI [{low:+.2f}, {high:+.2f}], 3 seeds)"


def test_logged_series_stack_the_runs_and_refuse_mismatched_steps():
    def log(values, steps=(10, 20)):
        return [
            *({"split": "eval", "step": s, "nll": v} for s, v in zip(steps, values, strict=True)),
            {"split": "train", "step": 10, "nll": 9.0},
        ]

    steps, values = plots.logged_series([log([1.0, 2.0]), log([3.0, 4.0])], "eval", "nll")
    assert steps == [10, 20]
    np.testing.assert_array_equal(values, [[1.0, 2.0], [3.0, 4.0]])
    _, doubled = plots.logged_series([log([1.0, 2.0])], "eval", lambda r: 2 * r["nll"])
    np.testing.assert_array_equal(doubled, [[2.0, 4.0]])
    with pytest.raises(ValueError, match="different steps"):
        plots.logged_series([log([1.0, 2.0]), log([1.0, 2.0], steps=(10, 30))], "eval", "nll")


def test_the_band_is_one_standard_error_wide():
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots()
    values = np.array([[1.0, 2.0], [3.0, 6.0]])
    plots.mean_se_band(axis, [0, 1], values, color="C0", label="run", style="--")
    (line,) = axis.get_lines()
    np.testing.assert_array_equal(line.get_ydata(), [2.0, 4.0])
    assert line.get_linestyle() == "--"
    band = axis.collections[0].get_paths()[0].vertices[:, 1]
    se = values.std(0, ddof=1) / np.sqrt(2)  # 1 and 2
    assert set(np.round(band, 12)) >= {2.0 - se[0], 2.0 + se[0], 4.0 - se[1], 4.0 + se[1]}
    plt.close(figure)


def test_a_series_band_spans_its_edges_and_carries_its_own_legend_entry():
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots()
    plots.series(
        axis, [1, 2], [2.0, 3.0], [1.0, 2.5], [4.0, 3.5], color="C1", style="o-", band_label="range"
    )
    (line,) = axis.get_lines()
    np.testing.assert_array_equal(line.get_ydata(), [2.0, 3.0])
    assert line.get_marker() == "o"
    band = axis.collections[0]
    assert set(band.get_paths()[0].vertices[:, 1]) >= {1.0, 4.0, 2.5, 3.5}
    assert [text.get_text() for text in axis.legend().get_texts()] == ["range"]
    plt.close(figure)


def test_a_forest_puts_each_estimate_on_its_row_with_its_interval():
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots()
    errors = [[0.1, 0.3], [0.2, 0.4]]  # below, above
    y = plots.forest(axis, [1.0, -1.0], errors, ["a", "b"], color="C0", top_down=True)
    np.testing.assert_array_equal(y, [1, 0])  # the first row on top
    ticks = zip(axis.get_yticks(), axis.get_yticklabels(), strict=True)
    assert {float(at): label.get_text() for at, label in ticks} == {1.0: "a", 0.0: "b"}
    (bars,) = axis.collections
    ends = sorted(tuple(segment[:, 0]) for segment in bars.get_segments())
    np.testing.assert_allclose(ends, [(-1.3, -0.6), (0.9, 1.2)])
    plt.close(figure)
    figure, axis = plt.subplots()
    plots.forest(axis, [1.0, -1.0], errors, ["a", "b"], color=None)  # a colour per row
    colours = {line.get_color() for line in axis.get_lines() if line.get_marker() == "o"}
    assert len(colours) == 2
    plt.close(figure)


def test_windows_are_the_stream_cut_with_targets_one_token_ahead():
    pieces = ptb.windows(np.arange(10), 4)
    np.testing.assert_array_equal(pieces["inputs"], [[0, 1, 2, 3], [4, 5, 6, 7]])
    np.testing.assert_array_equal(pieces["targets"], [[1, 2, 3, 4], [5, 6, 7, 8]])
    with pytest.raises(ValueError, match="3 tokens are too few for windows of length 4"):
        ptb.windows(np.arange(3), 4)
    # A negative count sliced tokens[:-1] (every token but the last) where it raises now.
    with pytest.raises(ValueError, match=r"num_train_tokens must be an int >= 0 .*got -1"):
        ptb.load_windows(4, -1, 0)
    with pytest.raises(ValueError, match=r"num_eval_tokens must be an int >= 0 .*got -3"):
        ptb.load_windows(4, 0, -3)
