"""The covariance family of the global clusters: spheres joined into the clusters a family's BIC chooses.

FedGEM's sites fit spheres (:mod:`fedica.fedgem.geometry`); an elongated or correlated cluster takes
several of them, and the federated ICL over spheres counts each (docs/ALGORITHMS.md 2.11.3). Under
``covariance_type`` ``diag``, ``full`` or ``auto`` (docs/ALGORITHMS.md 2.14), once the run has chosen its
partition, each site labels its points with its global clusters and sends each cluster's count, mean and
scatter matrix. The server pools them into every global cluster's exact moments (the pooled points', as a
central analyst would compute them) and joins clusters the way mclust's model-based hierarchical
agglomeration does (Fraley 1998): at each step the two whose union loses the least classification
log-likelihood under the family, down to one cluster (over the family, or under ``auto`` over every
family). The moments of any union of
clusters follow from its members' (the parallel-axis rule), so the whole path needs one exchange. Each
family's best partitions on its path are then fitted by a federated EM, one exchange a step, whose M-step
is the pooled points' exactly; the smallest BIC among them is the result.

Written here rather than with scikit-learn or mclust: neither agglomerates from moments without the points,
and the server never holds a point.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.special import logsumexp

from fedica.protocol import InvalidReply

__all__ = ["DIAGONAL_FAMILIES", "FAMILIES", "REG_COVAR", "FamilyModel", "checked_cluster_moments", "cluster_moments",
           "component_moments", "family_covariances", "robust_cluster_moments", "agglomeration_candidates", "checked_mixture_moments", "log_gaussian_densities",
           "mixture_bic", "mixture_moments", "mixture_parameters", "shape_parameters", "site_labels", "site_mixture_weights"]

#: The families a global cluster's covariance may take (scikit-learn's ``covariance_type`` names).
FAMILIES = ("spherical", "diag", "full")
# The families whose M-step reads only the clusters' scatters' diagonals (:func:`family_covariances`; the robust
# sum reads their traces): a site sends those alone for their candidates.
DIAGONAL_FAMILIES = frozenset({"spherical", "diag"})

# Added to every covariance's diagonal, relative to the pooled data's mean per-feature variance: scikit-learn's
# reg_covar (1e-6) in units where that variance is 1, so that the regularisation does not depend on the data's unit.
REG_COVAR = 1e-6

# Besides each path's best partition and its neighbours, the federated EM fits every partition of at most this many
# clusters on the path: the classification BIC of a hard partition favours a few tight clusters at a boundary, which
# EM cannot remove (two touching elongated clusters: 3 to 5 clusters for 2); the central yardstick scans K 1 to 8.
SMALL_MODELS = 8
# ... where the path's best partition holds at most this many clusters: a path whose best holds more is not a few
# clusters off, and every partition it scans up to SMALL_MODELS lies far above it in BIC. On the real-data table
# (RESULTS.md, 189 runs) the chosen mixture lay within one cluster of its family's path best in 188, and the bound
# changes none of them; at G=1,000 (K=50) the small partitions were 24 of 30 candidates, and the run took 107 s
# with them and 75 s without (docs/PERFORMANCE.md).
SMALL_MODELS_PATH_BEST = 2 * SMALL_MODELS

# A site's scatter of a cluster is at most this many times the other holders' spread (trace over trace), and its
# mean's squared distance from theirs at most OFFSET_LIMIT times that spread (robust_cluster_moments). Measured on
# honest sites of the real-data table: scatter ratios up to 6.4 (5 points or more), offsets up to 19.
SCATTER_LIMIT = 10.0
OFFSET_LIMIT = 25.0

# A cluster whose responsibilities add up to less than this share of one point has no scatter (zero).
NEGLIGIBLE_MASS = 1e-9

# A reply's scatter matrices are symmetric and positive semi-definite up to this share of their largest entry
# (a sum of outer products computed in floating point).
_ROUNDING = 1e-9

# mixture_moments takes a cluster's scatter from the difference of the points' moments where the cluster's squared
# distance from the site's mean is at most this many times its spread (its trace): the difference then loses at most
# that many times the rounding of its spread, 1e-13 of it, far inside the replies' _ROUNDING; farther, from residuals.
_CANCELLATION_LIMIT = 1e3

# The EM of a site's weights over fixed means and covariances (labelling: adapted) stops at this gain in mean
# log-likelihood per point, or after this many steps.
_WEIGHTS_TOL = 1e-8
_WEIGHTS_MAX_ITER = 200


def _parameters_per_cluster(family: str, dim: int) -> int:
    """A cluster's mean, weight and covariance parameters under ``family``."""
    covariance = {"spherical": 1, "diag": dim, "full": dim * (dim + 1) // 2}[family]
    return dim + 1 + covariance


def mixture_parameters(family: str, n_clusters: int, dim: int, unit_parameters: int = 0) -> int:
    """A mixture's free parameters under ``family``: ``K (d + 1 + q) - 1`` (scikit-learn's ``GaussianMixture``
    count), and the ``unit_parameters`` its shapes owe to the units it was fitted in (:func:`shape_parameters`)."""
    return n_clusters * _parameters_per_cluster(family, dim) - 1 + unit_parameters


def shape_parameters(family: str, dim: int, standardised: bool) -> int:
    """The parameters a family's mixture owes to features standardised by scales estimated from the data.

    Diagonal and full covariances are closed under scaling each feature: standardised or not, the mixture is the
    same model of the data's own units, with the same parameters. Spheres are not: spheres of standardised
    features are, in the data's units, clusters that share one axis-aligned shape, the features' pooled
    deviations, each with its own volume (mclust's VEI with its shape estimated beforehand). That shape is
    ``d - 1`` parameters estimated from the data (the deviations, but for the scale the volumes take), which the
    spheres' count leaves out; without them the spheres' BIC outranks families that are the same model in every
    unit. Measured on penguins (4 features, grams beside millimetres) split over 4 sites: without them `auto`
    chose 5-7 spheres in 7 of 30 runs where the central analyst's BIC on the data's units chose full
    covariances with 2-3 clusters in every run; with them, 2 of 30 (docs/ALGORITHMS.md 2.14, "The criterion").
    """
    return dim - 1 if standardised and family == "spherical" else 0


def component_moments(X: np.ndarray, responsibilities: np.ndarray, means: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each component's mass and scatter matrix around its mean (a cluster's, with 0/1 responsibilities).

    Parameters
    ----------
    X : ndarray of shape (n, d)
    responsibilities : ndarray of shape (K, n)
        The E-step's posterior of every component for every point.
    means : ndarray of shape (K, d)
        The M-step's means (``responsibilities @ X / masses``).

    Returns
    -------
    masses : ndarray of shape (K,)
        ``Gamma_k = sum_n gamma_nk``; they sum to ``n``.
    scatters : ndarray of shape (K, d, d)
        ``S_k = sum_n gamma_nk (x_n - M_k)(x_n - M_k)^T / Gamma_k`` (zero for a component of mass under
        :data:`NEGLIGIBLE_MASS`).
    """
    masses = responsibilities.sum(axis=1)
    # A Gram matrix of the weighted residuals is positive semi-definite to rounding; a cluster of a negligible share
    # of one point weighs nothing in any pooled moment and is left at zero (its quotient is rounding only). All
    # clusters at once: (K, n, d) residuals, one batched product.
    held = masses > NEGLIGIBLE_MASS
    shares = np.sqrt(responsibilities[held] / masses[held, None])
    weighted = (X[None] - means[held, None]) * shares[:, :, None]
    scatters = np.zeros((means.shape[0], X.shape[1], X.shape[1]))
    scatters[held] = np.matmul(weighted.transpose(0, 2, 1), weighted)
    return masses, (scatters + scatters.transpose(0, 2, 1)) / 2


def checked_cluster_moments(arrays, n_clusters: int, dim: int, n_points: int | None,
                            diagonal_rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A site's ``masses`` (K,), ``means`` (K, d) and ``scatters`` (K, d, d), or :class:`InvalidReply` naming the rule.

    The masses are whole non-negative counts summing to the site's declared points (``n_points``; None: non-negative
    only, a federated EM's responsibilities, checked by the caller); the means finite; each scatter
    symmetric and positive semi-definite. The clusters ``diagonal_rows`` flags (default none) came as their
    scatters' diagonals (``scatter-diagonals``, each finite and non-negative up to rounding, as a positive
    semi-definite scatter's) and are returned as diagonal matrices, the others in ``scatters``. Where a site's
    points lie the server checks as it checks a maximiser (the federation's extent), in the caller.
    """
    rows = np.zeros(n_clusters, dtype=bool) if diagonal_rows is None else diagonal_rows
    try:
        masses = np.asarray(arrays["masses"], dtype=np.float64)
        means = np.asarray(arrays["means"], dtype=np.float64)
        full = np.asarray(arrays["scatters"], dtype=np.float64)
        diagonals = np.asarray(arrays["scatter-diagonals"] if rows.any() else np.zeros((0, dim)), dtype=np.float64)
    except KeyError as err:
        raise InvalidReply(f"{err.args[0]!r} is missing") from None
    except (TypeError, ValueError):
        raise InvalidReply("'masses', 'means' and 'scatters' must be numeric arrays") from None
    if masses.shape != (n_clusters,) or not np.all(np.isfinite(masses)) or np.any(masses < 0):
        raise InvalidReply(f"'masses' must be {n_clusters} non-negative finite numbers, got shape {masses.shape}")
    if n_points is not None and (np.any(masses != np.round(masses)) or masses.sum() != n_points):
        raise InvalidReply(f"'masses' must be whole counts summing to the {n_points} points the site declared "
                           f"(they sum to {masses.sum():.6g})")
    if means.shape != (n_clusters, dim) or not np.all(np.isfinite(means)):
        raise InvalidReply(f"'means' must be finite, of shape {(n_clusters, dim)}, got {means.shape}")
    expected = (int((~rows).sum()), dim, dim)
    if full.shape != expected or not np.all(np.isfinite(full)):
        raise InvalidReply(f"'scatters' must be finite, of shape {expected}, got {full.shape}")
    size = np.abs(full).max(axis=(1, 2)) + np.finfo(float).tiny
    if np.any(np.abs(full - full.transpose(0, 2, 1)).max(axis=(1, 2), initial=0.0) > _ROUNDING * size):
        raise InvalidReply("'scatters' holds a matrix that is not symmetric")
    if full.shape[0] and np.any(np.linalg.eigvalsh(full)[:, 0] < -_ROUNDING * size * dim):
        raise InvalidReply("'scatters' holds a matrix that is not positive semi-definite")
    if diagonals.shape != (int(rows.sum()), dim) or not np.all(np.isfinite(diagonals)):
        raise InvalidReply(f"'scatter-diagonals' must be finite, of shape {(int(rows.sum()), dim)}, "
                           f"got {diagonals.shape}")
    if np.any(diagonals.min(axis=1, initial=0.0) < -_ROUNDING * (np.abs(diagonals).max(axis=1, initial=0.0)
                                                                 + np.finfo(float).tiny) * dim):
        raise InvalidReply("'scatter-diagonals' holds a negative variance")
    scatters = np.zeros((n_clusters, dim, dim))
    scatters[~rows] = full
    scatters[np.flatnonzero(rows)[:, None], np.arange(dim), np.arange(dim)] = diagonals
    return masses, means, scatters


def cluster_moments(labels: np.ndarray, n_clusters: int, masses: np.ndarray, means: np.ndarray,
                    scatters: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each global cluster's mass, mean and covariance from its member components' moments.

    Exactly the pooled data's moments of the points the components' responsibilities give the cluster:
    ``n_j = sum Gamma_k``, ``c_j = sum Gamma_k M_k / n_j``, ``Sigma_j = sum Gamma_k (S_k + (M_k - c_j)(M_k - c_j)^T) / n_j``
    over the components ``k`` of cluster ``j``. A component labelled outside ``0..n_clusters - 1`` (untrusted) counts
    in none.
    """
    dim = means.shape[1]
    counts, centres = np.zeros(n_clusters), np.zeros((n_clusters, dim))
    second = np.zeros((n_clusters, dim, dim))
    for k in np.flatnonzero((labels >= 0) & (labels < n_clusters) & (masses > 0)):
        j = labels[k]
        counts[j] += masses[k]
        centres[j] += masses[k] * means[k]
        second[j] += masses[k] * (scatters[k] + np.outer(means[k], means[k]))
    held = counts > 0
    centres[held] /= counts[held, None]
    covariances = np.zeros_like(second)
    covariances[held] = second[held] / counts[held, None, None] - np.einsum("ki,kj->kij", centres[held], centres[held])
    return counts, centres, (covariances + covariances.transpose(0, 2, 1)) / 2


def robust_cluster_moments(masses: np.ndarray, means: np.ndarray, scatters: np.ndarray, hostile_fraction: float,
                           reg: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """Each cluster's mass, mean and covariance from the sites' moments, no site's moments beyond what honest
    sites send.

    Parameters
    ----------
    masses : ndarray of shape (G, K)
    means : ndarray of shape (G, K, d)
    scatters : ndarray of shape (G, K, d, d)
        Site ``g``'s count (or responsibility mass), mean and scatter of cluster ``k``.
    hostile_fraction : float
        ``max_hostile_fraction``: 0 gives the pooled points' moments exactly (:func:`cluster_moments`).
    reg : float
        Added to the others' spread in the limits below (a cluster the others hold at one point).

    Returns
    -------
    counts, centres, covariances : ndarrays of shapes (K,), (K, d), (K, d, d)
    named : list of int
        The sites (rows) left out of some cluster: a scatter beyond :data:`SCATTER_LIMIT` with at least ``d + 1``
        points in it, more than an honest site's.

    Notes
    -----
    Among three holders of a cluster or more, each site's scatter and mean are compared with the other holders'
    pooled moments ``(c, Sigma)`` in the features' units (no inverse, which a cluster thin in one direction would
    blow up): ``tr(S_g) / tr(Sigma)`` is about 1 for points of the cluster, less for a part of it; measured on
    the real-data table's runs (RESULTS.md), at most 6.4 with 5 points or more, up to 20 with fewer (a noisy
    scatter). A scatter beyond :data:`SCATTER_LIMIT` is scaled down to it, and its site named when it holds
    ``d + 1`` points of the cluster or more. A mean's ``||m_g - c||^2 / tr(Sigma)`` is up to 19 for an honest site
    that holds one class of a cluster that joins two (iris split by classes), so a mean beyond
    :data:`OFFSET_LIMIT` is moved towards ``c`` to it, and its site not named: no honest bound tells it apart.
    A site can thus widen a cluster's spread by at most its share of the cluster's mass times those limits
    (measured: one site of five that sent every scatter 100 times wider took penguins from three clusters at ARI
    .95 to one at 0 before; now 3 at .95).
    """
    n_sites, k, dim = means.shape
    counts, centres = masses.sum(axis=0), np.zeros((k, dim))
    covariances = np.zeros((k, dim, dim))
    named: set[int] = set()
    for j in range(k):
        weights, first, scatter = masses[:, j], means[:, j].copy(), scatters[:, j].copy()
        holder = weights >= 1.0
        left_out = np.zeros(n_sites, dtype=bool)
        if hostile_fraction > 0 and holder.sum() >= 3:
            # Every site's comparison with the other holders at once: their pooled moments without it.
            own_trace = np.trace(scatter, axis1=1, axis2=2)
            rest = weights.sum() - weights
            centre = (weights @ first - weights[:, None] * first) / rest[:, None]
            second_trace = weights @ (own_trace + np.einsum("gi,gi->g", first, first))
            spread = ((second_trace - weights * (own_trace + np.einsum("gi,gi->g", first, first))) / rest
                      - np.einsum("gi,gi->g", centre, centre) + reg * dim)
            ratio = own_trace / spread
            beyond = holder & (ratio > SCATTER_LIMIT)
            left_out = beyond & (weights >= dim + 1)  # beyond any honest site: left out
            named.update(int(g) for g in np.flatnonzero(left_out))
            shrink = beyond & ~left_out
            scatter[shrink] *= (SCATTER_LIMIT / ratio[shrink])[:, None, None]
            offset = np.einsum("gi,gi->g", first - centre, first - centre) / spread
            far = holder & (offset > OFFSET_LIMIT)
            first[far] = centre[far] + (first[far] - centre[far]) * np.sqrt(OFFSET_LIMIT / offset[far])[:, None]
        weights = np.where(left_out, 0.0, weights)
        if not weights.any():
            continue
        second = scatter + np.einsum("gi,gj->gij", first, first)
        centres[j] = weights @ first / weights.sum()
        covariances[j] = np.einsum("g,gij->ij", weights, second) / weights.sum() - np.outer(centres[j], centres[j])
    return counts, centres, (covariances + covariances.transpose(0, 2, 1)) / 2, sorted(named)


def family_covariances(covariances: np.ndarray, family: str, reg: float) -> np.ndarray:
    """The family's maximum-likelihood covariances given the clusters' (k, d, d) covariances, plus ``reg I``."""
    dim = covariances.shape[-1]
    if family == "full":
        shaped = covariances.copy()
    elif family == "diag":
        shaped = np.einsum("kii->ki", covariances)[:, :, None] * np.eye(dim)
    else:
        shaped = (np.trace(covariances, axis1=1, axis2=2) / dim)[:, None, None] * np.eye(dim)
    return shaped + reg * np.eye(dim)


def _log_likelihoods(counts: np.ndarray, covariances: np.ndarray, family: str, n_total: float, reg: float) -> np.ndarray:
    """Each cluster's classification log-likelihood under ``family``: ``n log(n/N) - n/2 (d log 2 pi + log|Sigma| +
    tr(Sigma^-1 C))`` with ``Sigma`` the family's covariance of its covariance ``C`` (regularised)."""
    dim = covariances.shape[-1]
    shaped = family_covariances(covariances, family, reg)
    _, log_det = np.linalg.slogdet(shaped)
    fit = np.einsum("kij,kji->k", np.linalg.inv(shaped), covariances)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(counts > 0, counts * np.log(counts / n_total), 0.0)
    return share - 0.5 * counts * (dim * np.log(2 * np.pi) + log_det + fit)


