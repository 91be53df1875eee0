"""Length and popularity specs: presets match real statistics, kinds respect their bounds,
bad input fails with one line naming the field."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsbench.config import ConfigError, WorkloadConfig
from fsbench.workloads.distributions import (
    LENGTH_PRESETS,
    HistogramLength,
    LogNormalLength,
    parse_length_spec,
)
from fsbench.workloads.popularity import ZipfPopularity, parse_popularity_spec

BIG = 10**7  # max_len large enough that clipping never bites


@pytest.mark.parametrize("name", sorted(LENGTH_PRESETS))
def test_preset_sampled_median_and_p90_within_10_percent_of_target(name):
    preset = LENGTH_PRESETS[name]
    x = parse_length_spec(name).sample(np.random.default_rng(1234), 200_000, BIG)
    assert np.median(x) == pytest.approx(preset.median, rel=0.10)
    assert np.quantile(x, 0.9) == pytest.approx(preset.p90, rel=0.10)


def test_presets_describe_their_fit_targets_and_source():
    for preset in LENGTH_PRESETS.values():
        text = preset.describe()
        assert preset.distribution.describe() in text and preset.source in text
        assert f"median {preset.median:g}" in text and f"p90 {preset.p90:g}" in text


def test_5core_presets_never_go_below_5_and_otto_stays_in_2_to_500():
    rng = np.random.default_rng(0)
    for name in ("amazon-beauty", "yelp"):
        assert parse_length_spec(name).sample(rng, 50_000, BIG).min() == 5
    otto = parse_length_spec("otto-sessions").sample(rng, 200_000, BIG)
    assert otto.min() == 2 and otto.max() == 500


@pytest.mark.parametrize("spec,lo,hi", [
    ("fixed:7", 7, 7),
    ("uniform:3-9", 3, 9),
    ("lognormal:mu=2,sigma=1", 1, BIG),
    ("lognormal:mu=2,sigma=1,shift=10", 10, BIG),
    ("lognormal:mu=2,sigma=1,min=4,max=12", 4, 12),
    ("lognormal:mu=2,sigma=1,min=4,max=12,mode=clip", 4, 12),
    ("lognormal:mu=0.683,sigma=1.232,shift=4,min=5", 5, BIG),
    ("powerlaw:alpha=2.5,xmin=6", 6, BIG),
])
def test_parametric_kind_parses_and_respects_its_bounds(spec, lo, hi):
    x = parse_length_spec(spec).sample(np.random.default_rng(0), 20_000, BIG)
    assert x.dtype == np.int64 and len(x) == 20_000
    assert lo <= x.min() and x.max() <= hi
    if lo == hi:
        assert (x == lo).all()
    if spec.startswith("uniform"):
        assert set(np.unique(x)) == set(range(lo, hi + 1))


def _std_normal_cdf(z):
    return 0.5 * math.erfc(-z / math.sqrt(2))


def test_lognormal_truncate_conditions_on_bounds_while_clip_piles_mass_on_them():
    rng = np.random.default_rng(0)
    trunc = parse_length_spec("lognormal:mu=2,sigma=1,min=4,max=12").sample(rng, 200_000, BIG)
    clip = parse_length_spec("lognormal:mu=2,sigma=1,min=4,max=12,mode=clip").sample(
        rng, 200_000, BIG)

    def cdf(v):  # P(LogNormal(2, 1) < v)
        return _std_normal_cdf(math.log(v) - 2)

    inside = cdf(12.5) - cdf(3.5)
    for v in (4, 8, 12):
        assert (trunc == v).mean() == pytest.approx((cdf(v + 0.5) - cdf(v - 0.5)) / inside,
                                                    abs=0.005)
    assert (clip == 4).mean() == pytest.approx(cdf(4.5), abs=0.005)
    assert (clip == 12).mean() == pytest.approx(1 - cdf(11.5), abs=0.005)
    assert (clip == 8).mean() == pytest.approx(cdf(8.5) - cdf(7.5), abs=0.005)


def test_truncation_far_in_the_upper_tail_still_samples_inside_bounds():
    x = parse_length_spec("lognormal:mu=0,sigma=0.5,min=20,max=30").sample(
        np.random.default_rng(0), 1000, BIG)
    assert 20 <= x.min() and x.max() <= 30


def test_powerlaw_tail_exponent_is_alpha():
    x = parse_length_spec("powerlaw:alpha=2.5,xmin=10").sample(
        np.random.default_rng(0), 400_000, BIG)
    # Approximate maximum-likelihood estimate for a discrete power law (Clauset et al.).
    alpha_hat = 1 + len(x) / np.log(x / (10 - 0.5)).sum()
    assert alpha_hat == pytest.approx(2.5, abs=0.05)


@pytest.mark.parametrize("spec", ["fixed:500", "uniform:1-1000", "kuairand-1k",
                                  "lognormal:mu=5,sigma=2", "powerlaw:alpha=1.1,xmin=1"])
def test_samples_are_clipped_to_max_len(spec):
    x = parse_length_spec(spec).sample(np.random.default_rng(0), 10_000, 50)
    assert x.max() == 50 and x.min() >= 1


@settings(max_examples=60, deadline=None)
@given(mu=st.floats(-3, 12), sigma=st.floats(0.01, 4), shift=st.floats(-5, 50),
       max_len=st.integers(1, 5000), seed=st.integers(0, 2**32))
def test_any_lognormal_stays_in_1_to_max_len(mu, sigma, shift, max_len, seed):
    dist = LogNormalLength(mu=mu, sigma=sigma, shift=shift)
    x = dist.sample(np.random.default_rng(seed), 500, max_len)
    assert x.dtype == np.int64 and x.min() >= 1 and x.max() <= max_len


def test_hist_spec_reproduces_the_csv_frequencies(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("length_bin,count\n3,50\n10,30\n40,20\n99,0\n")
    x = parse_length_spec(f"hist:{path}").sample(np.random.default_rng(0), 100_000, BIG)
    values, counts = np.unique(x, return_counts=True)
    assert values.tolist() == [3, 10, 40]
    np.testing.assert_allclose(counts / len(x), [0.5, 0.3, 0.2], atol=0.01)


def test_hist_file_is_cached_by_path_and_reread_after_an_edit(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("length_bin,count\n3,1\n")
    first = parse_length_spec(f"hist:{path}")
    assert parse_length_spec(f"hist:{path}") is first
    path.write_text("length_bin,count\n4,1\n7,1\n")
    second = parse_length_spec(f"hist:{path}")
    assert isinstance(second, HistogramLength) and second.bins.tolist() == [4, 7]


@pytest.mark.parametrize("spec", [
    "no-such-preset", "fixed:0", "fixed:x", "uniform:9-3", "uniform:5", "gamma:k=2",
    "lognormal:mu=1", "lognormal:mu=1,sigma=0", "lognormal:mu=1,sigma=1,mode=wrap",
    "lognormal:mu=1,sigma=1,min=9,max=3", "lognormal:mu=1,sigma=1,foo=2",
    "lognormal:mu=nan,sigma=1", "lognormal:mu=0,sigma=0.1,min=100000",
    "powerlaw:alpha=1,xmin=5", "powerlaw:alpha=2", "hist:",
])
def test_bad_length_spec_raises_one_line_config_error_naming_the_field(spec):
    with pytest.raises(ConfigError) as err:
        parse_length_spec(spec)
    msg = str(err.value)
    assert msg.startswith(f"lengths={spec!r}") and "\n" not in msg
    assert "amazon-beauty" in msg and "lognormal:" in msg and "hist:PATH" in msg


@pytest.mark.parametrize("content,why", [
    ("length,n\n3,1\n", "header"),
    ("length_bin,count\n3,one\n", "line 2"),
    ("length_bin,count\n3,1,2\n", "line 2"),
    ("length_bin,count\n0,5\n", "line 2"),
    ("length_bin,count\n3,0\n", "positive"),
    ("", "header"),
])
def test_malformed_hist_csv_raises_config_error_naming_path_and_why(tmp_path, content, why):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(ConfigError) as err:
        parse_length_spec(f"hist:{path}")
    msg = str(err.value)
    assert msg.startswith("lengths=") and str(path) in msg and why in msg and "\n" not in msg


def test_missing_hist_csv_raises_config_error_naming_path(tmp_path):
    path = tmp_path / "absent.csv"
    with pytest.raises(ConfigError, match="lengths=.*absent.csv.*No such file"):
        parse_length_spec(f"hist:{path}")


def test_workload_config_rejects_bad_length_and_popularity_specs():
    with pytest.raises(ConfigError, match="^lengths="):
        WorkloadConfig(name="t", lengths="fixed:-1")
    with pytest.raises(ConfigError, match="^popularity="):
        WorkloadConfig(name="t", popularity="zipf:0")


# ---------------------------------------------------------------------------
# Zipf popularity

@pytest.mark.parametrize("vocab", [2, 3, 1000, 65_538, 1_000_003, 10**8])
def test_zipf_ids_stay_in_1_to_vocab_minus_1(vocab):
    ids = ZipfPopularity(0.8).sample(np.random.default_rng(0), 50_000, vocab)
    assert ids.dtype == np.int64 and ids.min() >= 1 and ids.max() <= vocab - 1


@pytest.mark.parametrize("s", [0.7, 1.0, 1.4])
def test_zipf_top_rank_frequencies_are_proportional_to_k_power_minus_s(s):
    vocab = 200_000
    zipf = ZipfPopularity(s)
    ids = zipf.sample(np.random.default_rng(0), 1_000_000, vocab)
    top = zipf.id_of_rank(np.arange(1, 6), vocab)
    freq = np.array([(ids == i).sum() for i in top], dtype=float)
    np.testing.assert_allclose(freq / freq[0], np.arange(1, 6) ** -s, rtol=0.08)


def test_zipf_mass_beyond_the_exact_table_matches_the_exact_pmf():
    """Ranks past the exactly tabulated head come from a continuous approximation."""
    vocab, s = 300_001, 1.0
    ranks = ZipfPopularity(s).sample_ranks(np.random.default_rng(0), 1_000_000, vocab)
    pmf = np.arange(1, vocab, dtype=float) ** -s
    pmf /= pmf.sum()
    for lo, hi in [(1, 1000), (1001, 65_536), (65_537, 150_000), (150_001, vocab - 1)]:
        assert ((ranks >= lo) & (ranks <= hi)).mean() == pytest.approx(
            pmf[lo - 1:hi].sum(), abs=0.002)


@pytest.mark.parametrize("vocab", [2, 11, 1000, 4096, 999_983])
def test_zipf_rank_to_id_is_a_bijection(vocab):
    ids = ZipfPopularity(1.0).id_of_rank(np.arange(1, vocab), vocab)
    assert sorted(ids.tolist()) == list(range(1, vocab))


def test_zipf_hot_items_are_spread_over_the_id_space():
    vocab, shards = 1_000_001, 8
    top = ZipfPopularity(1.0).id_of_rank(np.arange(1, 9), vocab)
    assert len(set((top - 1) * shards // (vocab - 1))) >= 6  # not all in the first shard


@pytest.mark.parametrize("spec", ["zipf:0", "zipf:-1", "zipf:abc", "zipf:", "zipf",
                                  "uniform", "zipf:inf"])
def test_bad_popularity_spec_raises_one_line_config_error_naming_the_field(spec):
    with pytest.raises(ConfigError) as err:
        parse_popularity_spec(spec)
    msg = str(err.value)
    assert msg.startswith(f"popularity={spec!r}") and "zipf:S" in msg and "\n" not in msg


def test_popularity_spec_parses_the_exponent():
    assert parse_popularity_spec("zipf:1.25") == ZipfPopularity(1.25)


def test_powerlaw_scale_and_shift_turn_items_into_tokens():
    """powerlaw:..,scale=2,shift=3: each drawn item count X becomes 2 X + 3 tokens (an
    action after every item, 3 contextual tokens), clipped at max_len like any length."""
    from fsbench.workloads.distributions import parse_length_spec

    items = parse_length_spec("powerlaw:alpha=1.2,xmin=1").sample(np.random.default_rng(5), 10_000, 4096)
    tokens = parse_length_spec("powerlaw:alpha=1.2,xmin=1,scale=2,shift=3").sample(
        np.random.default_rng(5), 10_000, 2 * 4096 + 3)
    assert np.array_equal(tokens, 2 * items + 3)
    with pytest.raises(ConfigError, match="shift=-1 must be >= 0"):
        parse_length_spec("powerlaw:alpha=1.2,xmin=1,shift=-1")
