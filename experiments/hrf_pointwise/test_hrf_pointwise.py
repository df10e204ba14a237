"""The pointwise HRF study (hrf_pointwise) at its quick size, run in-process."""

import math

import pytest

from configs import hrf_pointwise as pointwise_config
from experiments.core import verdicts
from experiments.core.outputs import read_csv
from experiments.core.verdicts import Outcome
from experiments.main import run_experiment


@pytest.mark.integration
def test_pointwise_quick_hybrid_is_exact_at_both_ends(tmp_path):
    config = pointwise_config.get_config("quick")
    run_experiment(config, str(tmp_path))
    for name in ("results.csv", "summary.csv", "relative_error.png", "summary.md", "config.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    rows = read_csv(tmp_path / "results.csv")
    assert len(rows) == len(config.radii) * config.num_angles * 4

    def error(radius, estimator, theta, column="rel_error_mc"):
        (row,) = [
            r
            for r in rows
            if float(r["radius"]) == radius
            and r["estimator"] == estimator
            and math.isclose(float(r["theta"]), theta, abs_tol=1e-12)
        ]
        return float(row[column])

    for radius in config.radii:
        for theta in (0.0, math.pi):
            # Zero variance at both ends (Theorem 3.5): only rounding is left (float64).
            assert error(radius, "angular_hybrid", theta) < 1e-6
            assert error(radius, "angular_hybrid", theta, "rel_error_theory") < 1e-12
        # Each base estimator is exact at one end only.
        assert error(radius, "trigonometric", math.pi) > 0.1
        assert error(radius, "positive", 0.0) > 0.1
        assert error(radius, "gaussian_hybrid", 0.0) > 0.1
    # The trig estimator is bounded, so its Monte Carlo error is reliable: within 5 SE.
    for row in rows:
        if row["estimator"] == "trigonometric" and float(row["rel_error_theory"]) > 0:
            z = (float(row["rel_error_mc"]) - float(row["rel_error_theory"])) / float(
                row["rel_error_se"]
            )
            assert abs(z) <= 5.0, row
    summary = (tmp_path / "summary.md").read_text()
    assert "## Claims, our numbers, verdicts" in summary
    # The exactness at both ends is a computed verdict (float64 rounding only).
    assert "Theorem 3.5" in summary and "exact counts as below 1e-06" in summary
    stored = verdicts.read(str(tmp_path))
    assert stored["exact_ends"].outcome == Outcome.HOLDS
    assert set(stored) == set(config.claims)


def test_config_variants():
    full, quick = pointwise_config.get_config(), pointwise_config.get_config("quick")
    assert full.experiment == quick.experiment
    with pytest.raises(ValueError, match="config variant"):
        pointwise_config.get_config("huge")
