"""fedica.privacy per client (dp_unit: client): normalised releases, their mechanism, its accountant, the server's balls."""

from __future__ import annotations

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp

import fedica
from fedica.data.common import ClientData
from fedica.fedgem.coordinator import FedGEMSettings
from fedica.fedgem.privacy import (
    client_noise_variance,
    fedgem_plan,
    maximiser_variance,
    noise_variance,
    private_client_init,
    private_client_step,
    private_reply,
)
from fedica.privacy import UNIT_KEY, PrivacyPlan
from fedica.protocol import GEM_INIT, GEM_ROUND, ArraySite
from fedica.tasks import CLIENT_TASKS

CENTROIDS = np.array([[-3.0, 0.0], [3.0, 0.0]])


def near_sites(n_sites=4, n_points=300, seed=0, spread=0.2):
    """Sites of two tight clusters about +-3 in d=2, inside a clip ball of radius 5."""
    rng = np.random.default_rng(seed)
    return [CENTROIDS[rng.integers(2, size=n_points)] + spread * rng.standard_normal((n_points, 2)) for _ in range(n_sites)]


def client_request(sigma=0.5, clip=5.0, seed=0, label="1"):
    return {"covariance-type": "identity", "local-steps": 1, "dp-noise": sigma, "dp-clip": clip, "dp-seed": seed,
            "server-round": label, UNIT_KEY: "client"}


def site_at(X, centroids):
    site = ArraySite(ClientData(X, None, X[:0], None, centroids.shape[0]), 2)
    site.state["centroids"] = centroids
    return site


def test_a_per_client_step_adds_the_mechanisms_noise_to_the_means_and_shares():
    X = near_sites(1)[0]
    sigma, clip = 0.01, 5.0  # the noisy means stay well inside the ball: no projection
    true_means, true_counts = private_client_step(X, CENTROIDS, 0.0, clip, np.random.default_rng(0))
    draws = [private_client_step(X, CENTROIDS, sigma, clip, np.random.default_rng(s)) for s in range(2000)]
    mean_noise = np.stack([m for m, _ in draws]) - true_means
    count_noise = np.stack([c for _, c in draws]) - true_counts
    # The means' sensitivity is 2 C sqrt(K_g), the shares' sqrt(2) (times the public size in the counts);
    # 8,000 and 4,000 draws: the variances' relative standard errors are about 1.6% and 2.2%.
    assert np.var(mean_noise) == pytest.approx((sigma * 2 * clip * np.sqrt(2)) ** 2, rel=0.08)
    assert np.var(count_noise) == pytest.approx((sigma * np.sqrt(2) * X.shape[0]) ** 2, rel=0.10)
    assert abs(np.mean(mean_noise)) < 0.1 * sigma * 2 * clip * np.sqrt(2)
    # Without noise the release is the components' means and the site's shares of its points.
    np.testing.assert_allclose(np.sort(true_means[:, 0]), [-3.0, 3.0], atol=0.05)
    assert true_counts.sum() == pytest.approx(X.shape[0])


def test_per_client_replies_are_noisy_seeded_and_keep_the_public_size():
    X = near_sites(1)[0]
    answer = lambda seed: CLIENT_TASKS.answer(GEM_ROUND, site_at(X, CENTROIDS), {"centroids": CENTROIDS},
                                              client_request(seed=seed))
    first, again, other = answer(0), answer(0), answer(1)
    np.testing.assert_array_equal(first[0]["maximisers"], again[0]["maximisers"])
    assert not np.allclose(first[0]["maximisers"], other[0]["maximisers"])
    assert set(first[0]) == {"maximisers", "radii", "dp-counts"}
    np.testing.assert_allclose(first[0]["radii"], ((first[0]["maximisers"] - CENTROIDS) ** 2).sum(axis=1))
    site = site_at(X, CENTROIDS)
    arrays, values = CLIENT_TASKS.answer(GEM_INIT, site, {}, {**client_request(sigma=0.05, label="init"), "n-init": 1,
                                                               "seed": 0})
    assert values["n-points"] == X.shape[0]  # public under the per-client relation: no noisy size
    assert "dp-n-points" not in site.state
    np.testing.assert_array_equal(site.state["centroids"], arrays["centroids"])
    # No seed is a data point (k-means++ seeds are).
    assert np.min(np.linalg.norm(arrays["centroids"][:, None] - X[None], axis=2)) > 0


