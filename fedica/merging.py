"""Server-side mathematics of FedGEM: overlaps, super-clusters, consensus, final merge.

Every client component is a ball: centre ``M`` (the client's M-step maximiser) and
radius ``sqrt(eps)``. Components of different clients overlap when their balls meet.
Super-clusters are built by a union-find over overlapping pairs that never puts two
components of one client together (section 2 of the design note ``ALGORITHMS.md``).
In a collaborative round every member of a super-cluster is moved to one consensus
point inside all member balls; in the final aggregation the members are averaged.

Conventions shared by all functions: ``centers`` is ``(m, d)``, ``radii`` are ball
radii (not squared), ``owners`` are integer client ids and ``weights`` are the
components' positive weights ``N_g * pi_k``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree
from scipy.spatial.distance import cdist

__all__ = [
    "candidate_pairs",
    "super_clusters",
    "consensus_centers",
    "ServerStep",
    "server_step",
    "FinalAggregation",
    "final_aggregation",
    "select_upsilon",
]

# The KD-tree prunes with its own floating-point arithmetic; querying slightly wider
# and then filtering with the exact rule keeps borderline pairs (distance == r_i + r_j).
_QUERY_SLACK = 1e-9
# Larger leaves than scipy's default (16) measured faster for d = 10 (fewer nodes visited).
_LEAF_SIZE = 64
# Radii below rmax * 2**-52 are indistinguishable from zero next to the largest ball;
# grouping them in one radius class bounds the number of classes.
_SMALLEST_RADIUS_CLASS = -52
# Up to this many components all pairs are compared directly (measured faster than the
# KD-trees, d = 10), in blocks of about this many distances (512 KiB: small blocks stay in
# cache and avoid a fresh memory mapping per call, measured 20% faster than one big block).
_BRUTE_FORCE_MAX = 1_000
_BRUTE_FORCE_BLOCK = 2**16
# Edges per chunk of the constrained union-find (see _constrained_union_find).
_UNION_CHUNK = 2048


# ---------------------------------------------------------------- validation


def _as_centers(centers):
    centers = np.asarray(centers, dtype=float)
    if centers.ndim != 2:
        raise ValueError(f"centers must be a 2-D array (m, d); got shape {centers.shape}.")
    if not np.all(np.isfinite(centers)):
        raise ValueError("centers must contain only finite values.")
    return centers


def _as_vector(values, m, name, *, positive=False):
    values = np.asarray(values, dtype=float)
    if values.shape != (m,):
        raise ValueError(f"{name} must have shape ({m},); got {values.shape}.")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{name} must contain only finite values.")
    if positive and np.any(values <= 0):
        raise ValueError(f"{name} must be positive.")
    if not positive and np.any(values < 0):
        raise ValueError(f"{name} must be non-negative.")
    return values


def _as_int_vector(values, m, name):
    values = np.asarray(values)
    if values.shape != (m,):
        raise ValueError(f"{name} must have shape ({m},); got {values.shape}.")
    if m and not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"{name} must hold integers; got dtype {values.dtype}.")
    return values.astype(np.int64, copy=False)


# ---------------------------------------------------------------- helpers


def _segment_sum(values, labels, n_segments, row_weights):
    """Weighted sum of the rows of ``values`` (r, d) per label -> (n_segments, d)."""
    indicator = sparse.csr_matrix(
        (row_weights, (labels, np.arange(labels.shape[0]))),
        shape=(n_segments, labels.shape[0]),
    )
    return np.asarray(indicator @ values)


def _project_onto_balls(points, centers, radii):
    """Row-wise Euclidean projection of ``points`` (r, d) onto the balls (centers, radii)."""
    offsets = points - centers
    lengths = np.sqrt(np.einsum("ij,ij->i", offsets, offsets))
    outside = lengths > radii
    shrink = np.divide(radii, lengths, out=np.ones_like(lengths), where=outside)
    return np.where(outside[:, None], centers + offsets * shrink[:, None], points)


def _first_appearance_labels(keys):
    """Relabel integer keys (m,) to 0..n-1 in order of first appearance."""
    _, first_index, inverse = np.unique(keys, return_index=True, return_inverse=True)
    rank = np.empty(first_index.shape[0], dtype=np.int64)
    rank[np.argsort(first_index, kind="stable")] = np.arange(first_index.shape[0])
    return rank[inverse.reshape(-1)]


def _radius_classes(radii):
    """Class id per radius: floor(log2 r), radii within a factor 2 share a class."""
    rmax = radii.max()
    if rmax == 0:
        return np.zeros(radii.shape[0], dtype=np.int64)
    floor_class = int(np.floor(np.log2(rmax))) + _SMALLEST_RADIUS_CLASS
    classes = np.full(radii.shape[0], floor_class, dtype=np.int64)
    positive = radii > 0
    classes[positive] = np.maximum(np.floor(np.log2(radii[positive])), floor_class)
    return classes


# ---------------------------------------------------------------- overlaps


def _flatten_neighbours(neighbour_lists):
    """Object array of index lists (q,) -> (query row, neighbour) pairs as int arrays."""
    counts = np.fromiter(map(len, neighbour_lists), dtype=np.int64, count=len(neighbour_lists))
    neighbours = np.fromiter(
        itertools.chain.from_iterable(neighbour_lists), dtype=np.int64, count=int(counts.sum())
    )
    return np.repeat(np.arange(len(neighbour_lists)), counts), neighbours


def _pairs_by_kd_tree(centers, radii):
    """Pairs (p, 2) that may overlap, each at least once, via per-radius-class KD-trees."""
    class_of = np.unique(_radius_classes(radii), return_inverse=True)[1].reshape(-1)
    by_class = np.argsort(class_of, kind="stable")
    members = np.split(by_class, np.cumsum(np.bincount(class_of))[:-1])
    class_rmax = [radii[rows].max() for rows in members]
    trees = [cKDTree(centers[rows], leafsize=_LEAF_SIZE) for rows in members]

    # Loop over pairs of radius classes (at most 53 classes, independent of m); each
    # query is vectorised inside scipy. The member with the larger radius finds the pair.
    found = []
    for b, rows in enumerate(members):
        for a in range(b + 1):
            query_radius = radii[rows] + np.minimum(radii[rows], class_rmax[a])
            hits = trees[a].query_ball_point(
                centers[rows], query_radius * (1 + _QUERY_SLACK), return_sorted=False, workers=-1
            )
            query_index, neighbour = _flatten_neighbours(hits)
            found.append(np.column_stack([rows[query_index], members[a][neighbour]]))
    return np.concatenate(found)


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


def candidate_pairs(centers, radii, owners, *, algorithm="auto"):
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
    that further the components are split into radius classes (``floor(log2 r)``:
    radii within a factor 2) with one :class:`scipy.spatial.cKDTree` each, and a point
    of class ``b`` queries the tree of every class ``a <= b`` with
    ``query_ball_point`` and the per-point radius ``r_j + min(r_j, largest radius of
    class a)``. A large ball thus only costs its own queries, and small balls never
    search with a large radius. The queries run on all cores (``workers=-1``).
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

    Returns
    -------
    pairs : ndarray of shape (p, 2), int
        Overlapping pairs with ``i < j`` and ``owners[i] != owners[j]``, sorted
        lexicographically.
    ratio : ndarray of shape (p,)
        ``||c_i - c_j|| / (r_i + r_j)`` in ``[0, 1]``; 0 where both radii are 0 (the
        centres then coincide).
    """
    centers = _as_centers(centers)
    m = centers.shape[0]
    radii = _as_vector(radii, m, "radii")
    owners = _as_int_vector(owners, m, "owners")
    if algorithm not in ("auto", "brute", "kd_tree"):
        raise ValueError(f"algorithm must be 'auto', 'brute' or 'kd_tree'; got {algorithm!r}.")
    if m < 2:
        return np.empty((0, 2), dtype=np.int64), np.empty(0)

    if algorithm == "brute" or (algorithm == "auto" and m <= _BRUTE_FORCE_MAX):
        pairs, distance = _overlaps_by_brute_force(centers, radii, owners)
    else:
        pairs = np.sort(_pairs_by_kd_tree(centers, radii), axis=1)
        pairs = pairs[owners[pairs[:, 0]] != owners[pairs[:, 1]]]
        difference = centers[pairs[:, 0]] - centers[pairs[:, 1]]
        distance = np.sqrt(np.einsum("ij,ij->i", difference, difference))
        keep = distance <= radii[pairs[:, 0]] + radii[pairs[:, 1]]
        pairs, distance = pairs[keep], distance[keep]
        # A pair of equal-class members may be found from both ends: keep one (sorted by i, j).
        _, first = np.unique(pairs[:, 0] * m + pairs[:, 1], return_index=True)
        pairs, distance = pairs[first], distance[first]
    radius_sum = radii[pairs[:, 0]] + radii[pairs[:, 1]]
    ratio = np.divide(
        distance, radius_sum, out=np.zeros_like(distance), where=radius_sum > 0
    )
    return pairs, ratio


