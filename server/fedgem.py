"""FedGEM's server side: initialisation exchange, T collaborative rounds, the final aggregation, evaluation."""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from fedica.server.federation import Federation, Reply
from fedica.server.records import (
    TASK_GEM_EVALUATE,
    TASK_GEM_FINAL,
    TASK_GEM_INIT,
    TASK_GEM_ROUND,
    TASK_GEM_SILHOUETTE,
)
from flwr.app import MessageType

from fedica.config import client_count
from fedica.data.scenarios import scenario_client_data, true_n_clusters
from fedica.evaluation.baselines import (
    central_gmm,
    dp_gmm,
    evaluate_clustering,
    fed_kmeans,
    k_fed,
)
from fedica.evaluation.metrics import (
    ari_from_contingency,
    k_hat_from_predictions,
    weighted_local_ari,
)
from fedica.fedgem.local import final_radius, min_centroid_distance, uncertainty_radius
from fedica.fedgem.merging import FinalAggregation, final_aggregation, server_step
from fedica.fedgem.tuning import select_upsilon
from fedica.protocol import (
    InvalidReply,
    require_array,
    require_int,
    validate_gem_components,
    validate_weights,
)
from fedica.seeding import generator

log = logging.getLogger("fedica.server")


@dataclass
class ClientModel:
    """What the server knows of one client: its node, its declared sizes and the centroids it was sent last."""

    node_id: int
    n_points: int            # the count the server uses (declared, capped by count_cap_factor)
    weights: np.ndarray      # (K_g,) pi
    centroids: np.ndarray    # (K_g, d) the centroids the server sent (or the client reported at initialisation)

    declared_points: int = 0

    @property
    def n_components(self) -> int:
        return self.weights.shape[0]


@dataclass
class Components:
    """All clients' components stacked for a server step."""

    partitions: list[int]
    centers: np.ndarray   # (m, d)
    eps: np.ndarray       # (m,)
    owners: np.ndarray    # (m,) partition id of each component
    weights: np.ndarray   # (m,) N_g * pi_k

    def slices(self) -> dict[int, slice]:
        """Each client's rows: its components are stacked contiguously, in the order of ``partitions``."""
        starts = np.flatnonzero(np.r_[True, self.owners[1:] != self.owners[:-1]]) if self.owners.size else []
        ends = list(starts[1:]) + [self.owners.size]
        return {int(self.owners[a]): slice(int(a), int(b)) for a, b in zip(starts, ends)}


