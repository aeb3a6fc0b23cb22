"""What a FedGEM component is, by ``covariance_type``: the one place the isotropic model is defined.

FedGEM's model (docs/ALGORITHMS.md sections 2.1 and 2.11) is a mixture of isotropic Gaussians with
fixed weights whose means the federation merges. Two covariance types share every server rule:

- ``identity``: every component has covariance ``I`` (the paper's model; bit-identical to the
  kernels of :mod:`fedica.fedgem.local` it calls);
- ``spherical``: component ``k`` of a site has covariance ``sigma_k^2 I`` with ``sigma_k^2`` learned
  by the site in its own M-step, a local parameter the server never merges. Only the final stage's
  reply carries it, because the final radius is a squared length and needs the model's unit of
  length (:meth:`Identity.final_radius`).

A geometry (:class:`Identity`, :class:`Spherical`) holds, for its type, the client's E-step and M-step, the GEM uncertainty ball,
the final radius, the length scale that the overlap test and the consensus projection see (they act
on balls in the data's units, so they inherit it), the candidates' log-likelihood and the parameter
count of the server's criterion, the way scikit-learn's ``GaussianMixture`` picks its kernels by
``covariance_type``. :func:`geometry` returns the one instance of a type.

Under ``spherical`` the model of a site's data ``x`` with variances ``sigma^2`` is the identity model
of ``x / sigma``; every rule derived for unit variance therefore holds in units of ``sigma``, which
makes the whole protocol invariant to the data's units (docs/ALGORITHMS.md section 2.11).
"""

from __future__ import annotations

import numpy as np
from scipy.spatial.distance import cdist

from fedica.fedgem import local
from fedica.fedgem.selection import log_likelihoods
from fedica.parameters import COVARIANCE_TYPES, LABELLINGS

__all__ = ["CLUSTER_ANISOTROPY_LIMIT", "COVARIANCE_TYPES", "FEATURE_SCALE_SPREAD_LIMIT", "LABELLINGS", "VARIANCE_FLOOR",
           "Identity", "Spherical", "cluster_anisotropy", "families_of", "feature_scale_spread", "geometry", "separation"]


# The EM of a site's own mixture over the global centres stops when the mean log-likelihood per point gains
# less than this, or after SITE_MIXTURE_MAX_ITER steps (each step is one pass over a (K_hat, n) matrix).
SITE_MIXTURE_TOL = 1e-8
SITE_MIXTURE_MAX_ITER = 200

# Smallest variance a spherical component may learn, relative to its site's mean per-feature
# variance: a component on duplicated rows would otherwise shrink to 0 and claim every tie.
VARIANCE_FLOOR = 1e-6


# Both types give every feature of a component one variance: distances weigh the features by their units.
# When the median site's largest column standard deviation is more than this many times the others' median,
# the run warns that the features' scales disagree (docs/ALGORITHMS.md section 2.11.1). Measured on data nobody
# here generated, the median over a run's sites on every split of RESULTS.md's real-data table: scikit-learn's
# iris 1.6-2.4 and digits 1.4-1.5, against wine 290-490 and breast cancer 3,500-8,200 in their shipped units,
# whose spherical fits are wrong (RESULTS.md, "Features in different units").
FEATURE_SCALE_SPREAD_LIMIT = 10.0


def feature_scale_spread(X: np.ndarray) -> float:
    """How far the isotropic model is from the data's units: the largest column standard deviation over the median
    of the others'.

    Columns constant on the site (a digit's border pixels) are left out; a site with fewer than two
    columns that vary has spread 1. The ratio does not depend on the data's overall unit (every column
    times ``c``). The median leaves the largest column out so that two columns give their ratio (the
    median of both could not exceed half their sum: one feature x1000 beside another gave 2, issue 44).

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)

    Returns
    -------
    spread : float
        At least 1.
    """
    deviations = np.sort(X.std(axis=0))
    deviations = deviations[deviations > 0]
    return float(deviations[-1] / np.median(deviations[:-1])) if deviations.size > 1 else 1.0


