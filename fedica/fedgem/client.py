"""FedGEM's client side of the protocol: what a client computes for each task, in plain numpy.

Each function takes the client's own data and the arrays and values the server sent, and
returns the reply's arrays and values. Flower's ClientApp and the in-memory estimator both call
these, so a client computes the same thing whatever carries its messages. The server's
centroids are checked against the client's own shapes before use.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedica.evaluation.metrics import adjusted_rand, contingency, mean_silhouettes
from fedica.fedgem.local import assign_labels, em_step, kmeanspp_init, local_round
from fedica.fedgem.selection import log_likelihoods
from fedica.seeding import generator

Reply = tuple[dict[str, np.ndarray], dict[str, Any]]


def uniform_weights(n_components: int) -> np.ndarray:
    """The fixed mixture weights pi = 1/K_g of the paper's model."""
    return np.full(n_components, 1.0 / n_components)


def checked_centroids(centroids: Any, n_components: int, dim: int, name: str = "centroids") -> np.ndarray:
    """The server's centroids for this client, refused unless finite and of shape (K_g, d)."""
    centroids = np.asarray(centroids, dtype=np.float64)
    if centroids.shape != (n_components, dim) or not np.all(np.isfinite(centroids)):
        raise ValueError(f"the server sent {name} of shape {centroids.shape}; this client fits {n_components} in d={dim}")
    return centroids


def initialise(X: np.ndarray, n_components: int, values: Mapping[str, Any], partition_id: int) -> Reply:
    """The initial exchange: k-means++ centroids (best of ``n-init``), weights and the client's size."""
    rng = generator(int(values["seed"]), "client.kmeanspp", partition_id)
    start = time.perf_counter()
    centroids = kmeanspp_init(X, n_components, n_init=int(values["n-init"]), random_state=rng)
    seconds = time.perf_counter() - start
    return ({"centroids": centroids, "weights": uniform_weights(n_components)},
            {"n-points": X.shape[0], "fit-seconds": seconds})


def collaborative_round(X: np.ndarray, centroids: np.ndarray, values: Mapping[str, Any]) -> Reply:
    """A collaborative round: ``local-steps`` EM steps; the maximisers and their squared radii."""
    start = time.perf_counter()
    maximisers, radii = local_round(X, centroids, uniform_weights(centroids.shape[0]), n_steps=int(values["local-steps"]))
    seconds = time.perf_counter() - start
    return {"maximisers": maximisers, "radii": radii}, {"n-points": X.shape[0], "fit-seconds": seconds}


def final_step(X: np.ndarray, centroids: np.ndarray) -> Reply:
    """The final stage: one more EM step (the server computes the final radii itself)."""
    start = time.perf_counter()
    maximisers = em_step(X, centroids, uniform_weights(centroids.shape[0]))
    seconds = time.perf_counter() - start
    return {"maximisers": maximisers}, {"n-points": X.shape[0], "fit-seconds": seconds}


def silhouettes(X: np.ndarray, candidates: Any, n_components: int, values: Mapping[str, Any], partition_id: int) -> Reply:
    """The upsilon tuning: the mean silhouette of a sample of the client's points under each candidate model."""
    candidates = np.asarray(candidates, dtype=np.float64)
    if candidates.ndim != 3 or candidates.shape[1:] != (n_components, X.shape[1]):
        raise ValueError(f"candidates of shape {candidates.shape} do not fit this client's {n_components} components")
    sample = min(int(values["sample"]), X.shape[0])
    rng = generator(int(values["seed"]), "client.silhouette_sample", partition_id)
    points = X[rng.choice(X.shape[0], size=sample, replace=False)]
    start = time.perf_counter()
    scores = mean_silhouettes(points, [assign_labels(points, centroids) for centroids in candidates])
    seconds = time.perf_counter() - start
    return {"silhouettes": scores}, {"n-points": X.shape[0], "fit-seconds": seconds}


def likelihoods(X: np.ndarray, centres: Any, sizes: Any) -> Reply:
    """The model selection: the log-likelihood of the client's points under each candidate global model.

    ``centres`` stacks the candidates' global centres, ``sizes`` says how many each has.
    """
    centres = np.asarray(centres, dtype=np.float64)
    sizes = np.asarray(sizes)
    if (sizes.ndim != 1 or sizes.dtype.kind not in "iu" or np.any(sizes < 1) or centres.ndim != 2
            or centres.shape != (int(sizes.sum()), X.shape[1]) or not np.all(np.isfinite(centres))):
        raise ValueError(f"candidate centres of shape {centres.shape} and sizes {sizes.shape} do not fit d={X.shape[1]}")
    start = time.perf_counter()
    scores, entropies = log_likelihoods(X, np.split(centres, np.cumsum(sizes)[:-1]))
    return ({"log-likelihoods": scores, "entropies": entropies},
            {"n-points": X.shape[0], "fit-seconds": time.perf_counter() - start})


def evaluate(X_test: np.ndarray, y_test: np.ndarray | None, centroids: np.ndarray, global_ids: Any, n_points: int) -> Reply:
    """Label the test points with the consensus model; contingency counts and the local ARI.

    Only counts of (true label, global id) pairs leave the client, never a point or a label.
    """
    global_ids = np.asarray(global_ids).astype(np.int64)
    if global_ids.shape != (centroids.shape[0],):
        raise ValueError(f"global-ids of shape {global_ids.shape}; this client has {centroids.shape[0]} components")
    predicted = global_ids[assign_labels(X_test, centroids)]
    values: dict[str, Any] = {"n-points": n_points, "has-labels": y_test is not None}
    if y_test is None:
        true_values, pred_values, counts = contingency(np.zeros_like(predicted), predicted)
        values["local-ari"] = 0.0
    else:
        true_values, pred_values, counts = contingency(y_test, predicted)
        values["local-ari"] = adjusted_rand(y_test, predicted)
    return {"true-values": true_values, "pred-values": pred_values, "counts": counts}, values