# ---------------------------------------------------------------- super-clusters


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

    Edges are taken ``chunk_size`` at a time. Before a chunk, the edges whose endpoints
    already share a root, or whose roots already share an owner, are dropped in bulk:
    sets only grow, so the sequential process would skip those edges too, and the result
    does not depend on ``chunk_size``. With dense overlaps (every ball meets every other,
    e.g. a large final upsilon) most edges join sets that already conflict, and this
    removes them with one owner-set test per pair of roots instead of one per edge.
    """
    parent = list(range(n_nodes))
    owner_sets = [{owner} for owner in node_owner.tolist()]
    for start in range(0, edges.shape[0], chunk_size):
        chunk = edges[start : start + chunk_size]
        if start:
            chunk = _drop_settled_edges(chunk, _roots(parent), owner_sets, n_nodes)
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


def super_clusters(centers, radii, owners):
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

    Returns
    -------
    labels : ndarray of shape (m,), int
        Super-cluster of every component, numbered ``0..n_super-1`` in order of first
        appearance.
    """
    centers = _as_centers(centers)
    m = centers.shape[0]
    owners = _as_int_vector(owners, m, "owners")
    pairs, ratio = candidate_pairs(centers, radii, owners)
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


# ---------------------------------------------------------------- consensus


def _closed_form_pairs(first, second, radii_first, radii_second, weights_first, weights_second):
    """Closest point of the intersection of two balls to the weighted mean of their centres.

    All arguments are batched over ``q`` pairs: centres (q, d), radii and weights (q,).
    The point lies on the segment between the centres:
    ``nu = c_1 + clip(w_2 / (w_1 + w_2), 1 - r_2/w, r_1/w) (c_2 - c_1)``, ``w = ||c_2 - c_1||``
    (``ALGORITHMS.md``: the paper prints the wrong sign). Returns ``(nu, nonempty)``.
    """
    direction = second - first
    gap = np.linalg.norm(direction, axis=1)
    nonempty = gap <= radii_first + radii_second
    fraction = weights_second / (weights_first + weights_second)
    separated = gap > 0
    safe_gap = np.where(separated, gap, 1.0)
    lower = np.where(separated, 1 - radii_second / safe_gap, -np.inf)
    upper = np.where(separated, radii_first / safe_gap, np.inf)
    step = np.clip(fraction, lower, np.maximum(lower, upper))
    return first + step[:, None] * direction, nonempty


