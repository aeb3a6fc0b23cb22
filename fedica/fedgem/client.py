"""FedGEM's client side of the protocol: what a client computes for each task, in plain numpy.

Each function takes the client's own data and the arrays and values the server sent, and
returns the reply's arrays and values. :data:`TASKS` holds the task handlers over a
:class:`~fedica.protocol.tasks.Site` (its data, and its current centroids kept in its state between
messages) that fedica's one task registry (:data:`fedica.tasks.CLIENT_TASKS`) answers with, for
Flower's ClientApp and the in-memory estimator alike. The server's centroids are checked against
the client's own shapes before use.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedica.concurrency import one_blas_thread
from fedica.metrics import adjusted_rand, contingency, mean_silhouettes
from fedica.fedgem.families import component_moments, mixture_moments, site_mixture_weights
from fedica.fedgem.families import site_labels as family_labels
from fedica.fedgem.geometry import Identity, cluster_anisotropy, feature_scale_spread, geometry
from fedica.fedgem.local import assign_labels, kmeans_init, kmeanspp_init
from fedica.fedgem.standardisation import site_moments, standardised
from fedica.protocol.messages import (
    CLUSTER_SHAPE_KEY, GEM_CLUSTER_MOMENTS, GEM_EVALUATE, GEM_FAMILY_EM, GEM_FINAL, GEM_INIT, GEM_LIKELIHOOD, GEM_MOMENTS, GEM_ROUND, GEM_SILHOUETTE,
    K_AT_BOUND_KEY, REPORT_CLUSTER_SHAPE_KEY, REPORT_SCALE_SPREAD_KEY, SCALE_SPREAD_KEY,
)
from fedica.protocol.tasks import Handler, Site
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


def model_geometry(values: Mapping[str, Any]) -> Identity:
    """The geometry the server's request names (``covariance-type``); a server that names none runs the paper's identity."""
    return geometry(str(values.get("covariance-type", "identity")))


def initialise(X: np.ndarray, n_components: int, values: Mapping[str, Any], partition_id: int) -> Reply:
    """The initial exchange: the local start's centroids, weights and the client's size.

    The start is ``local-start``: ``seeds``, the best of ``n-init`` k-means++ seedings (the paper's; a server
    that names none asks for it), or ``kmeans``, Lloyd's k-means refining each seeding, the best kept.
    A spherical site also sends the variances it starts from, which the server sends back with every round's centroids.
    A server that asks (``report-scale-spread``) also gets the site's ``feature-scale-spread``, one number: how
    far its columns' standard deviations are apart (:func:`fedica.fedgem.geometry.feature_scale_spread`).
    """
    rng = generator(int(values["seed"]), "client.kmeanspp", partition_id)
    start = time.perf_counter()
    local_start = kmeans_init if values.get("local-start", "seeds") == "kmeans" else kmeanspp_init
    centroids = local_start(X, n_components, n_init=int(values["n-init"]), random_state=rng)
    variances = model_geometry(values).initial_variances(X, centroids)
    seconds = time.perf_counter() - start
    reply_values = {"n-points": X.shape[0], "fit-seconds": seconds}
    if values.get(REPORT_SCALE_SPREAD_KEY, False):
        reply_values[SCALE_SPREAD_KEY] = feature_scale_spread(X)
    arrays = {"centroids": centroids, "weights": uniform_weights(n_components)}
    return ({**arrays, "variances": variances} if variances is not None else arrays), reply_values


def collaborative_round(X: np.ndarray, centroids: np.ndarray, values: Mapping[str, Any],
                        variances: np.ndarray | None = None) -> Reply:
    """A collaborative round: ``local-steps`` EM steps; the maximisers and their squared radii.

    A spherical site also sends its variances after the last M-step: the server sends them back, adopted at the
    next round's centroids (:meth:`fedica.fedgem.geometry.Spherical.adopted_variances`).
    """
    start = time.perf_counter()
    maximisers, radii, variances = model_geometry(values).em_steps(
        X, centroids, uniform_weights(centroids.shape[0]), variances, int(values["local-steps"]))
    seconds = time.perf_counter() - start
    arrays = {"maximisers": maximisers, "radii": radii}
    if variances is not None:
        arrays["variances"] = variances
    return arrays, {"n-points": X.shape[0], "fit-seconds": seconds}


def final_step(X: np.ndarray, centroids: np.ndarray, values: Mapping[str, Any],
               variances: np.ndarray | None = None) -> Reply:
    """The final stage: one more EM step (the server computes the final radii itself).

    A spherical client also sends its final variances: the final radius is a squared length, and
    the server needs the model's unit of length for it (docs/ALGORITHMS.md section 2.11).
    A server that asks (``report-cluster-shape``) also gets the site's ``cluster-anisotropy`` under its final
    maximisers, one number: how far its clusters are from spheres (:func:`fedica.fedgem.geometry.cluster_anisotropy`).
    """
    start = time.perf_counter()
    model = model_geometry(values)
    maximisers, _, variances = model.em_steps(X, centroids, uniform_weights(centroids.shape[0]), variances, 1)
    seconds = time.perf_counter() - start
    arrays = {"maximisers": maximisers} if variances is None else {"maximisers": maximisers, "variances": variances}
    reply_values = {"n-points": X.shape[0], "fit-seconds": seconds}
    if values.get(REPORT_CLUSTER_SHAPE_KEY, False) and (anisotropy := cluster_anisotropy(X, maximisers)) is not None:
        reply_values[CLUSTER_SHAPE_KEY] = anisotropy
    return arrays, reply_values


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


def likelihoods(X: np.ndarray, centroids: Any, sizes: Any, values: Mapping[str, Any]) -> Reply:
    """The model selection: the log-likelihood of the client's points under each candidate global model.

    ``centroids`` stacks the candidates' global centroids, ``sizes`` says how many each has.
    """
    centroids = np.asarray(centroids, dtype=np.float64)
    sizes = np.asarray(sizes)
    if (sizes.ndim != 1 or sizes.dtype.kind not in "iu" or np.any(sizes < 1) or centroids.ndim != 2
            or centroids.shape != (int(sizes.sum()), X.shape[1]) or not np.all(np.isfinite(centroids))):
        raise ValueError(f"candidate centroids of shape {centroids.shape} and sizes {sizes.shape} do not fit d={X.shape[1]}")
    start = time.perf_counter()
    # One BLAS thread: the products are a few hundred centres by the site's points, where a second thread costs more
    # than it gives, and sites answer this request on every core (CONCURRENT_TASKS): 1.5x at 1,000 sites.
    with one_blas_thread():
        scores, entropies = model_geometry(values).log_likelihoods(X, np.split(centroids, np.cumsum(sizes)[:-1]))
    return ({"log-likelihoods": scores, "entropies": entropies},
            {"n-points": X.shape[0], "fit-seconds": time.perf_counter() - start})


def consensus_labels(X: np.ndarray, centroids: np.ndarray, global_ids: Any) -> np.ndarray:
    """Global ids of the rows of ``X`` under the consensus model: the nearest of the site's own clusters' centres."""
    global_ids = np.asarray(global_ids).astype(np.int64)
    if global_ids.shape != (centroids.shape[0],):
        raise ValueError(f"global-ids of shape {global_ids.shape}; this client has {centroids.shape[0]} components")
    return global_ids[assign_labels(X, centroids)]


def adapted_labels(X_fit: np.ndarray, X: np.ndarray, centres: Any, global_ids: Any, model: Identity,
                   covariances: Any = None) -> np.ndarray:
    """Global ids of the rows of ``X`` under the site's own mixture over every global centre (``labelling: adapted``).

    The mixture's weights (and variance) are fitted to the site's training points ``X_fit``
    (:meth:`fedica.fedgem.geometry.Identity.site_mixture`); ``centres`` (K_hat, d) are the global
    centres the server sent, ``global_ids`` (K_hat,) their ids. Under a covariance family the server also
    sends the clusters' ``covariances`` (K_hat, d, d), which the mixture holds fixed with the centres.
    """
    centres = np.asarray(centres, dtype=np.float64)
    global_ids = np.asarray(global_ids)
    if (centres.ndim != 2 or centres.shape[0] < 1 or centres.shape[1] != X_fit.shape[1]
            or not np.all(np.isfinite(centres))):
        raise ValueError(f"the server sent global centres of shape {centres.shape}; this client's points have d={X_fit.shape[1]}")
    if global_ids.shape != (centres.shape[0],) or global_ids.dtype.kind not in "iu":
        raise ValueError(f"global-ids of shape {global_ids.shape} do not name the {centres.shape[0]} global centres")
    if covariances is not None:  # the global clusters of a covariance family (fedica.fedgem.families)
        covariances = checked_covariances(covariances, centres.shape[0], centres.shape[1])
        weights = site_mixture_weights(X_fit, centres, covariances)
        return global_ids.astype(np.int64)[family_labels(X, centres, covariances, weights)]
    weights, variance = model.site_mixture(X_fit, centres)
    return global_ids.astype(np.int64)[model.site_labels(X, centres, weights, variance)]


def checked_covariances(covariances: Any, n_clusters: int, dim: int) -> np.ndarray:
    """The global clusters' covariances (K_hat, d, d) the server sent, or one line: each finite, symmetric, positive
    definite."""
    covariances = np.asarray(covariances, dtype=np.float64)
    if covariances.shape != (n_clusters, dim, dim) or not np.all(np.isfinite(covariances)):
        raise ValueError(f"the server sent covariances of shape {covariances.shape}; the {n_clusters} global centres "
                         f"need ({n_clusters}, {dim}, {dim}), finite")
    if not np.allclose(covariances, covariances.transpose(0, 2, 1)) or np.any(np.linalg.eigvalsh(covariances)[:, 0] <= 0):
        raise ValueError("the server sent a covariance that is not symmetric positive definite")
    return covariances


def result_labels(X_fit: np.ndarray, X: np.ndarray, fedgem_result: Mapping[str, Any], settings: Mapping[str, Any],
                  global_ids: Any) -> np.ndarray:
    """Global ids of the rows of ``X`` as a site of a finished run labels them, from the run's result.

    ``fedgem_result`` is the result's ``fedgem`` section (its centres in the data's units, and under
    ``standardize`` the federation's location and scale), ``settings`` its ``config.algorithm``,
    ``global_ids`` the site's ``client_mapping``; ``X_fit`` are the site's points its own mixture is
    fitted to under ``labelling: adapted``. Both in the units the site's loader gives them.
    """
    centres = np.asarray(fedgem_result["global_centroids"], dtype=np.float64)
    if fedgem_result.get("feature_scale") is not None:  # the sites clustered the standardised points
        units = (np.asarray(fedgem_result["feature_location"], dtype=np.float64),
                 np.asarray(fedgem_result["feature_scale"], dtype=np.float64))
        centres, X_fit, X = (standardised(A, *units) for A in (centres, X_fit, X))
    if settings.get("labelling", "consensus") == "adapted":
        covariances = fedgem_result.get("covariances")
        return adapted_labels(X_fit, X, centres, np.arange(centres.shape[0]), geometry(settings["covariance_type"]),
                              None if covariances is None else np.asarray(covariances, dtype=np.float64))
    global_ids = np.asarray(global_ids, dtype=np.int64)
    return consensus_labels(X, centres[global_ids], global_ids)


def evaluate(y_test: np.ndarray | None, predicted: np.ndarray, n_points: int) -> Reply:
    """Contingency counts and the local ARI of the test points' global ids ``predicted``.

    Only counts of (true label, global id) pairs leave the client, never a point or a label.
    """
    values: dict[str, Any] = {"n-points": n_points, "has-labels": y_test is not None}
    if y_test is None:
        true_values, pred_values, counts = contingency(np.zeros_like(predicted), predicted)
        values["local-ari"] = 0.0
    else:
        true_values, pred_values, counts = contingency(y_test, predicted)
        values["local-ari"] = adjusted_rand(y_test, predicted)
    return {"true-values": true_values, "pred-values": pred_values, "counts": counts}, values


# ---------------------------------------------------------------- the task handlers over a site


def adopted_centroids(site: Site, arrays: Mapping[str, Any], n_components: int, dim: int) -> np.ndarray:
    """The centroids the server sent (adopted as the site's model, kept in its state), or its own if it sent none."""
    if "centroids" in arrays:
        centroids = checked_centroids(arrays["centroids"], n_components, dim)
    elif "centroids" in site.state:
        centroids = site.state["centroids"]
    else:
        raise ValueError("no centroids: the server sent none and this client was never initialised")
    site.state["centroids"] = centroids
    return centroids


def request_variances(arrays: Mapping[str, Any], values: Mapping[str, Any], n_components: int) -> np.ndarray | None:
    """A spherical site's variances at the centroids the request sends (K_g,), from the request; None under identity.

    The server sends back what the site reported, adopted at the new centroids (docs/ALGORITHMS.md 2.11), so
    that the site keeps no state between rounds: a site restarted mid-run, or a run resumed from its journal,
    computes the same step as the uninterrupted run.
    """
    if not model_geometry(values).learns_variance:
        return None
    if "variances" not in arrays:
        raise ValueError("the server sent no variances: a spherical round needs the variances of this site's components")
    variances = np.asarray(arrays["variances"], dtype=np.float64)
    if variances.shape != (n_components,) or not np.all(np.isfinite(variances)) or np.any(variances <= 0):
        raise ValueError(f"the server sent variances of shape {variances.shape} (or not positive and finite); this "
                         f"client fits {n_components} components")
    return variances


def _moments_task(site: Site, arrays: Mapping[str, Any], values: Mapping[str, Any]) -> Reply:
    """The federated standardisation: the site's column means and standard deviations, (2, d), in its own units."""
    start = time.perf_counter()
    X = site.training_points(values)
    moments = np.vstack(site_moments(X))
    return {"moments": moments}, {"n-points": X.shape[0], "fit-seconds": time.perf_counter() - start}


def _init_task(site: Site, arrays: Mapping[str, Any], values: Mapping[str, Any]) -> Reply:
    data = site.points(values)
    reply = initialise(data.X_train, data.n_components, values, site.partition_id)
    site.state["centroids"] = reply[0]["centroids"]
    if data.n_components_at_bound:  # the server's result says which sites may hold more clusters than they fit
        reply[1][K_AT_BOUND_KEY] = True
    return reply


def _round_task(site: Site, arrays: Mapping[str, Any], values: Mapping[str, Any]) -> Reply:
    data = site.points(values)
    centroids = adopted_centroids(site, arrays, data.n_components, data.X_train.shape[1])
    return collaborative_round(data.X_train, centroids, values, request_variances(arrays, values, data.n_components))


def _final_task(site: Site, arrays: Mapping[str, Any], values: Mapping[str, Any]) -> Reply:
    data = site.points(values)
    centroids = adopted_centroids(site, arrays, data.n_components, data.X_train.shape[1])
    return final_step(data.X_train, centroids, values, request_variances(arrays, values, data.n_components))


def _silhouette_task(site: Site, arrays: Mapping[str, Any], values: Mapping[str, Any]) -> Reply:
    data = site.points(values)
    return silhouettes(data.X_train, arrays["candidates"], data.n_components, values, site.partition_id)


def _likelihood_task(site: Site, arrays: Mapping[str, Any], values: Mapping[str, Any]) -> Reply:
    return likelihoods(site.points(values).X_train, arrays["centroids"], arrays["sizes"], values)


def _site_labels(site: Site, data, X: np.ndarray, arrays: Mapping[str, Any], values: Mapping[str, Any]) -> np.ndarray:
    """Global ids of the rows of ``X`` as the request's ``labelling`` labels them (the evaluation's rule)."""
    if values.get("labelling", "consensus") == "adapted":
        return adapted_labels(data.X_train, X, arrays["centroids"], arrays["global-ids"], model_geometry(values),
                              arrays.get("covariances"))
    centroids = adopted_centroids(site, arrays, data.n_components, data.X_train.shape[1])
    return consensus_labels(X, centroids, arrays["global-ids"])


def cluster_moments_reply(X: np.ndarray, labels: np.ndarray, n_clusters: int) -> Reply:
    """Each global cluster's mass, mean and scatter matrix over the site's points ``X`` labelled ``labels``.

    The moments a covariance family is chosen from (:mod:`fedica.fedgem.families`); a cluster the site gives no
    point has mass 0, a zero mean and a zero scatter.
    """
    start = time.perf_counter()
    labels = np.asarray(labels, dtype=np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= n_clusters):
        raise ValueError(f"global ids outside 0..{n_clusters - 1}: the server's ids name no cluster of its partition")
    membership = np.zeros((n_clusters, X.shape[0]))
    membership[labels, np.arange(X.shape[0])] = 1.0
    masses = membership.sum(axis=1)
    means = membership @ X / np.maximum(masses, 1.0)[:, None]
    _, scatters = component_moments(X, membership, means)
    return ({"masses": masses, "means": means, "scatters": scatters},
            {"n-points": X.shape[0], "fit-seconds": time.perf_counter() - start})


def _cluster_moments_task(site: Site, arrays: Mapping[str, Any], values: Mapping[str, Any]) -> Reply:
    data = site.points(values)
    n_clusters = int(values["n-clusters"])
    return cluster_moments_reply(data.X_train, _site_labels(site, data, data.X_train, arrays, values), n_clusters)


def family_em_reply(X: np.ndarray, weights: Any, means: Any, covariances: Any, sizes: Any,
                    diagonal: Any = None) -> Reply:
    """One federated EM step of every candidate mixture the server sends (its clusters stacked, ``sizes`` per model):
    each cluster's mass, mean and scatter of the site's responsibilities, and the site's log-likelihood per model.

    ``diagonal`` (one flag a model; default none) names the models whose M-step reads only their scatters'
    diagonals (the diag and spherical families): their clusters' scatters are sent as ``scatter-diagonals`` (k, d),
    the others' in ``scatters`` (k, d, d): ``d`` numbers a cluster for ``d^2``.
    """
    start = time.perf_counter()
    sizes = np.asarray(sizes)
    weights, means = np.asarray(weights, dtype=np.float64), np.asarray(means, dtype=np.float64)
    if (sizes.ndim != 1 or sizes.dtype.kind not in "iu" or np.any(sizes < 1) or means.shape != (int(sizes.sum()), X.shape[1])
            or weights.shape != (means.shape[0],) or not np.all(np.isfinite(means)) or not np.all(np.isfinite(weights))
            or np.any(weights < 0)):
        raise ValueError(f"candidate mixtures of means {means.shape}, weights {weights.shape} and sizes {sizes.shape} "
                         f"do not fit d={X.shape[1]}")
    diagonal = np.zeros(sizes.shape, dtype=np.int64) if diagonal is None else np.asarray(diagonal)
    if diagonal.shape != sizes.shape or diagonal.dtype.kind not in "iub" or not np.isin(diagonal, (0, 1)).all():
        raise ValueError(f"'diagonal' of shape {diagonal.shape} must flag each of the {sizes.size} candidate mixtures "
                         "0 or 1")
    covariances = checked_covariances(covariances, means.shape[0], X.shape[1])
    # One BLAS thread: d x d factorisations and products of the site's points by d columns, too small for a second
    # thread to pay (digits under `auto`, 4 sites: 14.7 s on BLAS's two threads, 13.2 s on one); where two fits share
    # the cores (a sweep, xdist's workers), each one's spinning BLAS threads cost 5x (65 s beside another, 14 s).
    with one_blas_thread():
        masses, centres, scatters, log_likelihoods = mixture_moments(X, weights, means, covariances, sizes)
    rows = np.repeat(diagonal.astype(bool), sizes)
    return ({"masses": masses, "means": centres, "scatters": scatters[~rows],
             "scatter-diagonals": np.ascontiguousarray(np.einsum("kii->ki", scatters[rows])),
             "log-likelihoods": log_likelihoods},
            {"n-points": X.shape[0], "fit-seconds": time.perf_counter() - start})


def _family_em_task(site: Site, arrays: Mapping[str, Any], values: Mapping[str, Any]) -> Reply:
    return family_em_reply(site.points(values).X_train, arrays["weights"], arrays["means"], arrays["covariances"],
                           arrays["sizes"], arrays.get("diagonal"))


def _evaluate_task(site: Site, arrays: Mapping[str, Any], values: Mapping[str, Any]) -> Reply:
    data = site.points(values)
    # No held-out share (a user's files with test_fraction 0 keep every row for training): the evaluation labels
    # the training rows, scored against their labels where the site has them, so that K_hat counts the clusters the
    # site's points reach and the ARIs are not those of an empty test set (issue 44: k_hat 0, ARI 1.0 for .28).
    held_out = data.X_test.shape[0] > 0
    X, y = (data.X_test, data.y_test) if held_out else (data.X_train, data.y_train)
    return evaluate(y, _site_labels(site, data, X, arrays, values), data.X_train.shape[0])


TASKS: dict[str, Handler] = {
    GEM_MOMENTS: _moments_task,
    GEM_INIT: _init_task,
    GEM_ROUND: _round_task,
    GEM_FINAL: _final_task,
    GEM_SILHOUETTE: _silhouette_task,
    GEM_LIKELIHOOD: _likelihood_task,
    GEM_EVALUATE: _evaluate_task,
    GEM_CLUSTER_MOMENTS: _cluster_moments_task,
    GEM_FAMILY_EM: _family_em_task,
}

# The tasks different sites may answer at once on threads of one process (fedica.protocol.tasks.ClientTasks): plain
# numpy on the site's points, no warning filter (those are process-wide; the EM tasks set them). The likelihood stage
# (every candidate's centres: 5,100 at 1,000 sites), the covariance family's EM steps (a site's step on 6 candidates of
# 50 clusters, G=1,000: 7.5 ms one site after another, 4.2 ms a site on two threads; on 30 candidates of at most 8
# clusters each it gained nothing) and the labelling of the cluster moments and the evaluation.
CONCURRENT_TASKS = frozenset({GEM_LIKELIHOOD, GEM_FAMILY_EM, GEM_CLUSTER_MOMENTS, GEM_EVALUATE})
