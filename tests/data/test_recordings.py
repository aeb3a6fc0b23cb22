"""scenario=recordings: EEG-like sources, an A* of prescribed condition number, poor sites known to the harness."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import kurtosis

import fedica

from fedica.config import ConfigError, validate_config
from fedica.data.recordings import (
    SATURATION_LEVEL,
    mixing_with_condition,
    recordings_client_data,
    recordings_roles,
    recordings_site,
    recordings_true_mixing,
    source_kinds,
)
from fedica.data.scenarios import ica_poor_sites, ica_scenario_data, ica_scenario_truth
from fedica.server.app import compose_config

RECORDINGS = {"name": "recordings", "n_clients": 6, "n_channels": 8, "n_sources": 4, "sampling_rate": 250.0,
              "min_samples": 1000, "max_samples": 5000, "condition_number": 10.0, "sensor_noise": 0.02,
              "n_noisy": 1, "noise_level": 3.0, "dead_channel": True, "saturated_channel": True,
              "line_frequency": 50, "strength_spread": 1.0}
PARAMS = {key: value for key, value in RECORDINGS.items() if key != "name"}


@pytest.mark.parametrize("p, r, kappa", [(4, 4, 5.0), (8, 4, 9.5), (16, 8, 50.0), (64, 20, 50.0), (5, 3, 1.0)])
def test_mixing_has_unit_columns_and_the_asked_condition_number(p, r, kappa):
    A = mixing_with_condition(p, r, kappa, np.random.default_rng(7))
    assert A.shape == (p, r)
    np.testing.assert_allclose(np.linalg.norm(A, axis=0), 1.0, rtol=1e-12)
    assert np.linalg.cond(A) == pytest.approx(kappa, rel=0.01)
    with pytest.raises(ValueError, match="condition_number"):
        mixing_with_condition(p, r, 0.5, np.random.default_rng(0))


def test_sources_are_of_the_eeg_kinds_and_standardised():
    assert source_kinds(7) == ("alpha", "blink", "muscle", "line", "heavy", "alpha", "blink")
    site = recordings_site(0, **{**PARAMS, "n_channels": 8, "n_sources": 8, "min_samples": 5000}, seed=0)
    S = site.sources
    np.testing.assert_allclose(S.mean(axis=1), 0, atol=1e-10)
    np.testing.assert_allclose(S.std(axis=1), 1, rtol=1e-10)
    excess = kurtosis(S, axis=1)
    assert excess[3] == pytest.approx(-1.5, abs=0.05)  # the line sinusoid is sub-Gaussian
    assert excess[1] > 2 and excess[2] > 5 and excess[4] > 1  # blinks, muscle bursts, heavy noise: super-Gaussian
    assert kurtosis(S[1]) > 0 and np.median(S[1]) < 0  # blinks are one-sided: rare large positive bumps
    # The line source sits at 50 Hz, the alpha source between 8 and 12 Hz.
    frequencies = np.fft.rfftfreq(S.shape[1], 1 / 250.0)
    assert frequencies[np.argmax(np.abs(np.fft.rfft(S[3])))] == pytest.approx(50.0, abs=0.1)
    assert 8 <= frequencies[np.argmax(np.abs(np.fft.rfft(S[0])))] <= 12


def test_shapes_sizes_and_clean_sites_are_the_mixture_plus_sensor_noise():
    roles = recordings_roles(n_clients=6, n_noisy=1, dead_channel=True, saturated_channel=True, seed=2)
    A = recordings_true_mixing(n_channels=8, n_sources=4, condition_number=10.0, seed=2)
    assert A.shape == (8, 4) and np.linalg.cond(A) == pytest.approx(10.0, rel=0.01)
    for g in range(6):
        site = recordings_site(g, **PARAMS, seed=2)
        assert site.observations.shape == (8, site.sources.shape[1]) and site.sources.shape[0] == 4
        assert 1000 <= site.sources.shape[1] <= 5000
        if not any(mask[g] for mask in roles.values()):
            clean = A @ site.sources
            residual = site.observations - clean
            np.testing.assert_allclose(residual.std(axis=1) / clean.std(axis=1), 0.02, rtol=0.1)
    # Fewer sources than channels: rank n_sources plus the sensor noise, whose singular values lie well below
    # the smallest of the mixture's (which cond(A*) = 10 puts at about a tenth of the largest).
    g = int(np.flatnonzero(~roles["noisy"] & ~roles["dead_channel"] & ~roles["saturated_channel"])[0])
    singular = np.linalg.svd(recordings_client_data(g, **PARAMS, seed=2), compute_uv=False)
    assert singular[4] < 0.25 * singular[3]


def test_poor_sites_noisy_dead_and_saturated():
    roles = recordings_roles(n_clients=6, n_noisy=1, dead_channel=True, saturated_channel=True, seed=4)
    assert [int(mask.sum()) for mask in roles.values()] == [1, 1, 1]
    assert not np.any(roles["noisy"] & roles["dead_channel"]) and not np.any(roles["dead_channel"] & roles["saturated_channel"])
    A = recordings_true_mixing(n_channels=8, n_sources=4, condition_number=10.0, seed=4)
    noisy = recordings_site(int(np.flatnonzero(roles["noisy"])[0]), **PARAMS, seed=4)
    clean = A @ noisy.sources
    ratio = (noisy.observations - clean).std(axis=1) / clean.std(axis=1)
    np.testing.assert_allclose(ratio, np.hypot(3.0, 0.02), rtol=0.1)
    dead = recordings_client_data(int(np.flatnonzero(roles["dead_channel"])[0]), **PARAMS, seed=4)
    assert np.sum(np.all(dead == 0, axis=1)) == 1 and np.all(dead.std(axis=1)[np.any(dead != 0, axis=1)] > 0)
    saturated = recordings_client_data(int(np.flatnonzero(roles["saturated_channel"])[0]), **PARAMS, seed=4)
    at_rail = np.mean(np.abs(saturated) >= np.abs(saturated).max(axis=1, keepdims=True) - 1e-12, axis=1)
    assert np.sum(at_rail > 0.1) == 1  # one channel spends a share of its samples at its rail
    assert SATURATION_LEVEL == 1.0
    with pytest.raises(ValueError, match="a site is poor in one way only"):
        recordings_roles(n_clients=2, n_noisy=1, dead_channel=True, saturated_channel=True, seed=0)


def test_bit_identical_for_a_seed_and_built_alone():
    first = recordings_client_data(3, **PARAMS, seed=9)
    np.testing.assert_array_equal(first, recordings_client_data(3, **PARAMS, seed=9))
    assert not np.array_equal(first, recordings_client_data(3, **PARAMS, seed=10))
    # Built after the other sites, in another order, the site is the same.
    for g in (5, 0, 1):
        recordings_client_data(g, **PARAMS, seed=9)
    np.testing.assert_array_equal(first, recordings_client_data(3, **PARAMS, seed=9))


def test_dispatch_truth_and_poor_sites():
    Y = ica_scenario_data(RECORDINGS, 2, 5)
    np.testing.assert_array_equal(Y, recordings_client_data(2, **PARAMS, seed=5))
    np.testing.assert_array_equal(ica_scenario_truth(RECORDINGS, 5),
                                  recordings_true_mixing(n_channels=8, n_sources=4, condition_number=10.0, seed=5))
    roles = recordings_roles(n_clients=6, n_noisy=1, dead_channel=True, saturated_channel=True, seed=5)
    assert ica_poor_sites(RECORDINGS, 5) == {kind: np.flatnonzero(mask).tolist() for kind, mask in roles.items()}


def _validate(*overrides):
    return validate_config(compose_config(["algorithm=rfica", "scenario=recordings", *overrides]))


def test_config_rules_and_memory_refusal(monkeypatch):
    _validate()
    with pytest.raises(ConfigError, match=r"^scenario\.n_sources=9: must be <= 8"):
        _validate("scenario.n_channels=8", "scenario.n_sources=9")
    with pytest.raises(ConfigError, match=r"^scenario\.line_frequency=55: must be one of 50, 60"):
        _validate("scenario.line_frequency=55")
    with pytest.raises(ConfigError, match=r"^scenario\.sampling_rate=100\.0: must be > 100"):
        _validate("scenario.sampling_rate=100.0")
    with pytest.raises(ConfigError, match=r"^scenario\.n_noisy=6: .*a site is poor in one way only"):
        _validate("scenario.n_noisy=6", "scenario.dead_channel=true")
    with pytest.raises(ConfigError, match=r"^scenario\.condition_number=0\.5: must be >= 1"):
        _validate("scenario.condition_number=0.5")
    with pytest.raises(ConfigError, match=r"scenario=recordings does not fit algorithm=fedgem"):
        validate_config(compose_config(["algorithm=fedgem", "scenario=recordings"]))
    # 64 channels x 50,000 samples x 100 sites is 2.4 GiB: refused up front on a machine of 4 GiB.
    big = ["scenario.n_clients=100", "scenario.n_channels=64", "scenario.n_sources=20",
           "scenario.min_samples=1000", "scenario.max_samples=50000"]
    _validate(*big)  # this machine holds it
    monkeypatch.setattr("fedica.config.scenario._physical_memory", lambda: 4.0 * 2**30)
    with pytest.raises(ConfigError, match=r"^scenario\.max_samples=50000: the scenario's data would take 2\.4 GiB"):
        _validate(*big)


@pytest.mark.slow
def test_fedica_run_end_to_end_writes_truth_and_poor_sites(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run(
        [str(Path(sys.executable).with_name("fedica-run")), "engine=inprocess", "scenario=recordings",
         "scenario.n_clients=4", "scenario.max_samples=1500", "scenario.saturated_channel=true",
         f"hydra.run.dir={out}"],
        # The fedica under test, wherever the run starts (outside its checkout another may be installed).
        env={**os.environ, "PYTHONPATH": str(Path(fedica.__file__).parents[1])},
        capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads((out / "result.json").read_text())
    assert np.isfinite(result["metrics"]["rf-ica"]["error"])
    truth = np.asarray(result["rfica"]["true_mixing"])
    assert truth.shape == (4, 4) and np.linalg.cond(truth) == pytest.approx(10.0, rel=0.01)
    poor = result["rfica"]["poor_sites"]
    assert set(poor) == {"noisy", "dead_channel", "saturated_channel"}
    assert len(poor["noisy"]) == 1 and len(poor["saturated_channel"]) == 1 and poor["dead_channel"] == []
    assert result["rfica"]["corrupted_clients"] == sorted(poor["noisy"] + poor["saturated_channel"])


def test_the_recordings_benchmark_scores_every_method_and_skips_what_fedica_cannot_run():
    pytest.importorskip("picard")
    from fedica.scripts.bench_recordings import run_one, summarise

    scenario = {**RECORDINGS, "n_channels": 4, "n_sources": 4, "n_clients": 4, "max_samples": 1500,
                "dead_channel": False}
    run = run_one(scenario, 0)
    assert run["poor_sites"] == sorted(ica_poor_sites(scenario, 0)["noisy"] + ica_poor_sites(scenario, 0)["saturated_channel"])
    for key in ("rfica/all", "rfica/clean", "fastica/all", "fastica/clean", "picard/all", "picard/clean"):
        assert run[key]["error"] >= 0 and 0 <= run[key]["amari"] <= 1, key
    assert run["fastica/clean"]["amari"] < 0.05  # the pooled clean sites separate well
    # Fewer sources than channels: RF-ICA runs if the installed fedica takes n_components, else it is skipped.
    wide = run_one({**scenario, "n_channels": 6}, 0)
    assert "error" in wide["rfica/all"] or "skipped" in wide["rfica/all"]
    assert "error" in wide["fastica/all"] and "error" in wide["picard/all"]
    summary = summarise([wide])
    assert set(summary["fastica/all"]) >= {"median_error", "median_amari"}


def test_unequal_strengths_scale_each_source_per_site_and_leave_a_spread_of_one_as_it_was():
    from fedica.data.recordings import recordings_site

    params = dict(n_clients=4, n_channels=4, n_sources=4, n_noisy=0, seed=3)
    for g in range(4):
        plain = recordings_site(g, **params)
        np.testing.assert_array_equal(recordings_site(g, **params, strength_spread=1.0).observations, plain.observations)
        unequal = recordings_site(g, **params, strength_spread=10.0)
        strengths = unequal.sources.std(axis=1) / plain.sources.std(axis=1)
        assert np.all((strengths >= 0.1) & (strengths <= 10.0)) and np.ptp(np.log10(strengths)) > 0.2
        np.testing.assert_allclose(unequal.sources / strengths[:, None], plain.sources, atol=1e-12)
    with pytest.raises(ValueError, match="strength_spread must be a finite number >= 1, got 0.5"):
        recordings_site(0, **params, strength_spread=0.5)