def _emptiness_bound(multiplier, centers, radii, group, starts):
    """Per group, ``min_x sum_i lambda_i (||x - c_i||^2 - r_i^2)`` for ``lambda`` = the
    multipliers normalised to sum 1 (minimiser ``x = sum_i lambda_i c_i``); ``-inf`` where
    all multipliers are 0. A positive value proves that no point lies in all balls.
    Rows are sorted by ``group``; ``starts`` (g,) is where each group's block begins."""
    total = np.add.reduceat(multiplier, starts)
    weight = multiplier / np.where(total > 0, total, 1.0)[group]
    xbar = np.add.reduceat(centers * weight[:, None], starts, axis=0)
    offsets = xbar[group] - centers
    bound = np.add.reduceat(
        weight * (np.einsum("ij,ij->i", offsets, offsets) - radii**2), starts
    )
    return np.where(total > 0, bound, -np.inf)


def _dykstra_intersection(
    centers,
    radii,
    group,
    targets,
    *,
    # Late in a run every member ball passes through the members' common previous centroid,
    # so the intersection is often that single point, which Dykstra approaches only
    # sublinearly: 300 sweeps bound the cost, and the late acceptance below keeps the result.
    max_iter=300,
    check_every=10,
    move_tol=1e-12,
    feasibility_tol=1e-10,
    late_feasibility_tol=1e-4,
    emptiness_margin=1e-9,
):
    """Project every target onto the intersection of its group's balls, all groups at once.

    Dykstra's algorithm in the product space (one ball per member, the diagonal as the
    second set), which is Dykstra's algorithm with parallel projections: every sweep
    projects ``x_g + increment_i`` onto each member ball, updates the increments and
    sets ``x_g`` to the mean of the projections (a segment sum). The iterates converge
    to the projection of the target onto the intersection when it is non-empty.
    A parallel scheme was chosen over the cyclic one because it vectorises over all
    members of all groups at once whatever the group sizes.

    Every ``check_every`` sweeps a group stops when

    * ``x_g`` lies in every member ball up to ``feasibility_tol * scale`` and moved at
      most ``move_tol * scale`` since the last check (converged, feasible); or
    * the increments certify that the intersection is empty: for any ``lambda >= 0``
      summing to 1, ``min_x sum_i lambda_i (||x - c_i||^2 - r_i^2)`` is attained at
      ``x = sum_i lambda_i c_i``; if that minimum is positive (beyond
      ``emptiness_margin * scale^2``) no ``x`` lies in all balls. The increments
      estimate the Lagrange multipliers, so ``lambda_i`` proportional to
      ``||increment_i|| / max(r_i, ||x_g - c_i||)`` (or to ``||increment_i||``) is tried.
      This detects chained overlaps within a few sweeps, where the iterates
      themselves settle only slowly; or
    * ``max_iter`` is reached; the result then counts as feasible when it violates no
      ball by more than ``late_feasibility_tol * scale``. (Rarely, about one random
      instance in 3,000 with a non-empty intersection, Dykstra stalls for hundreds of
      sweeps while its increments build up and ends here infeasible: the caller then
      falls back as for an empty intersection.)

    ``scale`` is the group's largest radius or largest centre-to-target distance.

    Parameters
    ----------
    centers : ndarray of shape (r, d)
        Member ball centres.
    radii : ndarray of shape (r,)
        Member ball radii.
    group : ndarray of shape (r,), int
        Group of every member, in ``0..g-1``.
    targets : ndarray of shape (g, d)
        Point to project, per group.

    Returns
    -------
    projection : ndarray of shape (g, d)
    feasible : ndarray of shape (g,), bool
        False where the intersection is empty or no point of it was found; the caller
        must not use ``projection`` there.
    """
    n_groups = targets.shape[0]
    # Rows sorted by group, so that every group is a contiguous block: the per-group
    # means and maxima are then ufunc.reduceat calls, the cheapest segment reductions.
    order = np.argsort(group, kind="stable")
    group, radii = group[order], radii[order]
    # Work relative to the targets: the iterates and the emptiness bound then keep
    # their precision however far the balls are from the origin.
    centers = centers[order] - targets[group]
    counts = np.bincount(group, minlength=n_groups)
    starts = np.cumsum(counts) - counts
    scale = np.maximum.reduceat(np.maximum(radii, np.linalg.norm(centers, axis=1)), starts)

    shift = np.zeros_like(targets)
    feasible = np.zeros(n_groups, dtype=bool)
    active = np.arange(n_groups)
    row_group = group.copy()
    increment = np.zeros_like(centers)
    x = np.zeros_like(targets)
    x_at_check = x.copy()
    for sweep in range(1, max_iter + 1):
        shifted = np.repeat(x, counts, axis=0)
        shifted += increment
        landed = _project_onto_balls(shifted, centers, radii)
        increment = shifted - landed
        x = np.add.reduceat(landed, starts, axis=0) / counts[:, None]
        if sweep % check_every and sweep < max_iter:
            continue
        group_scale = scale[active]
        moved = np.linalg.norm(x - x_at_check, axis=1)
        distance = np.linalg.norm(x[row_group] - centers, axis=1)
        violation = np.maximum.reduceat(distance - radii, starts)
        converged = (violation <= feasibility_tol * group_scale) & (
            moved <= move_tol * group_scale
        )

        push = np.linalg.norm(increment, axis=1)
        reach = np.maximum(radii, distance)
        per_reach = np.divide(push, reach, out=np.zeros_like(push), where=reach > 0)
        empty = np.zeros(active.shape[0], dtype=bool)
        for multiplier in (per_reach, push):
            empty |= _emptiness_bound(multiplier, centers, radii, row_group, starts) > (
                emptiness_margin * group_scale**2
            )

        last = sweep == max_iter
        settled = converged | empty | last
        accepted = converged | (
            last & ~empty & (violation <= late_feasibility_tol * group_scale)
        )
        done = active[settled]
        shift[done] = x[settled]
        feasible[done] = accepted[settled]
        if settled.all():
            break
        keep_rows = ~settled[row_group]
        renumber = np.cumsum(~settled) - 1
        active, x, counts = active[~settled], x[~settled], counts[~settled]
        starts = np.cumsum(counts) - counts
        row_group = renumber[row_group[keep_rows]]
        centers, radii, increment = centers[keep_rows], radii[keep_rows], increment[keep_rows]
        x_at_check = x.copy()
    return targets + shift, feasible


