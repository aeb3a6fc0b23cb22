"""The server's trust rules: what FedGEM's server believes of a client's reply (docs/ALGORITHMS.md section 2.5).

No client's declared count or radius is taken at face value: counts are capped at a multiple
of the median declared count; a client declaring far more components than the others, or a
component of negligible weight, is not admitted; components whose balls are outliers by a
robust rule take part in no merge; in the final aggregation an untrusted component founds no
global cluster, and neither does a cluster that too few clients and too little mass support (or
that several such clients plant among the others). A component far from every other by the
federation's own scale is untrusted, with distances computed scale-free; the tuning's scores weigh at
most what a typical client's do. A client caught planting a cluster is trusted in nothing more (a
cluster within a supported cluster's own spread is that cluster's over-split fragment, not a plant).
The evaluation's tables have their own rule (:mod:`fedica.fedgem.tables`).
"""

from __future__ import annotations

import functools
import logging
import math
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import numpy as np

from fedica.fedgem.components import ClientModel, Components, Support
from fedica.fedgem.geometry import Identity, separation
from fedica.fedgem.merging import (
    FinalAggregation,
    final_aggregation,
    nested_final_aggregations,
    server_step,
    without_clusters,
)
from fedica.fedgem.overlaps import TooManyOverlaps

log = logging.getLogger("fedica.server")

# A cluster that few clients support counts when it carries at least this share of the median
# mass a client gives one of its clusters. Genuine clusters held by one small client are that
# light: at 0.25 one of 10 seeds of section 6.2's client-imbalance workload lost one.
SUPPORT_MASS_SHARE = 0.1
# ... but not when it lies no further from a cluster that enough clients support than this share of the
# median distance between such clusters and their nearest neighbours: there it is no separate
# cluster but a plant between true ones (colluders' components midway between the closest pair).
EMBEDDED_SHARE = 0.5

# ... and it is no plant but an over-split fragment of a supported cluster when it lies within this many times the
# median distance of that cluster's own members from its centroid: the same-client rule kept a client's second
# component of the cluster apart, and mapped into the cluster it changes nothing. G=1,000 blobs (K=50, 500 points
# a site): fragments lie within 0.2-1.4 of their cluster, whose members lie a median 0.74-0.82 from it; a component
# over two true clusters lies 2.5-3.0 from either. Without it, 472 honest clients of 1,000 were caught planting.
FRAGMENT_REACH = 2.0

# A component is far from the federation when its distance to the federation's centre (the
# coordinate-wise median of the centroids declared at initialisation) exceeds this many times the median
# centroid's distance to it: no honest data put a cluster there, and its squared distances to
# anything may overflow (issue 25: one row of 1e155 made every client's entropies NaN).
FAR_COMPONENT_FACTOR = 100.0

# The ICL's tie test: candidates within this share of the smallest ICL tie, but never by more than
# ICL_TIE_NATS (an absolute floor on what counts as a difference: a relative tolerance alone let
# one client's constant shift of 1e13 tie every candidate).
ICL_TIE_RELATIVE = 1e-9
ICL_TIE_NATS = 1e-6

def cap_counts(models: Mapping[int, ClientModel], factor: float | None) -> None:
    """Cap each client's sample count at ``factor`` times the median declared count.

    The count scales a client's weight in every consensus and its final radius, so one client
    claiming a huge count could otherwise pull every global centroid towards its own.
    """
    if factor is None:
        return
    cap = int(factor * np.median([m.declared_points for m in models.values()]))
    for partition, model in models.items():
        if model.declared_points > cap:
            log.warning("client %d declares %d points, more than %g x the median; the server counts %d",
                        partition, model.declared_points, factor, cap)
            model.n_points = cap


