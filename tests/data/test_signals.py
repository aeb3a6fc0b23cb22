"""scenario=signals: waveform sources, one A* for all sites, each site its own time points; some noisy or short."""

import numpy as np
import pytest
from scipy.stats import kurtosis

from fedica.config import ConfigError, validate_config
from fedica.data.scenarios import ica_poor_sites, ica_scenario_data, ica_scenario_truth
from fedica.data.signals import (
    DURATION,
    signal_sources,
    signals_client_data,
    signals_roles,
    signals_site,
    signals_true_mixing,
)

SIGNALS = {"name": "signals", "n_clients": 10, "r": 4, "n_samples": 2000, "n_noisy": 2, "noise_level": 1.0,
           "n_short": 2, "short_samples": 40, "orthogonal": True}
PARAMS = {key: value for key, value in SIGNALS.items() if key != "name"}


def test_sources_are_standardised_and_of_both_kurtosis_signs():
    S = signal_sources(np.linspace(0, DURATION, 200_001), r=4, seed=0)
    assert S.shape == (4, 200_001)
    np.testing.assert_allclose(S.mean(axis=1), 0, atol=0.05)  # whole periods would give 0
    np.testing.assert_allclose(S.std(axis=1), 1, atol=0.05)
    excess = kurtosis(S, axis=1)
    assert np.all(excess[:3] < -1) and excess[3] > 5  # sine, square, sawtooth sub-Gaussian; spikes super-Gaussian
    # Over the span the sources are nearly uncorrelated (so A* is what ICA can recover).
    assert np.abs(np.corrcoef(S)[np.triu_indices(4, 1)]).max() < 0.05
    # Repeated shapes for r > 4 are other signals (other frequencies).
    S8 = signal_sources(np.linspace(0, DURATION, 20_001), r=8, seed=0)
    assert np.abs(np.corrcoef(S8)[np.triu_indices(8, 1)]).max() < 0.2


def test_sites_share_a_star_and_sources_but_not_time_points():
    a, b = signals_site(0, **PARAMS, seed=3), signals_site(1, **PARAMS, seed=3)
    assert not np.array_equal(a.times, b.times)
    assert np.all(np.diff(a.times) >= 0) and a.times.min() >= 0 and a.times.max() <= DURATION
    np.testing.assert_allclose(signal_sources(a.times, r=4, seed=3), a.sources)
    A = signals_true_mixing(r=4, orthogonal=True, seed=3)
    np.testing.assert_allclose(A.T @ A, np.eye(4), atol=1e-12)
    noisy, _ = signals_roles(n_clients=10, n_noisy=2, n_short=2, seed=3)
    for g in np.flatnonzero(~noisy):
        site = signals_site(int(g), **PARAMS, seed=3)
        np.testing.assert_allclose(site.observations, A @ site.sources, atol=1e-12)


def test_roles_noisy_and_short_sites():
    noisy, short = signals_roles(n_clients=10, n_noisy=2, n_short=3, seed=1)
    assert noisy.sum() == 2 and short.sum() == 3 and not np.any(noisy & short)
    sizes = [signals_client_data(g, **{**PARAMS, "n_short": 3}, seed=1).shape for g in range(10)]
    assert [s[1] for s in sizes] == [40 if short[g] else 2000 for g in range(10)]
    assert all(s[0] == 4 for s in sizes)
    g = int(np.flatnonzero(noisy)[0])
    site = signals_site(g, **PARAMS, seed=1)
    residual = site.observations - signals_true_mixing(r=4, orthogonal=True, seed=1) @ site.sources
    assert residual.std() == pytest.approx(1.0, rel=0.05)
    with pytest.raises(ValueError, match="n_noisy \\+ n_short must be <= n_clients"):
        signals_roles(n_clients=3, n_noisy=2, n_short=2, seed=0)


def test_deterministic_and_built_alone():
    first = signals_client_data(4, **PARAMS, seed=9)
    np.testing.assert_array_equal(first, signals_client_data(4, **PARAMS, seed=9))
    assert not np.array_equal(first, signals_client_data(4, **PARAMS, seed=10))


def test_dispatch_truth_and_poor_sites():
    Y = ica_scenario_data(SIGNALS, 2, 5)
    np.testing.assert_array_equal(Y, signals_client_data(2, **PARAMS, seed=5))
    Y[:] = 0  # a copy: the cache is not touched
    assert np.any(ica_scenario_data(SIGNALS, 2, 5))
    np.testing.assert_array_equal(ica_scenario_truth(SIGNALS, 5), signals_true_mixing(r=4, orthogonal=True, seed=5))
    noisy, short = signals_roles(n_clients=10, n_noisy=2, n_short=2, seed=5)
    assert ica_poor_sites(SIGNALS, 5) == {"noisy": np.flatnonzero(noisy).tolist(),
                                          "short": np.flatnonzero(short).tolist()}
    with pytest.raises(ValueError, match="unknown keys"):
        ica_scenario_data({**SIGNALS, "sparsity": 0.1}, 0, 0)


def test_config():
    from fedica.server.app import compose_config

    cfg = validate_config(compose_config(["scenario=signals"]))
    assert cfg["scenario"] == SIGNALS
    for overrides, key in [
        (["scenario.n_noisy=6", "scenario.n_short=5"], "scenario.n_short"),
        (["scenario.short_samples=4"], "scenario.short_samples"),
        (["scenario.n_samples=3"], "scenario.n_samples"),
        (["scenario.noise_level=-1"], "scenario.noise_level"),
        (["scenario.r=1"], "scenario.r"),
    ]:
        with pytest.raises(ConfigError, match=rf"^{key}="):
            validate_config(compose_config(["scenario=signals", *overrides]))
    with pytest.raises(ConfigError, match="does not fit algorithm=fedgem"):
        validate_config(compose_config(["algorithm=fedgem", "scenario=signals"]))
