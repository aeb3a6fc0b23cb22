"""``fedica.FedGEM``: federated generalized EM on the user's own arrays, one array per site."""

from __future__ import annotations

import os
from collections.abc import Sequence
from numbers import Integral

import numpy as np
from scipy.spatial.distance import cdist
from scipy.special import logsumexp
from sklearn.base import BaseEstimator, DensityMixin
from sklearn.exceptions import NotFittedError
from sklearn.utils.validation import check_is_fitted, validate_data

from fedica.sites import ClientData
from fedica.fedgem import client as fedgem_client
from fedica.fedgem.privacy import private_reply
from fedica.fedgem.coordinator import FedGEMServer, FedGEMSettings
from fedica.fedgem.families import log_gaussian_densities, mixture_parameters, shape_parameters, site_mixture_weights
from fedica.fedgem.families import site_labels as family_labels
from fedica.fedgem.geometry import geometry
from fedica.fedgem.local import assign_labels, estimate_n_components, local_bound
from fedica.fedgem.selection import VARIANCE_FLOOR
from fedica.fedgem.standardisation import federated_scale, site_moments, standardised
from fedica.parameters import FEDGEM_PARAMETERS
from fedica.persistence import SaveLoadMixin, check_array, read_result
from fedica.protocol import ArraySite, ClientTasks, InMemoryFederation
from fedica.seeding import generator, sklearn_seed
from fedica.validation import check_columns, check_seed, fit_sites, is_site_list

_P = FEDGEM_PARAMETERS  # short, for the signature below

# What the estimator's in-memory sites answer: FedGEM's own tasks, each reply through the privacy step (which
# changes nothing unless dp_epsilon is set); no hostile-client transform, which belongs to the experiments' runs.
SITE_TASKS = ClientTasks(handlers=fedgem_client.TASKS, transforms=(private_reply,),
                         concurrent=fedgem_client.CONCURRENT_TASKS)


