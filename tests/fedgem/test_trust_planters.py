"""A client caught planting a cluster is trusted no more (issue 25, item 3a; fedica.fedgem.trust)."""

import numpy as np
import pytest

from fedica.fedgem.components import Components, Support
from fedica.fedgem.overlaps import TooManyOverlaps
from fedica.fedgem.trust import (
    fragment_clusters,
    planted_clusters,
    trusted_final_aggregation,
    trusted_grid_aggregations,
)

# Four true clusters; the closest pair, (0, 0) and (8, 0), has its midpoint at (4, 0).
TRUE_CENTRES = np.array([[0.0, 0.0], [8.0, 0.0], [0.0, 10.0], [10.0, 10.0]])
MIDPOINT = np.array([4.0, 0.0])
COLLUDERS = (6, 7)
LONE_CLIENT = 5


def _federation() -> Components:
    """Six honest clients holding every true cluster (client 5 also one of its own, far from the others), and two
    colluders each holding a midpoint component and a component at one shared point far from every true cluster."""
    rng = np.random.default_rng(0)
    centers, owners = [], []
    for client in range(6):
        rows = TRUE_CENTRES + 0.05 * rng.standard_normal(TRUE_CENTRES.shape)
        if client == LONE_CLIENT:  # a genuine cluster one client holds: it must stay counted
            rows = np.vstack([rows, [-15.0, -15.0]])
        centers.append(rows)
        owners += [client] * rows.shape[0]
    for client in COLLUDERS:
        centers.append(np.vstack([MIDPOINT, [20.0, 20.0], TRUE_CENTRES[2:]]))
        owners += [client] * 4
    centers = np.vstack(centers)
    owners = np.array(owners)
    weights = np.full(owners.size, 25.0)
    partitions = sorted(set(owners.tolist()))
    return Components(partitions, centers, np.zeros(owners.size), owners, weights)


def test_the_clients_of_a_planted_cluster_are_caught_and_none_of_their_components_founds_a_cluster():
    final = _federation()
    support = Support(quorum=3, typical_mass=2.5, masses=final.weights)
    radii = np.full(final.owners.size, 1.0)
    first, excluded, planters = trusted_final_aggregation(final, radii, 10.0, support)
    assert sorted(planters) == list(COLLUDERS)
    assert "planted cluster" in planters[COLLUDERS[0]] and "[4.0, 0.0]" in planters[COLLUDERS[0]]
    # Caught, the plant founds no cluster; their shared far point still does until the server distrusts them.
    assert excluded.tolist() == np.all(np.isclose(final.centers, MIDPOINT), axis=1).tolist()
    assert first.k_hat == 6
    aggregation, excluded, more = trusted_final_aggregation(final, radii, 10.0, support, distrusted=COLLUDERS)
    assert more == {} and excluded.tolist() == np.isin(final.owners, COLLUDERS).tolist()
    # The four true clusters and the lone client's own; the colluders' shared far point founds none.
    assert aggregation.k_hat == 5
    centroids = np.round(aggregation.global_centroids).tolist()
    assert [-15.0, -15.0] in centroids and [20.0, 20.0] not in centroids


def test_without_the_plant_the_colluders_far_cluster_counts_by_its_mass():
    # The rule distrusts planters, not small clusters: two clients' cluster far from the others is counted.
    final = _federation()
    at_midpoint = np.all(np.isclose(final.centers, MIDPOINT), axis=1)
    final.centers[at_midpoint] = [4.0, 40.0]  # far from every true cluster: no plant
    support = Support(quorum=3, typical_mass=2.5, masses=final.weights)
    aggregation, _, planters = trusted_final_aggregation(final, np.full(final.owners.size, 1.0), 10.0, support)
    assert planters == {}
    assert aggregation.k_hat == 7


def test_a_plant_needs_two_clients_and_fewer_than_the_quorum():
    centroids = np.array([[0.0, 0.0], [8.0, 0.0], [0.0, 10.0], [4.0, 0.0]])
    labels = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 3, 3])
    owners = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 4])
    assert planted_clusters(labels, owners, 3, centroids).tolist() == [False, False, False, True]
    assert not planted_clusters(labels, owners, 2, centroids).any()  # two clients are a quorum of 2
    assert not planted_clusters(labels, np.r_[owners[:-1], 3], 3, centroids).any()  # one client: a misfit
    assert not planted_clusters(labels, owners, 3, None).any()  # no centroids: nothing is embedded


