"""What one site holds (:class:`ClientData`) and how a count is dealt over sites (:func:`apportion`).

The library's bottom layer: the protocol kit's sites, the algorithms and the scenarios all use these.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["ClientData", "apportion"]


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
    n_components_at_bound : bool, default=False
        Whether the site chose K_g itself and chose its bound (it may hold more clusters than it fits).
    """

    X_train: np.ndarray
    y_train: np.ndarray | None
    X_test: np.ndarray
    y_test: np.ndarray | None
    n_components: int
    n_components_at_bound: bool = False

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


def apportion(total: int, fractions: np.ndarray, minimum: int = 0) -> np.ndarray:
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