def run_fedgem(federation: Federation) -> dict[str, Any]:
    """Run FedGEM over a federation and evaluate it (and, in-process, the baselines).

    Returns
    -------
    partial_result : dict
        ``metrics``, ``clients``, ``history``, ``timings`` and ``fedgem`` entries of the result.
    """
    cfg = federation.cfg
    alg = cfg["algorithm"]
    nodes = federation.connect()
    client_seconds = 0.0
    server_seconds = 0.0

    # Initialisation exchange: every client reports its k-means++ centroids, weights and size.
    models: dict[int, ClientModel] = {}
    init_replies = federation.exchange(TASK_GEM_INIT, "init", {node: {} for node in nodes})
    dim = _majority_dimension(init_replies)
    for reply in init_replies:
        try:
            centroids = validate_gem_components(reply.arrays, "centroids", dim=dim, n_components=None)
            weights = validate_weights(reply.arrays, "weights", centroids.shape[0])
            n_points = require_int(reply.values, "n-points", minimum=centroids.shape[0])
        except InvalidReply as err:
            federation.reject(reply.node_id, "init", f"invalid reply: {err}")
            continue
        models[reply.partition_id] = ClientModel(reply.node_id, n_points, weights, centroids, n_points)
        client_seconds += float(reply.values.get("fit-seconds", 0.0))
    federation.require(models.values(), "FedGEM initialisation")
    _cap_counts(models, alg["count_cap_factor"])

    history = federation.history
    for round_number in range(1, alg["rounds"] + 1):
        asked = _participants(models, alg["participation"], cfg, round_number)
        replies = federation.exchange(
            TASK_GEM_ROUND, round_number, {models[p].node_id: {"centroids": models[p].centroids} for p in asked}
        )
        components, seconds = _collect_round(federation, models, replies, round_number, dim)
        client_seconds += seconds
        federation.require(components.partitions, f"FedGEM round {round_number}")
        start = time.perf_counter()
        new_centers, n_super, excluded = _trusted_server_step(components, alg["radius_outlier_factor"])
        server_seconds += time.perf_counter() - start
        _log_excluded(components, excluded, round_number)
        shifts = []
        for partition, part in components.slices().items():
            shifts.append(np.linalg.norm(new_centers[part] - models[partition].centroids, axis=1))
            models[partition].centroids = new_centers[part]
        history.append({
            "round": round_number,
            "clients": components.partitions,
            "super_clusters": n_super,
            "mean_radius": float(np.mean(np.sqrt(components.eps))),
            "centroid_shift": float(np.mean(np.concatenate(shifts))),
            "excluded_components": int(excluded.sum()),
        })
        log.info("FedGEM round %d/%d: %d clients, %d super-clusters, mean radius %.4g",
                 round_number, alg["rounds"], len(components.partitions), n_super, history[-1]["mean_radius"])

    # Final stage: one more EM step on every client; the server computes the final radii itself.
    final_replies = federation.exchange(
        TASK_GEM_FINAL, "final", {m.node_id: {"centroids": m.centroids} for m in models.values()}
    )
    final, seconds = _collect_final(federation, models, final_replies, dim)
    client_seconds += seconds
    federation.require(final.partitions, "FedGEM final stage")

    upsilon, tuning, tuning_seconds = _choose_upsilon(federation, models, final)
    server_seconds += tuning_seconds["server"]
    client_seconds += tuning_seconds["clients"]
    start = time.perf_counter()
    aggregation, excluded = _trusted_final_aggregation(final, _final_radii(models, final, upsilon), alg["radius_outlier_factor"])
    server_seconds += time.perf_counter() - start
    _log_excluded(final, excluded, "final")

    evaluation, client_aris = _evaluate(federation, models, final, aggregation)
    true_k = true_n_clusters(cfg["scenario"])
    fedgem_metrics = {
        **evaluation,
        "super_clusters": aggregation.k_hat,
        "upsilon": upsilon,
        "rounds": alg["rounds"],
    }
    if true_k is not None:
        fedgem_metrics["k_true"] = true_k
    result_metrics = {"fedgem": fedgem_metrics}
    timings = {"fedgem": client_seconds + server_seconds, "fedgem_clients_sum": client_seconds, "fedgem_server": server_seconds}
    if cfg["baselines"] and cfg["scenario"]["name"] != "files":
        baseline_metrics, baseline_timings = run_baselines(cfg)
        result_metrics.update(baseline_metrics)
        timings.update(baseline_timings)

    mapping = {
        str(p): aggregation.labels[part].tolist() for p, part in final.slices().items()
    }
    return {
        "metrics": result_metrics,
        "clients": federation.clients_record(len(final.partitions)),
        "history": history,
        "timings": timings,
        "fedgem": {
            "global_centroids": aggregation.global_centroids,
            "client_mapping": mapping,
            "client_local_ari": client_aris,
            "upsilon": upsilon,
            "upsilon_tuning": tuning,
            "participation": federation.participation,
            "hostile_clients": federation.hostile_partitions(),
        },
    }


def _majority_dimension(replies: list[Reply]) -> int | None:
    """The data dimension most clients report, so that one client with another dimension cannot set it for all."""
    dims = [r.arrays["centroids"].shape[1] for r in replies
            if isinstance(r.arrays.get("centroids"), np.ndarray) and r.arrays["centroids"].ndim == 2]
    if not dims:
        return None
    values, counts = np.unique(dims, return_counts=True)
    return int(values[np.argmax(counts)])


def _participants(models: Mapping[int, ClientModel], participation: float, cfg: Mapping[str, Any], round_number: int) -> list[int]:
    """The clients asked in a round: all, or a seeded random share (at least ``min_clients``)."""
    partitions = sorted(models)
    if participation >= 1.0:
        return partitions
    count = min(len(partitions), max(int(cfg["min_clients"]), math.ceil(participation * len(partitions))))
    rng = generator(int(cfg["seed"]), "server.participation", round_number)
    return sorted(rng.choice(partitions, size=count, replace=False).tolist())


def _cap_counts(models: Mapping[int, ClientModel], factor: float | None) -> None:
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