# Both types make every component a sphere. When the median site's cluster_anisotropy exceeds this, the run warns
# that its clusters are elongated or correlated, so that the model spends several components on one cluster and
# K_hat may exceed the clusters the data hold (docs/ALGORITHMS.md section 2.11.3). Measured (RESULTS.md, "Clusters
# that are not spheres"), median over a run's sites: the generated blobs, section 6.2's and the MNIST-sized
# workloads .91 to 1.20; scikit-learn's iris and wine, standardised, 1.0 to 1.5, where K_hat is within one of the
# classes on most seeds; breast cancer, digits and Waveform 2.3 to 4.7, where it is 1 to 17 clusters too many.
CLUSTER_ANISOTROPY_LIMIT = 2.0
# A column whose within-cluster spread is under this share of the widest column's is constant (rounding only).
_CONSTANT_COLUMN = 1e-12


def cluster_anisotropy(X: np.ndarray, centroids: np.ndarray) -> float | None:
    """How far a site's clusters are from spheres, in units of what sampling noise gives spheres.

    Each point is assigned to its nearest centroid; ``W`` is the pooled within-cluster covariance of the
    residuals over ``n - k`` degrees of freedom (``k`` the clusters that hold a point), over the ``p`` columns
    that vary within the clusters (a digit's border pixels are constant; a column whose spread is under
    ``1e-12`` of the widest column's is taken as constant). The anisotropy is ``W``'s largest
    eigenvalue over its mean eigenvalue, divided by ``(1 + sqrt(p / (n - k)))^2``: the largest eigenvalue
    over the mean that spherical Gaussian clusters reach by sampling noise alone (the Marchenko-Pastur
    edge), so that spheres score about 1 at any size and dimension, and a cluster whose spread along one
    direction is ``a`` times its spread across scores about ``a^2 / (1 + (a^2 - 1) / p)`` divided by that edge.
    The ratio does not depend on the data's unit, its origin or a rotation.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    centroids : ndarray of shape (n_components, n_features)

    Returns
    -------
    anisotropy : float or None
        None when fewer than 2 columns vary within the clusters or fewer than 2 degrees of freedom remain:
        no shape to measure.
    """
    labels = local.assign_labels(X, centroids)
    residuals = X - centroids[labels]
    spread = residuals.std(axis=0)
    # A constant column's centroid is a weighted mean of one value, which may differ from it in the last bits.
    residuals = residuals[:, spread > _CONSTANT_COLUMN * spread.max()]
    n_columns = residuals.shape[1]
    degrees = X.shape[0] - np.unique(labels).size
    if n_columns < 2 or degrees < 2:
        return None
    eigenvalues = np.linalg.eigvalsh(residuals.T @ residuals / degrees)
    mean = eigenvalues.mean()
    if not mean > 0:
        return None
    noise_edge = (1.0 + np.sqrt(n_columns / degrees)) ** 2
    return float(eigenvalues[-1] / mean / noise_edge)


def separation(maximisers: np.ndarray) -> float:
    """``Rmin_g``, the smallest distance between two of a site's components; NaN for a site with one.

    Parameters
    ----------
    maximisers : ndarray of shape (K_g, d)

    Returns
    -------
    distance : float
        NaN when ``K_g = 1``: such a site knows no separation of its own (the final radius then
        borrows the federation's, :func:`fedica.fedgem.trust.final_radii`).
    """
    return local.min_centroid_distance(maximisers) if maximisers.shape[0] >= 2 else float("nan")


