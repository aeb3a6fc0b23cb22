"""Which components of different clients overlap: candidate pairs by KD-trees (paper appendix B.5.1)
or, for few components, by brute force; both exact under the rule ``||M_i - M_j|| <= r_i + r_j``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from scipy.spatial import cKDTree
from scipy.spatial.distance import cdist

from fedica.validation import as_centers, as_int_vector, as_vector

# The KD-tree prunes with its own floating-point arithmetic; querying slightly wider
# and then filtering with the exact rule keeps borderline pairs (distance == r_i + r_j).
_QUERY_SLACK = 1e-9


# Larger leaves than scipy's default (16) measured faster for d = 10 (fewer nodes visited).
_LEAF_SIZE = 64


# Radii below rmax * 2**-52 are indistinguishable from zero next to the largest ball;
# they share the last radius class, which bounds the number of classes.
_SMALLEST_RADIUS = 2.0**-52


# A radius class holds the radii within this factor below its largest one. Within a class
# every query searches 2 r_j, at most (2 / (1 + 1/4))^d times the volume needed; 4 measured
# best at 10^6 components (d = 10), where classes within a factor 2 cost 1.6x the time.
_RADIUS_CLASS_FACTOR = 4.0


# Up to this many components all pairs are compared directly (measured faster than the
# KD-trees, d = 10), in blocks of about this many distances (512 KiB: small blocks stay in
# cache and avoid a fresh memory mapping per call, measured 20% faster than one big block).
BRUTE_FORCE_MAX = 1_000


_BRUTE_FORCE_BLOCK = 2**16

# lookups_by_reach: targets looked up together have reaches within this factor of the group's largest
# (and a group holds at least this many, so that a tree pays for its construction).
_REACH_GROUP_FACTOR = 1.25
_REACH_GROUP_MIN = 256


# Candidate pairs whose coordinate differences are computed at once (8 MiB at d = 10).
_DIFFERENCE_BLOCK = 2**17


# A KD-tree lookup of fewer query points than this runs on one thread: starting the worker
# threads costs more than they save on a few hundred queries (measured: the small-to-large
# lookups of a 26,612-component server step spent 0.6 of 1.6 s starting and joining threads).
_PARALLEL_QUERIES = 2048


# Random pairs drawn to estimate how many balls overlap before any pair is listed: the
# estimate's relative error is about 1 / sqrt(expected hits), under 0.2 at the budgets in use.
_ESTIMATE_SAMPLES = 2**18


class TooManyOverlaps(ValueError):
    """More overlapping pairs than the memory budget (``max_pairs``) allows to list."""


def estimated_overlapping_pairs(centers, radii, owners, *, n_samples=_ESTIMATE_SAMPLES, random_state=0):
    """Estimated number of overlapping pairs of different owners, from random pairs.

    Parameters
    ----------
    centers : array-like of shape (m, d)
    radii : array-like of shape (m,)
    owners : array-like of shape (m,), int
    n_samples : int
        Random pairs drawn (with replacement).
    random_state : int, None or numpy.random.Generator

    Returns
    -------
    float
        ``m (m - 1) / 2`` times the share of sampled pairs ``i != j`` of different owners
        with ``||c_i - c_j|| <= r_i + r_j``.
    """
    sample = sampled_overlaps(centers, radii, owners, n_samples=n_samples, random_state=random_state)
    return sample.pairs_per_hit * sample.ratio.shape[0]


@dataclass(frozen=True)
class SampledOverlaps:
    """The overlapping pairs among random pairs: ``first``, ``second`` and ``ratio`` (hits,),
    and ``pairs_per_hit``, the pairs of the whole set one sampled pair stands for."""

    first: np.ndarray
    second: np.ndarray
    ratio: np.ndarray
    pairs_per_hit: float


def sampled_overlaps(centers, radii, owners, *, n_samples=_ESTIMATE_SAMPLES, random_state=0):
    """Random pairs ``i != j`` (with replacement) and which of them overlap, of different owners.

    Returns
    -------
    SampledOverlaps
        Ratios ``||c_i - c_j|| / (r_i + r_j)`` (0 where both radii are 0).
    """
    centers = as_centers(centers)
    m = centers.shape[0]
    radii = as_vector(radii, m, "radii")
    owners = as_int_vector(owners, m, "owners")
    if m < 2:
        return SampledOverlaps(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0), 0.0)
    rng = np.random.default_rng(random_state)
    i, j = rng.integers(0, m, n_samples), rng.integers(0, m, n_samples)
    distinct = i != j
    i, j = i[distinct], j[distinct]
    difference = centers[i] - centers[j]
    squared = np.einsum("ij,ij->i", difference, difference)
    overlap = (owners[i] != owners[j]) & (squared <= (radii[i] + radii[j]) ** 2)
    i, j = i[overlap], j[overlap]
    radius_sum = radii[i] + radii[j]
    ratio = np.divide(np.sqrt(squared[overlap]), radius_sum, out=np.zeros(i.shape[0]), where=radius_sum > 0)
    return SampledOverlaps(i, j, ratio, m * (m - 1) / 2 / max(1, distinct.sum()))


def pair_distances(centers, first, second):
    """``||c_first - c_second||`` (p,), in blocks, so that the (p, d) differences never exist at once."""
    distance = np.empty(first.shape[0])
    for start in range(0, first.shape[0], _DIFFERENCE_BLOCK):
        stop = start + _DIFFERENCE_BLOCK
        difference = centers[first[start:stop]] - centers[second[start:stop]]
        distance[start:stop] = np.sqrt(np.einsum("ij,ij->i", difference, difference))
    return distance


def radius_classes(radii):
    """Class id per radius (m,), 0 for the largest radii: a class starts at the largest radius
    not yet classed and holds every radius above that divided by ``_RADIUS_CLASS_FACTOR``."""
    order = np.argsort(-radii, kind="stable")
    descending = -radii[order]
    classes = np.empty(radii.shape[0], dtype=np.int64)
    tiny = radii.max() * _SMALLEST_RADIUS
    start, class_id = 0, 0
    while start < order.shape[0]:
        top = -descending[start]
        stop = order.shape[0] if top <= tiny else int(np.searchsorted(descending, -top / _RADIUS_CLASS_FACTOR))
        classes[order[start:stop]] = class_id
        start, class_id = stop, class_id + 1
    return classes


def _flatten_neighbours(neighbour_lists):
    """Object array of index lists (q,) -> (query row, neighbour) pairs as int arrays."""
    counts = np.fromiter(map(len, neighbour_lists), dtype=np.int64, count=len(neighbour_lists))
    neighbours = np.fromiter(
        itertools.chain.from_iterable(neighbour_lists), dtype=np.int64, count=int(counts.sum())
    )
    return np.repeat(np.arange(len(neighbour_lists)), counts), neighbours


def lookups_within(centers, queries, targets, radius):
    """Pairs (query, target), index arrays, of every target within ``radius`` (one per query, a
    little wider: ``_QUERY_SLACK``) of a query: one KD-tree of the targets, for a few queries
    against a set whose radii differ little (no radius classes to build)."""
    hits = cKDTree(centers[targets], leafsize=_LEAF_SIZE).query_ball_point(
        centers[queries], radius * (1 + _QUERY_SLACK), return_sorted=False,
        workers=-1 if queries.size >= _PARALLEL_QUERIES else 1,
    )
    query_index, neighbour = _flatten_neighbours(hits)
    return queries[query_index], targets[neighbour]


def lookups_by_reach(centers, queries, targets, query_reach, target_reach):
    """Pairs (query, target), index arrays, of every target within the query's reach plus its own.

    The targets are looked up in groups of similar reach (within ``_REACH_GROUP_FACTOR`` of the
    group's largest, at least ``_REACH_GROUP_MIN`` a group), each with the queries' reach plus the
    group's largest: one lookup with the largest reach of all would list, in 10 dimensions, a
    hundred times the pairs a typical target can meet (measured on a G=10,000 round, where the
    largest radius is 2.5 times the median).

    Parameters
    ----------
    centers : ndarray of shape (m, d)
    queries, targets : ndarray of int
        Row indices.
    query_reach : ndarray of shape (queries.size,)
    target_reach : ndarray of shape (targets.size,)
    """
    order = np.argsort(target_reach)[::-1]
    targets, target_reach = targets[order], target_reach[order]
    found = []
    start = 0
    while start < targets.shape[0]:
        largest = target_reach[start]
        # Reaches are sorted decreasingly: the group ends at the first below largest / factor.
        stop = max(start + _REACH_GROUP_MIN,
                   int(np.searchsorted(-target_reach, -largest / _REACH_GROUP_FACTOR, side="right")))
        found.append(lookups_within(centers, queries, targets[start:stop], query_reach + largest))
        start = stop
    if not found:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    return np.concatenate([query for query, _ in found]), np.concatenate([target for _, target in found])


def larger_end_lookups(centers, radii, classes, queries, targets):
    """Candidate pairs (query, target), index arrays, holding every overlapping pair of a
    query and a target whose radius is at most the query's (the pair's larger end).

    ``classes`` are :func:`radius_classes` of ``radii``; ``queries`` and ``targets`` are
    row indices. A query makes at most two lookups: in its own class's targets with radius
    ``2 r_j``, and in one tree of all smaller classes' targets with ``r_j`` plus their
    largest radius. Equal radii are found from both ends when both are queries and targets.
    """
    found = []
    target_class = classes[targets]
    for class_id in np.unique(classes[queries]).tolist():
        rows = queries[classes[queries] == class_id]
        for members, reach in (
            (targets[target_class == class_id], 2 * radii[rows]),
            (targets[target_class > class_id], None),
        ):
            if not members.size:
                continue
            query_radius = reach if reach is not None else radii[rows] + radii[members].max()
            hits = cKDTree(centers[members], leafsize=_LEAF_SIZE).query_ball_point(
                centers[rows], query_radius * (1 + _QUERY_SLACK), return_sorted=False,
                workers=-1 if rows.size >= _PARALLEL_QUERIES else 1,
            )
            query_index, neighbour = _flatten_neighbours(hits)
            query, other = rows[query_index], members[neighbour]
            keep = radii[other] <= radii[query]
            found.append((query[keep], other[keep]))
    if not found:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    return np.concatenate([query for query, _ in found]), np.concatenate([other for _, other in found])


def spatial_order(centers):
    """A permutation (m,) of the rows in a KD-tree's leaf order: queries and tree data taken in
    it keep each query's walk in cache (3.5x faster at 10^6 components in 10 dimensions)."""
    return cKDTree(centers, leafsize=_LEAF_SIZE, balanced_tree=False).indices


