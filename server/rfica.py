"""RF-ICA's server side: one round of communication, then the robust one-shot aggregation."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
from fedica.server.federation import Federation
from fedica.server.records import TASK_RFICA_FIT

from fedica.data.ica_paper import ica_corrupted_clients, ica_true_mixing
from fedica.evaluation.ica import ica_error
from fedica.protocol import InvalidReply, validate_ica_reply
from fedica.rfica.aggregation import rf_ica_aggregate

log = logging.getLogger("fedica.server")

METHODS = ("rf-ica", "f-ica", "simple-mean", "simple-median")


def run_rfica(federation: Federation) -> dict[str, Any]:
    """Run RF-ICA over a federation and score every method against the scenario's A*.

    Returns
    -------
    partial_result : dict
        The ``metrics``, ``clients``, ``timings`` and ``rfica`` entries of the result.
    """
    cfg = federation.cfg
    sc, alg = cfg["scenario"], cfg["algorithm"]
    nodes = federation.connect()
    replies = federation.exchange(TASK_RFICA_FIT, 1, {node: {} for node in nodes})

    estimates, n_samples, partitions, client_seconds = [], [], [], []
    for reply in replies:
        try:
            mixing, n_k = validate_ica_reply(reply.arrays, reply.values, r=sc["r"])
        except InvalidReply as err:
            federation.reject(reply.node_id, 1, f"invalid reply: {err}")
            continue
        estimates.append(mixing)
        n_samples.append(n_k)
        partitions.append(reply.partition_id)
        client_seconds.append(float(reply.values.get("fit-seconds", 0.0)))
    federation.require(estimates, "RF-ICA round 1")

    start = time.perf_counter()
    aggregate = rf_ica_aggregate(
        np.stack(estimates),
        np.asarray(n_samples),
        benchmark=alg["benchmark"],
        kmeans_restarts=alg["kmeans_restarts"],
        gm_tol=alg["gm_tol"],
        random_state=cfg["seed"],
    )
    server_seconds = time.perf_counter() - start

    truth = ica_true_mixing(r=sc["r"], orthogonal=sc["orthogonal"], seed=cfg["seed"])
    estimates_by_method = {
        "rf-ica": aggregate.rf_ica,
        "f-ica": aggregate.f_ica,
        "simple-mean": aggregate.simple_mean,
        "simple-median": aggregate.simple_median,
    }
    metrics = {name: {"error": ica_error(estimate, truth)} for name, estimate in estimates_by_method.items()}
    fit_seconds = float(np.sum(client_seconds)) + server_seconds
    return {
        "metrics": metrics,
        "clients": federation.clients_record(len(estimates)),
        "timings": {**{name: fit_seconds for name in METHODS}, "clients_sum": float(np.sum(client_seconds)), "server": server_seconds},
        "rfica": {
            "benchmark_client": partitions[aggregate.benchmark],
            "estimate": aggregate.rf_ica,
            "estimates": {name: value for name, value in estimates_by_method.items()},
            "true_mixing": truth,
            "client_partitions": partitions,
            "n_samples": n_samples,
            "corrupted_clients": np.flatnonzero(
                ica_corrupted_clients(n_clients=sc["n_clients"], corrupt_ratio=sc["corrupt_ratio"], seed=cfg["seed"])
            ).tolist(),
            "hostile_clients": federation.hostile_partitions(),
        },
    }

