"""Geometric median (spatial median, Fermat-Weber point) of weighted points.

RF-ICA aggregates every k-means cluster of client columns by its geometric
median (eq. 7 of the RF-ICA paper; docs/ALGORITHMS.md section 1.4, step 4).
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning

__all__ = ["geometric_median"]


def geometric_median(points, weights=None, *, tol=1e-10, max_iter=1000) -> np.ndarray:
    """Weighted geometric median of points in R^d.

    Minimises ``sum_i w_i ||y - x_i||`` over ``y`` by Weiszfeld's iteration with
    the Vardi-Zhang (2000) modification, which keeps the iteration well defined
    and convergent when an iterate lands exactly on a data point.

    Neither scipy nor scikit-learn provides a geometric median, so it is written
    here by hand.

    Two devices on top of the plain iteration make it exact to ~1e-9 at unit
    scale, including the hard case of a median very close to (or on) a data point,
    which Weiszfeld's isotropic step approaches very slowly:

    - Every data point that becomes the one nearest to the iterate is tested once
      with the exact optimality condition of a data point (``||R_k|| <= eta_k``,
      where ``R_k`` is the sum of the weighted unit vectors from ``x_k`` to the
      other points and ``eta_k`` the weight sitting on ``x_k``, duplicates
      pooled). If it holds, that data point is returned exactly (bit for bit):
      e.g. the median of an odd number of collinear points is exactly the middle
      one.
    - Away from data points, Newton's step (halved as needed) replaces the
      Weiszfeld step when it gives a lower objective, and otherwise the Weiszfeld
      step is lengthened while that lowers the objective. Each iterate is at least
      as good as Weiszfeld's, so the iteration keeps Weiszfeld's global
      convergence and gains Newton's local one; the line search also crosses the
      almost flat stretches of almost collinear points quickly.

    The iteration stops when a step moves less than ``tol``.

    When the median is not unique (all points collinear with a tie in the middle
    weight, e.g. an even number of equally weighted collinear points), any
    minimiser on the median segment may be returned; when it is barely unique
    (almost such a configuration) the location is ill-conditioned and only the
    objective value is exact.

    Parameters
    ----------
    points : array-like of shape (n_points, n_dims)
        The points, one per row. Must be finite, ``n_points >= 1``.
    weights : array-like of shape (n_points,), default=None
        Non-negative finite weights with a positive sum; ``None`` means all ones.
        Points with weight zero are ignored.
    tol : float, default=1e-10
        Stop when one step moves the iterate by less than ``tol``
        (Euclidean norm, in the units of ``points``; raised to the rounding
        resolution of the coordinates, ~1e-14 times their magnitude, if smaller).
    max_iter : int, default=1000
        Maximal number of steps. A ``ConvergenceWarning`` is issued if
        they are exhausted; the last iterate is returned.

    Returns
    -------
    median : ndarray of shape (n_dims,)
        The geometric median.

    Raises
    ------
    ValueError
        If ``points`` is not a non-empty finite 2-D array, ``weights`` has the
        wrong shape, is negative, non-finite or sums to zero, or ``tol``/``max_iter``
        are not positive.

    References
    ----------
    Weiszfeld, E. (1937). Sur le point pour lequel la somme des distances de n
    points donnés est minimum. Tohoku Math. J.
    Vardi, Y. and Zhang, C.-H. (2000). The multivariate L1-median and associated
    data depth. PNAS 97(4).

    Examples
    --------
    >>> geometric_median([[0.0, 0.0], [1.0, 0.0], [5.0, 0.0]])
    array([1., 0.])
    """
    x, w = _validate(points, weights)
    if not tol > 0:
        raise ValueError(f"tol must be positive, got {tol!r}")
    if int(max_iter) != max_iter or max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer, got {max_iter!r}")

    positive = w > 0
    x, w = x[positive], w[positive]
    if x.shape[0] == 1:
        return x[0].copy()

    centre = x.mean(axis=0)
    scale = max(float(np.max(np.abs(x - centre))), np.finfo(float).tiny)
    # Distances below this are "on the point": 1/distance would only carry rounding noise.
    coincide = 64 * np.finfo(float).eps * (scale + float(np.max(np.abs(centre))))

    # An absolute tol below the rounding resolution of the coordinates is unreachable.
    stop = max(tol, coincide)
    checked = np.zeros(x.shape[0], dtype=bool)
    y = np.average(x, axis=0, weights=w)
    for _ in range(int(max_iter)):
        diff = x - y
        dist = np.sqrt(np.einsum("ij,ij->i", diff, diff))
        nearest = int(np.argmin(dist))
        if not checked[nearest]:
            checked[nearest] = True
            if _is_median_at_point(x, w, nearest, coincide):
                return x[nearest].copy()

        on_point = dist <= coincide
        inv = np.where(on_point, 0.0, w / np.where(on_point, 1.0, dist))
        inv_sum = inv.sum()
        weiszfeld = inv @ x / inv_sum
        eta = w[on_point].sum()
        if eta > 0:
            # Vardi-Zhang step: y sits on a data point that is not the median (else
            # the check above returned it); shrink the Weiszfeld step accordingly.
            pull = np.linalg.norm(inv_sum * (weiszfeld - y))
            gamma = min(1.0, eta / pull)
            y_new = (1.0 - gamma) * weiszfeld + gamma * y
        else:
            y_new = _improve_on_weiszfeld(x, w, y, weiszfeld, _newton_direction(diff, dist, w, inv))
        step = np.linalg.norm(y_new - y)
        y = y_new
        if step < stop:
            return y
    warnings.warn(
        f"geometric_median did not converge to tol={tol} in max_iter={max_iter} steps",
        ConvergenceWarning,
        stacklevel=2,
    )
    return y


def _newton_direction(diff, dist, w, inv):
    """Newton's step for the objective at a point that is no data point, or None.

    ``diff = x - y``, ``inv = w / dist``. The Hessian is
    ``sum_i w_i / d_i (I - u_i u_i^T)`` with ``u_i`` the unit vector from ``y`` to ``x_i``.
    """
    unit = diff / dist[:, None]
    gradient = -(w @ unit)
    hessian = inv.sum() * np.eye(diff.shape[1]) - (unit * inv[:, None]).T @ unit
    try:
        return -np.linalg.solve(hessian, gradient)
    except np.linalg.LinAlgError:
        return None


def _improve_on_weiszfeld(x, w, y, weiszfeld, newton):
    """Next iterate: never worse than Weiszfeld's point, usually much better.

    Weiszfeld's step is isotropic, so it crawls where the objective is
    anisotropic: next to a data point (the median close to it) or along an
    almost-flat direction (almost collinear points). First Newton's step is tried,
    halved until it beats Weiszfeld's point or is no longer than Weiszfeld's
    step. Failing that, Weiszfeld's step is doubled while that keeps improving.
    """
    weiszfeld_length = np.linalg.norm(weiszfeld - y)
    if newton is not None:
        trial = newton
        while np.linalg.norm(trial) > weiszfeld_length:
            if _objective_difference(x, w, y + trial, weiszfeld) < 0:
                return y + trial
            trial = trial / 2
    best = weiszfeld
    trial = 2 * (weiszfeld - y)
    while _objective_difference(x, w, y + trial, best) < 0:
        best = y + trial
        trial = 2 * trial
    return best


def _objective_difference(x, w, a, b):
    """``f(a) - f(b)`` for ``f(y) = sum_i w_i ||x_i - y||``, without cancellation.

    Near the median the two objectives agree to more digits than a float holds,
    so each term uses ``|u| - |v| = (|u|^2 - |v|^2) / (|u| + |v|)``.
    """
    to_a = np.linalg.norm(x - a, axis=1)
    to_b = np.linalg.norm(x - b, axis=1)
    total = to_a + to_b
    numerator = (2 * x - a - b) @ (b - a)
    return float(w @ np.where(total > 0, numerator / np.where(total > 0, total, 1.0), 0.0))


def _is_median_at_point(x, w, k, coincide):
    """Exact optimality test of data point ``x[k]``: ``||R_k|| <= eta_k``."""
    diff = x - x[k]
    dist = np.sqrt(np.einsum("ij,ij->i", diff, diff))
    on_point = dist <= coincide
    eta = w[on_point].sum()
    unit_weights = np.where(on_point, 0.0, w / np.where(on_point, 1.0, dist))
    resultant = np.linalg.norm(unit_weights @ diff)
    # The slack absorbs rounding in the resultant (a sum of n unit vectors).
    return resultant <= eta + 1e-12 * w.sum()


def _validate(points, weights):
    try:
        x = np.asarray(points, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"points must be a numeric array of shape (n_points, n_dims): {exc}") from exc
    if x.ndim != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"points must have shape (n_points, n_dims) with n_points >= 1, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("points must be finite (found NaN or inf)")
    if weights is None:
        return x, np.ones(x.shape[0])
    try:
        w = np.asarray(weights, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"weights must be a numeric array of shape (n_points,): {exc}") from exc
    if w.shape != (x.shape[0],):
        raise ValueError(f"weights must have shape ({x.shape[0]},) to match points, got {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("weights must be finite and non-negative")
    if not w.sum() > 0:
        raise ValueError("weights must have a positive sum")
    return x, w