def test_an_over_split_fragment_inside_a_supported_cluster_is_mapped_into_it_and_costs_no_client_its_trust():
    # Six honest clients hold every true cluster; two of them also split cluster 0 (the same-client rule keeps each
    # one's second component out of it): the two fragments form a cluster of two clients, fewer than the quorum and
    # embedded, which is what a plant looks like, but it lies within cluster 0's own spread.
    rng = np.random.default_rng(1)
    centers, owners = [], []
    for client in range(6):
        rows = TRUE_CENTRES + 0.1 * rng.standard_normal(TRUE_CENTRES.shape)
        if client in (4, 5):
            rows = np.vstack([rows, TRUE_CENTRES[0] + [0.15, 0.1] + 0.01 * rng.standard_normal(2)])
        centers.append(rows)
        owners += [client] * rows.shape[0]
    owners = np.array(owners)
    final = Components(list(range(6)), np.vstack(centers), np.zeros(owners.size), owners, np.full(owners.size, 25.0))
    support = Support(quorum=3, typical_mass=2.5, masses=final.weights)
    aggregation, excluded, planters = trusted_final_aggregation(final, np.full(owners.size, 0.5), 10.0, support)
    assert planters == {}
    assert aggregation.k_hat == 4
    fragments = np.flatnonzero(excluded)
    assert fragments.size == 2 and set(owners[fragments]) == {4, 5}
    assert set(aggregation.labels[fragments]) == {aggregation.labels[0]}  # mapped into cluster 0


def test_a_fragment_lies_within_reach_of_its_nearest_supported_cluster():
    # Cluster 0's members lie a median 0.5 from its centroid: a cluster 0.9 away is its fragment, one 1.1 away is not.
    centers = np.array([[0.5, 0.0], [-0.5, 0.0], [0.0, 0.5], [0.0, -0.5], [10.0, 0.0], [10.0, 0.0], [0.9, 0.0], [0.0, 1.1]])
    labels = np.array([0, 0, 0, 0, 1, 1, 2, 3])
    centroids = np.array([[0.0, 0.0], [10.0, 0.0], [0.9, 0.0], [0.0, 1.1]])
    backed = np.array([True, True, False, False])
    assert fragment_clusters(labels, centers, centroids, backed).tolist() == [False, False, True, False]
    assert not fragment_clusters(labels, centers, centroids, np.zeros(4, dtype=bool)).any()


# The issue's workload: blobs with G=20 clients, K=10, d=2, R_min=4. On seed 2 the colluders' own fits made an
# eleventh cluster after their plant was caught; on seed 0, at the smallest upsilon, an honest client's
# component fell in with the colluders' other fragments (a cluster of four, embedded).
BLOBS_G20_K10 = ["engine=inprocess", "algorithm=fedgem", "scenario=blobs", "scenario.n_clients=20",
                 "scenario.n_clusters=10", "baselines=false"]


@pytest.mark.parametrize("seed", [0, 2])
def test_midpoint_colluders_are_distrusted_for_the_rest_of_the_run_and_their_evaluation_is_not_counted(seed):
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    # Before: K_hat 10 and 11 (seed 2: a cluster of one colluder's own), reported global ARI .878 and .916, honest
    # .963 and .993.
    result = run_inprocess(compose_config(BLOBS_G20_K10 + [f"seed={seed}", "attack=midpoint_cluster",
                                                           "attack.fraction=0.25"]))
    metrics, hostile = result["metrics"]["fedgem"], result["fedgem"]["hostile_clients"]
    books = {(r["client"], r["round"]): r["reason"] for r in result["clients"]["rejected"]}
    assert sorted(client for client, stage in books if stage == "final") == hostile
    assert sorted(client for client, stage in books if stage == "evaluate") == hostile
    assert all("planted cluster" in books[(client, "final")] and "caught at 6 of 6 upsilons" in books[(client, "final")]
               for client in hostile)
    assert metrics["k_hat"] == metrics["honest_k_hat"] == 10
    assert metrics["global_ari"] == pytest.approx(metrics["honest_global_ari"])
    assert metrics["local_ari"] == pytest.approx(metrics["honest_local_ari"])
    assert set(result["fedgem"]["client_local_ari"]) == {str(p) for p in range(20)} - {str(p) for p in hostile}