def _estimable(counts: np.ndarray, family: str, dim: int) -> bool:
    """Whether every cluster holds more points than a full covariance needs to be non-singular (``d``), or two."""
    return bool(np.all(counts > (dim if family == "full" else 1)))


@dataclass
class FamilyModel:
    """The global clusters a family's BIC chooses.

    Attributes
    ----------
    family : str
        The chosen family (one of :data:`FAMILIES`).
    merged : ndarray of shape (K0,)
        The cluster (0..K-1) each of the start's K0 global clusters joined.
    counts, means, covariances : ndarrays of shapes (K,), (K, d), (K, d, d)
        Each cluster's mass, mean and covariance under the family (regularised).
    table : dict
        For every family scored, the cluster counts on its path and their BIC (``inf``: a cluster too small).
    log_likelihood : float or None
        The federation's log-likelihood of its points under the mixture, once an EM step has scored it.
    em_steps : int
        The federated EM steps taken from the agglomeration's partition.
    """

    family: str
    merged: np.ndarray
    counts: np.ndarray
    means: np.ndarray
    covariances: np.ndarray
    table: dict = field(default_factory=dict)
    log_likelihood: float | None = None
    em_steps: int = 0
    left_out_rows: list = field(default_factory=list)   # the last M-step's sites left out of a cluster (reply order)
    left_out: list = field(default_factory=list)        # the same, by partition id (the server fills it)
    active: bool = True   # whether the federated EM still steps it (the server stops a converged or beaten one)
    # Parameters the mixture's shapes owe to the units it was fitted in (:func:`shape_parameters`), counted once.
    unit_parameters: int = 0

    def bic(self, n_total: float) -> float:
        """``-2 LL + (K (d + 1 + q) - 1 + u) log N``, the central BIC of the mixture (``u`` its
        ``unit_parameters``; ``inf`` before any EM step scored it, or when a cluster has too few points for its
        family's covariance)."""
        if self.log_likelihood is None or not _estimable(self.counts, self.family, self.means.shape[1]):
            return float("inf")
        return -2.0 * self.log_likelihood + self.n_parameters * np.log(n_total)

    @property
    def diagonal(self) -> bool:
        """Whether the M-step reads only the clusters' scatters' diagonals (:data:`DIAGONAL_FAMILIES`): the sites send
        only those for this candidate."""
        return self.family in DIAGONAL_FAMILIES

    @property
    def n_parameters(self) -> int:
        """The mixture's free parameters (:func:`mixture_parameters`), its ``unit_parameters`` counted."""
        return mixture_parameters(self.family, self.n_clusters, self.means.shape[1], self.unit_parameters)

    def m_step(self, masses: np.ndarray, means: np.ndarray, scatters: np.ndarray, reg: float,
               hostile_fraction: float = 0.0) -> None:
        """The M-step from every site's moments of this mixture's clusters, shapes (G, K), (G, K, d), (G, K, d, d)
        (:func:`robust_cluster_moments`; with ``hostile_fraction`` 0, the pooled points' M-step exactly)."""
        counts, centres, pooled, self.left_out_rows = robust_cluster_moments(masses, means, scatters, hostile_fraction, reg)
        held = counts > 0
        self.counts = counts
        self.means = np.where(held[:, None], centres, self.means)
        self.covariances = np.where(held[:, None, None], family_covariances(pooled, self.family, reg), self.covariances)
        self.em_steps += 1

    def posterior_labels(self, X: np.ndarray) -> np.ndarray:
        """Each row's most probable cluster under the mixture (its weights, means and covariances)."""
        return site_labels(X, self.means, self.covariances, np.maximum(self.weights, np.finfo(float).tiny))

    @property
    def weights(self) -> np.ndarray:
        return self.counts / self.counts.sum()

    @property
    def n_clusters(self) -> int:
        return int(self.counts.shape[0])


