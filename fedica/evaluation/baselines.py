"""In-process comparators for FedGEM, run on the same client data (FedGEM paper, section 6 and appendix D.3).

Each is a clearly named comparator, never a fallback: central GMM and DP-GMM pool the clients' training data
(they are centralised references); k-FED and FedKmeans are one-shot federated k-means variants whose clients
send only local centres (and, for FedKmeans, their counts). Every baseline returns the predicted global cluster
id of every client's test points, the number of clusters receiving test points, and its own fitting time
(client and server work, not prediction or evaluation).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from sklearn.cluster import KMeans
from sklearn.mixture import BayesianGaussianMixture, GaussianMixture
from threadpoolctl import threadpool_limits

from fedica.data.common import ClientData
from fedica.data.scenarios import scenario_client_data, true_n_clusters
from fedica.evaluation.metrics import (
    adjusted_rand,
    ari_from_contingency,
    contingency,
    k_hat_from_predictions,
    weighted_local_ari,
)
from fedica.seeding import sklearn_seed

__all__ = ["BaselineResult", "central_gmm", "dp_gmm", "evaluate_clustering", "fed_kmeans", "k_fed"]

BASELINE_METHODS = ("central-gmm", "dp-gmm", "k-fed", "fed-kmeans")  # the names baseline_methods selects

@dataclass(frozen=True)
class BaselineResult:
    """Output of a baseline.

    Attributes
    ----------
    test_labels : list of G ndarrays, each of shape (m_g,)
        Predicted global cluster ids of each client's test points.
    k_hat : int
        Number of global clusters that receive at least one test point.
    fit_seconds : float
        Wall time of fitting (client and server work).
    """

    test_labels: list[np.ndarray]
    k_hat: int
    fit_seconds: float



def _check_clients(clients: Sequence[ClientData]) -> None:
    if len(clients) == 0:
        raise ValueError("clients must not be empty")
    dims = {c.X_train.shape[1] for c in clients}
    if len(dims) != 1:
        raise ValueError(f"all clients must have the same number of features, got {sorted(dims)}")


def _result(test_labels: list[np.ndarray], fit_seconds: float) -> BaselineResult:
    test_labels = [np.asarray(labels, dtype=np.int64) for labels in test_labels]
    pooled = np.concatenate(test_labels)
    return BaselineResult(test_labels, int(np.unique(pooled).size), float(fit_seconds))


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
    """
    _check_clients(clients)
    rng = np.random.default_rng(random_state)
    model = GaussianMixture(n_components=n_clusters, covariance_type="spherical", init_params="k-means++",
                            n_init=n_init, max_iter=max_iter, random_state=sklearn_seed(rng))
    X = _pooled_train(clients)
    start = time.perf_counter()
    model.fit(X)
    seconds = time.perf_counter() - start
    return _result([model.predict(c.X_test) for c in clients], seconds)


