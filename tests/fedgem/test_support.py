"""How sure K_hat is (docs/ALGORITHMS.md section 2.6.4): each K's weight, near ties, each cluster's stability."""

import json
import warnings

import numpy as np
import pytest

import fedica
from fedica.fedgem.coordinator import FedGEMServer
from fedica.fedgem.support import candidate_support, cluster_stability, merged_labels, near_tie, split_labels


def _touching_pair(separation, seed, n_sites=4, n=60):
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0], [separation, 0.0]])
    return [centres[rng.integers(2, size=n)] + rng.standard_normal((n, 2)) for _ in range(n_sites)]


def _three_apart(seed=0, n_sites=5, n=100):
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0]])
    return [centres[rng.integers(3, size=n)] + rng.standard_normal((n, 2)) for _ in range(n_sites)]


def test_each_k_weighs_by_its_best_candidate_on_the_deviance_scale():
    # Two candidates of K=3 count once, by the better (100); K=4's is 2 above: weight ratio exp(-1).
    support = candidate_support(np.array([3, 3, 4, 2]), np.array([100.0, 130.0, 102.0, 140.0]), chosen=3)
    assert support["k"] == [2, 3, 4] and support["chosen"] == 3
    assert support["gap"] == [40.0, 0.0, 2.0]
    weights = np.array(support["weight"])
    assert weights.sum() == pytest.approx(1.0)
    assert weights[2] / weights[1] == pytest.approx(np.exp(-1.0))
    assert near_tie(support) == []  # a gap of 2 is no longer a bare mention
    assert near_tie({**support, "gap": [40.0, 0.0, 1.9]}) == [4]
    # Scores of real data lie in the thousands: the weights stay finite.
    assert np.isfinite(candidate_support(np.array([1, 2]), np.array([1e7, 1e7 + 3.0]), 1)["weight"]).all()


def test_a_merge_joins_the_cheapest_pair_and_a_split_cuts_the_widest_cluster():
    centres = np.array([[0.0, 0.0], [0.2, 0.0], [5.0, 0.0], [9.0, 0.0], [9.0, 3.0]])
    weights = np.ones(5)
    labels = np.array([0, 0, 1, 2, 2])
    assert merged_labels(labels, centres, weights).tolist() == [0, 0, 1, 1, 1]  # 5 to (9, 1.5) is cheapest
    split = split_labels(labels, centres, weights)
    assert split.tolist() in ([0, 0, 1, 2, 3], [0, 0, 1, 3, 2])  # cluster 2 is the widest
    assert merged_labels(np.zeros(3, dtype=int), centres[:3], np.ones(3)) is None
    assert split_labels(np.array([0, 1]), centres[:2], np.ones(2)) is None  # no cluster of two centres


def test_cluster_stability_counts_sites_and_measures_spreads_in_radii():
    labels = np.array([0, 0, 0, 1])
    owners = np.array([0, 1, 1, 2])
    centres = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 0.0], [5.0, 5.0]])
    clusters = cluster_stability(labels, owners, centres, np.array([[0.0, 0.0], [5.0, 5.0]]),
                                 np.array([4.0, 1.0, 1.0, 1.0]), n_sites=4)
    assert clusters[0]["sites"] == 2 and clusters[0]["site_share"] == 0.5
    assert clusters[0]["spread_max"] == pytest.approx(1.0) and clusters[0]["spread_median"] == pytest.approx(0.5)
    assert clusters[1] == {"sites": 1, "site_share": 0.25, "spread_median": 0.0, "spread_max": 0.0}


def test_a_clear_choice_has_the_weight_and_every_site_holds_every_cluster():
    model = fedica.FedGEM(covariance_type="spherical", random_state=0).fit(_three_apart())
    support = model.k_support_
    assert model.n_clusters_ == 3 and support["chosen"] == 3 and support["criterion"] == "icl"
    # Every upsilon gave the same partition: the neighbours beyond it are what the weight is measured against.
    assert {2, 4} <= set(support["k"])
    assert support["weight"][support["k"].index(3)] > 0.999
    assert [c["sites"] for c in support["clusters"]] == [5, 5, 5]
    assert all(c["spread_max"] <= 1.0 for c in support["clusters"])


def test_a_near_tie_is_a_warning_and_its_weights_say_how_near():
    # Two clusters 3.2 apart: K=1 and K=2 score within 2 of each other on this draw.
    with pytest.warns(UserWarning, match=r"FedGEM: K_hat=2 is a near tie with K=1: their ICL lies within 2 of the "
                                         r"chosen \(weights K=1 0\.\d\d, K=2 0\.\d\d\)"):
        model = fedica.FedGEM(covariance_type="spherical", standardize=None, random_state=0).fit(_touching_pair(3.2, 2))
    weights = dict(zip(model.k_support_["k"], model.k_support_["weight"]))
    assert 0.3 < weights[1] < 0.7 and 0.3 < weights[2] < 0.7
    with warnings.catch_warnings():  # the same clusters further apart: no tie
        warnings.filterwarnings("error", message=".*near tie")
        fedica.FedGEM(covariance_type="spherical", standardize=None, random_state=0).fit(_touching_pair(5.0, 2))


