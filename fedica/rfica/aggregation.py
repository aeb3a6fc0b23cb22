"""RF-ICA's server step: sign alignment (eq. 3), benchmark choice (Remark 1), k-means over all
columns and the geometric median of each cluster (eqs. 4-7), with the F-ICA, simple-mean and
simple-median comparators from the same replies (docs/ALGORITHMS.md section 1).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_limits

from fedica.rfica.geometric_median import geometric_median
from fedica.seeding import sklearn_seed
from fedica.validation import as_float_array, check_index, check_int

BENCHMARK_RULES = ("largest", "best_objective")


# Relative gap under which two k-means objectives count as equal in choose_benchmark.
_OBJECTIVE_TIE_RTOL = 1e-9


def align_signs(estimates, benchmark) -> np.ndarray:
    """Resolve the sign ambiguity against a benchmark client (paper eq. 3).

    For every client ``k`` and column ``i``, find the benchmark column ``j`` with
    the largest ``|cos(a_i^(k), a_j^(k0))|`` and flip ``a_i^(k)`` if its inner
    product with that column is negative. Columns orthogonal to every benchmark
    column (inner product 0) and zero columns are left unchanged. The benchmark
    estimate itself is returned unchanged.

    Parameters
    ----------
    estimates : array-like of shape (K, r, r)
        Client estimates; ``estimates[k][:, i]`` is column ``i`` of client ``k``.
    benchmark : int
        Index ``k0`` of the benchmark client in ``[0, K)``.

    Returns
    -------
    aligned : ndarray of shape (K, r, r)
        ``estimates`` with some columns multiplied by -1 (norms unchanged).
    """
    stack = _as_estimates(estimates)
    k0 = check_index(benchmark, "benchmark", stack.shape[0])
    return stack * _alignment_signs(stack, k0)[:, None, :]


def choose_benchmark(estimates, n_samples, *, rule="largest", kmeans_restarts=10, random_state=None) -> int:
    """Benchmark client for sign alignment (paper Remark 1).

    Parameters
    ----------
    estimates : array-like of shape (K, r, r)
        Client estimates (columns are re-normalised for ``"best_objective"``).
    n_samples : array-like of shape (K,)
        Clients' sample sizes, finite and non-negative.
    rule : {"largest", "best_objective"}, default="largest"
        ``"largest"``: the client with the largest ``n_k`` (lowest index on ties).
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
    if rule == "largest":
        return int(np.argmax(sizes))
    if rule != "best_objective":
        raise ValueError(f"rule must be one of {BENCHMARK_RULES}, got {rule!r}")
    kmeans_restarts = check_int(kmeans_restarts, "kmeans_restarts", minimum=1)
    seed = sklearn_seed(np.random.default_rng(random_state))
    return _benchmark_by_objective(_normalise_estimates(stack), sizes, kmeans_restarts, seed)


