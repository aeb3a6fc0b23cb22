"""The evidence rule: a site's over-split may be joined when the federation says so and the ICL agrees
(issue 24 item 4; docs/ALGORITHMS.md section 2.6.3)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fedica
from fedica.fedgem.selection import evidence_path_sizes, merge_path, path_sizes, relabel

# Three true clusters far apart (d = 2, unit variance).
TRUE_CENTRES = np.array([[0.0, 0.0], [12.0, 0.0], [0.0, 12.0]])


def _recomputed_evidence_path(start, centers, owners, weights, minority, only_shared):
    """The specification: every step recounts every pair's shared and supporting clients."""
    labels, clients, path = start.labels.copy(), np.unique(owners), []
    while np.unique(labels).size > 1:
        ids = np.unique(labels)
        index = np.searchsorted(ids, labels)
        membership = np.zeros((ids.size, clients.size), dtype=int)
        membership[index, np.searchsorted(clients, owners)] = 1
        shared = membership @ membership.T
        either = membership.sum(axis=1)[:, None] + membership.sum(axis=1) - shared
        mass = np.bincount(index, weights=weights, minlength=ids.size)
        sums = np.zeros((ids.size, centers.shape[1]))
        np.add.at(sums, index, centers * weights[:, None])
        centroids = sums / mass[:, None]
        cost = mass[:, None] * mass / (mass[:, None] + mass) * ((centroids[:, None] - centroids) ** 2).sum(axis=2)
        blocked = shared > np.maximum(1, minority * either)
        if only_shared:
            blocked |= shared == 0
        np.fill_diagonal(blocked, True)
        cost[blocked] = np.inf
        a, b = np.unravel_index(np.argmin(cost), cost.shape)
        if not np.isfinite(cost[a, b]):
            break
        labels[labels == ids[b]] = ids[a]
        path.append(relabel(labels, centers, weights))
    return path


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 8), st.sampled_from([0.1, 0.34, 0.6]), st.booleans())
def test_the_evidence_path_makes_the_merges_of_the_recomputed_one(seed, n_clients, minority, only_shared):
    rng = np.random.default_rng(seed)
    owners = np.repeat(np.arange(n_clients), rng.integers(1, 5, n_clients))
    centers = np.round(rng.standard_normal((owners.size, 2)) * 5, 1)
    weights = rng.uniform(1, 10, owners.size)
    # A start that already holds two components of one client in one cluster, as a fixed upsilon's never does.
    start = relabel(np.where(np.arange(owners.size) % 3 == 0, 0, np.arange(owners.size)), centers, weights)
    expected = _recomputed_evidence_path(start, centers, owners, weights, minority, only_shared)
    path = merge_path(start, centers, owners, weights, min_clusters=1, minority=minority, only_shared=only_shared)
    assert [p.labels.tolist() for p in path] == [p.labels.tolist() for p in expected]


def _over_split_start():
    """Twenty clients' components of one true cluster in two sets that share client 0, which holds one in each."""
    rng = np.random.default_rng(0)
    owners = np.r_[0, 0, np.arange(1, 20)]
    centers = 0.2 * rng.standard_normal((owners.size, 2))
    labels = np.r_[0, 1, np.arange(1, 20) % 2]  # client 0's two components, and the others split between them
    return relabel(labels, centers, np.ones(owners.size)), centers, owners


def test_the_strict_path_cannot_join_a_clients_over_split_and_the_evidence_path_does():
    start, centers, owners = _over_split_start()
    assert start.k_hat == 2
    assert merge_path(start, centers, owners, np.ones(owners.size), min_clusters=1) == []
    joined = merge_path(start, centers, owners, np.ones(owners.size), min_clusters=1, minority=0.1)
    assert [p.k_hat for p in joined] == [1]  # one client of twenty holds both: Jaccard 1/20


