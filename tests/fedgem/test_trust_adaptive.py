"""The trust rules against attacks that know them (issue 25): far components, the tuning's level and
tie test, and the evaluation's weights (fedica.fedgem.trust)."""

import numpy as np
import pytest

from fedica.evaluation.metrics import ari_from_contingency
from fedica.fedgem.components import ClientModel
from fedica.fedgem.tables import capped_table, table_caps
from fedica.fedgem.trust import (
    FAR_COMPONENT_FACTOR,
    FederationExtent,
    icl_winners,
    refuse_far_components,
    robust_totals,
    scale_free_distances,
    unsupported_clusters,
)


def test_distances_of_overflowing_rows_are_finite_or_inf_never_nan():
    points = np.array([[1e160, -1e160], [3.0, 4.0], [1e-170, 0.0], [0.0, 0.0]])
    distances = scale_free_distances(points, np.zeros(2))
    assert np.all(~np.isnan(distances))
    assert distances[0] == pytest.approx(np.sqrt(2) * 1e160)
    assert distances[1] == pytest.approx(5.0)
    assert distances[2] == pytest.approx(1e-170) and distances[3] == 0.0
    # Beyond the largest double the distance is inf, still ordered above every threshold.
    assert scale_free_distances(np.array([[1.7e308, 0.0]]), np.array([-1.7e308, 0.0]))[0] == np.inf


def test_a_row_far_from_the_federation_by_its_scale_is_untrusted_whatever_the_clients_own_scale():
    rng = np.random.default_rng(0)
    centroids = rng.uniform(-10, 10, (40, 2))
    extent = FederationExtent.of(centroids)
    assert extent.far_reason("maximisers", centroids) is None
    reply = np.array([[1.0, 2.0], [1e157, 1e157]])
    reason = extent.far_reason("maximisers", reply)
    assert "row 1" in reason and "untrusted" in reason
    # Just inside the factor is trusted: the rule is the federation's spread, not a fixed size.
    inside = extent.centre + [0.99 * FAR_COMPONENT_FACTOR * extent.spread, 0.0]
    assert extent.far_reason("maximisers", inside[None]) is None
    # No spread (every centroid at one point): nothing to measure by, no row is far.
    assert FederationExtent.of(np.zeros((5, 2))).far_reason("maximisers", reply) is None


def test_a_client_declaring_a_far_component_is_refused_at_initialisation():
    models = {p: ClientModel(100, np.full(2, 0.5), np.array([[p, 0.0], [0.0, p]]), 100) for p in range(1, 6)}
    models[9] = ClientModel(100, np.full(2, 0.5), np.array([[1.0, 1.0], [-1e155, 0.0]]), 100)
    refused = dict(refuse_far_components(models))
    assert set(refused) == {9} and "'centroids' row 1" in refused[9]
    assert set(models) == {1, 2, 3, 4, 5}


def _honest_scores(rng, n_clients=20, n_points=125):
    """Per-client log-likelihoods of three candidates: the first is best by 2 nats per point."""
    per_point = -3.0 + 0.05 * rng.standard_normal((n_clients, 1)) + np.array([0.0, -2.0, -2.5])
    return per_point * n_points, np.full(n_clients, float(n_points))


def test_a_constant_shift_of_one_clients_likelihoods_moves_no_total_and_ties_no_candidate():
    rng = np.random.default_rng(1)
    scores, sizes = _honest_scores(rng)
    clean = robust_totals(scores, sizes, 0.25)
    shifted = scores.copy()
    shifted[3] += -1e13
    attacked = robust_totals(shifted, sizes, 0.25)
    # The shifted client's level is clipped to the honest range: the totals stay within one honest client's.
    assert np.all(np.abs(attacked - clean) < 0.1 * 125)
    icl = -2 * attacked
    assert icl_winners(icl).tolist() == [0]


def test_the_tie_test_is_relative_but_never_looser_than_an_absolute_floor():
    assert icl_winners(np.array([5.0, 5.0, 6.0])).tolist() == [0, 1]
    # Relative 1e-9 of 2e13 would be 2e4 nats; the absolute floor keeps distinct candidates distinct.
    assert icl_winners(np.array([2e13 + 100.0, 2e13, 2e13 + 1.0])).tolist() == [1]


def test_a_table_beyond_its_clients_test_share_is_scaled_down_with_its_proportions():
    counts = np.array([1000, 1475, 1])
    scaled = capped_table(counts, 250)
    assert scaled.sum() == 250 and scaled.tolist() == [101, 149, 0]
    assert capped_table(counts, 5000).tolist() == counts.tolist()
    # Test points per declared training point: 2 for the honest clients, 19.8 for the forger: every
    # cap is 1.5 x 2 x the client's counted points.
    totals, sizes = np.array([250, 250, 250, 2475]), np.full(4, 125)
    assert table_caps(totals, sizes, sizes, 0.25).tolist() == [375, 375, 375, 375]
    assert table_caps(totals, sizes, sizes, 0.0).tolist() == [np.inf] * 4


