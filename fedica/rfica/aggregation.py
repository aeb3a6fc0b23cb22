"""RF-ICA's server step: sign alignment (eq. 3), benchmark choice (Remark 1), k-means over all
columns and the geometric median of each cluster (eqs. 4-7), optionally refined so that every site
puts one column in each cluster (``clustering="matched"``), each cluster's centre optionally
re-taken without its outlying members (``center="trimmed_geometric_median"``), with the F-ICA,
simple-mean and simple-median comparators from the same replies (docs/ALGORITHMS.md section 1).

Estimates have shape ``(K, p, r)``: ``r`` columns in a space of ``p >= r`` channels (``p = r`` when
every channel is kept).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.stats import chi2
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_limits

from fedica.parameters import BENCHMARK_RULES, CENTERS, CLUSTERINGS
from fedica.rfica.geometric_median import geometric_median
from fedica.seeding import sklearn_seed
from fedica.validation import as_float_array, check_index, check_int



# Relative gap under which two k-means objectives count as equal in choose_benchmark.
_OBJECTIVE_TIE_RTOL = 1e-9

# 2 - 2 |cos| of two unit columns below which they count as one direction (about 1e-6 radians apart):
# rounding alone leaves about 1e-16.
_SAME_DIRECTION_COST = 1e-12

# Columns whose largest entry lies in this range have a sum of squares that neither overflows (for any
# p below 1e28) nor loses digits to subnormal squares, so their norm is taken directly (as it always was:
# the same bits); outside it a column is divided by its largest entry first.
_PLAIN_NORM_RANGE = (1e-140, 1e140)

# Chance that an honest cluster keeps every member in trimmed_geometric_median when their deviations are
# isotropic Gaussian: the minimum covariance determinant's reweighting level (Rousseeuw and Van Driessen 1999,
# scikit-learn's MinCovDet keeps 97.5 % of the points), here for the whole cluster at once (Sidak), since every
# honest column dropped costs accuracy (a per-point 97.5 % cut dropped 6 % of honest columns, +7 % error).
_TRIM_KEEP_ALL = 0.975

# Bound on the assignment / median alternations of clustering="matched"; each one strictly lowers its
# objective, so this only guards against the medians' own tolerance making a cycle.
_MATCHED_MAX_ITER = 100
# Relative gain an assignment must bring over a site's current one to replace it (ties keep the current).
_ASSIGNMENT_RTOL = 1e-12


# The server compares the sites' columns in channel space, where a channel in a unit 1,000 times another's
# (millivolts beside microvolts) makes every column point along it: the sites' estimates then look degenerate
# (near-parallel columns) and the run stops. When the median site's largest row norm (a channel's scale in
# its estimates) is more than this many times the median row's, the server compares the columns with each
# channel divided by its scale (docs/ALGORITHMS.md section 1.4.3). Measured: 1.0 on the paper's simulation
# and the signals scenario, 1.15-2.01 on the recordings scenario (16 and 64 channels), 1,000 and more for a
# channel in another unit.
CHANNEL_SCALE_SPREAD_LIMIT = 10.0
# The same rule for a channel in far *smaller* units (microvolts beside volts): when the smallest channel's scale
# is below this share of the median's. Its row is then near zero in every unit-norm column, and every estimate looks
# rank-deficient; a smaller share than the large side's limit, as a channel far from every source has a low gain of
# its own: measured on the recordings scenario's own channels (4 to 32, 4 seeds), .16 to .82 of the median; a
# channel in units 1,000 times smaller, .0007 to .003.
SMALLEST_CHANNEL_SCALE_LIMIT = 0.01
# channel_scales' balancing: at most this many steps, stopping when no scale moves by more than _BALANCE_TOL; a
# channel whose median row norm is below _FLAT_CHANNEL of the median channel's is flat (dead) and keeps its scale.
_BALANCE_MAX_STEPS = 100
_BALANCE_TOL = 1e-9
_FLAT_CHANNEL = 1e-9


def channel_scales(estimates) -> np.ndarray:
    """Each channel's scale in the sites' estimates (p,), relative to the median channel's.

    A row of a mixing matrix is a channel's gain on the unit-variance sources, so its norm is the
    channel's scale in its own unit; but the sites send unit-norm columns, which squeeze the rows' norms
    (a channel 30 times the others' shows as 9 times). So the scales are balanced to their fixed point:
    divide every channel by its scale, make the columns unit-norm again, and multiply each scale by the
    median over the sites of its row's norm, relative to the median channel's, until no scale moves by
    more than 1e-9. At the fixed point, multiplying a channel by ``c`` at every site multiplies its scale
    by ``c``. The medians over the sites hold while fewer than half of them are hostile. A channel whose
    median row norm is below 1e-9 of the median channel's (flat at most sites: a dead channel) is not
    rescaled: its scale stays near the median channel's, so that dividing by it amplifies nothing.

    Parameters
    ----------
    estimates : array-like of shape (K, p, r)

    Returns
    -------
    scales : ndarray of shape (p,), positive, median 1
    """
    stack = np.asarray(estimates, dtype=np.float64)
    scales = np.ones(stack.shape[1])
    for _ in range(_BALANCE_MAX_STEPS):
        scaled = stack / scales[:, None]
        norms = np.linalg.norm(scaled, axis=1, keepdims=True)
        scaled = np.divide(scaled, norms, out=np.zeros_like(scaled), where=norms > 0)
        rows = np.median(np.linalg.norm(scaled, axis=2), axis=0)
        rows /= np.median(rows)
        rows = np.where(rows > _FLAT_CHANNEL, rows, 1.0)
        scales *= rows
        scales /= np.median(scales)
        if np.max(np.abs(rows - 1.0)) < _BALANCE_TOL:
            break
    return scales


def channel_scale_spread(scales: np.ndarray) -> float:
    """How far the channels' scales are apart: the largest over the median (1 when they agree)."""
    return float(scales.max() / np.median(scales))


def smallest_channel_scale(scales: np.ndarray) -> float:
    """The smallest channel's scale over the median channel's (1 when they agree)."""
    return float(scales.min() / np.median(scales))


def in_channel_units(matrix: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Columns found among channels divided by ``scales``, back in the channels' units, each with its norm kept."""
    back = matrix * scales[:, None]
    norms = np.linalg.norm(back, axis=0)
    return back * np.divide(np.linalg.norm(matrix, axis=0), norms, out=np.zeros_like(norms), where=norms > 0)


def align_signs(estimates, benchmark) -> np.ndarray:
    """Resolve the sign ambiguity against a benchmark client (paper eq. 3).

    For every client ``k`` and column ``i``, find the benchmark column ``j`` with
    the largest ``|cos(a_i^(k), a_j^(k0))|`` and flip ``a_i^(k)`` if its inner
    product with that column is negative. Columns orthogonal to every benchmark
    column (inner product 0) and zero columns are left unchanged. The benchmark
    estimate itself is returned unchanged.

    Parameters
    ----------
    estimates : array-like of shape (K, p, r)
        Client estimates, ``p >= r``; ``estimates[k][:, i]`` is column ``i`` of client ``k``.
    benchmark : int
        Index ``k0`` of the benchmark client in ``[0, K)``.

    Returns
    -------
    aligned : ndarray of shape (K, p, r)
        ``estimates`` with some columns multiplied by -1 (norms unchanged).
    """
    stack = _as_estimates(estimates)
    k0 = check_index(benchmark, "benchmark", stack.shape[0])
    return stack * _alignment_signs(stack, k0)[:, None, :]


def choose_benchmark(estimates, n_samples, *, rule="medoid", kmeans_restarts=10, random_state=None) -> int:
    """Benchmark client for sign alignment (paper Remark 1).

    Parameters
    ----------
    estimates : array-like of shape (K, p, r)
        Client estimates, ``p >= r`` (columns are re-normalised for ``"medoid"`` and ``"best_objective"``).
    n_samples : array-like of shape (K,)
        Clients' sample sizes, finite and non-negative (unused by ``"medoid"``).
    rule : {"medoid", "largest", "best_objective"}, default="medoid"
        ``"medoid"``: the client whose estimate has the smallest sum of
        :func:`signed_permutation_distance` to all others' (lowest index on ties); no number a
        client reports about itself has a say, and fewer than half of the clients cannot make
        one of theirs the medoid unless their estimates are nearer the honest ones than the
        honest ones are to each other. ``"largest"``: the client with the largest ``n_k``
        (lowest index on ties), the paper's rule, which one client claiming a large count decides.
        ``"best_objective"``: the client whose use as benchmark gives the smallest
        k-means objective of the aligned columns. Every candidate is tried (one
        k-means per distinct sign pattern, all with the same seed), so this costs
        up to ``K`` k-means runs. Objectives within a relative ``1e-9`` count as
        tied (flipping a whole true cluster leaves the objective unchanged, so
        exact ties are common); ties go to the largest ``n_k``, then the lowest index.
    kmeans_restarts : int, default=10
        ``n_init`` of each k-means (``"best_objective"`` only).
    random_state : int, numpy.random.Generator or None, default=None
        Seed source of the k-means runs (``"best_objective"`` only).

    Returns
    -------
    k0 : int
        Index of the benchmark client.
    """
    stack = _as_estimates(estimates)
    sizes = _as_sample_sizes(n_samples, stack.shape[0])
    if rule == "medoid":
        return medoid_benchmark(normalise_estimates(stack))
    if rule == "largest":
        return int(np.argmax(sizes))
    if rule != "best_objective":
        raise ValueError(f"rule must be one of {BENCHMARK_RULES}, got {rule!r}")
    kmeans_restarts = check_int(kmeans_restarts, "kmeans_restarts", minimum=1)
    seed = sklearn_seed(np.random.default_rng(random_state))
    return _benchmark_by_objective(normalise_estimates(stack), sizes, kmeans_restarts, seed)


@dataclass(frozen=True)
class RfIcaAggregate:
    """Result of :func:`rf_ica_aggregate`.

    Output columns are ordered like the benchmark client's columns: column ``j``
    of ``rf_ica`` and ``f_ica`` belongs to the cluster matched to benchmark column
    ``j`` (k-means: the assignment maximising the total cosine between the centroids
    and the benchmark's aligned columns; matched: the cluster the benchmark's column
    ``j`` is assigned to), so ``labels`` take values in ``range(r)`` with the same meaning.

    Attributes
    ----------
    rf_ica : ndarray of shape (p, r)
        RF-ICA estimate: geometric median of each cluster, as columns.
    f_ica : ndarray of shape (p, r)
        F-ICA baseline: the raw k-means centroids as columns, NOT re-normalised
        (as in the paper; a centroid of unit vectors has norm <= 1).
    simple_mean : ndarray of shape (p, r)
        Column ``i`` = mean of column ``i`` of the sign-aligned estimates (no clustering).
    simple_median : ndarray of shape (p, r)
        Column ``i`` = geometric median of column ``i`` of the sign-aligned estimates.
    benchmark : int
        Index of the benchmark client.
    labels : ndarray of shape (K, r), dtype int
        ``labels[k, i]`` = cluster (output column) of column ``i`` of client ``k``;
        with ``clustering="matched"`` every row is a permutation of ``range(r)``.
    signs : ndarray of shape (K, r)
        The sign (+1 or -1) column ``i`` of client ``k`` (normalised) enters its cluster with:
        eq. 3's alignment to the benchmark (k-means), or the sign of its cosine to its
        cluster's median (matched).
    inertia : float
        k-means objective (sum of squared distances to the centroids).
    clustering : {"kmeans", "matched"}
        The clustering that made ``labels`` and ``rf_ica``.
    matched_iterations : int
        Assignment steps of ``clustering="matched"`` (the last one changed nothing); 0 for k-means.
    center : {"geometric_median", "trimmed_geometric_median", "trimmed_mean"}
        How ``rf_ica``'s columns were taken from the clusters.
    trimmed : ndarray of shape (K, r), dtype bool
        ``trimmed[k, i]``: column ``i`` of client ``k`` was dropped from its cluster's centre
        (:func:`trimmed_geometric_median`, :func:`trimmed_mean`); all False for the plain geometric median.
    method_seconds : dict of str to float
        Each method's own server time (``rf-ica``, ``f-ica``, ``simple-mean``, ``simple-median``):
        the shared normalisation, benchmark choice and sign alignment, plus its own step.
    """

    rf_ica: np.ndarray
    f_ica: np.ndarray
    simple_mean: np.ndarray
    simple_median: np.ndarray
    benchmark: int
    labels: np.ndarray
    signs: np.ndarray
    inertia: float
    clustering: str = "kmeans"
    matched_iterations: int = 0
    center: str = "geometric_median"
    trimmed: np.ndarray | None = None
    method_seconds: dict[str, float] = field(default_factory=dict)


def rf_ica_aggregate(
    estimates, n_samples, *, benchmark="medoid", kmeans_restarts=10, gm_tol=1e-10, clustering="kmeans",
    center="geometric_median", random_state=None, column_weights=None
) -> RfIcaAggregate:
    """One-shot RF-ICA server aggregation (Algorithm 1 of the paper).

    Steps: re-normalise every client's columns (a client may send unnormalised
    columns); choose the benchmark client; align signs (eq. 3); k-means of the
    ``K * r`` columns into ``r`` clusters (``sklearn.cluster.KMeans``,
    ``n_init=kmeans_restarts``, lowest objective kept); geometric median of
    each cluster (eq. 7). With ``clustering="matched"`` the clusters are then
    refined until every client has exactly one column in each
    (docs/ALGORITHMS.md section 1.4.1). The baselines of section 4 are computed alongside.

    Parameters
    ----------
    estimates : array-like of shape (K, p, r)
        Client estimates, ``K >= 1``, ``p >= r`` channels, finite, no zero column.
        Columns of any scale (even near the limits of float64) are accepted.
    n_samples : array-like of shape (K,)
        Clients' sample sizes (the benchmark rules "largest" and "best_objective" use them), finite, non-negative.
    benchmark : {"medoid", "largest", "best_objective"} or int, default="medoid"
        Rule of :func:`choose_benchmark`, or an explicit client index.
    kmeans_restarts : int, default=10
        k-means restarts (``n_init``).
    gm_tol : float, default=1e-10
        ``tol`` of :func:`fedica.rfica.geometric_median.geometric_median`.
    clustering : {"kmeans", "matched"}, default="kmeans"
        ``"kmeans"``: the paper's clusters. ``"matched"``: starting from them, alternate a
        linear assignment of every client's columns to the cluster medians (one column
        per cluster, each with the sign of its cosine to its median) and the medians of
        the assigned columns, until no assignment changes.
    center : {"geometric_median", "trimmed_geometric_median", "trimmed_mean"}, default="geometric_median"
        Each final cluster's centre (``rf_ica``'s column): the paper's geometric median, or
        :func:`trimmed_geometric_median` or :func:`trimmed_mean` of the cluster's signed columns (the
        clusters are the same).
    random_state : int, numpy.random.Generator or None, default=None
        Seed source of k-means.
    column_weights : array-like of shape (K, r) or None, default=None
        Each client column's weight in its cluster's trimmed centre, in ``(0, 1]``: how well the
        client sees that source (:func:`fedica.rfica.uncertainty.column_weights`). Only the trimmed
        centres use them; None: every column counts once.

    Returns
    -------
    result : RfIcaAggregate
        RF-ICA estimate, the three baselines, benchmark, labels and k-means objective.

    Raises
    ------
    ValueError
        If ``estimates`` is not a non-empty finite ``(K, p, r)`` array with ``p >= r``, has a zero
        column, ``n_samples`` does not have shape ``(K,)`` or is negative/non-finite,
        ``benchmark`` is neither a known rule nor a valid index, or ``clustering`` or ``center`` is unknown.
    """
    stack = _as_estimates(estimates)
    n_clients, _, r = stack.shape
    sizes = _as_sample_sizes(n_samples, n_clients)
    kmeans_restarts = check_int(kmeans_restarts, "kmeans_restarts", minimum=1)
    if clustering not in CLUSTERINGS:
        raise ValueError(f"clustering must be one of {CLUSTERINGS}, got {clustering!r}")
    if center not in CENTERS:
        raise ValueError(f"center must be one of {CENTERS}, got {center!r}")
    started = time.perf_counter()
    unit = normalise_estimates(stack)
    seed = sklearn_seed(np.random.default_rng(random_state))

    if benchmark == "best_objective":
        # Same k-means seed as below: the final clustering is the winning candidate's.
        k0 = _benchmark_by_objective(unit, sizes, kmeans_restarts, seed)
    elif benchmark == "medoid":
        k0 = medoid_benchmark(unit)
    elif isinstance(benchmark, str):
        k0 = choose_benchmark(unit, sizes, rule=benchmark)
    else:
        k0 = check_index(benchmark, "benchmark", n_clients)
    alignment = _alignment_signs(unit, k0)
    aligned = unit * alignment[:, None, :]
    shared = time.perf_counter() - started

    started = time.perf_counter()
    kmeans = _kmeans_columns(aligned, kmeans_restarts, seed)
    # Relabel clusters so that cluster j is the one matched to benchmark column j.
    centroids = kmeans.cluster_centers_
    centroid_norms = np.linalg.norm(centroids, axis=1)
    cosines = aligned[k0].T @ centroids.T / np.where(centroid_norms == 0, 1.0, centroid_norms)
    cluster_of_column = linear_sum_assignment(-cosines)[1]
    centroids = centroids[cluster_of_column]
    relabel = np.empty(r, dtype=int)
    relabel[cluster_of_column] = np.arange(r)
    labels = relabel[kmeans.labels_].reshape(n_clients, r)

    clustering_seconds = time.perf_counter() - started
    started = time.perf_counter()
    columns = _columns(aligned)
    # A cluster can only be empty when there are fewer distinct columns than r; keep its centroid.
    rf_ica = np.column_stack(
        [
            geometric_median(columns[labels.ravel() == cluster], tol=gm_tol)
            if np.any(labels == cluster)
            else centroids[cluster]
            for cluster in range(r)
        ]
    )
    # The sign each aligned column enters its cluster with: +1 under k-means, its own under matched.
    entering, iterations = np.ones((n_clients, r)), 0
    if clustering == "matched":
        labels, entering, rf_ica, iterations = _matched_clusters(aligned, labels, rf_ica, k0, gm_tol)
    signs = alignment * entering
    trimmed = np.zeros((n_clients, r), dtype=bool)
    if center != "geometric_median":
        rf_ica, trimmed = _trimmed_centres(aligned * entering[:, None, :], labels, rf_ica, gm_tol, center,
                                           _as_column_weights(column_weights, (n_clients, r)))
    medians = time.perf_counter() - started
    started = time.perf_counter()
    simple_median = np.column_stack([geometric_median(aligned[:, :, i], tol=gm_tol) for i in range(r)])
    column_medians = time.perf_counter() - started
    started = time.perf_counter()
    simple_mean = aligned.mean(axis=0)
    mean = time.perf_counter() - started
    return RfIcaAggregate(
        rf_ica=rf_ica,
        f_ica=centroids.T.copy(),
        simple_mean=simple_mean,
        simple_median=simple_median,
        benchmark=int(k0),
        labels=labels,
        signs=signs,
        inertia=float(kmeans.inertia_),
        clustering=clustering,
        matched_iterations=iterations,
        center=center,
        trimmed=trimmed,
        method_seconds={"rf-ica": shared + clustering_seconds + medians, "f-ica": shared + clustering_seconds,
                        "simple-mean": shared + mean, "simple-median": shared + column_medians},
    )


def trimmed_geometric_median(points, *, tol=1e-10, spread_dims=None, weights=None):
    """Geometric median re-taken without the points far beyond the others' spread (docs/ALGORITHMS.md 1.4.2).

    One reweighting step, as the minimum covariance determinant's: the geometric median ``m`` of
    all points, their distances ``d_i = ||x_i - m||``, the robust scale ``s = median(d)``, and the
    geometric median of the points with ``d_i <= c s``. If the ``n`` points' deviations are
    isotropic Gaussian in ``q = spread_dims`` dimensions, ``d^2 / sigma^2`` is chi-squared with
    ``q`` degrees of freedom, ``s^2`` about ``sigma^2 chi2_q(0.5)``, and
    ``c = sqrt(chi2_q(0.975^(1/n)) / chi2_q(0.5))`` keeps all of them with probability 0.975
    (``c`` = 2.37 for 30 points in 4 dimensions). ``c > 1``, so the points within ``s`` (at least
    half) are always kept: no more than half is ever dropped. Where
    ``s = 0`` (more than half the points on the median) nothing is dropped: there is no spread
    to judge by, and the median already lies on the majority's point.

    Parameters
    ----------
    points : array-like of shape (n_points, n_dims)
        Finite, ``n_points >= 1``.
    tol : float, default=1e-10
        ``tol`` of both :func:`fedica.rfica.geometric_median.geometric_median` runs.
    spread_dims : int or None, default=None
        The dimension ``q`` of the honest points' spread; None: ``n_dims``. Unit columns in
        ``R^p`` spread on the sphere's tangent space, ``p - 1`` dimensions.
    weights : array-like of shape (n_points,) or None, default=None
        Positive weights of the points in both medians and in the typical distance
        (:func:`spread_cut`); None: all equal (the unweighted computation, bit for bit).

    Returns
    -------
    center : ndarray of shape (n_dims,)
    kept : ndarray of shape (n_points,), dtype bool
        The points the centre was re-taken from (all of them when none was dropped, in which
        case ``center`` is the plain geometric median, bit for bit).
    """
    center, kept = spread_cut(points, spread_dims=spread_dims, tol=tol, weights=weights)
    if kept.all():
        return center, kept
    return geometric_median(points[kept], None if weights is None else np.asarray(weights, float)[kept],
                            tol=tol), kept


def trimmed_mean(points, *, tol=1e-10, spread_dims=None, weights=None):
    """Mean of the points :func:`trimmed_geometric_median` keeps (docs/ALGORITHMS.md 1.4.2).

    The same cut (the geometric median ``m``, the median distance ``s`` to it, every point within
    ``c s`` kept), then the plain mean of the kept points. Why a mean: on honest sites the
    geometric median of a handful of estimates is a median, which loses efficiency against a
    pooled fit (six sites of 1,000 to 5,000 samples: 1.2 to 1.8 times the pooled FastICA's error
    where the mean of the clean sites' estimates equals it), while the cut leaves a hostile or
    poor site only the room inside ``c s`` of the median, a bias of at most ``c s`` times its
    share of the kept points. Every point counts once: a site's claimed sample count would let it
    weigh more.

    Parameters
    ----------
    points : array-like of shape (n_points, n_dims)
        Finite, ``n_points >= 1``.
    tol : float, default=1e-10
        ``tol`` of the geometric median the cut is measured from.
    spread_dims : int or None, default=None
        As in :func:`trimmed_geometric_median`.
    weights : array-like of shape (n_points,) or None, default=None
        As in :func:`trimmed_geometric_median`; the kept points' mean is then weighted too.

    Returns
    -------
    center : ndarray of shape (n_dims,)
    kept : ndarray of shape (n_points,), dtype bool
        The points averaged.
    """
    points = as_float_array(points, "points")
    _, kept = spread_cut(points, spread_dims=spread_dims, tol=tol, weights=weights)
    if weights is None:
        return points[kept].mean(axis=0), kept
    kept_weights = np.asarray(weights, dtype=np.float64)[kept]
    return kept_weights @ points[kept] / kept_weights.sum(), kept


def spread_cut(points, *, spread_dims=None, tol=1e-10, scale=None, factor=1.0, weights=None):
    """The geometric median ``m`` of ``points`` and the mask of the points within ``factor c s`` of it.

    ``d_i = scale_i ||x_i - m||``, ``s = median(d)``, ``c`` the cut of :func:`trimmed_geometric_median`
    for ``len(points)`` points in ``spread_dims`` dimensions. Since ``factor c > 1``, the points within
    ``s`` (at least half) are always kept; where ``s = 0`` every point is.

    Parameters
    ----------
    points : array-like of shape (n_points, n_dims)
        Finite, ``n_points >= 1``.
    spread_dims : int or None, default=None
        The dimension of the honest points' spread; None: ``n_dims``.
    tol : float, default=1e-10
        ``tol`` of the geometric median.
    scale : array-like of shape (n_points,) or None, default=None
        Positive factors on the points' distances (a point whose error is expected smaller is held to a
        tighter bound); None: all 1.
    factor : float, default=1.0
        The cut in units of ``c`` (at least 1).
    weights : array-like of shape (n_points,) or None, default=None
        Positive weights: ``m`` is then the weighted geometric median and ``s`` the weighted median
        distance (the smallest distance with at least half the weight within it); None: all equal.

    Returns
    -------
    center : ndarray of shape (n_dims,)
    kept : ndarray of shape (n_points,), dtype bool
    """
    points = as_float_array(points, "points")
    if points.ndim != 2 or points.shape[0] < 1:
        raise ValueError(f"points must have shape (n_points, n_dims) with n_points >= 1, got {points.shape}")
    dof = points.shape[1] if spread_dims is None else check_int(spread_dims, "spread_dims", minimum=1)
    if factor < 1:
        raise ValueError(f"factor must be at least 1, got {factor}")
    center = geometric_median(points, None if weights is None else np.asarray(weights, float), tol=tol)
    distances = np.linalg.norm(points - center, axis=1) * (1.0 if scale is None else np.asarray(scale, float))
    typical = np.median(distances) if weights is None else weighted_median(distances, weights)
    if typical == 0:
        return center, np.ones(points.shape[0], dtype=bool)
    return center, distances <= factor * trim_cut(dof, points.shape[0]) * typical


def weighted_median(values, weights) -> float:
    """The smallest of ``values`` with at least half of the total weight at or below it (``weights`` positive)."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(np.asarray(weights, dtype=np.float64)[order])
    return float(np.asarray(values)[order][np.searchsorted(cumulative, cumulative[-1] / 2)])


def trim_cut(dof, n_points):
    """``c`` of :func:`trimmed_geometric_median` (in median distances) for ``n_points`` in ``dof`` dimensions."""
    # 1 - 0.975^(1/n) computed without cancellation for large n.
    tail = -np.expm1(np.log(_TRIM_KEEP_ALL) / n_points)
    return float(np.sqrt(chi2.isf(tail, dof) / chi2.ppf(0.5, dof)))


def _trimmed_centres(signed, labels, medians, gm_tol, center, weights=None):
    """Each cluster's trimmed centre (``center``: :func:`trimmed_geometric_median` or :func:`trimmed_mean`)
    of its signed unit columns ``(K, p, r)``.

    ``weights`` (K, r), each column's weight in its cluster (None: all equal). Returns the centres as
    columns ``(p, r)`` (an empty cluster keeps its column of ``medians``) and the ``(K, r)`` mask of the
    columns dropped.
    """
    columns, flat_labels = _columns(signed), labels.ravel()
    flat_weights = None if weights is None else np.asarray(weights, dtype=np.float64).ravel()
    spread_dims = max(signed.shape[1] - 1, 1)
    trim = trimmed_mean if center == "trimmed_mean" else trimmed_geometric_median
    centres, dropped = medians.copy(), np.zeros(flat_labels.shape, dtype=bool)
    for cluster in np.unique(flat_labels):
        members = np.flatnonzero(flat_labels == cluster)
        centres[:, cluster], kept = trim(columns[members], tol=gm_tol, spread_dims=spread_dims,
                                         weights=None if flat_weights is None else flat_weights[members])
        dropped[members[~kept]] = True
    return centres, dropped.reshape(labels.shape)


def _matched_clusters(aligned, labels, medians, k0, gm_tol):
    """Refine clusters until every client has one column in each (docs/ALGORITHMS.md section 1.4.1).

    Block coordinate descent of ``F = sum_k sum_i ||s_ki a_ki - c_(pi_k(i))||`` over the
    assignments ``pi_k`` (one permutation per client), the signs ``s_ki`` and the centres ``c_j``.

    Parameters
    ----------
    aligned : ndarray of shape (K, p, r)
        Unit, sign-aligned client columns.
    labels : ndarray of shape (K, r)
        The k-means labels (the start; rows need not be permutations).
    medians : ndarray of shape (p, r)
        The geometric medians of the k-means clusters, as columns (the first centres).
    k0 : int
        The benchmark client: output column ``j`` is the cluster of its column ``j``.
    gm_tol : float

    Returns
    -------
    labels : ndarray of shape (K, r), dtype int
        Every row a permutation of ``range(r)``.
    signs : ndarray of shape (K, r)
        The sign each aligned column enters its cluster with.
    medians : ndarray of shape (p, r)
        Each cluster's geometric median of its signed columns.
    iterations : int
        Assignment steps made (the last changed nothing, unless the bound was reached).
    """
    n_clients, _, r = aligned.shape
    signs = np.ones((n_clients, r))
    for iteration in range(1, _MATCHED_MAX_ITER + 1):
        new_labels, new_signs = _assign_columns(aligned, medians.T, labels)
        if np.array_equal(new_labels, labels) and np.array_equal(new_signs, signs):
            break
        labels, signs = new_labels, new_signs
        signed = _columns(aligned * signs[:, None, :])
        medians = np.column_stack([geometric_median(signed[labels.ravel() == j], tol=gm_tol) for j in range(r)])
    else:
        warnings.warn(f"clustering='matched' stopped after {_MATCHED_MAX_ITER} assignment steps without settling",
                      ConvergenceWarning, stacklevel=3)
    # Renumber the clusters so that output column j holds the benchmark's column j.
    order = labels[k0]
    relabel = np.empty(r, dtype=int)
    relabel[order] = np.arange(r)
    return relabel[labels], signs, medians[:, order], iteration


def _assign_columns(aligned, centres, current):
    """Each client's columns to distinct centres, minimising the total distance to the nearer of ``±a``.

    ``||s a - c||^2 = 1 + ||c||^2 - 2 s <a, c>`` for a unit ``a``, so the best sign is that of
    ``<a, c>`` and the cost a decreasing function of ``|cos(a, c)|`` for each centre. A client keeps
    its ``current`` assignment (if a permutation) unless the new one is cheaper by more than a rounding
    margin, so that a tie never makes the alternation cycle.

    Parameters
    ----------
    aligned : ndarray of shape (K, p, r)
    centres : ndarray of shape (r, p)
    current : ndarray of shape (K, r), dtype int

    Returns
    -------
    labels : ndarray of shape (K, r), dtype int
    signs : ndarray of shape (K, r)
    """
    n_clients, _, r = aligned.shape
    inner = np.einsum("kpi,jp->kij", aligned, centres)
    squared_norms = np.einsum("jp,jp->j", centres, centres)
    costs = np.sqrt(np.maximum(1.0 + squared_norms - 2.0 * np.abs(inner), 0.0))
    labels = np.empty((n_clients, r), dtype=int)
    columns = np.arange(r)
    for k in range(n_clients):
        labels[k] = linear_sum_assignment(costs[k])[1]
        if np.array_equal(np.sort(current[k]), columns):
            best, kept = costs[k, columns, labels[k]].sum(), costs[k, columns, current[k]].sum()
            if kept <= best + _ASSIGNMENT_RTOL * (1.0 + best):
                labels[k] = current[k]
    chosen = np.take_along_axis(inner, labels[:, :, None], axis=2)[..., 0]
    return labels, np.where(chosen < 0, -1.0, 1.0)


def signed_permutation_distance(first, second) -> float:
    """``min over signed permutations P of ||U - V P||_F`` of two estimates' unit columns ``U`` and ``V``.

    The distance between two estimates of the same mixing that ICA's ambiguity (the order and
    sign of the columns, their scale) cannot tell apart: 0 exactly when one is a signed
    permutation of the other, after normalising their columns. With unit columns
    ``||u - s v||^2 = 2 - 2 s <u, v>``, so the best sign of a matched pair is that of ``<u, v>``
    and the permutation a linear assignment on ``2 - 2 |<u_i, v_j>|``.

    Parameters
    ----------
    first, second : array-like of shape (p, r)
        Two estimates with no zero column (columns of any scale).

    Returns
    -------
    distance : float
    """
    stack = normalise_estimates(_as_estimates(np.stack([np.asarray(first, dtype=np.float64),
                                                         np.asarray(second, dtype=np.float64)])))
    return float(np.sqrt(_pairwise_signed_distances(stack)[0, 1]))


def medoid_benchmark(unit) -> int:
    """Rule "medoid" of :func:`choose_benchmark` on unit-column estimates ``(K, p, r)``: lowest index on ties.

    ``K (K - 1) / 2`` distances, each ``O(r^2 p)``, plus a linear assignment of ``r x r`` where the
    columns' nearest partners are not already a permutation.
    """
    squared = _pairwise_signed_distances(np.asarray(unit, dtype=np.float64))
    return int(np.argmin(np.sqrt(squared).sum(axis=1)))


def _pairwise_signed_distances(unit):
    """(K, K) squared :func:`signed_permutation_distance` between every two unit-column estimates."""
    n_clients, _, r = unit.shape
    squared = np.zeros((n_clients, n_clients))
    for k in range(n_clients - 1):
        # 2 - 2 |cos| against every later client; below _SAME_DIRECTION_COST (rounding, or a cosine of
        # 1 + 1e-16) it is 0, so that exact copies tie exactly and the tie goes to the lowest index.
        costs = 2.0 - 2.0 * np.abs(np.einsum("pi,lpj->lij", unit[k], unit[k + 1:]))
        costs[costs < _SAME_DIRECTION_COST] = 0.0
        # Where every column's cheapest partner is a different column, that permutation reaches the
        # sum of the row minima, a lower bound of every assignment: it is optimal without solving one.
        nearest = np.argmin(costs, axis=2)
        distinct = np.all(np.sort(nearest, axis=1) == np.arange(r), axis=1)
        totals = np.take_along_axis(costs, nearest[:, :, None], axis=2)[:, :, 0].sum(axis=1)
        for index in np.flatnonzero(~distinct):
            rows, cols = linear_sum_assignment(costs[index])
            totals[index] = costs[index, rows, cols].sum()
        squared[k, k + 1:] = squared[k + 1:, k] = totals
    return squared


def _alignment_signs(stack, k0):
    """(K, r) signs of eq. 3 that align every client's columns with client ``k0``."""
    unit = _unit_columns(stack)
    cosines = np.einsum("kdi,dj->kij", unit, unit[k0])
    best = np.argmax(np.abs(cosines), axis=2)
    best_cosine = np.take_along_axis(cosines, best[..., None], axis=2)[..., 0]
    signs = np.where(best_cosine < 0, -1.0, 1.0)
    signs[k0] = 1.0
    return signs


def _benchmark_by_objective(unit, sizes, restarts, seed):
    """Rule "best_objective" of :func:`choose_benchmark` on unit-column estimates."""
    objective_of_pattern = {}
    objectives = np.empty(unit.shape[0])
    for candidate in range(unit.shape[0]):
        signs = _alignment_signs(unit, candidate)
        pattern = signs.tobytes()
        if pattern not in objective_of_pattern:
            objective_of_pattern[pattern] = _kmeans_columns(unit * signs[:, None, :], restarts, seed).inertia_
        objectives[candidate] = objective_of_pattern[pattern]
    tied = objectives <= objectives.min() * (1 + _OBJECTIVE_TIE_RTOL) + np.finfo(float).tiny
    return int(np.argmax(np.where(tied, sizes, -np.inf)))


def _kmeans_columns(aligned, restarts, seed):
    """k-means of the ``K * r`` columns into ``r`` clusters."""
    r = aligned.shape[2]
    kmeans = KMeans(n_clusters=r, n_init=restarts, random_state=seed)
    # One OpenMP thread: K * r points are few, and on busy cores (a federation
    # simulation) OpenMP's spinning threads made single fits up to 10x slower.
    with warnings.catch_warnings(), threadpool_limits(limits=1, user_api="openmp"):
        # Fewer distinct columns than clusters (e.g. identical clients) is legitimate here.
        warnings.simplefilter("ignore", ConvergenceWarning)
        return kmeans.fit(_columns(aligned))


def _columns(stack):
    """(K, p, r) -> (K * r, p): row ``k * r + i`` is column ``i`` of client ``k``."""
    return stack.transpose(0, 2, 1).reshape(-1, stack.shape[1])


def normalise_estimates(stack) -> np.ndarray:
    """``(K, p, r)`` estimates' unit columns, whatever their scale: a column is zero only if all its entries are.

    The sum of squares of a column near 1e200 overflows (its norm inf, the column 0) and that of a
    column near 1e-170 underflows (its norm 0, the column taken as zero), so such columns are divided
    by their largest entry first. Columns in ``_PLAIN_NORM_RANGE`` are divided by their norm directly,
    which keeps the results of ordinary estimates bit for bit what they were.
    """
    peaks = np.max(np.abs(stack), axis=1, keepdims=True)
    zero = np.argwhere(peaks[:, 0, :] == 0)
    if zero.size:
        client, column = zero[0]
        raise ValueError(
            f"estimates must have non-zero columns: column {column} of client {client} is zero "
            f"({len(zero)} zero column(s) in total)"
        )
    return _unit_columns(stack, peaks)


def _unit_columns(stack, peaks=None):
    """``stack``'s columns divided by their norms, computed without overflow or underflow; zero columns stay zero.

    Columns whose largest entry is in ``_PLAIN_NORM_RANGE`` are divided by their norm directly (the
    division by 1.0 below is exact), the others by their largest entry first.
    """
    if peaks is None:
        peaks = np.max(np.abs(stack), axis=1, keepdims=True)
    low, high = _PLAIN_NORM_RANGE
    plain = ((peaks >= low) & (peaks <= high)) | (peaks == 0)
    scaled = stack / np.where(plain, 1.0, peaks)
    norms = np.linalg.norm(scaled, axis=1, keepdims=True)
    return scaled / np.where(norms == 0, 1.0, norms)


def _as_estimates(estimates):
    stack = as_float_array(estimates, "estimates")
    if stack.ndim != 3 or stack.shape[1] < stack.shape[2]:
        raise ValueError(f"estimates must have shape (K, p, r) with p >= r channels, got {stack.shape}")
    if stack.shape[0] < 1:
        raise ValueError("estimates must hold at least one client (K >= 1), got K = 0")
    if stack.shape[2] < 1:
        raise ValueError(f"estimates must have r >= 1, got shape {stack.shape}")
    finite = np.all(np.isfinite(stack), axis=(1, 2))
    if not np.all(finite):
        raise ValueError(f"estimates must be finite: client(s) {np.flatnonzero(~finite).tolist()} contain NaN or inf")
    return stack


def _as_column_weights(weights, shape):
    if weights is None:
        return None
    weights = as_float_array(weights, "column_weights")
    if weights.shape != shape or not np.all((weights > 0) & (weights <= 1)):
        raise ValueError(f"column_weights must have shape {shape} with values in (0, 1], got shape {weights.shape}")
    return weights


def _as_sample_sizes(n_samples, n_clients):
    sizes = as_float_array(n_samples, "n_samples")
    if sizes.shape != (n_clients,):
        raise ValueError(f"n_samples must have shape ({n_clients},) to match estimates, got {sizes.shape}")
    if not np.all(np.isfinite(sizes)) or np.any(sizes < 0):
        raise ValueError("n_samples must be finite and non-negative")
    return sizes
