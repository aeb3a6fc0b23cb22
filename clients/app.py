"""fedica's ClientApp: route the message type with Flower's decorators, call :mod:`fedica`, reply.

:func:`make_client_app` builds a ClientApp that answers fedica's RF-ICA and FedGEM tasks on the
site's own array (``load_data(context)``, shape (n_samples, n_features)): what a user's own
Flower app uses with ``RFICAStrategy`` or ``FedGEMStrategy``. ``app`` is fedica's own ClientApp:
each client makes its data from the run's scenario and seed and its partition id (or reads its
own file), as configured in the message. No data ever leaves a client, only the estimates the
protocol names.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

import numpy as np
from fedica.server.records import CLIENT_ERROR_CODE, pack, unpack
from flwr.app import Array, ArrayRecord, Context, Error, Message, MetricRecord
from flwr.clientapp import ClientApp

from fedica import attacks
from fedica.config import client_count
from fedica.data.common import ClientData
from fedica.data.ica_paper import ica_client_data, ica_true_mixing
from fedica.data.scenarios import scenario_client_data
from fedica.fedgem import client as gem_client
from fedica.fedgem.local import estimate_n_components
from fedica.protocol import (
    CATEGORY,
    ERROR_KEY,
    EVALUATE,
    GEM_EVALUATE,
    GEM_FINAL,
    GEM_INIT,
    GEM_LIKELIHOOD,
    GEM_ROUND,
    GEM_SILHOUETTE,
    RFICA_FIT,
)
from fedica.rfica import client as ica_client
from fedica.seeding import generator, sklearn_seed

log = logging.getLogger("fedica.client")

STATE_KEY = "fedgem"
LOCAL_CLUSTERS_KEY = "fedgem-local-clusters"

Handler = Callable[[dict[str, np.ndarray], dict[str, Any], int, Context], tuple[dict[str, np.ndarray], dict[str, Any]]]


class ScenarioSource:
    """fedica's own clients: data from the run's scenario (``values["cfg"]``), hostile on an ``attack`` config."""

    def gem_data(self, values: Mapping[str, Any], partition_id: int, context: Context) -> ClientData:
        cfg = _run_config(values)
        scenario = dict(cfg["scenario"])
        if scenario["name"] == "files" and "data-path" in context.node_config:
            # In a deployment each site names its own file in its node config.
            scenario["paths"] = list(scenario["paths"])
            while len(scenario["paths"]) <= partition_id:
                scenario["paths"].append("")
            scenario["paths"][partition_id] = str(context.node_config["data-path"])
        return scenario_client_data(scenario, partition_id, int(cfg["seed"]))

    def ica_data(self, values: Mapping[str, Any], partition_id: int, context: Context) -> np.ndarray:
        cfg = _run_config(values)
        return _ica_data(partition_id, json.dumps(cfg["scenario"], sort_keys=True), cfg["seed"])

    def hostile_kind(self, values: Mapping[str, Any], partition_id: int) -> str | None:
        cfg = _run_config(values)
        attack = cfg["attack"]
        if attack["kind"] == "none" or attack["fraction"] == 0:
            return None
        hostile = attacks.hostile_mask(client_count(cfg["scenario"]), attack["fraction"], seed=cfg["seed"])
        return attack["kind"] if hostile[partition_id] else None


class ArraySource:
    """A user's clients: the site's own array from ``load_data(context)``; K_g given or estimated by BIC."""

    def __init__(self, load_data: Callable[[Context], Any], n_components: int | None, max_components: int):
        self.load_data = load_data
        self.n_components = n_components
        self.max_components = max_components

    def _points(self, context: Context) -> np.ndarray:
        X = np.asarray(self.load_data(context), dtype=np.float64)
        if X.ndim != 2 or not np.all(np.isfinite(X)):
            raise ValueError(f"load_data must return a finite 2-D array (n_samples, n_features), got shape {X.shape}")
        return X

    def gem_data(self, values: Mapping[str, Any], partition_id: int, context: Context) -> ClientData:
        X = self._points(context)
        if self.n_components is not None:
            k = int(self.n_components)
        elif LOCAL_CLUSTERS_KEY in context.state:
            k = int(context.state[LOCAL_CLUSTERS_KEY]["k"])
        else:
            rng = generator(int(values["seed"]), "client.kmeanspp", partition_id)
            k = estimate_n_components(X, self.max_components, random_state=sklearn_seed(rng))
            context.state[LOCAL_CLUSTERS_KEY] = MetricRecord({"k": k})
        return ClientData(X, None, X[:0], None, k)

    def ica_data(self, values: Mapping[str, Any], partition_id: int, context: Context) -> np.ndarray:
        return self._points(context).T

    def hostile_kind(self, values: Mapping[str, Any], partition_id: int) -> str | None:
        return None


def make_client_app(load_data: Callable[[Context], Any], n_components: int | None = None,
                    max_components: int = 10) -> ClientApp:
    """A ClientApp that answers fedica's tasks on the site's own data.

    Parameters
    ----------
    load_data : callable
        ``load_data(context)`` returns the site's array of shape (n_samples, n_features), e.g.
        ``np.load(context.node_config["data-path"])``.
    n_components : int or None, default=None
        FedGEM's K_g for this site; None: the site chooses by BIC over 2..``max_components``.
    max_components : int, default=10

    Returns
    -------
    flwr.clientapp.ClientApp
    """
    return _client_app(ArraySource(load_data, n_components, max_components))


def _client_app(source) -> ClientApp:
    client_app = ClientApp()
    tasks: dict[str, Handler] = {
        RFICA_FIT: lambda a, v, p, c: _rfica_fit(source, a, v, p, c),
        GEM_INIT: lambda a, v, p, c: _gem_init(source, a, v, p, c),
        GEM_ROUND: lambda a, v, p, c: _gem_round(source, a, v, p, c),
        GEM_FINAL: lambda a, v, p, c: _gem_final(source, a, v, p, c),
        GEM_SILHOUETTE: lambda a, v, p, c: _gem_silhouette(source, a, v, p, c),
        GEM_LIKELIHOOD: lambda a, v, p, c: _gem_likelihood(source, a, v, p, c),
        GEM_EVALUATE: lambda a, v, p, c: _gem_evaluate(source, a, v, p, c),
    }
    for task, handler in tasks.items():
        register = client_app.evaluate if CATEGORY[task] == EVALUATE else client_app.train
        register(task)(_responder(handler))
    return client_app


def _responder(handler: Handler) -> Callable[[Message, Context], Message]:
    def respond(msg: Message, context: Context) -> Message:
        partition_id = None
        try:
            partition_id = _partition_id(context)
            arrays, values = unpack(msg.content)
            reply_arrays, reply_values = handler(arrays, values, partition_id, context)
            reply_values["partition-id"] = partition_id
            return Message(pack(reply_arrays, reply_values), reply_to=msg)
        except Exception as err:  # noqa: BLE001 - any failure becomes a reply the server can log
            reason = f"{type(err).__name__}: {err}"
            log.warning("client %s replies with an error: %s", partition_id, reason)
            if partition_id is None:
                return Message(Error(code=CLIENT_ERROR_CODE, reason=reason), reply_to=msg)
            # A client that knows who it is says so, so that the server's books name it.
            return Message(pack({}, {"partition-id": partition_id, ERROR_KEY: reason}), reply_to=msg)

    return respond


def _partition_id(context: Context) -> int:
    node_config = context.node_config
    if "partition-id" not in node_config:
        raise ValueError("this SuperNode has no 'partition-id' in its node config (--node-config \"partition-id=0 num-partitions=N\")")
    return int(node_config["partition-id"])


def _run_config(values: Mapping[str, Any]) -> dict[str, Any]:
    if "cfg" not in values:
        raise ValueError("the message carries no run config ('cfg'); fedica's own ClientApp needs fedica's ServerApp")
    return json.loads(values["cfg"])


# ---------------------------------------------------------------- RF-ICA


def _rfica_fit(source, arrays, values, partition_id, context):
    data = source.ica_data(values, partition_id, context)
    reply_arrays, reply_values = ica_client.fit(data, values, partition_id)
    kind = source.hostile_kind(values, partition_id)
    if kind in attacks.ICA_ATTACKS:
        cfg = _run_config(values)
        sc = cfg["scenario"]
        truth = ica_true_mixing(r=sc["r"], orthogonal=sc["orthogonal"], seed=cfg["seed"])
        reply_arrays["mixing"] = attacks.hostile_ica_estimate(kind, truth, attacks.attack_rng(cfg["seed"], partition_id))
    return reply_arrays, reply_values


@lru_cache(maxsize=4)
def _ica_data(partition_id: int, scenario_json: str, seed: int) -> np.ndarray:
    sc = json.loads(scenario_json)
    return ica_client_data(partition_id, n_clients=sc["n_clients"], r=sc["r"], corrupt_ratio=sc["corrupt_ratio"],
                           n_normal=sc["n_normal"], n_corrupt=sc["n_corrupt"], sparsity=sc["sparsity"],
                           orthogonal=sc["orthogonal"], seed=seed)


# ---------------------------------------------------------------- FedGEM


def _store_centroids(context: Context, centroids: np.ndarray) -> None:
    context.state[STATE_KEY] = ArrayRecord({"centroids": Array(np.ascontiguousarray(centroids))})


def _received_centroids(arrays: Mapping[str, np.ndarray], data: ClientData, context: Context) -> np.ndarray:
    """The centroids the server sent (adopted as the client's model), or its own if it sent none."""
    if "centroids" in arrays:
        centroids = gem_client.checked_centroids(arrays["centroids"], data.n_components, data.X_train.shape[1])
    elif STATE_KEY in context.state:
        centroids = context.state[STATE_KEY]["centroids"].numpy()
    else:
        raise ValueError("no centroids: the server sent none and this client was never initialised")
    _store_centroids(context, centroids)
    return centroids


def _gem_init(source, arrays, values, partition_id, context):
    data = source.gem_data(values, partition_id, context)
    reply = gem_client.initialise(data.X_train, data.n_components, values, partition_id)
    _store_centroids(context, reply[0]["centroids"])
    return reply


def _gem_round(source, arrays, values, partition_id, context):
    data = source.gem_data(values, partition_id, context)
    reply_arrays, reply_values = gem_client.collaborative_round(data.X_train, _received_centroids(arrays, data, context), values)
    return _hostile_gem(source, values, partition_id, reply_arrays, reply_values)


def _gem_final(source, arrays, values, partition_id, context):
    data = source.gem_data(values, partition_id, context)
    reply_arrays, reply_values = gem_client.final_step(data.X_train, _received_centroids(arrays, data, context))
    reply_arrays["radii"] = np.zeros(data.n_components)
    reply_arrays, reply_values = _hostile_gem(source, values, partition_id, reply_arrays, reply_values)
    del reply_arrays["radii"]  # the server computes the final radii itself
    return reply_arrays, reply_values


def _hostile_gem(source, values, partition_id, reply_arrays, reply_values):
    """A hostile client's replacement of its honest reply (``attack`` config); an honest client's reply unchanged."""
    kind = source.hostile_kind(values, partition_id)
    if kind not in attacks.GEM_ATTACKS:
        return reply_arrays, reply_values
    cfg = _run_config(values)
    rng = attacks.attack_rng(cfg["seed"], partition_id, _stage(values))
    maximisers, radii, n_points = attacks.hostile_gem_reply(
        kind, reply_arrays["maximisers"], reply_arrays["radii"], reply_values["n-points"], rng)
    return {**reply_arrays, "maximisers": maximisers, "radii": radii}, {**reply_values, "n-points": n_points}


def _stage(values: Mapping[str, Any]) -> int:
    """The protocol stage as a number: the round, or a fixed code for a named stage."""
    label = str(values.get("server-round", "0"))
    return int(label) if label.isdigit() else zlib.crc32(label.encode())


def _gem_silhouette(source, arrays, values, partition_id, context):
    data = source.gem_data(values, partition_id, context)
    return gem_client.silhouettes(data.X_train, arrays["candidates"], data.n_components, values, partition_id)


def _gem_likelihood(source, arrays, values, partition_id, context):
    data = source.gem_data(values, partition_id, context)
    return gem_client.likelihoods(data.X_train, arrays["centres"], arrays["sizes"])


def _gem_evaluate(source, arrays, values, partition_id, context):
    data = source.gem_data(values, partition_id, context)
    centroids = _received_centroids(arrays, data, context)
    return gem_client.evaluate(data.X_test, data.y_test, centroids, arrays["global-ids"], data.X_train.shape[0])


app = _client_app(ScenarioSource())
