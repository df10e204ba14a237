"""The structured_kernels experiment (Choromanski & Fagan) at its quick size."""

import math

import numpy as np
import pytest

from configs import structured_kernels as structured_config
from experiments import structured_kernels
from experiments.main import run_experiment


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("structured_kernels")
    return workdir, run_experiment(structured_config.get_config("quick"), str(workdir))


def _cells(result):
    return {(r["kernel"], r["method"], r["m"]): r for r in result["rows"]}


def test_writes_outputs(quick_run):
    workdir, result = quick_run
    for name in ("results.csv", "error_vs_features.png", "summary.md", "config.json"):
        assert (workdir / name).stat().st_size > 0, name
    assert (workdir / "summary.md").read_text().startswith("# ")
    config = structured_config.get_config("quick")
    assert len(result["rows"]) == 3 * len(config.methods) * len(config.num_features)


def test_gaussian_kernel_error_matches_closed_form(quick_run):
    _, result = quick_run
    checked = [r for r in result["rows"] if math.isfinite(r["error_theory"])]
    # i.i.d. and plain circulant at each m (toeplitz_hd has no closed form)
    assert {r["method"] for r in checked} == {"gaussian", "circulant"}
    for row in checked:
        assert row["kernel"] == "gaussian"
        assert abs(row["error"] - row["error_theory"]) <= 4 * row["error_se"], row


def test_error_decreases_with_features(quick_run):
    _, result = quick_run
    config = structured_config.get_config("quick")
    cells = _cells(result)
    few, many = min(config.num_features), max(config.num_features)
    for kernel in structured_kernels.KERNELS:
        for method in config.methods:
            a, b = cells[(kernel, method, few)], cells[(kernel, method, many)]
            assert a["error"] - b["error"] > 4 * math.hypot(a["error_se"], b["error_se"])


def test_structured_versus_gaussian(quick_run):
    _, result = quick_run
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


def test_summary_states_a_computed_verdict_for_each_claim(quick_run):
    workdir, _ = quick_run
    summary = (workdir / "summary.md").read_text()
    assert "## Claims, our numbers, verdicts" in summary
    # One verdict per kernel for the _hd methods, one without preprocessing, one closed form.
    assert summary.count("**holds") + summary.count("**does not hold") == 5


def test_ratio_counts_and_verdict():
    rows = [{"ratio": ratio, "ratio_se": 0.01} for ratio in (1.0, 1.02, 1.05, 0.9)]
    counts = structured_kernels.ratio_counts(rows, lambda row: True)
    assert counts == {"above": 1, "below": 1, "within": 2, "cells": 4}
    assert structured_kernels.matches_verdict(counts) == (
        "does not hold, because the ratio is above 1 by > 3 SE in 1 of 4 cells"
    )
    assert structured_kernels.matches_verdict(
        structured_kernels.ratio_counts(rows[:2], lambda row: True)
    ).startswith("holds")


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
        ("num_features", (0, 16), "increasing"),
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


def test_config_variants():
    full, quick = structured_config.get_config(), structured_config.get_config("quick")
    assert set(quick.methods) <= set(full.methods)
    assert quick.num_points < full.num_points
    with pytest.raises(ValueError, match="config variant"):
        structured_config.get_config("huge")
