"""Super-clusters: a union-find over overlapping pairs, taken in increasing order of their overlap
ratio, that never joins two components of one client (the same-client rule,
docs/ALGORITHMS.md section 2).
"""

from __future__ import annotations

import numpy as np
from scipy import sparse
from scipy.sparse.csgraph import connected_components

from fedica.fedgem.levelled import levelled_labels, levelled_sweep, ratio_levels
from fedica.fedgem.overlaps import BRUTE_FORCE_MAX, TooManyOverlaps, candidate_pairs
from fedica.fedgem.union import ConstrainedUnion
from fedica.validation import as_centers, as_int_vector, as_vector


def _first_appearance_labels(keys):
    """Relabel integer keys (m,) to 0..n-1 in order of first appearance."""
    _, first_index, inverse = np.unique(keys, return_index=True, return_inverse=True)
    rank = np.empty(first_index.shape[0], dtype=np.int64)
    rank[np.argsort(first_index, kind="stable")] = np.arange(first_index.shape[0])
    return rank[inverse.reshape(-1)]


def _order_by_ratio(ratio):
    """Indices (p,) that sort ``ratio`` increasingly, ties in their original order.

    The pairs come sorted by (i, j), so keeping ties in order breaks them by i, then j.
    numpy's stable sort is about 5x slower than its default one on floats, and exact ties
    are rare (zero radii, integer grids): the default sort is used when it has none.
    """
    order = np.argsort(ratio)
    ordered = ratio[order]
    if np.any(ordered[1:] == ordered[:-1]):
        return np.argsort(ratio, kind="stable")
    return order


def super_clusters(centers, radii, owners, *, max_pairs=None):
    """Group components into super-clusters without ever joining two of one owner.

    Semantics: union-find over the overlapping pairs of :func:`candidate_pairs`, taken
    in increasing ``ratio`` (ties by ``i``, then ``j``), where a union that would put
    two components of one owner in one super-cluster is skipped.

    Fast path: the connected components of the overlap graph are computed with
    :func:`scipy.sparse.csgraph.connected_components`. A component in which no owner
    appears twice can never trigger a skip, so the sequential process would produce
    exactly that component; it is accepted as is. Only components with an owner
    conflict go through the sequential constrained union-find.

    Parameters
    ----------
    centers : array-like of shape (m, d)
        Ball centres.
    radii : array-like of shape (m,)
        Ball radii, non-negative.
    owners : array-like of shape (m,), int
        Client id of every component.
    max_pairs : int or None, default=None
        Memory budget on the overlapping pairs (see :func:`candidate_pairs`).

    Returns
    -------
    labels : ndarray of shape (m,), int
        Super-cluster of every component, numbered ``0..n_super-1`` in order of first
        appearance.
    """
    centers = as_centers(centers)
    m = centers.shape[0]
    owners = as_int_vector(owners, m, "owners")
    if m == 0:
        return np.empty(0, dtype=np.int64)
    owner_code = np.unique(owners, return_inverse=True)[1].reshape(-1)
    radii = as_vector(radii, m, "radii")
    if m > BRUTE_FORCE_MAX:
        levels, sample = ratio_levels(centers, radii, owner_code)
        if levels is not None:
            roots = levelled_labels(centers, radii, owner_code, levels, sample=sample, max_pairs=max_pairs)
            return _first_appearance_labels(roots)
    pairs, ratio = candidate_pairs(centers, radii, owners, max_pairs=max_pairs)
    return _nested_pair_labels(pairs, ratio, owner_code, [1.0])[0]


