"""The error of an estimated mixing matrix: the distance to the truth up to a signed permutation of columns.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from fedica.validation import as_float_array


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
    estimate = as_float_array(A_hat, "A_hat")
    truth = as_float_array(A_true, "A_true")
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