def test_in_a_small_federation_one_client_never_blocks_a_join_and_two_of_four_do():
    # Four sites, one true cluster found as two sets; the sites holding both are one, then two (Jaccard 1/4, 2/4).
    owners = np.array([0, 0, 1, 2, 3])
    centers = np.array([[0.0, 0.0], [0.2, 0.0], [0.1, 0.1], [0.1, -0.1], [0.3, 0.1]])
    start = relabel(np.array([0, 1, 0, 1, 1]), centers, np.ones(5))
    assert [p.k_hat for p in merge_path(start, centers, owners, np.ones(5), min_clusters=1, minority=0.1)] == [1]
    owners = np.array([0, 0, 1, 1, 3])
    assert merge_path(start, centers, owners, np.ones(5), min_clusters=1, minority=0.1) == []


def test_two_clusters_many_clients_hold_are_never_joined_by_the_evidence_path():
    # Distinct clusters held by the same clients: their Jaccard index is 1, far above any minority.
    owners = np.r_[np.arange(10), np.arange(10)]
    centers = np.r_[np.zeros((10, 2)), np.full((10, 2), 0.5)]  # even close together
    start = relabel(np.r_[np.zeros(10, int), np.ones(10, int)], centers, np.ones(20))
    assert merge_path(start, centers, owners, np.ones(20), min_clusters=1, minority=0.1) == []
    # Without the Jaccard bound a join would be allowed: the bound is what blocks it.
    assert len(merge_path(start, centers, owners, np.ones(20), min_clusters=1, minority=1.0)) == 1


def test_a_fixed_upsilons_path_only_takes_the_joins_the_strict_rule_refused():
    # Two clusters that share no client stay apart at a fixed upsilon: its radii decided them.
    owners = np.arange(4)
    centers = np.array([[0.0, 0.0], [0.1, 0.0], [5.0, 0.0], [5.1, 0.0]])
    start = relabel(np.array([0, 0, 1, 1]), centers, np.ones(4))
    assert merge_path(start, centers, owners, np.ones(4), min_clusters=1, minority=0.1, only_shared=True) == []
    assert len(merge_path(start, centers, owners, np.ones(4), min_clusters=1)) == 1


def test_the_evidence_path_is_sampled_densely_from_one_cluster():
    assert evidence_path_sizes(12, 1) == set(range(1, 12))
    sizes = sorted(evidence_path_sizes(1400, 1))
    assert sizes[:63] == list(range(1, 64)) and sum(sizes) <= 4096
    assert path_sizes(20, 5) == evidence_path_sizes(20, 5)