class FedGEM(SaveLoadMixin, DensityMixin, BaseEstimator):
    """Federated generalized EM for isotropic Gaussian mixtures when the global K is unknown.

    Each site runs EM steps on its own points and shares, per component, its M-step maximiser
    and the radius of its uncertainty ball; the server merges overlapping balls of different
    sites into super-clusters for ``rounds`` rounds, then a final aggregation with radii scaled
    by ``upsilon`` estimates the number of global clusters. This runs, in memory, exactly the
    protocol that fedica's Flower strategy runs over a network (docs/ALGORITHMS.md section 2).

    ``predict_proba``, ``score_samples`` and ``score`` read the global clusters as one isotropic
    Gaussian mixture (docs/ALGORITHMS.md section 2.12): centres ``means_``, weights ``weights_``
    and one variance ``covariance_``, both computed by ``fit`` from the sites' points (which it
    holds; a federated run never sends them). ``predict(X)`` stays the nearest global centre, so
    it equals ``predict_proba(X).argmax(axis=1)`` exactly when the weights are equal.

    ``save(path)`` and ``FedGEM.load(path)`` keep a fitted estimator in a portable ``.npz`` file
    (:mod:`fedica.persistence`); ``FedGEM.from_result(path)`` rebuilds one from a run's ``result.json``.

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
    same_client_rule : {"evidence", "strict"}, default="evidence"
        "evidence": two components of one site may end in one global cluster when one site holds both
        clusters or the sites holding both are a small minority of those holding either, and the sites'
        federated ICL agrees (docs/ALGORITHMS.md section 2.6.3); a fixed ``upsilon`` then adds one
        likelihood exchange. With ``upsilon="auto"`` it needs ``upsilon_criterion="likelihood"``.
        "strict" (the paper's rule, the default of ``fedica-run``'s config): they never do, so a site
        whose local fit split a cluster in two keeps K_hat above the true count.
    guard_factor : float, default=1.5
        The tuning prefers upsilon values whose K_hat is at most ``guard_factor * sqrt(sum K_g)``.
    n_init : int, default=3
        k-means++ seedings per site; the best by local objective starts the site.
    local_start : {"seeds", "kmeans"}, default="seeds"
        How a site starts: the best of its ``n_init`` k-means++ seedings ("seeds", the paper's), or
        Lloyd's k-means run from each seeding, the best by the k-means objective kept ("kmeans").
        Not with ``dp_epsilon`` (a private site starts from its private initialisation).
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
    covariance_type : {"auto", "spherical", "diag", "full", "identity"}, default="auto"
        Each global cluster's covariance. The sites always fit spheres, ``sigma_k^2 I`` with ``sigma_k^2``
        learned by each site (never merged; docs/ALGORITHMS.md section 2.11). "auto" then joins their
        clusters into a family's (spherical, diag or full), family and K chosen together by the
        federation's BIC, as a central analyst's GMM is chosen; "diag" or "full" fix the family
        (section 2.14); "spherical" keeps the spheres' partition; "identity" is the paper's unit
        covariance (:meth:`paper`). Every one but "identity" gives a result independent of each
        feature's unit (with ``standardize``).
    labelling : {"adapted", "consensus"}, default="adapted"
        How a site's points get their global ids (``labels_``, ``predict(X, site)``). "adapted": by
        the site's own mixture over every global centre, its weights (and, under "spherical", one
        variance) fitted by EM to its points with the centres fixed, so a site whose local fit put two
        clusters in one component labels their points apart; "consensus" (the paper's, the default of
        ``fedica-run``'s config): the nearest global centre of the site's own components.
        docs/ALGORITHMS.md section 2.8.
    standardize : {"federated"} or None, default="federated"
        "federated": before anything else, every feature is centred and scaled by one location and
        scale the sites agree on: each site sends its columns' means and standard deviations, and
        the server takes medians over the sites (docs/ALGORITHMS.md section 2.11.2), so that no
        feature's unit weighs it and no minority of sites sets the scales. The sites choose K_g,
        fit and label on the standardised points; ``means_`` is mapped back to the data's units,
        and ``predict``, ``predict_proba`` and ``score_samples`` take points in the data's units.
        The default since issue 44 (measured: docs/RESULTS.md, "Federated equals central"); the
        paper preset (:meth:`paper`) keeps the data's units. None: the data's own units (the fit
        warns when they are over 10-fold apart); a private fit (``dp_epsilon``) needs None.
    min_clients : int, default=2
        Fewest valid sites a round needs.
    max_local_clusters : int, default=10
        Largest K_g tried when a site's number of clusters is estimated (``n_local_clusters=None``);
        a site of ``n_g`` points tries at most ``floor(sqrt(n_g / 2))``.
    random_state : int, default=0
        Seeds every random stream (docs/ALGORITHMS.md, random streams); the same seed and data
        give the same result as ``fedica-run engine=inprocess``.
    dp_epsilon : float or None, default=None
        Differential privacy of everything a site sends (docs/ALGORITHMS.md section 2.13): the
        whole fit's budget epsilon; None: no noise. A private fit needs ``dp_clip``,
        ``covariance_type="identity"``, ``local_steps=1`` and ``n_local_clusters``.
    dp_delta : float, default=1e-5
    dp_clip : float or None, default=None
        The norm bound a site clips its points to, in the data's units.
    dp_unit : {"record", "client"}, default="record"
        What is protected: one data point of a site (``"record"``), or everything one site holds
        (``"client"``: the site's points replaced by any others of the same number).

    Attributes
    ----------
    n_clusters_ : int
        K_hat, the number of global clusters: the super-clusters of the final aggregation; under
        ``labelling="adapted"`` those that hold points of the sites (a super-cluster no site's own mixture
        gives a point is dropped).
    means_ : ndarray of shape (n_clusters_, n_features)
        The global centres, in the data's own units (also under ``standardize``).
    feature_names_in_ : tuple of str or None
        The columns the sites named, when given as pandas DataFrames (every site the same, in one order);
        a DataFrame given to ``predict``, ``predict_proba`` or ``score_samples`` must name them in that
        order. None when the sites were arrays.
    feature_location_, feature_scale_ : ndarray of shape (n_features,) or None
        Under ``standardize="federated"``: every feature's location and scale, the points' standardisation
        ``(X - feature_location_) / feature_scale_`` that the sites clustered; None otherwise.
    labels_ : ndarray of shape (n_samples,), or list of ndarray of shape (n_samples_g,)
        Fitted on one array ``X``: its rows' global cluster ids, in its order (-1 for the rows of a site left
        out of the final stage). Fitted on a list of sites: each site's points labelled with global cluster ids (``labelling``: by the site's own mixture,
        or by its consensus model).
    site_mapping_ : list of ndarray of shape (K_g,)
        The global id of each of a site's local components.
    site_means_ : list of ndarray of shape (K_g, n_features)
        Each site's consensus model: the global centre of each of its components.
    site_weights_ : list of ndarray of shape (n_clusters_,)
        Under ``labelling="adapted"``: each site's own mixture weights over ``means_`` (None for a
        site left out of the final stage; the list is None under "consensus").
    site_variances_ : list of float
        Under ``labelling="adapted"``: each site's mixture variance (1 under "identity").
    n_local_clusters_ : ndarray of shape (n_sites,)
        K_g of each site (given, or estimated).
    local_clusters_at_bound_ : ndarray of shape (n_sites,), bool
        Whether each site chose its bound (it may hold more clusters; a site of fewer than 8 points, whose
        bound is 1, always; one warning named them); all False when ``n_local_clusters`` is given.
    upsilon_ : float
        The upsilon used (given, or tuned).
    tuning_ : dict or None
        The tuning's grid, silhouettes and K_hat per candidate.
    k_support_ : dict
        How sure the number of clusters is (docs/ALGORITHMS.md section 2.6.4; the result's ``fedgem.k_support``):
        ``criterion`` that chose K_hat; where it is a likelihood criterion, ``k`` (the candidate Ks the sites
        scored), ``weight`` (each K's ``exp(-criterion / 2)``, normalised: its approximate posterior weight),
        ``gap`` (each K's criterion less the chosen's) and ``chosen``; and ``clusters``, per global cluster of
        the final aggregation (before ``labelling="adapted"`` drops one no site's points reach): ``sites``
        holding it, ``site_share``, ``spread_median`` and ``spread_max`` (its components' distances to its
        centre over their own final radii). A K within 2 of the chosen's criterion is a near tie, and the
        fit warned.
    privacy_ : dict or None
        A private fit's ``epsilon`` and ``delta`` spent, in total and per exchange
        (:meth:`fedica.privacy.PrivacyPlan.record`); None without ``dp_epsilon``.
    feature_scale_spread_ : float or None
        The median site's largest column standard deviation over the median of its other columns'
        (:func:`fedica.fedgem.geometry.feature_scale_spread`); above
        :data:`~fedica.fedgem.geometry.FEATURE_SCALE_SPREAD_LIMIT` (10) the fit warned that the features'
        units weigh them and its result is not to be trusted: standardise the features (``standardize``). None for a
        private fit, whose sites report no such number.
    cluster_anisotropy_ : float or None
        The median site's :func:`~fedica.fedgem.geometry.cluster_anisotropy` under its final local model: how far its
        clusters are from spheres, about 1 for spherical clusters; above
        :data:`~fedica.fedgem.geometry.CLUSTER_ANISOTROPY_LIMIT` (2) the fit warned that the model spends several
        components on an elongated cluster, so that K_hat may exceed the clusters the data hold. None for a private
        fit, and in a result written before it.
    history_ : list of dict
        Per round: ``super_clusters``, ``mean_radius``, ``centroid_shift``, ...
    rejected_ : list of dict
        Sites left out of a round, with the reason.
    weights_ : ndarray of shape (n_clusters_,)
        The global mixture's weights: the share of all sites' points that ``labels_`` assigns to
        each global cluster, each cluster counting at least one point (so no weight is zero).
    covariance_ : float
        The global mixture's one variance (in standardised units under ``standardize``) (covariance ``covariance_ * I``): the maximum-likelihood
        value, the mean over all sites' points and features of the squared distance to the
        assigned global centre, floored at 1e-6 times the points' mean per-feature variance (the
        floor of :func:`fedica.fedgem.selection.log_likelihoods`).

    covariance_family_ : str or None
        Under ``covariance_type`` ``diag``, ``full`` or ``auto``: the family of the global clusters the BIC chose
        (``spherical``, ``diag`` or ``full``; docs/ALGORITHMS.md section 2.14); None otherwise.
    covariances_ : ndarray of shape (n_clusters_, n_features, n_features) or None
        Under a covariance family: each global cluster's covariance (in standardised units under ``standardize``),
        pooled from its sites' components' moments and regularised; ``predict_proba``, ``score_samples`` and the
        sites' own mixtures then use them, and ``weights_`` are the clusters' pooled masses. None otherwise.

    Sites left out of the final stage (``labels_`` None) count in neither ``weights_`` nor
    ``covariance_``.
    """

    # The defaults are the declaration's (fedica.parameters), spelt out as scikit-learn's get_params reads them.
    def __init__(self, rounds=_P["rounds"].default, local_steps=_P["local_steps"].default,
                 upsilon=_P["upsilon"].default, upsilon_grid=_P["upsilon_grid"].default,
                 upsilon_criterion=_P["upsilon_criterion"].default, same_client_rule=_P["same_client_rule"].default,
                 guard_factor=_P["guard_factor"].default,
                 n_init=_P["n_init"].default, local_start=_P["local_start"].default,
                 silhouette_sample=_P["silhouette_sample"].default,
                 radius_outlier_factor=_P["radius_outlier_factor"].default,
                 count_cap_factor=_P["count_cap_factor"].default,
                 component_cap_factor=_P["component_cap_factor"].default,
                 max_hostile_fraction=_P["max_hostile_fraction"].default,
                 max_overlap_pairs=_P["max_overlap_pairs"].default, participation=_P["participation"].default,
                 covariance_type=_P["covariance_type"].default, labelling=_P["labelling"].default,
                 standardize=_P["standardize"].default, min_clients=_P["min_clients"].default,
                 max_local_clusters=_P["max_local_clusters"].default,
                 random_state=_P["random_state"].default, dp_epsilon=_P["dp_epsilon"].default,
                 dp_delta=_P["dp_delta"].default, dp_clip=_P["dp_clip"].default, dp_unit=_P["dp_unit"].default):
        self.rounds = rounds
        self.local_steps = local_steps
        self.upsilon = upsilon
        self.upsilon_grid = upsilon_grid
        self.upsilon_criterion = upsilon_criterion
        self.same_client_rule = same_client_rule
        self.guard_factor = guard_factor
        self.n_init = n_init
        self.local_start = local_start
        self.silhouette_sample = silhouette_sample
        self.radius_outlier_factor = radius_outlier_factor
        self.count_cap_factor = count_cap_factor
        self.component_cap_factor = component_cap_factor
        self.max_hostile_fraction = max_hostile_fraction
        self.max_overlap_pairs = max_overlap_pairs
        self.participation = participation
        self.covariance_type = covariance_type
        self.labelling = labelling
        self.standardize = standardize
        self.min_clients = min_clients
        self.max_local_clusters = max_local_clusters
        self.random_state = random_state
        self.dp_epsilon = dp_epsilon
        self.dp_delta = dp_delta
        self.dp_clip = dp_clip
        self.dp_unit = dp_unit

    def fit(self, X, y=None, *, groups=None, n_local_clusters: int | Sequence[int] | None = None) -> FedGEM:
        """Run FedGEM over the sites.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), or a sequence of them
            scikit-learn's form: one array (or DataFrame) whose rows ``groups`` assigns to sites; the
            federation's form: one array per site, all with the same features.
        y : None
            Ignored (scikit-learn's convention for a clusterer). In the federation's form only, a second
            positional argument is taken as ``n_local_clusters``, as fedica has always read it.
        groups : array-like of shape (n_samples,), default=None
            With one array ``X``: each row's site (any labels, as scikit-learn's ``GroupKFold`` takes them;
            the sites in their sorted order). None: one site, a federation of one.
        n_local_clusters : int, sequence of int or None, default=None
            K_g of every site (one int), of each site (a sequence), or None: each site chooses
            its own (:func:`fedica.fedgem.local.choose_n_components`: the ICL over spherical
            mixtures of 1 to ``min(max_local_clusters, floor(sqrt(n_g / 2)))`` components), with a
            warning for each site that chooses its bound.

        Returns
        -------
        self : FedGEM
        """
        # Every argument is checked before any work: a mistake is one line naming it, not a failure after the rounds.
        FEDGEM_PARAMETERS.check(self.get_params())
        seed = check_seed(self.random_state)
        if is_site_list(X) and n_local_clusters is None:
            n_local_clusters = y  # the federation's form keeps its second positional argument, the sites' K_g
        data, rows = fit_sites(self, X, groups, min_rows=lambda d: 2)
        if self.dp_epsilon is not None and n_local_clusters is None:
            raise ValueError("n_local_clusters=None: a private fit needs each site's K_g (a site's own choice is not private)")
        # The sites choose K_g on the points they will fit: standardised by what the protocol's first exchange
        # gives them (the same moments and medians, computed here for the choice the sites make before it).
        model_data = data
        if self.standardize == "federated" and n_local_clusters is None:
            location, scale = federated_scale(*zip(*map(site_moments, data)))
            model_data = [standardised(X, location, scale) for X in data]
        self.n_local_clusters_ = self._local_cluster_counts(model_data, n_local_clusters, seed)
        settings = FedGEMSettings(
            rounds=self.rounds, local_steps=self.local_steps, upsilon=self.upsilon, upsilon_grid=tuple(self.upsilon_grid),
            upsilon_criterion=self.upsilon_criterion, same_client_rule=self.same_client_rule,
            guard_factor=self.guard_factor, n_init=self.n_init, local_start=self.local_start,
            silhouette_sample=self.silhouette_sample,
            radius_outlier_factor=self.radius_outlier_factor, count_cap_factor=self.count_cap_factor,
            component_cap_factor=self.component_cap_factor, max_hostile_fraction=self.max_hostile_fraction,
            max_overlap_pairs=self.max_overlap_pairs,
            participation=self.participation, covariance_type=self.covariance_type, labelling=self.labelling,
            standardize=self.standardize, seed=seed,
            # The sites are all here: a federation of fewer sites than min_clients is the one the caller has.
            min_clients=min(self.min_clients, len(data)),
            dp_epsilon=self.dp_epsilon, dp_delta=self.dp_delta, dp_clip=self.dp_clip, dp_unit=self.dp_unit)
        server = FedGEMServer(settings, evaluate=False)
        sites = {g: ArraySite(ClientData(X, None, X[:0], None, int(k), bool(at_bound)), g)
                 for g, (X, k, at_bound) in enumerate(zip(data, self.n_local_clusters_, self.local_clusters_at_bound_))}
        InMemoryFederation(sites, SITE_TASKS, server.rejected).run(server.run())
        self._store(server, data)
        if rows is not None:
            self.labels_ = _labels_in_row_order(self.labels_, rows)
        return self

    def fit_predict(self, X, y=None, *, groups=None, n_local_clusters: int | Sequence[int] | None = None):
        """Fit (:meth:`fit`), then return ``labels_``.

        Returns
        -------
        labels : ndarray of shape (n_samples,), or a list of them
            With one array ``X``: its rows' global cluster ids, in its order (-1 for the rows of a site
            left out of the final stage). With a list of sites: each site's (None for a site left out).
        """
        return self.fit(X, y, groups=groups, n_local_clusters=n_local_clusters).labels_

    @classmethod
    def paper(cls, **params) -> FedGEM:
        """FedGEM as the paper runs it: the preset ``algorithm=fedgem_paper`` of ``fedica-run``.

        The identity covariance, two components of one site never in one global cluster, each
        site labelling its points by its consensus model, the data's own units (the values ``paper=`` in
        :data:`fedica.parameters.FEDGEM_PARAMETERS`); ``params`` set any parameter besides.

        Returns
        -------
        estimator : FedGEM
            Unfitted.
        """
        return cls(**{**FEDGEM_PARAMETERS.paper_preset(), **params})

    @classmethod
    def from_result(cls, path: str | os.PathLike) -> FedGEM:
        """The fitted estimator of a FedGEM run's ``result.json`` (``fedica-run algorithm=fedgem``).

        The parameters are the run's ``config.algorithm`` keys the estimator has, ``random_state``
        its ``seed`` and ``min_clients`` its ``min_clients``; site ``g`` is the run's partition
        ``g``. From the result's ``fedgem`` section come ``means_`` (``global_centroids``),
        ``n_clusters_``, ``site_mapping_`` (``client_mapping``; None for a site outside the final
        aggregation) and ``site_means_``, ``n_local_clusters_`` (``local_clusters``; 0 for a site
        that never answered), ``upsilon_``, ``tuning_`` (``upsilon_tuning``, as the JSON holds it:
        lists where a fit has arrays), and ``history_`` and ``rejected_`` from the result's
        ``history`` and ``clients``. The sites' points never left them: ``labels_``, ``weights_``,
        ``covariance_`` and the sites' own mixtures (``site_weights_``) are None, so ``predict``
        works (with ``site`` only under ``labelling="consensus"``), while ``predict_proba``,
        ``score_samples`` and ``score`` raise ``NotFittedError``.

        Parameters
        ----------
        path : str or os.PathLike

        Returns
        -------
        estimator : FedGEM

        Raises
        ------
        ValueError
            One line naming the file: not a result, a stopped run's ``partial_result.json``, an
            RF-ICA result, or a key missing.
        """
        keys = ("global_centroids", "client_mapping", "local_clusters", "upsilon", "upsilon_tuning")
        result, params = read_result(path, "fedgem", FEDGEM_PARAMETERS, keys)
        section = result["fedgem"]
        model = cls(**params)
        n_sites = int(result["clients"]["expected"])
        model.means_ = np.asarray(section["global_centroids"], dtype=np.float64)
        model.n_clusters_ = model.means_.shape[0]
        mapping = {int(p): np.asarray(ids, dtype=np.int64) for p, ids in section["client_mapping"].items()}
        model.site_mapping_ = [mapping.get(g) for g in range(n_sites)]
        model.site_means_ = [None if m is None else model.means_[m] for m in model.site_mapping_]
        model.n_local_clusters_ = np.array([section["local_clusters"].get(str(g), 0) for g in range(n_sites)],
                                           dtype=np.int64)
        model.upsilon_ = float(section["upsilon"])
        model.tuning_ = section["upsilon_tuning"]
        model.k_support_ = section.get("k_support")  # None in a result written before it
        model.feature_scale_spread_ = section.get("feature_scale_spread")  # None in a result written before it
        model.cluster_anisotropy_ = section.get("cluster_anisotropy")  # likewise
        # Only a standardised run records them (its centres are in the data's units, as means_ here).
        model.feature_location_, model.feature_scale_ = (
            (np.asarray(section["feature_location"], dtype=np.float64), np.asarray(section["feature_scale"], dtype=np.float64))
            if "feature_scale" in section else (None, None))
        model.history_ = result["history"]
        model.rejected_ = result["clients"]["rejected"]
        model.labels_ = model.weights_ = model.covariance_ = model.feature_names_in_ = None
        model.covariance_family_ = section.get("covariance_family")  # None in a result written before it
        covariances = section.get("covariances")
        model.covariances_ = None if covariances is None else np.asarray(covariances, dtype=np.float64)
        if model.covariances_ is not None:
            model.weights_ = np.asarray(section["cluster_weights"], dtype=np.float64)
        model.site_weights_ = model.site_variances_ = None
        return model

    _PARAMETERS = FEDGEM_PARAMETERS
    _FITTED_ATTRIBUTES = frozenset({
        "means_", "weights_", "covariance_", "n_clusters_", "labels_", "upsilon_", "tuning_", "k_support_", "history_",
        "rejected_", "privacy_", "site_mapping_", "site_means_", "site_weights_", "site_variances_", "n_local_clusters_",
        "local_clusters_at_bound_", "feature_location_", "feature_scale_", "feature_scale_spread_",
        "cluster_anisotropy_", "n_features_in_", "feature_names_in_", "covariance_family_", "covariances_"})

    def _check_fitted(self) -> None:
        """What ``predict``, ``predict_proba`` and ``score_samples`` read, checked after :meth:`load`."""
        means = check_array(getattr(self, "means_", None), "means_", ndim=2)
        n_clusters, n_features = means.shape
        if getattr(self, "n_features_in_", None) not in (None, n_features):
            raise ValueError(f"n_features_in_={self.n_features_in_!r}, but means_ has {n_features} columns")
        check_array(getattr(self, "weights_", None), "weights_", ndim=1, shape=(n_clusters,), optional=True)
        covariance = getattr(self, "covariance_", None)
        if covariance is not None and not (isinstance(covariance, (float, np.floating)) and 0 < covariance < np.inf):
            raise ValueError(f"covariance_={covariance!r} is not a positive variance")
        covariances = check_array(getattr(self, "covariances_", None), "covariances_", ndim=3,
                                  shape=(n_clusters, n_features, n_features), optional=True)
        if covariances is not None and (not np.allclose(covariances, covariances.transpose(0, 2, 1))
                                        or np.any(np.linalg.eigvalsh(covariances)[:, 0] <= 0)):
            raise ValueError("covariances_ holds a matrix that is not symmetric positive definite")
        for name in ("feature_location_", "feature_scale_"):
            check_array(getattr(self, name, None), name, ndim=1, shape=(n_features,), optional=True)
        scale = getattr(self, "feature_scale_", None)
        if scale is not None and (scale <= 0).any():
            raise ValueError("feature_scale_ holds a scale that is not positive")
        if (scale is None) != (getattr(self, "feature_location_", None) is None):
            raise ValueError("feature_scale_ and feature_location_ must both be set or both be None")
        for g, mapping in enumerate(getattr(self, "site_mapping_", None) or []):
            if mapping is not None:
                check_array(mapping, f"site_mapping_[{g}]", ndim=1, kinds="iu")
                if len(mapping) and (mapping.min() < 0 or mapping.max() >= n_clusters):
                    raise ValueError(f"site_mapping_[{g}] names a global cluster outside 0..{n_clusters - 1}")

    def predict(self, X, site: int | None = None) -> np.ndarray:
        """Global cluster ids of new points.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        site : int or None, default=None
            Label as this site itself does (``labelling``: with its own mixture over every global
            centre, or with its consensus model); None: the nearest global centre.

        Returns
        -------
        labels : ndarray of shape (n_samples,)
        """
        X, means = self._in_model_units(self._rows(X)), self._model_means()
        covariances = getattr(self, "covariances_", None)  # None in an estimator saved before covariance families
        if site is None:
            return assign_labels(X, means) if covariances is None else self._log_joint_in_model_units(X).argmax(axis=1)
        # A site left out of the final stage has no consensus model (its mapping is None).
        valid = [g for g, mapping in enumerate(self.site_mapping_) if mapping is not None]
        if isinstance(site, bool) or not isinstance(site, Integral) or site not in valid:
            listed = (f"0..{len(valid) - 1}" if valid == list(range(len(valid))) else ", ".join(map(str, valid)))
            kind = ValueError if isinstance(site, Integral) and not isinstance(site, bool) else TypeError
            raise kind(f"site={site!r}: must be None or a site of the fit with a consensus model: {listed}")
        if self.labelling == "consensus":
            mapping = self.site_mapping_[site]
            return mapping[assign_labels(X, means[mapping])]
        if getattr(self, "site_weights_", None) is None:
            raise NotFittedError(f"site={site}: labelling='adapted' needs the site's own mixture, which this estimator "
                                 "does not hold (rebuilt from a result.json, or saved by an older fedica); predict "
                                 "without site, or set_params(labelling='consensus')")
        if covariances is not None:
            return family_labels(X, means, covariances, self.site_weights_[site])
        model = geometry(self.covariance_type)
        return model.site_labels(X, means, self.site_weights_[site], self.site_variances_[site])

    def predict_proba(self, X) -> np.ndarray:
        """Posterior probability of each global cluster for each row of ``X``, under the global mixture.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        probabilities : ndarray of shape (n_samples, n_clusters_)
            Each row sums to 1.
        """
        log_joint = self._log_joint(X)
        return np.exp(log_joint - logsumexp(log_joint, axis=1, keepdims=True))

    def score_samples(self, X) -> np.ndarray:
        """Log density of each row of ``X`` under the global mixture.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        log_density : ndarray of shape (n_samples,)
        """
        return logsumexp(self._log_joint(X), axis=1)

    def score(self, X, y=None) -> float:
        """Mean log density of the rows of ``X`` under the global mixture (as ``GaussianMixture.score``).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        y : ignored

        Returns
        -------
        log_likelihood : float
        """
        return float(self.score_samples(X).mean())

    def bic(self, X) -> float:
        """Bayesian information criterion of the global mixture on ``X`` (as ``GaussianMixture.bic``; smaller is
        better): ``-2 log L + p log n``, where ``p`` counts the mixture's free parameters.

        On the pooled points of a simulation it scores the federation's mixture by the central analyst's own
        criterion, beside a ``GaussianMixture`` fitted on them (the harness's ``pooled_bic``, docs/INTERFACE.md).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        bic : float
        """
        log_density = self.score_samples(X)
        return float(-2.0 * log_density.sum() + self._n_parameters() * np.log(log_density.shape[0]))

    def aic(self, X) -> float:
        """Akaike information criterion of the global mixture on ``X`` (as ``GaussianMixture.aic``): ``-2 log L + 2 p``.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)

        Returns
        -------
        aic : float
        """
        return float(-2.0 * self.score_samples(X).sum() + 2 * self._n_parameters())

    def _n_parameters(self) -> int:
        """The global mixture's free parameters: its family's (:func:`fedica.fedgem.families.mixture_parameters`), or
        under the spheres alone ``K`` means, ``K - 1`` weights and the one variance; either with the shape that
        spheres of standardised features owe to the units (:func:`fedica.fedgem.families.shape_parameters`)."""
        n_clusters, dim = self.means_.shape
        standardised = getattr(self, "feature_scale_", None) is not None
        family = getattr(self, "covariance_family_", None)  # None in an estimator saved before covariance families
        if family is not None:
            return mixture_parameters(family, n_clusters, dim, shape_parameters(family, dim, standardised))
        return n_clusters * (dim + 1) + shape_parameters("spherical", dim, standardised)

    def _rows(self, X) -> np.ndarray:
        check_is_fitted(self, "means_")
        check_columns(X, getattr(self, "feature_names_in_", None))  # None in an estimator saved before it
        X = validate_data(self, X, dtype=np.float64, reset=False)
        if X.shape[1] != self.means_.shape[1]:  # an estimator rebuilt from a result or an older file names no width
            raise ValueError(f"X must have shape (n_samples, {self.means_.shape[1]}), got {X.shape}")
        return X

    def _in_model_units(self, X: np.ndarray) -> np.ndarray:
        """Rows in the units the sites clustered: standardised under ``standardize``, else ``X`` itself."""
        scale = getattr(self, "feature_scale_", None)  # None in an estimator saved before standardize
        return X if scale is None else standardised(X, self.feature_location_, scale)

    def _model_means(self) -> np.ndarray:
        return self._in_model_units(self.means_)

    def _log_joint_in_model_units(self, X: np.ndarray) -> np.ndarray:
        """``log weights_k + log N(x; mean_k, covariance_k)`` of rows already in the model's units, (n, n_clusters)."""
        covariances = getattr(self, "covariances_", None)
        if covariances is not None:
            return np.log(self.weights_) + log_gaussian_densities(X, self._model_means(), covariances)
        if self.covariance_ is None:
            raise NotFittedError("this FedGEM was rebuilt from a run's result, which holds no mixture weights or "
                                 "variance: predict_proba, score_samples and score need fit on the sites' points")
        return _log_weighted_densities(X, self._model_means(), self.weights_, self.covariance_)

    def _log_joint(self, X) -> np.ndarray:
        log_joint = self._log_joint_in_model_units(self._in_model_units(self._rows(X)))
        scale = getattr(self, "feature_scale_", None)
        # A density of the data's units: the standardised one times the map's Jacobian, 1 / prod(scale).
        return log_joint if scale is None else log_joint - float(np.log(scale).sum())

    def _local_cluster_counts(self, data, n_local_clusters, seed) -> np.ndarray:
        self.local_clusters_at_bound_ = np.zeros(len(data), dtype=bool)
        if n_local_clusters is None:
            counts = np.array([
                estimate_n_components(X, self.max_local_clusters, random_state=sklearn_seed(generator(seed, "client.kmeanspp", g)))
                for g, X in enumerate(data)])
            bounds = np.array([local_bound(X, self.max_local_clusters) for X in data])
            # The server warns once, naming these sites (their init replies say so, as a federation's do).
            self.local_clusters_at_bound_ = counts == bounds
            return counts
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
        self.feature_location_, self.feature_scale_ = server.feature_location, server.feature_scale
        # The sites' points and the centres in the units the sites clustered (standardised under standardize).
        data = [self._in_model_units(X) for X in data]
        centres = agg.global_centroids
        self.site_mapping_ = [agg.labels[slices[g]] if g in slices else None for g in range(len(data))]
        family = server.family
        self.covariance_family_ = None if family is None else family.family
        self.covariances_ = None if family is None else family.covariances
        if self.labelling == "consensus":
            self.site_weights_ = self.site_variances_ = None
            self.labels_ = [None if m is None else m[assign_labels(X, centres[m])]
                            for X, m in zip(data, self.site_mapping_)]
        elif family is not None:
            self.site_variances_ = None
            self.site_weights_ = [None if m is None else site_mixture_weights(X, centres, family.covariances)
                                  for X, m in zip(data, self.site_mapping_)]
            self.labels_ = [None if w is None else family_labels(X, centres, family.covariances, w)
                            for X, w in zip(data, self.site_weights_)]
        else:
            centres = self._adapted_labels(data, centres)
        self.n_clusters_ = centres.shape[0]
        self.means_ = server.in_data_units(centres)
        self.site_means_ = [None if m is None else self.means_[m] for m in self.site_mapping_]
        self.weights_, self.covariance_ = _global_mixture(data, self.labels_, centres)
        if family is not None:  # the family's clusters are their pooled moments: their masses weigh them
            self.weights_, self.covariance_ = family.weights, None
        self.upsilon_ = server.upsilon
        self.tuning_ = server.tuning
        self.k_support_ = server.k_support
        self.privacy_ = None if server.privacy is None else server.privacy.record()
        self.feature_scale_spread_ = server.feature_scale_spread
        self.cluster_anisotropy_ = server.cluster_anisotropy
        self.history_ = server.history
        self.rejected_ = server.rejected

    def _adapted_labels(self, data: list[np.ndarray], centres: np.ndarray) -> np.ndarray:
        """Label each site's points by its own mixture over the global ``centres``; the global clusters that hold points.

        A global cluster that no site's mixture gives a point (the centre of one site's component fitted
        between two clusters the other sites resolve, say) is no cluster of the data: it is dropped, and
        the sites' mixtures refitted over the rest, until every global cluster holds points (issue 44:
        ``n_clusters_`` counted 5 where ``labels_`` used 4 ids). A site component that had joined a dropped
        cluster is mapped, in ``site_mapping_``, to the nearest global centre that remains.
        Sets ``labels_``, ``site_weights_``, ``site_variances_`` and ``site_mapping_``; returns the kept centres.
        """
        model = geometry(self.covariance_type)
        kept = np.arange(centres.shape[0])
        while True:
            mixtures = [None if m is None else model.site_mixture(X, centres[kept])
                        for X, m in zip(data, self.site_mapping_)]
            labels = [None if mix is None else model.site_labels(X, centres[kept], *mix) for X, mix in zip(data, mixtures)]
            used = np.unique(np.concatenate([y for y in labels if y is not None] or [np.arange(kept.size)]))
            if used.size == kept.size:
                break
            kept = kept[used]
        # Each former global id to its kept index: its own, or the nearest kept centre's.
        renumbered = assign_labels(centres, centres[kept])
        self.site_mapping_ = [None if m is None else renumbered[m] for m in self.site_mapping_]
        self.site_weights_ = [None if mix is None else mix[0] for mix in mixtures]
        self.site_variances_ = [None if mix is None else mix[1] for mix in mixtures]
        self.labels_ = labels
        return centres[kept]


