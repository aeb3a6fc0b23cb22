"""Super-clusters by levels of overlap ratio (fedica.fedgem.levelled) against the specification."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedica.fedgem.levelled import levelled_labels, ratio_levels
from fedica.fedgem.overlaps import TooManyOverlaps, candidate_pairs
from fedica.fedgem.superclusters import _first_appearance_labels, nested_super_clusters, super_clusters
from fedica.fedgem.union import unique_keys


def specification(centers, radii, owners):
    """Every overlapping pair by (ratio, i, j); a union is skipped when the sets share an owner."""
    pairs, ratio = candidate_pairs(centers, radii, owners, algorithm="brute")
    root = list(range(len(radii)))
    owner_sets = [{owner} for owner in owners.tolist()]
    for index in np.lexsort((pairs[:, 1], pairs[:, 0], ratio)).tolist():
        a, b = root[pairs[index, 0]], root[pairs[index, 1]]
        while root[a] != a:
            a = root[a]
        while root[b] != b:
            b = root[b]
        if a != b and owner_sets[a].isdisjoint(owner_sets[b]):
            root[b] = a
            owner_sets[a] |= owner_sets[b]
    return _first_appearance_labels([_find(root, i) for i in range(len(root))])


def _find(root, i):
    while root[i] != i:
        i = root[i]
    return i


def clustered(seed, n_clients=300, n_true=8, d=10, spread=0.1, radius=0.25):
    """Every client holds 3 to 5 of ``n_true`` clusters, a few of them twice (the conflicts)."""
    rng = np.random.default_rng(seed)
    truth = rng.normal(scale=10.0, size=(n_true, d))
    ids = [rng.choice(n_true, rng.integers(3, 6), replace=bool(rng.random() < 0.1)) for _ in range(n_clients)]
    owners = np.repeat(np.arange(n_clients), [len(i) for i in ids])
    members = np.concatenate(ids)
    centers = truth[members] + rng.normal(scale=spread, size=(members.size, d))
    return centers, radius * rng.uniform(0.5, 1.5, size=members.size), owners


@pytest.mark.parametrize("seed", range(4))
def test_dense_federations_take_the_levels_and_equal_the_specification(seed):
    centers, radii, owners = clustered(seed)
    levels, _ = ratio_levels(centers, radii, owners)
    assert levels is not None and len(levels) >= 3 and levels[-1] == 1.0
    labels = super_clusters(centers, radii, owners)
    expected = specification(centers, radii, owners)
    np.testing.assert_array_equal(labels, expected)
    assert len(set(zip(owners.tolist(), labels.tolist()))) == owners.size  # the same-client rule held
    assert 8 < labels.max() + 1 < 40  # conflicts split some true clusters, most merged


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 2**32 - 1),
    st.lists(st.floats(0.0, 0.99), min_size=0, max_size=4),
    st.booleans(),
)
def test_any_levels_give_the_specification(seed, thresholds, on_a_grid):
    """Levels only change which pairs are listed, never the result: ties on a level's
    threshold, zero radii, duplicated centres and every set size included."""
    rng = np.random.default_rng(seed)
    m = int(rng.integers(20, 160))
    if on_a_grid:  # exact ties of ratios, some exactly on a threshold
        centers = rng.integers(-3, 4, size=(m, 2)).astype(float)
        radii = rng.integers(0, 5, size=m) / 2
        thresholds = thresholds + [0.5]
    else:
        centers = rng.normal(size=(m, 3))
        radii = rng.uniform(0, 1.2, size=m) * (rng.random(m) > 0.1)
    owners = rng.integers(0, int(rng.integers(3, 12)), size=m)
    levels = sorted(set(thresholds)) + [1.0]
    owner_code = np.unique(owners, return_inverse=True)[1]
    labels = _first_appearance_labels(levelled_labels(centers, radii, owner_code, levels))
    np.testing.assert_array_equal(labels, specification(centers, radii, owners))


def test_sparse_overlaps_keep_the_full_list():
    centers, radii, owners = clustered(0, radius=0.02)
    assert ratio_levels(centers, radii, owners)[0] is None


def test_the_budget_bounds_what_one_level_lists():
    centers, radii, owners = clustered(1)
    all_pairs = candidate_pairs(centers, radii, owners)[0].shape[0]
    # Far fewer pairs than overlap are listed, so half of them is enough ...
    np.testing.assert_array_equal(
        super_clusters(centers, radii, owners, max_pairs=all_pairs // 2), super_clusters(centers, radii, owners)
    )
    # ... but not fewer than the first level's few pairs per component.
    with pytest.raises(TooManyOverlaps, match="would be listed, more than max_overlap_pairs=1000"):
        super_clusters(centers, radii, owners, max_pairs=1000)


@pytest.mark.parametrize("shared_owner", [False, True])
def test_two_large_sets_join_at_a_later_level_unless_they_share_an_owner(shared_owner):
    """Two tight groups of 40 balls meet only with ratios near 0.75: at the second level both
    are large sets, and only their cross pairs can join them."""
    rng = np.random.default_rng(5)
    centers = np.concatenate([rng.normal(scale=0.05, size=(40, 2)), [1.5, 0] + rng.normal(scale=0.05, size=(40, 2))])
    radii = np.ones(80)
    owners = np.arange(80)
    if shared_owner:
        owners[79] = owners[0]
    owner_code = np.unique(owners, return_inverse=True)[1]
    labels = _first_appearance_labels(levelled_labels(centers, radii, owner_code, [0.3, 1.0]))
    np.testing.assert_array_equal(labels, specification(centers, radii, owners))
    assert labels.max() + 1 == (2 if shared_owner else 1)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-(2**62), 2**62), max_size=300), st.booleans())
def test_unique_keys_equal_numpy_unique(values, few_distinct):
    keys = np.array(values, dtype=np.int64) % (7 if few_distinct else 2**62)
    distinct, inverse = unique_keys(keys, return_inverse=True)
    expected, expected_inverse = np.unique(keys, return_inverse=True)
    np.testing.assert_array_equal(distinct, expected)
    np.testing.assert_array_equal(inverse, expected_inverse.reshape(-1))
    np.testing.assert_array_equal(unique_keys(keys), expected)


# ------------------------------------------------------------------ nested thresholds (one sweep for a grid)

THRESHOLDS = [0.05, 0.2, 0.45, 0.7, 1.0]


@pytest.mark.parametrize("radius", [0.02, 0.25, 1.0])
def test_one_sweep_gives_each_thresholds_super_clusters(radius):
    # radius 0.02: sparse overlaps (the full list); 0.25 and 1.0: dense (the levels), with owner conflicts.
    centers, radii, owners = clustered(2, radius=radius)
    swept = nested_super_clusters(centers, radii, owners, THRESHOLDS)
    for threshold, labels in zip(THRESHOLDS, swept):
        np.testing.assert_array_equal(labels, specification(centers, threshold * radii, owners))
    counts = [int(labels.max()) + 1 for labels in swept]
    assert counts == sorted(counts, reverse=True)
    if radius > 0.02:
        assert counts[0] > counts[-1]  # the thresholds matter: the partitions differ
    for finer, coarser in zip(swept, swept[1:]):  # each refines the next
        assert all(np.unique(coarser[finer == label]).size == 1 for label in np.unique(finer))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(4, 60), st.lists(st.floats(0.01, 1.0), min_size=1, max_size=5))
def test_one_sweep_equals_the_specification_on_small_federations(seed, m, thresholds):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(m, 2)).round(1)  # ties in distance
    radii = rng.choice([0.0, 0.3, 0.6], size=m)  # ties in radius, and zero radii
    owners = rng.integers(0, max(2, m // 3), size=m)
    thresholds = sorted(thresholds)
    pairs, ratio = candidate_pairs(centers, radii, owners, algorithm="brute")
    for threshold, labels in zip(thresholds, nested_super_clusters(centers, radii, owners, thresholds)):
        scaled = threshold * radii
        expected = specification(centers, scaled, owners)
        # The documented exceptions: a pair whose ratio meets a threshold to the last bits may fall on either side
        # of it, and two ratios equal at radii (ties taken in (i, j) order) may differ in their last bits at
        # t * radii, or the other way round, which orders the two pairs otherwise.
        near_threshold = np.any(np.isclose(ratio, threshold, rtol=1e-12, atol=0))
        within = ratio <= threshold
        scaled_pairs, scaled_ratio = candidate_pairs(centers, scaled, owners, algorithm="brute")
        reordered = not (np.array_equal(pairs[within], scaled_pairs)
                         and np.array_equal(np.lexsort((pairs[within, 1], pairs[within, 0], ratio[within])),
                                            np.lexsort((scaled_pairs[:, 1], scaled_pairs[:, 0], scaled_ratio))))
        if not (near_threshold or reordered):
            np.testing.assert_array_equal(labels, expected)


def test_a_sweep_over_the_budget_leaves_the_thresholds_it_did_not_reach():
    centers, radii, owners = clustered(1)
    swept = nested_super_clusters(centers, radii, owners, THRESHOLDS, max_pairs=1000)
    reached = [labels is not None for labels in swept]
    assert reached == sorted(reached, reverse=True) and 0 < sum(reached) < len(THRESHOLDS)
    for threshold, labels in zip(THRESHOLDS, swept):
        if labels is not None:
            np.testing.assert_array_equal(labels, specification(centers, threshold * radii, owners))
    small = clustered(1, n_clients=100)  # few enough components for the full list, which the budget refuses at once
    assert nested_super_clusters(*small, THRESHOLDS, max_pairs=10) == [None] * len(THRESHOLDS)
    all_pairs = candidate_pairs(centers, radii, owners)[0].shape[0]
    swept = nested_super_clusters(centers, radii, owners, THRESHOLDS, max_pairs=all_pairs // 2)
    for threshold, labels in zip(THRESHOLDS, swept):
        np.testing.assert_array_equal(labels, super_clusters(centers, threshold * radii, owners))


def test_thresholds_must_increase_within_zero_and_one():
    centers, radii, owners = clustered(0, n_clients=5)
    for thresholds in ([0.5, 0.2], [0.0, 1.0], [0.5, 1.5]):
        with pytest.raises(ValueError, match="thresholds must increase within"):
            nested_super_clusters(centers, radii, owners, thresholds)
