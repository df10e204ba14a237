"""The structured_kernels experiment (Choromanski & Fagan) at its quick size."""

import math

import numpy as np
import pytest

from configs import structured_kernels as structured_config
from experiments import structured_kernels
from experiments.core import verdicts
from experiments.core.verdicts import Outcome
from experiments.main import run_experiment
from tests.support.studies import committed_figure_texts, quick_run_fixture

quick_run = quick_run_fixture(structured_config)


def _cells(result):
    return {(r["kernel"], r["method"], r["m"]): r for r in result["rows"]}


@pytest.mark.integration
def test_writes_outputs(quick_run):
    _, workdir, result = quick_run
    for name in ("results.csv", "error_vs_features.png", "summary.md", "config.json"):
        assert (workdir / name).stat().st_size > 0, name
    assert (workdir / "summary.md").read_text().startswith("# ")
    config = structured_config.get_config("quick")
    assert len(result["rows"]) == 3 * len(config.methods) * len(config.num_features)


@pytest.mark.integration
def test_gaussian_kernel_error_matches_closed_form(quick_run):
    _, _, result = quick_run
    checked = [r for r in result["rows"] if math.isfinite(r["error_theory"])]
    # i.i.d. and plain circulant at each m (toeplitz_hd has no closed form)
    assert {r["method"] for r in checked} == {"gaussian", "circulant"}
    for row in checked:
        assert row["kernel"] == "gaussian"
        assert abs(row["error"] - row["error_theory"]) <= 4 * row["error_se"], row


@pytest.mark.integration
def test_error_decreases_with_features(quick_run):
    _, _, result = quick_run
    config = structured_config.get_config("quick")
    cells = _cells(result)
    few, many = min(config.num_features), max(config.num_features)
    for kernel in structured_kernels.KERNELS:
        for method in config.methods:
            a, b = cells[(kernel, method, few)], cells[(kernel, method, many)]
            assert a["error"] - b["error"] > 4 * math.hypot(a["error_se"], b["error_se"])


@pytest.mark.integration
def test_structured_versus_gaussian(quick_run):
    _, _, result = quick_run
    cells = _cells(result)
    m = max(structured_config.get_config("quick").num_features)  # = d = 64, one block
    # With HD preprocessing, a structured matrix estimates the angular kernel as well as an
    # unstructured Gaussian one (the paper's claim): the ratio is 1 within 4 of its SEs.
    toeplitz = cells[("angular", "toeplitz_hd", m)]
    assert abs(toeplitz["ratio"] - 1.0) <= 4 * toeplitz["ratio_se"], toeplitz
    # without preprocessing, image pixel vectors correlate with their own shifts, and the
    # circulant error exceeds the Gaussian one for the Gaussian kernel (also by theory)
    circulant = cells[("gaussian", "circulant", m)]
    assert circulant["ratio"] - 1.0 > 4 * circulant["ratio_se"], circulant
    assert circulant["error_theory"] > cells[("gaussian", "gaussian", m)]["error_theory"]


@pytest.mark.integration
def test_summary_states_a_computed_verdict_for_each_claim(quick_run):
    _, workdir, _ = quick_run
    summary = (workdir / "summary.md").read_text()
    assert "## Claims, our numbers, verdicts" in summary
    stored = verdicts.read(str(workdir))
    # One verdict per kernel for the _hd methods, one without preprocessing, one closed form.
    assert set(stored) == {"hd_angular", "hd_arccos", "hd_gaussian", "plain", "theory"}
    assert all(v.sentence() in summary for v in stored.values())
    # The quick variant cannot refute.
    assert all(v.outcome != Outcome.DOES_NOT_HOLD for v in stored.values())


