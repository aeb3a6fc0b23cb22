"""A channel in another unit: RF-ICA compares the sites' columns with each channel divided by its scale.

Before, one channel in millivolts beside microvolts (x 1,000) made every site's unit-norm columns point
along it; the server refused every estimate as degenerate (near-parallel columns) and the run stopped.
"""

import warnings

import numpy as np
import pytest

from fedica import RFICA
from fedica.data.scenarios import SCENARIOS, ica_scenario_data
from fedica.evaluation.ica import ica_error
from fedica.rfica.aggregation import (
    CHANNEL_SCALE_SPREAD_LIMIT, SMALLEST_CHANNEL_SCALE_LIMIT, channel_scale_spread, channel_scales,
)

RECORDINGS = dict(name="recordings", n_clients=6, n_channels=4, n_sources=4, sampling_rate=250.0, min_samples=2000,
                  max_samples=5000, condition_number=9.5, n_noisy=1, noise_level=3.0, sensor_noise=0.05,
                  dead_channel=False, saturated_channel=False, line_frequency=50)
SCALE_WARNING = "the channels' scales differ"


def _unit_columns(matrix):
    return matrix / np.linalg.norm(matrix, axis=0)


def _estimates(seed=0, sites=6, channels=5, components=3):
    rng = np.random.default_rng(seed)
    return np.stack([_unit_columns(rng.normal(size=(channels, components))) for _ in range(sites)])


def test_the_balanced_scales_follow_a_channel_s_unit_and_ignore_a_minority():
    estimates = _estimates()
    base = channel_scales(estimates)
    assert np.median(base) == pytest.approx(1.0)
    for c in (1e-3, 30.0, 1e3):
        scaled = estimates.copy()
        scaled[:, 0] *= c
        scaled /= np.linalg.norm(scaled, axis=1, keepdims=True)  # the sites send unit-norm columns
        scales = channel_scales(scaled)
        np.testing.assert_allclose(scales / scales[1], np.r_[c, 1.0, 1.0, 1.0, 1.0] * base / base[1], rtol=1e-6)
    # Two hostile sites of six claim a channel a million times the others': the median ignores them.
    hostile = estimates.copy()
    hostile[:2, 0] *= 1e6
    hostile[:2] /= np.linalg.norm(hostile[:2], axis=1, keepdims=True)
    assert channel_scale_spread(channel_scales(hostile)) < CHANNEL_SCALE_SPREAD_LIMIT
    # A channel flat at every site (dead) keeps a scale near the median channel's: dividing by it amplifies nothing.
    dead = estimates.copy()
    dead[:, 2] = 0.0
    assert 0.5 < channel_scales(dead)[2] < 2.0


@pytest.mark.parametrize("seed", [0, 2])
def test_a_channel_in_another_unit_changes_nothing_and_says_so(seed):
    sites = [ica_scenario_data(RECORDINGS, g, seed).T for g in range(RECORDINGS["n_clients"])]
    truth = _unit_columns(SCENARIOS["recordings"].true_mixing(RECORDINGS, seed))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*" + SCALE_WARNING)
        own = RFICA(random_state=0).fit(sites)
    assert own.channel_scale_spread_ < CHANNEL_SCALE_SPREAD_LIMIT
    for c in (30.0, 1000.0):  # before, both stopped the run: every site (or all but one) refused as degenerate
        units = np.ones(RECORDINGS["n_channels"])
        units[0] = c
        with pytest.warns(UserWarning, match=SCALE_WARNING):
            other = RFICA(random_state=0).fit([X * units for X in sites])
        assert other.channel_scale_spread_ > CHANNEL_SCALE_SPREAD_LIMIT
        back = _unit_columns(other.mixing_ / units[:, None])  # the estimate in the first unit
        assert ica_error(back, truth) == pytest.approx(ica_error(own.mixing_, truth), abs=2e-3)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_channel_in_far_smaller_units_changes_nothing_and_says_so(seed):
    # Before, channel 0 times 1e-6 gave an error of 1.2-1.6 without a word: every site whitened as if its data were
    # singular, and the spread (the largest scale over the median) did not see a small channel.
    sites = [ica_scenario_data(RECORDINGS, g, seed).T for g in range(RECORDINGS["n_clients"])]
    truth = _unit_columns(SCENARIOS["recordings"].true_mixing(RECORDINGS, seed))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*a channel's scale is")
        own = RFICA(random_state=0).fit(sites)
    assert own.smallest_channel_scale_ > SMALLEST_CHANNEL_SCALE_LIMIT
    for c in (1e-3, 1e-6):
        units = np.ones(RECORDINGS["n_channels"])
        units[0] = c
        with pytest.warns(UserWarning, match="a channel's scale is .* far smaller units"):
            other = RFICA(random_state=0).fit([X * units for X in sites])
        assert other.smallest_channel_scale_ < SMALLEST_CHANNEL_SCALE_LIMIT
        assert other.channel_scale_spread_ < CHANNEL_SCALE_SPREAD_LIMIT  # the largest over the median misses it
        back = _unit_columns(other.mixing_ / units[:, None])
        assert ica_error(back, truth) == pytest.approx(ica_error(own.mixing_, truth), abs=2e-3)
