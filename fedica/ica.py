"""RF-ICA: one-shot robust federated ICA (ALGORITHMS.md section 1).

Pieces, in the order a run uses them:

- simulation of the paper's scenario (section 4): :func:`ica_true_mixing`,
  :func:`corrupted_mask`, :func:`ica_client_data`, :func:`client_sample_size`;
- the client step: :func:`local_fastica` (symmetric FastICA, unit-norm columns);
- the server step: :func:`align_signs` (eq. 3), :func:`choose_benchmark`
  (Remark 1), :func:`rf_ica_aggregate` (k-means + geometric median, eqs. 4-7,
  plus the F-ICA / simple mean / simple median baselines);
- the error :func:`ica_error` (min over signed permutations, exact).

Random streams of the simulation. Everything is derived from the scenario's
``seed`` with :class:`numpy.random.SeedSequence` and a spawn key, so that each
stream is independent of the others and of the order in which clients are
built: ``A*`` uses ``SeedSequence(seed, spawn_key=(0,))``, the corrupted mask
``spawn_key=(1,)`` and client ``k``'s sources ``spawn_key=(2, k)``. No stream
equals ``np.random.default_rng(seed)`` (which is ``spawn_key=()``), so a shared
FastICA start drawn from ``default_rng(shared_init_seed)`` never coincides with
``A*`` even when ``shared_init_seed == seed``.
"""

from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import KMeans
from sklearn.decomposition import FastICA
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_limits

from fedica.geometric_median import geometric_median

__all__ = [
    "RfIcaAggregate",
    "align_signs",
    "choose_benchmark",
    "client_sample_size",
    "corrupted_mask",
    "ica_client_data",
    "ica_error",
    "ica_true_mixing",
    "local_fastica",
    "make_mixing_matrix",
    "normalize_columns",
    "rf_ica_aggregate",
]

_STREAM_MIXING = 0
_STREAM_CORRUPTED = 1
_STREAM_SOURCES = 2

_CONTRASTS = ("cube", "logcosh")
_INITS = ("random", "shared")
_BENCHMARK_RULES = ("largest", "best_objective")

# Covariance eigenvalue ratio below which PCA whitening would divide by rounding noise.
_RANK_DEFICIENT_RATIO = 1e-10
# Relative gap under which two k-means objectives count as equal in choose_benchmark.
_OBJECTIVE_TIE_RTOL = 1e-9


# --------------------------------------------------------------------------- helpers


def normalize_columns(A) -> np.ndarray:
    """Scale every column to unit Euclidean norm.

    Parameters
    ----------
    A : array-like of shape (n_rows, n_columns)
        Typically an ``(r, r)`` mixing-matrix estimate.

    Returns
    -------
    A_normalised : ndarray of shape (n_rows, n_columns)
        ``A`` with each column divided by its norm (a new array).

    Raises
    ------
    ValueError
        If ``A`` is not 2-D, or a column is zero or contains NaN/inf.
    """
    matrix = _as_float_array(A, "A")
    if matrix.ndim != 2:
        raise ValueError(f"A must be a 2-D array, got shape {matrix.shape}")
    bad = ~np.all(np.isfinite(matrix), axis=0)
    if np.any(bad):
        raise ValueError(f"A must be finite: column(s) {np.flatnonzero(bad).tolist()} contain NaN or inf")
    norms = np.linalg.norm(matrix, axis=0)
    if np.any(norms == 0):
        raise ValueError(f"A must have non-zero columns: column(s) {np.flatnonzero(norms == 0).tolist()} are zero")
    return matrix / norms


