"""experiments.core.stats on fixed inputs whose answers are derived by hand or from scipy."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as scipy_stats

from experiments.core import stats
from experiments.core.stats import Estimate


def test_mean_se_of_three_values_and_nan_for_one():
    mean, se = stats.mean_se(np.array([1.0, 2.0, 3.0]))
    assert float(mean) == 2.0 and float(se) == pytest.approx(1 / math.sqrt(3))
    mean, se = stats.mean_se(np.array([[4.0, 5.0]]))
    assert mean.tolist() == [4.0, 5.0] and np.isnan(se).all()


def test_mean_se_a_non_finite_sample_poisons_only_its_own_column():
    samples = np.array([[1.0, 1.0], [np.inf, 2.0], [3.0, 3.0]])
    with np.errstate(all="raise"):  # and no warning either
        mean, se = stats.mean_se(samples)
    assert math.isinf(mean[0]) and math.isnan(se[0])
    assert mean[1] == 2.0 and se[1] == pytest.approx(1 / math.sqrt(3))


def test_mean_se_of_nothing_raises():
    with pytest.raises(ValueError, match="at least one entry"):
        stats.mean_se(np.zeros((0, 3)))


def test_paired_difference_matches_scipy_ttest_rel():
    a, b = [3.0, 5.0, 4.0], [1.0, 2.0, 3.0]  # differences 2, 3, 1: mean 2, sd 1
    d = stats.paired_difference(a, b)
    reference = scipy_stats.ttest_rel(a, b)
    assert (d.mean, d.n, d.df) == (2.0, 3, 2.0)
    assert d.se == pytest.approx(1 / math.sqrt(3)) and d.sd == pytest.approx(1.0)
    assert d.t == pytest.approx(reference.statistic) and d.p == pytest.approx(reference.pvalue)
    reversed_pair = stats.paired_difference(b, a)  # a negative effect has the same p
    assert reversed_pair.p == pytest.approx(scipy_stats.ttest_rel(b, a).pvalue) == d.p
    low, high = d.interval(0.95)
    half = 4.302652729749462 / math.sqrt(3)  # t_{0.975, 2} se
    assert (low, high) == pytest.approx((2 - half, 2 + half))


def test_paired_difference_of_one_pair_has_no_interval():
    d = stats.paired_difference([1.0], [0.5])
    assert d.mean == 0.5 and math.isnan(d.se)
    assert all(math.isnan(v) for v in (*d.interval(), d.t, d.p))


def test_paired_difference_rejects_unpaired_shapes():
    with pytest.raises(ValueError, match="same length"):
        stats.paired_difference([1.0, 2.0], [1.0])


def test_as_dict_gives_the_table_columns():
    row = stats.paired_difference([3.0, 5.0, 4.0], [1.0, 2.0, 3.0]).as_dict()
    assert list(row) == ["mean", "se", "sd", "t", "p", "low", "high", "n"]


def test_pool_is_the_equal_weight_mean_with_welch_satterthwaite_df():
    pooled = stats.pool([Estimate(1.0, 0.3, 10, 9.0), Estimate(2.0, 0.4, 10, 9.0)])
    assert pooled.mean == 1.5
    assert pooled.se == pytest.approx(math.sqrt(0.09 + 0.16) / 2)
    # (sum v_i)^2 / sum v_i^2 / df_i with v_i = se_i^2 / 4 (the 1/4 cancels)
    assert pooled.df == pytest.approx(0.25**2 / ((0.09**2 + 0.16**2) / 9))
    assert pooled.n == 20  # the units of both cells
    # A cell of two units (1 df) counts in the df: 0.25^2 / (0.09^2 / 1 + 0.16^2 / 9) = 0.72.
    few = stats.pool([Estimate(1.0, 0.3, 2, 1.0), Estimate(2.0, 0.4, 10, 9.0)])
    assert few.df == pytest.approx(0.25**2 / (0.09**2 / 1 + 0.16**2 / 9))
    assert math.isinf(stats.pool([Estimate(1.0, 0.1, 5), Estimate(2.0, 0.1, 5, 4.0)]).df)


def test_pool_of_cells_on_shared_units_takes_the_smallest_df_and_the_largest_cell():
    # 4 and 9 df: the interval must be at least as wide as the 4-df cell's t interval.
    shared = stats.pool(
        [Estimate(1.0, 0.3, 10, 9.0), Estimate(2.0, 0.4, 5, 4.0)], shared_units=True
    )
    assert (shared.df, shared.n) == (4.0, 10)
    assert shared.interval(0.95)[1] == pytest.approx(1.5 + scipy_stats.t(4).ppf(0.975) * 0.35)


def test_identical_paired_samples_have_t_zero_and_the_sd_is_se_root_n():
    same = stats.paired_difference([1.0, 2.0, 4.0], [1.0, 2.0, 4.0])
    assert same.t == 0.0 and math.isnan(same.p)
    assert math.isnan(Estimate(0.5, 0.0, 3).t)  # an effect without spread: no t
    assert Estimate(1.0, 0.5, 4).sd == 1.0  # 0.5 sqrt(4)


def test_the_difference_of_two_sample_means_matches_scipy_welch_ttest():
    a, b = [1.0, 2.5, 3.0, 4.5], [0.5, 0.7, 1.9]
    d = stats.independent_difference(stats.sample_estimate(a), stats.sample_estimate(b))
    reference = scipy_stats.ttest_ind(a, b, equal_var=False)
    assert d.df == pytest.approx(reference.df)  # Welch-Satterthwaite, 4.66 (not min df 2)
    assert d.t == pytest.approx(reference.statistic) and d.p == pytest.approx(reference.pvalue)
    low, high = d.interval(0.95)
    assert (low, high) == pytest.approx(tuple(reference.confidence_interval(0.95)))


def test_independent_difference_adds_variances():
    d = stats.independent_difference(Estimate(3.0, 0.3, 100), Estimate(1.0, 0.4, 100))
    assert d.mean == 2.0 and d.se == pytest.approx(0.5) and math.isinf(d.df)


def test_tost_p_is_the_larger_one_sided_p():
    estimate = Estimate(0.1, 0.2, 1000)  # normal reference
    lower = scipy_stats.norm.sf(3.0)  # (0.1 + 0.5) / 0.2
    upper = scipy_stats.norm.cdf(-2.0)  # (0.1 - 0.5) / 0.2
    assert stats.tost_p(estimate, 0.5) == pytest.approx(max(lower, upper))
    with pytest.raises(ValueError, match="margin"):
        stats.tost_p(estimate, 0.0)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_tost_p_of_a_sample_mean_is_scipys_larger_one_sided_t_test_p(sign):
    # Either side may decide: the mean near +margin, then near -margin (t reference, 4 df).
    x = sign * np.array([0.3, 0.1, 0.45, 0.2, 0.35])
    margin = 0.5
    lower = scipy_stats.ttest_1samp(x, -margin, alternative="greater").pvalue
    upper = scipy_stats.ttest_1samp(x, margin, alternative="less").pvalue
    assert stats.tost_p(stats.sample_estimate(x), margin) == pytest.approx(max(lower, upper))


def test_units_to_resolve_scales_the_observed_spread():
    estimate = Estimate(1.0, 0.8, 10)
    expected = math.ceil(10 * (1.959963984540054 * 0.8 / 1.0) ** 2)  # 24.6 -> 25
    assert stats.units_to_resolve(estimate, 0.0, 0.95) == expected == 25
    # Resolved already: the size from which it would be, at most n (here 10 * 0.0196^2 -> 1).
    assert stats.units_to_resolve(Estimate(1.0, 0.01, 10), 0.0, 0.95) == 1
    # Just resolved (z se = 0.99999): n itself.
    assert stats.units_to_resolve(Estimate(1.0, 0.51021, 10), 0.0, 0.95) == 10
    # Resolved now by a t interval (9 df): at N units its quantile has N - 1 df, so N = 5
    # (2.776 x 0.2 sqrt(10 / 5) = 0.785 < 1), where 4 give 3.182 x 0.2 sqrt(10 / 4) = 1.006 and
    # 3 still straddle 0 (the quantile at 10 units said 3).
    resolved = Estimate(1.0, 0.2, 10, 9.0)
    assert stats.units_to_resolve(resolved, 0.0, 0.95) == 5
    # Fewer units than df + 1 leave no t quantile of their own: one unit is no interval; 2
    # units (1 df) give 12.71 x 0.1 sqrt(5) = 2.84, 3 give 4.303 x 0.1 sqrt(10 / 3) = 0.786.
    assert stats.units_to_resolve(Estimate(1.0, 0.1, 10, 9.0), 0.0, 0.95) == 3
    for units in (4, 5):
        half = scipy_stats.t(units - 1).ppf(0.975) * 0.2 * math.sqrt(10 / units)
        assert (half < 1.0) == (units == 5)
    # A mean of samples: its t interval, whose quantile falls as the units grow. [0.7, 1.3]:
    # at the observed spread (sd 0.424) 3 units give 1.0 +- 4.303 x 0.245, still across 0
    # (the normal count said 3); 4 give 1.0 +- 3.182 x 0.212 = [0.325, 1.675].
    pair = stats.sample_estimate([0.7, 1.3])
    assert stats.units_to_resolve(pair, 0.0, 0.95) == 4
    for units in (3, 4):
        sd = pair.se * math.sqrt(2)
        low = 1.0 - scipy_stats.t(units - 1).ppf(0.975) * sd / math.sqrt(units)
        assert (low > 0) == (units == 4)


def test_power_sizes_the_t_test_and_equivalence_the_textbook_normal_formula():
    # Detecting half an SD with 80% power at 5% two-sided: 31.4 -> 32 units by the normal
    # formula, 34 by the t test's noncentral t (power 0.808 at 34, 0.795 at 33).
    assert stats.units_for_power(1.0, 0.5) == 34
    for units, above in ((33, False), (34, True)):
        critical = scipy_stats.t.ppf(0.975, units - 1)
        power = scipy_stats.nct(units - 1, 0.5 * math.sqrt(units)).sf(critical)
        assert (power >= 0.8) == above
    # performer_vit's sd 0.0029 at an effect of 0.005: 5 seeds (the normal formula said 3).
    assert stats.units_for_power(0.0029, 0.005) == 5
    # 1.25 SD: 8 units, by the t test's own df n - 1 (power 0.786 at 7, 0.856 at 8; the
    # critical value at df n said 7).
    assert stats.units_for_power(1.0, 1.25) == 8
    for units, above in ((7, False), (8, True)):
        critical = scipy_stats.t.ppf(0.975, units - 1)
        power = scipy_stats.nct(units - 1, 1.25 * math.sqrt(units)).sf(critical)
        assert (power >= 0.8) == above
    # TOST at 5%, 80% power at a true difference of 0: the normal approximation
    # ((1.645 + 1.282) / 0.5)^2 = 34.3 said 35, at which the t tests' power is 0.790; 36.
    assert stats.units_for_equivalence(1.0, 0.5) == 36
    assert stats.tost_power(35, 1.0, 0.5) < 0.8 <= stats.tost_power(36, 1.0, 0.5)
    # sd = margin / 2: the approximation's 3 units have power 0.56; 4 reach 0.83.
    assert stats.units_for_equivalence(1.0, 2.0) == 4
    assert stats.units_for_equivalence(0.0, 2.0) == 0
    d = Estimate(0.0, 0.1, 30, 29.0)
    t = scipy_stats.t(29)
    assert stats.detectable_difference(d) == pytest.approx((t.ppf(0.975) + t.ppf(0.8)) * 0.1)


def test_holm_and_bonferroni():
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert stats.bonferroni_z(10) == pytest.approx(scipy_stats.norm.isf(0.0025))


def test_ratio_estimators_with_hand_derived_delta_method_ses():
    a, b = np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 1.0, 2.0, 2.0])
    ratio = stats.ratio_of_means(a, b)
    # residuals a - (5/3) b = (-2/3, 1/3, -1/3, 2/3): sd sqrt(10/27), se sd / (2 * 1.5)
    assert ratio.mean == pytest.approx(5 / 3)
    assert ratio.se == pytest.approx(math.sqrt(10 / 27) / 3)
    log_ratio = stats.log_ratio_of_means(a, b)
    # cov / n: var a 5/12, var b 1/12, cov 1/6; delta method for ln(mean a / mean b)
    variance = (5 / 12) / 2.5**2 + (1 / 12) / 1.5**2 - 2 * (1 / 6) / (2.5 * 1.5)
    assert log_ratio.mean == pytest.approx(math.log(2.5 / 1.5))
    assert log_ratio.se == pytest.approx(math.sqrt(variance))
    per_unit = stats.mean_log_ratio(a, b)
    assert per_unit.mean == pytest.approx(np.mean(np.log(a / b)))


def test_chunked_mean_se_equals_the_mean_se_of_the_stacked_draws():
    draw = jax.jit(jax.vmap(lambda key: jax.random.normal(key, (3,)) + jnp.arange(3.0)))
    key = jax.random.key(0)
    stacked = stats.draw_in_chunks(draw, key, 50, 16, "test")
    assert stacked.shape == (50, 3)
    mean, se = stats.chunked_mean_se(draw, key, 50, 16, "test")
    reference_mean, reference_se = stats.mean_se(stacked)
    np.testing.assert_allclose(mean, reference_mean, rtol=1e-12)
    np.testing.assert_allclose(se, reference_se, rtol=1e-9)
    with pytest.raises(ValueError, match="num_draws"):
        stats.draw_in_chunks(draw, key, 0, 16, "test")


def test_every_chunk_draws_from_its_own_keys():
    # Chunk 2 (draws 16-31) uses split(fold_in(key, 16), 16): no chunk repeats another's draws,
    # which would shrink the SE of the mean by as much as the number of chunks.
    draw = jax.jit(jax.vmap(lambda key: jax.random.normal(key, (2,))))
    key = jax.random.key(0)
    stacked = stats.draw_in_chunks(draw, key, 40, 16, "test")
    assert len(np.unique(stacked[:, 0])) == 40
    second = np.asarray(draw(jax.random.split(jax.random.fold_in(key, 16), 16)), np.float64)
    np.testing.assert_array_equal(stacked[16:32], second)


@pytest.mark.parametrize(("sd", "margin"), [(1.0, 0.3), (1.0, 1.0), (2.0, 1.5)])
def test_tost_power_is_the_share_of_samples_tost_p_shows_equivalent(sd, margin):
    # TOST at 5% over the returned number of pairs (97, 11 and 17 here),
    # true difference 0: the share shown equivalent by tost_p is tost_power, at least 80%; one
    # pair fewer falls short of 80%.
    n = stats.units_for_equivalence(sd, margin)
    assert stats.tost_power(n - 1, sd, margin) < 0.8 <= stats.tost_power(n, sd, margin)
    draws = 2000
    differences = np.random.default_rng(0).normal(0.0, sd, size=(draws, n))
    shown = [stats.tost_p(stats.sample_estimate(d), margin) < 0.05 for d in differences]
    power = stats.tost_power(n, sd, margin)
    se = math.sqrt(power * (1 - power) / draws)
    assert abs(np.mean(shown) - power) <= 4 * se, (np.mean(shown), power)


def test_bootstrap_se_of_the_interquartile_range_matches_its_asymptotic_se():
    # Normal draws: Var(IQR) = 0.25 / (n phi(z_0.75)^2), SE = 1.5733 / sqrt(n). Over 20 samples
    # of 4000 the bootstrap SE / this had mean 1.008 and sd 0.065: 4 sd of tolerance.
    draws = np.random.default_rng(7).normal(size=4000)
    assert stats.interquartile_range(draws) == pytest.approx(1.349, abs=0.05)
    se = stats.bootstrap_se(draws, stats.interquartile_range, resamples=500, seed=1)
    assert se / (1.5733 / np.sqrt(4000)) == pytest.approx(1.0, abs=0.26)
    again = stats.bootstrap_se(draws, stats.interquartile_range, resamples=500, seed=1)
    assert again == se  # seeded
    with pytest.raises(ValueError, match="resamples >= 2"):
        stats.bootstrap_se(draws[:1], np.mean)
