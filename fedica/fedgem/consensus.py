"""The consensus point of a super-cluster: the point of the intersection of all member balls
closest to the members' weighted mean (closed form for two members, Dykstra's alternating
projections otherwise; each member's own-ball projection where the intersection is empty).
"""

from __future__ import annotations

import numpy as np
from scipy import sparse

from fedica.validation import as_centers, as_int_vector, as_vector


def segment_sum(values, labels, n_segments, row_weights):
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


def _closed_form_pairs(first, second, radii_first, radii_second, weights_first, weights_second):
    """Closest point of the intersection of two balls to the weighted mean of their centres.

    All arguments are batched over ``q`` pairs: centres (q, d), radii and weights (q,).
    The point lies on the segment between the centres:
    ``nu = c_1 + clip(w_2 / (w_1 + w_2), 1 - r_2/w, r_1/w) (c_2 - c_1)``, ``w = ||c_2 - c_1||``
    (docs/ALGORITHMS.md section 2.3, step 3: the paper prints the wrong sign). Returns ``(nu, nonempty)``.
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
    docs/ALGORITHMS.md section 2.3, step 3 (batched); larger clusters use Dykstra's alternating projections
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
    centers = as_centers(centers)
    m = centers.shape[0]
    radii = as_vector(radii, m, "radii")
    weights = as_vector(weights, m, "weights", positive=True)
    labels = as_int_vector(labels, m, "labels")
    if m == 0:
        return centers.copy()

    labels = np.unique(labels, return_inverse=True)[1].reshape(-1)
    n_clusters = int(labels.max()) + 1
    sizes = np.bincount(labels, minlength=n_clusters)
    weighted_mean = (
        segment_sum(centers, labels, n_clusters, weights)
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