def _outlying_radii(eps: np.ndarray, factor: float | None, scale: Callable[[], float]) -> np.ndarray:
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


def _separation_scale(components: Components) -> float:
    """The median over clients of the smallest distance between a client's own components."""
    return float(np.median([min_centroid_distance(components.centers[part]) for part in components.slices().values()]))


def _trusted_server_step(components: Components, factor: float | None) -> tuple[np.ndarray, int, np.ndarray]:
    """A server step in which components with outlying radii take part in no merge and keep their maximiser.

    Returns
    -------
    new_centers : ndarray of shape (m, d)
    n_super_clusters : int
        Super-clusters of the merged components plus one per excluded component.
    excluded : ndarray of shape (m,), dtype bool
    """
    excluded = _outlying_radii(components.eps, factor, lambda: _separation_scale(components))
    keep = ~excluded
    new_centers = components.centers.copy()
    step = server_step(components.centers[keep], components.eps[keep], components.owners[keep], components.weights[keep])
    new_centers[keep] = step.new_centers
    return new_centers, step.n_super_clusters + int(excluded.sum()), excluded


def _trusted_final_aggregation(
    final: Components, radii: np.ndarray, factor: float | None
) -> tuple[FinalAggregation, np.ndarray]:
    """The final aggregation over the trusted components.

    ``final.eps`` holds each component's drift ``||M_k - theta_k||^2`` from the centroids the
    server sent it. A component is not trusted when its final radius is an outlier (say, a
    client whose centroids are far apart claims a huge ball), or when its drift is an outlier
    AND exceeds its own final radius (it moved further in one EM step than the tolerance it
    asks for: it did not converge with the federation, or it lies). An untrusted component
    founds no global cluster: it is mapped to the nearest global centroid of the others, so
    that it can neither merge every cluster into one nor add clusters of its own.
    """
    scale = functools.cache(lambda: _separation_scale(final))
    excluded = _outlying_radii(radii, factor, scale) | (_outlying_radii(final.eps, factor, scale) & (final.eps > radii))
    keep = ~excluded
    trusted = final_aggregation(final.centers[keep], radii[keep], final.owners[keep], final.weights[keep])
    labels = np.empty(final.centers.shape[0], dtype=np.int64)
    labels[keep] = trusted.labels
    if excluded.any():
        distances = np.linalg.norm(final.centers[excluded, None, :] - trusted.global_centroids[None, :, :], axis=2)
        labels[excluded] = np.argmin(distances, axis=1)
    return FinalAggregation(labels, trusted.global_centroids, trusted.k_hat), excluded


def _log_excluded(components: Components, excluded: np.ndarray, round_label: int | str) -> None:
    if excluded.any():
        owners = sorted(set(components.owners[excluded].tolist()))
        log.warning("round %s: %d components with outlying radii (clients %s) took part in no merge",
                    round_label, int(excluded.sum()), owners)


def _collect(
    federation: Federation,
    models: Mapping[int, ClientModel],
    replies: list[Reply],
    round_label: int | str,
    dim: int,
    read_radii,
) -> tuple[Components, float]:
    """Validate replies and stack every client's maximisers with the radii ``read_radii`` gives.

    ``read_radii(reply, model, maximisers)`` returns the client's (K_g,) squared radii or
    raises :class:`InvalidReply`; a client the server never initialised is rejected.
    """
    partitions, centers, eps, owners, weights = [], [], [], [], []
    seconds = 0.0
    for reply in replies:
        model = models.get(reply.partition_id)
        if model is None:
            federation.reject(reply.node_id, round_label, "this client was not initialised")
            continue
        try:
            maximisers = validate_gem_components(reply.arrays, "maximisers", dim=dim, n_components=model.n_components)
            radii = read_radii(reply, model, maximisers)
        except InvalidReply as err:
            federation.reject(reply.node_id, round_label, f"invalid reply: {err}")
            continue
        partitions.append(reply.partition_id)
        centers.append(maximisers)
        eps.append(radii)
        owners.append(np.full(model.n_components, reply.partition_id))
        weights.append(model.n_points * model.weights)
        seconds += float(reply.values.get("fit-seconds", 0.0))
    if not partitions:
        return Components([], np.empty((0, dim)), np.empty(0), np.empty(0, int), np.empty(0)), seconds
    return Components(partitions, np.vstack(centers), np.concatenate(eps), np.concatenate(owners), np.concatenate(weights)), seconds