def consensus_centers(centers, radii, weights, labels):
    """Move the members of every super-cluster to a common point of all their balls.

    For a super-cluster with two or more members, ``nu`` is the point of the
    intersection of the member balls closest to the weighted mean of their centres,
    and every member gets ``nu``. Two-member clusters use the closed form of
    ``ALGORITHMS.md`` (batched); larger clusters use Dykstra's alternating projections
    batched over all of them (see ``_dykstra_intersection``: converged to 1e-10 of the
    cluster's scale, or, after 300 sweeps, accepted if within 1e-4 of it). Where the
    intersection is empty (overlaps that chain), or Dykstra finds no point of it, every
    member instead gets the projection of the weighted mean onto its own ball.
    Singletons keep their centre. Finally every output is projected onto its own
    ball, so each lies in it up to rounding (about 1e-15 of the coordinates'
    magnitude): each client's update is a valid GEM step. Members of a cluster with
    a common point therefore agree up to Dykstra's tolerance.

    Parameters
    ----------
    centers : array-like of shape (m, d)
        Ball centres ``M``.
    radii : array-like of shape (m,)
        Ball radii ``sqrt(eps)``, non-negative.
    weights : array-like of shape (m,)
        Positive component weights ``N_g * pi_k``.
    labels : array-like of shape (m,), int
        Super-cluster of every component (any integer ids).

    Returns
    -------
    new_centers : ndarray of shape (m, d)
    """
    centers = _as_centers(centers)
    m = centers.shape[0]
    radii = _as_vector(radii, m, "radii")
    weights = _as_vector(weights, m, "weights", positive=True)
    labels = _as_int_vector(labels, m, "labels")
    if m == 0:
        return centers.copy()

    labels = np.unique(labels, return_inverse=True)[1].reshape(-1)
    n_clusters = int(labels.max()) + 1
    sizes = np.bincount(labels, minlength=n_clusters)
    weighted_mean = (
        _segment_sum(centers, labels, n_clusters, weights)
        / np.bincount(labels, weights=weights, minlength=n_clusters)[:, None]
    )
    # consensus[l] is cluster l's common point; agreed[l] says whether it exists.
    consensus = np.zeros_like(weighted_mean)
    agreed = np.zeros(n_clusters, dtype=bool)

    two = np.flatnonzero(sizes == 2)
    if two.size:
        order = np.argsort(labels, kind="stable")
        starts = np.cumsum(sizes) - sizes
        first, second = order[starts[two]], order[starts[two] + 1]
        consensus[two], agreed[two] = _closed_form_pairs(
            centers[first], centers[second], radii[first], radii[second],
            weights[first], weights[second],
        )

    many = np.flatnonzero(sizes >= 3)
    if many.size:
        group_of_cluster = np.full(n_clusters, -1)
        group_of_cluster[many] = np.arange(many.size)
        rows = np.flatnonzero(sizes[labels] >= 3)
        consensus[many], agreed[many] = _dykstra_intersection(
            centers[rows], radii[rows], group_of_cluster[labels[rows]], weighted_mean[many]
        )

    # Without a common point every member moves towards the weighted mean, as far as
    # its own ball allows (the projection below).
    new_centers = np.where(agreed[labels, None], consensus[labels], weighted_mean[labels])
    singleton = sizes[labels] == 1
    new_centers[singleton] = centers[singleton]
    return _project_onto_balls(new_centers, centers, radii)


