"""``fedica.FedGEM``: federated generalized EM on the user's own arrays, one array per site."""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from fedica.data.common import ClientData
from fedica.fedgem.local import assign_labels, estimate_n_components
from fedica.fedgem.coordinator import FedGEMServer, FedGEMSettings
from fedica.parameters import FEDGEM_PARAMETERS
from fedica.protocol import ArraySite, InMemoryFederation
from fedica.seeding import generator, sklearn_seed
from fedica.tasks import CLIENT_TASKS
from fedica.validation import check_seed, check_sites

_P = FEDGEM_PARAMETERS  # short, for the signature below


class FedGEM(BaseEstimator):
    """Federated generalized EM for isotropic Gaussian mixtures when the global K is unknown.

    Each site runs EM steps on its own points and shares, per component, its M-step maximiser
    and the radius of its uncertainty ball; the server merges overlapping balls of different
    sites into super-clusters for ``rounds`` rounds, then a final aggregation with radii scaled
    by ``upsilon`` estimates the number of global clusters. This runs, in memory, exactly the
    protocol that fedica's Flower strategy runs over a network (docs/ALGORITHMS.md section 2).

    The parameters' defaults and rules are declared in :data:`fedica.parameters.FEDGEM_PARAMETERS`;
    ``fit`` checks them all before any work.

    Parameters
    ----------
    rounds : int, default=10
        T, the number of collaborative rounds.
    local_steps : int, default=1
        S, EM steps per site per round.
    upsilon : float or "auto", default="auto"
        The final-radius hyperparameter; "auto" chooses the final partition (and so K_hat) by
        ``upsilon_criterion``.
    upsilon_grid : sequence of float, default=(0.1, 0.5, 1.0, 5.0, 10.0, 50.0)
    upsilon_criterion : {"likelihood", "silhouette"}, default="likelihood"
        "likelihood": the federated ICL (a penalised likelihood) over the grid's partitions and
        the merge path from the finest (docs/ALGORITHMS.md section 2.6); "silhouette": the
        paper's tuning by the sites' local silhouettes (appendix D.3).
    guard_factor : float, default=1.5
        The tuning prefers upsilon values whose K_hat is at most ``guard_factor * sqrt(sum K_g)``.
    n_init : int, default=3
        k-means++ seedings per site; the best by local objective starts the site.
    silhouette_sample : int, default=1000
        Points per site scored by the tuning's silhouette.
    radius_outlier_factor : float or None, default=10.0
        A component whose ball is this many times the median radius (and wider than half the
        typical separation) takes part in no merge; None: off.
    count_cap_factor : float or None, default=10.0
        The server counts at most this multiple of the median site size for one site.
    component_cap_factor : float or None, default=3.0
        A site declaring more than this multiple of the median number of local clusters (or a
        component of less than half the uniform weight at that cap) is not admitted; None: off.
    max_hostile_fraction : float, default=0.25
        The share of sites that may be hostile: a global cluster is counted only when more
        sites than that support it or it carries a typical site's cluster mass (0: every
        cluster counts).
    max_overlap_pairs : int or None, default=20_000_000
        Memory budget of one server step: at most this many overlapping pairs of balls
        (about 110 bytes each). A tuning candidate above it is left out (``tuning_["skipped"]``);
        a round above it raises :class:`fedica.fedgem.overlaps.TooManyOverlaps`. None: no budget.
    participation : float, default=1.0
        Share of the sites asked in each round.
    covariance_type : {"spherical", "identity"}, default="spherical"
        Each component's covariance. "spherical": ``sigma_k^2 I`` with ``sigma_k^2`` learned by its
        site (never merged), which makes the result independent of the data's units; "identity":
        the paper's unit covariance (the default of ``fedica-run``'s config, for the paper's
        experiments). docs/ALGORITHMS.md section 2.11.
    min_clients : int, default=2
        Fewest valid sites a round needs.
    max_local_clusters : int, default=10
        Largest K_g tried when a site's number of clusters is estimated (``n_local_clusters=None``).
    random_state : int, default=0
        Seeds every random stream (docs/ALGORITHMS.md, random streams); the same seed and data
        give the same result as ``fedica-run engine=inprocess``.

    Attributes
    ----------
    n_clusters_ : int
        K_hat, the number of global clusters (super-clusters of the final aggregation).
    means_ : ndarray of shape (n_clusters_, n_features)
        The global centres.
    labels_ : list of ndarray of shape (n_samples_g,)
        Each site's points labelled with global cluster ids, by the site's consensus model.
    site_mapping_ : list of ndarray of shape (K_g,)
        The global id of each of a site's local components.
    site_means_ : list of ndarray of shape (K_g, n_features)
        Each site's consensus model: the global centre of each of its components.
    n_local_clusters_ : ndarray of shape (n_sites,)
        K_g of each site (given, or estimated).
    upsilon_ : float
        The upsilon used (given, or tuned).
    tuning_ : dict or None
        The tuning's grid, silhouettes and K_hat per candidate.
    history_ : list of dict
        Per round: ``super_clusters``, ``mean_radius``, ``centroid_shift``, ...
    rejected_ : list of dict
        Sites left out of a round, with the reason.
    """

    # The defaults are the declaration's (fedica.parameters), spelt out as scikit-learn's get_params reads them.
    def __init__(self, rounds=_P["rounds"].default, local_steps=_P["local_steps"].default,
                 upsilon=_P["upsilon"].default, upsilon_grid=_P["upsilon_grid"].default,
                 upsilon_criterion=_P["upsilon_criterion"].default, guard_factor=_P["guard_factor"].default,
                 n_init=_P["n_init"].default, silhouette_sample=_P["silhouette_sample"].default,
                 radius_outlier_factor=_P["radius_outlier_factor"].default,
                 count_cap_factor=_P["count_cap_factor"].default,
                 component_cap_factor=_P["component_cap_factor"].default,
                 max_hostile_fraction=_P["max_hostile_fraction"].default,
                 max_overlap_pairs=_P["max_overlap_pairs"].default, participation=_P["participation"].default,
                 covariance_type=_P["covariance_type"].default, min_clients=_P["min_clients"].default, max_local_clusters=_P["max_local_clusters"].default,
                 random_state=_P["random_state"].default):
        self.rounds = rounds
        self.local_steps = local_steps
        self.upsilon = upsilon
        self.upsilon_grid = upsilon_grid
        self.upsilon_criterion = upsilon_criterion
        self.guard_factor = guard_factor
        self.n_init = n_init
        self.silhouette_sample = silhouette_sample
        self.radius_outlier_factor = radius_outlier_factor
        self.count_cap_factor = count_cap_factor
        self.component_cap_factor = component_cap_factor
        self.max_hostile_fraction = max_hostile_fraction
        self.max_overlap_pairs = max_overlap_pairs
        self.participation = participation
        self.covariance_type = covariance_type
        self.min_clients = min_clients
        self.max_local_clusters = max_local_clusters
        self.random_state = random_state

    def fit(self, sites: Sequence[Any], n_local_clusters: int | Sequence[int] | None = None) -> FedGEM:
        """Run FedGEM over the sites.

        Parameters
        ----------
        sites : sequence of array-like of shape (n_samples_g, n_features)
            One array per site, all with the same number of features.
        n_local_clusters : int, sequence of int or None, default=None
            K_g of every site (one int), of each site (a sequence), or None: each site chooses
            its own by BIC over isotropic mixtures of 2 to ``max_local_clusters`` components.

        Returns
        -------
        self : FedGEM
        """
        # Every argument is checked before any work: a mistake is one line naming it, not a failure after the rounds.
        FEDGEM_PARAMETERS.check(self.get_params())
        seed = check_seed(self.random_state)
        data = check_sites(sites, min_sites=2, min_rows=lambda d: 2)
        self.n_local_clusters_ = self._local_cluster_counts(data, n_local_clusters, seed)
        settings = FedGEMSettings(
            rounds=self.rounds, local_steps=self.local_steps, upsilon=self.upsilon, upsilon_grid=tuple(self.upsilon_grid),
            upsilon_criterion=self.upsilon_criterion,
            guard_factor=self.guard_factor, n_init=self.n_init, silhouette_sample=self.silhouette_sample,
            radius_outlier_factor=self.radius_outlier_factor, count_cap_factor=self.count_cap_factor,
            component_cap_factor=self.component_cap_factor, max_hostile_fraction=self.max_hostile_fraction,
            max_overlap_pairs=self.max_overlap_pairs,
            participation=self.participation, covariance_type=self.covariance_type, min_clients=self.min_clients, seed=seed)
        server = FedGEMServer(settings, evaluate=False)
        sites = {g: ArraySite(ClientData(X, None, X[:0], None, int(k)), g)
                 for g, (X, k) in enumerate(zip(data, self.n_local_clusters_))}
        InMemoryFederation(sites, CLIENT_TASKS, server.rejected).run(server.run())
        self._store(server, data)
        return self

    def predict(self, X, site: int | None = None) -> np.ndarray:
        """Global cluster ids of new points.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        site : int or None, default=None
            Label with this site's consensus model (as the site itself would); None: the
            nearest global centre.

        Returns
        -------
        labels : ndarray of shape (n_samples,)
        """
        check_is_fitted(self, "means_")
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.means_.shape[1]:
            raise ValueError(f"X must have shape (n_samples, {self.means_.shape[1]}), got {X.shape}")
        if site is None:
            return assign_labels(X, self.means_)
        # A site left out of the final stage has no consensus model (its mapping is None).
        valid = [g for g, mapping in enumerate(self.site_mapping_) if mapping is not None]
        if isinstance(site, bool) or not isinstance(site, Integral) or site not in valid:
            listed = (f"0..{len(valid) - 1}" if valid == list(range(len(valid))) else ", ".join(map(str, valid)))
            kind = ValueError if isinstance(site, Integral) and not isinstance(site, bool) else TypeError
            raise kind(f"site={site!r}: must be None or a site of the fit with a consensus model: {listed}")
        return self.site_mapping_[site][assign_labels(X, self.site_means_[site])]

    def _local_cluster_counts(self, data, n_local_clusters, seed) -> np.ndarray:
        if n_local_clusters is None:
            return np.array([
                estimate_n_components(X, self.max_local_clusters, random_state=sklearn_seed(generator(seed, "client.kmeanspp", g)))
                for g, X in enumerate(data)])
        counts = np.asarray(n_local_clusters)
        if counts.ndim > 1 or (counts.ndim == 1 and counts.shape[0] != len(data)):
            raise ValueError(f"n_local_clusters={n_local_clusters!r}: must be one int or one per site "
                             f"({len(data)} sites), got shape {counts.shape}")
        counts = np.broadcast_to(counts, (len(data),)).copy()
        if counts.dtype.kind not in "iu" or np.any(counts < 1):
            raise ValueError(f"n_local_clusters must be integers >= 1 (one, or one per site); got {n_local_clusters!r}")
        for g, (X, k) in enumerate(zip(data, counts)):
            if X.shape[0] < k:
                raise ValueError(f"site {g} has {X.shape[0]} points, fewer than its {k} local clusters")
        return counts.astype(np.int64)

    def _store(self, server: FedGEMServer, data: list[np.ndarray]) -> None:
        agg = server.aggregation
        slices = server.final.slices()
        self.n_clusters_ = int(agg.k_hat)
        self.means_ = agg.global_centroids
        self.site_mapping_ = [agg.labels[slices[g]] if g in slices else None for g in range(len(data))]
        self.site_means_ = [None if m is None else self.means_[m] for m in self.site_mapping_]
        self.labels_ = [None if m is None else m[assign_labels(X, c)]
                        for X, m, c in zip(data, self.site_mapping_, self.site_means_)]
        self.upsilon_ = server.upsilon
        self.tuning_ = server.tuning
        self.history_ = server.history
        self.rejected_ = server.rejected

