"""``FedGEMStrategy``: FedGEM as a Flower strategy, and fedica's FedGEM run (the result it writes)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from fedica.server.comparators import flower_driver
from fedica.server.federation import Federation
from fedica.server.strategy import ProtocolStrategy
from flwr.app import Array, ArrayRecord, MetricRecord

from fedica.data.files import read_rows
from fedica.data.scenarios import scenario_client_data, true_n_clusters
from fedica.evaluation.baselines import evaluate_clustering, run_baselines
from fedica.fedgem.local import assign_labels
from fedica.fedgem.server import FedGEMServer, FedGEMSettings
from fedica.parameters import FEDGEM_PARAMETERS as _P
from fedica.protocol import GEM_EVALUATE, GEM_FINAL, GEM_ROUND, GEM_SILHOUETTE, Request

log = logging.getLogger("fedica.server")


class FedGEMStrategy(ProtocolStrategy):
    """FedGEM (federated generalized EM, unknown global K) as a Flower ``Strategy``.

    The clients must run a ClientApp that answers fedica's FedGEM tasks, e.g.
    ``fedica.clients.make_client_app(load_data)``. ``start(grid)`` runs the initial exchange,
    ``rounds`` collaborative rounds, the final stage, the upsilon tuning (``upsilon="auto"``)
    and the final aggregation: the same numerical path as :class:`fedica.FedGEM`.

    Parameters
    ----------
    rounds, local_steps, upsilon, upsilon_grid, upsilon_criterion, guard_factor, n_init, silhouette_sample,
    radius_outlier_factor, count_cap_factor, component_cap_factor, max_hostile_fraction, max_overlap_pairs, participation,
    random_state
        As for :class:`fedica.FedGEM`: declared in :data:`fedica.parameters.FEDGEM_PARAMETERS`, and checked
        against it here (``ValueError`` or ``TypeError`` naming the parameter).
    evaluate : bool, default=False
        End with an evaluation stage: clients label their held-out points and report
        contingency counts (fedica's own scenarios hold labels).
    min_available_nodes, min_clients, node_wait_timeout, client_config
        As for :class:`fedica.server.strategy.ProtocolStrategy`.

    Attributes
    ----------
    n_clusters_ : int
    means_ : ndarray of shape (n_clusters_, n_features)
    site_mapping_ : dict of int to ndarray of shape (K_g,)
        Global id of each local component, by partition id.
    upsilon_ : float
    history_ : list of dict
    server : FedGEMServer
        The protocol's state (everything the run computed).
    """

    # The defaults and rules are fedica.parameters.FEDGEM_PARAMETERS', as for fedica.FedGEM.
    def __init__(self, *, rounds: int = _P["rounds"].default, local_steps: int = _P["local_steps"].default,
                 upsilon: float | str = _P["upsilon"].default, upsilon_grid=_P["upsilon_grid"].default,
                 upsilon_criterion: str = _P["upsilon_criterion"].default,
                 guard_factor: float = _P["guard_factor"].default, n_init: int = _P["n_init"].default,
                 silhouette_sample: int = _P["silhouette_sample"].default,
                 radius_outlier_factor: float | None = _P["radius_outlier_factor"].default,
                 count_cap_factor: float | None = _P["count_cap_factor"].default,
                 component_cap_factor: float | None = _P["component_cap_factor"].default,
                 max_hostile_fraction: float = _P["max_hostile_fraction"].default,
                 max_overlap_pairs: int | None = _P["max_overlap_pairs"].default,
                 participation: float = _P["participation"].default, random_state: int = _P["random_state"].default,
                 evaluate: bool = False, **kwargs: Any):
        parameters = dict(rounds=rounds, local_steps=local_steps, upsilon=upsilon, upsilon_grid=upsilon_grid,
                          upsilon_criterion=upsilon_criterion, guard_factor=guard_factor, n_init=n_init,
                          silhouette_sample=silhouette_sample, radius_outlier_factor=radius_outlier_factor,
                          count_cap_factor=count_cap_factor, component_cap_factor=component_cap_factor,
                          max_hostile_fraction=max_hostile_fraction, max_overlap_pairs=max_overlap_pairs,
                          participation=participation, random_state=random_state)
        _P.check(parameters)  # at construction: a bad value is one line now, not a failure after the rounds
        super().__init__(**kwargs)
        del parameters["random_state"]
        self.settings = FedGEMSettings(**{**parameters, "upsilon_grid": tuple(upsilon_grid)},
                                       min_clients=self.min_clients, seed=int(random_state))
        self.evaluate = bool(evaluate)
        self.server: FedGEMServer | None = None

    def protocol(self):
        self.server = FedGEMServer(self.settings, evaluate=self.evaluate, rejected=self.federation.rejected)
        return self.server.run()

    def model_arrays(self) -> ArrayRecord:
        if self.server is None or self.server.aggregation is None:
            return ArrayRecord()
        return ArrayRecord({"means": Array(np.ascontiguousarray(self.server.aggregation.global_centroids))})

    def stage_metrics(self, request: Request) -> MetricRecord | None:
        server = self.server
        if request.task == GEM_ROUND and server.history:
            last = server.history[-1]
            return MetricRecord({"super-clusters": int(last["super_clusters"]), "mean-radius": last["mean_radius"],
                                 "centroid-shift": last["centroid_shift"]})
        if request.task in (GEM_FINAL, GEM_SILHOUETTE) and server.aggregation is not None:
            return MetricRecord({"k-hat": int(server.aggregation.k_hat), "upsilon": float(server.upsilon)})
        if request.task == GEM_EVALUATE and server.evaluation:
            return MetricRecord({k.replace("_", "-"): float(v) for k, v in server.evaluation.items()})
        return None

    def summary(self) -> None:
        log.info("FedGEMStrategy: %s, evaluate=%s", self.settings, self.evaluate)

    @property
    def n_clusters_(self) -> int:
        return int(self.server.aggregation.k_hat)

    @property
    def means_(self) -> np.ndarray:
        return self.server.aggregation.global_centroids

    @property
    def site_mapping_(self) -> dict[int, np.ndarray]:
        labels = self.server.aggregation.labels
        return {p: labels[part] for p, part in self.server.final.slices().items()}

    @property
    def upsilon_(self) -> float:
        return self.server.upsilon

    @property
    def history_(self) -> list[dict[str, Any]]:
        return self.server.history


def scenario_silhouettes(cfg: Mapping[str, Any], server: FedGEMServer) -> dict[str, float]:
    """FedGEM's silhouettes (pooled and per client), scored exactly as the comparators'.

    A silhouette needs the points, which never leave a client: for a simulated scenario the
    server regenerates the clients' test data (as for the comparators) and labels it with each
    client's consensus model, as the client itself does in the evaluation stage.
    """
    payloads = server.consensus_payloads()
    partitions = sorted(payloads)
    clients = [scenario_client_data(cfg["scenario"], p, int(cfg["seed"])) for p in partitions]
    labels = [payloads[p]["global-ids"][assign_labels(c.X_test, payloads[p]["centroids"])]
              for p, c in zip(partitions, clients)]
    scores = evaluate_clustering(clients, labels)
    return {key: scores[key] for key in ("silhouette", "local_silhouette")}


def write_site_labels(result: Mapping[str, Any], out_dir: str | os.PathLike) -> list[str]:
    """Every site's rows labelled with its consensus model: ``labels_site<g>.csv`` (``row,cluster``) in ``out_dir``.

    For a FedGEM run on ``scenario=files``: ``row`` counts the file's data rows from 0 (a header is
    not a row), ``cluster`` is the global cluster id, as in ``fedgem.global_centroids``; each site's
    rows go to the nearest of its consensus centroids, as the site itself labels its points. The
    files are read here, so only where every site's file is on this machine (not a deployment,
    whose sites keep their files and labels). Returns the files written (none for other runs).
    """
    scenario = result["scenario"]
    if result["algorithm"] != "fedgem" or scenario["name"] != "files" or result["engine"] == "deployment":
        return []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    centroids = np.asarray(result["fedgem"]["global_centroids"], dtype=np.float64)
    written = []
    for partition, global_ids in sorted(result["fedgem"]["client_mapping"].items(), key=lambda item: int(item[0])):
        global_ids = np.asarray(global_ids, dtype=np.int64)
        X = read_rows(scenario["paths"][int(partition)], label_column=scenario.get("label_column"))
        clusters = global_ids[assign_labels(X, centroids[global_ids])]
        path = out_dir / f"labels_site{partition}.csv"
        np.savetxt(path, np.c_[np.arange(X.shape[0]), clusters], fmt="%d", delimiter=",", header="row,cluster", comments="")
        written.append(str(path))
    return written


def run_fedgem(federation: Federation, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """fedica's FedGEM run over a federation: the strategy, then the result's sections (and the baselines).

    Returns
    -------
    partial_result : dict
        ``metrics``, ``clients``, ``history``, ``timings`` and ``fedgem`` entries of the result.
    """
    alg = cfg["algorithm"]
    settings = FedGEMSettings.from_config(alg, min_clients=int(cfg["min_clients"]), seed=int(cfg["seed"]))
    strategy = FedGEMStrategy(**{k: v for k, v in vars(settings).items() if k not in ("min_clients", "seed")},
                              random_state=settings.seed, evaluate=True, min_clients=settings.min_clients,
                              min_available_nodes=federation.expected, client_config=federation.common_values)
    try:
        strategy.start(federation.grid, timeout=federation.round_timeout, federation=federation)
    finally:
        if strategy.server is not None:
            federation.history.extend(strategy.server.history)
    server = strategy.server
    fedgem_metrics = {**server.evaluation, "super_clusters": server.aggregation.k_hat, "upsilon": server.upsilon,
                      "rounds": alg["rounds"]}
    if federation.hostile_partitions:
        # The books know who was hostile (the server never did): the honest clients' view beside everyone's.
        honest = [p for p in server.evaluated if p not in set(federation.hostile_partitions)]
        fedgem_metrics.update({f"honest_{k}": v for k, v in server.evaluation_over(honest).items()})
    true_k = true_n_clusters(cfg["scenario"])
    if true_k is not None:
        fedgem_metrics["k_true"] = true_k
    if cfg["scenario"]["name"] != "files":
        fedgem_metrics.update(scenario_silhouettes(cfg, server))

    result_metrics = {"fedgem": fedgem_metrics}
    timings = {"fedgem": server.client_seconds + server.server_seconds, "fedgem_clients_sum": server.client_seconds,
               "fedgem_server": server.server_seconds}
    if cfg["baselines"] and cfg["scenario"]["name"] != "files":
        start = time.perf_counter()
        baseline_metrics, baseline_timings = run_baselines(cfg["scenario"], cfg["baseline_methods"], seed=int(cfg["seed"]),
                                                           n_init=alg["n_init"], driver=flower_driver(federation),
                                                           partitions=server.final.partitions)
        log.info("baselines %s in %.2f s", list(baseline_metrics), time.perf_counter() - start)
        result_metrics.update(baseline_metrics)
        timings.update(baseline_timings)
    mapping = {str(p): labels.tolist() for p, labels in strategy.site_mapping_.items()}
    return {
        "metrics": result_metrics,
        "clients": federation.clients_record(len(server.final.partitions)),
        "history": server.history,
        "timings": timings,
        "fedgem": {
            "global_centroids": server.aggregation.global_centroids,
            "client_mapping": mapping,
            "client_local_ari": server.client_aris,
            "local_clusters": {str(p): m.n_components for p, m in sorted(server.models.items())},
            "upsilon": server.upsilon,
            "upsilon_tuning": server.tuning,
            "participation": federation.participation,
            "hostile_clients": federation.hostile_partitions,
        },
    }
