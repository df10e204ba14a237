"""Quick variants never state "does not hold" (issue 33, point 5): a run of a quick config
through ``run_experiment`` has its summary's verdicts downgraded to "not resolved"."""

import json

import pytest

from configs import iap_es as iap_es_config
from configs import kernel_mse as kernel_mse_config
from configs import performer_vit as performer_vit_config
from configs import structured_concentration as structured_concentration_config
from experiments import kernel_mse, outputs
from experiments.main import run_experiment


@pytest.fixture
def toy_run(tmp_path, monkeypatch):
    """kernel_mse's run replaced by one that renders a summary with a failed claim."""
    monkeypatch.setattr(outputs, "TEMPLATES", str(tmp_path))
    (tmp_path / "toy.md").write_text("# Toy\n\nClaim: $claim.\n")

    def run(config, workdir):
        del config, workdir
        return outputs.render_summary("toy", claim="**does not hold**, because 7.3 SE")

    monkeypatch.setattr(kernel_mse, "run", run)
    return lambda arg: run_experiment(kernel_mse_config.get_config(arg), str(tmp_path / "w"))


def test_a_quick_run_states_no_does_not_hold(toy_run):
    summary = toy_run("quick,num_draws=10")
    assert "does not hold" not in summary.replace('none is "does not hold"', "")
    assert "Claim: **not resolved (quick variant, not powered)**, because 7.3 SE." in summary
    assert "needs the full config (the same command without :quick)" in summary


def test_a_quick_run_states_no_does_not_hold_in_tables_csv_or_json(tmp_path):
    rows = [{"claim": "SimRF < ORF", "verdict": "does not hold (3 SE)", "z": 3.0}]
    with outputs.unpowered_verdicts(kernel_mse_config.get_config("quick")):
        table = outputs.markdown_table(rows)
        outputs.write_csv(str(tmp_path / "r.csv"), rows)
        outputs.write_json(str(tmp_path / "r.json"), {"verdicts": ["does not hold", "holds"]})
    assert "| SimRF < ORF | not resolved (quick variant, not powered) (3 SE) | 3 |" in table
    assert outputs.read_csv(tmp_path / "r.csv")[0]["verdict"].startswith("not resolved")
    verdicts = json.loads((tmp_path / "r.json").read_text())["verdicts"]
    assert verdicts == [outputs.NOT_POWERED, "holds"]
    assert "does not hold" in outputs.markdown_table(rows)  # outside a quick run: unchanged


def test_a_full_run_keeps_its_verdicts(toy_run):
    assert toy_run(None) == "# Toy\n\nClaim: **does not hold**, because 7.3 SE.\n"
    # Outside run_experiment nothing is downgraded either.
    assert "does not hold" in outputs.render_summary("toy", claim="does not hold")


@pytest.mark.parametrize(
    ("module", "quick", "full"),
    [
        (kernel_mse_config, "quick", "default"),
        (structured_concentration_config, "quick", "default"),
        (performer_vit_config, "quick", "default"),
        (iap_es_config, "quick", "default"),  # its variant field is "label"
    ],
)
def test_every_config_records_its_variant(module, quick, full):
    assert outputs.config_variant(module.get_config("quick")) == quick
    assert outputs.config_variant(module.get_config()) == full
