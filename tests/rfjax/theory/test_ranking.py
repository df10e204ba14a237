"""``rfjax.theory.rank_estimators`` against Monte Carlo: every closed form it ranks by matches the
Monte Carlo MSE within 4 SE, and every order between two estimators that Monte Carlo resolves
beyond 4 SE (paired, common keys) is the predicted order."""

import doctest
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rfjax import features, projections, theory
from rfjax.theory import _ranking

NSIG = 4.0
NUM_DRAWS = 4_000
DIM, NUM_FEATURES, NUM_POINTS = 4, 8, 6


@pytest.fixture(autouse=True)
def _float64():
    with jax.enable_x64(True):
        yield


def _data():
    kq, kk = jax.random.split(jax.random.key(7))
    queries = 0.25 * jax.random.normal(kq, (NUM_POINTS, DIM)) + 0.1
    keys = 0.3 * jax.random.normal(kk, (NUM_POINTS, DIM)) * jnp.array([1.5, 1.0, 0.6, 0.4])
    return queries, keys


def _monte_carlo_squared_errors(ranking, queries, keys):
    """Per draw, the squared error averaged over all query-key pairs, for each ranked pair."""
    truth = jnp.exp(queries @ keys.T)
    maps = [
        features.get(entry.feature_map)().fit(jax.random.key(0), queries, keys) for entry in ranking
    ]

    def errors(key):
        out = []
        for entry, fmap in zip(ranking, maps, strict=True):
            w = projections.get(entry.coupling)(key, DIM, NUM_FEATURES, dtype=jnp.float64)
            gram = fmap.features(queries, w, side="query") @ fmap.features(keys, w, side="key").T
            out.append(jnp.mean((gram - truth) ** 2))
        return jnp.stack(out)

    keys_ = jax.random.split(jax.random.key(1), NUM_DRAWS)
    return np.asarray(jax.jit(jax.vmap(errors))(keys_))


def test_ranking_matches_monte_carlo():
    queries, keys = _data()
    ranking = theory.rank_estimators(queries[:, None], keys[None], NUM_FEATURES)
    assert [entry.mse for entry in ranking] == sorted(entry.mse for entry in ranking)
    assert {(e.feature_map, e.coupling) for e in ranking} >= {
        ("positive", "simplex"),
        ("oprf", "gaussian"),
        ("saderf", "gaussian"),
    }
    squared = _monte_carlo_squared_errors(ranking, queries, keys)
    means = squared.mean(0)
    errors = squared.std(0, ddof=1) / np.sqrt(NUM_DRAWS)
    for entry, mean, se in zip(ranking, means, errors, strict=True):
        assert abs(mean - entry.mse) <= NSIG * se, (entry, mean, se)
    resolved = 0
    for i, j in itertools.combinations(range(len(ranking)), 2):  # ranking[i] predicted better
        difference = squared[:, j] - squared[:, i]
        z = difference.mean() / (difference.std(ddof=1) / np.sqrt(NUM_DRAWS))
        if abs(z) > NSIG:
            resolved += 1
            assert z > 0, (ranking[i], ranking[j], z)
    assert resolved >= 20, resolved  # the test has power: most of the 36 orders are resolved


def test_statistics_change_the_fitted_estimators_only():
    queries, keys = _data()
    own = {(e.feature_map, e.coupling): e.mse for e in theory.rank_estimators(queries, keys, 8)}
    other = features.input_statistics(3.0 * queries, keys)
    given = theory.rank_estimators(queries, keys, 8, statistics=other)
    for entry in given:
        key = (entry.feature_map, entry.coupling)
        if entry.feature_map in ("positive", "positive_antithetic", "trigonometric"):
            assert entry.mse == pytest.approx(own[key], rel=1e-12)
        else:
            assert entry.mse != pytest.approx(own[key], rel=1e-6)


def test_weights_give_the_weighted_mean_of_the_pairs():
    queries, keys = _data()
    stats = features.input_statistics(queries, keys)
    x, y = queries[:, None], keys[None]
    plain = theory.rank_estimators(x, y, 8, statistics=stats)
    uniform = theory.rank_estimators(x, y, 8, statistics=stats, weights=jnp.full((6, 6), 2.0))
    assert [(e.feature_map, e.coupling) for e in uniform] == [
        (e.feature_map, e.coupling) for e in plain
    ]
    assert [e.mse for e in uniform] == pytest.approx([e.mse for e in plain], rel=1e-12)
    one_pair = np.zeros((6, 6))
    one_pair[2, 4] = 1.0
    weighted = theory.rank_estimators(x, y, 8, statistics=stats, weights=one_pair)
    single = theory.rank_estimators(queries[2], keys[4], 8, statistics=stats)
    assert {(e.feature_map, e.coupling): e.mse for e in weighted} == pytest.approx(
        {(e.feature_map, e.coupling): e.mse for e in single}, rel=1e-12
    )
    for bad in (np.zeros((6, 6)), -one_pair, np.ones((5,))):
        with pytest.raises(ValueError, match="weights"):
            theory.rank_estimators(x, y, 8, weights=bad)


def test_bad_arguments_raise():
    queries, keys = _data()
    with pytest.raises(ValueError, match="num_features"):
        theory.rank_estimators(queries, keys, 0)
    with pytest.raises(ValueError, match="last axis"):
        theory.rank_estimators(queries, keys[:, :3], 4)


def test_docstring_examples_run():
    with jax.enable_x64(False):
        result = doctest.testmod(_ranking)
    assert result.failed == 0 and result.attempted > 0
