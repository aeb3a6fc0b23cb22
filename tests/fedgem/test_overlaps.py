"""The overlap search (fedica.fedgem.overlaps): radius classes, KD-trees against brute force, the
sampled count of overlapping pairs and the memory budget."""

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedica.fedgem.overlaps import (
    TooManyOverlaps,
    radius_classes,
    candidate_pairs,
    estimated_overlapping_pairs,
    lookups_by_reach,
)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(st.lists(st.floats(0, 1e6) | st.just(0.0), min_size=1, max_size=60))
def test_radius_classes_hold_radii_within_a_factor_four_below_their_largest(radii):
    radii = np.array(radii)
    classes = radius_classes(radii)
    largest = [radii[classes == c].max() for c in range(classes.max() + 1)]
    assert set(classes.tolist()) == set(range(len(largest)))
    assert all(b <= a / 4 for a, b in itertools.pairwise(largest))  # classes descend, a factor 4 apart
    for c, top in enumerate(largest):
        members = radii[classes == c]
        assert np.all((members > top / 4) | (top <= radii.max() * 2.0**-52))


@pytest.mark.parametrize("overlap", [0.4, 2.0])
def test_kd_tree_and_brute_force_agree_in_ten_dimensions(overlap):
    centers, radii, owners = _ten_dimensional_clusters(overlap=overlap)
    tree_pairs, tree_ratio = candidate_pairs(centers, radii, owners, algorithm="kd_tree")
    brute_pairs, brute_ratio = candidate_pairs(centers, radii, owners, algorithm="brute")
    np.testing.assert_array_equal(tree_pairs, brute_pairs)
    np.testing.assert_allclose(tree_ratio, brute_ratio, rtol=1e-14)
    assert brute_pairs.shape[0] > (1000 if overlap > 1 else 0)


def _ten_dimensional_clusters(seed=3, members=150, overlap=2.0):
    rng = np.random.default_rng(seed)
    truth = rng.normal(scale=10.0, size=(10, 10))
    owners = np.repeat(np.arange(members), 10)
    centers = truth[np.tile(np.arange(10), members)] + rng.normal(scale=0.1, size=(10 * members, 10))
    return centers, overlap * 0.1 * rng.uniform(0.5, 1.5, size=10 * members), owners


def test_the_sampled_estimate_of_overlapping_pairs_is_within_ten_percent():
    centers, radii, owners = _ten_dimensional_clusters()
    exact = candidate_pairs(centers, radii, owners)[0].shape[0]
    assert exact > 40_000
    assert abs(estimated_overlapping_pairs(centers, radii, owners, random_state=1) - exact) < 0.1 * exact


def test_a_pair_budget_refuses_before_listing_and_changes_nothing_within_it():
    centers, radii, owners = _ten_dimensional_clusters()
    pairs, ratio = candidate_pairs(centers, radii, owners)
    with pytest.raises(TooManyOverlaps, match=f"more than max_overlap_pairs={pairs.shape[0] // 2}"):
        candidate_pairs(centers, radii, owners, max_pairs=pairs.shape[0] // 2)
    budgeted, budgeted_ratio = candidate_pairs(centers, radii, owners, max_pairs=2 * pairs.shape[0])
    np.testing.assert_array_equal(budgeted, pairs)
    np.testing.assert_array_equal(budgeted_ratio, ratio)


def test_candidate_pairs_validates_input():
    with pytest.raises(ValueError, match="radii"):
        candidate_pairs(np.zeros((3, 2)), np.array([1.0, -1.0, 1.0]), np.arange(3))
    with pytest.raises(ValueError, match="owners"):
        candidate_pairs(np.zeros((3, 2)), np.ones(3), np.array([0.5, 1.0, 2.0]))
    with pytest.raises(ValueError, match="centers"):
        candidate_pairs(np.zeros(3), np.ones(3), np.arange(3))
    with pytest.raises(ValueError, match="algorithm"):
        candidate_pairs(np.zeros((3, 2)), np.ones(3), np.arange(3), algorithm="ball_tree")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.integers(1, 3000), st.floats(0.0, 3.0))
def test_lookups_by_reach_find_every_target_within_the_two_reaches(seed, n_targets, spread):
    # Reaches spread over orders of magnitude (and zeros): several groups, each looked up with its largest.
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(n_targets + 50, 10))
    queries, targets = np.arange(50), np.arange(50, n_targets + 50)
    reach = np.exp(rng.normal(scale=spread, size=centers.shape[0])) * (rng.random(centers.shape[0]) > 0.05)
    query, target = lookups_by_reach(centers, queries, targets, reach[queries], reach[targets])
    distance = np.linalg.norm(centers[queries][:, None] - centers[targets][None], axis=2)
    within = np.argwhere(distance <= reach[queries][:, None] + reach[targets][None])
    found = set(zip(query.tolist(), target.tolist()))
    assert {(int(queries[i]), int(targets[j])) for i, j in within} <= found
    assert len(found) == query.size  # no pair twice