def dp_gmm(clients: Sequence[ClientData], *, max_components: int | None = None, covariance_type: str = "full",
           max_iter: int = 100, random_state=None) -> BaselineResult:
    """Centralised Dirichlet-process GMM (unknown K) on the pooled training data.

    ``BayesianGaussianMixture(weight_concentration_prior_type="dirichlet_process")`` truncated at
    ``max_components``, by default ``sum_g K_g`` (an upper bound on K; paper appendix D.3). Its K_hat counts the
    components that receive test points.

    Parameters
    ----------
    clients : sequence of ClientData
    max_components : int or None
        Truncation level; None means the sum of the clients' ``n_components``.
    covariance_type : {"full", "tied", "diag", "spherical"}
        scikit-learn's default ("full") unless set.
    max_iter : int
    random_state : int, numpy.random.Generator or None

    Returns
    -------
    BaselineResult
    """
    _check_clients(clients)
    rng = np.random.default_rng(random_state)
    n_components = sum(c.n_components for c in clients) if max_components is None else max_components
    X = _pooled_train(clients)
    model = BayesianGaussianMixture(n_components=min(n_components, len(X)), covariance_type=covariance_type,
                                    weight_concentration_prior_type="dirichlet_process", max_iter=max_iter,
                                    random_state=sklearn_seed(rng))
    # The variational updates make many small (d x d) BLAS calls, where thread start-up dominates: one BLAS
    # thread measured 9x faster than two on generated Waveform (21-D, 3500 points).
    with threadpool_limits(limits=1, user_api="blas"):
        start = time.perf_counter()
        model.fit(X)
        seconds = time.perf_counter() - start
        return _result([model.predict(c.X_test) for c in clients], seconds)


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
    _check_clients(clients)
    rng = np.random.default_rng(random_state)
    start = time.perf_counter()
    local = _local_kmeans(clients, n_init, rng)
    server = _server_kmeans(local, n_clusters, n_init, rng, weighted=False)
    local_to_global = [server.predict(model.cluster_centers_) for model in local]
    seconds = time.perf_counter() - start
    return _result([mapping[model.predict(c.X_test)]
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
    _check_clients(clients)
    rng = np.random.default_rng(random_state)
    start = time.perf_counter()
    local = _local_kmeans(clients, n_init, rng)
    server = _server_kmeans(local, n_clusters, n_init, rng, weighted=True)
    seconds = time.perf_counter() - start
    return _result([server.predict(c.X_test) for c in clients], seconds)


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
        receiving test points. Both ARIs are NaN when any client has no test labels.
    """
    if len(test_labels) != len(clients):
        raise ValueError(f"test_labels must have one array per client ({len(clients)}), got {len(test_labels)}")
    for g, (client, labels) in enumerate(zip(clients, test_labels)):
        if np.shape(labels) != (client.X_test.shape[0],):
            raise ValueError(f"test_labels[{g}] must have shape ({client.X_test.shape[0]},), got "
                             f"{np.shape(labels)}")
    pooled_pred = np.concatenate([np.asarray(labels) for labels in test_labels])
    k_hat = k_hat_from_predictions(pooled_pred, np.ones_like(pooled_pred))
    if any(client.y_test is None for client in clients):
        return {"local_ari": float("nan"), "global_ari": float("nan"), "k_hat": k_hat}
    local = [adjusted_rand(client.y_test, labels) for client, labels in zip(clients, test_labels)]
    triplets = [contingency(client.y_test, labels) for client, labels in zip(clients, test_labels)]
    true_values, pred_values, counts = (np.concatenate(parts) for parts in zip(*triplets))
    return {
        "local_ari": weighted_local_ari(local, [client.n_train for client in clients]),
        "global_ari": ari_from_contingency(true_values, pred_values, counts),
        "k_hat": k_hat,
    }


def run_baselines(scenario: Mapping[str, Any], methods: Sequence[str], *, seed: int,
                  n_init: int = 3) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """The comparators on a simulated scenario's clients, scored like FedGEM.

    The data are regenerated from the scenario and the seed (a simulation), never taken from
    the clients.

    Returns
    -------
    metrics : dict of method name to its scores
    fit_seconds : dict of method name to its own fitting time
    """
    clients = [scenario_client_data(scenario, p, seed) for p in range(int(scenario["n_clients"]))]
    true_k = true_n_clusters(scenario)
    runs = {
        "central-gmm": lambda: central_gmm(clients, true_k, n_init=n_init, random_state=seed),
        "dp-gmm": lambda: dp_gmm(clients, random_state=seed),
        "k-fed": lambda: k_fed(clients, true_k, random_state=seed),
        "fed-kmeans": lambda: fed_kmeans(clients, true_k, random_state=seed),
    }
    result_metrics, timings = {}, {}
    for name in methods:
        outcome = runs[name]()
        scores = evaluate_clustering(clients, outcome.test_labels)
        scores["k_true"] = true_k
        result_metrics[name] = scores
        timings[name] = outcome.fit_seconds
    return result_metrics, timings
