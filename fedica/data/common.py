"""What every clustering scenario returns (:class:`ClientData`, from :mod:`fedica.sites`) and the helpers they share.
"""

from __future__ import annotations

import numpy as np
from sklearn.model_selection import train_test_split

from fedica.seeding import generator, sklearn_seed
from fedica.sites import ClientData, apportion

__all__ = ["ClientData", "apportion", "column_scale", "deal_classes", "mark_readonly", "resolve_k_range"]


def resolve_k_range(n_clusters: int, k_min: int, k_max: int | None) -> tuple[int, int]:
    """The range of local cluster counts ``(k_min, k_max)``, ``k_max`` None meaning ``n_clusters - 1``; checked."""
    k_max = n_clusters - 1 if k_max is None else k_max
    if not 1 <= k_min <= k_max <= n_clusters:
        raise ValueError(
            f"need 1 <= k_min <= k_max <= n_clusters, got k_min={k_min}, k_max={k_max}, n_clusters={n_clusters} "
            "(FedGEM's setting is 2 <= K_g < K: k_min=2, k_max=n_clusters-1)"
        )
    return int(k_min), int(k_max)


def column_scale(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation (d,) of ``X``'s columns; a constant column's deviation is 1 (it keeps its scale)."""
    std = X.std(axis=0)
    return X.mean(axis=0), np.where(std > 0, std, 1.0)


def mark_readonly(*arrays: np.ndarray) -> None:
    """Cached arrays are shared between calls; make accidental in-place edits fail loudly."""
    for array in arrays:
        array.setflags(write=False)


def deal_classes(y: np.ndarray, sets, test_fraction: float, seed: int):
    """Split a labelled data set train/test (stratified) and deal every class evenly among its holders.

    The machinery of the class scenarios (``fedica.data.classes._class_partition`` does the same, step by
    step and with the same streams ``classes.split`` and ``classes.assign``), here for any label vector, so
    that another labelled data set (``fedica.data.mnist``) is split over clients exactly as waveform and digits.

    Parameters
    ----------
    y : ndarray of shape (n,), int
        Labels of the whole data set.
    sets : sequence of G ndarrays
        The classes each client holds (indices into ``numpy.unique(y)``), e.g. from
        :func:`fedica.data.blobs.client_cluster_sets` with stream ``scenario.cluster_sets``.
    test_fraction : float
        In (0, 1).
    seed : int

    Returns
    -------
    train_idx, test_idx : ndarray of shape (n_train,) and (n_test,)
        Row indices of the training and test points.
    train_owner, test_owner : ndarray of shape (n_train,) and (n_test,)
        The client of every training and test index; every point is on exactly one client.

    Raises
    ------
    ValueError
        If a client would get fewer training points than the classes it holds.
    """
    classes = np.unique(y)
    n_clients = len(sets)
    train_idx, test_idx = train_test_split(
        np.arange(y.size), test_size=test_fraction, stratify=y,
        random_state=sklearn_seed(generator(seed, "classes.split")))
    holds = np.zeros((n_clients, classes.size), dtype=bool)
    holds[np.repeat(np.arange(n_clients), [s.size for s in sets]), np.concatenate(sets)] = True
    rng = generator(seed, "classes.assign")
    owners = []
    for idx in (train_idx, test_idx):
        owner = np.empty(idx.size, dtype=np.int64)
        for c in range(classes.size):  # a handful of classes; each class's points are dealt in one shot
            members = rng.permutation(np.flatnonzero(y[idx] == classes[c]))
            holders = np.flatnonzero(holds[:, c])
            chunk = np.arange(members.size) * holders.size // members.size  # even split, sizes differ by <= 1
            owner[members] = holders[chunk]
        owners.append(owner)
    train_counts = np.bincount(owners[0], minlength=n_clients)
    short = np.flatnonzero(train_counts < [s.size for s in sets])
    if short.size:
        g = int(short[0])
        raise ValueError(f"client {g} gets only {train_counts[g]} training points for {sets[g].size} classes; "
                         "use fewer clients or more data")
    return train_idx, test_idx, owners[0], owners[1]