def test_per_client_releases_stay_in_the_clip_ball_whatever_the_data():
    rng = np.random.default_rng(3)
    far = 100.0 * rng.standard_normal((50, 3))
    other = 100.0 * rng.standard_normal((50, 3)) + 400.0
    centroids = np.array([[0.0, 0.0, 0.0], [50.0, 0.0, 0.0]])
    clip = 2.0
    # Noiseless, any two sites' releases differ by at most the sensitivities the mechanism is scaled to.
    means_a, counts_a = private_client_step(far, centroids, 0.0, clip, rng)
    means_b, counts_b = private_client_step(other, centroids, 0.0, clip, rng)
    assert np.linalg.norm(means_a, axis=1).max() <= clip + 1e-12
    assert np.linalg.norm(means_a - means_b) <= 2 * clip * np.sqrt(2) + 1e-12
    assert np.linalg.norm(counts_a / 50 - counts_b / 50) <= np.sqrt(2) + 1e-12
    # With noise, what is sent is projected onto the ball again.
    noisy, _ = private_client_step(far, centroids, 3.0, clip, rng)
    assert np.linalg.norm(noisy, axis=1).max() <= clip + 1e-12
    seeds = private_client_init(far[:2], 3.0, clip, rng)
    assert np.linalg.norm(seeds, axis=1).max() <= clip + 1e-12


def test_a_per_client_plan_is_dp_accountings_composition_of_its_releases():
    settings = FedGEMSettings(dp_epsilon=1.0, dp_clip=5.0, covariance_type="identity", standardize=None, rounds=2, dp_unit="client")
    plan = fedgem_plan(settings)
    assert plan.exchanges == (("init", 1), ("round 1", 2), ("round 2", 2), ("final", 2))
    accountant = rdp.RdpAccountant()
    for _ in range(7):  # one by one, as a site releases them
        accountant.compose(dp_accounting.GaussianDpEvent(plan.noise_multiplier))
    record = plan.record()
    assert record["epsilon"] == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-9)
    assert record["epsilon"] == pytest.approx(1.0, abs=1e-4)
    assert record["unit"] == "client"
    assert plan.request_values(0)[UNIT_KEY] == "client"
    # A per-record plan's requests are what they were: no unit key.
    per_record = fedgem_plan(FedGEMSettings(dp_epsilon=1.0, dp_clip=5.0, covariance_type="identity", standardize=None))
    assert UNIT_KEY not in per_record.request_values(0)


def test_the_server_widens_a_per_client_ball_by_the_means_noise_capped_by_the_balls_diameter():
    plan = PrivacyPlan.calibrated(1.0, 1e-5, 3.0, "client", [("init", 1), ("final", 2)])
    small = PrivacyPlan(1.0, 1e-5, 3.0, "client", plan.exchanges, 0.01)
    maximisers, counts = np.zeros((2, 4)), np.array([10.0, 20.0])
    np.testing.assert_allclose(maximiser_variance(small, maximisers, counts), 4 * (2 * 3.0 * 0.01) ** 2 * 2)
    assert client_noise_variance(2, 4, plan.noise_multiplier, 3.0) == pytest.approx((2 * 3.0) ** 2)
    record = PrivacyPlan(1.0, 1e-5, 3.0, "record", plan.exchanges, 0.01)
    np.testing.assert_array_equal(maximiser_variance(record, maximisers, counts),
                                  noise_variance(maximisers, counts, 0.01, 3.0))


def test_a_per_client_fit_finds_the_clusters_when_the_noise_is_small_and_records_its_unit():
    sites = near_sites(n_sites=6, n_points=200, spread=0.3)
    model = fedica.FedGEM(covariance_type="identity", standardize=None, rounds=2, dp_epsilon=1e5, dp_clip=5.0, dp_unit="client",
                          random_state=0).fit(sites, 2)
    assert model.privacy_["unit"] == "client"
    assert model.privacy_["epsilon"] == pytest.approx(1e5, rel=1e-3)
    assert model.n_clusters_ == 2
    np.testing.assert_allclose(np.sort(model.means_[:, 0]), [-3.0, 3.0], atol=0.15)


def test_without_dp_epsilon_the_unit_changes_nothing():
    sites = near_sites()
    record = fedica.FedGEM(covariance_type="identity", rounds=2, dp_unit="record").fit(sites, 2)
    client = fedica.FedGEM(covariance_type="identity", rounds=2, dp_unit="client").fit(sites, 2)
    np.testing.assert_array_equal(record.means_, client.means_)
    assert record.history_ == client.history_ and client.privacy_ is None
    request = {"covariance-type": "identity", "local-steps": 1, "server-round": "1"}
    X = sites[0]
    reply = CLIENT_TASKS.handlers[GEM_ROUND](site_at(X, CENTROIDS), {"centroids": CENTROIDS}, request)
    assert private_reply(GEM_ROUND, site_at(X, CENTROIDS), {"centroids": CENTROIDS}, request, reply) is reply


def test_a_site_refuses_an_unknown_unit_in_one_line():
    X = near_sites(1)[0]
    with pytest.raises(ValueError, match="dp-unit must be one of record, client, got 'group'") as caught:
        CLIENT_TASKS.answer(GEM_ROUND, site_at(X, CENTROIDS), {"centroids": CENTROIDS},
                            {**client_request(), UNIT_KEY: "group"})
    assert "\n" not in str(caught.value)