def test_honest_fragments_that_look_planted_at_one_upsilon_cost_no_client_its_trust():
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    # Digits (G=10), seed 5: at the smallest upsilon two honest clients' components form a small embedded cluster.
    # Caught at any one upsilon, both lost their trust and their evaluation; a plant must show at half of them.
    result = run_inprocess(compose_config(["engine=inprocess", "algorithm=fedgem", "+workload=digits", "seed=5",
                                           "baselines=false"]))
    assert not [r for r in result["clients"]["rejected"] if r["round"] in ("final", "evaluate")]
    assert len(result["fedgem"]["client_local_ari"]) == 10


def _assert_same_aggregations(found, expected):
    for (aggregation, excluded, planters), (other, other_excluded, other_planters) in zip(found, expected):
        np.testing.assert_array_equal(aggregation.labels, other.labels)
        np.testing.assert_array_equal(aggregation.global_centroids, other.global_centroids)
        np.testing.assert_array_equal(excluded, other_excluded)
        assert planters == other_planters


@pytest.mark.parametrize("distrusted", [(), COLLUDERS])
def test_a_grid_aggregated_in_one_sweep_equals_each_upsilon_aggregated_alone(distrusted):
    final = _federation()
    final.eps[:] = 0.3  # the drifts: above the two smallest upsilons' radii, so their outlying ones are untrusted
    final.eps[3] = 40.0  # one client's component drifted far
    support = Support(quorum=3, typical_mass=2.5, masses=final.weights)
    base = np.random.default_rng(3).uniform(0.5, 1.5, size=final.owners.size)
    base[0] = 300.0  # an outlying radius: untrusted once it exceeds half the clients' separation
    grid = [0.0005, 0.002, 0.01, 0.1, 1.0, 4.0]
    radii = {u: u * base for u in grid}
    found = trusted_grid_aggregations(final, radii, 10.0, support, distrusted=distrusted)
    expected = [trusted_final_aggregation(final, radii[u], 10.0, support, distrusted=distrusted) for u in grid]
    _assert_same_aggregations([found[u] for u in grid], expected)
    assert len({tuple(excluded) for _, excluded, _ in expected}) > 1  # the upsilons trust different components
    assert len({aggregation.k_hat for aggregation, _, _ in expected}) > 1
    # Radii that are not one array scaled (a private run's hold each maximiser's noise) are aggregated one by one.
    noisy = {u: r + 0.05 for u, r in radii.items()}
    found = trusted_grid_aggregations(final, noisy, 10.0, support, distrusted=distrusted)
    expected = [trusted_final_aggregation(final, noisy[u], 10.0, support, distrusted=distrusted) for u in grid]
    _assert_same_aggregations([found[u] for u in grid], expected)


def test_an_upsilon_over_the_pair_budget_holds_its_error():
    final = _federation()
    radii = {u: np.full(final.owners.size, u) for u in (1e-6, 400.0)}
    found = trusted_grid_aggregations(final, radii, None, max_pairs=50)
    assert found[1e-6][0].k_hat == final.owners.size - 4  # only the colluders' four shared points meet
    assert isinstance(found[400.0], TooManyOverlaps)


