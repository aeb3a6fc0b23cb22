"""``fedica.RFICA``: one-shot robust federated ICA on the user's own arrays, one array per site."""

from __future__ import annotations

import os
from numbers import Integral

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from fedica.sites import ClientData
from fedica.parameters import RFICA_PARAMETERS
from fedica.persistence import SaveLoadMixin, check_array, read_result
from fedica.protocol import ArraySite, ClientTasks, InMemoryFederation, Reply
from fedica.protocol.messages import COLUMN_VARIANCES_KEY
from fedica.rfica import client as rfica_client
from fedica.rfica.coordinator import (
    RFICAState,
    aggregate_estimates,
    explained_variance_record,
    receive_estimates,
    rfica_protocol,
)
from fedica.rfica.mne_ica import fitted_mne_ica
from fedica.rfica.privacy import check_covered, private_mixing_reply
from fedica.validation import check_columns, check_seed, fit_sites

_P = RFICA_PARAMETERS  # short, for the signature below

# What the estimator's in-memory sites answer: RF-ICA's own tasks, each reply through the privacy step (which
# changes nothing unless dp_epsilon is set); no hostile-client transform, which belongs to the experiments' runs.
SITE_TASKS = ClientTasks(handlers=rfica_client.TASKS, transforms=(private_mixing_reply,),
                         concurrent=rfica_client.CONCURRENT_TASKS)