def _pairs_by_kd_tree(centers, radii):
    """Pairs (p, 2) that may overlap, each exactly once, via KD-trees per radius class.

    A pair is looked up from its end with the larger radius (ties: the larger index), which
    always finds it, so no pair needs de-duplicating afterwards.
    """
    spatial = spatial_order(centers)
    centers, radii = centers[spatial], radii[spatial]
    everyone = np.arange(centers.shape[0])
    query, other = larger_end_lookups(centers, radii, radius_classes(radii), everyone, everyone)
    once = (radii[query] > radii[other]) | (query > other)
    return spatial[query[once]], spatial[other[once]]


def _overlaps_by_brute_force(centers, radii, owners):
    """Overlapping pairs (p, 2) of different owners with i < j, sorted, and their distances
    (p,), from all pairwise distances in row blocks."""
    m = centers.shape[0]
    block = max(1, _BRUTE_FORCE_BLOCK // m)
    found, distances = [], []
    for start in range(0, m, block):
        stop = min(start + block, m)
        distance = cdist(centers[start:stop], centers[start:])
        reach = radii[start:stop, None] + radii[None, start:]
        i, j = np.nonzero(distance <= reach)
        keep = (i < j) & (owners[start + i] != owners[start + j])
        i, j = i[keep], j[keep]
        found.append(np.column_stack([i, j]) + start)
        distances.append(distance[i, j])
    return np.concatenate(found), np.concatenate(distances)


def _exact_overlaps(centers, radii, owners, first, second):
    """The candidates (each given once, in either order) that truly overlap, of different
    owners: pairs (p, 2) with i < j sorted lexicographically, and their distances (p,)."""
    keep = owners[first] != owners[second]
    first, second = first[keep], second[keep]
    m = centers.shape[0]
    # Sorting one int64 key per pair is several times faster than sorting the rows.
    key = np.sort(np.minimum(first, second) * m + np.maximum(first, second))
    first, second = np.divmod(key, m)
    distance = pair_distances(centers, first, second)
    keep = distance <= radii[first] + radii[second]
    return np.column_stack([first[keep], second[keep]]), distance[keep]


def candidate_pairs(centers, radii, owners, *, algorithm="auto", max_pairs=None):
    """All overlapping pairs of components of different owners.

    Components ``i`` and ``j`` overlap when ``||c_i - c_j|| <= r_i + r_j``.

    Search strategy (``algorithm``). ``"brute"`` compares all pairs, vectorised in row
    blocks (memory ``O(m)`` per block, time ``O(m^2)``); with a few hundred components,
    as in the papers' experiments, that beats any tree by an order of magnitude.
    ``"kd_tree"`` scales: one query radius for everything (``2 max r`` with
    ``query_pairs``, or ``r_i + max r`` per point) would degrade to all pairs as soon
    as one ball is large, which happens in early rounds. Instead the pair is looked for
    from its member with the larger radius, ``j``: every other member ``i`` has
    ``r_i <= r_j``, so it lies within ``r_j + r_i <= 2 r_j`` of ``c_j``. To tighten
    that further the components are split into radius classes (each holding the radii
    within a factor 4 below its largest), and a point queries its own class's
    :class:`scipy.spatial.cKDTree` with ``2 r_j`` and one tree of all smaller classes with
    ``r_j`` plus their largest radius. A large ball thus costs only its own two queries, and
    small balls never search with a large radius. The queries run in spatial order,
    on all cores when they are many (``_PARALLEL_QUERIES``).
    ``query_ball_point`` is used rather than ``query_pairs`` because it takes a radius
    per point and measured several times faster (d = 10). ``"auto"`` takes ``"brute"`` up to 1,000 components (measured
    crossover with d = 10) and ``"kd_tree"`` above. Both take the exact test on
    distances computed from the coordinate differences (``cdist`` for brute force, the
    norm of the difference for the tree's candidates, which the tree searches slightly
    wider for), so they agree on every pair except one whose distance equals
    ``r_i + r_j`` to the last bit, and on the ratios to rounding.

    Cost of the KD-tree search: the tree searches plus the number of candidates. The
    searches are fast when the radii are small next to the spacing of the centres; in
    10 dimensions they approach brute force as the two become comparable. No method
    can beat the number of overlapping pairs, which is quadratic inside a group of
    mutually overlapping balls (e.g. when every ball is wider than the scatter of its
    cluster's centres).

    Parameters
    ----------
    centers : array-like of shape (m, d)
        Ball centres.
    radii : array-like of shape (m,)
        Ball radii (``sqrt(eps)``), non-negative.
    owners : array-like of shape (m,), int
        Client id of every component.
    algorithm : {"auto", "brute", "kd_tree"}, default="auto"
        Search strategy; the result does not depend on it (up to rounding).
    max_pairs : int or None, default=None
        Memory budget: when more than this many pairs may overlap (at most
        ``m (m - 1) / 2``) and :func:`estimated_overlapping_pairs` expects more,
        :class:`TooManyOverlaps` is raised before any pair is listed (each pair costs
        about 110 bytes up to the super-clusters). None: no budget.

    Returns
    -------
    pairs : ndarray of shape (p, 2), int
        Overlapping pairs with ``i < j`` and ``owners[i] != owners[j]``, sorted
        lexicographically.
    ratio : ndarray of shape (p,)
        ``||c_i - c_j|| / (r_i + r_j)`` in ``[0, 1]``; 0 where both radii are 0 (the
        centres then coincide).
    """
    centers = as_centers(centers)
    m = centers.shape[0]
    radii = as_vector(radii, m, "radii")
    owners = as_int_vector(owners, m, "owners")
    if algorithm not in ("auto", "brute", "kd_tree"):
        raise ValueError(f"algorithm must be 'auto', 'brute' or 'kd_tree'; got {algorithm!r}.")
    if m < 2:
        return np.empty((0, 2), dtype=np.int64), np.empty(0)
    if max_pairs is not None and m * (m - 1) // 2 > max_pairs:
        expected = estimated_overlapping_pairs(centers, radii, owners)
        if expected > max_pairs:
            raise TooManyOverlaps(
                f"about {expected:.3g} pairs of the {m} balls overlap, more than max_overlap_pairs={max_pairs}"
                " (about 110 bytes each)"
            )

    if algorithm == "brute" or (algorithm == "auto" and m <= BRUTE_FORCE_MAX):
        pairs, distance = _overlaps_by_brute_force(centers, radii, owners)
    else:
        pairs, distance = _exact_overlaps(centers, radii, owners, *_pairs_by_kd_tree(centers, radii))
    radius_sum = radii[pairs[:, 0]] + radii[pairs[:, 1]]
    ratio = np.divide(
        distance, radius_sum, out=np.zeros_like(distance), where=radius_sum > 0
    )
    return pairs, ratio