class _FinalStage:
    """The part of :class:`fedica.fedgem.coordinator.FedGEMServer` that catches planters, on a fixed federation."""

    from fedica.fedgem.coordinator import FedGEMServer

    _catch_planters = FedGEMServer._catch_planters
    _planters_beyond_budget = FedGEMServer._planters_beyond_budget

    def __init__(self, final: Components, support: Support, max_hostile_fraction: float):
        from types import SimpleNamespace

        self.final, self.support = final, support
        self.settings = SimpleNamespace(upsilon=1.0, upsilon_grid=(1.0,), max_hostile_fraction=max_hostile_fraction)
        self.distrusted, self.aggregated, self.books = {}, {}, []

    def _aggregate_grid(self, upsilons):
        pass

    def _final_aggregation(self, upsilon):
        return trusted_final_aggregation(self.final, np.full(self.final.owners.size, 1.0), 10.0, self.support,
                                         distrusted=self.distrusted)

    def reject(self, client, stage, reason):
        self.books.append((client, stage, reason))


def _two_plants() -> Components:
    """The federation above with two more colluders, planting a second cluster at (8, 4), among the true ones."""
    final = _federation()
    centers = np.vstack([np.vstack([[8.0, 4.0], [20.0, 20.0], TRUE_CENTRES[:2]]) for _ in range(2)])
    owners = np.repeat([8, 9], 4)
    return Components(list(range(10)), np.vstack([final.centers, centers]), np.zeros(final.owners.size + 8),
                      np.r_[final.owners, owners], np.r_[final.weights, np.full(8, 25.0)])


def test_colluders_within_the_hostile_budget_are_distrusted_and_booked():
    stage = _FinalStage(_federation(), Support(quorum=3, typical_mass=2.5, masses=_federation().weights), 0.25)
    stage._catch_planters()  # 8 clients at a quarter: two may be hostile, the two colluders
    assert sorted(stage.distrusted) == list(COLLUDERS)
    assert [(client, stage_name) for client, stage_name, _ in stage.books] == [(6, "final"), (7, "final")]


def test_more_planters_than_may_be_hostile_are_taken_for_honest_misfits_and_none_is_distrusted():
    # At 1,000 sites honest clients whose K_g joins two close clusters lie midway between them, as a plant does:
    # 353 of them were distrusted (blobs K=50). Four planters where two may be hostile are not all colluders.
    final = _two_plants()
    stage = _FinalStage(final, Support(quorum=3, typical_mass=2.5, masses=final.weights), 0.2)
    with pytest.warns(UserWarning, match=r"4 clients' components .* more than the 2 clients max_hostile_fraction=0\.2"):
        stage._catch_planters()
    assert stage.distrusted == {} and stage.books == [] and stage.aggregated == {}
    # Both plants still found no cluster: the four true clusters, the lone client's and the colluders' far point.
    aggregation = stage._final_aggregation(1.0)[0]
    centroids = np.round(aggregation.global_centroids).tolist()
    assert [4.0, 0.0] not in centroids and [8.0, 4.0] not in centroids and aggregation.k_hat == 6


def test_undone_catches_keep_the_first_passes_aggregations_rather_than_compute_them_again(monkeypatch):
    # At 1,000 sites every catch is undone (more than may be hostile) and the grid was aggregated once more, 2.5 s.
    import fedica.fedgem.coordinator as coordinator

    computed = []

    def counted(*args, **kwargs):
        computed.append(dict(kwargs["distrusted"] if "distrusted" in kwargs else args[5]))
        return trusted_final_aggregation(*args, **kwargs)

    class CachingFinalStage(_FinalStage):
        _final_aggregation = coordinator.FedGEMServer._final_aggregation

        def __init__(self, *args):
            super().__init__(*args)
            self.settings.radius_outlier_factor, self.settings.max_overlap_pairs = 10.0, None

        def _final_radii(self, upsilon):
            return np.full(self.final.owners.size, upsilon)

    monkeypatch.setattr(coordinator, "trusted_final_aggregation", counted)
    final = _two_plants()
    stage = CachingFinalStage(final, Support(quorum=3, typical_mass=2.5, masses=final.weights), 0.2)
    with pytest.warns(UserWarning, match=r"4 clients' components"):
        stage._catch_planters()
    assert stage.distrusted == {}
    aggregation, excluded, planters = stage._final_aggregation(1.0)
    assert computed == [{}]  # the pass that trusted every client, and no other
    _assert_same_aggregations([(aggregation, excluded, planters)],
                              [trusted_final_aggregation(final, np.full(final.owners.size, 1.0), 10.0, stage.support,
                                                         None, {})])