# ---------------------------------------------------------------- rounds


@dataclass(frozen=True)
class ServerStep:
    """Result of one collaborative server step.

    Attributes
    ----------
    new_centers : ndarray of shape (m, d)
        Centroid each component's client adopts.
    labels : ndarray of shape (m,)
        Super-cluster of every component.
    n_super_clusters : int
    """

    new_centers: np.ndarray
    labels: np.ndarray
    n_super_clusters: int


def server_step(centers, eps, owners, weights):
    """One collaborative server step: super-clusters, then consensus.

    Parameters
    ----------
    centers : array-like of shape (m, d)
        Maximisers ``M`` sent by the clients.
    eps : array-like of shape (m,)
        Squared radii; the balls have radius ``sqrt(eps)``.
    owners : array-like of shape (m,), int
        Client id of every component.
    weights : array-like of shape (m,)
        Positive weights ``N_g * pi_k``.

    Returns
    -------
    ServerStep
    """
    centers = _as_centers(centers)
    radii = np.sqrt(_as_vector(eps, centers.shape[0], "eps"))
    labels = super_clusters(centers, radii, owners)
    new_centers = consensus_centers(centers, radii, weights, labels)
    n_super = int(labels.max()) + 1 if labels.size else 0
    return ServerStep(new_centers=new_centers, labels=labels, n_super_clusters=n_super)


