"""Super-clusters of densely overlapping balls without listing every overlapping pair.

The constrained union-find (:mod:`fedica.fedgem.superclusters`) takes the overlapping pairs in
increasing overlap ratio. Once the pairs up to some ratio ``t`` are taken, a later pair can only
change the sets when its two ends lie in distinct sets that share no owner: a pair inside one set
would find one root, and a pair between sets sharing an owner would be skipped (sets only grow,
so both stay so). The pairs are therefore taken in levels of ratio, ``t_1 < t_2 < ... < 1``, and a
level lists only the pairs that can still matter at its start: those between two small sets
(fewer than ``_SMALL_SET`` members), and those between a large set and a set that shares no owner
with it, when their bounding balls come within reach. The pairs inside large sets, which are most of them when
every ball of a true cluster meets every other (``K (G/2)^2`` with ``G`` clients), are never
listed. The result is the same partition as the full list's, pair order and ties included.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree

from fedica.fedgem.overlaps import (
    TooManyOverlaps,
    larger_end_lookups,
    lookups_by_reach,
    pair_distances,
    radius_classes,
    sampled_overlaps,
    spatial_order,
)
from fedica.fedgem.union import ConstrainedUnion, unique_keys

# Sets with fewer members than this count as small: their pairs are listed at every level.
_SMALL_SET = 32

# The first level is expected to hold about this many pairs per component, and each further
# level this many times the pairs of the one before (from the sampled ratios).
_FIRST_LEVEL_PAIRS_PER_COMPONENT = 4
_LEVEL_GROWTH = 4

# Levels pay when the overlapping pairs are many per component; the sample must hold enough
# overlapping pairs for their ratio quantiles to mean something.
_MIN_PAIRS_PER_COMPONENT = 16
_MIN_SAMPLED_HITS = 64
_QUICK_SAMPLES = 2**14


def ratio_levels(centers, radii, owners):
    """The ratio thresholds ``t_1 < ... < 1`` of the levels, or None where levels do not pay.

    Parameters
    ----------
    centers : ndarray of shape (m, d)
    radii : ndarray of shape (m,)
    owners : ndarray of shape (m,), int

    Returns
    -------
    levels : list of float or None
        From the overlap ratios of a random sample of pairs: ``t_l`` is the quantile at which
        ``4 * 4^(l-1)`` pairs per component are expected, the last is 1.
    sample : fedica.fedgem.overlaps.SampledOverlaps
        The sample (it also bounds what every level lists, :func:`levelled_labels`).
    """
    m = centers.shape[0]
    # A small sample first: most federations are far from dense, and the full one costs 50 ms.
    quick = sampled_overlaps(centers, radii, owners, n_samples=_QUICK_SAMPLES)
    if quick.pairs_per_hit * quick.ratio.shape[0] < _MIN_PAIRS_PER_COMPONENT * m / 2:
        return None, quick
    sample = sampled_overlaps(centers, radii, owners)
    expected = sample.pairs_per_hit * sample.ratio.shape[0]
    if sample.ratio.shape[0] < _MIN_SAMPLED_HITS or expected < _MIN_PAIRS_PER_COMPONENT * m:
        return None, sample
    share = _FIRST_LEVEL_PAIRS_PER_COMPONENT * m / expected
    shares = []
    while share < 1:
        shares.append(share)
        share *= _LEVEL_GROWTH
    thresholds = np.unique(np.quantile(sample.ratio, shares)).tolist()
    return [t for t in thresholds if t < 1] + [1.0], sample


def levelled_labels(centers, radii, owner_code, levels, *, sample=None, max_pairs=None):
    """Roots (m,) of the constrained union-find over all overlapping pairs, level by level.

    The last of :func:`levelled_sweep`'s snapshots; its parameters.
    """
    roots = None
    for _, roots in levelled_sweep(centers, radii, owner_code, levels, sample=sample, max_pairs=max_pairs):
        pass
    return roots


def levelled_sweep(centers, radii, owner_code, levels, *, sample=None, max_pairs=None):
    """The constrained union-find over all overlapping pairs, level by level, seen after each level.

    After the level that ends at ``t`` the sets are those of the pairs of ratio at most ``t``
    (:func:`fedica.fedgem.superclusters.nested_super_clusters` reads them as the partitions of
    the balls of radii ``t * radii``).

    Parameters
    ----------
    centers : ndarray of shape (m, d)
    radii : ndarray of shape (m,)
    owner_code : ndarray of shape (m,), int
        Owners numbered ``0..n_owners-1``.
    levels : list of float
        Increasing ratio thresholds, the last 1 (:func:`ratio_levels`).
    sample : fedica.fedgem.overlaps.SampledOverlaps or None, default=None
        Random overlapping pairs, from which every level's pairs between distinct sets are
        estimated before they are listed (needed with ``max_pairs``).
    max_pairs : int or None, default=None
        Memory budget: :class:`fedica.fedgem.overlaps.TooManyOverlaps` when a level is
        expected to list more pairs than this.

    Yields
    ------
    threshold : float
        The level's end.
    roots : ndarray of shape (m,), int
        The root of every component's set once the level's pairs are taken.
    """
    m = centers.shape[0]
    # The geometry runs in spatial order (cache); the pairs' order and ties use the original rows.
    spatial = spatial_order(centers)
    local_centers, local_radii = centers[spatial], radii[spatial]
    classes = radius_classes(local_radii)
    union = ConstrainedUnion(owner_code)
    previous = -1.0
    roots = union.roots()
    for threshold in levels:
        if max_pairs is not None:
            expected = sample.pairs_per_hit * _sampled_listings(sample, previous, threshold, roots, union)
            if expected > max_pairs:
                raise TooManyOverlaps(
                    f"about {expected:.3g} pairs of the {m} balls with overlap ratios in ({max(previous, 0):.3g},"
                    f" {threshold:.3g}] would be listed, more than max_overlap_pairs={max_pairs} (about 110 bytes each)"
                )
        first, second = _live_candidates(
            local_centers, threshold * local_radii, classes, roots[spatial], union
        )
        first, second = spatial[first], spatial[second]
        keep = (owner_code[first] != owner_code[second]) & (roots[first] != roots[second])
        first, second = np.minimum(first[keep], second[keep]), np.maximum(first[keep], second[keep])
        distance = pair_distances(centers, first, second)
        radius_sum = radii[first] + radii[second]
        ratio = np.divide(distance, radius_sum, out=np.zeros_like(distance), where=radius_sum > 0)
        keep = (distance <= radius_sum) & (ratio > previous) & (ratio <= threshold)
        # A pair found from both its ends is taken once. Only the level's pairs are sorted: most of those
        # listed lie in earlier levels (G=10,000: 3 to 22 million listed a level, 0.2 to 1.4 million kept).
        key, inverse = unique_keys(first[keep] * m + second[keep], return_inverse=True)
        first, second = np.divmod(key, m)
        kept_ratio, ratio = ratio[keep], np.empty(key.shape[0])
        ratio[inverse] = kept_ratio  # a pair listed twice has one ratio
        # Ties in their (i, j) order, as in the full list (stable sort of lexicographic pairs).
        order = np.argsort(ratio, kind="stable")
        union.add_edges(np.column_stack([first[order], second[order]]))
        previous = threshold
        roots = union.roots()
        yield threshold, roots


def _sampled_listings(sample, previous, threshold, roots, union):
    """How many of the sampled overlapping pairs a level would list: ratio in the level, in
    distinct sets, and both ends in small sets or the two sets joinable."""
    in_level = (sample.ratio > previous) & (sample.ratio <= threshold)
    first, second = roots[sample.first[in_level]], roots[sample.second[in_level]]
    sizes = np.bincount(roots, minlength=roots.shape[0])
    distinct = first != second
    first, second = first[distinct], second[distinct]
    both_small = (sizes[first] < _SMALL_SET) & (sizes[second] < _SMALL_SET)
    joinable = [union.joinable(a, b) for a, b in zip(first[~both_small].tolist(), second[~both_small].tolist())]
    return int(both_small.sum()) + int(np.count_nonzero(joinable))


def _live_candidates(centers, reach, classes, roots, union):
    """Candidate pairs (index arrays, in the given row order) within ``reach`` that may still
    join two sets: both ends in small sets, a small end and a large set it may join, or ends in
    two joinable large sets near each other."""
    sizes = np.bincount(roots, minlength=roots.shape[0])
    small = np.flatnonzero(sizes[roots] < _SMALL_SET)
    # Pairs of two small ends, from their larger end.
    found = [larger_end_lookups(centers, reach, classes, small, small)]
    large_roots = np.flatnonzero(sizes >= _SMALL_SET)
    if large_roots.size:
        members, middle, extent = _bounding_balls(centers, reach, roots, large_roots)
        found.extend(_small_to_large_candidates(centers, reach, roots, small, large_roots, members, middle, extent, union))
        if large_roots.size > 1:
            found.extend(_large_set_candidates(centers, reach, classes, large_roots, members, middle, extent, union))
    return np.concatenate([f for f, _ in found]), np.concatenate([s for _, s in found])


def _bounding_balls(centers, reach, roots, large_roots):
    """Each large set's members (row arrays), middle (its centres' mean) and extent: no member's
    reach goes further than the extent from the middle."""
    in_large = np.flatnonzero(np.isin(roots, large_roots))
    by_set = in_large[np.argsort(roots[in_large], kind="stable")]
    members = np.split(by_set, np.cumsum(np.bincount(roots[by_set])[large_roots])[:-1])
    middle = np.array([centers[rows].mean(axis=0) for rows in members])
    extent = np.array([
        np.linalg.norm(centers[rows] - centre, axis=1).max() + reach[rows].max()
        for rows, centre in zip(members, middle)
    ])
    return members, middle, extent


def _small_to_large_candidates(centers, reach, roots, small, large_roots, members, middle, extent, union):
    """Candidate pairs of a small-set member and a large set's member, for the large sets within the
    small member's reach that its set may join: a small set inside a large one of a shared owner
    (a client's second component in a cluster that holds its first) meets hundreds of members,
    none of which can ever join it (sets only grow, so they keep sharing the owner)."""
    if not small.size:
        return []
    tree = cKDTree(centers[small])
    near = tree.query_ball_point(middle, extent + reach[small].max(), return_sorted=False)
    found = []
    for set_index, hits in enumerate(near):
        rows = small[np.asarray(hits, dtype=np.int64)]
        rows = rows[np.linalg.norm(centers[rows] - middle[set_index], axis=1) <= extent[set_index] + reach[rows]]
        if not rows.size:
            continue
        large_root = int(large_roots[set_index])
        allowed = {root: union.joinable(root, large_root) for root in np.unique(roots[rows]).tolist()}
        rows = rows[[allowed[root] for root in roots[rows].tolist()]]
        if rows.size:
            targets = members[set_index]
            found.append(lookups_by_reach(centers, rows, targets, reach[rows], reach[targets]))
    return found


def _large_set_candidates(centers, reach, classes, large_roots, members, middle, extent, union):
    """Candidate pairs between two joinable large sets whose bounding balls come within reach."""
    near = cKDTree(middle).query_pairs(2 * extent.max(), output_type="ndarray")
    near = near[np.linalg.norm(middle[near[:, 0]] - middle[near[:, 1]], axis=1) <= extent[near[:, 0]] + extent[near[:, 1]]]
    found = []
    for a, b in near.tolist():
        if union.joinable(int(large_roots[a]), int(large_roots[b])):
            found.append(larger_end_lookups(centers, reach, classes, members[a], members[b]))
            found.append(larger_end_lookups(centers, reach, classes, members[b], members[a]))
    return found
