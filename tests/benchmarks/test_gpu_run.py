"""``benchmarks.gpu_run``'s bookkeeping, with the steps' processes replaced by a recorder: the
steps run in their fixed order, each with its share of ``--minutes`` among the steps asked for,
and each benchmark is told a budget inside its process's limit."""

import json
import sys

import pytest

from benchmarks import gpu_run, long_context


@pytest.fixture
def recorded(monkeypatch, tmp_path):
    """Runs ``gpu_run.main`` with these arguments as if on a GPU; returns (step name, command,
    seconds) per process it would start, and the steps.json it wrote."""
    started = []

    def step(name, command, log, timeout_s):
        started.append((name, command, timeout_s))
        return {"command": command, "returncode": 0, "seconds": 0.0}

    monkeypatch.setattr(gpu_run, "_step", step)
    monkeypatch.setattr(gpu_run.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(gpu_run, "_environment", lambda: {"backend": "gpu"})

    def run(*argv):
        started.clear()
        monkeypatch.setattr(sys, "argv", ["gpu_run", "--out", str(tmp_path), *argv])
        gpu_run.main()
        return started[:], json.loads((tmp_path / "steps.json").read_text())

    return run


def test_steps_run_in_order_with_their_shares_of_the_minutes(recorded):
    started, steps = recorded("--steps", "attention", "fwht", "--minutes", "10")
    assert [name for name, _, _ in started] == ["fwht benchmark", "attention benchmark"]
    shares = gpu_run.SHARES["fwht"] + gpu_run.SHARES["attention"]
    fwht_s, attention_s = (600 * gpu_run.SHARES[n] / shares for n in ("fwht", "attention"))
    assert [s for _, _, s in started] == pytest.approx([fwht_s, attention_s])
    assert sum(s for _, _, s in started) == pytest.approx(600)
    fwht, attention = (command for _, command, _ in started)
    assert fwht[fwht.index("--budget-s") + 1] == f"{0.75 * fwht_s:.0f}"
    assert attention[attention.index("--budget-s") + 1] == f"{0.7 * attention_s:.0f}"
    assert "--profile" in attention and "--lengths" not in attention  # not --quick
    assert set(steps) == {"fwht_gpu", "attention_gpu"}


def test_every_step_shares_the_minutes_and_quick_shortens_the_benchmarks(recorded):
    lm_args = "--skip perplexity --implementation xla"  # overrides --lm-implementation's default
    started, steps = recorded("--minutes", "30", "--quick", "--lm-args", lm_args)
    names = ["GPU tests", "long-context benchmark", "fwht benchmark", "attention benchmark"]
    assert [name for name, _, _ in started] == names
    expected = [60 * 30 * gpu_run.SHARES[step] for step in gpu_run.STEPS]
    assert [s for _, _, s in started] == pytest.approx(expected)
    fwht, attention = started[2][1], started[3][1]
    assert fwht[-2:] == ["--repeats", "3"] and attention[-4:] == [
        "--lengths",
        "1024",
        "4096",
        "16384",
    ]
    assert list(steps) == ["pytest", "long_context", "fwht_gpu", "attention_gpu"]
    lm = started[1][1]
    assert long_context.parser().parse_args(lm[3:]).implementation == "xla"


@pytest.mark.parametrize("minutes", ["0", "-5", "nan"])
def test_minutes_that_leave_no_time_are_refused_before_any_step(recorded, minutes, capsys):
    # --minutes 0 ran every step under a limit of 0 s, each killed as it started
    with pytest.raises(SystemExit) as stopped:
        recorded("--minutes", minutes)
    assert stopped.value.code == 2 and f"--minutes must be > 0, got {float(minutes)}" in (
        capsys.readouterr().err
    )