def make_mixing_matrix(r, *, orthogonal=True, random_state=None) -> np.ndarray:
    """Random ``r x r`` mixing matrix as in the paper's simulation (section 4).

    Parameters
    ----------
    r : int
        Dimension, ``r >= 1``.
    orthogonal : bool, default=True
        If True, the nearest orthogonal matrix (in Frobenius norm) to a standard
        Gaussian matrix ``G``: its polar factor ``U V^T`` from ``G = U S V^T``
        (Haar distributed). If False, ``G`` with its columns scaled to unit norm.
    random_state : int, numpy.random.Generator or None, default=None
        Source of ``G``.

    Returns
    -------
    A : ndarray of shape (r, r)
        Columns of unit norm in both cases.
    """
    r = _check_int(r, "r", minimum=1)
    gaussian = np.random.default_rng(random_state).standard_normal((r, r))
    if orthogonal:
        left, _, right_t = np.linalg.svd(gaussian)
        return left @ right_t
    return normalize_columns(gaussian)


# --------------------------------------------------------------------------- simulation


def corrupted_mask(n_clients, corrupt_ratio, *, random_state=None) -> np.ndarray:
    """Which clients are corrupted (have few samples).

    Exactly ``round(corrupt_ratio * n_clients)`` clients, chosen uniformly
    without replacement. ``round`` is Python's (ties to even: 4.5 -> 4).

    Parameters
    ----------
    n_clients : int
        Number of clients ``K >= 1``.
    corrupt_ratio : float
        Share of corrupted clients, in ``[0, 1]``.
    random_state : int, numpy.random.Generator or None, default=None
        Source of the choice.

    Returns
    -------
    mask : ndarray of shape (n_clients,), dtype bool
        True for corrupted clients.
    """
    n_clients = _check_int(n_clients, "n_clients", minimum=1)
    corrupt_ratio = _check_ratio(corrupt_ratio, "corrupt_ratio")
    n_corrupted = int(round(corrupt_ratio * n_clients))
    chosen = np.random.default_rng(random_state).choice(n_clients, size=n_corrupted, replace=False)
    mask = np.zeros(n_clients, dtype=bool)
    mask[chosen] = True
    return mask


def ica_true_mixing(*, r, orthogonal, seed) -> np.ndarray:
    """The ``A*`` every client of a scenario shares, derived only from ``seed``.

    Parameters
    ----------
    r : int
        Dimension, ``r >= 1``.
    orthogonal : bool
        See :func:`make_mixing_matrix`.
    seed : int
        Scenario seed, ``>= 0``.

    Returns
    -------
    A_true : ndarray of shape (r, r)
        Unit-norm columns; orthogonal if ``orthogonal``.
    """
    return make_mixing_matrix(r, orthogonal=orthogonal, random_state=_stream(seed, _STREAM_MIXING))


def ica_corrupted_clients(*, n_clients, corrupt_ratio, seed) -> np.ndarray:
    """Which clients of a scenario are corrupted, derived only from ``seed``.

    Parameters
    ----------
    n_clients : int
        Number of clients ``K >= 1``.
    corrupt_ratio : float
        Share of corrupted clients, in ``[0, 1]``.
    seed : int
        Scenario seed, ``>= 0``.

    Returns
    -------
    mask : ndarray of shape (n_clients,), dtype bool
    """
    return corrupted_mask(n_clients, corrupt_ratio, random_state=_stream(seed, _STREAM_CORRUPTED))


def client_sample_size(partition_id, *, n_clients, corrupt_ratio, n_normal, n_corrupt, seed) -> int:
    """Number of samples ``n_k`` of client ``partition_id``.

    Parameters
    ----------
    partition_id : int
        Client index in ``[0, n_clients)``.
    n_clients : int
        Number of clients ``K``.
    corrupt_ratio : float
        Share of corrupted clients, in ``[0, 1]`` (see :func:`corrupted_mask`).
    n_normal, n_corrupt : int
        Sample sizes of normal and corrupted clients, ``>= 1``.
    seed : int
        Scenario seed, ``>= 0``.

    Returns
    -------
    n_k : int
        ``n_corrupt`` if the client is corrupted, else ``n_normal``.
    """
    n_clients = _check_int(n_clients, "n_clients", minimum=1)
    partition_id = _check_index(partition_id, "partition_id", n_clients)
    n_normal = _check_int(n_normal, "n_normal", minimum=1)
    n_corrupt = _check_int(n_corrupt, "n_corrupt", minimum=1)
    mask = ica_corrupted_clients(n_clients=n_clients, corrupt_ratio=corrupt_ratio, seed=seed)
    return n_corrupt if mask[partition_id] else n_normal


