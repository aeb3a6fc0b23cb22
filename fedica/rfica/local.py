"""RF-ICA's client step: a local ICA (FastICA or Picard), then unit-norm columns in channel space
(docs/ALGORITHMS.md section 1.2).
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from numbers import Integral

import numpy as np
from picard import picard
from sklearn.decomposition import FastICA
from sklearn.exceptions import ConvergenceWarning

from fedica.concurrency import SharedContext, one_blas_thread
from fedica.parameters import CONTRASTS, INITS, SOLVERS
from fedica.rfica.uncertainty import column_variances
from fedica.seeding import sklearn_seed
from fedica.validation import as_float_array, check_int


# Picard's names of the two contrasts: logcosh's score is tanh; both are Picard's own densities.
_PICARD_FUN = {"cube": "cube", "logcosh": "tanh"}

# Picard's tolerance is on the gradient's norm (its own default), not FastICA's step size.
_PICARD_TOL = 1e-7

# A retry (another start) of a site that did not converge gets this many times its iterations.
RETRY_ITERATIONS_FACTOR = 4


# Covariance eigenvalue ratio below which PCA whitening would divide by rounding noise.
_RANK_DEFICIENT_RATIO = 1e-10


@contextlib.contextmanager
def _silenced_solver_warnings():
    # A site reports its convergence in its reply and the server names the sites that did not converge in one
    # line (fedica.rfica.coordinator); the solvers' own warning, once per site, would only repeat it.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=ConvergenceWarning)
        warnings.filterwarnings("ignore", message="Picard did not converge", category=UserWarning)
        yield


# Shared by concurrent sites: the warning filters are process-wide (fedica.concurrency).
_SOLVERS_QUIET = SharedContext(_silenced_solver_warnings)


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


@dataclass(frozen=True)
class LocalICA:
    """A site's local ICA: its mixing estimate in channel space and how its solver fared.

    Attributes
    ----------
    mixing : ndarray of shape (n_channels, n_components)
        ``Y ~ mixing @ S``, unit-norm columns; finite, except the rows of bad channels and the
        columns a site with bad channels could not estimate, which are NaN (:func:`bad_channels`).
    n_iter : int
        Iterations of the attempt whose estimate this is.
    converged : bool
        Whether that attempt met its tolerance within its iterations.
    attempts : int
        1, or 2 when the first attempt did not converge and was retried.
    column_variances : ndarray of shape (n_components,)
        The variance of each column's direction (:func:`fedica.rfica.uncertainty.column_variances`): how
        well the site sees each source; NaN for the columns that are NaN.
    """

    mixing: np.ndarray
    n_iter: int
    converged: bool
    attempts: int
    column_variances: np.ndarray


def observation_matrix(Y) -> np.ndarray:
    """A site's observations as the local ICA takes them: float64, finite, C-ordered.

    The one entry of every client computation: FastICA's whitening and its iterations run
    BLAS products whose rounding depends on the memory layout, and an unconverged fit
    amplifies that rounding into a different estimate; a C-ordered copy of a transposed
    (F-ordered) array makes the result independent of how the caller held the values.

    Parameters
    ----------
    Y : array-like of shape (n_channels, n_samples)

    Returns
    -------
    Y : ndarray of shape (n_channels, n_samples), C-contiguous (``Y`` itself when it already is)

    Raises
    ------
    ValueError
        On a bad shape, NaN/inf or ``n_samples <= n_channels``.
    """
    data = np.ascontiguousarray(as_float_array(Y, "Y"))
    if data.ndim != 2 or data.shape[0] < 1:
        raise ValueError(f"Y must have shape (r, n_samples), got {data.shape}")
    if data.shape[1] <= data.shape[0]:
        raise ValueError(f"Y must have more samples (columns) than signals (rows): got shape {data.shape}")
    if not np.all(np.isfinite(data)):
        raise ValueError("Y must be finite (found NaN or inf)")
    return data


def site_covariance(Y) -> np.ndarray:
    """A site's channel covariance, what it sends for the federated whitening.

    Parameters
    ----------
    Y : array-like of shape (n_channels, n_samples)

    Returns
    -------
    covariance : ndarray of shape (n_channels, n_channels)
        ``Yc Yc^T / n_samples`` of the centred observations, exactly symmetric.
    """
    data = observation_matrix(Y)
    centred = data - data.mean(axis=1, keepdims=True)
    covariance = centred @ centred.T / data.shape[1]
    return (covariance + covariance.T) / 2


# A channel whose standard deviation is below this share of the channels' root mean square carries no signal (dead,
# disconnected, or constant up to rounding): 1e-12 keeps a channel in nanovolts beside channels in volts (1e-9) live,
# which the local ICA handles in its own units (local_ica's channel_units). The root mean square, not the median: half
# the channels in microvolts would pull a median down to them.
FLAT_CHANNEL_RATIO = 1e-12


def flat_channels(centred) -> np.ndarray:
    """Which channels of centred observations ``(n_channels, n_samples)`` are flat (boolean mask).

    Flat: constant, or of a standard deviation under :data:`FLAT_CHANNEL_RATIO` of the channels'
    root mean square deviation. Such a channel holds nothing of any source, and its zero variance makes the
    covariance singular: the solvers' whitening divides by it, or a scalar whitening crawls for
    thousands of iterations (docs/ALGORITHMS.md section 1.12).
    """
    deviations = np.sqrt(np.mean(centred**2, axis=1))
    return (deviations == 0) | (deviations < FLAT_CHANNEL_RATIO * np.sqrt(np.mean(deviations**2)))


# A channel with at least this share of its samples at its minimum, or at its maximum, is saturated (clipped at an
# amplifier's rail). A continuous signal holds its extremes once; one clipped at 1 sd holds about a sixth of its
# samples at each (fedica.data.recordings.SATURATION_LEVEL), one clipped at 3 sd a thousandth at each end.
SATURATED_SHARE = 0.01
# ... and at least this many samples: in a site of fewer than 100 samples one sample is over 1 %, and a continuous
# signal never repeats its extreme.
SATURATED_MIN_SAMPLES = 3
# ... and at least this many times as many samples as any other value: a pile at the rail. Data measured to a coarse
# resolution (iris's centimetres to one decimal) repeat their extremes too, but less often than their common values.
SATURATED_PILE_FACTOR = 2
# A channel of fewer distinct values than this is discrete (counts, levels), not a signal clipped at a rail.
SATURATED_MIN_LEVELS = 16


def saturated_channels(data) -> np.ndarray:
    """Which channels of observations ``(n_channels, n_samples)`` are saturated (boolean mask).

    Saturated: at least :data:`SATURATED_SHARE` of the samples, and :data:`SATURATED_MIN_SAMPLES`,
    equal the channel's minimum, or its maximum, :data:`SATURATED_PILE_FACTOR` times as many as
    hold any value between them (a pile at the rail, where coarsely measured data repeat every value),
    of at least :data:`SATURATED_MIN_LEVELS` distinct values, and not flat. Clipping cuts every source's contribution at once, so that
    the channel is no longer a linear mixture of them (docs/ALGORITHMS.md section 1.12).
    """
    n_samples = data.shape[1]
    saturated = np.zeros(data.shape[0], dtype=bool)
    for channel, values in enumerate(data):
        at_rail = max(np.sum(values == values.max()), np.sum(values == values.min()))
        if at_rail < max(SATURATED_SHARE * n_samples, SATURATED_MIN_SAMPLES) or at_rail == n_samples:
            continue  # the common case, decided without counting every value
        counts = np.unique(values, return_counts=True)[1]  # in increasing order of value: the rails at both ends
        saturated[channel] = (counts.size >= SATURATED_MIN_LEVELS
                              and at_rail >= SATURATED_PILE_FACTOR * counts[1:-1].max())
    return saturated


def bad_channels(data) -> np.ndarray:
    """The channels a site leaves out of its ICA (boolean mask): flat (:func:`flat_channels`) or saturated."""
    return flat_channels(data - data.mean(axis=1, keepdims=True)) | saturated_channels(data)


def components_for_share(eigenvalues, share: float) -> int:
    """The number of principal components that keep a share of the variance, as MNE's ICA counts it.

    Parameters
    ----------
    eigenvalues : array-like of shape (n_channels,)
        The covariance's eigenvalues, in decreasing order, non-negative.
    share : float
        In (0, 1).

    Returns
    -------
    n_components : int
        One more than the number of leading components whose cumulative share is at most
        ``share`` (MNE's ``_exp_var_ncomp``), at most ``n_channels``.
    """
    cumulative = np.cumsum(np.clip(eigenvalues, 0.0, None))
    return int(min(np.sum(cumulative / cumulative[-1] <= share) + 1, len(cumulative)))


def local_ica(
    Y,
    *,
    solver="fastica",
    contrast="cube",
    init="random",
    n_components=None,
    whitening=None,
    random_state=None,
    shared_init_seed=0,
    max_iter=1000,
    tol=1e-6,
    retry_random_state=None,
) -> LocalICA:
    """A site's estimate of the mixing matrix in channel space (docs/ALGORITHMS.md section 1.2).

    The observations are centred and, when fewer components than channels are asked,
    projected to an ``r``-dimensional subspace: the server's (``whitening``, the federated
    whitening of section 1.8) or the site's own top-``r`` principal subspace. The solver
    separates the ``r`` projected signals; the estimate is brought back to channel space
    (the pseudo-inverse of the projection) and its columns scaled to unit norm.

    Parameters
    ----------
    Y : array-like of shape (n_channels, n_samples)
        Observations, one column per sample; finite, ``n_samples > n_channels``; any memory order
        (:func:`observation_matrix`).
    solver : {"fastica", "picard"}, default="fastica"
        scikit-learn's symmetric FastICA (``algorithm="parallel"``), or python-picard's
        orthogonal Picard (``ortho=True``, Picard-O, the solver of MNE's ICA).
    contrast : {"cube", "logcosh"}, default="cube"
        The non-linearity; "cube" is the kurtosis contrast of the paper (eq. 8). Picard's
        densities of the same name: ``cube`` and ``tanh``.
    init : {"random", "shared"}, default="random"
        ``"random"``: the solver's own PCA whitening and a random start drawn
        from ``random_state``. ``"shared"`` (paper appendix D, as fixed in
        docs/ALGORITHMS.md section 1.3): centre the signals, divide them by one scalar
        ``sqrt(mean variance)``, and run the solver without whitening from the
        orthogonal rotation ``make_mixing_matrix(r, random_state=shared_init_seed)``,
        the same for every client. The scalar whitening is exact only when the
        covariance of the signals is a multiple of the identity (orthogonal ``A*``, or
        the federated whitening); the start is shared in channel space only when the
        projection is (every channel, or ``whitening`` given).
    n_components : int, float or None, default=None
        Without ``whitening``: the site's own top-``n_components`` principal subspace (a float in
        (0, 1): the fewest components keeping that share of the variance,
        :func:`components_for_share`); None: every channel, no projection.
        Ignored when ``whitening`` is given (its rows are the components).
    whitening : ndarray of shape (r, n_channels) or None, default=None
        The server's projection (federated whitening); the site separates ``whitening @ Yc``.
    random_state : int, numpy.random.Generator or None, default=None
        Source of the random start for ``init="random"``.
    shared_init_seed : int, default=0
        Seed of the shared start for ``init="shared"``; nothing else influences it.
    max_iter : int, default=1000
        The solver's iterations.
    tol : float, default=1e-6
        FastICA's tolerance (Picard's is on the gradient's norm, ``1e-7``).
    retry_random_state : int, numpy.random.Generator or None, default=None
        When given, an attempt that does not converge is retried once from a random start
        drawn from it, with ``RETRY_ITERATIONS_FACTOR * max_iter`` iterations, and the
        retry's estimate is kept. The solver's convergence warning is silenced either way
        (an unconverged fit still gives an estimate, and the reply says it did not converge).

    Returns
    -------
    LocalICA
        The mixing (n_channels, r), unit columns, with the solver's iterations and convergence.

    Raises
    ------
    ValueError
        On a bad shape, NaN/inf, ``n_samples <= n_channels``, constant ``Y``, an
        unknown ``solver``/``contrast``/``init``, ``n_components`` above the channel count, or
        a ``whitening`` of the wrong width.

    Notes
    -----
    If the sample covariance of the projected signals is numerically singular (e.g. a small
    client whose sparse source happens to be all zero), PCA whitening would
    divide by rounding noise and return a meaningless estimate; the scalar
    whitening of ``init="shared"`` is then used instead, started from a random
    rotation drawn from ``random_state`` when ``init="random"``.
    """
    data = observation_matrix(Y)
    n_channels, n_samples = data.shape
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
    if contrast not in CONTRASTS:
        raise ValueError(f"contrast must be one of {CONTRASTS}, got {contrast!r}")
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")

    centred = data - data.mean(axis=1, keepdims=True)
    bad = bad_channels(data)
    if bad.any() and not bad.all():
        return _without_bad_channels(data, bad, solver=solver, contrast=contrast, init=init, n_components=n_components,
                                      whitening=whitening, random_state=random_state, shared_init_seed=shared_init_seed,
                                      max_iter=max_iter, tol=tol, retry_random_state=retry_random_state)
    projection = _projection(centred, n_components, whitening)
    # Without a projection the solver sees the observations as given (it centres them itself),
    # exactly as before the projections existed.
    signals = data if projection is None else projection @ centred
    signals_centred = centred if projection is None else signals
    r = signals.shape[0]
    covariance = signals_centred @ signals_centred.T / n_samples
    covariance_eigenvalues = np.linalg.eigvalsh(covariance)
    if not covariance_eigenvalues[-1] > 0:
        raise ValueError("Y must not be constant: every signal has zero variance")
    rank_deficient = _rank_deficient(covariance_eigenvalues)
    # A channel in far smaller units (microvolts beside volts) makes the covariance look singular although its
    # correlations are not: every channel is then divided by its deviation, and the mixing's rows multiplied back
    # (ICA is equivariant to the channels' scales), rather than taking the scalar whitening that singular data
    # need. Only then: a site whose covariance passes the test keeps its exact path.
    channel_units = None
    if rank_deficient and projection is None:
        deviations = np.sqrt(np.diag(covariance))
        units = np.where(deviations > 0, deviations, 1.0)
        if not _rank_deficient(np.linalg.eigvalsh(covariance / np.outer(units, units))):
            channel_units, rank_deficient = units, False
            signals, signals_centred = data / units[:, None], centred / units[:, None]

    rng = np.random.default_rng(random_state)
    # One BLAS thread: a solver's products are small (r x n by n x r) and OpenBLAS's threads made a 64-channel
    # site's Picard 3 times slower even on an idle machine (docs/PERFORMANCE.md); the results move in their
    # last bits only.
    with one_blas_thread(), _SOLVERS_QUIET:
        if init == "random" and not rank_deficient:
            attempt = _solve_whitening(signals, solver, contrast, sklearn_seed(rng), max_iter, tol)
        else:
            start = make_mixing_matrix(r, random_state=shared_init_seed if init == "shared" else rng)
            attempt = _solve_scaled(signals_centred, solver, contrast, start, max_iter, tol)
        attempts = 1
        if not attempt[2] and retry_random_state is not None:
            retry = np.random.default_rng(retry_random_state)
            attempts = 2
            if rank_deficient:
                attempt = _solve_scaled(signals_centred, solver, contrast, make_mixing_matrix(r, random_state=retry),
                                        RETRY_ITERATIONS_FACTOR * max_iter, tol)
            else:
                attempt = _solve_whitening(signals, solver, contrast, sklearn_seed(retry),
                                           RETRY_ITERATIONS_FACTOR * max_iter, tol)
    mixing, n_iter, converged = attempt
    sources = np.linalg.pinv(mixing) @ signals_centred
    if channel_units is not None:
        mixing = channel_units[:, None] * mixing
    if projection is not None:
        mixing = np.linalg.pinv(projection) @ mixing
    return LocalICA(normalize_columns(mixing), int(n_iter), bool(converged), attempts,
                    column_variances(mixing, sources, contrast))


def _without_bad_channels(data, bad, *, n_components, whitening, **settings) -> LocalICA:
    """The local ICA on the good channels alone, its estimate NaN on the bad channels' rows.

    Every channel asked (``n_components`` None) is more components than the good channels hold:
    the columns beyond them are NaN, and the server fills them, with the bad rows, from the other
    sites (docs/ALGORITHMS.md section 1.12). A count above the good channels is refused.
    """
    n_channels, live = data.shape[0], ~bad
    if isinstance(n_components, Integral) and n_components > live.sum():
        raise ValueError(f"n_components={n_components} is more than the {int(live.sum())} channels that are not flat "
                         f"or saturated (bad: {', '.join(map(str, np.flatnonzero(bad)))})")
    part = local_ica(data[live], n_components=n_components, whitening=None if whitening is None
                     else as_float_array(whitening, "whitening")[:, live], **settings)
    columns = n_channels if n_components is None and whitening is None else part.mixing.shape[1]
    mixing = np.full((n_channels, columns), np.nan)
    mixing[np.ix_(live, np.arange(part.mixing.shape[1]))] = part.mixing
    variances = np.full(columns, np.nan)
    variances[:part.mixing.shape[1]] = part.column_variances
    return LocalICA(mixing, part.n_iter, part.converged, part.attempts, variances)


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
    """A client's estimate of the mixing matrix by symmetric FastICA on every channel.

    The mixing of :func:`local_ica` with ``solver="fastica"``, no dimension reduction and no
    retry (the estimate of the paper's protocol).

    Parameters
    ----------
    Y : array-like of shape (r, n_samples)
        Observations, one column per sample; finite, ``n_samples > r``.
    contrast, init, random_state, shared_init_seed, max_iter, tol
        As for :func:`local_ica`.

    Returns
    -------
    A_hat : ndarray of shape (r, r)
        Estimated mixing matrix in observation space (``Y ~ A_hat S``), columns
        of unit norm, always finite.
    """
    return local_ica(Y, contrast=contrast, init=init, random_state=random_state, shared_init_seed=shared_init_seed,
                     max_iter=max_iter, tol=tol).mixing


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


def _projection(centred, n_components, whitening):
    """The (r, n_channels) projection the solver's signals come from, or None for every channel."""
    n_channels = centred.shape[0]
    if whitening is not None:
        matrix = as_float_array(whitening, "whitening")
        if matrix.ndim != 2 or matrix.shape[1] != n_channels or not 1 <= matrix.shape[0] <= n_channels:
            raise ValueError(f"whitening must have shape (r, {n_channels}) with 1 <= r <= {n_channels}, "
                             f"got {matrix.shape}")
        if not np.all(np.isfinite(matrix)):
            raise ValueError("whitening must be finite")
        return matrix
    if n_components is None:
        return None
    eigenvalues, eigenvectors = np.linalg.eigh(centred @ centred.T / centred.shape[1])
    eigenvalues, eigenvectors = eigenvalues[::-1], eigenvectors[:, ::-1]
    if isinstance(n_components, float):
        r = components_for_share(eigenvalues, n_components)
    else:
        r = check_int(n_components, "n_components", minimum=1)
        if r > n_channels:
            raise ValueError(f"n_components={r} is more than the {n_channels} channels")
    # Orthonormal rows: the solver whitens the r principal signals itself.
    return eigenvectors[:, :r].T.copy()


def _rank_deficient(eigenvalues) -> bool:
    """Whether a covariance (its ascending eigenvalues) is numerically singular for PCA whitening."""
    return bool(eigenvalues[0] <= _RANK_DEFICIENT_RATIO * eigenvalues[-1])


def _solve_whitening(signals, solver, contrast, seed, max_iter, tol):
    """(mixing (r, r), iterations, converged) of the solver with its own PCA whitening, started from ``seed``."""
    r = signals.shape[0]
    if solver == "fastica":
        ica = FastICA(n_components=r, whiten="unit-variance", random_state=seed, algorithm="parallel", fun=contrast,
                      max_iter=max_iter, tol=tol).fit(signals.T)
        return ica.mixing_, *_fastica_outcome(ica.n_iter_, max_iter)
    pre_whitening, unmixing, _, n_iter = picard(signals, fun=_PICARD_FUN[contrast], n_components=r, ortho=True,
                                                max_iter=max_iter, tol=_PICARD_TOL, random_state=seed,
                                                return_n_iter=True)
    return np.linalg.pinv(unmixing @ pre_whitening), *_picard_outcome(n_iter, max_iter)


def _solve_scaled(centred, solver, contrast, start, max_iter, tol):
    """(mixing (r, r), iterations, converged) of the solver on scalar-whitened signals, started from ``start``."""
    scaled = centred / np.sqrt(np.mean(centred**2))
    if solver == "fastica":
        ica = FastICA(whiten=False, w_init=start, algorithm="parallel", fun=contrast, max_iter=max_iter,
                      tol=tol).fit(scaled.T)
        return ica.mixing_, *_fastica_outcome(ica.n_iter_, max_iter)
    _, unmixing, _, n_iter = picard(scaled, fun=_PICARD_FUN[contrast], ortho=True, whiten=False, w_init=start,
                                    max_iter=max_iter, tol=_PICARD_TOL, return_n_iter=True)
    return np.linalg.pinv(unmixing), *_picard_outcome(n_iter, max_iter)


# Convergence is read from the iteration counts, not from the solvers' warnings: recording warnings
# (warnings.catch_warnings) is not thread-safe, and sites may run on concurrent threads (fedica.concurrency).
# A solver that met its tolerance on its very last allowed iteration is counted as not converged (and retried).


def _fastica_outcome(n_iter, max_iter) -> tuple[int, bool]:
    """(iterations, converged) of a FastICA run: it stops early only when it has converged."""
    return n_iter, n_iter < max_iter


def _picard_outcome(n_iter, max_iter) -> tuple[int, bool]:
    """(updates, converged) of a Picard run from the index of its last loop pass: it stops early (before that
    pass's update) only when it has converged; otherwise it ran ``max_iter`` updates."""
    converged = n_iter < max_iter - 1
    return (n_iter if converged else max_iter), converged