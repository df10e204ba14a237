"""RESULTS.md and the README's table of studies are generated (from results/ and the studies'
declarations) and current; the reproduce command's plumbing."""

import json
import os
import sys
import types

import pytest

from experiments import reproduce, results_page
from experiments.core import study
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


def test_render_demotes_headings_rewrites_local_links_and_lists_folders_without_a_run(tmp_path):
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
    assert "# Not run yet" not in page  # no other study has a folder
    # A folder holding only a note is listed under "Not run yet", the note saying why.
    (tmp_path / "lstm_lm").mkdir()
    (tmp_path / "lstm_lm" / results_page.NOT_RUN_FILE).write_text("Too slow here.\n\nTimes.\n")
    page = results_page.render(str(tmp_path))
    command = results_page.default_command("lstm_lm")
    assert f"# Not run yet\n\n- `{command}`\n\n  Too slow here.\n\n  Times.\n" in page


def test_reproduce_runs_each_headline_experiment_and_reports_its_files(tmp_path, monkeypatch):
    monkeypatch.setattr(reproduce, "HEADLINE", (("kernel_mse", "quick", "Fig. 6 at test scale"),))
    # A figure an earlier run of another variant left in the folder is not this run's.
    (tmp_path / "kernel_mse").mkdir()
    (tmp_path / "kernel_mse" / "stale_variant.png").write_bytes(b"")
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


def test_committed_readme_study_table_is_current():
    with open(os.path.join(ROOT, results_page.README)) as handle:
        committed = handle.read()
    table = results_page.with_study_table(committed, os.path.join(ROOT, "results"))
    assert committed == table, (
        "the README's table of studies is stale: run python -m experiments.results_page"
    )


def _table_names(table: str) -> list[str]:
    return [line.split("`")[1] for line in table.splitlines()[2:]]


def test_every_study_with_results_is_on_the_page_and_in_the_readme_table_in_declared_order(
    monkeypatch,
):
    declared = study.studies()
    assert set(declared) == set(study.study_names()) and "core" not in declared
    orders = [entry.order for entry in declared.values()]
    assert orders == sorted(orders)
    monkeypatch.chdir(ROOT)
    with_results = [name for name in declared if os.path.isdir(os.path.join("results", name))]
    with open("RESULTS.md") as handle:
        page = handle.read()
    for name in with_results:
        assert results_page.render_experiment("results", name) in page, name
    table = _table_names(results_page.study_table())
    assert [name for name in table if name in with_results] == with_results
    assert [name for name in declared if name in table] == table


def test_a_study_comes_onto_the_page_and_into_the_table_with_its_first_results(tmp_path):
    """Adding a study changes neither RESULTS.md nor the README: without a folder in
    ``results/`` it is on neither; its first committed folder brings it onto both."""
    assert _table_names(results_page.study_table(str(tmp_path))) == []
    empty = results_page.render(str(tmp_path))
    assert "gram_error" not in empty and "# Not run yet" not in empty
    (tmp_path / "gram_error").mkdir()
    (tmp_path / "gram_error" / "summary.md").write_text("# Gram error\n\nNumbers.\n")
    assert _table_names(results_page.study_table(str(tmp_path))) == ["gram_error"]
    page = results_page.render(str(tmp_path))
    assert "## Gram error\n\n`" + results_page.default_command("gram_error") in page
    assert "kernel_mse" not in page


def _fake_studies(monkeypatch, **declared):
    """Study packages ``experiments.<name>`` that declare ``declared[name]`` (None: no STUDY)."""
    monkeypatch.setattr(study, "study_names", lambda: sorted(declared))
    for name, entry in declared.items():
        module = types.ModuleType(f"experiments.{name}")
        if entry is not None:
            module.STUDY = entry
        monkeypatch.setitem(sys.modules, f"experiments.{name}", module)