def _collect_round(
    federation: Federation, models: Mapping[int, ClientModel], replies: list[Reply], round_number: int, dim: int
) -> tuple[Components, float]:
    """A collaborative round's replies; radii are recomputed on the server where the model allows."""
    local_steps = federation.cfg["algorithm"]["local_steps"]

    def read_radii(reply: Reply, model: ClientModel, maximisers: np.ndarray) -> np.ndarray:
        radii = require_array(reply.arrays, "radii", (model.n_components,), nonnegative=True)
        n_points = require_int(reply.values, "n-points", minimum=model.n_components)
        if n_points != model.declared_points:
            log.warning("client %d claims %d points, it declared %d at initialisation; the declared count is used",
                        reply.partition_id, n_points, model.declared_points)
        if local_steps > 1:
            return radii
        # The server never trusts a reported radius: with one EM step the exact radius is
        # ||M_k - theta_k||^2 for the centroids theta it sent this client itself.
        recomputed = uncertainty_radius(maximisers, model.centroids)
        if not np.allclose(radii, recomputed, rtol=1e-6, atol=1e-9):
            log.warning("client %d, round %d: reported radii %s differ from the recomputed %s; the recomputed are used",
                        reply.partition_id, round_number, np.round(radii, 6).tolist(), np.round(recomputed, 6).tolist())
        return recomputed

    return _collect(federation, models, replies, round_number, dim, read_radii)


def _collect_final(
    federation: Federation, models: Mapping[int, ClientModel], replies: list[Reply], dim: int
) -> tuple[Components, float]:
    """The final stage's replies; ``eps`` of the result holds each component's drift from the centroids sent."""
    return _collect(federation, models, replies, "final", dim,
                    lambda reply, model, maximisers: uncertainty_radius(maximisers, model.centroids))


def _final_radii(models: Mapping[int, ClientModel], final: Components, upsilon: float) -> np.ndarray:
    """The final radii of the paper's heuristic, computed on the server from each client's maximisers and declared size."""
    radii = np.empty(final.centers.shape[0])
    for partition, part in final.slices().items():
        model = models[partition]
        radii[part] = final_radius(final.centers[part], model.weights, model.n_points, upsilon)
    return radii