def ica_client_data(
    partition_id, *, n_clients, r, corrupt_ratio, n_normal, n_corrupt, sparsity, orthogonal, seed
) -> np.ndarray:
    """Observations ``Y = A* X`` of one client in the paper's simulation.

    Sources are Bernoulli-Gaussian: ``X = B * W`` entrywise with
    ``B ~ Bernoulli(sparsity)`` and ``W ~ N(0, 1)``. The client draws only its
    own sources, from a stream derived from ``(seed, partition_id)``; ``A*`` and
    the corrupted mask come from streams derived from ``seed`` only (see the
    module docstring), so any client can be built alone, in any order, and the
    result is deterministic.

    Parameters
    ----------
    partition_id : int
        Client index in ``[0, n_clients)``.
    n_clients : int
        Number of clients ``K >= 1``.
    r : int
        Number of sources and of observed signals, ``>= 1``.
    corrupt_ratio : float
        Share of corrupted clients, in ``[0, 1]``.
    n_normal, n_corrupt : int
        Sample sizes of normal and corrupted clients, ``>= 1``.
    sparsity : float
        Probability that a source entry is non-zero, in ``(0, 1]``.
    orthogonal : bool
        Whether ``A*`` is orthogonal (see :func:`make_mixing_matrix`).
    seed : int
        Scenario seed, ``>= 0``.

    Returns
    -------
    Y : ndarray of shape (r, n_k)
        ``n_k`` from :func:`client_sample_size`.

    Raises
    ------
    ValueError
        If ``partition_id`` is not an integer in ``[0, n_clients)`` or another
        argument is out of range.
    """
    n_k = client_sample_size(
        partition_id,
        n_clients=n_clients,
        corrupt_ratio=corrupt_ratio,
        n_normal=n_normal,
        n_corrupt=n_corrupt,
        seed=seed,
    )
    sparsity = _check_ratio(sparsity, "sparsity")
    if sparsity == 0:
        raise ValueError("sparsity must be in (0, 1]: all sources would be zero")
    mixing = ica_true_mixing(r=r, orthogonal=orthogonal, seed=seed)
    rng = _stream(seed, _STREAM_SOURCES, int(partition_id))
    active = rng.random((mixing.shape[0], n_k)) < sparsity
    sources = active * rng.standard_normal((mixing.shape[0], n_k))
    return mixing @ sources


# --------------------------------------------------------------------------- client


