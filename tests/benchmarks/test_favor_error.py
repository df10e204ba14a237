"""``benchmarks.favor_error``: the normalised inputs' scale, the rows' mean |q'|^2, each cell's
mean and standard error, the error of one projection, and the refusal of one seed."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import favor_error
from rfjax.attention import draw_projection, favor_attention, softmax_attention


def test_normalised_rows_have_the_temperature_as_rescaled_squared_norm():
    x = jax.random.normal(jax.random.key(0), (1, 5, 2, favor_error.HEAD_DIM))
    for temperature in (1.0, 4.0):
        rescaled = jnp.sum(favor_error.normalised(x, temperature) ** 2, -1) / 8.0  # sqrt(64)
        np.testing.assert_allclose(rescaled, temperature, rtol=1e-5)


def test_rows_report_the_mean_rescaled_squared_norm(monkeypatch):
    """|q'|^2 = |q|^2 / sqrt(H) averages sigma^2 sqrt(H) over the T N = 1,024 query rows: within
    5 standard errors (|q|^2 / sigma^2 is chi-squared with H degrees of freedom, relative SD
    sqrt(2 / H)); the normalised rows' is tau."""
    monkeypatch.setattr(favor_error, "cells", lambda *args: {})
    rows = favor_error.measure(seeds=2)
    raw = [r for r in rows if r["inputs"].startswith("sigma")]
    assert [(r["inputs"], r["map"]) for r in raw] == [
        (f"sigma = {s}", m) for s in favor_error.SIGMAS for m in favor_error.MAPS
    ]
    relative_se = math.sqrt(2 / favor_error.HEAD_DIM / (favor_error.LENGTH * favor_error.HEADS))
    for row in raw:
        sigma = float(row["inputs"].removeprefix("sigma = "))
        assert row["r2"] == pytest.approx(sigma**2 * 8.0, rel=5 * relative_se)
    normalised = [r for r in rows if r not in raw]
    assert [(r["r2"], r["map"]) for r in normalised] == [
        (t, "positive") for t in favor_error.TEMPERATURES
    ]


def test_each_cell_is_the_mean_and_standard_error_over_the_seeds(monkeypatch):
    errors = {m: [0.1 * m, 0.3 * m, 0.2 * m] for m in favor_error.WIDTHS}
    monkeypatch.setattr(favor_error, "relative_error", lambda fmap, m, seeds, *_: errors[m])
    out = favor_error.cells("positive", 3, None, None, None)
    for m in favor_error.WIDTHS:
        mean, se = out[f"m={m}"]
        assert mean == pytest.approx(0.2 * m)
        assert se == pytest.approx(np.std(errors[m], ddof=1) / math.sqrt(3))


def test_the_error_of_one_projection_is_relative_to_softmax_attention():
    shape = (1, 8, favor_error.HEADS, favor_error.HEAD_DIM)
    keys = jax.random.split(jax.random.key(1), 3)
    q, k, v = (0.3 * jax.random.normal(key, shape) for key in keys)
    (got,) = favor_error.relative_error("positive", 16, 1, q, k, v)
    projection = draw_projection(
        jax.random.key(1000),
        favor_error.HEAD_DIM,
        16,
        coupling="orthogonal",
        num_heads=favor_error.HEADS,
    )
    exact = softmax_attention(q, k, v)
    difference = favor_attention(q, k, v, projection, feature_map="positive") - exact
    want = float(jnp.linalg.norm(difference) / jnp.linalg.norm(exact))
    assert got == pytest.approx(want, rel=1e-5)  # jitted there, eager here


def test_one_seed_is_refused(capsys):
    with pytest.raises(SystemExit):
        favor_error.main(["--seeds", "1"])
    assert "--seeds must be >= 2, got 1" in capsys.readouterr().err
