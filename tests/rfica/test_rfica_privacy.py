"""fedica.rfica.privacy: the Gaussian mechanism of RF-ICA's one release, per site (docs/ALGORITHMS.md section 1.9)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dp_accounting import GaussianDpEvent, rdp
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import fedica
import fedica.conf
from fedica.config import ConfigError, validate_config
from fedica.data.common import ClientData
from fedica.privacy import SECRET_NOISE, SEEDED_NOISE
from fedica.protocol import RFICA_FIT, ArraySite
from fedica.protocol.messages import RFICA_COVARIANCE
from fedica.protocol.tasks import ClientTasks
from fedica.results import format_summary
from fedica.rfica import estimator as rfica_estimator
from fedica.rfica.privacy import (
    canonical_columns,
    private_mixing,
    private_mixing_reply,
    release_sensitivity,
    rfica_plan,
)
from fedica.tasks import CLIENT_TASKS

R = 3


def ica_sites(n_sites=8, n_samples=2000, seed=0):
    """Sites observing the same orthogonal mixing of Laplace sources (rows: samples), and that mixing."""
    rng = np.random.default_rng(seed)
    mixing = np.linalg.qr(rng.standard_normal((R, R)))[0]
    return [rng.laplace(size=(n_samples, R)) @ mixing.T for _ in range(n_sites)], mixing


def array_site(X, partition_id=3, noise_secret=None):
    return ArraySite(ClientData(X, None, X[:0], None, 1), partition_id, noise_secret=noise_secret)


def fit_request(noise=0.5, seed=0, label="1"):
    return {"contrast": "cube", "init": "random", "seed": 0, "solver": "fastica", "dp-noise": noise, "dp-clip": 1.0,
            "dp-seed": seed, "server-round": label}


# ---------------------------------------------------------------- the mechanism


def test_the_plan_is_one_gaussian_mechanism_whose_epsilon_is_dp_accountings():
    plan = rfica_plan(2.0, 1e-5)
    accountant = rdp.RdpAccountant()
    accountant.compose(GaussianDpEvent(plan.noise_multiplier))
    record = plan.record()
    assert record["epsilon"] == accountant.get_epsilon(1e-5)
    assert record["epsilon"] == pytest.approx(2.0, abs=1e-4)
    assert [(e["exchange"], e["mechanisms"]) for e in record["exchanges"]] == [("mixing", 1)]
    assert record["unit"] == "client" and record["clip"] == 1.0
    assert rfica_plan(None, 1e-5) is None
    # A larger budget is less noise.
    assert rfica_plan(8.0, 1e-5).noise_multiplier < plan.noise_multiplier


def test_columns_are_unit_and_canonically_signed_before_the_noise():
    rng = np.random.default_rng(1)
    mixing = rng.standard_normal((5, 4))
    unit = canonical_columns(mixing)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=0), 1.0)
    largest = unit[np.argmax(np.abs(unit), axis=0), np.arange(4)]
    assert np.all(largest > 0)
    # Any scale and sign of a column gives the same release with the same noise: the noise sees unit columns.
    rescaled = mixing * np.array([1e6, -3.0, 1e-150, -1e200])
    np.testing.assert_allclose(canonical_columns(rescaled), unit, rtol=0, atol=1e-14)
    released = private_mixing(rescaled, 0.7, np.random.default_rng(5))
    np.testing.assert_allclose(released, unit + 0.7 * release_sensitivity(4) * np.random.default_rng(5).standard_normal(
        (5, 4)), rtol=0, atol=1e-13)


def test_the_sensitivity_bounds_every_pair_of_releases():
    rng = np.random.default_rng(2)
    worst = max(np.linalg.norm(canonical_columns(rng.standard_normal((6, 4))) - canonical_columns(
        rng.standard_normal((6, 4)))) for _ in range(2000))
    assert worst <= release_sensitivity(4) == pytest.approx(4.0)
    # Opposite columns before the canonical sign are the same release after it.
    one = rng.standard_normal((6, 4))
    assert np.linalg.norm(canonical_columns(one) - canonical_columns(-one)) == 0


def test_the_noise_has_the_mechanisms_variance():
    mixing = canonical_columns(np.random.default_rng(3).standard_normal((5, 5)))
    rng = np.random.default_rng(4)
    noise = np.stack([private_mixing(mixing, 0.3, rng) - mixing for _ in range(4000)])
    expected = (0.3 * release_sensitivity(5)) ** 2
    # 100,000 entries: the sample variance is within 2% of the true one (about 4.5 standard errors).
    assert noise.var() == pytest.approx(expected, rel=0.02)
    assert abs(noise.mean()) < 0.02 * np.sqrt(expected)


# ---------------------------------------------------------------- the site's reply


def test_the_private_reply_is_noisy_seeded_and_declares_nothing_of_the_data():
    sites, _ = ica_sites(1)
    site = array_site(sites[0])
    plain_request = {k: v for k, v in fit_request().items() if not k.startswith("dp-")}
    plain = CLIENT_TASKS.answer(RFICA_FIT, site, {}, plain_request)
    first = CLIENT_TASKS.answer(RFICA_FIT, site, {}, fit_request(seed=0))
    again = CLIENT_TASKS.answer(RFICA_FIT, site, {}, fit_request(seed=0))
    other = CLIENT_TASKS.answer(RFICA_FIT, site, {}, fit_request(seed=1))
    np.testing.assert_array_equal(first[0]["mixing"], again[0]["mixing"])
    assert not np.allclose(first[0]["mixing"], other[0]["mixing"])
    assert not np.allclose(first[0]["mixing"], canonical_columns(plain[0]["mixing"]))
    assert set(first[1]) == {"n-samples", "fit-seconds"} and first[1]["n-samples"] == 1
    assert "n-iter" in plain[1] and plain[1]["n-samples"] == sites[0].shape[0]


def test_the_sites_reply_carries_the_noise_the_request_names():
    sites, _ = ica_sites(1)
    site = array_site(sites[0])
    plain_request = {k: v for k, v in fit_request().items() if not k.startswith("dp-")}
    unit = canonical_columns(CLIENT_TASKS.answer(RFICA_FIT, site, {}, plain_request)[0]["mixing"])
    noise = np.stack([CLIENT_TASKS.answer(RFICA_FIT, site, {}, fit_request(noise=0.2, seed=seed))[0]["mixing"] - unit
                      for seed in range(100)])
    # 900 entries: the sample variance is within 20% of (0.2 * 2 sqrt(3))^2 (about 4 standard errors).
    assert noise.var() == pytest.approx((0.2 * release_sensitivity(R)) ** 2, rel=0.2)


def test_a_request_without_dp_noise_passes_through_untouched():
    sites, _ = ica_sites(1)
    site = array_site(sites[0])
    request = {k: v for k, v in fit_request().items() if not k.startswith("dp-")}
    reply = CLIENT_TASKS.handlers[RFICA_FIT](site, {}, request)
    assert private_mixing_reply(RFICA_FIT, site, {}, request, reply) is reply


def test_a_private_covariance_request_is_refused():
    sites, _ = ica_sites(1)
    with pytest.raises(ValueError, match="releases no covariance"):
        CLIENT_TASKS.answer(RFICA_COVARIANCE, array_site(sites[0]), {}, fit_request())


def test_a_site_with_its_own_secret_draws_noise_the_server_cannot_regenerate():
    sites, _ = ica_sites(1)
    seeded = CLIENT_TASKS.answer(RFICA_FIT, array_site(sites[0]), {}, fit_request(seed=0))[0]["mixing"]
    secret = [CLIENT_TASKS.answer(RFICA_FIT, array_site(sites[0], noise_secret=1234), {}, fit_request(seed=seed))[0]
              ["mixing"] for seed in (0, 1)]
    # Nothing the server sends enters the secret site's noise: another run seed, the same release.
    np.testing.assert_array_equal(secret[0], secret[1])
    assert not np.allclose(secret[0], seeded)


def test_a_deployed_flower_site_draws_its_noise_from_its_node_config_secret(monkeypatch):
    from flwr.app import Context, RecordDict

    from fedica.clients.app import LOCAL_ENGINE_VARIABLE, ArraySource, FlowerSite

    sites, _ = ica_sites(1)
    monkeypatch.delenv(LOCAL_ENGINE_VARIABLE, raising=False)

    def flower_site(node_config):
        context = Context(run_id=1, node_id=1, node_config={"partition-id": 3, **node_config}, state=RecordDict(),
                          run_config={})
        return FlowerSite(ArraySource(lambda context: sites[0], None, 10), 3, context, {})

    releases = [CLIENT_TASKS.answer(RFICA_FIT, flower_site({"dp-noise-seed": 7}), {}, fit_request(seed=seed))[0]
                ["mixing"] for seed in (0, 1)]
    np.testing.assert_array_equal(releases[0], releases[1])
    expected = CLIENT_TASKS.answer(RFICA_FIT, array_site(sites[0], noise_secret=7), {}, fit_request())[0]["mixing"]
    np.testing.assert_array_equal(releases[0], expected)
    # Without a node config seed: fresh OS entropy, kept for the site (the same request repeats its noise).
    site = flower_site({})
    first, repeated = (CLIENT_TASKS.answer(RFICA_FIT, site, {}, fit_request())[0]["mixing"] for _ in range(2))
    np.testing.assert_array_equal(first, repeated)
    assert not np.allclose(first, CLIENT_TASKS.answer(RFICA_FIT, flower_site({}), {}, fit_request())[0]["mixing"])


# ---------------------------------------------------------------- the estimator, the strategy, the config


def test_a_fit_without_dp_epsilon_is_the_fit_without_the_privacy_transform(monkeypatch):
    sites, _ = ica_sites()
    with_chain = fedica.RFICA().fit(sites)
    monkeypatch.setattr(rfica_estimator, "SITE_TASKS", ClientTasks(rfica_estimator.SITE_TASKS.handlers, ()))
    without = fedica.RFICA().fit(sites)
    for name in ("mixing_", "f_ica_", "simple_mean_", "simple_median_", "site_mixings_", "labels_"):
        np.testing.assert_array_equal(getattr(with_chain, name), getattr(without, name))
    assert with_chain.privacy_ is None


def test_a_private_fit_records_what_it_spent_and_pays_in_error():
    sites, truth = ica_sites()
    plain = fedica.RFICA().fit(sites)
    private = fedica.RFICA(dp_epsilon=1.0, refine_rounds=0).fit(sites)
    assert private.privacy_["epsilon"] == pytest.approx(1.0, abs=1e-4)
    assert private.privacy_["noise"] == SEEDED_NOISE
    assert private.site_converged_ is None  # the sites do not say
    # The sites' releases are noisy (far from unit columns); the server aggregates their directions alone.
    assert np.abs(np.linalg.norm(private.site_mixings_, axis=1) - 1).max() > 1
    again = fedica.RFICA().aggregate(private.site_mixings_)
    scaled = fedica.RFICA().aggregate(private.site_mixings_ * np.array([7.0, 1e-3, 20.0]))
    np.testing.assert_allclose(again.mixing_, private.mixing_, atol=1e-12)
    np.testing.assert_allclose(scaled.mixing_, private.mixing_, atol=1e-12)
    from fedica.evaluation.ica import ica_error
    assert ica_error(plain.mixing_, truth) < 0.1 < ica_error(private.mixing_, truth)


@pytest.mark.parametrize("parameters, line", [
    (dict(n_components=2), r"^whitening=None: a private run releases the mixing alone: take 'local'"),
    (dict(n_components=2, whitening="federated"), r"^whitening='federated': a private run"),
    (dict(benchmark="largest"), r"^benchmark='largest': a private run does not release the sites' sizes"),
    (dict(n_components=0.9, whitening="local"), r"^n_components=0.9: a private run needs a count or null"),
])
def test_what_the_release_cannot_cover_is_refused_in_one_line(parameters, line):
    from fedica.server import RFICAStrategy

    sites, _ = ica_sites(3, 200)
    with pytest.raises(ValueError, match=line):
        fedica.RFICA(dp_epsilon=1.0, **parameters).fit(sites)
    with pytest.raises(ValueError, match=line):
        RFICAStrategy(dp_epsilon=1.0, **parameters)
    fedica.RFICA(dp_epsilon=1.0, n_components=2, whitening="local", refine_rounds=0).fit(sites)  # one release: covered


def test_aggregate_refuses_dp_epsilon():
    with pytest.raises(ValueError, match=r"^dp_epsilon=1.0: aggregate\(\) takes estimates the sites already"):
        fedica.RFICA(dp_epsilon=1.0).aggregate(np.stack([np.eye(R)] * 3))


def test_the_config_refuses_the_federated_whitening_of_a_private_run():
    with initialize_config_dir(config_dir=str(Path(fedica.conf.__file__).parent), version_base=None):
        cfg = compose(config_name="config", overrides=["algorithm=rfica", "algorithm.dp_epsilon=1.0",
                                                       "algorithm.n_components=3"])
    with pytest.raises(ConfigError, match=r"algorithm.whitening=None: a private run releases the mixing alone"):
        validate_config(OmegaConf.to_container(cfg, resolve=True))


def test_the_strategy_says_whose_seed_the_noise_came_from(monkeypatch):
    from fedica.clients.app import LOCAL_ENGINE_VARIABLE
    from fedica.rfica.coordinator import RFICAState
    from fedica.server import RFICAStrategy

    strategy = RFICAStrategy(dp_epsilon=4.0, refine_rounds=0)
    assert strategy.privacy_ is None  # no run yet
    strategy.state = RFICAState(dp_epsilon=4.0, privacy=rfica_plan(4.0, 1e-5))
    monkeypatch.delenv(LOCAL_ENGINE_VARIABLE, raising=False)
    assert strategy.privacy_["noise"] == SECRET_NOISE
    line = format_summary({"algorithm": "rfica", "privacy": strategy.privacy_})
    assert "privacy: epsilon 4, delta 1e-05 per client (rdp accountant" in line
    assert "noise secret at each site); per exchange: mixing 4" in line


@pytest.mark.slow
def test_a_private_fedica_run_records_its_privacy_in_the_result_and_the_summary(tmp_path):
    command = [sys.executable, "-m", "fedica", "algorithm=rfica_paper", "scenario=ica_paper", "engine=inprocess",
               "scenario.n_clients=6", "scenario.r=3", "scenario.n_normal=500", "scenario.n_corrupt=100",
               "algorithm.dp_epsilon=2", f"hydra.run.dir={tmp_path}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["privacy"]["epsilon"] == pytest.approx(2.0, abs=1e-4)
    assert result["privacy"]["unit"] == "client"
    assert result["rfica"]["n_samples"] == [1] * 6
    assert "privacy: epsilon 2, delta 1e-05 per client" in (tmp_path / "summary.txt").read_text()
    assert fedica.RFICA.from_result(tmp_path / "result.json").privacy_ == result["privacy"]