def test_the_hd_claim_is_refuted_only_beyond_its_margin():
    config = structured_config.get_config()

    def rows(ratio):
        return [
            {"kernel": k, "method": method, "m": 64, "ratio": value, "ratio_se": 0.01}
            | {"z_score": math.nan}
            for k in structured_kernels.KERNELS
            for method, value in (("toeplitz_hd", ratio), ("circulant", 1.5))
        ]

    def outcome(ratio):
        judged = structured_kernels.judge({"rows": rows(ratio)}, config).given
        return judged["hd_gaussian"].outcome

    # Above 1 by 10 SE but inside the 1.25 margin: holds; 1.30 +- 0.0196: beyond it.
    assert outcome(1.1) == Outcome.HOLDS
    assert outcome(1.3) == Outcome.DOES_NOT_HOLD
    assert outcome(1.24) == Outcome.NOT_RESOLVED  # the interval straddles 1.25
    assert structured_kernels.judge({"rows": rows(1.0)}, config).given["theory"].outcome == (
        Outcome.NOT_TESTED
    )


def test_closed_form_reduces_to_iid_for_uncorrelated_shifts():
    # a single spike has zero autocorrelation at every nonzero lag: structured = i.i.d.
    points = np.zeros((2, 8))
    points[0, 3] = 1.3
    for structure in structured_kernels.STRUCTURES:
        structured = structured_kernels.gaussian_kernel_theory(points, 1.0, structure, 12)
        iid = structured_kernels.gaussian_kernel_theory(points, 1.0, "gaussian", 12)
        assert structured == pytest.approx(iid, rel=1e-12)
    # a constant vector is its own shift: the circulant rows project it identically
    points[0] = 0.4
    one_block = structured_kernels.gaussian_kernel_theory(points, 1.0, "circulant", 8)
    iid = structured_kernels.gaussian_kernel_theory(points, 1.0, "gaussian", 8)
    assert one_block > 4 * iid
    assert math.isnan(structured_kernels.gaussian_kernel_theory(points, 1.0, "hankel_hd", 8))


def test_parse_method():
    assert structured_kernels.parse_method("toeplitz_hd") == ("toeplitz", True)
    assert structured_kernels.parse_method("hd_orthogonal") == ("hd_orthogonal", False)
    with pytest.raises(ValueError, match="unknown coupling"):
        structured_kernels.parse_method("gaussian_hd")


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("methods", ("circulant", "toeplitz"), "reference"),
        ("methods", ("gaussian", "no_such_coupling"), "unknown coupling"),
        ("num_features", (64, 16), "increasing"),
        ("num_features", (0, 16), "num_features"),
        ("kernels", ("angular",), "kernels"),
        ("num_points", 1, "num_points"),
        ("dataset", "mnist", "dataset"),
    ],
)
def test_bad_config_raises(tmp_path, field, value, match):
    config = structured_config.get_config("quick")
    config[field] = value
    with pytest.raises(ValueError, match=match):
        run_experiment(config, str(tmp_path))


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (0, r"config\.num_points must be an int in \[2, 1797\], got 0"),
        (-1, r"config\.num_points must be an int in \[2, 1797\], got -1"),
        (1798, r"config\.num_points must be an int in \[2, 1797\], got 1798"),
    ],
)
def test_validation_checks_num_points_before_the_data_is_loaded(value, match):
    config = structured_config.get_config("quick")
    config.num_points = value
    with pytest.raises(ValueError, match=match):
        structured_kernels.validate_config(config)


def test_config_variants():
    full, quick = structured_config.get_config(), structured_config.get_config("quick")
    assert set(quick.methods) <= set(full.methods)
    assert quick.num_points < full.num_points
    with pytest.raises(ValueError, match="config variant"):
        structured_config.get_config("huge")


def test_figures_say_what_their_error_bars_are(monkeypatch, tmp_path):
    # The committed figures drew ± 2 SE bars that neither the figure nor the summary named.
    texts = committed_figure_texts(monkeypatch, "structured_kernels", tmp_path)
    assert "2 SE" in texts["error_vs_features.png"], texts