def nested_super_clusters(centers, radii, owners, thresholds, *, max_pairs=None):
    """:func:`super_clusters` of the balls of radii ``t * radii``, for every ``t`` of ``thresholds``, in one sweep.

    Balls of radii ``t r`` overlap when their pair's ratio ``||c_i - c_j|| / (r_i + r_j)`` is at
    most ``t``, and the constrained union-find takes them in increasing ratio: the pairs at
    ``radii`` in the same order, cut at ``t``. The partitions are therefore snapshots of one
    union-find run over the pairs at ``radii``, taken as the ratio passes each threshold (each one
    refines the next). The final aggregations of an upsilon grid are such a family (a final
    radius is proportional to the root of upsilon, docs/ALGORITHMS.md section 2.6): one sweep
    replaces one union-find per upsilon. Equal to :func:`super_clusters` at ``t * radii`` except
    where two ratios, or a ratio and ``t``, agree to the last bits (``t * radii`` rounds).

    Parameters
    ----------
    centers : array-like of shape (m, d)
    radii : array-like of shape (m,)
        The largest balls' radii, non-negative.
    owners : array-like of shape (m,), int
    thresholds : sequence of float
        Increasing, in ``(0, 1]``.
    max_pairs : int or None, default=None
        Memory budget on the pairs the sweep lists (see :func:`super_clusters`).

    Returns
    -------
    list of (ndarray of shape (m,) or None)
        Per threshold, the labels numbered in order of first appearance; None where the sweep
        went over ``max_pairs`` before it reached the threshold (:func:`super_clusters` at that
        threshold's radii may still fit, as its listing is smaller).
    """
    thresholds = [float(t) for t in thresholds]
    if any(not 0 < t <= 1 for t in thresholds) or thresholds != sorted(thresholds):
        raise ValueError(f"thresholds must increase within (0, 1], got {thresholds}")
    centers = as_centers(centers)
    m = centers.shape[0]
    owners = as_int_vector(owners, m, "owners")
    if m == 0:
        return [np.empty(0, dtype=np.int64) for _ in thresholds]
    owner_code = np.unique(owners, return_inverse=True)[1].reshape(-1)
    radii = as_vector(radii, m, "radii")
    try:
        if m > BRUTE_FORCE_MAX:
            levels, sample = ratio_levels(centers, radii, owner_code)
            if levels is not None:
                return _levelled_snapshots(centers, radii, owner_code, levels, sample, thresholds, max_pairs)
        pairs, ratio = candidate_pairs(centers, radii, owners, max_pairs=max_pairs)
    except TooManyOverlaps:
        return [None] * len(thresholds)
    return _nested_pair_labels(pairs, ratio, owner_code, thresholds)


def _levelled_snapshots(centers, radii, owner_code, levels, sample, thresholds, max_pairs):
    """The levelled union-find's sets at each of ``thresholds`` (None past a level over ``max_pairs``)."""
    wanted = set(thresholds)
    found = {}
    try:
        for level, roots in levelled_sweep(centers, radii, owner_code, sorted(set(levels) | wanted),
                                           sample=sample, max_pairs=max_pairs):
            if level in wanted:
                found[level] = _first_appearance_labels(roots)
    except TooManyOverlaps:
        pass
    return [found.get(t) for t in thresholds]


def _nested_pair_labels(pairs, ratio, owner_code, thresholds):
    """The constrained union-find's labels over the overlapping ``pairs`` of ratio at most each threshold.

    Fast path: a connected component of the overlap graph (at the largest threshold) in which no
    owner appears twice can never trigger a skip, and nor can any part of it at a smaller threshold:
    the sequential process would give exactly the connected components of its pairs, which
    :func:`scipy.sparse.csgraph.connected_components` computes. Only components with an owner
    conflict go through the sequential constrained union-find.
    """
    m = owner_code.shape[0]
    if thresholds[-1] < 1.0:  # the pairs at radii all have ratios of at most 1
        in_reach = ratio <= thresholds[-1]
        pairs, ratio = pairs[in_reach], ratio[in_reach]
    n_components, component = _connected(m, pairs)
    n_owners = int(owner_code.max()) + 1
    key = np.sort(component.astype(np.int64) * n_owners + owner_code)
    repeated = key[1:][key[1:] == key[:-1]]
    conflicted = np.zeros(n_components, dtype=bool)
    conflicted[repeated // n_owners] = True
    in_conflict = conflicted[component]
    edge_in_conflict = in_conflict[pairs[:, 0]]
    free_pairs, free_ratio = pairs[~edge_in_conflict], ratio[~edge_in_conflict]
    nodes = np.flatnonzero(in_conflict)
    local = np.full(m, -1, dtype=np.int64)
    local[nodes] = np.arange(nodes.shape[0])
    order = _order_by_ratio(ratio[edge_in_conflict])
    # This loop is inherently sequential (whether a union happens depends on every earlier
    # union); it only visits the edges of owner-conflicting components.
    union = ConstrainedUnion(owner_code[nodes])
    edges, edge_ratio = local[pairs[edge_in_conflict][order]], ratio[edge_in_conflict][order]
    taken = 0
    labels = []
    for threshold in thresholds:
        if threshold == thresholds[-1]:
            n_free, keys = n_components, component.astype(np.int64)
        else:
            n_free, keys = _connected(m, free_pairs[free_ratio <= threshold])
            keys = keys.astype(np.int64)
        if nodes.size:
            end = int(np.searchsorted(edge_ratio, threshold, side="right"))
            union.add_edges(edges[taken:end])
            taken = end
            keys[nodes] = n_free + nodes[union.roots()]
        labels.append(_first_appearance_labels(keys))
    return labels


def _connected(m, pairs):
    """Connected components (count, label of each of the m nodes) of the graph of ``pairs`` (p, 2)."""
    graph = sparse.coo_matrix((np.ones(pairs.shape[0], dtype=np.int8), (pairs[:, 0], pairs[:, 1])), shape=(m, m))
    return connected_components(graph, directed=False)
