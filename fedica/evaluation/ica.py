"""How far an estimated mixing matrix is from the truth: the distance up to a signed permutation of columns
(:func:`ica_error`) and the Amari index (:func:`amari_index`).
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


def amari_index(estimate, A_true, *, unmixing=False) -> float:
    """Amari index of an estimate: how far ``W A*`` is from a scaled permutation, in [0, 1].

    With ``P = W A*`` (``r x r``), where ``W`` is the estimate's unmixing (``pinv(A_hat)``, shape
    ``(r, p)``, for a mixing estimate ``A_hat`` of shape ``(p, r)``; the estimate itself when
    ``unmixing``) and ``A*``'s columns are scaled to unit norm, each row of ``|P|`` is first divided by
    its largest entry (``Q = |P| / max_j |P_ij|``), and then

    ``amari = ( sum_i (sum_j Q_ij - 1) + sum_j (sum_i Q_ij / max_i Q_ij - 1) ) / (2 r (r - 1))``.

    Each bracket lies in ``[0, r - 1]``, so the index lies in [0, 1]; it is 0 exactly when ``P`` is a
    permutation matrix times a diagonal one. Dividing the rows first (Amari, Cichocki and Yang 1996
    normalise only within each sum) makes the index independent of the scale and sign of every estimated
    component, however the estimate is given (columns of ``A_hat`` or rows of ``W``); normalising ``A*``'s
    columns makes it independent of the truth's scale. For ``r = 1`` it is 0.

    Parameters
    ----------
    estimate : array-like of shape (p, r), or (r, p) if ``unmixing``
        A mixing estimate ``A_hat`` (observations ~ A_hat sources), or an unmixing ``W`` (sources ~ W
        observations).
    A_true : array-like of shape (p, r)
        The true mixing, ``p >= r`` (more channels than sources: ``W A*`` is still ``r x r``).
    unmixing : bool, default=False
        Whether ``estimate`` is ``W`` rather than ``A_hat``.

    Returns
    -------
    index : float
        In [0, 1]; 0 for a signed, scaled permutation of the true sources.
    """
    estimate = as_float_array(estimate, "estimate")
    truth = as_float_array(A_true, "A_true")
    if truth.ndim != 2 or truth.size == 0 or truth.shape[0] < truth.shape[1]:
        raise ValueError(f"A_true must be a non-empty (p, r) array with p >= r, got shape {truth.shape}")
    expected = truth.shape[::-1] if unmixing else truth.shape
    if estimate.shape != expected:
        raise ValueError(f"the estimate must have shape {expected} ({'W' if unmixing else 'A_hat'} for A_true of "
                         f"shape {truth.shape}), got {estimate.shape}")
    if not (np.all(np.isfinite(estimate)) and np.all(np.isfinite(truth))):
        raise ValueError("the estimate and A_true must be finite (found NaN or inf)")
    r = truth.shape[1]
    if r == 1:
        return 0.0
    W = estimate if unmixing else np.linalg.pinv(estimate)
    product = np.abs(W @ (truth / np.linalg.norm(truth, axis=0)))
    # A zero row (a component that holds none of the sources) or column (a source no component holds)
    # scores the worst, r - 1, as its sum's limit would.
    row_max = product.max(axis=1, keepdims=True)
    q = np.divide(product, row_max, out=np.zeros_like(product), where=row_max > 0)
    rows = np.sum(np.where(row_max[:, 0] > 0, q.sum(axis=1) - 1.0, r - 1.0))
    column_max = q.max(axis=0)
    ratios = np.divide(q.sum(axis=0), column_max, out=np.full(r, float(r)), where=column_max > 0)
    columns = np.sum(ratios - 1.0)
    return float((rows + columns) / (2 * r * (r - 1)))