def test_the_neighbours_change_no_choice(monkeypatch):
    for sites in (_three_apart(1), _touching_pair(3.2, 2), _touching_pair(3.0, 0)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            scored = fedica.FedGEM(random_state=0).fit(sites)
            with monkeypatch.context() as patch:
                patch.setattr(FedGEMServer, "_neighbours", lambda self, candidates: [])
                unscored = fedica.FedGEM(random_state=0).fit(sites)
        np.testing.assert_array_equal(scored.means_, unscored.means_)
        assert scored.tuning_["k_hats"].tolist() == unscored.tuning_["k_hats"].tolist()
        np.testing.assert_array_equal(scored.tuning_["icl"], unscored.tuning_["icl"])
        assert len(scored.k_support_["k"]) >= len(unscored.k_support_["k"])


def test_a_private_fit_weighs_k_by_its_private_criterion():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = fedica.FedGEM(covariance_type="identity", standardize=None, dp_epsilon=5.0, dp_clip=10.0, random_state=0).fit(_three_apart(n=400), n_local_clusters=3)
    assert model.k_support_["criterion"] == "private-bic"
    assert len(model.k_support_["k"]) >= 2 and model.k_support_["chosen"] == model.n_clusters_


def test_a_run_records_the_support_and_its_summary_prints_it(tmp_path):
    from fedica.results import format_summary
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    paths = []
    for g, X in enumerate(_three_apart()):
        paths.append(tmp_path / f"site{g}.csv")
        np.savetxt(paths[-1], X, delimiter=",", header="a,b", comments="")
    result = run_inprocess(compose_config(["algorithm=fedgem", "scenario=files", "engine=inprocess",
                                           f"scenario.paths=[{','.join(map(str, paths))}]"]))
    support = json.loads(json.dumps(result["fedgem"]["k_support"]))  # as result.json holds it
    assert support["chosen"] == 3 and [c["sites"] for c in support["clusters"]] == [5, 5, 5]
    line = next(line for line in format_summary(result).splitlines() if line.startswith("K_hat support"))
    assert "K=3 1.00" in line and "sites holding each cluster: 5, 5, 5" in line
    path = tmp_path / "result.json"
    path.write_text(json.dumps(result, default=lambda value: value.tolist()))
    assert fedica.FedGEM.from_result(path).k_support_ == support


def test_the_strategy_of_a_users_flower_app_reports_it():
    from fedica.clients import make_client_app
    from fedica.server.fedgem import FedGEMStrategy
    from fedica.server.inprocess import InProcessGrid

    sites = _three_apart()
    grid = InProcessGrid(make_client_app(lambda context: sites[int(context.node_config["partition-id"])]),
                         [{"partition-id": g, "num-partitions": 5} for g in range(5)])
    strategy = FedGEMStrategy(min_available_nodes=5, min_clients=2)
    strategy.start(grid=grid)
    assert strategy.k_support_["chosen"] == strategy.n_clusters_ == 3
    assert [c["sites"] for c in strategy.k_support_["clusters"]] == [5, 5, 5]


def test_a_neighbour_the_sites_prefer_to_the_choice_is_a_warning():
    # Two clusters six times longer than wide: spheres take several for each, and the sites' own likelihood prefers
    # a merge beyond what the merge rules offered. Said, with the gap; the choice stays the merge rules'.
    rng = np.random.default_rng(2)
    sites = []
    for _ in range(4):
        y = rng.integers(2, size=150)
        sites.append(np.c_[rng.normal(0.0, 6.0, 150), rng.normal(0.0, 0.7, 150) + 5.0 * y])
    with pytest.warns(UserWarning, match=r"FedGEM: the sites' ICL prefers K=3 to K_hat=4 \(by \d+\), a partition that "
                                         r"joins clusters the merge rules kept apart: K_hat may over-count"):
        model = fedica.FedGEM(covariance_type="spherical", standardize=None, random_state=0).fit(sites)
    gaps = dict(zip(model.k_support_["k"], model.k_support_["gap"]))
    assert model.n_clusters_ == 4 and gaps[3] < -2
    # The default family joins the spheres into the two elongated clusters.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert fedica.FedGEM(standardize=None, random_state=0).fit(sites).n_clusters_ == 2


def test_the_summary_line_of_a_large_federation_stays_one_readable_line():
    # G=1,000 (blobs, K=50): 49 candidates, 48 of them at weight 0, and 50 clusters held by 326 to 558 sites each.
    from fedica.results import k_support_line

    candidates = [49, *range(51, 83), 89, 93, 98, 106, 116, 127, 138, 151, 164, 179, 195, 200, 213, 233, 1212]
    support = {"criterion": "icl", "k": [50, *candidates], "weight": [1.0] + [0.0] * len(candidates), "chosen": 50,
               "clusters": [{"sites": 326 + (g * 37) % 233, "spread_max": 2.0 + g / 10} for g in range(50)]}
    line = k_support_line(support)
    assert line.startswith("K_hat support: weights K=50 1.00 (48 other candidates, K=49 to 1212, under 0.01); ")
    assert "sites holding each cluster: 326 to 556 (median 439) over 50 clusters;" in line
    assert len(line) < 250
    # A near tie keeps both candidates on the line; a few clusters are each listed.
    support = {"k": [2, 3, 4], "weight": [0.45, 0.55, 0.0], "chosen": 3,
               "clusters": [{"sites": 4, "spread_max": None}, {"sites": 5, "spread_max": None}, {"sites": 3, "spread_max": None}]}
    line = k_support_line(support)
    assert "weights K=2 0.45, K=3 0.55 (1 other candidate, K=4, under 0.01)" in line
    assert line.endswith("sites holding each cluster: 4, 5, 3")