def test_one_forged_table_weighs_no_more_than_its_share():
    rng = np.random.default_rng(2)
    tables = []
    for _ in range(19):  # honest: 250 test points over 10 clusters, 96 % on the diagonal
        labels = rng.integers(0, 10, 250)
        predicted = np.where(rng.random(250) < 0.96, labels, rng.integers(0, 10, 250))
        pairs, counts = np.unique(np.c_[labels, predicted], axis=0, return_counts=True)
        tables.append((pairs[:, 0], pairs[:, 1], counts))
    true_f, pred_f = (grid.ravel() for grid in np.meshgrid(np.arange(10), np.arange(10)))
    forged = (true_f, pred_f, np.full(100, 25 * 10 * 99 // 1000))  # 9.9x a client's 250, spread evenly
    parts = tables + [forged]

    def pooled(caps):
        return ari_from_contingency(*(np.concatenate([p[i] for p in parts]) for i in range(2)),
                                    np.concatenate([capped_table(p[2], cap) for p, cap in zip(parts, caps)]))

    honest = ari_from_contingency(*(np.concatenate([p[i] for p in tables]) for i in range(3)))
    sizes = np.full(len(parts), 125)
    caps = table_caps(np.array([p[2].sum() for p in parts]), sizes, sizes, 0.25)
    assert honest - pooled([np.inf] * len(parts)) > 0.25
    assert honest - pooled(caps) < 0.15


def test_a_cluster_of_few_clients_midway_between_two_true_ones_is_not_counted_by_its_mass():
    # Clusters 0-2 have three supporters each (quorum 3); cluster 3, of two clients with a typical
    # mass, sits midway between clusters 0 and 1; cluster 4, of one client, lies apart.
    centroids = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 6.0], [2.0, 0.0], [9.0, 9.0]])
    labels = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 4])
    owners = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 4, 5])
    masses = np.full(labels.size, 40.0)
    weak = unsupported_clusters(labels, owners, masses, quorum=3, typical_mass=5.0, centroids=centroids)
    assert weak.tolist() == [False, False, False, True, False]
    # Without the centroids only the mass counts (the rule before).
    assert not unsupported_clusters(labels, owners, masses, quorum=3, typical_mass=5.0).any()


# The workload: blobs with G=20 clients, K=10, d=2, R_min=4.
BLOBS_G20_K10 = ["engine=inprocess", "algorithm=fedgem", "scenario=blobs", "scenario.n_clients=20",
                 "scenario.n_clusters=10", "baselines=false", "seed=0"]


def _attacked(kind, fraction):
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    result = run_inprocess(compose_config(BLOBS_G20_K10 + [f"attack={kind}", f"attack.fraction={fraction}"]))
    return result, result["metrics"]["fedgem"]


def test_one_overflowing_row_is_rejected_with_its_reason_and_the_run_finds_the_truth():
    # Before: the run stopped (every client's entropies NaN).
    result, metrics = _attacked("overflow_row", 0.05)
    reasons = [r for r in result["clients"]["rejected"] if "far from every other" in r["reason"]]
    assert [(r["client"], r["round"]) for r in reasons] == [(result["fedgem"]["hostile_clients"][0], 2)]
    assert metrics["k_hat"] == 10 and metrics["global_ari"] > 0.95


def test_midpoint_colluders_found_no_cluster_of_their_own():
    # Before: K_hat 11 (their own test points fell in the planted cluster), global ARI .87.
    _, metrics = _attacked("midpoint_cluster", 0.25)
    assert metrics["k_hat"] == metrics["honest_k_hat"] == 10


def test_a_forged_local_ari_is_rejected_with_its_table():
    # Before: reported local ARI .29, global ARI .43 (honest .97).
    result, metrics = _attacked("forged_metrics", 0.05)
    forged = [r for r in result["clients"]["rejected"] if "own contingency table" in r["reason"]]
    assert [r["client"] for r in forged] == result["fedgem"]["hostile_clients"]
    assert metrics["local_ari"] == pytest.approx(metrics["honest_local_ari"])
    assert metrics["k_hat"] == 10


def test_the_attacks_send_what_they_claim():
    from fedica import attacks

    rng = np.random.default_rng(3)
    honest = rng.standard_normal((3, 2))
    overflowing = attacks.overflow_maximisers(honest, rng)
    assert np.all(np.abs(overflowing[0]) >= 1e155) and np.all(np.abs(overflowing[0]) <= 1e160)
    assert np.array_equal(overflowing[1:], honest[1:]) and np.all(np.isfinite(overflowing))
    assert np.array_equal(attacks.shifted_likelihoods(np.array([-5.0, -6.0])), [-5.0 - 1e13, -6.0 - 1e13])
    centres = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 4.0], [7.0, 7.0]])
    assert attacks.closest_pair_midpoint(centres).tolist() == [0.0, 2.0]
    true_values, pred_values, counts = attacks.forged_contingency(np.array([4, 2, 4]), np.array([0, 1, 1, 2]), 600)
    assert sorted(set(zip(true_values.tolist(), pred_values.tolist()))) == [(t, p) for t in range(3) for p in (2, 4)]
    assert counts.tolist() == [100] * 6