def local_fastica(
    Y,
    *,
    contrast="cube",
    init="random",
    random_state=None,
    shared_init_seed=0,
    max_iter=1000,
    tol=1e-6,
) -> np.ndarray:
    """A client's estimate of the mixing matrix by symmetric FastICA.

    Uses :class:`sklearn.decomposition.FastICA` with ``algorithm="parallel"``.
    ``ConvergenceWarning`` from FastICA is silenced (an unconverged run still
    gives an estimate, and robust aggregation is meant to absorb poor ones).

    Parameters
    ----------
    Y : array-like of shape (r, n_samples)
        Observations, one column per sample; finite, ``n_samples > r``.
    contrast : {"cube", "logcosh"}, default="cube"
        FastICA non-linearity; "cube" is the kurtosis contrast of the paper (eq. 8).
    init : {"random", "shared"}, default="random"
        ``"random"``: scikit-learn's own PCA whitening and a random start drawn
        from ``random_state``. ``"shared"`` (paper appendix D, as fixed in
        ALGORITHMS.md): centre ``Y``, divide it by one scalar
        ``sqrt(mean variance)``, and run FastICA with ``whiten=False`` from the
        orthogonal rotation ``make_mixing_matrix(r, random_state=shared_init_seed)``,
        the same for every client. The scalar whitening is exact only when the
        covariance of ``Y`` is a multiple of the identity (orthogonal ``A*``);
        the estimate is then an orthogonal matrix.
    random_state : int, numpy.random.Generator or None, default=None
        Source of the random start for ``init="random"``.
    shared_init_seed : int, default=0
        Seed of the shared start for ``init="shared"``; nothing else influences it.
    max_iter : int, default=1000
        FastICA iterations.
    tol : float, default=1e-6
        FastICA tolerance.

    Returns
    -------
    A_hat : ndarray of shape (r, r)
        Estimated mixing matrix in observation space (``Y ~ A_hat S``), columns
        of unit norm, always finite.

    Raises
    ------
    ValueError
        On a bad shape, NaN/inf, ``n_samples <= r``, constant ``Y`` or an
        unknown ``contrast``/``init``.

    Notes
    -----
    If the sample covariance of ``Y`` is numerically singular (e.g. a small
    client whose sparse source happens to be all zero), PCA whitening would
    divide by rounding noise and return a meaningless estimate; the scalar
    whitening of ``init="shared"`` is then used instead, started from a random
    rotation drawn from ``random_state`` when ``init="random"``.
    """
    data = _as_float_array(Y, "Y")
    if data.ndim != 2 or data.shape[0] < 1:
        raise ValueError(f"Y must have shape (r, n_samples), got {data.shape}")
    r, n_samples = data.shape
    if n_samples <= r:
        raise ValueError(f"Y must have more samples (columns) than signals (rows): got shape {data.shape}")
    if not np.all(np.isfinite(data)):
        raise ValueError("Y must be finite (found NaN or inf)")
    if contrast not in _CONTRASTS:
        raise ValueError(f"contrast must be one of {_CONTRASTS}, got {contrast!r}")
    if init not in _INITS:
        raise ValueError(f"init must be one of {_INITS}, got {init!r}")

    centred = data - data.mean(axis=1, keepdims=True)
    covariance_eigenvalues = np.linalg.eigvalsh(centred @ centred.T / n_samples)
    if not covariance_eigenvalues[-1] > 0:
        raise ValueError("Y must not be constant: every signal has zero variance")
    rank_deficient = covariance_eigenvalues[0] <= _RANK_DEFICIENT_RATIO * covariance_eigenvalues[-1]

    rng = np.random.default_rng(random_state)
    options = dict(algorithm="parallel", fun=contrast, max_iter=max_iter, tol=tol)
    if init == "random" and not rank_deficient:
        ica = FastICA(n_components=r, whiten="unit-variance", random_state=_sklearn_seed(rng), **options)
        fit_data = data.T
    else:
        start = make_mixing_matrix(r, random_state=shared_init_seed if init == "shared" else rng)
        scale = np.sqrt(np.mean(centred**2))
        ica = FastICA(whiten=False, w_init=start, **options)
        fit_data = (centred / scale).T
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ica.fit(fit_data)
    return normalize_columns(ica.mixing_)