def _path(counts: np.ndarray, means: np.ndarray, covariances: np.ndarray, family: str, n_total: float, reg: float):
    """The agglomeration under ``family`` from the given clusters down to one: (K, BIC, assignment) at each step.

    Each step joins the pair whose union loses the least classification log-likelihood; the union's moments are
    its members' pooled. Only the joined cluster's pairs are scored again.
    """
    dim = means.shape[1]
    alive = list(range(counts.shape[0]))
    counts, means, covariances = counts.copy(), means.copy(), covariances.copy()
    assignment = np.arange(counts.shape[0])
    own = _log_likelihoods(counts, covariances, family, n_total, reg)

    def union(a, b):
        n = counts[a] + counts[b]
        mean = (counts[a] * means[a] + counts[b] * means[b]) / n
        gap = means[a] - means[b]
        cov = (counts[a] * covariances[a] + counts[b] * covariances[b]) / n + counts[a] * counts[b] / n ** 2 * np.outer(gap, gap)
        return n, mean, cov

    def losses(a, others):
        if not others:
            return {}
        joined = [union(a, b) for b in others]
        joined_ll = _log_likelihoods(np.array([u[0] for u in joined]), np.array([u[2] for u in joined]), family, n_total, reg)
        return {b: own[a] + own[b] - ll for b, ll in zip(others, joined_ll)}

    loss = {}
    for i, a in enumerate(alive):
        for b, value in losses(a, alive[i + 1:]).items():
            loss[(a, b)] = value
    steps = []
    while True:
        k = len(alive)
        penalty = k * _parameters_per_cluster(family, dim) - 1
        score = (-2 * own[alive].sum() + penalty * np.log(n_total)
                 if _estimable(counts[alive], family, dim) else np.inf)
        ids = {c: i for i, c in enumerate(alive)}
        steps.append((k, float(score), np.array([ids[c] for c in assignment])))
        if k == 1:
            return steps
        a, b = min(loss, key=loss.get)
        n, mean, cov = union(a, b)
        counts[a], means[a], covariances[a] = n, mean, cov
        own[a] = _log_likelihoods(np.array([n]), cov[None], family, n_total, reg)[0]
        alive.remove(b)
        assignment[assignment == b] = a
        loss = {pair: value for pair, value in loss.items() if a not in pair and b not in pair}
        for c, value in losses(a, [c for c in alive if c != a]).items():
            loss[(min(a, c), max(a, c))] = value