@dataclass(frozen=True)
class FinalAggregation:
    """Result of the final aggregation.

    Attributes
    ----------
    labels : ndarray of shape (m,)
        Global cluster id of every component.
    global_centroids : ndarray of shape (k_hat, d)
        Weighted mean of the members of each global cluster; row ``l`` is cluster ``l``.
    k_hat : int
        Number of global clusters.
    """

    labels: np.ndarray
    global_centroids: np.ndarray
    k_hat: int


def final_aggregation(centers, eps_final, owners, weights):
    """Final merge: super-clusters on the final radii, then weighted means.

    Parameters
    ----------
    centers : array-like of shape (m, d)
        Final maximisers ``M``.
    eps_final : array-like of shape (m,)
        Squared final radii (see :func:`fedica.gem.final_radius`); balls have radius
        ``sqrt(eps_final)``.
    owners : array-like of shape (m,), int
        Client id of every component.
    weights : array-like of shape (m,)
        Positive weights ``N_g * pi_k``.

    Returns
    -------
    FinalAggregation
    """
    centers = _as_centers(centers)
    m = centers.shape[0]
    radii = np.sqrt(_as_vector(eps_final, m, "eps_final"))
    weights = _as_vector(weights, m, "weights", positive=True)
    labels = super_clusters(centers, radii, owners)
    k_hat = int(labels.max()) + 1 if m else 0
    global_centroids = (
        _segment_sum(centers, labels, k_hat, weights)
        / np.bincount(labels, weights=weights, minlength=k_hat)[:, None]
    )
    return FinalAggregation(labels=labels, global_centroids=global_centroids, k_hat=k_hat)


def select_upsilon(silhouettes, k_hats, guard):
    """Index of the winning upsilon in a tuning grid.

    Rule (``ALGORITHMS.md`` section 2): candidates with a NaN silhouette are never
    chosen. If some candidate has ``k_hat <= guard``, only those compete. Among the
    competitors the highest silhouette wins; silhouettes within 1e-12 of the best
    tie, and ties go to the smaller ``k_hat``, then to the smaller index.

    Parameters
    ----------
    silhouettes : array-like of shape (c,)
        Weighted mean silhouette per candidate (NaN allowed).
    k_hats : array-like of shape (c,)
        Number of global clusters per candidate.
    guard : float
        The largest k_hat that is not significantly above ``sqrt(sum_g K_g)`` (the
        caller scales that bound by its tolerance).

    Returns
    -------
    index : int
    """
    silhouettes = np.asarray(silhouettes, dtype=float)
    k_hats = np.asarray(k_hats)
    if silhouettes.ndim != 1 or silhouettes.size == 0:
        raise ValueError("silhouettes must be a non-empty 1-D array.")
    if k_hats.shape != silhouettes.shape:
        raise ValueError(
            f"k_hats must have the shape of silhouettes {silhouettes.shape}; got {k_hats.shape}."
        )
    if not np.isfinite(guard):
        raise ValueError(f"guard must be finite; got {guard!r}.")
    valid = ~np.isnan(silhouettes)
    if not valid.any():
        raise ValueError("silhouettes are all NaN: no upsilon can be selected.")
    competing = valid & (k_hats <= guard)
    if not competing.any():
        competing = valid
    best = silhouettes[competing].max()
    tied = competing & (silhouettes >= best - 1e-12)
    smallest_k = k_hats[tied].min()
    return int(np.flatnonzero(tied & (k_hats == smallest_k))[0])
