"""Clustering metrics, including the pooled ARI computed from per-client contingency triplets.

In a federation the server never sees test points or labels, only each client's contingency table as sparse
triplets ``(true label, predicted global id, count)``. Summing the clients' triplets gives the pooled
contingency table, from which the pooled ("global") ARI follows exactly.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial.distance import pdist, squareform
from sklearn.metrics import silhouette_score

__all__ = [
    "adjusted_rand",
    "ari_from_contingency",
    "contingency",
    "k_hat_from_predictions",
    "leave_one_out_aris",
    "PooledTables",
    "mean_silhouettes",
    "silhouette",
    "weighted_local_ari",
    "weighted_mean",
]


def adjusted_rand(labels_true, labels_pred) -> float:
    """Adjusted Rand index, equal to scikit-learn's `adjusted_rand_score` bit for bit.

    Computed from the contingency table by :func:`ari_from_contingency`'s kernel: scikit-learn's own
    function spends most of its time validating parameters and building a sparse pair-confusion matrix,
    which a federation calls once per client and stage (2,000 times in a run of 1,000 clients).

    Parameters
    ----------
    labels_true : array-like of shape (n,)
    labels_pred : array-like of shape (n,)

    Returns
    -------
    float
    """
    labels_true = np.asarray(labels_true)
    labels_pred = np.asarray(labels_pred)
    if labels_true.ndim != 1 or labels_true.shape != labels_pred.shape:
        raise ValueError(f"labels_true and labels_pred must be 1-D of equal length, got shapes "
                         f"{labels_true.shape} and {labels_pred.shape}")
    _, rows = np.unique(labels_true, return_inverse=True)
    _, cols = np.unique(labels_pred, return_inverse=True)
    return _ari_from_cells(np.ones(rows.size, dtype=np.int64), rows.ravel(), cols.ravel())


def weighted_local_ari(per_client_ari, weights) -> float:
    """Weighted mean of the clients' ARIs (the paper weights client g by N_g).

    Parameters
    ----------
    per_client_ari : array-like of shape (G,)
    weights : array-like of shape (G,)
        Non-negative, not all zero.

    Returns
    -------
    float
    """
    per_client_ari = np.asarray(per_client_ari, dtype=float)
    weights = np.asarray(weights, dtype=float)
    if per_client_ari.ndim != 1 or weights.shape != per_client_ari.shape:
        raise ValueError(f"per_client_ari and weights must be 1-D of equal length, got shapes "
                         f"{per_client_ari.shape} and {weights.shape}")
    if np.any(weights < 0) or not weights.sum() > 0:
        raise ValueError("weights must be non-negative with a positive sum")
    return float(np.average(per_client_ari, weights=weights))


def weighted_mean(values, weights) -> float:
    """Weighted mean of the finite values; NaN entries (an undefined score) drop out with their weights.

    Parameters
    ----------
    values : array-like of shape (G,)
    weights : array-like of shape (G,)
        Non-negative.

    Returns
    -------
    float
        NaN when no value is finite or the finite values' weights sum to zero.
    """
    values = np.asarray(values, dtype=float)
    weights = np.asarray(weights, dtype=float)
    if values.ndim != 1 or weights.shape != values.shape:
        raise ValueError(f"values and weights must be 1-D of equal length, got shapes {values.shape} and {weights.shape}")
    kept = np.isfinite(values)
    if not kept.any() or not weights[kept].sum() > 0:
        return float("nan")
    return float(np.average(values[kept], weights=weights[kept]))


def silhouette(X, labels, *, max_points: int = 10_000, seed: int = 0) -> float:
    """Mean silhouette coefficient (scikit-learn's ``silhouette_score``, Euclidean), NaN where undefined.

    Above ``max_points`` points it is computed on a subsample of that many, drawn without replacement by
    ``numpy.random.default_rng(seed)``, so the same points and labels always give the same value (the exact
    score costs time and memory quadratic in the number of points).

    Parameters
    ----------
    X : array-like of shape (n, d)
    labels : array-like of shape (n,)
    max_points : int
    seed : int

    Returns
    -------
    float
        NaN when the (sub)sample has fewer than 2 distinct labels or as many labels as points.
    """
    X = np.asarray(X, dtype=float)
    labels = np.asarray(labels)
    if X.ndim != 2 or labels.shape != (X.shape[0],):
        raise ValueError(f"labels must have shape ({X.shape[0]},) for X of shape {X.shape}, got {labels.shape}")
    if X.shape[0] > max_points:
        chosen = np.sort(np.random.default_rng(seed).choice(X.shape[0], size=max_points, replace=False))
        X, labels = X[chosen], labels[chosen]
    if not 2 <= np.unique(labels).size < X.shape[0]:
        return float("nan")
    return float(silhouette_score(X, labels))


def contingency(labels_true, labels_pred) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Contingency table of two labelings as sparse triplets (the message a client sends).

    Parameters
    ----------
    labels_true : array-like of shape (n,)
        Integer true labels.
    labels_pred : array-like of shape (n,)
        Integer predicted (global) cluster ids.

    Returns
    -------
    true_values : ndarray of shape (t,)
    pred_values : ndarray of shape (t,)
    counts : ndarray of shape (t,), int64
        One entry per distinct (true, predicted) pair that occurs, with its number of points.
    """
    labels_true = np.asarray(labels_true)
    labels_pred = np.asarray(labels_pred)
    if labels_true.ndim != 1 or labels_true.shape != labels_pred.shape:
        raise ValueError(f"labels_true and labels_pred must be 1-D of equal length, got shapes "
                         f"{labels_true.shape} and {labels_pred.shape}")
    pairs, counts = np.unique(np.column_stack([labels_true, labels_pred]), axis=0, return_counts=True)
    return pairs[:, 0], pairs[:, 1], counts.astype(np.int64)


def ari_from_contingency(true_values, pred_values, counts) -> float:
    """Adjusted Rand index from contingency triplets; repeated (true, pred) pairs are summed.

    Equals `adjusted_rand` on the pooled labels. Hand-written because scikit-learn's ARI takes labels, not a
    table; it uses scikit-learn's pair-confusion formula (with Python integers, so no overflow) and its special
    case (no disagreeing pairs gives 1.0).

    Parameters
    ----------
    true_values : array-like of shape (t,)
    pred_values : array-like of shape (t,)
    counts : array-like of shape (t,)
        Non-negative integer counts.

    Returns
    -------
    float
    """
    true_values = np.asarray(true_values)
    pred_values = np.asarray(pred_values)
    counts = np.asarray(counts)
    if not (true_values.ndim == 1 and true_values.shape == pred_values.shape == counts.shape):
        raise ValueError(f"true_values, pred_values and counts must be 1-D of equal length, got shapes "
                         f"{true_values.shape}, {pred_values.shape} and {counts.shape}")
    if counts.size and (np.any(counts < 0) or np.any(counts != np.round(counts))):
        raise ValueError("counts must be non-negative integers")
    if not counts.sum() > 0:
        return 1.0  # scikit-learn's value for empty labelings
    _, rows = np.unique(true_values, return_inverse=True)
    _, cols = np.unique(pred_values, return_inverse=True)
    return _ari_from_cells(counts.astype(np.int64), rows.ravel(), cols.ravel())


def _ari_from_cells(counts: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> float:
    """The ARI of a contingency table given as cells ``(rows[i], cols[i])`` holding ``counts[i]`` (repeats summed).

    scikit-learn's pair-confusion formula and special cases, on exact integers: the pair counts are taken in
    int64 while they fit (below 3e9 points) and in Python integers beyond, as are the final products (up to
    n^4), so the value equals scikit-learn's bit for bit and a forged count cannot overflow it.
    """
    n_samples = int(counts.sum(dtype=object)) if counts.size else 0
    if n_samples == 0:
        return 1.0  # scikit-learn's value for empty labelings
    exact = np.int64 if n_samples < 3_000_000_000 else object
    cells = _summed(counts, rows * (int(cols.max()) + 1) + cols, exact)
    row_sums = _summed(counts, rows, exact)
    col_sums = _summed(counts, cols, exact)
    return _ari_from_square_sums(n_samples, int((cells * cells).sum()), int((row_sums * row_sums).sum()),
                                 int((col_sums * col_sums).sum()))


def _ari_from_square_sums(n_samples: int, sum_squares: int, row_squares: int, col_squares: int) -> float:
    """scikit-learn's pair-confusion ARI from a table's size and its sums of squared cells, row and column
    sums (Python integers, so the value is the same bit for bit however they were summed)."""
    if n_samples == 0:
        return 1.0  # scikit-learn's value for empty labelings
    tp = sum_squares - n_samples
    fp = col_squares - sum_squares
    fn = row_squares - sum_squares
    tn = n_samples**2 - fp - fn - sum_squares
    if fn == 0 and fp == 0:
        return 1.0
    return 2.0 * (tp * tn - fn * fp) / ((tp + fn) * (fn + tn) + (tp + fp) * (fp + tn))


def leave_one_out_aris(tables) -> tuple[float, np.ndarray]:
    """The pooled ARI of contingency tables, and the pooled ARI of all but each one.

    Equals :func:`ari_from_contingency` on the concatenated tables, and on the concatenation without
    table ``g``, bit for bit, in one pass over the cells instead of one per table: removing a table
    changes a square sum only where the table has cells, ``sum (A - a)^2 = sum A^2 - sum (2 A a - a^2)``
    over its cells (``A`` the pooled count, ``a`` the table's), and likewise for row and column sums.

    Parameters
    ----------
    tables : sequence of (true_values, pred_values, counts)
        Each a contingency table as triplets; repeated (true, pred) pairs are summed.

    Returns
    -------
    pooled : float
    without : ndarray of shape (n_tables,)
        ``without[g]``: the ARI of every table but ``g``.
    """
    n_tables = len(tables)
    if n_tables == 0:
        return 1.0, np.empty(0)
    sizes = [np.asarray(table[2]).shape[0] for table in tables]
    owner = np.repeat(np.arange(n_tables), sizes)
    true_values, pred_values, counts = (np.concatenate([np.asarray(table[i]) for table in tables]) for i in range(3))
    if counts.size and (np.any(counts < 0) or np.any(counts != np.round(counts))):
        raise ValueError("counts must be non-negative integers")
    if counts.size == 0:
        return 1.0, np.ones(n_tables)
    counts = counts.astype(np.int64)
    n_samples = int(counts.sum(dtype=object))
    # Pooled counts reach n and the removed terms 2 A a reach 2 n^2: int64 while that fits.
    exact = np.int64 if n_samples < 2_000_000_000 else object
    counts = counts.astype(exact)
    _, rows = np.unique(true_values, return_inverse=True)
    _, cols = np.unique(pred_values, return_inverse=True)
    rows, cols = rows.ravel(), cols.ravel()
    square_sums, removed = [], []
    for keys in (rows * (int(cols.max()) + 1) + cols, rows, cols):
        _, group = np.unique(keys, return_inverse=True)
        group = group.ravel()
        pooled = np.zeros(int(group.max()) + 1, dtype=exact)
        np.add.at(pooled, group, counts)
        square_sums.append(int((pooled * pooled).sum()))
        # Each table's own count per group (a table may repeat a pair), and the square sum it takes away.
        own_keys, own_group = np.unique(owner * pooled.shape[0] + group, return_inverse=True)
        own = np.zeros(own_keys.shape[0], dtype=exact)
        np.add.at(own, own_group.ravel(), counts)
        whole = pooled[own_keys % pooled.shape[0]]
        taken = np.zeros(n_tables, dtype=exact)
        np.add.at(taken, own_keys // pooled.shape[0], 2 * whole * own - own * own)
        removed.append(taken)
    table_sizes = np.zeros(n_tables, dtype=exact)
    np.add.at(table_sizes, owner, counts)
    pooled_ari = _ari_from_square_sums(n_samples, *square_sums)
    without = np.array([
        _ari_from_square_sums(n_samples - int(table_sizes[g]), *(total - int(taken[g]) for total, taken in zip(square_sums, removed)))
        for g in range(n_tables)
    ])
    return pooled_ari, without


class PooledTables:
    """Contingency tables pooled, from which tables are taken out and put back one at a time, with the pooled ARI.

    The same square sums as :func:`leave_one_out_aris`, kept up to date: taking out or putting back a
    table changes them only in its own cells (``(A -+ a)^2 - A^2``), so a sequence of removals costs one
    pass over the removed tables' cells, and :meth:`ari` equals :func:`ari_from_contingency` on the
    tables in the pool, bit for bit.

    Parameters
    ----------
    tables : sequence of (true_values, pred_values, counts)
        Each a contingency table as triplets, non-negative integer counts; all in the pool at first.
    """

    def __init__(self, tables):
        self.n_tables = len(tables)
        sizes = [np.asarray(table[2]).shape[0] for table in tables]
        owner = np.repeat(np.arange(self.n_tables), sizes)
        if not owner.size:
            self.in_pool = np.ones(self.n_tables, dtype=bool)
            self.n_samples, self._squares, self._own, self._pooled = 0, [0, 0, 0], [], []
            return
        true_values, pred_values, counts = (np.concatenate([np.asarray(table[i]) for table in tables]) for i in range(3))
        counts = counts.astype(np.int64)
        # Pooled counts reach n and their squares n^2: int64 while that fits, else Python integers.
        dtype = np.int64 if int(counts.sum(dtype=object)) < 2_000_000_000 else object
        _, rows = np.unique(true_values, return_inverse=True)
        _, cols = np.unique(pred_values, return_inverse=True)
        rows, cols = rows.ravel(), cols.ravel()
        self._pooled, self._own = [], []
        for keys in (rows * (int(cols.max()) + 1) + cols, rows, cols):
            _, group = np.unique(keys, return_inverse=True)
            group = group.ravel()
            pooled = np.zeros(int(group.max()) + 1, dtype=dtype)
            np.add.at(pooled, group, counts.astype(dtype))
            self._pooled.append(pooled)
            # Each table's cells in this grouping: the groups it touches and its count in each.
            own_keys, own_group = np.unique(owner * pooled.shape[0] + group, return_inverse=True)
            own = np.zeros(own_keys.shape[0], dtype=dtype)
            np.add.at(own, own_group.ravel(), counts.astype(dtype))
            table_of = own_keys // pooled.shape[0]
            bounds = np.searchsorted(table_of, np.arange(self.n_tables + 1))
            self._own.append([(own_keys[a:b] % pooled.shape[0], own[a:b]) for a, b in zip(bounds[:-1], bounds[1:])])
        self._squares = [int((pooled * pooled).sum()) for pooled in self._pooled]
        self._sizes = np.zeros(self.n_tables, dtype=object)
        np.add.at(self._sizes, owner, counts.astype(object))
        self.n_samples = int(self._sizes.sum())
        self.in_pool = np.ones(self.n_tables, dtype=bool)

    def ari(self) -> float:
        """The ARI of the tables in the pool."""
        return _ari_from_square_sums(self.n_samples, *self._squares)

    def take_out(self, table: int) -> None:
        """Take table ``table`` out of the pool (it must be in it)."""
        self._move(table, -1)

    def put_back(self, table: int) -> None:
        """Put table ``table`` back into the pool (it must be out of it)."""
        self._move(table, 1)

    def _move(self, table: int, sign: int) -> None:
        if self.in_pool[table] != (sign < 0):
            raise ValueError(f"table {table} is {'already' if sign > 0 else 'not'} in the pool")
        if not self._own:
            self.in_pool[table] = sign > 0
            return
        for index, (pooled, own) in enumerate(zip(self._pooled, self._own)):
            groups, counts = own[table]
            before = pooled[groups]
            after = before + sign * counts
            self._squares[index] += int((after * after).sum()) - int((before * before).sum())
            pooled[groups] = after
        self.n_samples += sign * int(self._sizes[table])
        self.in_pool[table] = sign > 0


def _summed(counts: np.ndarray, keys: np.ndarray, dtype) -> np.ndarray:
    """``counts`` summed per distinct key, in ``dtype``."""
    _, groups = np.unique(keys, return_inverse=True)
    sums = np.zeros(int(groups.max()) + 1, dtype=dtype)
    np.add.at(sums, groups.ravel(), counts.astype(dtype))
    return sums


def k_hat_from_predictions(pred_values, counts) -> int:
    """Number of distinct predicted clusters that receive at least one test point (the paper's K_hat).

    Parameters
    ----------
    pred_values : array-like of shape (t,)
        Predicted cluster ids of contingency triplets (repeats allowed).
    counts : array-like of shape (t,)

    Returns
    -------
    int
    """
    pred_values = np.asarray(pred_values)
    counts = np.asarray(counts)
    if pred_values.shape != counts.shape:
        raise ValueError(f"pred_values and counts must have equal shapes, got {pred_values.shape} and "
                         f"{counts.shape}")
    return int(np.unique(pred_values[counts > 0]).size)


def mean_silhouettes(X, labelings) -> np.ndarray:
    """Mean silhouette coefficient of several labellings of the same points.

    The same value as :func:`sklearn.metrics.silhouette_score` (Euclidean; a point alone
    in its cluster scores 0), but the pairwise distances are computed once for all
    labellings and each score is two matrix products: scikit-learn's function costs
    about 2 ms per call on a client's few hundred points even with precomputed
    distances, 15x this, and the upsilon tuning scores one labelling per grid value on
    every client.

    Parameters
    ----------
    X : array-like of shape (n, d)
        Points.
    labelings : array-like of shape (c, n), int
        One labelling of the points per row.

    Returns
    -------
    scores : ndarray of shape (c,)
        NaN where a labelling has fewer than 2 clusters or as many clusters as points
        (the silhouette is undefined there).
    """
    X = np.asarray(X, dtype=float)
    labelings = np.asarray(labelings)
    if X.ndim != 2 or labelings.ndim != 2 or labelings.shape[1] != X.shape[0]:
        raise ValueError(f"labelings must have shape (c, {X.shape[0]}) for X of shape {X.shape}; got {labelings.shape}.")
    n = X.shape[0]
    distances = squareform(pdist(X)) if n > 1 else np.zeros((n, n))
    rows = np.arange(n)
    scores = np.full(labelings.shape[0], np.nan)
    for index, labels in enumerate(labelings):
        codes = np.unique(labels, return_inverse=True)[1].reshape(-1)
        k = int(codes.max()) + 1 if n else 0
        if not 2 <= k < n:
            continue
        members = np.zeros((n, k))
        members[rows, codes] = 1.0
        counts = members.sum(axis=0)
        sums = distances @ members  # (n, k): summed distance of every point to every cluster
        own_count = counts[codes]
        within = sums[rows, codes] / np.maximum(own_count - 1, 1)
        mean_to = sums / counts
        mean_to[rows, codes] = np.inf
        nearest_other = mean_to.min(axis=1)
        spread = np.maximum(within, nearest_other)
        silhouette = np.divide(nearest_other - within, spread, out=np.zeros(n), where=spread > 0)
        silhouette[own_count == 1] = 0.0
        scores[index] = silhouette.mean()
    return scores
