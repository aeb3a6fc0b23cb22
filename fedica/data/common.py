"""What every clustering scenario returns (:class:`ClientData`) and the helpers they share.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ClientData:
    """One client's data.

    Attributes
    ----------
    X_train : ndarray of shape (n, d), float64
        Training points.
    y_train : ndarray of shape (n,), int64, or None
        Global class labels of the training points, None if unknown.
    X_test : ndarray of shape (m, d), float64
        Test points.
    y_test : ndarray of shape (m,), int64, or None
        Global class labels of the test points, None if unknown.
    n_components : int
        K_g, the number of local mixture components this client fits.
    """

    X_train: np.ndarray
    y_train: np.ndarray | None
    X_test: np.ndarray
    y_test: np.ndarray | None
    n_components: int

    def __post_init__(self):
        if self.X_train.ndim != 2 or self.X_test.ndim != 2:
            raise ValueError(
                f"X_train and X_test must be 2-D, got shapes {self.X_train.shape} and {self.X_test.shape}"
            )
        if self.X_train.shape[1] != self.X_test.shape[1]:
            raise ValueError(
                f"X_train and X_test must have the same number of columns, got {self.X_train.shape[1]} "
                f"and {self.X_test.shape[1]}"
            )
        for name, X, y in (("train", self.X_train, self.y_train), ("test", self.X_test, self.y_test)):
            if y is not None and y.shape != (X.shape[0],):
                raise ValueError(f"y_{name} must have shape ({X.shape[0]},) to match X_{name}, got {y.shape}")
        if int(self.n_components) < 1:
            raise ValueError(f"n_components must be >= 1, got {self.n_components}")

    @property
    def n_train(self) -> int:
        """N_g, the number of training points."""
        return int(self.X_train.shape[0])


def _apportion(total: int, fractions: np.ndarray, minimum: int = 0) -> np.ndarray:
    """Integer counts summing exactly to ``total``, proportional to ``fractions`` (largest-remainder method).

    Every entry first gets ``minimum``; the rest is split by the fractions, floors first, then one extra unit each
    to the largest fractional parts (ties: lower index). Rounding therefore never loses or adds a point.
    """
    fractions = np.asarray(fractions, dtype=float)
    free = total - minimum * fractions.size
    if free < 0:
        raise ValueError(f"cannot give {fractions.size} parts at least {minimum} each out of {total}")
    raw = free * fractions / fractions.sum()
    counts = np.floor(raw).astype(np.int64)
    short = free - int(counts.sum())
    counts[np.argsort(-(raw - counts), kind="stable")[:short]] += 1
    return counts + minimum


def _resolve_k_range(n_clusters: int, k_min: int, k_max: int | None) -> tuple[int, int]:
    k_max = n_clusters - 1 if k_max is None else k_max
    if not 1 <= k_min <= k_max <= n_clusters:
        raise ValueError(
            f"need 1 <= k_min <= k_max <= n_clusters, got k_min={k_min}, k_max={k_max}, n_clusters={n_clusters} "
            "(FedGEM's setting is 2 <= K_g < K: k_min=2, k_max=n_clusters-1)"
        )
    return int(k_min), int(k_max)


def _readonly(*arrays: np.ndarray) -> None:
    """Cached arrays are shared between calls; make accidental in-place edits fail loudly."""
    for array in arrays:
        array.setflags(write=False)
