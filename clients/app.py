"""fedica's ClientApp: decode the server's message, call fedica, encode the reply.

One ClientApp serves both algorithms; the task travels in the message. Each client
makes its own data from the run's seed and its partition id (or reads its own
file): no data ever leaves it, only the estimates the protocol names.
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

import numpy as np
from fedica.server.records import (
    CLIENT_ERROR_CODE,
    ERROR_KEY,
    TASK_GEM_EVALUATE,
    TASK_GEM_FINAL,
    TASK_GEM_INIT,
    TASK_GEM_ROUND,
    TASK_GEM_SILHOUETTE,
    TASK_RFICA_FIT,
    pack,
    unpack,
)
from flwr.app import Array, ArrayRecord, Context, Error, Message
from flwr.clientapp import ClientApp

from fedica import attacks
from fedica.config import client_count
from fedica.data.common import ClientData
from fedica.data.ica_paper import ica_client_data, ica_true_mixing
from fedica.data.scenarios import scenario_client_data
from fedica.evaluation.metrics import adjusted_rand, contingency, mean_silhouettes
from fedica.fedgem.local import (
    assign_labels,
    em_step,
    final_radius,
    kmeanspp_init,
    local_round,
)
from fedica.rfica.local import local_fastica
from fedica.seeding import generator

log = logging.getLogger("fedica.client")

app = ClientApp()

STATE_KEY = "fedgem"


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local fitting tasks: RF-ICA's FastICA; FedGEM's initialisation, rounds and final stage."""
    return _handle(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """FedGEM's silhouette scoring for the upsilon tuning and the final evaluation."""
    return _handle(msg, context)


def _handle(msg: Message, context: Context) -> Message:
    partition_id = None
    try:
        partition_id = _partition_id(context)
        arrays, values = unpack(msg.content)
        cfg = json.loads(values["cfg"])
        handler = _TASKS[values["task"]]
        reply_arrays, reply_values = handler(arrays, values, cfg, partition_id, context)
        reply_values["partition-id"] = partition_id
        return Message(pack(reply_arrays, reply_values), reply_to=msg)
    except Exception as err:  # noqa: BLE001 - any failure becomes a reply the server can log
        reason = f"{type(err).__name__}: {err}"
        log.warning("client %s replies with an error: %s", partition_id, reason)
        if partition_id is None:
            return Message(Error(code=CLIENT_ERROR_CODE, reason=reason), reply_to=msg)
        # A client that knows who it is says so, so that the server's books name it.
        return Message(pack({}, {"partition-id": partition_id, ERROR_KEY: reason}), reply_to=msg)


def _partition_id(context: Context) -> int:
    node_config = context.node_config
    if "partition-id" not in node_config:
        raise ValueError("this SuperNode has no 'partition-id' in its node config (--node-config \"partition-id=0 num-partitions=N\")")
    return int(node_config["partition-id"])


def _is_hostile(cfg: Mapping[str, Any], partition_id: int, n_clients: int) -> bool:
    attack = cfg["attack"]
    if attack["kind"] == "none" or attack["fraction"] == 0:
        return False
    return bool(attacks.hostile_mask(n_clients, attack["fraction"], seed=cfg["seed"])[partition_id])


# ---------------------------------------------------------------- RF-ICA


def _rfica_fit(arrays, values, cfg, partition_id, context):
    sc, alg = cfg["scenario"], cfg["algorithm"]
    data = _ica_data(partition_id, json.dumps(sc, sort_keys=True), cfg["seed"])
    start = time.perf_counter()
    estimate = local_fastica(
        data,
        contrast=alg["contrast"],
        init=alg["init"],
        random_state=generator(cfg["seed"], "client.fastica", partition_id),
        shared_init_seed=cfg["seed"],
    )
    seconds = time.perf_counter() - start
    if _is_hostile(cfg, partition_id, sc["n_clients"]):
        truth = ica_true_mixing(r=sc["r"], orthogonal=sc["orthogonal"], seed=cfg["seed"])
        estimate = attacks.hostile_ica_estimate(cfg["attack"]["kind"], truth, attacks.attack_rng(cfg["seed"], partition_id))
    return {"mixing": estimate}, {"n-samples": data.shape[1], "fit-seconds": seconds}


@lru_cache(maxsize=4)
def _ica_data(partition_id: int, scenario_json: str, seed: int) -> np.ndarray:
    sc = json.loads(scenario_json)
    return ica_client_data(
        partition_id,
        n_clients=sc["n_clients"],
        r=sc["r"],
        corrupt_ratio=sc["corrupt_ratio"],
        n_normal=sc["n_normal"],
        n_corrupt=sc["n_corrupt"],
        sparsity=sc["sparsity"],
        orthogonal=sc["orthogonal"],
        seed=seed,
    )


# ---------------------------------------------------------------- FedGEM


def _gem_data(cfg: Mapping[str, Any], partition_id: int, context: Context) -> ClientData:
    scenario = dict(cfg["scenario"])
    if scenario["name"] == "files" and "data-path" in context.node_config:
        # In a deployment each site names its own file in its node config.
        scenario["paths"] = list(scenario["paths"])
        while len(scenario["paths"]) <= partition_id:
            scenario["paths"].append("")
        scenario["paths"][partition_id] = str(context.node_config["data-path"])
    return scenario_client_data(scenario, partition_id, int(cfg["seed"]))


def _gem_weights(data: ClientData) -> np.ndarray:
    return np.full(data.n_components, 1.0 / data.n_components)


def _store_centroids(context: Context, centroids: np.ndarray) -> None:
    context.state[STATE_KEY] = ArrayRecord({"centroids": Array(np.ascontiguousarray(centroids))})


def _gem_init(arrays, values, cfg, partition_id, context):
    data = _gem_data(cfg, partition_id, context)
    start = time.perf_counter()
    centroids = kmeanspp_init(
        data.X_train, data.n_components, n_init=cfg["algorithm"]["n_init"], random_state=generator(cfg["seed"], "client.kmeanspp", partition_id)
    )
    seconds = time.perf_counter() - start
    _store_centroids(context, centroids)
    return (
        {"centroids": centroids, "weights": _gem_weights(data)},
        {"n-points": data.X_train.shape[0], "fit-seconds": seconds},
    )


def _received_centroids(arrays: Mapping[str, np.ndarray], data: ClientData, context: Context) -> np.ndarray:
    """The centroids the server sent, or the client's own if it sent none (a client that missed rounds)."""
    if "centroids" in arrays:
        centroids = np.asarray(arrays["centroids"], dtype=np.float64)
        if centroids.shape != (data.n_components, data.X_train.shape[1]) or not np.all(np.isfinite(centroids)):
            raise ValueError(f"the server sent centroids of shape {centroids.shape}; this client fits {data.n_components} in d={data.X_train.shape[1]}")
        return centroids
    if STATE_KEY not in context.state:
        raise ValueError("no centroids: the server sent none and this client was never initialised")
    return context.state[STATE_KEY]["centroids"].numpy()


def _adopt_centroids(arrays, cfg, partition_id, context):
    """Load the client's data and adopt the centroids the server sent (kept in the node's state)."""
    data = _gem_data(cfg, partition_id, context)
    centroids = _received_centroids(arrays, data, context)
    _store_centroids(context, centroids)
    return data, centroids, _gem_weights(data)


def _gem_round(arrays, values, cfg, partition_id, context):
    data, centroids, weights = _adopt_centroids(arrays, cfg, partition_id, context)
    start = time.perf_counter()
    maximisers, radii = local_round(data.X_train, centroids, weights, n_steps=cfg["algorithm"]["local_steps"])
    seconds = time.perf_counter() - start
    maximisers, radii, n_points = _hostile_gem(cfg, partition_id, values, maximisers, radii, data.X_train.shape[0])
    return {"maximisers": maximisers, "radii": radii, "weights": weights}, {"n-points": n_points, "fit-seconds": seconds}


def _hostile_gem(cfg, partition_id, values, maximisers, radii, n_points):
    """A hostile client's replacement of its honest reply (``attack`` config); an honest client's reply unchanged."""
    if not (_is_hostile(cfg, partition_id, client_count(cfg["scenario"])) and cfg["attack"]["kind"] in attacks.GEM_ATTACKS):
        return maximisers, radii, n_points
    rng = attacks.attack_rng(cfg["seed"], partition_id, _stage(values))
    return attacks.hostile_gem_reply(cfg["attack"]["kind"], maximisers, radii, n_points, rng)


def _stage(values: Mapping[str, Any]) -> int:
    """The protocol stage as a number: the round, or a fixed code for a named stage."""
    label = str(values.get("server-round", "0"))
    return int(label) if label.isdigit() else zlib.crc32(label.encode())


def _gem_final(arrays, values, cfg, partition_id, context):
    data, centroids, weights = _adopt_centroids(arrays, cfg, partition_id, context)
    start = time.perf_counter()
    maximisers = em_step(data.X_train, centroids, weights)
    seconds = time.perf_counter() - start
    n_points = data.X_train.shape[0]
    reply_arrays = {"maximisers": maximisers, "weights": weights}
    upsilon = cfg["algorithm"]["upsilon"]
    if upsilon != "auto":
        # The client's own final radius, for the record; the server recomputes it from the same inputs.
        reply_arrays["radii"] = final_radius(maximisers, weights, n_points, float(upsilon))
    maximisers, radii, n_points = _hostile_gem(
        cfg, partition_id, values, maximisers, reply_arrays.get("radii", np.zeros(data.n_components)), n_points
    )
    reply_arrays["maximisers"] = maximisers
    if "radii" in reply_arrays:
        reply_arrays["radii"] = radii
    return reply_arrays, {"n-points": n_points, "fit-seconds": seconds}


def _gem_silhouette(arrays, values, cfg, partition_id, context):
    data = _gem_data(cfg, partition_id, context)
    candidates = np.asarray(arrays["candidates"], dtype=np.float64)
    if candidates.ndim != 3 or candidates.shape[1:] != (data.n_components, data.X_train.shape[1]):
        raise ValueError(f"candidates of shape {candidates.shape} do not fit this client's {data.n_components} components")
    sample = min(cfg["algorithm"]["silhouette_sample"], data.X_train.shape[0])
    rng = generator(cfg["seed"], "client.silhouette_sample", partition_id)
    points = data.X_train[rng.choice(data.X_train.shape[0], size=sample, replace=False)]
    start = time.perf_counter()
    scores = mean_silhouettes(points, [assign_labels(points, centroids) for centroids in candidates])
    seconds = time.perf_counter() - start
    return {"silhouettes": scores}, {"n-points": data.X_train.shape[0], "fit-seconds": seconds}


def _gem_evaluate(arrays, values, cfg, partition_id, context):
    data = _gem_data(cfg, partition_id, context)
    centroids = _received_centroids(arrays, data, context)
    global_ids = np.asarray(arrays["global-ids"]).astype(np.int64)
    if global_ids.shape != (data.n_components,):
        raise ValueError(f"global-ids of shape {global_ids.shape}; this client has {data.n_components} components")
    _store_centroids(context, centroids)
    predicted = global_ids[assign_labels(data.X_test, centroids)]
    reply_values: dict[str, Any] = {"n-points": data.X_train.shape[0], "has-labels": data.y_test is not None}
    if data.y_test is None:
        true_values, pred_values, counts = contingency(np.zeros_like(predicted), predicted)
        reply_values["local-ari"] = 0.0
    else:
        true_values, pred_values, counts = contingency(data.y_test, predicted)
        reply_values["local-ari"] = adjusted_rand(data.y_test, predicted)
    return {"true-values": true_values, "pred-values": pred_values, "counts": counts}, reply_values


_TASKS: dict[str, Callable[..., tuple[dict[str, np.ndarray], dict[str, Any]]]] = {
    TASK_RFICA_FIT: _rfica_fit,
    TASK_GEM_INIT: _gem_init,
    TASK_GEM_ROUND: _gem_round,
    TASK_GEM_FINAL: _gem_final,
    TASK_GEM_SILHOUETTE: _gem_silhouette,
    TASK_GEM_EVALUATE: _gem_evaluate,
}
