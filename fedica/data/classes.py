"""Labelled data sets split over clients by class: Breiman's waveform generator (the UCI Waveform
data set in law) and scikit-learn's handwritten digits.
"""

from __future__ import annotations

import functools

import numpy as np
from sklearn.datasets import load_digits

from fedica.data.blobs import client_cluster_sets
from fedica.data.common import ClientData, deal_classes, mark_readonly, resolve_k_range
from fedica.seeding import generator
from fedica.validation import check_partition, check_seed, check_test_fraction


def waveform(n_samples: int, *, random_state=None) -> tuple[np.ndarray, np.ndarray]:
    """Breiman's waveform generator (Breiman et al. 1984; the UCI Waveform data set, version 1).

    With ``h1(i) = max(6 - |i - 11|, 0)``, ``h2(i) = h1(i - 4)``, ``h3(i) = h1(i + 4)`` for i = 1..21 and
    ``u ~ U(0, 1)`` per point: class 0 is ``u h1 + (1 - u) h2``, class 1 is ``u h1 + (1 - u) h3``, class 2 is
    ``u h2 + (1 - u) h3``, each plus independent N(0, 1) noise per feature; classes are equally likely (drawn,
    not balanced exactly). UCI numbers the classes differently and rounds to 2 decimals; neither changes ARI.

    Parameters
    ----------
    n_samples : int
    random_state : int, numpy.random.Generator or None

    Returns
    -------
    X : ndarray of shape (n_samples, 21)
    y : ndarray of shape (n_samples,), int64 in {0, 1, 2}
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    rng = np.random.default_rng(random_state)
    waves = _waveform_base_waves()
    pairs = np.array([[waves[0], waves[1]], [waves[0], waves[2]], [waves[1], waves[2]]])  # (3 classes, 2, 21)
    y = rng.integers(0, 3, size=n_samples)
    u = rng.uniform(size=(n_samples, 1))
    X = u * pairs[y, 0] + (1.0 - u) * pairs[y, 1] + rng.standard_normal((n_samples, 21))
    return X, y.astype(np.int64)


def _waveform_base_waves() -> np.ndarray:
    """h1, h2, h3 of `waveform`, shape (3, 21)."""
    i = np.arange(1, 22)
    h1 = lambda t: np.maximum(6 - np.abs(t - 11), 0)  # noqa: E731
    return np.array([h1(i), h1(i - 4), h1(i + 4)], dtype=float)


@functools.lru_cache(maxsize=8)
def _waveform_dataset(n_samples: int, seed: int):
    X, y = waveform(n_samples, random_state=generator(seed, "waveform.points"))
    mark_readonly(X, y)
    return X, y


@functools.lru_cache(maxsize=1)
def _digits_dataset():
    X, y = load_digits(return_X_y=True)
    X, y = X.astype(np.float64), y.astype(np.int64)
    mark_readonly(X, y)
    return X, y


@functools.lru_cache(maxsize=32)
def _class_partition(dataset: str, dataset_args: tuple, n_clients: int, test_fraction: float, k_min: int,
                     k_max: int, seed: int):
    """Split a labelled data set train/test (stratified) and deal every class evenly among its holders.

    Returns ``(X, y, train_idx, test_idx, train_owner, test_owner, sets)``: the owner arrays give the client
    of every train/test index.
    """
    X, y = _waveform_dataset(*dataset_args, seed) if dataset == "waveform" else _digits_dataset()
    classes = np.unique(y)
    sets = client_cluster_sets(n_clients, classes.size, k_min, k_max,
                               random_state=generator(seed, "scenario.cluster_sets"))
    train_idx, test_idx, train_owner, test_owner = deal_classes(y, sets, test_fraction, seed)
    mark_readonly(train_idx, test_idx, train_owner, test_owner, *sets)
    return X, y, train_idx, test_idx, train_owner, test_owner, tuple(sets)


def _class_client_data(partition_id, dataset, dataset_args, n_clients, test_fraction, k_min, k_max, seed):
    g = check_partition(partition_id, n_clients)
    k_min, k_max = resolve_k_range(3 if dataset == "waveform" else 10, k_min, k_max)
    X, y, train_idx, test_idx, train_owner, test_owner, sets = _class_partition(
        dataset, dataset_args, int(n_clients), check_test_fraction(test_fraction), k_min, k_max,
        check_seed(seed))
    train = train_idx[train_owner == g]
    test = test_idx[test_owner == g]
    return ClientData(X[train], y[train], X[test], y[test], int(sets[g].size))


def waveform_client_data(partition_id: int, *, n_clients: int = 5, n_samples: int = 5000,
                         test_fraction: float = 0.3, k_min: int = 2, k_max: int | None = None,
                         seed: int = 0) -> ClientData:
    """One client's share of a generated Waveform data set (stand-in for the paper's UCI Waveform).

    The whole data set (`waveform`, ``n_samples`` points) and its stratified train/test split come from
    ``seed``; every client holds a random set of K_g classes (`client_cluster_sets`; ``k_max=None`` means 2, the
    paper's text; the authors' code allows 3) and every class's train and test points are dealt evenly at random
    among the clients holding it, so each point is on exactly one client. No standardisation (the paper's
    setting).

    Parameters
    ----------
    partition_id : int
        Client index in [0, n_clients).
    n_clients : int
    n_samples : int
        Size of the whole data set.
    test_fraction : float
        In (0, 1).
    k_min : int
    k_max : int or None
    seed : int

    Returns
    -------
    ClientData
        21 features; labels in {0, 1, 2}; ``n_components`` is the number of classes the client holds.
    """
    return _class_client_data(partition_id, "waveform", (int(n_samples),), n_clients, test_fraction, k_min,
                              k_max, seed)


def digits_client_data(partition_id: int, *, n_clients: int = 10, test_fraction: float = 0.3, k_min: int = 2,
                       k_max: int | None = None, seed: int = 0) -> ClientData:
    """One client's share of scikit-learn's handwritten digits (1797 x 64, 10 classes, shipped with sklearn).

    Split and dealt among clients exactly as in `waveform_client_data` (``k_max=None`` means 9). Features are
    used as loaded: pixel intensities 0..16, not standardised.

    Parameters
    ----------
    partition_id : int
    n_clients : int
    test_fraction : float
    k_min : int
    k_max : int or None
    seed : int

    Returns
    -------
    ClientData
        64 features; labels in 0..9.
    """
    return _class_client_data(partition_id, "digits", (), n_clients, test_fraction, k_min, k_max, seed)