class RFICA(SaveLoadMixin, TransformerMixin, BaseEstimator):
    """Robust federated ICA: a local ICA per site, then a robust one-shot aggregation.

    Every site estimates the mixing matrix of its own observations with symmetric FastICA
    or Picard (with ``n_components``, in a subspace of its channels: the federation's robust
    one or its own, docs/ALGORITHMS.md section 1.8);
    the server aligns the signs of all estimates' columns to a benchmark site, clusters all
    columns with k-means (by default then refined so that every site has one column in each
    cluster) and takes each cluster's geometric median, so that up to half of the sites may be
    poor or corrupt (docs/ALGORITHMS.md section 1). This runs, in memory,
    exactly the protocol that fedica's Flower strategy runs over a network.

    The parameters' defaults and rules are declared in :data:`fedica.parameters.RFICA_PARAMETERS`;
    ``fit`` and ``aggregate`` check them all before any work.

    ``save(path)`` and ``RFICA.load(path)`` keep a fitted estimator in a portable ``.npz`` file
    (:mod:`fedica.persistence`); ``RFICA.from_result(path)`` rebuilds one from a run's ``result.json``.

    Parameters
    ----------
    contrast : {"logcosh", "cube"}, default="logcosh"
        The local ICA's contrast: ``"logcosh"`` (robust to outliers; half the error of the cube on
        every measured workload) or the paper's kurtosis criterion ``"cube"``.
    init : {"random", "shared"}, default="random"
        Each site's own random FastICA start, or one start shared by all (paper appendix D).
    local_solver : {"picard", "fastica"}, default="picard"
        The sites' ICA: python-picard's orthogonal Picard (Picard-O, the solver of MNE's ICA; it
        converges on the noisy sites where FastICA reaches its iterations), or scikit-learn's
        symmetric FastICA (the paper's).
    n_components : int, float or None, default=None
        The components estimated: a count (at most n_features); a float in (0, 1), the share of
        the variance kept (the fewest principal components that keep it, as MNE's ICA counts);
        None: every channel (the paper's protocol).
    whitening : {"federated", "local"} or None, default=None
        How the sites reach the subspace of ``n_components``. ``"federated"``: one more exchange,
        in which every site sends its channel covariance and the server sends back one whitening
        formed robustly (the geometric median of the trace-normalised covariances); ``"local"``:
        every site its own top principal subspace (one exchange, as the paper's). None:
        federated when ``n_components`` is set, local otherwise.
    benchmark : {"medoid", "largest", "best_objective"}, default="medoid"
        The site the others' signs are aligned to: the medoid of the estimates (no number a site
        reports decides it), the largest claimed sample count (the paper's), or the smallest
        k-means objective. Degenerate estimates (rank-deficient, near-parallel columns, conditioned
        far beyond the other sites') are refused first, listed in ``rejected_``.
    kmeans_restarts : int, default=10
    gm_tol : float, default=1e-10
        Tolerance of the geometric median.
    clustering : {"matched", "kmeans"}, default="matched"
        The server's clustering of all sites' columns: k-means refined so that every site has
        exactly one column in each cluster (docs/ALGORITHMS.md section 1.4.1), or the paper's
        ``"kmeans"``.
    center : {"trimmed_mean", "trimmed_geometric_median", "geometric_median"}, default="trimmed_mean"
        Each cluster's centre (a column of ``mixing_``): the mean of its members within the
        cluster's own spread of its geometric median (docs/ALGORITHMS.md section 1.4.2; never
        more than half of a cluster is left out), the geometric median re-taken from those members,
        or the paper's plain geometric median.
    min_clients : int, default=2
    random_state : int, default=0
        Seeds every random stream; the same seed, data and parameters give the same result as ``fedica-run``,
        whose defaults are these.
    dp_epsilon : float or None, default=None
        Differential privacy of each site's one release, per site (docs/ALGORITHMS.md section 1.9):
        every site sends its estimate's unit columns plus Gaussian noise calibrated so that the
        release is ``(dp_epsilon, dp_delta)``-private for the site's whole data, and declares one
        sample. Needs ``whitening="local"`` with ``n_components`` (a count, not a share) and a
        benchmark other than ``"largest"``. None: no noise, every result as without it, bit for bit.
    dp_delta : float, default=1e-5
    refine_rounds : int, default=20
        After the one-shot aggregate, at most this many steps of FastICA's fixed point on the
        federation's data, one exchange each (docs/ALGORITHMS.md section 1.10): every site sends
        averages over its samples at the current estimate, the server combines them robustly (a
        site whose averages stand far beyond the others' is set aside) and steps; it stops once
        converged (typically 3 to 10 steps). It brings the estimate to the pooled FastICA's
        accuracy where the sites' own estimates fall short. 0: the paper's one-shot protocol. Only :meth:`fit` refines (:meth:`aggregate` has no data).

    n_jobs : int or None, default=None
        Threads on which the sites compute their ICA and refinement averages, as scikit-learn
        reads it (None: one; -1: every core). A site's work is numpy's and BLAS's, which release
        Python's lock, so the sites run side by side on the cores; the result is the same, bit for
        bit, for every value (:mod:`fedica.concurrency`).

    Attributes
    ----------
    mixing_ : ndarray of shape (n_features, n_components_)
        The aggregated mixing matrix A (observations ~ sources @ A.T), unit-norm columns.
    components_ : ndarray of shape (n_components_, n_features)
        The unmixing matrix, the pseudo-inverse of ``mixing_``.
    n_components_ : int
        The number of components estimated.
    mean_ : ndarray of shape (n_features,)
        The mean of all sites' observations, weighted by their sizes (removed by ``transform``);
        zeros after ``aggregate``; after ``from_result``, the run's robust centre of the sites' means
        (zeros where the sites sent none).
    site_mixings_ : ndarray of shape (n_sites, n_features, n_components_)
        Each site's own (unit-column) estimate in channel space; with ``dp_epsilon``, its noisy release
        as received (the server aggregates its columns' directions).
    site_column_variances_ : ndarray of shape (n_sites, n_components_) or None
        How well each site sees each of its sources: the variance of each column's direction
        (radians squared, :func:`fedica.rfica.uncertainty.column_variances`), from the site's own data. The
        trimmed centres weigh each column by ``clip(0.01 / variance, 0.1, 1)`` (docs/ALGORITHMS.md
        section 1.13). None when the sites sent none (``center="geometric_median"``, a private fit, or
        :meth:`aggregate` without them).
    site_converged_ : ndarray of shape (n_sites,), dtype bool, or None
        Whether each site's local ICA converged (after one retry from another start when the first
        did not); a warning line names the sites that did not. None after :meth:`aggregate`.
    site_iterations_ : ndarray of shape (n_sites,), dtype int, or None
        The iterations of each site's estimate. None after :meth:`aggregate`.
    whitening_ : ndarray of shape (n_components_, n_features) or None
        The federated whitening the sites received; None without it.
    feature_names_in_ : tuple of str or None
        The channels the sites named, when given as pandas DataFrames (every site the same, in one order);
        a DataFrame given to ``transform`` must name them in that order. None when the sites were arrays.
    channel_scale_spread_ : float
        How far the channels' scales in the sites' estimates are apart (the largest over the median,
        :func:`fedica.rfica.aggregation.channel_scales`); over 10 (a channel in another unit) the
        server compared the sites' columns with each channel divided by its scale, and warned.
    smallest_channel_scale_ : float
        The smallest channel's scale in the sites' estimates over the median's; under .01 (a channel in
        far smaller units) the server compared the columns with each channel divided by its scale, and warned.
    labels_ : ndarray of shape (n_sites, n_features)
        The cluster (column of ``mixing_``) of each column of each site's estimate; with
        ``clustering="matched"`` every row is a permutation of ``range(n_features)``.
    benchmark_site_ : int
    f_ica_, simple_mean_, simple_median_ : ndarray of shape (n_features, n_features)
        The comparators computed from the same estimates (paper section 4).
    one_shot_mixing_ : ndarray of shape (n_features, n_components_)
        The one-shot aggregate before the refinement (``mixing_`` itself without one).
    refinement_ : list of dict
        One entry per refinement step: its ``round``, the ``sites`` averaged and those ``set_aside``, and
        ``change``, the largest turn of an unmixing row (``1 - |cos|``); empty without refinement.
    refinement_reverted_ : list of int
        The columns where the refined value left the spread of the sites' estimates of it, and the
        one-shot column stands (a warning names them).
    noisy_sites_ : list of int
        The sites whose covariance reads them noisy, sensor noise far beyond the other sites'
        (docs/ALGORITHMS.md section 1.10): never averaged in the refinement, and named in a warning
        whether or not the refinement converges. Empty: none, or no refinement.
    explained_variance_ : ndarray of shape (n_components_,) or None
        The variance of the observations each component explains, in the federation's robust channel
        covariance (docs/ALGORITHMS.md section 1.11); the components (columns of ``mixing_``, rows of
        ``components_``) are in decreasing order of it. None when the sites sent no covariance (no
        refinement and no federated whitening, as in the paper's protocol): the columns then follow
        the benchmark site's.
    explained_variance_ratio_ : ndarray of shape (n_components_,) or None
        ``explained_variance_`` over the covariance's trace, the total variance: each component's
        share, as scikit-learn's ``PCA.explained_variance_ratio_``.
    bad_channels_ : dict of int to list of int
        The sites with bad channels and those channels: flat (dead, disconnected or constant: a
        deviation under 1e-12 of the channels' root mean square) or saturated (at least 1 % of the
        samples at the channel's minimum, or at its maximum: clipped at a rail). Such a site estimates its columns on its other
        channels, the server fills the rest from the sites that have them, and the site takes no part
        in the refinement (docs/ALGORITHMS.md section 1.12); one warning names them. Empty: none.
    covariance_ : ndarray of shape (n_features, n_features) or None
        The federation's robust channel covariance (the median trace times the geometric median of
        the sites' trace-normalised covariances, docs/ALGORITHMS.md section 1.8); None when the sites
        sent none.
    privacy_ : dict or None
        A private fit's ``epsilon`` and ``delta`` spent, its noise multiplier and its one exchange
        (:meth:`fedica.privacy.PrivacyPlan.record`); None without ``dp_epsilon``.
    """

    # The defaults are the declaration's (fedica.parameters), spelt out as scikit-learn's get_params reads them.
    def __init__(self, contrast=_P["contrast"].default, init=_P["init"].default,
                 local_solver=_P["local_solver"].default, n_components=_P["n_components"].default,
                 whitening=_P["whitening"].default, benchmark=_P["benchmark"].default,
                 kmeans_restarts=_P["kmeans_restarts"].default, gm_tol=_P["gm_tol"].default,
                 clustering=_P["clustering"].default, center=_P["center"].default,
                 min_clients=_P["min_clients"].default,
                 random_state=_P["random_state"].default, dp_epsilon=_P["dp_epsilon"].default,
                 dp_delta=_P["dp_delta"].default, refine_rounds=_P["refine_rounds"].default,
                 n_jobs=_P["n_jobs"].default):
        self.contrast = contrast
        self.init = init
        self.local_solver = local_solver
        self.refine_rounds = refine_rounds
        self.n_components = n_components
        self.whitening = whitening
        self.benchmark = benchmark
        self.kmeans_restarts = kmeans_restarts
        self.gm_tol = gm_tol
        self.clustering = clustering
        self.center = center
        self.min_clients = min_clients
        self.random_state = random_state
        self.dp_epsilon = dp_epsilon
        self.dp_delta = dp_delta
        self.n_jobs = n_jobs

    def fit(self, X, y=None, *, groups=None) -> RFICA:
        """Run the local ICA on every site, then the robust aggregation.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), or a sequence of them
            scikit-learn's form: one array (or DataFrame) of observations whose rows ``groups``
            assigns to sites; the federation's form: one array per site, the same channels
            everywhere. Any memory order (a C- or an F-ordered array gives the same result).
        y : None
            Ignored (scikit-learn's convention).
        groups : array-like of shape (n_samples,), default=None
            With one array ``X``: each row's site (any labels, as scikit-learn's ``GroupKFold`` takes
            them; the sites in their sorted order). None: one site, a federation of one.

        Returns
        -------
        self : RFICA
        """
        RFICA_PARAMETERS.check(self.get_params())  # before any work: a mistake is one line naming the argument
        check_covered(self.get_params())
        data, _ = fit_sites(self, X, groups, min_rows=lambda d: d + 1)
        if isinstance(self.n_components, Integral) and self.n_components > data[0].shape[1]:
            raise ValueError(f"n_components={self.n_components}: must be at most the {data[0].shape[1]} features")
        state = self._state(data[0].shape[1], len(data))
        sites = {g: ArraySite(ClientData(X, None, X[:0], None, 1), g) for g, X in enumerate(data)}
        InMemoryFederation(sites, SITE_TASKS, state.rejected, n_jobs=self.n_jobs).run(rfica_protocol(state))
        sizes = np.array([X.shape[0] for X in data], dtype=float)
        self.mean_ = np.average([X.mean(axis=0) for X in data], axis=0, weights=sizes)
        return self._store(state)

    def aggregate(self, local_mixings, n_samples=None, column_variances=None) -> RFICA:
        """The server step alone, on mixing matrices the sites estimated themselves.

        Parameters
        ----------
        local_mixings : array-like of shape (n_sites, n_features, n_components)
            Each site's mixing estimate in channel space.
        n_samples : array-like of shape (n_sites,), optional
            Each site's sample count (the benchmark rules "largest" and "best_objective" use it); default: all equal.
        column_variances : array-like of shape (n_sites, n_components), optional
            The variance of each estimated column's direction, as the sites measured it
            (``site_column_variances_`` of a fit; :func:`fedica.rfica.uncertainty.column_variances`): the
            trimmed centres weigh each column by it. Default: every column counts once.

        Returns
        -------
        self : RFICA
        """
        RFICA_PARAMETERS.check(self.get_params())
        if self.dp_epsilon is not None:
            raise ValueError(f"dp_epsilon={self.dp_epsilon!r}: aggregate() takes estimates the sites already released; "
                             "the noise is added by fit()'s sites")
        stack = np.asarray(local_mixings, dtype=np.float64)
        if stack.ndim != 3 or stack.shape[2] > stack.shape[1]:
            raise ValueError(f"local_mixings must have shape (n_sites, n_features, n_components), n_components <= "
                             f"n_features, got {stack.shape}")
        sizes = np.ones(stack.shape[0], dtype=np.int64) if n_samples is None else np.asarray(n_samples)
        if sizes.shape != (stack.shape[0],) or sizes.dtype.kind not in "iu" or np.any(sizes < 1):
            raise ValueError(f"n_samples={n_samples!r}: must be one positive integer count per site "
                             f"({stack.shape[0]} sites)")
        state = self._state(stack.shape[1], stack.shape[0])
        state.components = stack.shape[2]
        variances = None if column_variances is None else np.asarray(column_variances, dtype=np.float64)
        if variances is not None and variances.shape != stack.shape[::2]:
            raise ValueError(f"column_variances must have shape {stack.shape[::2]} (one per site and component), got "
                             f"{variances.shape}")
        replies = [Reply(g, {"mixing": m} if variances is None else {"mixing": m, COLUMN_VARIANCES_KEY: variances[g]},
                         {"n-samples": int(n)}) for g, (m, n) in enumerate(zip(stack, sizes))]
        receive_estimates(state, replies)
        if not state.estimates:
            raise ValueError("local_mixings: no estimate left to aggregate ("
                             + "; ".join(f"site {entry['client']}: {entry['reason']}" for entry in state.rejected) + ")")
        aggregate_estimates(state)
        self.mean_ = np.zeros(stack.shape[1])
        self.feature_names_in_ = None
        return self._store(state)

    _PARAMETERS = RFICA_PARAMETERS
    _FITTED_ATTRIBUTES = frozenset({
        "mixing_", "components_", "mean_", "n_components_", "one_shot_mixing_", "simple_median_", "simple_mean_",
        "f_ica_", "site_mixings_", "site_column_variances_",
        "labels_", "benchmark_site_", "whitening_", "refinement_", "refinement_reverted_", "rejected_", "privacy_",
        "site_converged_", "site_iterations_", "channel_scale_spread_", "smallest_channel_scale_", "n_features_in_",
        "feature_names_in_", "explained_variance_", "explained_variance_ratio_", "covariance_",
        "bad_channels_", "noisy_sites_"})

    def _check_fitted(self) -> None:
        """What ``transform`` and ``inverse_transform`` read, checked after :meth:`load`."""
        mixing = check_array(getattr(self, "mixing_", None), "mixing_", ndim=2)
        n_features, n_sources = mixing.shape
        check_array(getattr(self, "components_", None), "components_", ndim=2, shape=(n_sources, n_features))
        check_array(getattr(self, "mean_", None), "mean_", ndim=1, shape=(n_features,))
        if getattr(self, "n_features_in_", None) not in (None, n_features):
            raise ValueError(f"n_features_in_={self.n_features_in_!r}, but mixing_ has {n_features} rows")
        if getattr(self, "n_components_", n_sources) != n_sources:
            raise ValueError(f"n_components_={self.n_components_!r}, but mixing_ has {n_sources} columns")

    def transform(self, X) -> np.ndarray:
        """The sources of observations ``X``, shape (n_samples, n_features)."""
        check_is_fitted(self, "components_")
        check_columns(X, getattr(self, "feature_names_in_", None))  # None in an estimator saved before it
        X = validate_data(self, X, dtype=np.float64, reset=False)
        if X.shape[1] != self.components_.shape[1]:  # an estimator rebuilt from a result names no width
            raise ValueError(f"X must have shape (n_samples, {self.components_.shape[1]}), got {X.shape}")
        return (X - self.mean_) @ self.components_.T

    def inverse_transform(self, S) -> np.ndarray:
        """The observations of sources ``S``: ``S @ mixing_.T + mean_``.

        Parameters
        ----------
        S : array-like of shape (n_samples, n_components)
            ``n_components`` is ``mixing_.shape[1]``, the number of sources.

        Returns
        -------
        X : ndarray of shape (n_samples, n_features)
        """
        check_is_fitted(self, "mixing_")
        S = np.asarray(S, dtype=np.float64)
        if S.ndim != 2 or S.shape[1] != self.mixing_.shape[1]:
            raise ValueError(f"S must have shape (n_samples, {self.mixing_.shape[1]}), got {S.shape}")
        return S @ self.mixing_.T + self.mean_

    def to_mne(self, info):
        """The estimate as a fitted ``mne.preprocessing.ICA`` (needs the ``eeg`` extra).

        MNE's tools then work on the federation's model: ``plot_components`` (topomaps, with a
        montage in ``info``), ``plot_sources``, ``plot_properties(raw)``, ``get_sources(raw)``,
        ``apply(raw, exclude=[...])`` (which keeps what lies outside the components' span) and
        ``save``. Its sources are :meth:`transform`'s, ``ICA000`` the component explaining the most
        variance when ``explained_variance_`` is known.

        Parameters
        ----------
        info : mne.Info
            The recordings' measurement info (``raw.info``): with ``feature_names_in_`` (sites given as
            DataFrames named by channel) it must hold those channels, in any order; otherwise exactly
            the fitted channels, in the fitted order.

        Returns
        -------
        ica : mne.preprocessing.ICA
            Fitted (``current_fit="raw"``), ``pca_mean_`` this ``mean_``.
        """
        check_is_fitted(self, "mixing_")
        names = getattr(self, "feature_names_in_", None)
        return fitted_mne_ica(self.mixing_, self.mean_, info, channel_names=None if names is None else list(names),
                              covariance=getattr(self, "covariance_", None), method=self.local_solver)

    @classmethod
    def paper(cls, **params) -> RFICA:
        """RF-ICA as the paper runs it: the preset ``algorithm=rfica_paper`` of ``fedica-run``.

        FastICA with the kurtosis contrast at every site, k-means over every site's columns, each
        cluster's plain geometric median and no refinement (the values ``paper=`` in
        :data:`fedica.parameters.RFICA_PARAMETERS`); ``params`` set any parameter besides.

        Returns
        -------
        estimator : RFICA
            Unfitted.
        """
        return cls(**{**RFICA_PARAMETERS.paper_preset(), **params})

    @classmethod
    def from_result(cls, path: str | os.PathLike) -> RFICA:
        """The fitted estimator of an RF-ICA run's ``result.json`` (``fedica-run algorithm=rfica``).

        The parameters are the run's ``config.algorithm`` keys the estimator has, ``random_state``
        its ``seed`` and ``min_clients`` its ``min_clients``. From the result's ``rfica`` section
        come ``mixing_`` (``estimate``), ``components_`` (``unmixing``), ``benchmark_site_``
        (``benchmark_client``, a partition id) and ``f_ica_``, ``simple_mean_``, ``simple_median_``
        (``estimates``); ``rejected_`` from the result's ``clients``; ``explained_variance_`` and
        ``explained_variance_ratio_``. ``mean_`` is the result's ``mean``, the geometric median of the
        sites' channel means, which they send beside their covariances (the refinement's or the
        federated whitening's exchange), so ``transform`` centres new observations. A run whose sites
        sent no covariance (the paper's one-shot protocol, a private run) sent no mean either: ``mean_``
        is then zeros and ``transform`` does not centre; pass observations with their site's mean
        removed (as the run's ``sources_site<g>.csv`` are computed). ``site_mixings_`` and ``labels_``
        stay with the run (the result holds neither): None.

        Parameters
        ----------
        path : str or os.PathLike

        Returns
        -------
        estimator : RFICA

        Raises
        ------
        ValueError
            One line naming the file: not a result, a stopped run's ``partial_result.json``, a
            FedGEM result, or a key missing.
        """
        result, params = read_result(path, "rfica", RFICA_PARAMETERS,
                                     ("estimate", "unmixing", "benchmark_client", "estimates"))
        section = result["rfica"]
        model = cls(**params)
        model.mixing_ = np.asarray(section["estimate"], dtype=np.float64)
        model.components_ = np.asarray(section["unmixing"], dtype=np.float64)
        # The sites' robust centre where they sent their means (beside their covariances); a run whose sites sent
        # none (the paper's one-shot protocol, a private run) leaves its sources uncentred, as its files were.
        model.mean_ = (np.zeros(model.mixing_.shape[0]) if section.get("mean") is None
                       else np.asarray(section["mean"], dtype=np.float64))
        model.site_mixings_ = model.labels_ = None
        model.benchmark_site_ = int(section["benchmark_client"])
        model.f_ica_, model.simple_mean_, model.simple_median_ = (
            np.asarray(section["estimates"][name], dtype=np.float64)
            for name in ("f-ica", "simple-mean", "simple-median"))
        model.rejected_ = result["clients"]["rejected"]
        model.privacy_ = result.get("privacy")
        model.channel_scale_spread_ = section.get("channel_scale_spread")  # None in a result written before it
        model.feature_names_in_ = None  # a run's channels are its files' or its scenario's, not named here
        model.smallest_channel_scale_ = section.get("smallest_channel_scale")
        model.bad_channels_ = {int(g): channels for g, channels in section.get("bad_channels", {}).items()}
        model.covariance_ = None if section.get("covariance") is None else np.asarray(section["covariance"], dtype=np.float64)
        model.explained_variance_, model.explained_variance_ratio_ = (
            None if section.get(key) is None else np.asarray(section[key], dtype=np.float64)
            for key in ("explained_variance", "explained_variance_ratio"))  # None in a result written before them
        return model

    def _state(self, r: int, n_sites: int) -> RFICAState:
        return RFICAState(contrast=self.contrast, init=self.init, local_solver=self.local_solver,
                          n_components=self.n_components, whitening=self.whitening, benchmark=self.benchmark,
                          kmeans_restarts=self.kmeans_restarts, gm_tol=self.gm_tol, clustering=self.clustering,
                          center=self.center, dp_epsilon=self.dp_epsilon, dp_delta=self.dp_delta,
                          refine_rounds=self.refine_rounds, seed=check_seed(self.random_state),
                          # The sites are all here: a federation of fewer than min_clients is the caller's.
                          min_clients=min(self.min_clients, n_sites), r=r)

    def _store(self, state: RFICAState) -> RFICA:
        agg = state.aggregate
        self.mixing_ = agg.rf_ica
        self.components_ = np.linalg.pinv(agg.rf_ica)
        self.n_components_ = agg.rf_ica.shape[1]
        self.site_mixings_ = np.stack(state.estimates)
        reported = all(variances is not None for variances in state.column_variances)
        self.site_column_variances_ = np.stack(state.column_variances) if reported else None
        told = all(c is not None for c in state.converged)
        self.site_converged_ = np.array(state.converged, dtype=bool) if told else None
        self.site_iterations_ = np.array(state.n_iter, dtype=np.int64) if told else None
        self.whitening_ = state.whitening_matrix
        self.channel_scale_spread_ = state.channel_scale_spread
        self.smallest_channel_scale_ = state.smallest_channel_scale
        self.labels_ = agg.labels
        self.benchmark_site_ = state.partitions[agg.benchmark]
        self.f_ica_, self.simple_mean_, self.simple_median_ = agg.f_ica, agg.simple_mean, agg.simple_median
        self.rejected_ = state.rejected
        self.privacy_ = None if state.privacy is None else state.privacy.record()
        self.one_shot_mixing_ = agg.rf_ica if state.one_shot_mixing is None else state.one_shot_mixing
        self.refinement_ = state.refinement
        self.refinement_reverted_ = state.refinement_reverted
        self.noisy_sites_ = state.noisy_sites
        self.explained_variance_, self.explained_variance_ratio_ = explained_variance_record(state)
        self.covariance_ = state.global_covariance
        self.bad_channels_ = dict(state.bad_channels)
        return self

