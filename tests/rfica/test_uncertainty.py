"""How well a site sees each source (fedica.rfica.uncertainty, docs/ALGORITHMS.md section 1.13)."""

import warnings

import numpy as np
import pytest

import fedica
from fedica.data.scenarios import ica_scenario_data, ica_scenario_truth
from fedica.evaluation.ica import ica_error
from fedica.protocol import InvalidReply
from fedica.protocol.messages import MAX_COLUMN_VARIANCE, validate_column_variances
from fedica.rfica.aggregation import rf_ica_aggregate
from fedica.rfica.local import local_ica, normalize_columns
from fedica.rfica.uncertainty import MIN_COLUMN_WEIGHT, column_weights


def _angle_squared(estimate, truth):
    """Squared angle between each true column and the estimate's column nearest it (unit columns, any sign)."""
    cosines = np.abs(normalize_columns(estimate).T @ truth)
    return np.arccos(np.clip(cosines.max(axis=0), -1.0, 1.0)) ** 2


def test_a_columns_variance_is_the_spread_of_its_direction_over_repeated_samples():
    # Two Laplace sources of unequal strength, mixed non-orthogonally: the predicted variance of each column's direction
    # against the mean squared angle over 60 independent sites of 2,000 samples.
    mixing = normalize_columns(np.array([[1.0, 0.6], [0.2, 1.0]]))
    strengths = np.array([1.0, 0.2])
    predicted, observed = [], []
    for seed in range(60):
        rng = np.random.default_rng(seed)
        Y = mixing @ (strengths[:, None] * rng.laplace(size=(2, 2000)))
        fit = local_ica(Y, solver="picard", contrast="logcosh", random_state=seed)
        order = np.argmax(np.abs(fit.mixing.T @ mixing), axis=0)
        predicted.append(fit.column_variances[order])
        observed.append(_angle_squared(fit.mixing, mixing))
    ratio = np.mean(observed, axis=0) / np.mean(predicted, axis=0)
    assert np.all((ratio > 0.5) & (ratio < 2.0)), ratio
    # The faint source's column turns more: the loud one leaks into it.
    assert np.mean(predicted, axis=0)[1] > 5 * np.mean(predicted, axis=0)[0]


def test_a_source_a_site_cannot_see_has_the_largest_variance_and_the_least_weight():
    rng = np.random.default_rng(0)
    mixing = normalize_columns(rng.standard_normal((6, 3)))
    sources = rng.laplace(size=(3, 4000)) * np.array([[3.0], [2.0], [0.002]])  # the third under the sensor noise
    Y = mixing @ sources + 0.02 * rng.standard_normal((6, 4000))
    fit = local_ica(Y, solver="picard", contrast="logcosh", n_components=3, random_state=0)
    weights = column_weights(fit.column_variances)
    seen = np.flatnonzero(np.abs(fit.mixing.T @ mixing[:, :2]).max(axis=1) > 0.999)
    assert seen.size == 2
    blind = np.setdiff1d(np.arange(3), seen)[0]
    assert fit.column_variances[blind] > 100 * fit.column_variances[seen].max()
    assert weights[blind] == MIN_COLUMN_WEIGHT and np.all(weights[seen] == 1.0)


def test_weights_never_exceed_one_whatever_a_site_claims():
    assert column_weights([1e-300, 1e-2, 1e-1, MAX_COLUMN_VARIANCE, np.nan]).tolist() == [1.0, 1.0, 0.1, 0.1, 0.1]
    # A site that claims to see every source perfectly weighs as an ordinary site that sees them well.
    estimates = np.stack([np.eye(3)] * 5)
    weighted = rf_ica_aggregate(estimates, np.ones(5), clustering="matched", center="trimmed_mean",
                                column_weights=np.ones((5, 3)))
    plain = rf_ica_aggregate(estimates, np.ones(5), clustering="matched", center="trimmed_mean")
    np.testing.assert_allclose(weighted.rf_ica, plain.rf_ica, atol=1e-12)


def test_a_source_two_sites_of_six_see_is_taken_from_them():
    """Issue 45's trial: a source loud at two sites and under the noise at four (16 channels, 4 sources, seed 3).

    Without the sites' variances the one-shot centre of its cluster is a mean of the four sites' noise columns (error
    .68 over the estimate); weighted by them it is the two sites' column.
    """
    scenario = {"name": "recordings", "n_clients": 6, "n_channels": 16, "n_sources": 4, "min_samples": 1000,
                "max_samples": 5000, "sampling_rate": 250.0, "condition_number": 10.0, "sensor_noise": 0.02,
                "noise_level": 3.0, "line_frequency": 50, "n_noisy": 0, "dead_channel": False,
                "saturated_channel": False, "strength_spread": 10.0}
    truth = ica_scenario_truth(scenario, 3)
    sites = [ica_scenario_data(scenario, g, 3).T for g in range(6)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        model = fedica.RFICA(n_components=4, refine_rounds=0, random_state=3).fit(sites)
        unweighted = fedica.RFICA(n_components=4, random_state=3).aggregate(model.site_mixings_)
    assert model.site_column_variances_.shape == (6, 4)
    assert ica_error(unweighted.mixing_, truth) > 0.5
    assert ica_error(model.mixing_, truth) < 0.1


@pytest.mark.parametrize(("variances", "reason"), [
    (np.array([1e-3, np.nan, 1e-3]), "NaN where the mixing has a column"),
    (np.array([1e-3, 0.0, 1e-3]), "must lie in"),
    (np.array([1e-3, 5.0, 1e-3]), "must lie in"),
    (np.array([1e-3, 1e-3]), "shape"),
])
def test_a_reply_s_variances_are_checked_with_their_reason(variances, reason):
    with pytest.raises(InvalidReply, match=reason):
        validate_column_variances({"column-variances": variances}, np.eye(3))


def test_a_site_that_sends_no_variances_counts_once_in_every_column():
    assert validate_column_variances({}, np.eye(3)) is None
