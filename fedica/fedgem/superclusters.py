"""Super-clusters: a union-find over overlapping pairs, taken in increasing order of their overlap
ratio, that never joins two components of one client (the same-client rule,
docs/ALGORITHMS.md section 2).
"""

from __future__ import annotations

import numpy as np
from scipy import sparse
from scipy.sparse.csgraph import connected_components

from fedica.fedgem.overlaps import candidate_pairs
from fedica.validation import as_centers, as_int_vector

# Edges per chunk of the constrained union-find (see _constrained_union_find), and the
# size mostly settled chunks may grow to.
_UNION_CHUNK = 2048
_UNION_CHUNK_MAX = 2**17


def _first_appearance_labels(keys):
    """Relabel integer keys (m,) to 0..n-1 in order of first appearance."""
    _, first_index, inverse = np.unique(keys, return_index=True, return_inverse=True)
    rank = np.empty(first_index.shape[0], dtype=np.int64)
    rank[np.argsort(first_index, kind="stable")] = np.arange(first_index.shape[0])
    return rank[inverse.reshape(-1)]


def _roots(parent):
    """Root of every node (n,) of a union-find forest given as a parent array or list."""
    roots = np.asarray(parent, dtype=np.int64)
    # Pointer jumping: every pass halves the remaining depth.
    while True:
        jumped = roots[roots]
        if np.array_equal(jumped, roots):
            return roots
        roots = jumped


def _constrained_union_find(n_nodes, edges, node_owner, *, chunk_size=_UNION_CHUNK):
    """Sequential union-find over ``edges`` (p, 2) (already in processing order).

    A union is skipped when the two sets share an owner. Returns the root of every node
    (n_nodes,). Hand-written because the skip needs the owner set of every root, which
    neither scipy's ``DisjointSet`` nor ``connected_components`` can take into account.
    Path halving, and the set with more owners becomes the root.

    Edges are taken ``chunk_size`` at a time (a chunk after a mostly settled one is up to
    twice as large as it, at most ``_UNION_CHUNK_MAX``). Before a chunk, the edges whose endpoints
    already share a root, or whose roots already share an owner, are dropped in bulk:
    sets only grow, so the sequential process would skip those edges too, and the result
    does not depend on ``chunk_size``. With dense overlaps (every ball meets every other,
    e.g. a large final upsilon) most edges join sets that already conflict, and this
    removes them with one owner-set test per pair of roots instead of one per edge.
    """
    parent = list(range(n_nodes))
    owner_sets = [{owner} for owner in node_owner.tolist()]
    start, size = 0, chunk_size
    while start < edges.shape[0]:
        chunk = edges[start : start + size]
        if start:
            live = _drop_settled_edges(chunk, _roots(parent), owner_sets, n_nodes)
            # After a mostly settled chunk the next may be larger: few of its edges would
            # reach the loop anyway, and every chunk costs one pass over all roots.
            mostly_settled = 4 * live.shape[0] < chunk.shape[0]
            start += size
            size = min(2 * size, max(chunk_size, _UNION_CHUNK_MAX)) if mostly_settled else chunk_size
            chunk = live
        else:
            start += size
        for i, j in zip(chunk[:, 0].tolist(), chunk[:, 1].tolist()):
            while parent[i] != i:
                parent[i] = i = parent[parent[i]]
            while parent[j] != j:
                parent[j] = j = parent[parent[j]]
            if i == j:
                continue
            if len(owner_sets[i]) < len(owner_sets[j]):
                i, j = j, i
            if owner_sets[i].isdisjoint(owner_sets[j]):
                parent[j] = i
                owner_sets[i] |= owner_sets[j]
    return _roots(parent)


def _drop_settled_edges(edges, roots, owner_sets, n_nodes):
    """The edges (p, 2) whose endpoints' current sets are distinct and share no owner."""
    root_i, root_j = roots[edges[:, 0]], roots[edges[:, 1]]
    live = root_i != root_j
    edges, root_i, root_j = edges[live], root_i[live], root_j[live]
    root_pairs, inverse = np.unique(
        np.minimum(root_i, root_j) * n_nodes + np.maximum(root_i, root_j), return_inverse=True
    )
    # Testing the distinct pairs of roots pays only when edges share them; otherwise the
    # sequential loop does the same tests anyway.
    if 4 * root_pairs.size > edges.shape[0]:
        return edges
    joinable = np.array(
        [owner_sets[pair // n_nodes].isdisjoint(owner_sets[pair % n_nodes]) for pair in root_pairs.tolist()],
        dtype=bool,
    )
    return edges[joinable[inverse.reshape(-1)]]


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
    pairs, ratio = candidate_pairs(centers, radii, owners, max_pairs=max_pairs)
    if m == 0:
        return np.empty(0, dtype=np.int64)

    graph = sparse.coo_matrix(
        (np.ones(pairs.shape[0], dtype=np.int8), (pairs[:, 0], pairs[:, 1])),
        shape=(m, m),
    )
    n_components, component = connected_components(graph, directed=False)

    owner_code = np.unique(owners, return_inverse=True)[1].reshape(-1)
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