# --------------------------------------------------------------------------- server


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
    k0 = _check_index(benchmark, "benchmark", stack.shape[0])
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
        raise ValueError(f"rule must be one of {_BENCHMARK_RULES}, got {rule!r}")
    kmeans_restarts = _check_int(kmeans_restarts, "kmeans_restarts", minimum=1)
    seed = _sklearn_seed(np.random.default_rng(random_state))
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
    """

    rf_ica: np.ndarray
    f_ica: np.ndarray
    simple_mean: np.ndarray
    simple_median: np.ndarray
    benchmark: int
    labels: np.ndarray
    inertia: float


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
        ``tol`` of :func:`fedica.geometric_median.geometric_median`.
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
    kmeans_restarts = _check_int(kmeans_restarts, "kmeans_restarts", minimum=1)
    unit = _normalise_estimates(stack)
    seed = _sklearn_seed(np.random.default_rng(random_state))

    if benchmark == "best_objective":
        # Same k-means seed as below: the final clustering is the winning candidate's.
        k0 = _benchmark_by_objective(unit, sizes, kmeans_restarts, seed)
    elif isinstance(benchmark, str):
        k0 = choose_benchmark(unit, sizes, rule=benchmark)
    else:
        k0 = _check_index(benchmark, "benchmark", n_clients)
    aligned = align_signs(unit, k0)

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
    simple_median = np.column_stack([geometric_median(aligned[:, :, i], tol=gm_tol) for i in range(r)])
    return RfIcaAggregate(
        rf_ica=rf_ica,
        f_ica=centroids.T.copy(),
        simple_mean=aligned.mean(axis=0),
        simple_median=simple_median,
        benchmark=int(k0),
        labels=labels.reshape(n_clients, r),
        inertia=float(kmeans.inertia_),
    )


def ica_error(A_hat, A_true) -> float:
    """Estimation error up to a signed permutation of the columns.

    ``min over signed permutation matrices P of ||A_hat - A_true P||_F``, exact:
    the best sign of each matched pair is independent of the others, so the
    minimum is a linear assignment problem with cost
    ``c_ij = min(||a_i - a*_j||^2, ||a_i + a*_j||^2)``
    (``scipy.optimize.linear_sum_assignment``); the result is the square root of
    the optimal total. Differences are formed explicitly (not through
    ``|a|^2 + |b|^2 - 2|<a, b>|``) so that an exact match gives exactly 0.

    Parameters
    ----------
    A_hat : array-like of shape (d, r)
        Estimate.
    A_true : array-like of shape (d, r)
        Truth.

    Returns
    -------
    error : float
        Non-negative Frobenius distance.
    """
    estimate = _as_float_array(A_hat, "A_hat")
    truth = _as_float_array(A_true, "A_true")
    if estimate.ndim != 2 or estimate.shape != truth.shape or estimate.size == 0:
        raise ValueError(
            f"A_hat and A_true must be non-empty 2-D arrays of the same shape, got {estimate.shape} and {truth.shape}"
        )
    if not (np.all(np.isfinite(estimate)) and np.all(np.isfinite(truth))):
        raise ValueError("A_hat and A_true must be finite (found NaN or inf)")
    minus = np.sum((estimate[:, :, None] - truth[:, None, :]) ** 2, axis=0)
    plus = np.sum((estimate[:, :, None] + truth[:, None, :]) ** 2, axis=0)
    cost = np.minimum(minus, plus)
    rows, cols = linear_sum_assignment(cost)
    return float(np.sqrt(cost[rows, cols].sum()))


# --------------------------------------------------------------------------- private


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
    stack = _as_float_array(estimates, "estimates")
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
    sizes = _as_float_array(n_samples, "n_samples")
    if sizes.shape != (n_clients,):
        raise ValueError(f"n_samples must have shape ({n_clients},) to match estimates, got {sizes.shape}")
    if not np.all(np.isfinite(sizes)) or np.any(sizes < 0):
        raise ValueError("n_samples must be finite and non-negative")
    return sizes


def _as_float_array(value, name):
    try:
        return np.asarray(value, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a numeric array: {exc}") from exc


def _check_int(value, name, *, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_index(value, name, size):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value < size:
        raise ValueError(f"{name} must be an integer in [0, {size}), got {value!r}")
    return int(value)


def _check_ratio(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


def _stream(seed, *key):
    seed = _check_int(seed, "seed", minimum=0)
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def _sklearn_seed(rng):
    return int(rng.integers(np.iinfo(np.int32).max))