def component_cap(models: Mapping[int, ClientModel], factor: float | None,
                  at_bound: Collection[int] = ()) -> int | None:
    """The most components one client may declare: ``factor`` times the median declared K_g (None: no cap).

    A site that chose its K_g at its bound (``at_bound``: too few points for more) may hold any number of
    clusters: its K_g counts as unbounded in the median, so that small sites cannot cap a larger one below
    what it found (issue 44: sites of 5 and 16 rows chose 1, and the 54-row site's 4 were refused). Fewer
    than half of the sites still cannot move the median outside the others' values, flagged or not; when
    half or more are at their bound the median is unbounded and no cap applies.
    """
    if factor is None or not models:
        return None
    counts = [math.inf if p in at_bound else m.n_components for p, m in models.items()]
    median = float(np.median(counts))
    return None if not math.isfinite(median) else max(2, math.ceil(factor * median))


def admit_components(models: dict[int, ClientModel], factor: float | None,
                     at_bound: Collection[int] = ()) -> list[tuple[int, str]]:
    """Remove the clients whose declared components one client must not add; return them with the reason.

    A client is refused when it declares more than :func:`component_cap` components, or a
    component whose weight is below the uniform weight of a client at the cap (half of it):
    tiny components cost their client nothing and could each found a global cluster
    (docs/ALGORITHMS.md section 2.5).
    """
    cap = component_cap(models, factor, at_bound)
    if cap is None:
        return []
    refused = []
    for partition, model in list(models.items()):
        if model.n_components > cap:
            refused.append((partition, f"declares {model.n_components} components; at most {cap} "
                                       f"({factor:g} x the median K_g) are admitted"))
        elif model.weights.min() < 0.5 / cap:
            refused.append((partition, f"declares a component of weight {model.weights.min():.3g}, below the floor "
                                       f"{0.5 / cap:.3g} (half the uniform weight of {cap} components)"))
    for partition, _ in refused:
        del models[partition]
    return refused


