"""Tests of the shared experiment output helpers."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from experiments.core import outputs
from tests.support import ROOT


@pytest.fixture
def template_dir(tmp_path, monkeypatch):
    """A study package folder ``<tmp>/sketch/`` with its ``summary.md``."""
    monkeypatch.setattr(outputs, "EXPERIMENTS", str(tmp_path))
    (tmp_path / "sketch").mkdir()
    (tmp_path / "sketch" / "summary.md").write_text("Claim: $claim. Ours: $ours ($$ is literal).\n")
    return tmp_path


def test_render_summary_fills_every_placeholder(template_dir):
    text = outputs.render_summary("sketch", claim="SimRF < ORF", ours=0.25)
    assert text == "Claim: SimRF < ORF. Ours: 0.25 ($ is literal).\n"


@pytest.mark.parametrize(
    "values, listed",
    [({"claim": "x"}, "['ours']"), ({"claim": "x", "ours": 1, "extra": 2}, "['extra']")],
)
def test_render_summary_rejects_missing_and_unused_values(template_dir, values, listed):
    with pytest.raises(ValueError, match=listed.replace("[", r"\[").replace("]", r"\]")):
        outputs.render_summary("sketch", **values)


def test_render_summary_names_a_missing_template(template_dir):
    with pytest.raises(FileNotFoundError, match="no summary template for experiment 'nope'"):
        outputs.render_summary("nope")


def test_progress_prints_lines_when_not_on_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(outputs.sys.stderr, "isatty", lambda: False)
    # interval 0: a line after every item but the last, then the closing one.
    assert list(outputs.progress(range(4), "draws", interval_s=0.0)) == list(range(4))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "draws: 1/4 (25%)",
        "draws: 2/4 (50%)",
        "draws: 3/4 (75%)",
        "draws: 4/4 (100%)",
    ]
    assert "elapsed" in lines[0] and "left" in lines[0] and lines[-1].endswith("done")


def test_progress_is_silent_for_a_short_phase_and_uses_a_bar_on_a_terminal(monkeypatch, capsys):
    monkeypatch.setattr(outputs.sys.stderr, "isatty", lambda: False)
    assert list(outputs.progress([1, 2], "quick", interval_s=3600.0)) == [1, 2]
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(outputs.sys.stderr, "isatty", lambda: True)
    with outputs.Progress("bar", 3, interval_s=0.0) as display:
        assert display.bar is not None
        display.update(3)
    assert capsys.readouterr().out == ""  # the bar is on stderr; no lines on stdout


def test_format_duration():
    assert [outputs.format_duration(s) for s in (42, 210, 9000)] == ["42 s", "3.5 min", "2.5 h"]


def test_a_write_that_fails_midway_leaves_the_previous_file(tmp_path):
    path = str(tmp_path / "runs" / "result.json")
    outputs.write_json(path, {"run": 1})
    with pytest.raises(TypeError, match="not JSON serializable"):
        outputs.write_json(path, {"run": 2, "bad": object()})  # json.dump fails after "run"
    assert json.loads(pathlib.Path(path).read_text()) == {"run": 1}
    assert os.listdir(tmp_path / "runs") == ["result.json"]  # no temporary file left
    plain = tmp_path / "plain.json"
    plain.write_text("{}")  # the mode open(path, "w") gives, not the temporary file's 0o600
    assert os.stat(path).st_mode == os.stat(plain).st_mode
    # Ctrl-C (or SIGTERM's exit) in the middle of a write leaves no temporary file either.
    with pytest.raises(KeyboardInterrupt), outputs.replacing(path) as handle:
        handle.write('{"run": 3')
        raise KeyboardInterrupt
    assert json.loads(pathlib.Path(path).read_text()) == {"run": 1}
    assert os.listdir(tmp_path / "runs") == ["result.json"]


def test_a_figure_is_written_whole_or_not_at_all(tmp_path):
    """save_figure writes through a temporary file too (it wrote the PNG in place)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = tmp_path / "figure.png"
    fig, axis = plt.subplots()
    axis.plot([0, 1], [1, 0])
    outputs.save_figure(fig, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and os.listdir(tmp_path) == ["figure.png"]
    fig, _ = plt.subplots()
    fig.savefig = lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("disk full"))
    with pytest.raises(RuntimeError, match="disk full"):
        outputs.save_figure(fig, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and os.listdir(tmp_path) == ["figure.png"]


_WRITE_FOREVER = """
import sys
from experiments.core import outputs
data = {"rows": list(range(20_000))}
while True:
    outputs.write_json(sys.argv[1], data)
"""


def test_a_reader_never_sees_a_file_half_written_even_when_the_writer_is_killed(tmp_path):
    """Another worker (or a resumed run) reads records while one is written; SIGKILL can come
    at any instruction."""
    path = tmp_path / "result.json"
    writer = subprocess.Popen([sys.executable, "-c", _WRITE_FOREVER, str(path)], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not path.exists():
            assert time.monotonic() < deadline and writer.poll() is None
            time.sleep(0.01)
        for _ in range(100):
            assert len(json.loads(path.read_text())["rows"]) == 20_000
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    assert len(json.loads(path.read_text())["rows"]) == 20_000