def _sites(seed, over_split_sites, n_sites=12, n_points=90):
    """Every site holds the three true clusters; ``over_split_sites`` are told K_g = 4 (one cluster split in two)."""
    rng = np.random.default_rng(seed)
    sites = [np.vstack([c + rng.standard_normal((n_points // 3, 2)) for c in TRUE_CENTRES]) for _ in range(n_sites)]
    k_local = [4 if g in over_split_sites else 3 for g in range(n_sites)]
    truth = np.repeat(np.arange(3), n_points // 3)
    return sites, k_local, truth


def _fit(rule, sites, k_local, upsilon):
    # Every cluster counts (no support rule): the over-split then survives the strict rule as a cluster of its own.
    return fedica.FedGEM(covariance_type="identity", upsilon=upsilon, same_client_rule=rule, max_hostile_fraction=0.0,
                         random_state=0).fit(sites, n_local_clusters=k_local)


@pytest.mark.parametrize("upsilon", [1.0, "auto"])
def test_a_federation_where_sites_over_split_a_cluster_finds_k_under_the_evidence_rule_only(upsilon):
    sites, k_local, truth = _sites(0, over_split_sites={0, 1, 2})
    strict = _fit("strict", sites, k_local, upsilon)
    evidence = _fit("evidence", sites, k_local, upsilon)
    # The strict rule's aggregation keeps the over-split: the consensus model counts its halves (the sites' own
    # mixtures may leave one without a point, and the adapted model drops it); the evidence rule's finds three.
    assert strict.set_params(labelling="consensus").fit(sites, n_local_clusters=k_local).n_clusters_ > 3
    assert evidence.n_clusters_ == 3
    # An over-splitting site maps both of its components of the one cluster to that cluster's global id.
    for g in (0, 1, 2):
        assert np.unique(evidence.site_mapping_[g]).size == 3
        predicted = evidence.predict(sites[g], site=g)
        assert np.unique(predicted).size == 3
        assert np.all([np.unique(predicted[truth == c]).size == 1 for c in range(3)])
    pooled = np.concatenate([evidence.predict(X) for X in sites])
    assert np.unique(pooled).size == 3


def test_the_evidence_rule_is_the_librarys_default_and_the_strict_rule_asks_no_likelihood():
    sites, k_local, _ = _sites(1, over_split_sites={0})
    default = fedica.FedGEM(covariance_type="identity", upsilon=1.0, max_hostile_fraction=0.0,
                            random_state=0).fit(sites, n_local_clusters=k_local)
    evidence = _fit("evidence", sites, k_local, 1.0)
    assert default.same_client_rule == "evidence"
    np.testing.assert_array_equal(default.means_, evidence.means_)
    assert default.tuning_["criterion"] == "likelihood"  # the ICL judges the joins the strict rule refused
    assert _fit("strict", sites, k_local, 1.0).tuning_ is None  # a fixed upsilon asks the sites no likelihood


def test_two_distinct_clusters_the_share_admits_are_kept_apart_by_the_icl():
    # Clusters 0 and 1 are held by disjoint sites but two (Jaccard 2 / 22 < 0.1): the evidence path may join them,
    # and every site's likelihood refuses it. Joining without the ICL would give K_hat 1.
    rng = np.random.default_rng(3)
    centres = TRUE_CENTRES[:2]
    holds = [[0]] * 10 + [[1]] * 10 + [[0, 1]] * 2
    sites = [np.vstack([centres[c] + rng.standard_normal((40, 2)) for c in held]) for held in holds]
    for upsilon in (50.0, "auto"):
        fit = fedica.FedGEM(covariance_type="identity", upsilon=upsilon, same_client_rule="evidence",
                            random_state=0).fit(sites, n_local_clusters=[len(h) for h in holds])
        assert fit.n_clusters_ == 2
        assert min(fit.tuning_["k_hats"]) == 1  # the join was a candidate


def test_the_evidence_rule_needs_a_judge():
    sites, k_local, _ = _sites(0, over_split_sites={0})
    with pytest.raises(ValueError, match="same_client_rule='evidence' with upsilon_criterion='silhouette'"):
        fedica.FedGEM(same_client_rule="evidence", upsilon_criterion="silhouette").fit(sites, n_local_clusters=k_local)


# Section 6.2's workload with 20 clients, as in tests/server/test_protocol_attacks.py.
S62_G20 = ["engine=inprocess", "algorithm=fedgem", "+workload=s62_nominal", "scenario.n_clients=20", "baselines=false"]


@pytest.mark.parametrize("attack", ["midpoint_cluster", "split_components"])
def test_a_hostile_quarter_gains_nothing_from_the_evidence_rule(attack, monkeypatch):
    # midpoint_cluster plants a bridge between the two closest true clusters; split_components (one copy per true
    # centre, within the component cap) puts a hostile client in every cluster.
    from fedica import attacks
    from fedica.attacks import hostile
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    monkeypatch.setattr(attacks, "SPLIT_COPIES", 1)
    hostile.planted_centroids.cache_clear()
    try:
        runs = {rule: run_inprocess(compose_config(S62_G20 + [f"attack={attack}", "attack.fraction=0.25",
                                                              f"algorithm.same_client_rule={rule}"]))["metrics"]["fedgem"]
                for rule in ("strict", "evidence")}
    finally:
        hostile.planted_centroids.cache_clear()
    assert runs["evidence"]["honest_k_hat"] == runs["strict"]["honest_k_hat"] == 6
    assert runs["evidence"]["honest_global_ari"] >= runs["strict"]["honest_global_ari"] - 0.01
