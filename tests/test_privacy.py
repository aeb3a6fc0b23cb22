"""fedica.privacy: the Gaussian mechanism of FedGEM's private replies, its accountant and the server's use of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import fedica
import fedica.conf
from fedica.config import ConfigError, validate_config
from fedica.data.common import ClientData
from fedica.fedgem import estimator as fedgem_estimator
from fedica.fedgem.coordinator import FedGEMServer, FedGEMSettings
from fedica.fedgem.privacy import (
    clip_rows,
    fedgem_plan,
    noise_variance,
    private_criterion,
    private_reply,
    private_step,
    widened_radii,
)
from fedica.privacy import PrivacyPlan
from fedica.protocol import GEM_INIT, GEM_LIKELIHOOD, GEM_ROUND, ArraySite
from fedica.protocol.tasks import ClientTasks
from fedica.results import format_summary
from fedica.tasks import CLIENT_TASKS


def blob_sites(n_sites=4, n_points=300, seed=0):
    """Sites of two well-separated clusters in d=2, each site holding both."""
    rng = np.random.default_rng(seed)
    centres = np.array([[-4.0, 0.0], [4.0, 0.0]])
    return [centres[rng.integers(2, size=n_points)] + rng.standard_normal((n_points, 2)) for _ in range(n_sites)]


def round_request(sigma=2.0, clip=5.0, seed=0, label="1"):
    return {"covariance-type": "identity", "local-steps": 1, "dp-noise": sigma, "dp-clip": clip, "dp-seed": seed,
            "server-round": label}


def site_with_centroids(X, centroids):
    site = ArraySite(ClientData(X, None, X[:0], None, centroids.shape[0]), 3)
    site.state["centroids"] = centroids
    return site


CENTROIDS = np.array([[-4.0, 0.0], [4.0, 0.0]])


def test_noise_is_added_and_its_stream_is_the_seed():
    X = blob_sites(1)[0]
    reply = lambda seed: CLIENT_TASKS.answer(GEM_ROUND, site_with_centroids(X, CENTROIDS),
                                             {"centroids": CENTROIDS}, round_request(seed=seed))
    first, again, other = reply(0), reply(0), reply(1)
    np.testing.assert_array_equal(first[0]["maximisers"], again[0]["maximisers"])
    assert not np.allclose(first[0]["maximisers"], other[0]["maximisers"])
    honest = CLIENT_TASKS.with_transforms().handlers[GEM_ROUND](site_with_centroids(X, CENTROIDS),
                                                                {"centroids": CENTROIDS}, round_request())
    assert not np.allclose(first[0]["maximisers"], honest[0]["maximisers"])
    assert set(first[0]) == {"maximisers", "radii", "dp-counts"}


def test_the_noise_has_the_mechanisms_variance():
    X = blob_sites(1, n_points=400)[0]
    sigma, clip = 1.5, 3.0
    gamma_free = private_step(X, CENTROIDS, 1e-12, clip, np.random.default_rng(0))
    true_sums, true_counts = gamma_free[0] * gamma_free[1][:, None], gamma_free[1]
    draws = [private_step(X, CENTROIDS, sigma, clip, np.random.default_rng(s)) for s in range(2000)]
    sum_noise = np.stack([m * c[:, None] for m, c in draws]) - true_sums
    count_noise = np.stack([c for _, c in draws]) - true_counts
    # 8000 sum draws and 4000 count draws: the variance's relative standard error is about 1.6% and 2.2%.
    assert np.var(sum_noise) == pytest.approx((sigma * clip) ** 2, rel=0.08)
    assert np.var(count_noise) == pytest.approx(sigma ** 2, rel=0.10)
    assert abs(np.mean(sum_noise)) < 0.1 * sigma * clip


def test_points_are_clipped_to_the_bound():
    rng = np.random.default_rng(1)
    X = 50.0 * rng.standard_normal((200, 3))
    clipped = clip_rows(X, 2.0)
    assert np.linalg.norm(clipped, axis=1).max() <= 2.0 + 1e-12
    inside = np.linalg.norm(X, axis=1) <= 2.0
    np.testing.assert_array_equal(clipped[inside], X[inside])
    # Nearly noiseless, a one-component step returns the mean of the clipped points: inside the ball.
    maximisers, _ = private_step(X, np.zeros((1, 3)), 1e-12, 2.0, rng)
    np.testing.assert_allclose(maximisers[0], clipped.mean(axis=0), atol=1e-9)
    assert np.linalg.norm(maximisers[0]) <= 2.0


def test_the_accountant_is_dp_accountings_for_the_same_mechanisms():
    exchanges = [("init", 2), ("round 1", 2), ("round 2", 2), ("final", 2)]
    plan = PrivacyPlan.calibrated(1.0, 1e-5, 4.0, "record", exchanges)
    accountant = rdp.RdpAccountant()
    for _, n in exchanges:  # one by one, as the sites release them
        for _ in range(n):
            accountant.compose(dp_accounting.GaussianDpEvent(plan.noise_multiplier))
    record = plan.record()
    assert record["epsilon"] == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-9)
    assert record["epsilon"] == pytest.approx(1.0, abs=1e-4)
    assert [e["exchange"] for e in record["exchanges"]] == ["init", "round 1", "round 2", "final"]
    single = rdp.RdpAccountant()
    single.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(plan.noise_multiplier), 2))
    assert record["exchanges"][0]["epsilon"] == pytest.approx(single.get_epsilon(1e-5), rel=1e-9)
    assert record["exchanges"][-1]["cumulative_epsilon"] == pytest.approx(record["epsilon"], rel=1e-9)
    # More releases at the same budget need more noise.
    longer = PrivacyPlan.calibrated(1.0, 1e-5, 4.0, "record", exchanges + [("round 3", 2)])
    assert longer.noise_multiplier > plan.noise_multiplier


@pytest.mark.parametrize("change, message", [
    ({"dp_clip": None}, "dp_clip=None"),
    ({"covariance_type": "spherical"}, "covariance_type='spherical'"),
    ({"local_steps": 2}, "local_steps=2"),
    ({"upsilon_criterion": "silhouette"}, "upsilon_criterion='silhouette'"),
    ({"standardize": "federated"}, "standardize='federated'"),
])
def test_a_private_plan_refuses_what_it_does_not_cover_in_one_line(change, message):
    settings = FedGEMSettings(**{"dp_epsilon": 1.0, "dp_clip": 5.0, "covariance_type": "identity", "standardize": None,
                                 **change})
    with pytest.raises(ValueError, match=message) as caught:
        fedgem_plan(settings)
    assert "\n" not in str(caught.value)


def test_no_plan_and_untouched_replies_without_dp_epsilon():
    assert fedgem_plan(FedGEMSettings()) is None
    X = blob_sites(1)[0]
    request = {"covariance-type": "identity", "local-steps": 1, "server-round": "1"}
    reply = CLIENT_TASKS.handlers[GEM_ROUND](site_with_centroids(X, CENTROIDS), {"centroids": CENTROIDS}, request)
    assert private_reply(GEM_ROUND, site_with_centroids(X, CENTROIDS), {"centroids": CENTROIDS}, request, reply) is reply


def test_a_fit_without_dp_epsilon_is_the_fit_without_the_privacy_transform(monkeypatch):
    sites = blob_sites()
    with_chain = fedica.FedGEM(covariance_type="identity", rounds=3).fit(sites, 2)
    monkeypatch.setattr(fedgem_estimator, "SITE_TASKS", ClientTasks(fedgem_estimator.SITE_TASKS.handlers, ()))
    without = fedica.FedGEM(covariance_type="identity", rounds=3).fit(sites, 2)
    np.testing.assert_array_equal(with_chain.means_, without.means_)
    assert with_chain.history_ == without.history_
    assert with_chain.privacy_ is None


def test_a_private_fit_records_what_it_spent_and_finds_the_clusters():
    sites = blob_sites(n_sites=6, n_points=2000)
    model = fedica.FedGEM(covariance_type="identity", standardize=None, rounds=3, dp_epsilon=4.0, dp_clip=6.0).fit(sites, 2)
    assert model.privacy_["epsilon"] == pytest.approx(4.0, abs=1e-3)
    assert model.privacy_["delta"] == 1e-5
    assert [e["exchange"] for e in model.privacy_["exchanges"]] == ["init", "round 1", "round 2", "round 3", "final"]
    assert model.tuning_["criterion"] == "private-bic"
    assert model.n_clusters_ == 2
    np.testing.assert_allclose(np.sort(model.means_[:, 0]), [-4.0, 4.0], atol=0.5)
    # Another seed draws other noise.
    other = fedica.FedGEM(covariance_type="identity", standardize=None, rounds=3, dp_epsilon=4.0, dp_clip=6.0, random_state=1).fit(sites, 2)
    assert not np.allclose(np.sort(other.means_, axis=0), np.sort(model.means_, axis=0))


def test_a_private_fit_needs_each_sites_k():
    with pytest.raises(ValueError, match="n_local_clusters=None"):
        fedica.FedGEM(covariance_type="identity", standardize=None, dp_epsilon=1.0, dp_clip=5.0).fit(blob_sites())


def test_a_private_site_refuses_the_tuning_replies_and_sends_no_raw_point():
    X = blob_sites(1)[0]
    site = site_with_centroids(X, CENTROIDS)
    with pytest.raises(ValueError, match="no private reply"):
        private_reply(GEM_LIKELIHOOD, site, {}, round_request(), ({}, {}))
    values = {**round_request(sigma=50.0, label="init"), "n-init": 1, "seed": 0}
    arrays, reply_values = CLIENT_TASKS.answer(GEM_INIT, site, {}, values)
    # No seed is a data point (k-means++ seeds are), and the declared size is noisy.
    assert np.min(np.linalg.norm(arrays["centroids"][:, None] - X[None], axis=2)) > 0
    assert reply_values["n-points"] != X.shape[0]
    after = CLIENT_TASKS.answer(GEM_ROUND, site, {"centroids": CENTROIDS}, round_request())
    assert after[1]["n-points"] == reply_values["n-points"]


def test_the_server_widens_balls_by_the_noise():
    maximisers = np.array([[1.0, 0.0], [0.0, 2.0]])
    counts = np.array([100.0, 50.0])
    v = noise_variance(maximisers, counts, 2.0, 3.0)
    np.testing.assert_allclose(v, 4.0 * (2 * 9.0 + np.array([1.0, 4.0])) / counts ** 2)
    # A noisy GEM radius below the noise's variance holds no drift of its own: the ball is the noise's.
    np.testing.assert_allclose(widened_radii(v / 2, v, debias=True), v)
    np.testing.assert_allclose(widened_radii(np.array([4.0, 4.0]), v, debias=False), (2.0 + np.sqrt(v)) ** 2)


def test_the_private_criterion_prefers_the_true_partition():
    rng = np.random.default_rng(0)
    truth = np.array([[-4.0, 0.0], [4.0, 0.0]])
    owners = np.repeat([0, 1], 10)
    maximisers = truth[owners] + 0.2 * rng.standard_normal((20, 2))
    counts = np.full(20, 100.0)
    one, two, split = np.zeros(20, int), owners, np.arange(20) % 4
    scores = private_criterion([one, two, split], maximisers, counts, counts.sum())
    assert np.argmin(scores) == 1


def test_the_private_start_finds_the_clusters_when_the_noise_is_small():
    X = blob_sites(1, n_points=2000)[0]
    site = ArraySite(ClientData(X, None, X[:0], None, 2), 0)
    values = {**round_request(sigma=1e-6, clip=6.0, label="init"), "n-init": 1, "seed": 0}
    arrays, reply_values = CLIENT_TASKS.answer(GEM_INIT, site, {}, values)
    np.testing.assert_allclose(np.sort(arrays["centroids"][:, 0]), [-4.0, 4.0], atol=0.3)
    assert reply_values["n-points"] == X.shape[0]
    np.testing.assert_array_equal(site.state["centroids"], arrays["centroids"])


@pytest.mark.parametrize("overrides, message", [
    ({"dp_epsilon": 1.0}, r"^algorithm\.dp_clip=None: a private run needs the norm bound"),
    ({"dp_epsilon": 1.0, "dp_clip": 5.0, "local_steps": 3}, r"^algorithm\.local_steps=3: a private run needs 1"),
    ({"dp_epsilon": 0.0, "dp_clip": 5.0}, r"^algorithm\.dp_epsilon=0\.0: "),
    ({"dp_epsilon": 1.0, "dp_clip": 5.0, "standardize": "federated"},
     r"^algorithm\.standardize='federated': a private run keeps the data's units"),
])
def test_the_config_refuses_a_private_run_it_cannot_make_in_one_line(overrides, message):
    with initialize_config_dir(config_dir=str(fedica.conf.__path__[0]), version_base=None):
        cfg = OmegaConf.to_container(compose(config_name="config", overrides=["algorithm=fedgem_paper"]), resolve=True)
    cfg["algorithm"].update(overrides)
    with pytest.raises(ConfigError, match=message) as caught:
        validate_config(cfg)
    assert "\n" not in str(caught.value)


def test_the_summary_prints_what_a_private_run_spent():
    plan = PrivacyPlan.calibrated(1.0, 1e-5, 6.0, "record", [("init", 2), ("round 1", 2), ("final", 2)])
    text = format_summary({"algorithm": "fedgem", "privacy": plan.record()})
    line = next(line for line in text.splitlines() if line.startswith("privacy:"))
    assert line.startswith("privacy: epsilon 1, delta 1e-05 per record (rdp accountant")
    alone = plan.record()["exchanges"][0]["epsilon"]
    assert 0.3 < alone < 1.0  # each exchange alone spends less than the three together
    assert line.endswith(f"per exchange: init {alone:.3g}, round 1 {alone:.3g}, final {alone:.3g}")
    assert "privacy" not in format_summary({"algorithm": "fedgem"})


def test_the_server_rejects_a_private_reply_without_its_noisy_counts_by_name(monkeypatch):
    def drop_counts(task, site, arrays, values, reply):
        if task == GEM_ROUND and site.partition_id == 0:
            return {k: v for k, v in reply[0].items() if k != "dp-counts"}, reply[1]
        return reply

    monkeypatch.setattr(fedgem_estimator, "SITE_TASKS", fedgem_estimator.SITE_TASKS.with_transforms(drop_counts))
    model = fedica.FedGEM(covariance_type="identity", standardize=None, rounds=2, dp_epsilon=4.0, dp_clip=6.0).fit(blob_sites(), 2)
    reasons = {(r["client"], r["round"]): r["reason"] for r in model.rejected_}
    assert set(reasons) == {(0, 1), (0, 2)}
    assert "'dp-counts' must hold 2 finite counts" in reasons[(0, 1)]


@pytest.mark.slow
def test_a_private_fedica_run_records_its_privacy_in_the_result_and_the_summary(tmp_path):
    command = [sys.executable, "-m", "fedica", "algorithm=fedgem_paper", "engine=inprocess", "baselines=false",
               "algorithm.rounds=2", "algorithm.dp_epsilon=2", "algorithm.dp_clip=8", f"hydra.run.dir={tmp_path}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False,
                          env={**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["privacy"]["epsilon"] == pytest.approx(2.0, abs=1e-3)
    assert [e["exchange"] for e in result["privacy"]["exchanges"]] == ["init", "round 1", "round 2", "final"]
    assert result["fedgem"]["upsilon_tuning"]["criterion"] == "private-bic"
    assert "privacy: epsilon 2, delta 1e-05 per record" in (tmp_path / "summary.txt").read_text()


# ---------------------------------------------------------------- whose seed the noise comes from


def client_app_replies(app, node_config, *requests):
    """The arrays a ClientApp answers FedGEM round requests with, on one SuperNode of ``node_config`` (its context kept)."""
    from fedica.protocol.messages import message_type
    from fedica.server.inprocess import InProcessGrid
    from fedica.server.records import pack, unpack

    grid = InProcessGrid(app, [{"partition-id": 3, **node_config}])
    (node,) = grid.get_node_ids()
    replies = []
    for values in requests:
        message = grid.create_message(pack({"centroids": CENTROIDS}, values), message_type(GEM_ROUND), node, "1")
        (reply,) = grid.send_and_receive([message])
        arrays, reply_values = unpack(reply.content)
        assert "error" not in reply_values, reply_values
        replies.append(arrays)
    return replies


def client_app_reply(app, node_config, values):
    return client_app_replies(app, node_config, values)[0]


def deployed_site_app(monkeypatch, X):
    """A user's ClientApp on ``X``, outside fedica's local engines (as on a SuperNode)."""
    from fedica.clients.app import LOCAL_ENGINE_VARIABLE

    monkeypatch.delenv(LOCAL_ENGINE_VARIABLE, raising=False)
    return fedica.clients.make_client_app(lambda context: X, n_components=2)


def run_seeded_reply(X, values):
    return CLIENT_TASKS.answer(GEM_ROUND, site_with_centroids(X, CENTROIDS), {"centroids": CENTROIDS}, values)[0]


def test_a_deployed_site_draws_its_noise_from_its_own_secret_seed_not_the_runs(monkeypatch):
    X = blob_sites(1)[0]
    app = deployed_site_app(monkeypatch, X)
    first = client_app_reply(app, {"dp-noise-seed": 11}, round_request())
    again = client_app_reply(app, {"dp-noise-seed": 11}, round_request())
    other = client_app_reply(app, {"dp-noise-seed": 12}, round_request())
    np.testing.assert_array_equal(first["maximisers"], again["maximisers"])
    assert not np.allclose(first["maximisers"], other["maximisers"])
    # What the server knows (the run's seed, the stage, the partition) does not give this noise.
    assert not np.allclose(first["maximisers"], run_seeded_reply(X, round_request())["maximisers"])
    # Another run seed leaves a secret-seeded site's noise as it was: the run's seed is not in it.
    np.testing.assert_array_equal(first["maximisers"],
                                  client_app_reply(app, {"dp-noise-seed": 11}, round_request(seed=5))["maximisers"])


def test_a_deployed_site_without_a_seed_draws_fresh_entropy_once_per_site(monkeypatch):
    X = blob_sites(1)[0]
    app = deployed_site_app(monkeypatch, X)
    first, repeated = client_app_replies(app, {}, round_request(), round_request())
    fresh = client_app_reply(app, {}, round_request())
    assert not np.allclose(first["maximisers"], fresh["maximisers"])
    assert not np.allclose(first["maximisers"], run_seeded_reply(X, round_request())["maximisers"])
    # The same site asked the same request again repeats its noise: no second, independent release.
    np.testing.assert_array_equal(first["maximisers"], repeated["maximisers"])


def test_fedicas_local_engines_keep_the_runs_reproducible_noise(monkeypatch):
    from fedica.clients.app import LOCAL_ENGINE_VARIABLE

    X = blob_sites(1)[0]
    monkeypatch.setenv(LOCAL_ENGINE_VARIABLE, "1")
    app = fedica.clients.make_client_app(lambda context: X, n_components=2)
    reply = client_app_reply(app, {}, round_request())
    for key, expected in run_seeded_reply(X, round_request()).items():
        np.testing.assert_array_equal(reply[key], expected)


def test_without_dp_a_sites_noise_seed_changes_nothing(monkeypatch):
    X = blob_sites(1)[0]
    app = deployed_site_app(monkeypatch, X)
    plain = {"covariance-type": "identity", "local-steps": 1, "server-round": "1"}
    with_seed = client_app_reply(app, {"dp-noise-seed": 11}, plain)
    assert set(with_seed) == {"maximisers", "radii"}
    for reply in (client_app_reply(app, {}, plain), run_seeded_reply(X, plain)):
        for key, expected in reply.items():
            np.testing.assert_array_equal(with_seed[key], expected)


@pytest.mark.parametrize("secret", [-1, "11", True, 1.5])
def test_a_site_refuses_a_noise_seed_that_is_not_a_non_negative_int_in_one_line(monkeypatch, secret):
    from fedica.clients.app import LOCAL_ENGINE_VARIABLE, ArraySource, FlowerSite
    from flwr.app import Context, RecordDict

    monkeypatch.delenv(LOCAL_ENGINE_VARIABLE, raising=False)
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 3, "dp-noise-seed": secret},
                      state=RecordDict(), run_config={})
    site = FlowerSite(ArraySource(lambda context: blob_sites(1)[0], 2, 10), 3, context, {})
    with pytest.raises(ValueError, match=r"^node config dp-noise-seed=.*must be a non-negative int$"):
        site.noise_secret


def test_the_result_says_whose_seed_the_noise_came_from(monkeypatch):
    from fedica.clients.app import LOCAL_ENGINE_VARIABLE
    from fedica.privacy import SECRET_NOISE, SEEDED_NOISE
    from fedica.server import FedGEMStrategy

    model = fedica.FedGEM(covariance_type="identity", standardize=None, rounds=1, dp_epsilon=4.0, dp_clip=6.0).fit(blob_sites(), 2)
    assert model.privacy_["noise"] == SEEDED_NOISE == "seeded by the run (simulation)"
    strategy = FedGEMStrategy(covariance_type="identity", standardize=None, dp_epsilon=4.0, dp_clip=6.0)
    strategy.server = FedGEMServer(strategy.settings)  # the protocol's server holds the plan; no exchange is driven
    monkeypatch.delenv(LOCAL_ENGINE_VARIABLE, raising=False)
    assert strategy.privacy_["noise"] == SECRET_NOISE == "secret at each site"
    assert "clip 6, noise secret at each site); per exchange" in format_summary(
        {"algorithm": "fedgem", "privacy": strategy.privacy_})
    monkeypatch.setenv(LOCAL_ENGINE_VARIABLE, "1")
    assert strategy.privacy_["noise"] == SEEDED_NOISE