@dataclass(frozen=True)
class RfIcaAggregate:
    """Result of :func:`rf_ica_aggregate`.

    Output columns are ordered like the benchmark client's columns: column ``j``
    of ``rf_ica`` and ``f_ica`` belongs to the cluster matched to benchmark column
    ``j`` (the assignment maximising the total cosine between the centroids and
    the benchmark's aligned columns), so ``labels`` take values in ``range(r)``
    with the same meaning.

    Attributes
    ----------
    rf_ica : ndarray of shape (r, r)
        RF-ICA estimate: geometric median of each cluster, as columns.
    f_ica : ndarray of shape (r, r)
        F-ICA baseline: the raw k-means centroids as columns, NOT re-normalised
        (as in the paper; a centroid of unit vectors has norm <= 1).
    simple_mean : ndarray of shape (r, r)
        Column ``i`` = mean of column ``i`` of the sign-aligned estimates (no clustering).
    simple_median : ndarray of shape (r, r)
        Column ``i`` = geometric median of column ``i`` of the sign-aligned estimates.
    benchmark : int
        Index of the benchmark client.
    labels : ndarray of shape (K, r), dtype int
        ``labels[k, i]`` = cluster (output column) of column ``i`` of client ``k``.
    inertia : float
        k-means objective (sum of squared distances to the centroids).
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
    inertia: float
    method_seconds: dict[str, float] = field(default_factory=dict)


def rf_ica_aggregate(
    estimates, n_samples, *, benchmark="largest", kmeans_restarts=10, gm_tol=1e-10, random_state=None
) -> RfIcaAggregate:
    """One-shot RF-ICA server aggregation (Algorithm 1 of the paper).

    Steps: re-normalise every client's columns (a client may send unnormalised
    columns); choose the benchmark client; align signs (eq. 3); k-means of the
    ``K * r`` columns into ``r`` clusters (``sklearn.cluster.KMeans``,
    ``n_init=kmeans_restarts``, lowest objective kept); geometric median of
    each cluster (eq. 7). The baselines of section 4 are computed alongside.

    Parameters
    ----------
    estimates : array-like of shape (K, r, r)
        Client estimates, ``K >= 1``, finite, no zero column.
    n_samples : array-like of shape (K,)
        Clients' sample sizes (used to choose the benchmark), finite, non-negative.
    benchmark : {"largest", "best_objective"} or int, default="largest"
        Rule of :func:`choose_benchmark`, or an explicit client index.
    kmeans_restarts : int, default=10
        k-means restarts (``n_init``).
    gm_tol : float, default=1e-10
        ``tol`` of :func:`fedica.rfica.geometric_median.geometric_median`.
    random_state : int, numpy.random.Generator or None, default=None
        Seed source of k-means.

    Returns
    -------
    result : RfIcaAggregate
        RF-ICA estimate, the three baselines, benchmark, labels and k-means objective.

    Raises
    ------
    ValueError
        If ``estimates`` is not a non-empty finite ``(K, r, r)`` array, has a zero
        column, ``n_samples`` does not have shape ``(K,)`` or is negative/non-finite,
        or ``benchmark`` is neither a known rule nor a valid index.
    """
    stack = _as_estimates(estimates)
    n_clients, r, _ = stack.shape
    sizes = _as_sample_sizes(n_samples, n_clients)
    kmeans_restarts = check_int(kmeans_restarts, "kmeans_restarts", minimum=1)
    started = time.perf_counter()
    unit = _normalise_estimates(stack)
    seed = sklearn_seed(np.random.default_rng(random_state))

    if benchmark == "best_objective":
        # Same k-means seed as below: the final clustering is the winning candidate's.
        k0 = _benchmark_by_objective(unit, sizes, kmeans_restarts, seed)
    elif isinstance(benchmark, str):
        k0 = choose_benchmark(unit, sizes, rule=benchmark)
    else:
        k0 = check_index(benchmark, "benchmark", n_clients)
    aligned = align_signs(unit, k0)
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
    labels = relabel[kmeans.labels_]

    clustering = time.perf_counter() - started
    started = time.perf_counter()
    columns = _columns(aligned)
    # A cluster can only be empty when there are fewer distinct columns than r; keep its centroid.
    rf_ica = np.column_stack(
        [
            geometric_median(columns[labels == cluster], tol=gm_tol)
            if np.any(labels == cluster)
            else centroids[cluster]
            for cluster in range(r)
        ]
    )
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
        labels=labels.reshape(n_clients, r),
        inertia=float(kmeans.inertia_),
        method_seconds={"rf-ica": shared + clustering + medians, "f-ica": shared + clustering,
                        "simple-mean": shared + mean, "simple-median": shared + column_medians},
    )


def _alignment_signs(stack, k0):
    """(K, r) signs of eq. 3 that align every client's columns with client ``k0``."""
    norms = np.linalg.norm(stack, axis=1, keepdims=True)
    unit = stack / np.where(norms == 0, 1.0, norms)
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
    r = aligned.shape[1]
    kmeans = KMeans(n_clusters=r, n_init=restarts, random_state=seed)
    # One OpenMP thread: K * r points are few, and on busy cores (a federation
    # simulation) OpenMP's spinning threads made single fits up to 10x slower.
    with warnings.catch_warnings(), threadpool_limits(limits=1, user_api="openmp"):
        # Fewer distinct columns than clusters (e.g. identical clients) is legitimate here.
        warnings.simplefilter("ignore", ConvergenceWarning)
        return kmeans.fit(_columns(aligned))


def _columns(stack):
    """(K, r, r) -> (K * r, r): row ``k * r + i`` is column ``i`` of client ``k``."""
    return stack.transpose(0, 2, 1).reshape(-1, stack.shape[1])


def _normalise_estimates(stack):
    norms = np.linalg.norm(stack, axis=1, keepdims=True)
    zero = np.argwhere(norms[:, 0, :] == 0)
    if zero.size:
        client, column = zero[0]
        raise ValueError(
            f"estimates must have non-zero columns: column {column} of client {client} is zero "
            f"({len(zero)} zero column(s) in total)"
        )
    return stack / norms


def _as_estimates(estimates):
    stack = as_float_array(estimates, "estimates")
    if stack.ndim != 3 or stack.shape[1] != stack.shape[2]:
        raise ValueError(f"estimates must have shape (K, r, r), got {stack.shape}")
    if stack.shape[0] < 1:
        raise ValueError("estimates must hold at least one client (K >= 1), got K = 0")
    if stack.shape[1] < 1:
        raise ValueError(f"estimates must have r >= 1, got shape {stack.shape}")
    finite = np.all(np.isfinite(stack), axis=(1, 2))
    if not np.all(finite):
        raise ValueError(f"estimates must be finite: client(s) {np.flatnonzero(~finite).tolist()} contain NaN or inf")
    return stack


def _as_sample_sizes(n_samples, n_clients):
    sizes = as_float_array(n_samples, "n_samples")
    if sizes.shape != (n_clients,):
        raise ValueError(f"n_samples must have shape ({n_clients},) to match estimates, got {sizes.shape}")
    if not np.all(np.isfinite(sizes)) or np.any(sizes < 0):
        raise ValueError("n_samples must be finite and non-negative")
    return sizes