def _model(family: str, assignment: np.ndarray, k: int, counts, means, covariances, reg: float, table) -> FamilyModel:
    pooled_counts, pooled_means, pooled = cluster_moments(assignment, k, counts, means, covariances)
    return FamilyModel(family, assignment, pooled_counts, pooled_means, family_covariances(pooled, family, reg), table)


def agglomeration_candidates(counts: np.ndarray, means: np.ndarray, covariances: np.ndarray, families: tuple[str, ...],
                             reg: float, width: int = 1) -> list[FamilyModel]:
    """Every family's best partition on its agglomeration path, and its neighbours within ``width`` clusters.

    Parameters
    ----------
    counts, means, covariances : ndarrays of shapes (K0,), (K0, d), (K0, d, d)
        The start's clusters (:func:`cluster_moments`); a cluster without mass joins none (``merged`` -1).
    families : tuple of str
        The families to score (one, or :data:`FAMILIES` under ``auto``).
    reg : float
        Added to every covariance's diagonal (:data:`REG_COVAR` times the data's mean per-feature variance).
    width : int
        How many cluster counts on each side of a family's best (by the path's classification BIC) are kept; with a
        width, every partition of at most :data:`SMALL_MODELS` clusters too, where the best holds at most
        :data:`SMALL_MODELS_PATH_BEST`.

    Returns
    -------
    candidates : list of FamilyModel
        The path's mixtures (weights, means and the family's covariances of the pooled moments), best first within a
        family; each one's ``table`` holds every family's path. Empty when no partition of any path is estimable.
    """
    held = np.flatnonzero(counts > 0)
    n_total = float(counts[held].sum())
    table, candidates = {}, []
    for family in families:
        steps = _path(counts[held], means[held], covariances[held], family, n_total, reg)
        table[family] = {"k": [k for k, _, _ in steps], "bic": [score for _, score, _ in steps]}
        finite = [step for step in steps if np.isfinite(step[1])]
        if not finite:
            continue
        best_k = min(finite, key=lambda step: (step[1], step[0]))[0]
        for k, _, assignment in sorted(finite, key=lambda step: (abs(step[0] - best_k), step[0])):
            if abs(k - best_k) <= width or (width and k <= SMALL_MODELS and best_k <= SMALL_MODELS_PATH_BEST):
                merged = np.full(counts.shape[0], -1)
                merged[held] = assignment
                candidates.append(_model(family, merged, k, counts, means, covariances, reg, table))
    return candidates