class Identity:
    """Every component has covariance ``I`` (the paper's model): the base every type shares.

    The methods take validated arrays; ``variances`` is each component's ``sigma_k^2`` (K_g,) or
    None under ``identity`` (no local parameter beyond the means).
    """

    name = "identity"
    #: Whether the site learns and keeps variances (and sends them in the final reply).
    learns_variance = False

    def initial_variances(self, X: np.ndarray, seeds: np.ndarray) -> np.ndarray | None:
        """The variances a site starts from, given its seeds (K_g, d); None: unit variance, fixed."""
        return None

    def adopted_variances(self, variances: np.ndarray | None, maximisers: np.ndarray,
                          centroids: np.ndarray) -> np.ndarray | None:
        """The variances (K_g,) a site holds once it adopts the server's ``centroids`` (K_g, d); None: unit variance.

        ``variances`` and ``maximisers`` are the site's own last M-step's.
        """
        return None

    def em_steps(self, X: np.ndarray, centroids: np.ndarray, weights: np.ndarray, variances: np.ndarray | None,
                 n_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``n_steps`` EM steps from ``centroids`` (K_g, d).

        Returns
        -------
        maximisers : ndarray of shape (K_g, d)
        eps : ndarray of shape (K_g,)
            The GEM ball's squared radius of the last step (:meth:`uncertainty_radius`).
        variances : ndarray of shape (K_g,) or None
            The variances after the last M-step.
        """
        maximisers, eps = local.local_round(X, centroids, weights, n_steps=n_steps)
        return maximisers, eps, None

    def uncertainty_radius(self, maximisers: np.ndarray, centroids: np.ndarray) -> np.ndarray:
        """Squared radius (K_g,) of the GEM ball around each maximiser: ``||M_k - theta_k||^2``.

        The same for both types: with the variance the site holds for the step, ``Q_k(m) >=
        Q_k(theta_k)`` is ``||m - M_k||^2 <= ||theta_k - M_k||^2`` (docs/ALGORITHMS.md 2.2, 2.11), so
        the server recomputes it from the centroids it sent without knowing any variance.
        """
        return local.uncertainty_radius(maximisers, centroids)

    def length_scale(self, variances: np.ndarray | None, n_components: int) -> np.ndarray | float:
        """The model's unit of length per component: ``sigma_k`` (K_g,), or 1 under unit variance."""
        return 1.0

    def final_radius(self, maximisers: np.ndarray, weights: np.ndarray, n_points: int, upsilon: float,
                     variances: np.ndarray | None = None, separation_g: float | None = None) -> np.ndarray:
        """Final squared radii (K_g,): ``upsilon * R_g * sigma_k / (pi_k sqrt(N_g))``.

        Parameters
        ----------
        maximisers : ndarray of shape (K_g, d)
        weights : ndarray of shape (K_g,)
        n_points : int
        upsilon : float
        variances : ndarray of shape (K_g,) or None
            The site's final variances (``spherical``); None under ``identity`` (``sigma_k = 1``).
        separation_g : float or None
            ``R_g``, the separation to use; None: the site's own ``Rmin_g`` (it holds two or more
            components). A site with one component is given the federation's
            (:func:`fedica.fedgem.trust.final_radii`).

        Returns
        -------
        eps_final : ndarray of shape (K_g,)
            With ``sigma_k = 1`` and ``R_g = Rmin_g`` this is the paper's heuristic exactly
            (:func:`fedica.fedgem.local.final_radius`).
        """
        if separation_g is None and not self.learns_variance:
            return local.final_radius(maximisers, weights, n_points, upsilon)
        rmin = separation(maximisers) if separation_g is None else separation_g
        return upsilon * rmin * self.length_scale(variances, weights.shape[0]) / (weights * np.sqrt(n_points))

    def log_likelihoods(self, X: np.ndarray, candidates) -> tuple[np.ndarray, np.ndarray]:
        """A site's log-likelihoods and assignment entropies (L,) under the candidate global models.

        Both types score a candidate with the site's own maximum-likelihood variance given the
        candidate's centres (:func:`fedica.fedgem.selection.log_likelihoods`): that variance is a
        local parameter present in every candidate, so it leaves the comparison unchanged and makes
        the scores invariant to the data's units under either type.
        """
        return log_likelihoods(X, candidates)

    def site_mixture(self, X: np.ndarray, centres: np.ndarray) -> tuple[np.ndarray, float]:
        """A site's own mixture over the global ``centres`` (K_hat, d): its weights (K_hat,) and variance.

        The centres stay fixed; EM fits the site's weights (and, under ``spherical``, one variance
        shared by its components; under ``identity`` the variance is 1) to its points ``X``, from the
        model the federated ICL scores the site with (2.6.1: the shares of its points nearest each
        centre, the variance around them). A global cluster the site does not hold ends with a weight
        near 0, and a site whose own fit put two clusters in one component labels their points apart
        (docs/ALGORITHMS.md section 2.8, ``labelling: adapted``).
        """
        return _site_mixture(X, centres, None if self.learns_variance else 1.0, self._floor(X))

    @staticmethod
    def _floor(X: np.ndarray) -> float:
        return VARIANCE_FLOOR * max(float(X.var(axis=0).mean()), np.finfo(float).tiny)

    def site_labels(self, X: np.ndarray, centres: np.ndarray, weights: np.ndarray, variance: float) -> np.ndarray:
        """Row indices into ``centres`` of the most probable component of each row of ``X`` under the site's mixture."""
        log_joint = cdist(centres, X, "sqeuclidean")
        log_joint *= -0.5 / variance
        log_joint += _log(weights)[:, None]
        return log_joint.argmax(axis=0)

    def n_parameters(self, k_hats: np.ndarray, dim: int) -> np.ndarray:
        """Global parameters of each candidate (L,): its ``K_hat d`` means.

        The sites' weights and variances are local and present in every candidate, so they drop
        out of the comparison; the count is the same for both types.
        """
        return np.asarray(k_hats) * dim


class Spherical(Identity):
    """Component ``k`` of a site has covariance ``sigma_k^2 I``, ``sigma_k^2`` learned by the site."""

    name = "spherical"
    learns_variance = True

    def initial_variances(self, X: np.ndarray, seeds: np.ndarray) -> np.ndarray:
        """Every component starts at the site's pooled variance around its seeds (K_g,).

        ``sum_n min_k ||x_n - seed_k||^2 / (N d)``: the k-means spread of the seeding, one value
        for all components, since a seed alone says nothing of its own component's spread.
        """
        pooled = cdist(seeds, X, "sqeuclidean").min(axis=0).mean() / X.shape[1]
        return np.full(seeds.shape[0], max(float(pooled), self._floor(X)))

    def adopted_variances(self, variances: np.ndarray | None, maximisers: np.ndarray,
                          centroids: np.ndarray) -> np.ndarray:
        """The variance's conditional M-step at the adopted means: ``sigma_k^2 + ||theta_k - M_k||^2 / d``.

        With the last step's responsibilities ``gamma``, the variance that maximises ``Q_k`` at a mean
        ``m`` is ``sum_n gamma_nk ||x_n - m||^2 / (d Gamma_k) = sigma_k^2 + ||m - M_k||^2 / d``, where
        ``sigma_k^2`` is the one at ``M_k``. A site that adopts the server's ``theta_k`` in the GEM
        ball therefore holds ``(theta_k, sigma_k^2(theta_k))``, a pair whose ``Q_k`` is no smaller
        than the old pair's: the generalised-EM step of both parameters (docs/ALGORITHMS.md 2.11).
        """
        return variances + ((centroids - maximisers) ** 2).sum(axis=1) / centroids.shape[1]

    def em_steps(self, X: np.ndarray, centroids: np.ndarray, weights: np.ndarray, variances: np.ndarray | None,
                 n_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``n_steps`` EM steps of the means and the variances (same returns as :meth:`Identity.em_steps`).

        E-step: ``gamma_nk = softmax_k(log pi_k - ||x_n - theta_k||^2 / (2 sigma_k^2) - (d/2) log sigma_k^2)``.
        M-step: ``M_k = sum_n gamma_nk x_n / Gamma_k`` and
        ``sigma_k^2 = sum_n gamma_nk ||x_n - M_k||^2 / (d Gamma_k)`` (floored at
        :data:`VARIANCE_FLOOR` times the site's mean per-feature variance). A component with no
        responsibility keeps its mean and its variance.
        """
        if variances is None:
            raise ValueError("a spherical component needs its variance: the site was not initialised")
        n, d = X.shape
        log_weights = _log(weights)
        floor = self._floor(X)
        current = centroids
        for _ in range(n_steps):
            start = current
            # (k, n) layout, as in fedica.fedgem.local: the reductions over k run along contiguous rows.
            joint = cdist(start, X, "sqeuclidean")
            joint *= (-0.5 / variances)[:, None]
            joint += (log_weights - 0.5 * d * np.log(variances))[:, None]
            joint -= joint.max(axis=0)
            np.exp(joint, out=joint)
            joint /= joint.sum(axis=0)
            totals = joint.sum(axis=1)
            alive = totals > 0
            safe = np.where(alive, totals, 1.0)
            current = np.where(alive[:, None], (joint @ X) / safe[:, None], start)
            spread = (joint * cdist(current, X, "sqeuclidean")).sum(axis=1) / (d * safe)
            variances = np.where(alive, np.maximum(spread, floor), variances)
        return current, local.uncertainty_radius(current, start), variances

    def length_scale(self, variances: np.ndarray | None, n_components: int) -> np.ndarray:
        if variances is None or variances.shape != (n_components,):
            raise ValueError("the spherical final radius needs each component's variance")
        return np.sqrt(variances)


def _log(weights: np.ndarray) -> np.ndarray:
    """``log weights`` with ``log 0 = -inf``: a component of weight 0 takes no responsibility."""
    return np.log(weights, out=np.full(weights.shape, -np.inf), where=weights > 0)


def _site_mixture(X: np.ndarray, centres: np.ndarray, variance: float | None, floor: float) -> tuple[np.ndarray, float]:
    """EM of a mixture's weights (and one shared variance, when ``variance`` is None) with its ``centres`` fixed.

    Written here rather than with scikit-learn's ``GaussianMixture``, which cannot hold its means
    fixed. The log-likelihood is concave in the weights, so with a fixed variance the EM climbs to
    their one maximum; the start is the ICL's site model, which makes the result deterministic.
    """
    n, d = X.shape
    distances = cdist(centres, X, "sqeuclidean")  # (K, n): the reductions over k run along contiguous rows
    counts = np.maximum(np.bincount(distances.argmin(axis=0), minlength=centres.shape[0]), 1)
    weights = counts / counts.sum()
    learns = variance is None
    if learns:
        variance = max(float(distances.min(axis=0).mean()) / d, floor)
    previous = -np.inf
    for _ in range(SITE_MIXTURE_MAX_ITER):
        joint = distances * (-0.5 / variance)
        joint += _log(weights)[:, None]
        peak = joint.max(axis=0)
        joint -= peak
        np.exp(joint, out=joint)
        totals = joint.sum(axis=0)
        mean_log_likelihood = float((peak + np.log(totals)).mean()) - 0.5 * d * np.log(variance)
        joint /= totals
        weights = joint.sum(axis=1) / n
        if learns:
            variance = max(float(np.einsum("kn,kn->", joint, distances)) / (n * d), floor)
        if mean_log_likelihood - previous < SITE_MIXTURE_TOL:
            break
        previous = mean_log_likelihood
    return weights, float(variance)


# Under a covariance family (diag, full, auto) the sites fit spheres, which the server joins into the family's
# clusters once the run has its partition (fedica.fedgem.families).
_SPHERES = Spherical()
_GEOMETRIES = {"identity": Identity(), "spherical": _SPHERES, "diag": _SPHERES, "full": _SPHERES, "auto": _SPHERES}


def families_of(covariance_type: str) -> tuple[str, ...]:
    """The covariance families the server chooses the global clusters among: none (the spheres' partition stays the
    result) under ``identity`` and ``spherical``, the one family under ``diag`` or ``full``, all three under ``auto``."""
    return {"diag": ("diag",), "full": ("full",), "auto": ("spherical", "diag", "full")}.get(covariance_type, ())


def geometry(covariance_type: str) -> Identity:
    """The geometry of ``covariance_type`` (one of :data:`COVARIANCE_TYPES`)."""
    try:
        return _GEOMETRIES[covariance_type]
    except KeyError:
        raise ValueError(f"covariance_type={covariance_type!r}: must be one of {', '.join(COVARIANCE_TYPES)}") from None
