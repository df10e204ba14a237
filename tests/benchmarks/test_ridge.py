"""``benchmarks.ridge``: which row's fit time each table ratio divides by, and the direction of
``--versus-sklearn``'s ratios (made-up times; nothing is fitted at scale)."""

import json

import numpy as np
import pytest

from benchmarks import ridge


def test_the_table_divides_each_fit_by_rbf_samplers_at_the_same_m(tmp_path):
    setting = {"gamma": 0.1, "alpha": 1.0, "alpha_grid": [1.0], "validation": [0.5]}
    fits = {  # (method, m): fit seconds
        ("sklearn RBFSampler + RidgeClassifier", 64): 2.0,
        ("sklearn RBFSampler + RidgeClassifier", 128): 8.0,
        ("sklearn Nystroem + RidgeClassifier", 64): 5.0,
        ("sklearn Nystroem + RidgeClassifier", 128): 40.0,
        ("rfjax fourier/orthogonal", 64): 1.0,
        ("rfjax fourier/orthogonal", 128): 2.0,
        ("rfjax fourier/orthogonal", 256): 3.0,  # larger than any peer's m: no ratio
    }
    records = [setting] + [ridge.row(method, m, 60000, 0.9, s) for (method, m), s in fits.items()]
    (tmp_path / "ridge.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    text = ridge.table(str(tmp_path))
    for (method, m), seconds in fits.items():
        reference = fits.get(("sklearn RBFSampler + RidgeClassifier", m))
        ratio = "" if reference is None else f"{seconds / reference:.2f}"
        line = f"| {method} | {m} | 60000 | 0.9000 +- 0.0030 | {seconds:.1f} | {ratio} |"
        assert line in text, line


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class _Estimator:
    """Fits in ``fit_s``; predicts in ``predict_s`` per row, ``first`` times that on a row
    count it has not predicted before."""

    def __init__(self, clock, fit_s, predict_s, first=1.0):
        self.clock, self.fit_s, self.predict_s, self.first = clock, fit_s, predict_s, first
        self.counts = set()

    def fit(self, x, y):
        self.clock.now += self.fit_s
        return self

    def predict(self, x):
        new = len(x) not in self.counts
        self.counts.add(len(x))
        self.clock.now += self.predict_s * len(x) * (self.first if new else 1.0)
        return np.zeros(len(x), int)


def test_versus_sklearn_divides_rfjax_by_sklearn_and_first_by_warm(monkeypatch, tmp_path):
    clock = _Clock()
    monkeypatch.setattr(ridge.time, "perf_counter", clock)
    estimators = {
        "rfjax": _Estimator(clock, fit_s=1.0, predict_s=1e-3, first=1.5),
        "sklearn": _Estimator(clock, fit_s=4.0, predict_s=5e-3),
    }
    monkeypatch.setattr(ridge, "versus_estimators", lambda m: estimators)
    monkeypatch.setattr(ridge, "versus_memory", lambda m, rows: {"rfjax": 10, "sklearn": 40})
    (record,) = ridge.versus_sklearn([8], rows=5000, repeats=3, out=str(tmp_path))
    ratios = {name: ratio["median"] for name, ratio in record["ratios"].items()}
    assert ratios == pytest.approx(
        {
            "fit rfjax/sklearn": 0.25,
            "predict rfjax/sklearn": 0.2,
            "rfjax predict new n first/warm": 1.5,
        }
    )
    assert record["peak_memory rfjax/sklearn"] == 0.25
    # medians over the repeats' new row counts 4999, 4022 and 3045
    assert record["median_s"]["rfjax predict new n (first)"] == pytest.approx(1.5e-3 * 4022)
    saved = json.loads((tmp_path / "versus_sklearn.json").read_text())
    assert saved["records"][0]["ratios"] == record["ratios"]
    with pytest.raises(ValueError, match="--rows > 977"):
        ridge.versus_sklearn([8], rows=1955, repeats=3, out=str(tmp_path))


def test_larger_widths_run_rfjax_alone_and_exact_ridge_once(monkeypatch, tmp_path):
    """``--rfjax-only-components`` widths run the first rfjax variant alone (scikit-learn's
    pipelines hold 60,000 x m features there), the others every method asked for, in order."""
    data = np.zeros((4, 2), np.float32), np.zeros(4, int), np.zeros((4, 2)), np.zeros(4, int)
    monkeypatch.setattr(ridge, "load", lambda: data)
    monkeypatch.setattr(ridge, "median_gamma", lambda x: 1.0)
    monkeypatch.setattr(ridge, "choose_alpha", lambda x, y, gamma: (1.0, [0.5]))
    monkeypatch.setattr(ridge, "method_fit", lambda name, m, *rest: (10, None))
    measured = []
    monkeypatch.setattr(ridge, "measure", lambda out, name, m, *rest: measured.append((name, m)))
    ridge.fashion_mnist_rows([64], [128, 64], str(tmp_path))
    first = ridge.METHODS[0]
    assert measured == [
        (ridge.EXACT, None),
        *((name, 64) for name in ridge.METHODS if name != ridge.EXACT),
        (first, 128),
    ]