def scale_free_distances(points: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """Euclidean distances (m,) of the rows of ``points`` (m, d) to ``centre`` (d,), computed without overflow.

    Each row and the centre are divided by their largest magnitude before the difference is
    squared, so that any finite input gives a finite distance or, beyond the largest double, inf
    (never NaN); ``np.linalg.norm`` of a row of 1e160 overflows to inf, and inf - inf is NaN.
    """
    points = np.asarray(points, dtype=np.float64)
    centre = np.asarray(centre, dtype=np.float64)
    scale = np.maximum(np.abs(points).max(axis=1, initial=0.0), np.abs(centre).max(initial=0.0))
    safe = np.where(scale > 0, scale, 1.0)[:, None]
    with np.errstate(over="ignore"):
        return scale * np.linalg.norm(points / safe - centre / safe, axis=1)


@dataclass(frozen=True)
class FederationExtent:
    """Where the federation's components lie: the coordinate-wise median of the centroids and their median distance to it."""

    centre: np.ndarray
    spread: float

    @classmethod
    def of(cls, centroids: np.ndarray) -> FederationExtent:
        """The extent of stacked centroids (m, d): robust while fewer than half of them are hostile."""
        centre = np.median(centroids, axis=0)
        return cls(centre, float(np.median(scale_free_distances(centroids, centre))))

    def far_rows(self, centroids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Which rows of ``centroids`` (m, d) lie more than :data:`FAR_COMPONENT_FACTOR` spreads from the centre, and their distances.

        With a spread of 0 (every centroid at one point) no row is far: there is no scale to measure by.
        """
        distances = scale_free_distances(centroids, self.centre)
        if not self.spread > 0:
            return np.zeros(distances.shape, dtype=bool), distances
        return distances > FAR_COMPONENT_FACTOR * self.spread, distances

    def far_reason(self, key: str, centroids: np.ndarray) -> str | None:
        """Why ``centroids`` (a reply's ``key``) are untrusted, or None: the first far row, by the federation's scale."""
        far, distances = self.far_rows(centroids)
        if not far.any():
            return None
        row = int(np.flatnonzero(far)[0])
        return (f"{key!r} row {row} lies {distances[row]:.3g} from the federation's centre, more than "
                f"{FAR_COMPONENT_FACTOR:g} x the median component's {self.spread:.3g} (untrusted: far from every other)")


def refuse_far_components(models: dict[int, ClientModel]) -> list[tuple[int, str]]:
    """Remove the clients that declare a component far from the federation at initialisation; return them with the reason."""
    if len(models) < 2:
        return []
    extent = FederationExtent.of(np.vstack([m.centroids for m in models.values()]))
    refused = [(p, reason) for p, m in models.items() if (reason := extent.far_reason("centroids", m.centroids))]
    for partition, _ in refused:
        del models[partition]
    return refused


def hostile_count(n_clients: int, hostile_fraction: float) -> int:
    """How many of ``n_clients`` clients may be hostile under ``hostile_fraction``."""
    return math.floor(hostile_fraction * n_clients)


def support_quorum(n_clients: int, hostile_fraction: float) -> int:
    """The clients a global cluster needs to be counted on their number alone: more than the hostile ones can be."""
    return hostile_count(n_clients, hostile_fraction) + 1


def unsupported_clusters(labels: np.ndarray, owners: np.ndarray, masses: np.ndarray, quorum: int,
                         typical_mass: float, centroids: np.ndarray | None = None) -> np.ndarray:
    """Which global clusters too few clients and too little (or misplaced) mass support.

    If up to a fraction of the clients may be hostile, a cluster whose members come from no
    more clients than that could be theirs alone; it is counted when more clients support it
    (``quorum``) or when its mass reaches ``typical_mass``, the mass a typical client gives one
    of its clusters (a genuine cluster held by few clients carries real data), and, given the
    ``centroids``, a cluster of two or more clients is not embedded among the quorum's clusters
    (several clients' components at one such point are a collusion): its distance to the nearest
    of them is at least :data:`EMBEDDED_SHARE` times the median distance from one of them to
    its nearest other (a plant midway between the two closest true clusters is at most that).

    Parameters
    ----------
    labels : ndarray of shape (m,)
        Global cluster of every component.
    owners : ndarray of shape (m,)
    masses : ndarray of shape (m,)
        Each component's weight, counted with its client's count capped at the median.
    quorum : int
    typical_mass : float
    centroids : ndarray of shape (k_hat, d), optional
        The global clusters' centroids (without them, no cluster is taken as embedded).

    Returns
    -------
    unsupported : ndarray of shape (k_hat,), dtype bool
    """
    k_hat = int(labels.max()) + 1 if labels.size else 0
    mass = np.bincount(labels, weights=masses, minlength=k_hat)
    few = cluster_supporters(labels, owners, k_hat) < quorum
    return few & ((mass < typical_mass) | planted_clusters(labels, owners, quorum, centroids))


def cluster_supporters(labels: np.ndarray, owners: np.ndarray, k_hat: int) -> np.ndarray:
    """How many distinct clients have a component in each of the ``k_hat`` global clusters."""
    supporters = np.zeros(k_hat, dtype=np.int64)
    np.add.at(supporters, np.unique(np.c_[labels, owners], axis=0)[:, 0], 1)
    return supporters


def planted_clusters(labels: np.ndarray, owners: np.ndarray, quorum: int, centroids: np.ndarray | None) -> np.ndarray:
    """Which global clusters (k_hat,) are plants: of two clients or more but fewer than ``quorum``, and embedded
    among the clusters the quorum supports (:func:`embedded_clusters`; without ``centroids``, none).
    """
    k_hat = int(labels.max()) + 1 if labels.size else 0
    supporters = cluster_supporters(labels, owners, k_hat)
    few = supporters < quorum
    # Only a cluster of two or more clients is taken as a plant: one client's stray component near its
    # clusters is an honest misfit too (section 6.2's cluster imbalance, G=5: K_hat 7 -> 8 when it was).
    return embedded_clusters(centroids, ~few) & (supporters >= 2) & few


def fragment_clusters(labels: np.ndarray, centers: np.ndarray, centroids: np.ndarray, backed: np.ndarray) -> np.ndarray:
    """Which clusters (k_hat,) not ``backed`` lie within a backed cluster's own spread: over-split fragments of it.

    A cluster is a fragment of the backed cluster nearest its centroid when it lies no further from it than
    :data:`FRAGMENT_REACH` times the median distance of that cluster's member components (``centers`` with
    ``labels``) from its centroid. The median is robust while fewer than half of its members are hostile.
    """
    fragments = np.zeros(backed.shape, dtype=bool)
    anchors = np.flatnonzero(backed)
    if anchors.size == 0:
        return fragments
    spreads = np.array([np.median(scale_free_distances(centers[labels == a], centroids[a])) for a in anchors])
    for cluster in np.flatnonzero(~backed):
        distances = scale_free_distances(centroids[anchors], centroids[cluster])
        nearest = int(np.argmin(distances))
        fragments[cluster] = distances[nearest] <= FRAGMENT_REACH * spreads[nearest]
    return fragments


def embedded_clusters(centroids: np.ndarray | None, backed: np.ndarray) -> np.ndarray:
    """Which clusters lie no further from a ``backed`` cluster than :data:`EMBEDDED_SHARE` of the backed clusters' median nearest-neighbour distance.

    Needs two backed clusters for a scale; with fewer (or no ``centroids``) none is embedded.
    """
    if centroids is None or backed.sum() < 2:
        return np.zeros(backed.shape, dtype=bool)
    anchors = centroids[backed]
    gaps = np.stack([scale_free_distances(anchors, centre) for centre in centroids])  # (k_hat, n_backed)
    own = np.flatnonzero(backed)
    gaps_among = gaps[own].copy()
    gaps_among[np.arange(own.size), np.arange(own.size)] = np.inf
    scale = float(np.median(gaps_among.min(axis=1)))
    return ~backed & (gaps.min(axis=1) <= EMBEDDED_SHARE * scale)


def outlying_radii(eps: np.ndarray, factor: float | None, scale: Callable[[], float]) -> np.ndarray:
    """Components whose ball is an outlier by a robust rule (``factor`` None: none).

    A radius is an outlier when it exceeds ``factor`` times the median radius AND half of
    ``scale()``, the typical distance between a client's own components (computed only
    when some radius passes the first test). The first condition alone would flag honest
    components late in a run, when most radii are nearly zero; a ball smaller than half
    the cluster separation cannot swallow a neighbouring cluster.
    """
    radii = np.sqrt(eps)
    if factor is None or radii.size == 0:
        return np.zeros(radii.shape, dtype=bool)
    large = radii > factor * float(np.median(radii))
    return large & (radii > 0.5 * scale()) if large.any() else large


def separation_scale(components: Components) -> float:
    """The median over clients of the smallest distance between a client's own components.

    A client with one component has no such distance and takes no part; with none of two or more
    the scale is 0 (the outlier rule's first condition alone decides).
    """
    distances = site_separations(components)
    return float(np.median(distances[np.isfinite(distances)])) if np.isfinite(distances).any() else 0.0


def site_separations(components: Components) -> np.ndarray:
    """``Rmin_g`` of every client of ``components``, in the order of its partitions (NaN where K_g = 1)."""
    return np.array([separation(components.centers[part]) for part in components.slices().values()])


def trusted_server_step(
    components: Components, factor: float | None, max_pairs: int | None = None
) -> tuple[np.ndarray, int, np.ndarray]:
    """A server step in which components with outlying radii take part in no merge and keep their maximiser.

    ``max_pairs`` is the memory budget on overlapping pairs (:func:`fedica.fedgem.merging.server_step`).

    Returns
    -------
    new_centers : ndarray of shape (m, d)
    n_super_clusters : int
        Super-clusters of the merged components plus one per excluded component.
    excluded : ndarray of shape (m,), dtype bool
    """
    excluded = outlying_radii(components.eps, factor, lambda: separation_scale(components))
    keep = ~excluded
    new_centers = components.centers.copy()
    step = server_step(components.centers[keep], components.eps[keep], components.owners[keep], components.weights[keep],
                       max_pairs=max_pairs)
    new_centers[keep] = step.new_centers
    return new_centers, step.n_super_clusters + int(excluded.sum()), excluded


def cluster_support(models: Mapping[int, ClientModel], final: Components, hostile_fraction: float) -> Support | None:
    """The support rule of a run's final components; None when ``hostile_fraction`` is 0 (every cluster counts)."""
    if hostile_fraction <= 0:
        return None
    median_points = float(np.median([m.n_points for m in models.values()]))
    typical = SUPPORT_MASS_SHARE * float(np.median([min(m.n_points, median_points) / m.n_components for m in models.values()]))
    masses = np.empty(final.centers.shape[0])
    for partition, part in final.slices().items():
        masses[part] = min(models[partition].n_points, median_points) * models[partition].weights
    return Support(support_quorum(len(final.partitions), hostile_fraction), typical, masses)


def trusted_final_aggregation(
    final: Components, radii: np.ndarray, factor: float | None, support: Support | None = None,
    max_pairs: int | None = None, distrusted: Collection[int] = (),
) -> tuple[FinalAggregation, np.ndarray, dict[int, str]]:
    """The final aggregation over the trusted components, and the clients it catches planting a cluster.

    ``final.eps`` holds each component's drift ``||M_k - theta_k||^2`` from the centroids the
    server sent it. A component is not trusted when its final radius is an outlier (say, a
    client whose centroids are far apart claims a huge ball), when its drift is an outlier
    AND exceeds its own final radius (it moved further in one EM step than the tolerance it
    asks for: it did not converge with the federation, or it lies), or when its client is
    ``distrusted``. An untrusted component founds no global cluster: it is mapped to the nearest
    global centroid of the others, so that it can neither merge every cluster into one nor add
    clusters of its own. With a ``support`` rule, the members of a cluster it does not count are
    treated the same way (repeatedly, until every remaining cluster is supported), and the clients
    with a member in a planted cluster (:func:`planted_clusters`; not one of :func:`fragment_clusters`) are reported: the server
    distrusts the ones caught at enough upsilons (a client caught planting one cluster is not
    believed of its others). ``max_pairs`` is the memory budget on overlapping pairs
    (:func:`fedica.fedgem.merging.final_aggregation`).

    Returns
    -------
    aggregation : FinalAggregation
    excluded : ndarray of shape (m,), dtype bool
        The untrusted components.
    planters : dict of int to str
        The clients caught planting here (beyond ``distrusted``), each with the reason.
    """
    excluded = untrusted_final_components(final, radii, factor, distrusted)
    keep = ~excluded
    trusted = final_aggregation(final.centers[keep], radii[keep], final.owners[keep], final.weights[keep],
                                max_pairs=max_pairs)
    return _supported_aggregation(final, excluded, trusted, support)


def trusted_grid_aggregations(
    final: Components, radii_by_upsilon: Mapping[float, np.ndarray], factor: float | None,
    support: Support | None = None, max_pairs: int | None = None, distrusted: Collection[int] = (),
) -> dict[float, tuple[FinalAggregation, np.ndarray, dict[int, str]] | TooManyOverlaps]:
    """:func:`trusted_final_aggregation` at every upsilon of a grid, with one union-find per set of trusted components.

    The upsilons whose trusted components are the same, and whose squared final radii are one
    array scaled (``eps_final`` is proportional to upsilon, :func:`final_radii`), share one
    union-find sweep (:func:`fedica.fedgem.merging.nested_final_aggregations`). Any other upsilon
    (say, under privacy, where each radius also holds its maximiser's noise) is aggregated alone.

    Parameters
    ----------
    final : Components
    radii_by_upsilon : mapping of float to ndarray of shape (m,)
        The squared final radii at every upsilon.
    factor, support, max_pairs, distrusted
        As :func:`trusted_final_aggregation`.

    Returns
    -------
    dict of float to (tuple or TooManyOverlaps)
        Per upsilon, what :func:`trusted_final_aggregation` returns there, or the
        :class:`~fedica.fedgem.overlaps.TooManyOverlaps` it raises.
    """
    excluded = {u: untrusted_final_components(final, radii, factor, distrusted) for u, radii in radii_by_upsilon.items()}
    trusted: dict[float, FinalAggregation | None] = dict.fromkeys(radii_by_upsilon)
    groups: dict[bytes, list[float]] = {}
    for upsilon in sorted(radii_by_upsilon):
        groups.setdefault(excluded[upsilon].tobytes(), []).append(upsilon)
    for upsilons in groups.values():
        keep = ~excluded[upsilons[0]]
        largest = radii_by_upsilon[upsilons[-1]][keep]
        shares = [u / upsilons[-1] for u in upsilons]
        if len(upsilons) > 1 and all(np.allclose(radii_by_upsilon[u][keep], share * largest, rtol=1e-12, atol=0.0)
                                     for u, share in zip(upsilons, shares)):
            swept = nested_final_aggregations(final.centers[keep], largest, final.owners[keep], final.weights[keep],
                                              shares, max_pairs=max_pairs)
            trusted.update(zip(upsilons, swept))
    results: dict[float, tuple[FinalAggregation, np.ndarray, dict[int, str]] | TooManyOverlaps] = {}
    for upsilon, radii in radii_by_upsilon.items():
        if trusted[upsilon] is not None:
            results[upsilon] = _supported_aggregation(final, excluded[upsilon], trusted[upsilon], support)
            continue
        try:
            results[upsilon] = trusted_final_aggregation(final, radii, factor, support, max_pairs, distrusted)
        except TooManyOverlaps as err:
            results[upsilon] = err
    return results


def untrusted_final_components(final: Components, radii: np.ndarray, factor: float | None,
                               distrusted: Collection[int] = ()) -> np.ndarray:
    """The components the final aggregation at squared radii ``radii`` does not trust (see :func:`trusted_final_aggregation`)."""
    scale = functools.cache(lambda: separation_scale(final))
    excluded = outlying_radii(radii, factor, scale) | (outlying_radii(final.eps, factor, scale) & (final.eps > radii))
    return excluded | np.isin(final.owners, list(distrusted))


def _supported_aggregation(final: Components, excluded: np.ndarray, trusted: FinalAggregation,
                           support: Support | None) -> tuple[FinalAggregation, np.ndarray, dict[int, str]]:
    """The support rule applied to the aggregation ``trusted`` of the components not ``excluded``
    (updated in place), the untrusted mapped to the nearest global centroid, and the planters caught."""
    planters: dict[int, str] = {}
    keep = ~excluded
    while True:
        if support is None:
            break
        owners = final.owners[keep]
        weak = unsupported_clusters(trusted.labels, owners, support.masses[keep], support.quorum,
                                    support.typical_mass, trusted.global_centroids)
        if not weak.any() or weak.all():
            break
        planted = planted_clusters(trusted.labels, owners, support.quorum, trusted.global_centroids)
        if planted.any():  # a plant within a supported cluster's own spread is its over-split fragment: no one is caught
            backed = cluster_supporters(trusted.labels, owners, trusted.k_hat) >= support.quorum
            planted &= ~fragment_clusters(trusted.labels, final.centers[keep], trusted.global_centroids, backed)
        planted = np.flatnonzero(planted)
        caught: set[int] = set()
        # The most supported plant first; a plant that shares a client caught here is judged again without it
        # (colluders' other fragments may draw an honest component in: blobs G=20 K=10, seed 0).
        for cluster in sorted(planted, key=lambda c: -np.unique(owners[trusted.labels == c]).size):
            members = set(np.unique(owners[trusted.labels == cluster]).tolist())
            if members & caught:
                continue
            caught |= members
            reason = (f"a component in a cluster of {len(members)} clients (fewer than the quorum of {support.quorum}) "
                      f"at {np.round(trusted.global_centroids[cluster], 3).tolist()}, embedded among the clusters the "
                      f"quorum supports: a planted cluster; none of this client's components is trusted, nor its evaluation")
            for owner in sorted(members):
                planters.setdefault(int(owner), reason)
        excluded[np.flatnonzero(keep)[weak[trusted.labels]]] = True
        # Whole clusters leave: the others' super-clusters stay as they are (merging.without_clusters).
        trusted = without_clusters(trusted, final.centers[keep], final.weights[keep], weak)
        keep = ~excluded
    labels = np.empty(final.centers.shape[0], dtype=np.int64)
    labels[keep] = trusted.labels
    if excluded.any():
        labels[excluded] = _nearest_centroids(final.centers[excluded], trusted.global_centroids)
    return FinalAggregation(labels, trusted.global_centroids, trusted.k_hat), excluded, planters


# Components compared with every centroid at once: (256, k_hat, d) differences stay in cache
# (measured twice as fast as one (m, k_hat, d) block at 5,000 components and 60 centroids). The
# same norms as one block, not cdist's: its rounding differs, and a near-tie could move a label.
_NEAREST_BLOCK = 256


def _nearest_centroids(points: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """The index of each point's nearest centroid (ties: the first), by Euclidean distance."""
    nearest = np.empty(points.shape[0], dtype=np.int64)
    for start in range(0, points.shape[0], _NEAREST_BLOCK):
        block = points[start:start + _NEAREST_BLOCK]
        nearest[start:start + _NEAREST_BLOCK] = np.argmin(np.linalg.norm(block[:, None, :] - centroids[None, :, :], axis=2), axis=1)
    return nearest


def final_radii(models: Mapping[int, ClientModel], final: Components, upsilon: float,
                geometry: Identity) -> np.ndarray:
    """The final radii of the paper's heuristic, computed on the server from each client's maximisers and declared size.

    ``eps_final_k = upsilon R_g sigma_k / (pi_k sqrt(N_g))`` (:meth:`fedica.fedgem.geometry.Identity.final_radius`;
    ``sigma_k`` the client's reported final variance's root under ``spherical``, 1 under ``identity``).
    ``R_g`` is the client's own ``Rmin_g``; a client with one component has none, and takes the
    federation's: the median ``Rmin`` of the clients with two or more (the cluster separation the
    heuristic measures is the federation's, docs/ALGORITHMS.md section 2.11), or, where no client
    has two, ``sigma_k`` itself (a separation of one unit of length).

    Parameters
    ----------
    models : mapping of int to ClientModel
    final : Components
        The final stage's components (with ``variances`` under ``spherical``).
    upsilon : float
    geometry : Identity
        The run's geometry (:func:`fedica.fedgem.geometry.geometry`).

    Returns
    -------
    eps_final : ndarray of shape (m,)
    """
    radii = np.empty(final.centers.shape[0])
    slices = final.slices()
    borrowed = None
    if any(part.stop - part.start < 2 for part in slices.values()):
        own = site_separations(final)
        borrowed = float(np.median(own[np.isfinite(own)])) if np.isfinite(own).any() else None
    for partition, part in slices.items():
        model = models[partition]
        variances = None if final.variances is None else final.variances[part]
        if part.stop - part.start >= 2:
            radii[part] = geometry.final_radius(final.centers[part], model.weights, model.n_points, upsilon, variances)
        else:
            scale = borrowed if borrowed is not None else float(np.atleast_1d(geometry.length_scale(variances, 1))[0])
            radii[part] = geometry.final_radius(final.centers[part], model.weights, model.n_points, upsilon, variances,
                                                separation_g=scale)
    return radii


def log_excluded(components: Components, excluded: np.ndarray, round_label: int | str, level: int = logging.WARNING) -> None:
    """Say which clients' components took part in no merge, at ``level``.

    The collaborative rounds pass DEBUG: on real data some component is excluded in almost every
    round, and the run says so once at its end (:meth:`fedica.fedgem.coordinator.FedGEMServer.run`).
    """
    if excluded.any():
        owners = sorted(set(components.owners[excluded].tolist()))
        log.log(level, "round %s: %d components with outlying radii (clients %s) took part in no merge",
                round_label, int(excluded.sum()), owners)


def clip_to_order_statistics(scores: np.ndarray, n_trim: int) -> np.ndarray:
    """Clip each column of the clients' scores to its ``n_trim``-th smallest and largest values.

    With at most ``n_trim`` hostile clients, every clipped score lies between two honest
    ones: a hostile client can move a column's sum no further than an extreme honest client
    could (a winsorised sum). NaN (no score) stays NaN and takes no part.

    Parameters
    ----------
    scores : ndarray of shape (n_clients, n_candidates)
    n_trim : int

    Returns
    -------
    clipped : ndarray of shape (n_clients, n_candidates)
    """
    scores = np.asarray(scores, dtype=np.float64)
    clipped = scores.copy()
    for column in range(scores.shape[1]):
        finite = np.sort(scores[np.isfinite(scores[:, column]), column])
        trim = min(int(n_trim), (finite.size - 1) // 2)
        if trim > 0:
            clipped[:, column] = np.clip(scores[:, column], finite[trim], finite[-1 - trim])
    return clipped


def tuning_weights(counts: np.ndarray, hostile_fraction: float) -> np.ndarray:
    """The clients' weights in the tuning: their counts, at most the median count (so no one client outweighs the rest)."""
    return counts if hostile_fraction <= 0 else np.minimum(counts, np.median(counts))


def robust_silhouettes(scores: np.ndarray, counts: np.ndarray, hostile_fraction: float) -> np.ndarray:
    """The federation's silhouette of each candidate: the clients' weighted mean, with each client's deviations
    from its own mean clipped to the other clients' range.

    Parameters
    ----------
    scores : ndarray of shape (n_clients, n_candidates)
        NaN where a client has no score.
    counts : ndarray of shape (n_clients,)
    hostile_fraction : float

    Returns
    -------
    silhouettes : ndarray of shape (n_candidates,)
        NaN where no client has a score.
    """
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a client with no score at all keeps its NaNs
        level = np.nanmean(scores, axis=1, keepdims=True)
    profiles = level + clip_to_order_statistics(scores - level, hostile_count(scores.shape[0], hostile_fraction))
    weights = tuning_weights(counts, hostile_fraction)
    valid = np.isfinite(profiles)
    totals = (np.where(valid, profiles, 0.0) * weights[:, None]).sum(axis=0)
    weight_sum = (valid * weights[:, None]).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(weight_sum > 0, totals / np.maximum(weight_sum, 1), np.nan)


def robust_totals(scores: np.ndarray, sizes: np.ndarray, hostile_fraction: float) -> np.ndarray:
    """The clients' summed scores per candidate: each client's first score and its changes from it, per point and clipped.

    A client's score of the first candidate and its changes from it across the candidates are
    both taken per declared point and clipped to the other clients' range
    (:func:`clip_to_order_statistics`), then weighted by :func:`tuning_weights`, so that no client
    makes a candidate win, or every candidate tie, by reporting a likelihood that no honest
    client's data gives. The first score is the same in every candidate: it sets the totals' level
    (and so the relative part of the ICL's tie test, :func:`icl_winners`), never their order.

    Parameters
    ----------
    scores : ndarray of shape (n_clients, n_candidates)
    sizes : ndarray of shape (n_clients,)
        Each client's declared number of points.
    hostile_fraction : float

    Returns
    -------
    totals : ndarray of shape (n_candidates,)
    """
    n_trim = hostile_count(len(sizes), hostile_fraction)
    base = scores[:, :1] / sizes[:, None]
    with np.errstate(over="ignore"):  # a difference beyond the largest double is clipped as inf
        per_point = (scores - scores[:, :1]) / sizes[:, None]
    level = clip_to_order_statistics(base, n_trim)
    clipped = clip_to_order_statistics(per_point, n_trim)
    return ((level + clipped) * tuning_weights(sizes, hostile_fraction)[:, None]).sum(axis=0)


def icl_winners(scores: np.ndarray) -> np.ndarray:
    """The candidates (indices) whose ICL ties the smallest: within :data:`ICL_TIE_RELATIVE` of it, at most :data:`ICL_TIE_NATS`."""
    best = float(scores.min())
    return np.flatnonzero(scores <= best + min(ICL_TIE_RELATIVE * abs(best), ICL_TIE_NATS))
