"""The constrained union-find: sets of components joined pair by pair, never two of one owner
(the same-client rule, docs/ALGORITHMS.md section 2.3)."""

from __future__ import annotations

import numpy as np

# Edges per chunk of the constrained union-find (ConstrainedUnion.add_edges), and the size
# mostly settled chunks may grow to.
UNION_CHUNK = 2048
_UNION_CHUNK_MAX = 2**17


def unique_keys(keys, *, return_inverse=False):
    """The sorted distinct values of an int64 array (and each value's index among them).

    By sorting: numpy 2.4's ``np.unique`` hashes when no inverse is asked for, measured 60x
    slower than a sort on 2 million keys, and its inverse costs 0.2 ms on 2,048 keys.
    """
    order = np.argsort(keys, kind="stable") if return_inverse else None
    ordered = keys[order] if return_inverse else np.sort(keys)
    first = np.empty(ordered.shape[0], dtype=bool)
    first[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    if not return_inverse:
        return ordered[first]
    inverse = np.empty(keys.shape[0], dtype=np.int64)
    inverse[order] = np.cumsum(first) - 1
    return ordered[first], inverse


def _roots(parent):
    """Root of every node (n,) of a union-find forest given as a parent array or list."""
    roots = np.asarray(parent, dtype=np.int64)
    # Pointer jumping: every pass halves the remaining depth.
    while True:
        jumped = roots[roots]
        if np.array_equal(jumped, roots):
            return roots
        roots = jumped


class ConstrainedUnion:
    """Sets of nodes joined edge by edge unless the two sets share an owner.

    Hand-written because the skip needs the owner set of every root, which neither scipy's
    ``DisjointSet`` nor ``connected_components`` can take into account. Path halving, and
    the set with more owners becomes the root.

    Parameters
    ----------
    node_owner : ndarray of shape (n_nodes,), int
    """

    def __init__(self, node_owner):
        self.n_nodes = node_owner.shape[0]
        self.parent = list(range(self.n_nodes))
        self.owner_sets = [{owner} for owner in node_owner.tolist()]

    def roots(self):
        """Root of every node, ndarray of shape (n_nodes,)."""
        return _roots(self.parent)

    def joinable(self, root_a, root_b):
        """Whether two roots are distinct sets that share no owner."""
        return root_a != root_b and self.owner_sets[root_a].isdisjoint(self.owner_sets[root_b])

    def add_edges(self, edges, *, chunk_size=UNION_CHUNK):
        """Take ``edges`` (p, 2) in their order; a union is skipped when the sets share an owner.

        Edges are taken ``chunk_size`` at a time (a chunk after a mostly settled one is up
        to twice as large as it, at most ``_UNION_CHUNK_MAX``). Before a chunk, the edges
        whose endpoints already share a root, or whose roots already share an owner, are
        dropped in bulk: sets only grow, so the sequential process would skip those edges
        too, and the result does not depend on ``chunk_size``. With dense overlaps (every
        ball meets every other, e.g. a large final upsilon) most edges join sets that
        already conflict, and this removes them with one owner-set test per pair of roots
        instead of one per edge.
        """
        parent, owner_sets = self.parent, self.owner_sets
        start, size = 0, chunk_size
        while start < edges.shape[0]:
            chunk = edges[start : start + size]
            live = _drop_settled_edges(chunk, _roots(parent), owner_sets, self.n_nodes)
            # After a mostly settled chunk the next may be larger: few of its edges would
            # reach the loop anyway, and every chunk costs one pass over all roots.
            mostly_settled = 4 * live.shape[0] < chunk.shape[0]
            start += size
            size = min(2 * size, max(chunk_size, _UNION_CHUNK_MAX)) if mostly_settled else chunk_size
            for i, j in zip(live[:, 0].tolist(), live[:, 1].tolist()):
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


def _drop_settled_edges(edges, roots, owner_sets, n_nodes):
    """The edges (p, 2) whose endpoints' current sets are distinct and share no owner."""
    root_i, root_j = roots[edges[:, 0]], roots[edges[:, 1]]
    live = root_i != root_j
    edges, root_i, root_j = edges[live], root_i[live], root_j[live]
    root_pairs, inverse = unique_keys(
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
    return edges[joinable[inverse]]
