"""Properties of the server-side FedGEM mathematics (fedica.fedgem: overlaps, super-clusters, consensus, merging, tuning)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize, nnls

from fedica.fedgem.consensus import (
    _dykstra_intersection,
    _project_onto_balls,
    consensus_centers,
)
from fedica.fedgem.merging import final_aggregation, server_step, without_clusters
from fedica.fedgem.overlaps import candidate_pairs
from fedica.fedgem.superclusters import _first_appearance_labels, super_clusters
from fedica.fedgem.tuning import select_upsilon
from fedica.fedgem.union import ConstrainedUnion

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------ references (brute force)


def brute_force_pairs(centers, radii, owners):
    pairs, ratios = [], []
    m = len(radii)
    for i in range(m):
        for j in range(i + 1, m):
            if owners[i] == owners[j]:
                continue
            distance = np.linalg.norm(centers[i] - centers[j])
            if distance <= radii[i] + radii[j]:
                pairs.append((i, j))
                total = radii[i] + radii[j]
                ratios.append(distance / total if total > 0 else 0.0)
    return np.array(pairs, dtype=int).reshape(-1, 2), np.array(ratios)


def reference_super_clusters(centers, radii, owners):
    """The specification, literally: constrained union-find over all pairs by ratio."""
    pairs, ratios = brute_force_pairs(centers, radii, owners)
    m = len(radii)
    members = {i: {i} for i in range(m)}
    root = list(range(m))
    for index in sorted(range(len(ratios)), key=lambda e: (ratios[e], *pairs[e])):
        a, b = root[pairs[index][0]], root[pairs[index][1]]
        if a == b:
            continue
        if {owners[i] for i in members[a]} & {owners[i] for i in members[b]}:
            continue
        for node in members[b]:
            root[node] = a
        members[a] |= members.pop(b)
    labels, seen = np.empty(m, dtype=int), {}
    for i in range(m):
        labels[i] = seen.setdefault(root[i], len(seen))
    return labels


def closed_form_two(c1, c2, r1, r2, w1, w2):
    """docs/ALGORITHMS.md section 2.3, step 3 (weighted version), written out independently."""
    gap = np.linalg.norm(c2 - c1)
    if gap == 0:
        return c1.copy()
    fraction = np.clip(w2 / (w1 + w2), 1 - r2 / gap, r1 / gap)
    return c1 + fraction * (c2 - c1)


def in_own_ball(new_centers, centers, radii):
    slack = 1e-9 * np.maximum(1.0, np.maximum(np.abs(centers).max(axis=1), radii))
    return np.linalg.norm(new_centers - centers, axis=1) <= radii + slack


def assert_kkt_projection(point, target, centers, radii):
    """``point`` is the projection of ``target`` onto the intersection of the balls:
    feasible, and target - point is a non-negative combination of the outward normals
    of the active balls (sufficient for optimality: the problem is convex)."""
    scale = max(radii.max(), np.linalg.norm(centers - target, axis=1).max(), 1e-12)
    distance = np.linalg.norm(point - centers, axis=1)
    assert np.all(distance <= radii + 1e-7 * scale)
    active = distance >= radii - 1e-6 * scale
    residual = target - point
    if not active.any():
        assert np.linalg.norm(residual) <= 1e-6 * scale
        return
    normals = (point - centers[active]).T  # target - point = sum lambda_i (point - c_i)
    _, misfit = nnls(normals, residual)
    assert misfit <= 1e-5 * scale


# ------------------------------------------------------------------ strategies


@st.composite
def instances(draw, max_m=12, max_owners=4, max_d=3, integer=False):
    m = draw(st.integers(1, max_m))
    d = draw(st.integers(1, max_d))
    if integer:
        coordinate = st.integers(-4, 4).map(float)
        radius = st.integers(0, 6).map(lambda v: v / 2)
    else:
        coordinate = st.floats(-5, 5, allow_nan=False, allow_infinity=False)
        radius = st.one_of(st.just(0.0), st.floats(0.0, 4.0, allow_nan=False))
    centers = np.array(draw(st.lists(st.lists(coordinate, min_size=d, max_size=d),
                                     min_size=m, max_size=m)))
    radii = np.array(draw(st.lists(radius, min_size=m, max_size=m)))
    owners = np.array(draw(st.lists(st.integers(0, max_owners - 1), min_size=m, max_size=m)))
    weights = np.array(draw(st.lists(st.floats(0.1, 10.0), min_size=m, max_size=m)))
    return centers.reshape(m, d), radii, owners, weights


def random_instance(rng, m, d, n_owners, radius_decades=3):
    centers = rng.uniform(-3, 3, size=(m, d))
    radii = 10 ** rng.uniform(-radius_decades, 0.2, size=m)
    radii[rng.random(m) < 0.1] = 0.0
    duplicate = rng.random(m) < 0.1
    centers[duplicate] = centers[0]
    owners = rng.integers(n_owners, size=m)
    return centers, radii, owners


# ------------------------------------------------------------------ candidate pairs


@pytest.mark.parametrize("algorithm", ["kd_tree", "brute"])
@pytest.mark.parametrize("seed", range(8))
def test_candidate_pairs_equal_brute_force_pairs(seed, algorithm):
    rng = np.random.default_rng(seed)
    centers, radii, owners = random_instance(rng, m=300, d=int(rng.integers(1, 6)), n_owners=20)
    pairs, ratio = candidate_pairs(centers, radii, owners, algorithm=algorithm)
    expected_pairs, expected_ratio = brute_force_pairs(centers, radii, owners)
    assert pairs.shape[0] > 10  # the instance is not trivial
    np.testing.assert_array_equal(pairs, expected_pairs)
    np.testing.assert_allclose(ratio, expected_ratio, rtol=1e-12, atol=1e-15)


@FAST
@given(instances(integer=True), st.sampled_from(["kd_tree", "brute"]))
def test_candidate_pairs_equal_brute_force_on_exact_ties(instance, algorithm):
    centers, radii, owners, _ = instance
    pairs, ratio = candidate_pairs(centers, radii, owners, algorithm=algorithm)
    expected_pairs, expected_ratio = brute_force_pairs(centers, radii, owners)
    np.testing.assert_array_equal(pairs, expected_pairs)
    np.testing.assert_allclose(ratio, expected_ratio, rtol=1e-12)


# ------------------------------------------------------------------ super-clusters


@FAST
@given(st.one_of(instances(), instances(integer=True), instances(max_m=20, max_owners=3)))
def test_super_clusters_equal_the_sequential_specification(instance):
    centers, radii, owners, _ = instance
    labels = super_clusters(centers, radii, owners)
    np.testing.assert_array_equal(labels, reference_super_clusters(centers, radii, owners))


@FAST
@given(st.one_of(instances(max_m=25, max_owners=3), instances(integer=True)))
def test_no_super_cluster_holds_two_components_of_one_owner(instance):
    centers, radii, owners, _ = instance
    labels = super_clusters(centers, radii, owners)
    for label in np.unique(labels):
        members = owners[labels == label]
        assert len(set(members.tolist())) == members.size
    # First-appearance numbering.
    _, first = np.unique(labels, return_index=True)
    assert np.all(np.diff(first) > 0) and labels[0] == 0


def test_conflict_is_resolved_by_ratio_order():
    # A1 and A2 belong to client 0; B (client 1) overlaps both, A2 more tightly.
    centers = np.array([[0.0], [1.9], [3.0]])  # A1, B, A2
    radii = np.array([1.0, 1.0, 1.0])
    owners = np.array([0, 1, 0])
    np.testing.assert_array_equal(super_clusters(centers, radii, owners), [0, 1, 1])


def test_ratio_ties_are_taken_in_order_of_i_then_j():
    # (1,3) joins first; then (0,3) and (1,2) tie at ratio 0.5 and only one of the two
    # same-owner components 0 and 2 can join: (0,3) comes first.
    centers = np.array([[1.25], [0.0], [-1.0], [0.25]])
    radii = np.ones(4)
    owners = np.array([7, 8, 7, 9])
    _, ratio = candidate_pairs(centers, radii, owners)
    assert np.sum(ratio == 0.5) == 2
    np.testing.assert_array_equal(super_clusters(centers, radii, owners), [0, 0, 1, 0])
    np.testing.assert_array_equal(reference_super_clusters(centers, radii, owners), [0, 0, 1, 0])


@pytest.mark.parametrize("seed", range(3))
def test_fast_path_matches_specification_on_larger_random_instances(seed):
    rng = np.random.default_rng(50 + seed)
    centers, radii, owners = random_instance(rng, m=250, d=2, n_owners=30, radius_decades=1)
    labels = super_clusters(centers, radii, owners)
    np.testing.assert_array_equal(labels, reference_super_clusters(centers, radii, owners))
    assert labels.max() + 1 < 200  # merges happened, and conflicts (few owners) occurred


@pytest.mark.parametrize("seed", range(2))
def test_blocked_union_find_matches_specification_with_thousands_of_conflicting_edges(seed):
    """Dense overlaps and few owners: many blocks of edges conflict and are bisected."""
    rng = np.random.default_rng(70 + seed)
    m = 600
    owners = rng.integers(0, 12, size=m)
    truth = rng.normal(scale=4.0, size=(5, 3))
    centers = truth[rng.integers(0, 5, size=m)] + rng.normal(scale=0.4, size=(m, 3))
    radii = rng.uniform(0.2, 0.8, size=m)
    pairs, _ = candidate_pairs(centers, radii, owners)
    assert pairs.shape[0] > 15_000
    np.testing.assert_array_equal(super_clusters(centers, radii, owners), reference_super_clusters(centers, radii, owners))


def test_dense_overlaps_match_specification():
    """Every ball meets every other (as with a large final upsilon): after the first
    chunk nearly all edges join sets that already share an owner and are dropped in bulk."""
    rng = np.random.default_rng(90)
    n_owners, per_owner = 40, 6
    truth = rng.normal(scale=3.0, size=(per_owner, 4))
    owners = np.repeat(np.arange(n_owners), per_owner)
    centers = truth[np.tile(np.arange(per_owner), n_owners)] + rng.normal(scale=0.3, size=(owners.size, 4))
    radii = np.full(owners.size, 20.0)
    pairs, _ = candidate_pairs(centers, radii, owners)
    assert pairs.shape[0] > 20_000
    labels = super_clusters(centers, radii, owners)
    np.testing.assert_array_equal(labels, reference_super_clusters(centers, radii, owners))
    assert labels.max() + 1 == per_owner


def _union_roots(edges, node_owner, chunk_sizes):
    """Roots after the edges are given to one ConstrainedUnion in as many calls as ``chunk_sizes``."""
    union = ConstrainedUnion(node_owner)
    for part, chunk_size in zip(np.array_split(edges, len(chunk_sizes)), chunk_sizes):
        union.add_edges(part, chunk_size=chunk_size)
    return union.roots()


@pytest.mark.parametrize("chunk_size", [1, 3, 64, 10**9])
def test_constrained_union_find_does_not_depend_on_the_chunk_size(chunk_size):
    rng = np.random.default_rng(91)
    n_nodes = 400
    node_owner = rng.integers(0, 25, size=n_nodes)
    edges = rng.integers(0, n_nodes, size=(6_000, 2))
    edges = edges[edges[:, 0] != edges[:, 1]]
    expected = _union_roots(edges, node_owner, [10**9])
    roots = _union_roots(edges, node_owner, [chunk_size])
    # Edges given in several calls are taken as one sequence.
    np.testing.assert_array_equal(_first_appearance_labels(_union_roots(edges, node_owner, [chunk_size] * 3)),
                                  _first_appearance_labels(expected))
    np.testing.assert_array_equal(
        _first_appearance_labels(roots), _first_appearance_labels(expected)
    )
    for root in np.unique(roots):
        members = node_owner[roots == root]
        assert len(set(members.tolist())) == members.size


# ------------------------------------------------------------------ consensus


@pytest.mark.parametrize(
    "weights", [np.array([1.0, 1.0]), np.array([1.0, 3.0]), np.array([5.0, 0.5])]
)
@pytest.mark.parametrize("seed", range(5))
def test_two_member_consensus_is_the_corrected_formula_and_the_dykstra_point(weights, seed):
    rng = np.random.default_rng(seed)
    d = 3
    c1 = rng.normal(size=d)
    c2 = c1 + rng.normal(size=d)
    gap = np.linalg.norm(c2 - c1)
    r1, r2 = rng.uniform(0.2, 1.0, size=2) * gap * 1.2
    if r1 + r2 < gap:
        r2 = gap - r1 + 0.1
    radii = np.array([r1, r2])
    centers = np.vstack([c1, c2])
    expected = closed_form_two(c1, c2, r1, r2, *weights)
    new = consensus_centers(centers, radii, weights, np.array([4, 4]))
    np.testing.assert_allclose(new, np.vstack([expected, expected]), atol=1e-12)

    target = weights @ centers / weights.sum()
    projection, feasible = _dykstra_intersection(
        centers, radii, np.zeros(2, dtype=int), target[None]
    )
    assert feasible[0]
    np.testing.assert_allclose(projection[0], expected, atol=1e-7 * gap)
    assert_kkt_projection(expected, target, centers, radii)


def test_two_member_formula_moves_towards_the_other_ball():
    # The paper's printed sign would move M_1 away from M_2, out of the other ball.
    centers = np.array([[0.0, 0.0], [2.0, 0.0]])
    radii = np.array([1.5, 0.8])
    new = consensus_centers(centers, radii, np.ones(2), np.zeros(2, dtype=int))
    # Intersection on the axis is [1.2, 1.5]; the midpoint 1.0 is clipped up to 1.2.
    np.testing.assert_allclose(new, [[1.2, 0.0], [1.2, 0.0]])
    heavy_second = consensus_centers(centers, radii, np.array([1.0, 9.0]), np.zeros(2, dtype=int))
    np.testing.assert_allclose(heavy_second, [[1.5, 0.0], [1.5, 0.0]])  # 1.8 clipped to 1.5


@FAST
@given(
    st.integers(3, 6),
    st.integers(1, 4),
    st.integers(0, 2**32 - 1),
    st.sampled_from([0.0, -3e5, 1e6]),
)
# Projections onto a corner of several balls that Dykstra needs about 1,000 sweeps for:
# accepted after 300, within 2e-8 and 2e-4 of the scale.
@example(6, 4, 1490, 0.0)
@example(3, 1, 665, 0.0)
# Dykstra stalls and falls back (see below).
@example(5, 1, 3403775767, 1e6)
@example(4, 1, 1286656, 0.0)
def test_many_member_consensus_is_the_projection_onto_the_intersection(k, d, seed, offset):
    rng = np.random.default_rng(seed)
    anchor = offset + rng.normal(size=d)
    centers = anchor + rng.normal(size=(k, d))
    # Radii large enough that every ball contains ``anchor``: the intersection is non-empty.
    radii = np.linalg.norm(centers - anchor, axis=1) + rng.uniform(0.05, 1.0, size=k)
    weights = rng.uniform(0.5, 3.0, size=k)
    new = consensus_centers(centers, radii, weights, np.zeros(k, dtype=int))
    target = weights @ centers / weights.sum()
    scale = max(radii.max(), np.linalg.norm(centers - target, axis=1).max())
    spread = np.abs(new - new[0]).max()
    if spread <= 1e-7 * scale:
        assert_kkt_projection(new[0], target, centers, radii)
    elif spread <= 2e-4 * scale:
        # Accepted after max_iter sweeps within late_feasibility_tol (1e-4 of the scale):
        # close to the projection computed independently.
        reference = minimize(
            lambda x: np.sum((x - target) ** 2), anchor, method="SLSQP",
            constraints=[{"type": "ineq", "fun": lambda x: radii**2 - np.sum((x - centers) ** 2, axis=1)}],
            options={"ftol": 1e-14},
        ).x
        np.testing.assert_allclose(new, np.tile(reference, (k, 1)), atol=1e-3 * scale)
    else:
        # About 1 instance in 3,000: Dykstra stalls (its increments build up for hundreds of
        # sweeps without the iterate moving) and gives up; the documented fallback applies.
        np.testing.assert_allclose(new, _project_onto_balls(np.tile(target, (k, 1)), centers, radii))


def test_dykstra_resolves_a_random_batch_of_non_empty_intersections():
    """The stall above is rare: of 300 random instances, at most one falls back."""
    rng = np.random.default_rng(20)
    fallbacks = 0
    for _ in range(300):
        k, d = int(rng.integers(3, 7)), int(rng.integers(1, 5))
        anchor = rng.normal(size=d)
        centers = anchor + rng.normal(size=(k, d))
        radii = np.linalg.norm(centers - anchor, axis=1) + rng.uniform(0.05, 1.0, size=k)
        new = consensus_centers(centers, radii, rng.uniform(0.5, 3.0, size=k), np.zeros(k, dtype=int))
        fallbacks += np.abs(new - new[0]).max() > 1e-8
    assert fallbacks <= 1


def test_chained_overlaps_project_the_weighted_mean_onto_each_own_ball():
    # A meets B, B meets C, A misses C: one super-cluster, empty common intersection.
    centers = np.array([[0.0, 0.0], [1.8, 0.0], [3.6, 0.0]])
    radii = np.array([1.0, 1.0, 1.0])
    owners = np.array([0, 1, 2])
    weights = np.array([1.0, 1.0, 2.0])
    step = server_step(centers, radii**2, owners, weights)
    assert step.n_super_clusters == 1
    mean = weights @ centers / weights.sum()  # (2.25, 0)
    expected = np.array([[1.0, 0.0], [2.25, 0.0], [2.6, 0.0]])
    np.testing.assert_allclose(mean, [2.25, 0.0])
    np.testing.assert_allclose(step.new_centers, expected, atol=1e-12)
    assert in_own_ball(step.new_centers, centers, radii).all()


def test_dykstra_certifies_an_empty_intersection_quickly():
    centers = np.array([[0.0, 0.0], [1.8, 0.0], [3.6, 0.0], [1.8, 0.5]])
    radii = np.ones(4)
    _, feasible = _dykstra_intersection(
        centers, radii, np.zeros(4, dtype=int), centers.mean(axis=0)[None],
        max_iter=50, late_feasibility_tol=np.inf,
    )
    assert not feasible[0]


def test_singletons_keep_their_centre_and_pairs_of_one_owner_do_not_merge():
    centers = np.array([[0.0, 0.0], [0.5, 0.0], [10.0, 10.0]])
    eps = np.array([1.0, 1.0, 1.0])
    step = server_step(centers, eps, np.array([3, 3, 4]), np.ones(3))
    assert step.n_super_clusters == 3
    np.testing.assert_array_equal(step.new_centers, centers)


@FAST
@given(st.one_of(instances(max_m=15, max_owners=4, max_d=3), instances(integer=True)))
def test_ball_invariant_after_server_step(instance):
    centers, radii, owners, weights = instance
    step = server_step(centers, radii**2, owners, weights)
    assert in_own_ball(step.new_centers, centers, radii).all()
    assert step.n_super_clusters == step.labels.max() + 1
    # Members of a super-cluster share the new centre whenever their balls share a point.
    for label in range(step.n_super_clusters):
        members = np.flatnonzero(step.labels == label)
        if members.size == 1:
            np.testing.assert_array_equal(step.new_centers[members[0]], centers[members[0]])


@pytest.mark.parametrize("seed", range(4))
def test_ball_invariant_on_random_instances_with_chains(seed):
    rng = np.random.default_rng(seed)
    m, d = 400, 3
    # Points strung along lines make chained overlaps common.
    base = rng.normal(scale=5, size=(20, d))
    direction = rng.normal(size=(20, d))
    t = rng.uniform(0, 4, size=m)
    line = rng.integers(20, size=m)
    centers = base[line] + t[:, None] * direction[line] + 0.05 * rng.normal(size=(m, d))
    radii = rng.uniform(0.1, 0.8, size=m)
    owners = rng.integers(60, size=m)
    weights = rng.uniform(1, 100, size=m)
    step = server_step(centers, radii**2, owners, weights)
    assert in_own_ball(step.new_centers, centers, radii).all()
    sizes = np.bincount(step.labels)
    agreeing = disagreeing = 0
    for label in np.flatnonzero(sizes >= 2):
        members = np.flatnonzero(step.labels == label)
        assert len(set(owners[members].tolist())) == members.size
        shared = step.new_centers[members[0]]
        common = np.linalg.norm(shared - centers[members], axis=1) <= radii[members] + 1e-12
        if common.all():  # a common point exists, so every member must have received it
            np.testing.assert_allclose(
                step.new_centers[members], np.broadcast_to(shared, (members.size, d)), atol=1e-9
            )
        if sizes[label] >= 3:
            agreeing += common.all()
            disagreeing += not common.all()
    assert agreeing > 0 and disagreeing > 0  # Dykstra's point and the chained fallback


def test_consensus_validates_weights():
    with pytest.raises(ValueError, match="weights"):
        consensus_centers(
            np.zeros((2, 2)), np.ones(2), np.array([1.0, 0.0]), np.zeros(2, dtype=int)
        )


# ------------------------------------------------------------------ final aggregation


def test_final_aggregation_recovers_clusters_under_huge_radii_thanks_to_the_owner_rule():
    rng = np.random.default_rng(0)
    truth = np.array([[0.0, 0.0], [8.0, 0.0], [0.0, 8.0]])
    n_clients = 6
    centers = np.vstack([truth + 0.1 * rng.normal(size=truth.shape) for _ in range(n_clients)])
    owners = np.repeat(np.arange(n_clients), 3)
    truth_label = np.tile(np.arange(3), n_clients)
    weights = rng.uniform(1, 5, size=centers.shape[0])
    result = final_aggregation(centers, np.full(centers.shape[0], 1e4), owners, weights)
    assert result.k_hat == 3
    for label in range(3):
        members = result.labels == label
        assert np.unique(truth_label[members]).size == 1
        np.testing.assert_allclose(
            result.global_centroids[label],
            weights[members] @ centers[members] / weights[members].sum(),
        )


def test_final_aggregation_with_zero_radii_keeps_every_component():
    centers = np.array([[0.0], [1.0], [2.0]])
    result = final_aggregation(centers, np.zeros(3), np.arange(3), np.ones(3))
    assert result.k_hat == 3
    np.testing.assert_array_equal(result.global_centroids, centers)


# ------------------------------------------------------------------ upsilon selection


def test_select_upsilon_prefers_candidates_within_the_guard():
    # Best silhouette at k_hat=36 is ignored while a candidate stays below the guard.
    assert select_upsilon([0.2, 0.5, 0.9], [4, 6, 36], guard=6.0) == 1
    # None within the guard: the highest silhouette overall.
    assert select_upsilon([0.2, 0.5, 0.9], [40, 36, 38], guard=6.0) == 2


def test_select_upsilon_ties_go_to_smaller_k_hat_then_smaller_index():
    assert select_upsilon([0.7, 0.7 + 1e-13, 0.7], [5, 3, 3], guard=10) == 1
    assert select_upsilon([0.7, 0.7, 0.7], [4, 3, 3], guard=10) == 1
    assert select_upsilon([0.7, 0.7 + 1e-9, 0.7], [5, 9, 3], guard=10) == 1  # not a tie


def test_select_upsilon_skips_nan_and_rejects_all_nan():
    assert select_upsilon([np.nan, 0.1, 0.3], [2, 3, 4], guard=5) == 2
    assert select_upsilon([0.9, np.nan, 0.3], [8, 3, 9], guard=5) == 0  # NaN within guard ignored
    with pytest.raises(ValueError, match="NaN"):
        select_upsilon([np.nan, np.nan], [2, 3], guard=5)
    with pytest.raises(ValueError, match="k_hats"):
        select_upsilon([0.1, 0.2], [2], guard=5)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.booleans())
def test_dropping_whole_clusters_equals_aggregating_the_rest_again(seed, dense):
    """The constrained union-find of the components outside some final clusters is the same partition:
    many owner conflicts (few owners), ties on a grid, and above 1,000 components the levelled path."""
    rng = np.random.default_rng(seed)
    m = 1_500 if dense else int(rng.integers(5, 200))
    if dense:
        centers = rng.normal(scale=6.0, size=(12, 4))[rng.integers(0, 12, m)] + rng.normal(scale=0.3, size=(m, 4))
        radii = rng.uniform(0.3, 1.0, m)
    else:
        centers = rng.integers(-4, 5, size=(m, 2)).astype(float)
        radii = rng.integers(0, 5, size=m) / 2
    owners = rng.integers(0, int(rng.integers(2, 40)) if not dense else 300, size=m)
    weights = rng.uniform(0.5, 3.0, m)
    whole = final_aggregation(centers, radii ** 2, owners, weights)
    dropped = rng.random(whole.k_hat) < rng.uniform(0.1, 0.9)
    kept = ~dropped[whole.labels]
    derived = without_clusters(whole, centers, weights, dropped)
    again = final_aggregation(centers[kept], radii[kept] ** 2, owners[kept], weights[kept])
    np.testing.assert_array_equal(derived.labels, again.labels)
    assert derived.k_hat == again.k_hat
    np.testing.assert_array_equal(derived.global_centroids, again.global_centroids)