def _labels_in_row_order(site_labels: list, rows: list[np.ndarray]) -> np.ndarray:
    """The sites' labels as one array in the order of the rows of scikit-learn's one ``X`` (-1: a site left out)."""
    labels = np.full(sum(index.size for index in rows), -1, dtype=np.int64)
    for index, site in zip(rows, site_labels):
        if site is not None:
            labels[index] = site
    return labels


# The global mixture of predict_proba and score_samples (docs/ALGORITHMS.md section 2.12) is
# estimated and evaluated in these two functions alone, so that another covariance model changes only them.
def _global_mixture(data: list[np.ndarray], labels: list[np.ndarray | None],
                    means: np.ndarray) -> tuple[np.ndarray, float]:
    """The weights and the one variance of the global mixture, from the sites' labelled points.

    Parameters
    ----------
    data : list of ndarray of shape (n_samples_g, n_features)
    labels : list of ndarray of shape (n_samples_g,) or None
        Each site's global cluster ids; None: the site counts in neither.
    means : ndarray of shape (n_clusters, n_features)

    Returns
    -------
    weights : ndarray of shape (n_clusters,)
        Each cluster's share of the points, each counting at least one point.
    variance : float
        The maximum-likelihood variance around the assigned centres, floored as
        :func:`fedica.fedgem.selection.log_likelihoods` floors a site's.
    """
    labelled = [(X, y) for X, y in zip(data, labels) if y is not None]
    counts = np.zeros(means.shape[0])
    squared_distances = 0.0
    for X, y in labelled:
        counts += np.bincount(y, minlength=means.shape[0])
        residual = X - means[y]
        squared_distances += float(np.einsum("nd,nd->", residual, residual))
    n, d = counts.sum(), means.shape[1]
    # The floor's spread, the pooled points' mean per-feature variance, site by site (no copy of all points).
    pooled_mean = sum(X.sum(axis=0) for X, _ in labelled) / n
    spread = sum(float(np.square(X - pooled_mean).sum()) for X, _ in labelled) / (n * d)
    floor = VARIANCE_FLOOR * max(spread, np.finfo(float).tiny)
    counted = np.maximum(counts, 1)
    return counted / counted.sum(), float(max(squared_distances / (n * d), floor))


def _log_weighted_densities(X: np.ndarray, means: np.ndarray, weights: np.ndarray, variance: float) -> np.ndarray:
    """``log weights_k + log N(x; means_k, variance * I)`` per row ``x`` of ``X``, shape (n_samples, n_clusters)."""
    d = X.shape[1]
    log_normaliser = -0.5 * d * np.log(2.0 * np.pi * variance)
    return np.log(weights) + log_normaliser - cdist(X, means, "sqeuclidean") / (2.0 * variance)
