"""Errors and messages that say what is expected (issue 33, point 3): FAVOR's array layouts,
an unknown config field in either override form, where a run's summary went, and a progress
line that does not say "done" after an interruption."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from experiments.core import outputs
from rfjax.attention import draw_projection, favor_attention
from tests.support import ROOT


def test_favor_attention_on_a_model_width_array_names_the_layouts_and_the_reading():
    x = jnp.ones((2, 5, 32))  # (B, T, D): no heads axis
    projection = draw_projection(jax.random.key(0), 8, 16)  # H = D / N for N = 4 heads
    expected = (
        r"The query of shape \(2, 5, 32\) was read as \(T, N, H\) = \(2, 5, 32\).*"
        r"\(B, T, N, H\) or \(T, N, H\).*x\.reshape\(B, T, N, D // N\)"
    )
    with pytest.raises(ValueError, match=expected):
        favor_attention(x, x, x, projection)
    with pytest.raises(ValueError, match=r"read as \(B, T, N, H\) = \(1, 2, 5, 32\)"):
        favor_attention(x[None], x[None], x[None], projection)


def _main(*flags):
    command = [sys.executable, "-m", "experiments.main", "--config=configs/kernel_mse.py:quick"]
    return subprocess.run(
        [*command, *flags], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )


def test_an_unknown_field_gives_one_message_in_both_override_forms(tmp_path):
    workdir = f"--workdir={tmp_path / 'run'}"
    absl_form = _main("--config.num_feature=3", workdir)
    # the same field in the other form: --config=FILE:variant,key=value
    command = [sys.executable, "-m", "experiments.main", workdir]
    comma_form = subprocess.run(
        [*command, "--config=configs/kernel_mse.py:quick,num_feature=3"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    for completed in (absl_form, comma_form):
        assert completed.returncode == 2, completed.stderr[-2000:]
        assert "Traceback" not in completed.stderr
        first = completed.stderr.splitlines()[0]
        assert first.startswith("invalid config: config has no field 'num_feature'")
        assert "did you mean ['num_features']" in first
    assert absl_form.stderr == comma_form.stderr
    assert not (tmp_path / "run").exists()


def test_other_flag_errors_read_as_absl_without_a_traceback():
    completed = _main("--no_such_flag=1")
    assert completed.returncode == 1
    assert completed.stderr.startswith("FATAL Flags parsing error: Unknown command line flag")
    assert "Traceback" not in completed.stderr


@pytest.fixture
def lines(monkeypatch, capsys):
    monkeypatch.setattr(outputs.sys.stderr, "isatty", lambda: False)  # lines, not a bar
    return lambda: capsys.readouterr().out.splitlines()


def test_progress_after_ctrl_c_says_interrupted_not_done(lines):
    with pytest.raises(KeyboardInterrupt), outputs.Progress("steps", 10, interval_s=0.0) as bar:
        bar.update(3)
        raise KeyboardInterrupt
    last = lines()[-1]
    assert last.startswith("steps: 3/10 (30%)") and last.endswith("interrupted")
    assert "done" not in last


def test_progress_ended_by_an_error_or_a_break_is_not_done(lines):
    with pytest.raises(RuntimeError), outputs.Progress("draws", 4, interval_s=0.0) as bar:
        bar.update()
        raise RuntimeError("boom")
    assert lines()[-1].endswith("stopped by RuntimeError")
    iterator = outputs.progress(range(4), "draws", interval_s=0.0)
    for item in iterator:
        if item == 1:
            break
    iterator.close()  # what the loop's end does to a generator when it is collected
    assert lines()[-1].endswith("stopped")
    assert list(outputs.progress(range(2), "draws", interval_s=0.0)) == [0, 1]
    assert lines()[-1].endswith("done")