def test_studies_are_grouped_by_paper_in_the_declared_order(monkeypatch, tmp_path):
    _fake_studies(
        monkeypatch,
        a=study.Study(paper="P", order=30, reproduces="a"),
        b=study.Study(paper="Q", order=10, reproduces="b"),
        c=study.Study(paper="P", order=20, reproduces="c"),
    )
    assert list(study.studies()) == ["b", "c", "a"]
    assert study.sections() == [("Q", ["b"]), ("P", ["c", "a"])]
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    assert results_page.study_table(str(tmp_path)) == (
        "| config | reproduces |\n|---|---|\n| `b` | b |\n| `c` | c |\n| `a` | a |\n"
    )


def test_a_package_without_a_declaration_or_with_a_taken_order_is_refused(monkeypatch):
    _fake_studies(monkeypatch, a=study.Study(paper="P", order=1, reproduces="a"), b=None)
    with pytest.raises(ValueError, match=r"experiments/b/__init__.py must declare STUDY"):
        study.studies()
    _fake_studies(
        monkeypatch,
        a=study.Study(paper="P", order=1, reproduces="a"),
        b=study.Study(paper="Q", order=1, reproduces="b"),
    )
    with pytest.raises(ValueError, match=r"studies 'a' and 'b' both declare order 1"):
        study.studies()
    with pytest.raises(ValueError, match=r"Study.reproduces must be one non-empty line"):
        study.Study(paper="P", order=1, reproduces="two\nlines")


def test_a_variant_run_follows_its_study_and_a_folder_of_no_study_is_refused(tmp_path):
    # "fig6" sorts before "kernel_mse": the study's own folder still comes first
    for folder in ("kernel_mse_wide", "kernel_mse", "fig6"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "summary.md").write_text(f"# {folder}\n")
        (tmp_path / folder / "config.json").write_text(json.dumps({"experiment": "kernel_mse"}))
    page = results_page.render(str(tmp_path))
    assert (
        page.index("## kernel_mse\n") < page.index("## fig6\n") < page.index("## kernel_mse_wide\n")
    )
    assert "# Not run yet" not in page
    (tmp_path / "stray").mkdir()
    (tmp_path / "stray" / "config.json").write_text(json.dumps({"experiment": "gone"}))
    with pytest.raises(ValueError, match=r"stray/ belongs to no study: .* experiment 'gone'"):
        results_page.render(str(tmp_path))


def test_a_readme_without_the_table_markers_is_refused():
    with pytest.raises(ValueError, match=r"must hold the lines .* once each"):
        results_page.with_study_table("# README\n\nno table here\n")
    with pytest.raises(ValueError, match=r"must hold the lines .* in that order"):  # end first
        results_page.with_study_table(
            f"a\n{results_page.TABLE_END}\nold\n{results_page.TABLE_BEGIN}\nb\n"
        )
    readme = f"a\n{results_page.TABLE_BEGIN}\nold\n{results_page.TABLE_END}\nb\n"
    expected = f"a\n{results_page.TABLE_BEGIN}\n{results_page.study_table()}"
    assert results_page.with_study_table(readme) == f"{expected}{results_page.TABLE_END}\nb\n"


def test_the_page_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    # _update opened RESULTS.md and the README in place ("w"): a write that failed midway left
    # a truncated page. It writes through a temporary file and os.replace, as every output does.
    import builtins

    path = tmp_path / "RESULTS.md"
    path.write_text("previous page\n")
    plain_open = builtins.open

    def no_write_in_place(file, mode="r", *args, **kwargs):
        if os.fspath(file) == str(path) and "w" in mode:
            raise OSError("disk full")
        return plain_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_write_in_place)
    assert results_page._update(str(path), "new page\n", check=False)
    assert path.read_text() == "new page\n" and os.listdir(tmp_path) == ["RESULTS.md"]


def test_check_fails_when_either_file_is_out_of_date(tmp_path, monkeypatch):
    """``--check`` exits 1 when RESULTS.md is stale even though the README's table is current
    (and 0 when both are)."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(results_page, "render", lambda: "page\n")
    page = tmp_path / "RESULTS.md"
    argv = ["results_page", "--check", f"--output={page}", f"--readme={ROOT / 'README.md'}"]
    monkeypatch.setattr(sys, "argv", argv)
    page.write_text("stale page\n")
    assert results_page.main() == 1
    page.write_text("page\n")
    assert results_page.main() == 0
