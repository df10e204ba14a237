"""RESULTS.md is generated from results/ and current; the reproduce command's plumbing."""

import os

from experiments import reproduce, results_page
from tests.support import ROOT


def test_committed_results_page_is_current():
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        page = results_page.render()
        with open("RESULTS.md") as handle:
            committed = handle.read()
    finally:
        os.chdir(cwd)
    assert committed == page, "RESULTS.md is stale: run python -m experiments.results_page"


def test_render_demotes_headings_rewrites_local_links_and_lists_missing_runs(tmp_path):
    run = tmp_path / "kernel_mse"
    run.mkdir()
    (run / "summary.md").write_text(
        "# Title\n\nText [csv](results.csv), ![fig](mse.png), [web](https://x.org/a.png)\n## Part\n"
    )
    (run / "command.txt").write_text("python -m experiments.main --config=configs/kernel_mse.py\n")
    page = results_page.render(str(tmp_path))
    assert "## Title\n\n`python -m experiments.main --config=configs/kernel_mse.py`" in page
    assert f"[csv]({tmp_path}/kernel_mse/results.csv)" in page
    assert f"![fig]({tmp_path}/kernel_mse/mse.png)" in page
    assert "[web](https://x.org/a.png)" in page
    assert "\n### Part" in page
    assert "# Not run yet" in page
    assert results_page.default_command("gram_error") in page
    # An experiment without a summary but with a note says why it has no run.
    (tmp_path / "lstm_lm").mkdir()
    (tmp_path / "lstm_lm" / results_page.NOT_RUN_FILE).write_text("Too slow here.\n\nTimes.\n")
    page = results_page.render(str(tmp_path))
    command = results_page.default_command("lstm_lm")
    assert f"- `{command}`\n\n  Too slow here.\n\n  Times.\n" in page


def test_reproduce_runs_each_headline_experiment_and_reports_its_files(tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "HEADLINE", (("kernel_mse", "quick", "Fig. 6 at test scale"),))
    (written,) = reproduce.reproduce(str(tmp_path), full=False)
    assert written["summary"] == str(tmp_path / "kernel_mse" / "summary.md")
    assert os.path.getsize(written["summary"]) > 0
    assert [os.path.basename(path) for path in written["figures"]] == ["mse_ratio.png"]
    command = (tmp_path / "kernel_mse" / "command.txt").read_text()
    assert "--config=configs/kernel_mse.py:quick" in command


def test_every_headline_experiment_has_its_reproduce_variant():
    for name, variant, _ in reproduce.HEADLINE:
        config = reproduce.load_config(name, variant)
        assert config.experiment == name