def mixture_moments(X: np.ndarray, weights: np.ndarray, means: np.ndarray, covariances: np.ndarray,
                    sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A site's E-step under every candidate mixture at once (their clusters stacked, ``sizes`` clusters a mixture): each
    cluster's mass, mean and scatter of its points' responsibilities under its own mixture, and the points'
    log-likelihood under each mixture (the federated EM's reply, docs/ALGORITHMS.md 2.14).

    The candidates are answered together because a site's step is their many small products (up to 30 candidates,
    most of them of at most 8 clusters): a step of 30 candidates (558 clusters) on 500 points took 48 ms one call a
    candidate, 20 ms in one (docs/PERFORMANCE.md). The scatters come from the responsibilities' first and second
    moments of the points centred on the site's mean (one product for every cluster), and from the residuals where
    that difference would lose the cluster's spread (:data:`_CANCELLATION_LIMIT`).
    """
    n_points, dim = X.shape
    starts = np.cumsum(sizes) - sizes
    joint = log_gaussian_densities(X, means, covariances) + np.log(np.maximum(weights, np.finfo(float).tiny))
    peaks = np.maximum.reduceat(joint, starts, axis=1)
    posterior = np.exp(joint - np.repeat(peaks, sizes, axis=1))
    totals = np.add.reduceat(posterior, starts, axis=1)
    responsibilities = posterior / np.repeat(totals, sizes, axis=1)
    masses = responsibilities.sum(axis=0)
    divisor = np.maximum(masses, np.finfo(float).tiny)[:, None]
    centre = X.mean(axis=0)
    centred = X - centre
    offsets = responsibilities.T @ centred / divisor
    outer = (centred[:, :, None] * centred[:, None, :]).reshape(n_points, dim * dim)
    scatters = (responsibilities.T @ outer).reshape(-1, dim, dim) / divisor[:, :, None]
    scatters -= offsets[:, :, None] * offsets[:, None, :]
    scatters[masses <= NEGLIGIBLE_MASS] = 0.0
    # The difference of moments keeps the digits of a cluster's spread while its squared distance from the site's mean
    # is under _CANCELLATION_LIMIT times that spread; a cluster farther away for its spread (a few points' cluster, or
    # one far out) takes its scatter from its residuals, as component_moments does.
    spreads = np.trace(scatters, axis1=1, axis2=2)
    far = (masses > NEGLIGIBLE_MASS) & ~(np.einsum("kd,kd->k", offsets, offsets) <= _CANCELLATION_LIMIT * spreads)
    if far.any():
        _, scatters[far] = component_moments(X, responsibilities.T[far], offsets[far] + centre)
    return (masses, np.where(masses[:, None] > 0, offsets + centre, 0.0), (scatters + scatters.transpose(0, 2, 1)) / 2,
            (peaks + np.log(totals)).sum(axis=0))


def checked_mixture_moments(
    arrays, sizes: np.ndarray, dim: int, n_points: int, diagonal: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A federated EM reply's ``masses``, ``means``, ``scatters`` (every model's clusters stacked) and
    ``log-likelihoods`` (one per model), or :class:`InvalidReply` naming the rule: each model's masses sum to the
    site's declared points, and the moments are those :func:`checked_cluster_moments` allows (the models
    ``diagonal`` flags sent their scatters' diagonals)."""
    total = int(sizes.sum())
    try:
        log_likelihoods = np.asarray(arrays["log-likelihoods"], dtype=np.float64)
    except KeyError:
        raise InvalidReply("'log-likelihoods' is missing") from None
    except (TypeError, ValueError):
        raise InvalidReply("'log-likelihoods' must be numeric") from None
    if log_likelihoods.shape != sizes.shape or not np.all(np.isfinite(log_likelihoods)):
        raise InvalidReply(f"'log-likelihoods' must be {sizes.size} finite numbers, got shape {log_likelihoods.shape}")
    masses, means, scatters = checked_cluster_moments(arrays, total, dim, None,
                                                      None if diagonal is None else np.repeat(diagonal, sizes))
    for start, size in zip(np.cumsum(sizes) - sizes, sizes):
        if abs(masses[start:start + size].sum() - n_points) > 1e-6 * max(n_points, 1):
            raise InvalidReply(f"a model's 'masses' sum to {masses[start:start + size].sum():.6g}, not the {n_points} "
                               "points the site declared")
    return masses, means, scatters, log_likelihoods


def log_gaussian_densities(X: np.ndarray, means: np.ndarray, covariances: np.ndarray) -> np.ndarray:
    """``log N(x; means_k, covariances_k)`` for every row of ``X`` and cluster, shape (n, K).

    All clusters at once: each covariance's Cholesky factor ``L_k`` and its inverse (batched), and the rows'
    ``L_k^-1 (x - mean_k)`` as one product of the points by every inverse side by side ((n, d) by (d, K d)): numpy's
    stacked product of K small (n, d) by (d, d) ones took three times as long.
    """
    n_points, dim = X.shape
    n_clusters = means.shape[0]
    cholesky = np.linalg.cholesky(covariances)
    inverse = np.linalg.solve(cholesky, np.broadcast_to(np.eye(dim), cholesky.shape))
    projected = (X @ inverse.transpose(2, 0, 1).reshape(dim, n_clusters * dim)).reshape(n_points, n_clusters, dim)
    projected -= np.einsum("kij,kj->ki", inverse, means)
    log_det = np.log(np.diagonal(cholesky, axis1=1, axis2=2)).sum(axis=1)
    return -0.5 * (dim * np.log(2 * np.pi) + np.einsum("nkd,nkd->nk", projected, projected)) - log_det


def mixture_bic(X: np.ndarray, weights: np.ndarray, means: np.ndarray, covariances: np.ndarray, n_parameters: int,
                location: np.ndarray | None = None, scale: np.ndarray | None = None) -> float:
    """The BIC of a Gaussian mixture on the rows of ``X`` in the data's units (``GaussianMixture.bic``'s definition).

    ``means`` and ``covariances`` are in the units the mixture was fitted in: ``(X - location) / scale`` where a
    ``scale`` is given (a federation's standardised units), whose density is the data's times ``prod(scale)``. Scored
    there, since a standardised mixture's covariances are well conditioned where the data's units may span ten
    orders of magnitude (breast cancer's features).
    """
    if scale is not None:
        X = (X - location) / scale
    log_density = logsumexp(np.log(weights) + log_gaussian_densities(X, means, covariances), axis=1)
    if scale is not None:
        log_density = log_density - float(np.log(scale).sum())
    return float(-2.0 * log_density.sum() + n_parameters * np.log(X.shape[0]))


def site_mixture_weights(X: np.ndarray, means: np.ndarray, covariances: np.ndarray) -> np.ndarray:
    """A site's own weights (K,) over the global clusters, their means and covariances fixed (EM of the weights).

    The log-likelihood is concave in the weights, so EM climbs to their one maximum; it starts from equal weights.
    """
    log_densities = log_gaussian_densities(X, means, covariances)
    weights = np.full(means.shape[0], 1.0 / means.shape[0])
    previous = -np.inf
    for _ in range(_WEIGHTS_MAX_ITER):
        joint = log_densities + np.log(np.maximum(weights, np.finfo(float).tiny))
        peak = joint.max(axis=1, keepdims=True)
        posterior = np.exp(joint - peak)
        totals = posterior.sum(axis=1, keepdims=True)
        mean_log_likelihood = float((peak + np.log(totals)).mean())
        weights = (posterior / totals).mean(axis=0)
        if mean_log_likelihood - previous < _WEIGHTS_TOL:
            break
        previous = mean_log_likelihood
    return weights


def site_labels(X: np.ndarray, means: np.ndarray, covariances: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Indices of each row's most probable cluster under weights, means and covariances."""
    joint = log_gaussian_densities(X, means, covariances) + np.log(np.maximum(weights, np.finfo(float).tiny))
    return joint.argmax(axis=1)
