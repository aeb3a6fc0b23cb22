"""In-process comparators for FedGEM, run on the same client data (FedGEM paper, section 6 and appendix D.3).

Each is a clearly named comparator, never a fallback: central GMM and DP-GMM pool the clients' training data
(they are centralised references); k-FED and FedKmeans are one-shot federated k-means variants whose clients
send only local centres (and, for FedKmeans, their counts); FFCM-avg1/avg2 (:mod:`fedica.evaluation.ffcm`) and
AFCL (:mod:`fedica.evaluation.afcl`) are iterative federated protocols, a server generator of requests answered
over a transport or in memory (:func:`fedica.evaluation.comparison.run_protocol`). Every baseline returns the predicted global cluster id of every
client's test points, the number of clusters receiving test points, and its own fitting time (client and
server work, not prediction or evaluation).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from sklearn.cluster import KMeans
from sklearn.mixture import BayesianGaussianMixture, GaussianMixture
from threadpoolctl import threadpool_limits

from fedica.sites import ClientData
from fedica.data.scenarios import scenario_client_data, true_n_clusters
from fedica.evaluation.afcl import afcl
from fedica.evaluation.comparison import BaselineResult, baseline_result, check_clients, run_seed
from fedica.evaluation.ffcm import ffcm
from fedica.fedgem.local import choose_n_components
from fedica.metrics import (
    adjusted_rand,
    ari_from_contingency,
    contingency,
    k_hat_from_predictions,
    silhouette,
    weighted_local_ari,
    weighted_mean,
)
from fedica.protocol import ProtocolDriver
from fedica.seeding import sklearn_seed

__all__ = ["BASELINE_METHODS", "CENTRAL_GMM_METHODS", "FILE_METHODS", "BaselineResult", "central_gmm", "central_gmm_bic", "central_gmm_icl", "dp_gmm",
           "dp_gmm_truncation", "evaluate_clustering", "fed_kmeans", "k_fed", "run_baselines", "run_seed"]

# The names baseline_methods selects.
BASELINE_METHODS = ("central-gmm", "central-gmm-icl", "central-gmm-bic", "dp-gmm", "k-fed", "fed-kmeans", "ffcm-avg1",
                    "ffcm-avg2", "afcl")
# The comparators fitted on the pooled training points (K told, chosen by the ICL, or family and K chosen by the BIC),
# each reporting its BIC there (pooled_bic), beside which FedGEM's mixture is scored on the same points.
CENTRAL_GMM_METHODS = ("central-gmm", "central-gmm-icl", "central-gmm-bic")
# Those that run on scenario=files: the central GMMs on the pooled files, the references a user compares with.
FILE_METHODS = CENTRAL_GMM_METHODS

# central-gmm-bic: the statistician's choice on the pooled data (issue 44's yardstick), scikit-learn's covariance
# types and K from 1 to this many (also at most sqrt(n / 2)), as mclust compares models.
CENTRAL_BIC_COVARIANCE_TYPES = ("spherical", "diag", "full")
CENTRAL_BIC_MAX_COMPONENTS = 10

# central-gmm-icl: the most components the ICL compares on the pooled data (also at most sqrt(n / 2)).
CENTRAL_ICL_MAX_COMPONENTS = 20

# DP-GMM's default truncation never drops below this many components (see dp_gmm_truncation).
DP_GMM_MIN_TRUNCATION = 25

# evaluate_clustering computes a silhouette on at most this many test points: its cost is quadratic, and with
# 2,000 points its sampling error (about .005) is far below the differences between methods.
SILHOUETTE_MAX_POINTS = 2_000

log = logging.getLogger("fedica.baselines")


def _pooled_train(clients: Sequence[ClientData]) -> np.ndarray:
    return np.concatenate([c.X_train for c in clients])


def central_gmm(clients: Sequence[ClientData], n_clusters: int, *, n_init: int = 3, max_iter: int = 100,
                random_state=None) -> BaselineResult:
    """Centralised GMM with known K on the pooled training data (the paper's strongest reference).

    ``GaussianMixture(covariance_type="spherical", init_params="k-means++")``, best of ``n_init``
    initialisations (the paper: best of 3 k-means++ starts).

    Parameters
    ----------
    clients : sequence of ClientData
    n_clusters : int
        The true K.
    n_init : int
    max_iter : int
    random_state : int, numpy.random.Generator or None

    Returns
    -------
    BaselineResult
        ``info["pooled_bic"]`` is the model's BIC on the pooled training points.
    """
    check_clients(clients, "central-gmm")
    rng = np.random.default_rng(random_state)
    model = GaussianMixture(n_components=n_clusters, covariance_type="spherical", init_params="k-means++",
                            n_init=n_init, max_iter=max_iter, random_state=sklearn_seed(rng))
    X = _pooled_train(clients)
    start = time.perf_counter()
    model.fit(X)
    seconds = time.perf_counter() - start
    return baseline_result("central-gmm", [model.predict(c.X_test) for c in clients], seconds,
                           {"pooled_bic": float(model.bic(X))})


def central_gmm_icl(clients: Sequence[ClientData], *, max_components: int = CENTRAL_ICL_MAX_COMPONENTS,
                    n_init: int = 3, max_iter: int = 100, random_state=None) -> BaselineResult:
    """Centralised spherical GMM whose K the ICL chooses on the pooled training data (K unknown).

    K is chosen by :func:`fedica.fedgem.local.choose_n_components`, the criterion a FedGEM site uses
    for its own K_g, on all sites' training points pooled (1 to ``min(max_components, sqrt(n / 2))``
    components); then the model is fitted as :func:`central_gmm` with that K.

    Parameters
    ----------
    clients : sequence of ClientData
    max_components : int
    n_init : int
    max_iter : int
    random_state : int, numpy.random.Generator or None

    Returns
    -------
    BaselineResult
        ``info["k_chosen"]`` is the chosen K; ``info["pooled_bic"]`` the model's BIC on the pooled training points.
    """
    check_clients(clients, "central-gmm-icl")
    rng = np.random.default_rng(random_state)
    X = _pooled_train(clients)
    start = time.perf_counter()
    k = choose_n_components(X, max_components, random_state=sklearn_seed(rng)).n_components
    model = GaussianMixture(n_components=k, covariance_type="spherical", init_params="k-means++",
                            n_init=n_init, max_iter=max_iter, random_state=sklearn_seed(rng)).fit(X)
    seconds = time.perf_counter() - start
    return baseline_result("central-gmm-icl", [model.predict(c.X_test) for c in clients], seconds,
                           {"k_chosen": k, "pooled_bic": float(model.bic(X))})


def central_gmm_bic(clients: Sequence[ClientData], *, max_components: int = CENTRAL_BIC_MAX_COMPONENTS,
                    n_init: int = 3, max_iter: int = 100, random_state=None) -> BaselineResult:
    """Centralised GMM whose covariance type and K the BIC choose on the pooled training data: what a statistician runs.

    Every :data:`CENTRAL_BIC_COVARIANCE_TYPES` and K from 1 to ``min(max_components, sqrt(n / 2))`` is fitted
    once (``GaussianMixture``, k-means++ start, one seed for all), and the smallest ``bic`` wins; the winner
    is refitted with the best of ``n_init`` starts. The yardstick "federated equals central" measures FedGEM's
    default against (issue 44): not told K, not told the family.

    Parameters
    ----------
    clients : sequence of ClientData
    max_components : int
    n_init : int
    max_iter : int
    random_state : int, numpy.random.Generator or None

    Returns
    -------
    BaselineResult
        ``info["k_chosen"]`` and ``info["covariance_type"]`` are the choice; ``info["pooled_bic"]`` the model's BIC
        on the pooled training points, the criterion it chose by.
    """
    check_clients(clients, "central-gmm-bic")
    rng = np.random.default_rng(random_state)
    X = _pooled_train(clients)
    seed = sklearn_seed(rng)
    start = time.perf_counter()
    upper = max(1, min(int(max_components), math.isqrt(X.shape[0] // 2)))
    scores = {(family, k): GaussianMixture(k, covariance_type=family, init_params="k-means++", max_iter=max_iter,
                                           random_state=seed).fit(X).bic(X)
              for family in CENTRAL_BIC_COVARIANCE_TYPES for k in range(1, upper + 1)}
    family, k = min(scores, key=scores.get)
    model = GaussianMixture(k, covariance_type=family, init_params="k-means++", n_init=n_init, max_iter=max_iter,
                            random_state=sklearn_seed(rng)).fit(X)
    seconds = time.perf_counter() - start
    return baseline_result("central-gmm-bic", [model.predict(c.X_test) for c in clients], seconds,
                           {"k_chosen": k, "covariance_type": family, "pooled_bic": float(model.bic(X))})


def dp_gmm_truncation(clients: Sequence[ClientData]) -> int:
    """DP-GMM's default truncation level: ``min(sum_g K_g, max(2 max_g K_g, DP_GMM_MIN_TRUNCATION))``.

    ``sum_g K_g`` is the paper's upper bound on K (appendix D.3), but the fit's cost grows linearly with the
    truncation (100 clients x 490 points, d=10: 588 components took 17 min, 25 take 20 s). Fewer components
    only shorten the stick-breaking approximation of the same prior; the cap keeps at least
    :data:`DP_GMM_MIN_TRUNCATION`, and twice the largest K_g, which exceeds K whenever some client holds at
    least half of the clusters. Federations with ``sum_g K_g`` below the cap are fitted as in the paper.
    """
    total = sum(int(c.n_components) for c in clients)
    largest = max(int(c.n_components) for c in clients)
    return min(total, max(2 * largest, DP_GMM_MIN_TRUNCATION))


def dp_gmm(clients: Sequence[ClientData], *, max_components: int | None = None, covariance_type: str = "full",
           init_params: str = "k-means++", max_iter: int = 100, random_state=None) -> BaselineResult:
    """Centralised Dirichlet-process GMM (unknown K) on the pooled training data.

    ``BayesianGaussianMixture(weight_concentration_prior_type="dirichlet_process")`` truncated at
    ``max_components``, by default :func:`dp_gmm_truncation` (``sum_g K_g``, the paper's upper bound on K,
    capped for cost). Its K_hat counts the components that receive test points.

    Parameters
    ----------
    clients : sequence of ClientData
    max_components : int or None
        Truncation level; None means :func:`dp_gmm_truncation`.
    covariance_type : {"full", "tied", "diag", "spherical"}
        scikit-learn's default ("full") unless set. ("diag" is 3x faster on the 100-client blobs but halves
        the ARI on Waveform, whose features are correlated.)
    init_params : str
        scikit-learn's initialisation; "k-means++" (seeds only, as the central GMM) rather than its default
        "kmeans", which on both Waveform and the 100-client blobs measured a lower ARI and, with many
        components, a longer fit.
    max_iter : int
    random_state : int, numpy.random.Generator or None

    Returns
    -------
    BaselineResult
        ``info["truncation"]`` is the truncation level used.
    """
    check_clients(clients, "dp-gmm")
    rng = np.random.default_rng(random_state)
    n_components = dp_gmm_truncation(clients) if max_components is None else int(max_components)
    X = _pooled_train(clients)
    n_components = min(n_components, len(X))
    model = BayesianGaussianMixture(n_components=n_components, covariance_type=covariance_type,
                                    weight_concentration_prior_type="dirichlet_process", init_params=init_params,
                                    max_iter=max_iter, random_state=sklearn_seed(rng))
    # The variational updates make many small (d x d) BLAS calls, where thread start-up dominates: one BLAS
    # thread measured 9x faster than two on generated Waveform (21-D, 3500 points), 2x on the 100-client blobs.
    with threadpool_limits(limits=1, user_api="blas"):
        start = time.perf_counter()
        model.fit(X)
        seconds = time.perf_counter() - start
        return baseline_result("dp-gmm", [model.predict(c.X_test) for c in clients], seconds, {"truncation": n_components})


def _local_kmeans(clients: Sequence[ClientData], n_init: int, rng: np.random.Generator) -> list[KMeans]:
    return [KMeans(n_clusters=c.n_components, n_init=n_init, random_state=sklearn_seed(rng)).fit(c.X_train)
            for c in clients]


def _server_kmeans(local: list[KMeans], n_clusters: int, n_init: int, rng: np.random.Generator,
                   weighted: bool) -> KMeans:
    centres = np.concatenate([model.cluster_centers_ for model in local])
    if len(centres) < n_clusters:
        raise ValueError(f"n_clusters={n_clusters} exceeds the {len(centres)} local centres the server receives")
    weights = (np.concatenate([np.bincount(model.labels_, minlength=model.n_clusters) for model in local])
               if weighted else None)
    return KMeans(n_clusters=n_clusters, n_init=n_init, random_state=sklearn_seed(rng)).fit(centres,
                                                                                     sample_weight=weights)


def k_fed(clients: Sequence[ClientData], n_clusters: int, *, n_init: int = 3, random_state=None) -> BaselineResult:
    """k-FED (Dennis et al. 2021), one shot with known K.

    Every client runs k-means with its K_g and sends its centres; the server runs k-means with K on all local
    centres (unweighted); every client maps each local cluster to the server centre nearest its local centre and
    labels a test point by the mapped id of its nearest local centre.

    Parameters
    ----------
    clients : sequence of ClientData
    n_clusters : int
        The true K.
    n_init : int
        k-means++ starts, locally and at the server.
    random_state : int, numpy.random.Generator or None

    Returns
    -------
    BaselineResult
    """
    check_clients(clients, "k-fed")
    rng = np.random.default_rng(random_state)
    start = time.perf_counter()
    local = _local_kmeans(clients, n_init, rng)
    server = _server_kmeans(local, n_clusters, n_init, rng, weighted=False)
    local_to_global = [server.predict(model.cluster_centers_) for model in local]
    seconds = time.perf_counter() - start
    return baseline_result("k-fed", [mapping[model.predict(c.X_test)]
                    for c, model, mapping in zip(clients, local, local_to_global)], seconds)


def fed_kmeans(clients: Sequence[ClientData], n_clusters: int, *, n_init: int = 3,
               random_state=None) -> BaselineResult:
    """Federated k-means in the style of Garst & Reinders (2024), one shot with known K.

    Every client runs k-means with its K_g and sends its centres with their point counts; the server runs
    k-means with K on the local centres weighted by the counts (``sample_weight``), giving the global model;
    clients label test points by the nearest global centre.

    Parameters
    ----------
    clients : sequence of ClientData
    n_clusters : int
        The true K.
    n_init : int
        k-means++ starts, locally and at the server.
    random_state : int, numpy.random.Generator or None

    Returns
    -------
    BaselineResult
    """
    check_clients(clients, "fed-kmeans")
    rng = np.random.default_rng(random_state)
    start = time.perf_counter()
    local = _local_kmeans(clients, n_init, rng)
    server = _server_kmeans(local, n_clusters, n_init, rng, weighted=True)
    seconds = time.perf_counter() - start
    return baseline_result("fed-kmeans", [server.predict(c.X_test) for c in clients], seconds)


def evaluate_clustering(clients: Sequence[ClientData], test_labels: Sequence[np.ndarray]) -> dict:
    """Score predicted global cluster ids of the clients' test points.

    Parameters
    ----------
    clients : sequence of G ClientData
    test_labels : sequence of G ndarrays, each of shape (m_g,)
        Predicted global cluster ids.

    Returns
    -------
    dict
        ``local_ari``: per-client ARI, averaged with weights N_g = ``len(X_train)``; ``global_ari``: ARI of the
        pooled labels, computed from summed per-client contingency triplets; ``k_hat``: number of global clusters
        receiving test points; ``silhouette``: the silhouette of all clients' test points pooled under the
        predicted ids (FedGEM paper, Table 6), on a deterministic subsample of
        :data:`SILHOUETTE_MAX_POINTS` points when the pool is larger, NaN with fewer than 2 labels;
        ``local_silhouette``: each client's silhouette of its own test points, averaged with weights N_g over
        the clients where it is defined (2 or more labels). Both ARIs are NaN when any client has no test labels.
    """
    if len(test_labels) != len(clients):
        raise ValueError(f"test_labels must have one array per client ({len(clients)}), got {len(test_labels)}")
    for g, (client, labels) in enumerate(zip(clients, test_labels)):
        if np.shape(labels) != (client.X_test.shape[0],):
            raise ValueError(f"test_labels[{g}] must have shape ({client.X_test.shape[0]},), got "
                             f"{np.shape(labels)}")
    pooled_pred = np.concatenate([np.asarray(labels) for labels in test_labels])
    sizes = [client.n_train for client in clients]
    scores = {"local_ari": float("nan"), "global_ari": float("nan"),
              "k_hat": k_hat_from_predictions(pooled_pred, np.ones_like(pooled_pred)),
              "silhouette": silhouette(np.concatenate([c.X_test for c in clients]), pooled_pred,
                                       max_points=SILHOUETTE_MAX_POINTS),
              "local_silhouette": weighted_mean([silhouette(c.X_test, labels, max_points=SILHOUETTE_MAX_POINTS)
                                                 for c, labels in zip(clients, test_labels)], sizes)}
    if any(client.y_test is None for client in clients):
        return scores
    local = [adjusted_rand(client.y_test, labels) for client, labels in zip(clients, test_labels)]
    triplets = [contingency(client.y_test, labels) for client, labels in zip(clients, test_labels)]
    true_values, pred_values, counts = (np.concatenate(parts) for parts in zip(*triplets))
    scores["local_ari"] = weighted_local_ari(local, sizes)
    scores["global_ari"] = ari_from_contingency(true_values, pred_values, counts)
    return scores


def _method_runs(clients: Sequence[ClientData], true_k: int, seed: int, n_init: int, driver: ProtocolDriver | None,
                 partitions: Sequence[int]) -> dict[str, Callable[[], BaselineResult]]:
    return {
        "central-gmm": lambda: central_gmm(clients, true_k, n_init=n_init, random_state=seed),
        "central-gmm-icl": lambda: central_gmm_icl(clients, n_init=n_init, random_state=seed),
        "central-gmm-bic": lambda: central_gmm_bic(clients, n_init=n_init, random_state=seed),
        "dp-gmm": lambda: dp_gmm(clients, random_state=seed),
        "k-fed": lambda: k_fed(clients, true_k, random_state=seed),
        "fed-kmeans": lambda: fed_kmeans(clients, true_k, random_state=seed),
        "ffcm-avg1": lambda: ffcm(clients, true_k, variant="avg1", n_init=n_init, random_state=seed, driver=driver,
                                  partitions=partitions),
        "ffcm-avg2": lambda: ffcm(clients, true_k, variant="avg2", n_init=n_init, random_state=seed, driver=driver,
                                  partitions=partitions),
        "afcl": lambda: afcl(clients, random_state=seed, driver=driver, partitions=partitions),
    }


# BaselineResult.info entries that run_baselines reports as timings, under "<method>_<suffix>".
_INFO_TIMINGS = {"client_seconds": "clients_sum", "server_seconds": "server"}


def run_baselines(scenario: Mapping[str, Any], methods: Sequence[str], *, seed: int, n_init: int = 3,
                  driver: ProtocolDriver | None = None, partitions: Sequence[int] | None = None,
                  fedgem_k: int | None = None, fedgem_bic: Callable[[np.ndarray], float] | None = None,
                  ) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """The comparators on a simulated scenario's clients (or the user's files), scored like FedGEM.

    The one-shot comparators run on data regenerated from the scenario and the seed (a
    simulation); the iterative federated ones (FFCM, AFCL) exchange their messages with the
    clients through ``driver`` (Flower's transport, under fedica's ServerApp), or in memory on
    the regenerated data when it is None. Scores always use the regenerated test data. Each
    method logs its start and its fitting time (logger ``fedica.baselines``, INFO). ``partitions``
    (default: every client of the scenario) are the clients that take part, so that the comparators
    see exactly the clients FedGEM saw.

    On ``scenario=files`` (read here, so only where the files are: the local engines) the comparators
    run when ``methods`` names nothing but :data:`FILE_METHODS` (the central GMM on the pooled files),
    the user's request: the default list, which names comparators of the simulated scenarios, runs none
    on files (a log line says so), so a files run's result is what it was before. Its K is the number of
    distinct labels of the clients' files when every file has labels (``k_source: "labels"`` in its
    metrics), else ``fedgem_k``, the K_hat FedGEM found (``k_source: "fedgem"``: a central GMM with
    FedGEM's K, scored by its silhouettes; there is no true K to score against).

    Parameters
    ----------
    scenario : mapping
        The run's ``scenario`` section.
    methods : sequence of str
        Names of :data:`BASELINE_METHODS`.
    seed : int
    n_init : int
    driver : ProtocolDriver or None
    partitions : sequence of int or None
    fedgem_k : int or None
        FedGEM's K_hat, the K of the central GMM on unlabelled files.
    fedgem_bic : callable or None
        The BIC of FedGEM's mixture on rows of the data's units (:func:`fedica.fedgem.families.mixture_bic`); where
        a central GMM runs, it scores FedGEM's mixture on the same pooled training points as theirs.

    Returns
    -------
    metrics : dict of method name to its scores
        :func:`evaluate_clustering`'s scores, ``k_true``, and the other numeric entries of the method's
        ``BaselineResult.info`` (e.g. ``rounds``, AFCL's ``residual_bytes``, the central GMMs' ``pooled_bic``); on
        files also ``k_source``. With ``fedgem_bic`` and a central GMM, also ``"fedgem": {"pooled_bic": ...}``.
    fit_seconds : dict of method name to its own fitting time
        Also ``<method>_clients_sum`` and ``<method>_server`` for the federated protocols (as for FedGEM).
    """
    unknown = sorted(set(methods) - set(BASELINE_METHODS))
    if unknown:
        raise ValueError(f"unknown baseline methods {unknown}; known: {BASELINE_METHODS}")
    files = scenario["name"] == "files"
    if partitions is None:
        partitions = range(len(scenario["paths"]) if files else int(scenario["n_clients"]))
    partitions = sorted(partitions)
    if files and not (methods and set(methods) <= set(FILE_METHODS)):
        log.info("scenario=files: no comparator runs (they run when baseline_methods names nothing but %s)",
                 ", ".join(FILE_METHODS))
        return {}, {}
    clients = [scenario_client_data(scenario, p, seed) for p in partitions]
    true_k, k_source = true_n_clusters(scenario), None
    if files:
        if not any(client.X_test.shape[0] for client in clients):
            raise ValueError("scenario=files holds no rows out (test_fraction 0) to score a comparator on; "
                             "set scenario.test_fraction")
        true_k, k_source = _files_k(clients, fedgem_k)
    runs = _method_runs(clients, true_k, seed, n_init, driver, partitions)
    result_metrics, timings = {}, {}
    for name in methods:
        outcome = runs[name]()
        scores = evaluate_clustering(clients, outcome.test_labels)
        if k_source != "fedgem":  # FedGEM's K_hat is no true K
            scores["k_true"] = true_k
        if k_source is not None:
            scores["k_source"] = k_source
        for key, value in outcome.info.items():
            if key in _INFO_TIMINGS:
                timings[f"{name}_{_INFO_TIMINGS[key]}"] = float(value)
            elif isinstance(value, (int, float, np.integer, np.floating, str)) and not isinstance(value, bool):
                scores[key] = value
        result_metrics[name] = scores
        timings[name] = outcome.fit_seconds
    if fedgem_bic is not None and set(methods) & set(CENTRAL_GMM_METHODS):
        result_metrics["fedgem"] = {"pooled_bic": float(fedgem_bic(_pooled_train(clients)))}
    return result_metrics, timings


def _files_k(clients: Sequence[ClientData], fedgem_k: int | None) -> tuple[int, str]:
    """The K of a comparator on the user's files, and where it comes from: the labels, else FedGEM's K_hat."""
    if all(client.y_train is not None for client in clients):
        labels = np.concatenate([np.concatenate([c.y_train, c.y_test]) for c in clients])
        return int(np.unique(labels).size), "labels"
    if fedgem_k is None:
        raise ValueError("a comparator on unlabelled files needs FedGEM's K_hat (fedgem_k)")
    return int(fedgem_k), "fedgem"