def _choose_upsilon(
    federation: Federation, models: Mapping[int, ClientModel], final: Components
) -> tuple[float, dict[str, Any] | None, dict[str, float]]:
    """The configured upsilon, or the silhouette-tuned one (paper appendix D.3) when ``upsilon: auto``.

    Also returns the seconds of computation it took on the server and, summed, on the
    clients (their silhouettes); the message exchange in between counts as neither.
    """
    alg = federation.cfg["algorithm"]
    if alg["upsilon"] != "auto":
        return float(alg["upsilon"]), None, {"server": 0.0, "clients": 0.0}
    start = time.perf_counter()
    grid = [float(u) for u in alg["upsilon_grid"]]
    aggregations = [
        _trusted_final_aggregation(final, _final_radii(models, final, u), alg["radius_outlier_factor"])[0] for u in grid
    ]
    slices = final.slices()
    payloads = {
        models[p].node_id: {"candidates": np.stack([agg.global_centroids[agg.labels[part]] for agg in aggregations])}
        for p, part in slices.items()
    }
    server_seconds = time.perf_counter() - start
    replies = federation.exchange(TASK_GEM_SILHOUETTE, "silhouette", payloads, message_type=MessageType.EVALUATE)
    start = time.perf_counter()
    client_seconds = 0.0
    totals = np.zeros(len(grid))
    weight_sum = np.zeros(len(grid))
    for reply in replies:
        try:
            scores = require_array(reply.arrays, "silhouettes", (len(grid),), allow_nan=True)
        except InvalidReply as err:
            federation.reject(reply.node_id, "silhouette", f"invalid reply: {err}")
            continue
        client_seconds += float(reply.values.get("fit-seconds", 0.0))
        valid = np.isfinite(scores)
        n_points = models[reply.partition_id].n_points
        totals += np.where(valid, scores, 0.0) * n_points
        weight_sum += np.where(valid, n_points, 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        silhouettes = np.where(weight_sum > 0, totals / np.maximum(weight_sum, 1), np.nan)
    k_hats = np.array([agg.k_hat for agg in aggregations])
    # The paper keeps k_hat "not significantly" above sqrt(sum_g K_g); guard_factor says how far is significant.
    guard = alg["guard_factor"] * math.sqrt(sum(m.n_components for m in models.values()))
    if np.all(np.isnan(silhouettes)):
        log.warning("no client could score a silhouette; upsilon falls back to the grid's median value")
        chosen = len(grid) // 2
    else:
        chosen = select_upsilon(silhouettes, k_hats, guard)
    log.info("upsilon tuning: grid %s, silhouettes %s, K_hat %s -> upsilon %g",
             grid, np.round(silhouettes, 4).tolist(), k_hats.tolist(), grid[chosen])
    tuning = {"grid": grid, "silhouettes": silhouettes, "k_hats": k_hats, "guard": guard}
    return grid[chosen], tuning, {"server": server_seconds + time.perf_counter() - start, "clients": client_seconds}


def _evaluate(
    federation: Federation, models: Mapping[int, ClientModel], final: Components, aggregation: FinalAggregation
) -> tuple[dict[str, float], dict[str, float]]:
    """Clients label their test points with the consensus model.

    Returns
    -------
    metrics : dict
        N_g-weighted local ARI, pooled (global) ARI and K_hat (clusters receiving test points).
    client_aris : dict
        Each client's own local ARI, keyed by partition id.
    """
    slices = final.slices()
    payloads = {
        models[p].node_id: {
            "centroids": aggregation.global_centroids[aggregation.labels[part]],
            "global-ids": aggregation.labels[part],
        }
        for p, part in slices.items()
    }
    replies = federation.exchange(TASK_GEM_EVALUATE, "evaluate", payloads, message_type=MessageType.EVALUATE)
    aris, weights, triplets, client_aris = [], [], [], {}
    has_labels = True
    for reply in replies:
        try:
            counts = require_array(reply.arrays, "counts", (None,), nonnegative=True)
            true_values = require_array(reply.arrays, "true-values", counts.shape)
            pred_values = require_array(reply.arrays, "pred-values", counts.shape)
            local = float(reply.values["local-ari"])
        except (InvalidReply, KeyError, TypeError, ValueError) as err:
            federation.reject(reply.node_id, "evaluate", f"invalid reply: {err}")
            continue
        has_labels = has_labels and bool(reply.values.get("has-labels", True))
        aris.append(local)
        client_aris[str(reply.partition_id)] = local
        weights.append(models[reply.partition_id].n_points)
        triplets.append((true_values.astype(np.int64), pred_values.astype(np.int64), counts.astype(np.int64)))
    if not triplets:
        return {"local_ari": float("nan"), "global_ari": float("nan"), "k_hat": 0}, client_aris
    true_all, pred_all, count_all = (np.concatenate(parts) for parts in zip(*triplets))
    evaluation = {"k_hat": k_hat_from_predictions(pred_all, count_all)}
    if has_labels:
        evaluation["local_ari"] = weighted_local_ari(np.asarray(aris), np.asarray(weights))
        evaluation["global_ari"] = ari_from_contingency(true_all, pred_all, count_all)
    return evaluation, client_aris


def run_baselines(cfg: Mapping[str, Any]) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """The in-process comparators on the same clients' data, scored like FedGEM.

    The server regenerates the scenario's data for this (a simulation), never from the clients.
    """
    scenario = cfg["scenario"]
    clients = [scenario_client_data(scenario, p, int(cfg["seed"])) for p in range(client_count(scenario))]
    true_k = true_n_clusters(scenario)
    seed = int(cfg["seed"])
    runs = {
        "central-gmm": lambda: central_gmm(clients, true_k, n_init=cfg["algorithm"]["n_init"], random_state=seed),
        "dp-gmm": lambda: dp_gmm(clients, random_state=seed),
        "k-fed": lambda: k_fed(clients, true_k, random_state=seed),
        "fed-kmeans": lambda: fed_kmeans(clients, true_k, random_state=seed),
    }
    result_metrics, timings = {}, {}
    for name in cfg["baseline_methods"]:
        outcome = runs[name]()
        scores = evaluate_clustering(clients, outcome.test_labels)
        scores["k_true"] = true_k
        result_metrics[name] = scores
        timings[name] = outcome.fit_seconds
    return result_metrics, timings

