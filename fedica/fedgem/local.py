"""Client-side mathematics of FedGEM for an isotropic Gaussian mixture.

The model (docs/ALGORITHMS.md sections 2.1-2.2) is a mixture of ``k`` Gaussians
with identity covariance and *fixed* weights ``pi``; only the means ``theta`` are
estimated. A client runs EM steps on its own data and reports, per component, the
M-step maximiser ``M_k`` and the squared radius ``eps_k`` of the largest ball around
``M_k`` whose every point is still a generalised-EM (GEM) step.

Radius. The paper (eq. 3) defines ``eps_k`` as the largest value such that every ``m``
with ``||m - M_k||^2 <= eps_k`` satisfies
``sum_n gamma_nk log N(x_n | m, I) >= sum_n gamma_nk log N(x_n | theta_k, I)``.
Because ``sum_n gamma_nk ||x_n - m||^2 = sum_n gamma_nk ||x_n - M_k||^2 +
(sum_n gamma_nk) ||m - M_k||^2``, the constraint reads ``||m - M_k||^2 <= ||theta_k - M_k||^2``,
so the exact solution is ``eps_k = ||M_k - theta_k||^2``. The paper's reformulation
(eq. 7) and bisection (Algorithm 4) are not equivalent to eq. 3 and are not used.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy.spatial.distance import cdist, pdist
from scipy.special import xlogy
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture

__all__ = [
    "kmeanspp_init",
    "kmeans_init",
    "responsibilities",
    "em_step",
    "uncertainty_radius",
    "local_round",
    "min_centroid_distance",
    "final_radius",
    "assign_labels",
    "local_objective",
    "LOCAL_CRITERIA",
    "LocalChoice",
    "local_bound",
    "choose_n_components",
    "estimate_n_components",
]


def _as_points(X, name="X"):
    X = np.asarray(X, dtype=float)
    if X.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array (n, d); got shape {X.shape}.")
    # A finite sum proves every value finite (inf and NaN propagate) at half the cost of
    # isfinite(X).all(), which only runs when the sum overflows or is not finite.
    if not (np.isfinite(X.sum()) or np.isfinite(X).all()):
        raise ValueError(f"{name} must contain only finite values.")
    return X


def _as_centroids(centroids, d, name="centroids"):
    centroids = _as_points(centroids, name)
    if centroids.shape[0] < 1:
        raise ValueError(f"{name} must hold at least one row.")
    if centroids.shape[1] != d:
        raise ValueError(
            f"{name} must have {d} columns to match the data; got shape {centroids.shape}."
        )
    return centroids


def _as_weights(weights, k, name="weights"):
    weights = np.asarray(weights, dtype=float)
    if weights.shape != (k,):
        raise ValueError(f"{name} must have shape ({k},); got {weights.shape}.")
    total = weights.sum()
    # min() is NaN if any weight is, and NaN >= 0 is False.
    if not (np.isfinite(total) and total > 0 and weights.min() >= 0):
        raise ValueError(f"{name} must be finite, non-negative and have a positive sum.")
    return weights


def kmeanspp_init(X, n_components, *, n_init=3, random_state=None):
    """Best of several greedy k-means++ seedings.

    Greedy k-means++ (Arthur and Vassilvitskii 2007; the variant of
    :func:`sklearn.cluster.kmeans_plusplus`): the first seed is a uniformly drawn point;
    every further seed is the best, by the resulting k-means objective, of
    ``2 + floor(log k)`` candidates drawn with probability proportional to the squared
    distance to the nearest seed so far. The seeding with the smallest k-means objective
    of the seeds themselves (sum of squared distances of the points to their nearest
    seed, no Lloyd iterations) is returned.

    Hand-written rather than calling :func:`sklearn.cluster.kmeans_plusplus` because that
    function's per-call overhead (validation, one call per seeding) costs about 0.8 ms on
    a client's few hundred points, several times its arithmetic; here the ``n_init``
    seedings advance together, one vectorised step per seed.

    Parameters
    ----------
    X : array-like of shape (n, d)
        Local data.
    n_components : int
        Number of seeds ``k``; ``1 <= k <= n``.
    n_init : int, default=3
        Number of independent seedings, ``>= 1``.
    random_state : int, numpy.random.Generator or None, default=None
        Source of randomness.

    Returns
    -------
    seeds : ndarray of shape (n_components, d)
        The best seeding; its rows are points of ``X``.
    """
    X = _as_points(X)
    _check_seeding(X, n_components, n_init)
    seeds, objectives = _kmeanspp_seedings(X, int(n_components), int(n_init), np.random.default_rng(random_state))
    return seeds[np.argmin(objectives)]


def kmeans_init(X, n_components, *, n_init=3, random_state=None):
    """Lloyd's k-means from each of several greedy k-means++ seedings; the best by the k-means objective.

    The seedings are :func:`kmeanspp_init`'s (the same random stream draws the same ones);
    each is refined by Lloyd's iterations (:class:`sklearn.cluster.KMeans`, one start each)
    and the centres with the smallest k-means objective after refining are returned. A seeding
    that put two seeds in one true cluster and none in another keeps that mistake without
    Lloyd's steps; with them, the restart that fixes it wins by the objective.

    Parameters
    ----------
    X : array-like of shape (n, d)
    n_components : int
    n_init : int, default=3
        Number of seedings, each refined.
    random_state : int, numpy.random.Generator or None, default=None

    Returns
    -------
    centroids : ndarray of shape (n_components, d)
    """
    X = _as_points(X)
    _check_seeding(X, n_components, n_init)
    seeds, _ = _kmeanspp_seedings(X, int(n_components), int(n_init), np.random.default_rng(random_state))
    fits = []
    for start in seeds:
        with warnings.catch_warnings():  # repeated rows may leave fewer distinct clusters than seeds
            warnings.simplefilter("ignore", ConvergenceWarning)
            fits.append(KMeans(n_clusters=int(n_components), init=start, n_init=1, algorithm="lloyd").fit(X))
    return min(fits, key=lambda fit: fit.inertia_).cluster_centers_


def _check_seeding(X, n_components, n_init):
    """ValueError unless ``1 <= n_components <= len(X)`` and ``n_init >= 1`` are integers."""
    if not isinstance(n_components, (int, np.integer)) or n_components < 1:
        raise ValueError(f"n_components must be an integer >= 1; got {n_components!r}.")
    if X.shape[0] < n_components:
        raise ValueError(
            f"X must hold at least n_components={n_components} points; got {X.shape[0]}."
        )
    if not isinstance(n_init, (int, np.integer)) or n_init < 1:
        raise ValueError(f"n_init must be an integer >= 1; got {n_init!r}.")


def _kmeanspp_seedings(X, k, n_init, rng):
    """``n_init`` greedy k-means++ seedings of ``X`` (n, d) at once.

    Returns the seeds (n_init, k, d) and each seeding's k-means objective (n_init,).
    """
    n = X.shape[0]
    n_trials = 2 + int(np.log(k))
    batch = np.arange(n_init)
    seed_index = np.empty((n_init, k), dtype=np.int64)
    seed_index[:, 0] = rng.integers(n, size=n_init)
    # closest[b, i]: squared distance of point i to the nearest seed of seeding b.
    closest = cdist(X[seed_index[:, 0]], X, "sqeuclidean")
    for c in range(1, k):
        cumulative = np.cumsum(closest, axis=1)
        draws = rng.uniform(size=(n_init, n_trials)) * cumulative[:, -1:]
        candidates = np.minimum(
            [np.searchsorted(row, row_draws) for row, row_draws in zip(cumulative, draws)], n - 1
        )
        reach = cdist(X[candidates.ravel()], X, "sqeuclidean").reshape(n_init, n_trials, n)
        np.minimum(reach, closest[:, None, :], out=reach)
        best = reach.sum(axis=2).argmin(axis=1)
        closest = reach[batch, best]
        seed_index[:, c] = candidates[batch, best]
    return X[seed_index], closest.sum(axis=1)


def _log_weights(weights):
    """log of validated weights (k,); -inf where a weight is 0."""
    if weights.all():
        return np.log(weights)
    return np.log(weights, out=np.full(weights.shape, -np.inf), where=weights > 0)


def _responsibilities(X, centroids, log_weights):
    """Softmax over components of ``log pi_k - ||x_n - theta_k||^2 / 2``, inputs validated.

    Returns the responsibilities transposed, shape (k, n): reductions over the k
    components then run along contiguous rows, several times faster than along the
    short last axis of an (n, k) array.
    """
    # cdist computes the differences directly, so squared distances keep full
    # relative precision even far from the origin (no ||x||^2 - 2x.t + ||t||^2 cancellation).
    joint = cdist(centroids, X, "sqeuclidean")
    joint *= -0.5
    joint += log_weights[:, None]
    # The softmax by hand (shift by the maximum, exponentiate, normalise): scipy's
    # softmax/logsumexp add tens of microseconds of overhead per call, which is most of
    # an EM step on a client's few hundred points.
    joint -= joint.max(axis=0)
    np.exp(joint, out=joint)
    joint /= joint.sum(axis=0)
    return joint


def _em_step(X, centroids, log_weights):
    gamma = _responsibilities(X, centroids, log_weights)
    totals = gamma.sum(axis=1)
    alive = totals > 0
    if alive.all():
        return (gamma @ X) / totals[:, None]
    maximisers = centroids.copy()
    maximisers[alive] = (gamma[alive] @ X) / totals[alive, None]
    return maximisers


def responsibilities(X, centroids, weights):
    """Posterior component probabilities of an identity-covariance mixture.

    ``gamma_nk`` is the softmax over ``k`` of ``log pi_k - ||x_n - theta_k||^2 / 2``,
    computed with log-sum-exp so that points far from every centroid stay finite.

    Parameters
    ----------
    X : array-like of shape (n, d)
        Points.
    centroids : array-like of shape (k, d)
        Component means ``theta``.
    weights : array-like of shape (k,)
        Fixed component weights ``pi`` (non-negative, positive sum; only their ratios matter).

    Returns
    -------
    gamma : ndarray of shape (n, k)
        Responsibilities; each row sums to one.
    """
    X = _as_points(X)
    centroids = _as_centroids(centroids, X.shape[1])
    weights = _as_weights(weights, centroids.shape[0])
    return _responsibilities(X, centroids, _log_weights(weights)).T


def em_step(X, centroids, weights):
    """One EM step for the means of an identity-covariance mixture with fixed weights.

    Parameters
    ----------
    X : array-like of shape (n, d)
        Points.
    centroids : array-like of shape (k, d)
        Current means ``theta``.
    weights : array-like of shape (k,)
        Fixed component weights ``pi``.

    Returns
    -------
    maximisers : ndarray of shape (k, d)
        ``M_k = sum_n gamma_nk x_n / sum_n gamma_nk``. A component whose total
        responsibility is zero (numerically) keeps its centroid, which is its exact
        M-step maximiser in the limit and gives it a zero radius.
    """
    X = _as_points(X)
    centroids = _as_centroids(centroids, X.shape[1])
    return _em_step(X, centroids, _log_weights(_as_weights(weights, centroids.shape[0])))


def _squared_steps(maximisers, centroids):
    """Row-wise ``||M_k - theta_k||^2`` (k,) of validated (k, d) arrays."""
    return np.sum((maximisers - centroids) ** 2, axis=1)


def uncertainty_radius(maximisers, centroids):
    """Exact squared radius of the GEM uncertainty ball (paper eq. 3).

    Parameters
    ----------
    maximisers : array-like of shape (k, d)
        M-step maximisers ``M_k``.
    centroids : array-like of shape (k, d)
        The centroids ``theta_k`` the E-step was taken at.

    Returns
    -------
    eps : ndarray of shape (k,)
        ``||M_k - theta_k||^2``; the ball's radius is ``sqrt(eps)``. See the module
        docstring for the derivation.
    """
    maximisers = _as_points(maximisers, "maximisers")
    centroids = _as_points(centroids, "centroids")
    if maximisers.shape != centroids.shape:
        raise ValueError(
            f"maximisers and centroids must have the same shape; got {maximisers.shape} "
            f"and {centroids.shape}."
        )
    return _squared_steps(maximisers, centroids)


def local_round(X, centroids, weights, *, n_steps=1):
    """A client's work in one collaborative round: ``n_steps`` EM steps and a radius.

    Parameters
    ----------
    X : array-like of shape (n, d)
        Local data.
    centroids : array-like of shape (k, d)
        Centroids received from the server (or the initial seeds).
    weights : array-like of shape (k,)
        Fixed component weights ``pi``.
    n_steps : int, default=1
        Number of EM steps ``S >= 1``.

    Returns
    -------
    maximisers : ndarray of shape (k, d)
        Result of the last EM step.
    eps : ndarray of shape (k,)
        Squared radius of the last step, relative to that step's starting centroids.
    """
    if not isinstance(n_steps, (int, np.integer)) or n_steps < 1:
        raise ValueError(f"n_steps must be an integer >= 1; got {n_steps!r}.")
    X = _as_points(X)
    current = _as_centroids(centroids, X.shape[1])
    log_weights = _log_weights(_as_weights(weights, current.shape[0]))
    for _ in range(n_steps):
        start = current
        current = _em_step(X, start, log_weights)
    return current, _squared_steps(current, start)


def min_centroid_distance(centroids):
    """Smallest Euclidean distance between two distinct rows.

    Parameters
    ----------
    centroids : array-like of shape (k, d)
        Centroids, ``k >= 2``.

    Returns
    -------
    distance : float
    """
    centroids = _as_points(centroids, "centroids")
    if centroids.shape[0] < 2:
        raise ValueError(f"centroids must hold at least 2 rows; got {centroids.shape[0]}.")
    return float(pdist(centroids).min())


def final_radius(maximisers, weights, n_points, upsilon):
    """Final-aggregation squared radii from the paper's heuristic (appendix D.3).

    Parameters
    ----------
    maximisers : array-like of shape (k, d)
        The client's final maximisers, ``k >= 2``.
    weights : array-like of shape (k,)
        Fixed component weights ``pi`` (positive).
    n_points : int
        Number of local points ``N_g >= 1``.
    upsilon : float
        The hyperparameter, ``>= 0``.

    Returns
    -------
    eps_final : ndarray of shape (k,)
        ``upsilon * Rmin_g / (pi_k * sqrt(N_g))`` with ``Rmin_g`` the smallest distance
        between two of the maximisers. It is used like ``eps``: the ball radius is its
        square root.
    """
    maximisers = _as_points(maximisers, "maximisers")
    weights = np.asarray(weights, dtype=float)
    if weights.shape != (maximisers.shape[0],):
        raise ValueError(
            f"weights must have shape ({maximisers.shape[0]},); got {weights.shape}."
        )
    if not np.all(np.isfinite(weights)) or np.any(weights <= 0):
        raise ValueError("weights must be finite and positive.")
    if not np.isfinite(n_points) or n_points < 1:
        raise ValueError(f"n_points must be >= 1; got {n_points!r}.")
    if not np.isfinite(upsilon) or upsilon < 0:
        raise ValueError(f"upsilon must be finite and >= 0; got {upsilon!r}.")
    rmin = min_centroid_distance(maximisers)
    return upsilon * rmin / (weights * np.sqrt(n_points))


def assign_labels(X, centroids):
    """Index of the nearest centroid of every point.

    Parameters
    ----------
    X : array-like of shape (n, d)
    centroids : array-like of shape (k, d)

    Returns
    -------
    labels : ndarray of shape (n,), int
        Ties go to the lower index.
    """
    X = _as_points(X)
    centroids = _as_centroids(centroids, X.shape[1])
    return np.argmin(cdist(X, centroids, "sqeuclidean"), axis=1)


def local_objective(X, centroids):
    """k-means objective: sum of squared distances to the nearest centroid.

    Parameters
    ----------
    X : array-like of shape (n, d)
    centroids : array-like of shape (k, d)

    Returns
    -------
    objective : float
    """
    X = _as_points(X)
    centroids = _as_centroids(centroids, X.shape[1])
    return float(cdist(X, centroids, "sqeuclidean").min(axis=1).sum())


LOCAL_CRITERIA = ("icl", "bic")
# The smallest variance a component of a site's candidate mixture may take, relative to the site's
# mean per-feature variance (scikit-learn's reg_covar is absolute): on tied rows (iris repeats many)
# a component otherwise collapses to scikit-learn's 1e-6 and buys the likelihood of the ties.
TIE_VARIANCE_FLOOR = 1e-2


@dataclass(frozen=True)
class LocalChoice:
    """A site's own choice of K_g.

    Attributes
    ----------
    n_components : int
    bound : int
        The largest K_g the site could choose (:func:`local_bound`).
    scores : ndarray of shape (bound,)
        The criterion of K_g = 1..bound (smaller is better).
    """

    n_components: int
    bound: int
    scores: np.ndarray

    @property
    def at_bound(self) -> bool:
        """Whether the site chose its bound: it may hold more clusters (a site of fewer than 8 points, bound 1, always)."""
        return self.n_components == self.bound


def local_bound(X, max_components):
    """The largest K_g a site may choose: ``min(max_components, floor(sqrt(n / 2)), distinct rows)``, at least 1.

    ``sqrt(n / 2)`` is the classical rule of thumb for the number of clusters of ``n`` points (Mardia et
    al. 1979): a component of a spherical mixture in ``d`` dimensions costs ``d + 2`` parameters, and with
    fewer than about ``sqrt(2 n)`` points per component their estimates are too noisy for a penalised
    likelihood to compare (a site of 10 points may choose 1 or 2, one of 70 up to 5). A site cannot hold
    more clusters than distinct rows.

    Parameters
    ----------
    X : ndarray of shape (n, d)
    max_components : int

    Returns
    -------
    bound : int
    """
    X = _as_points(X)
    rule = math.isqrt(X.shape[0] // 2)
    return max(1, min(int(max_components), rule, np.unique(X, axis=0).shape[0]))


def choose_n_components(X, max_components, *, criterion="icl", random_state=None):
    """A site's own choice of K_g: the criterion-best spherical Gaussian mixture of 1 to :func:`local_bound` components.

    Each candidate is scikit-learn's ``GaussianMixture(covariance_type="spherical")`` (k-means
    initialisation, one start) with every variance floored at :data:`TIE_VARIANCE_FLOOR` times the
    site's mean per-feature variance, so that duplicated rows cannot make a component degenerate.
    The ICL (Biernacki et al. 2000) is the BIC plus twice the entropy of the candidate's
    responsibilities, the criterion the server uses for K_hat (docs/ALGORITHMS.md section 2.6).

    Parameters
    ----------
    X : ndarray of shape (n, d)
    max_components : int
        Largest K_g tried (the bound also grows with ``n``: :func:`local_bound`).
    criterion : {"icl", "bic"}
    random_state : int or None

    Returns
    -------
    LocalChoice
    """
    X = _as_points(X)
    if criterion not in LOCAL_CRITERIA:
        raise ValueError(f"criterion={criterion!r}: must be one of {', '.join(LOCAL_CRITERIA)}")
    bound = local_bound(X, max_components)
    floor = TIE_VARIANCE_FLOOR * max(float(X.var(axis=0).mean()), np.finfo(float).tiny)
    scores = np.empty(bound)
    for k in range(1, bound + 1):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            model = GaussianMixture(k, covariance_type="spherical", reg_covar=floor, n_init=1,
                                    random_state=random_state).fit(X)
        scores[k - 1] = model.bic(X)
        if criterion == "icl":
            posterior = model.predict_proba(X)
            scores[k - 1] -= 2.0 * float(xlogy(posterior, posterior).sum())
    return LocalChoice(1 + int(np.argmin(scores)), bound, scores)


def estimate_n_components(X, max_components, *, random_state=None):
    """A site's own choice of K_g, when nobody tells it: :func:`choose_n_components` by the ICL.

    Parameters
    ----------
    X : ndarray of shape (n, d)
    max_components : int
    random_state : int or None

    Returns
    -------
    n_components : int
    """
    return choose_n_components(X, max_components, random_state=random_state).n_components
