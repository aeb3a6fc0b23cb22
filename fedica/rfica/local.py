"""RF-ICA's client step: symmetric FastICA, then unit-norm columns (docs/ALGORITHMS.md section 1).
"""

from __future__ import annotations

import warnings

import numpy as np
from sklearn.decomposition import FastICA
from sklearn.exceptions import ConvergenceWarning

from fedica.seeding import sklearn_seed
from fedica.validation import as_float_array, check_int

CONTRASTS = ("cube", "logcosh")


INITS = ("random", "shared")


# Covariance eigenvalue ratio below which PCA whitening would divide by rounding noise.
_RANK_DEFICIENT_RATIO = 1e-10


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
    matrix = as_float_array(A, "A")
    if matrix.ndim != 2:
        raise ValueError(f"A must be a 2-D array, got shape {matrix.shape}")
    bad = ~np.all(np.isfinite(matrix), axis=0)
    if np.any(bad):
        raise ValueError(f"A must be finite: column(s) {np.flatnonzero(bad).tolist()} contain NaN or inf")
    norms = np.linalg.norm(matrix, axis=0)
    if np.any(norms == 0):
        raise ValueError(f"A must have non-zero columns: column(s) {np.flatnonzero(norms == 0).tolist()} are zero")
    return matrix / norms


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
        docs/ALGORITHMS.md section 1.3): centre ``Y``, divide it by one scalar
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
    data = as_float_array(Y, "Y")
    if data.ndim != 2 or data.shape[0] < 1:
        raise ValueError(f"Y must have shape (r, n_samples), got {data.shape}")
    r, n_samples = data.shape
    if n_samples <= r:
        raise ValueError(f"Y must have more samples (columns) than signals (rows): got shape {data.shape}")
    if not np.all(np.isfinite(data)):
        raise ValueError("Y must be finite (found NaN or inf)")
    if contrast not in CONTRASTS:
        raise ValueError(f"contrast must be one of {CONTRASTS}, got {contrast!r}")
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")

    centred = data - data.mean(axis=1, keepdims=True)
    covariance_eigenvalues = np.linalg.eigvalsh(centred @ centred.T / n_samples)
    if not covariance_eigenvalues[-1] > 0:
        raise ValueError("Y must not be constant: every signal has zero variance")
    rank_deficient = covariance_eigenvalues[0] <= _RANK_DEFICIENT_RATIO * covariance_eigenvalues[-1]

    rng = np.random.default_rng(random_state)
    options = dict(algorithm="parallel", fun=contrast, max_iter=max_iter, tol=tol)
    if init == "random" and not rank_deficient:
        ica = FastICA(n_components=r, whiten="unit-variance", random_state=sklearn_seed(rng), **options)
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
    r = check_int(r, "r", minimum=1)
    gaussian = np.random.default_rng(random_state).standard_normal((r, r))
    if orthogonal:
        left, _, right_t = np.linalg.svd(gaussian)
        return left @ right_t
    return normalize_columns(gaussian)
