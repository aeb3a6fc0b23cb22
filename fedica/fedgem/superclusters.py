"""Super-clusters: a union-find over overlapping pairs, taken in increasing order of their overlap
ratio, that never joins two components of one client (the same-client rule,
docs/ALGORITHMS.md section 2).
"""

from __future__ import annotations

import numpy as np
from scipy import sparse
from scipy.sparse.csgraph import connected_components

from fedica.fedgem.levelled import levelled_labels, ratio_levels
from fedica.fedgem.overlaps import BRUTE_FORCE_MAX, candidate_pairs
from fedica.fedgem.union import UNION_CHUNK, ConstrainedUnion
from fedica.validation import as_centers, as_int_vector, as_vector


def _first_appearance_labels(keys):
    """Relabel integer keys (m,) to 0..n-1 in order of first appearance."""
    _, first_index, inverse = np.unique(keys, return_index=True, return_inverse=True)
    rank = np.empty(first_index.shape[0], dtype=np.int64)
    rank[np.argsort(first_index, kind="stable")] = np.arange(first_index.shape[0])
    return rank[inverse.reshape(-1)]


def _constrained_union_find(n_nodes, edges, node_owner, *, chunk_size=UNION_CHUNK):
    """Roots (n_nodes,) after :meth:`ConstrainedUnion.add_edges` of ``edges`` (p, 2), in order."""
    union = ConstrainedUnion(node_owner)
    union.add_edges(edges, chunk_size=chunk_size)
    return union.roots()


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

    graph = sparse.coo_matrix(
        (np.ones(pairs.shape[0], dtype=np.int8), (pairs[:, 0], pairs[:, 1])),
        shape=(m, m),
    )
    n_components, component = connected_components(graph, directed=False)

    n_owners = int(owner_code.max()) + 1
    key = np.sort(component.astype(np.int64) * n_owners + owner_code)
    repeated = key[1:][key[1:] == key[:-1]]
    conflicted = np.zeros(n_components, dtype=bool)
    conflicted[repeated // n_owners] = True

    keys = component.astype(np.int64)
    in_conflict = conflicted[component]
    if in_conflict.any():
        nodes = np.flatnonzero(in_conflict)
        local = np.full(m, -1, dtype=np.int64)
        local[nodes] = np.arange(nodes.shape[0])
        edge_in_conflict = in_conflict[pairs[:, 0]]
        sub_pairs, sub_ratio = pairs[edge_in_conflict], ratio[edge_in_conflict]
        order = _order_by_ratio(sub_ratio)
        # This loop is inherently sequential (whether a union happens depends on every
        # earlier union); it only visits the edges of owner-conflicting components.
        roots = _constrained_union_find(
            nodes.shape[0], local[sub_pairs[order]], owner_code[nodes]
        )
        keys[nodes] = n_components + nodes[roots]
    return _first_appearance_labels(keys)
