"""fedica's ClientApp: route the message type with Flower's decorators to fedica's one task registry, reply.

:func:`make_client_app` builds a ClientApp that answers fedica's RF-ICA and FedGEM tasks on the
site's own array (``load_data(context)``, shape (n_samples, n_features)): what a user's own
Flower app uses with ``RFICAStrategy`` or ``FedGEMStrategy``. ``app`` is fedica's own ClientApp:
each client makes its data from the run's scenario and seed and its partition id (or reads its
own file), as configured in the message. Every message is answered by
:data:`fedica.tasks.CLIENT_TASKS` (the algorithms' handlers, then the chain of reply transforms),
the registry the library's estimators answer with in memory; this module only adapts a Flower
message and context to it (:class:`FlowerSite`). No data ever leaves a client, only the
estimates the protocol names.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np
from fedica.server.records import CLIENT_ERROR_CODE, decode_array, encode_array, pack, unpack
from flwr.app import ArrayRecord, ConfigRecord, Context, Error, Message
from flwr.clientapp import ClientApp

from fedica.sites import ClientData
from fedica.data.files import site_columns
from fedica.data.scenarios import ica_scenario_data, scenario_client_data
from fedica.fedgem.local import choose_n_components
from fedica.fedgem.standardisation import STANDARDISATION_KEY, request_standardisation, standardised
from fedica.attacks.hostile import hostile_kind, split_components_count
from fedica.privacy import NOISE_SECRET_KEY
from fedica.protocol import CATEGORY, COLUMNS_KEY, ERROR_KEY, EVALUATE, RAY_NODE_KEY
from fedica.protocol.tasks import LOCAL_ENGINE_VARIABLE
from fedica.seeding import generator, sklearn_seed
from fedica.tasks import CLIENT_TASKS

log = logging.getLogger("fedica.client")

STATE_KEY = "fedgem"
LOCAL_CLUSTERS_KEY = "fedgem-local-clusters"
# Where a deployed site keeps the OS entropy of its private noise (FlowerSite.noise_secret); a string: 128 bits.
NOISE_SECRET_STATE = "dp-noise-secret"



class ScenarioSource:
    """fedica's own clients: data from the run's scenario (``values["cfg"]``), hostile on an ``attack`` config."""

    def gem_data(self, values: Mapping[str, Any], partition_id: int, context: Context) -> ClientData:
        cfg = _run_config(values)
        data = scenario_client_data(_site_scenario(cfg, partition_id, context), partition_id, int(cfg["seed"]),
                                    standardisation=values.get(STANDARDISATION_KEY))
        if hostile_kind(cfg, partition_id) == "split_components":
            return dataclasses.replace(data, n_components=split_components_count(cfg))
        return data

    def gem_training_points(self, values: Mapping[str, Any], partition_id: int, context: Context) -> np.ndarray:
        cfg = _run_config(values)
        return scenario_client_data(_site_scenario(cfg, partition_id, context), partition_id, int(cfg["seed"])).X_train

    def ica_data(self, values: Mapping[str, Any], partition_id: int, context: Context) -> np.ndarray:
        cfg = _run_config(values)
        return ica_scenario_data(_site_scenario(cfg, partition_id, context), partition_id, int(cfg["seed"]))

    def run_config(self, values: Mapping[str, Any]) -> dict[str, Any]:
        return _run_config(values)

    def columns(self, site: FlowerSite) -> tuple[str, ...] | None:
        """The names of the site's file's columns (:func:`fedica.data.files.site_columns`); None for a generated scenario."""
        if site.run_config["scenario"]["name"] != "files":
            return None
        path = str(_site_scenario(site.run_config, site.partition_id, site.context)["paths"][site.partition_id])
        stat = os.stat(path)
        return _file_columns(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=256)
def _file_columns(path: str, modified_ns: int, size: int) -> tuple[str, ...] | None:
    """:func:`site_columns` of a file as it is now (its modification time and size key the cache): read once a run."""
    return site_columns(path)


def _site_scenario(cfg: Mapping[str, Any], partition_id: int, context: Context) -> dict[str, Any]:
    """The run's scenario as this site sees it: a files site reads the file its own node config names.

    Only fedica's local engines (in-process, simulation), which the user who wrote the config
    runs on their own machine, let a client read a path the server sends
    (:data:`LOCAL_ENGINE_VARIABLE` in the environment the engine gives its clients). A SuperNode
    reads only its node config's ``data-path``: the server cannot point it at any other file.
    """
    scenario = dict(cfg["scenario"])
    if scenario["name"] != "files":
        return scenario
    if "data-path" in context.node_config:
        if scenario.get("standardize") == "pool":
            raise ValueError("scenario.standardize=pool needs every site's file on one machine; a SuperNode reads only "
                             "its own data-path (give algorithm.standardize=federated, or scenario.standardize=site)")
        scenario["paths"] = list(scenario["paths"])
        while len(scenario["paths"]) <= partition_id:
            scenario["paths"].append("")
        scenario["paths"][partition_id] = str(context.node_config["data-path"])
    elif os.environ.get(LOCAL_ENGINE_VARIABLE) != "1":
        raise ValueError("this SuperNode has no 'data-path' in its node config, and it reads no file the server names "
                         "(--node-config \"partition-id=0 num-partitions=N data-path='/my/site.csv'\")")
    return scenario


class ArraySource:
    """A user's clients: the site's own array from ``load_data(context)``; K_g given or chosen by the site's ICL."""

    def __init__(self, load_data: Callable[[Context], Any], n_components: int | None, max_components: int,
                 path_keys: tuple[str, ...] = ()):
        self.load_data = load_data
        self.n_components = n_components
        self.max_components = max_components
        self.path_keys = path_keys
        self._columns: dict[int, tuple[str, ...] | None] = {}  # each node's last load_data columns

    def _points(self, context: Context) -> np.ndarray:
        for key in self.path_keys:
            _check_absolute_path(context, key)
        data = self.load_data(context)
        # A DataFrame names its columns: the site reports them (columns), and the server holds every site to them.
        names = getattr(data, "columns", None)
        self._columns[context.node_id] = None if names is None else tuple(str(name) for name in names)
        X = np.asarray(data, dtype=np.float64)
        if X.ndim != 2 or not np.all(np.isfinite(X)):
            raise ValueError(f"load_data must return a finite 2-D array (n_samples, n_features), got shape {X.shape}")
        return X

    def gem_data(self, values: Mapping[str, Any], partition_id: int, context: Context) -> ClientData:
        X = self._points(context)
        named = request_standardisation(values, X.shape[1])
        if named is not None:  # before the site's K_g choice, which sees the standardised points
            X = standardised(X, *named)
        # The choice is kept for the units it was made in: a run's standardisation is named by every request after the first.
        units = str(values.get(STANDARDISATION_KEY, ""))
        at_bound = False
        if self.n_components is not None:
            k = int(self.n_components)
        elif LOCAL_CLUSTERS_KEY in context.state and context.state[LOCAL_CLUSTERS_KEY].get("units", "") == units:
            k = int(context.state[LOCAL_CLUSTERS_KEY]["k"])
            at_bound = bool(context.state[LOCAL_CLUSTERS_KEY].get("at-bound", False))
        else:
            rng = generator(int(values["seed"]), "client.kmeanspp", partition_id)
            choice = choose_n_components(X, self.max_components, random_state=sklearn_seed(rng))
            k, at_bound = choice.n_components, choice.at_bound
            if at_bound:
                log.warning("site %d chose K_g=%d, its bound: it may hold more clusters, or clusters that spheres fit badly, "
                            "as features in different units make them (the run's algorithm.standardize=federated puts "
                            "every feature on one scale; else give n_components, or raise max_components for a site "
                            "of more points)", partition_id, k)
            context.state[LOCAL_CLUSTERS_KEY] = ConfigRecord({"k": k, "units": units, "at-bound": at_bound})
        return ClientData(X, None, X[:0], None, k, at_bound)

    def gem_training_points(self, values: Mapping[str, Any], partition_id: int, context: Context) -> np.ndarray:
        return self._points(context)

    def ica_data(self, values: Mapping[str, Any], partition_id: int, context: Context) -> np.ndarray:
        return self._points(context).T

    def run_config(self, values: Mapping[str, Any]) -> None:
        return None

    def columns(self, site: FlowerSite) -> tuple[str, ...] | None:
        """The columns of the DataFrame ``load_data`` last returned for this node; None for an array."""
        return self._columns.get(site.context.node_id)


class ContextState(MutableMapping):
    """A site's state between messages (its FedGEM centroids), kept in the Flower context's ``state``.

    The arrays live in one ArrayRecord under :data:`STATE_KEY`, so they persist as long as Flower
    keeps the context (a simulation's actor, a SuperNode's run). They go in and out through the
    records codec's :func:`~fedica.server.records.encode_array` and ``decode_array`` (np.save's
    bytes and np.load's arrays, without parsing a .npy header per array: a site stores its state
    at every message).
    """

    def __init__(self, context: Context):
        self.context = context

    def _record(self) -> ArrayRecord:
        return self.context.state[STATE_KEY] if STATE_KEY in self.context.state else ArrayRecord()

    def __getitem__(self, key: str) -> np.ndarray:
        record = self._record()
        if key not in record:
            raise KeyError(key)
        return decode_array(record[key])

    # The record is changed in place: a new ArrayRecord from every array (Flower's constructor copies each one)
    # took 37 us a write against 17 us (two arrays held), a quarter of a second of a 1,000-site run.
    def __setitem__(self, key: str, value: np.ndarray) -> None:
        if STATE_KEY not in self.context.state:
            self.context.state[STATE_KEY] = ArrayRecord()
        self.context.state[STATE_KEY][key] = encode_array(value)

    def __delitem__(self, key: str) -> None:
        record = self._record()
        if key not in record:
            raise KeyError(key)
        del record[key]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._record().keys()))

    def __len__(self) -> int:
        return len(self._record())


class FlowerSite:
    """The :class:`~fedica.protocol.tasks.Site` of one message: the client's data source and its Flower context."""

    def __init__(self, source, partition_id: int, context: Context, values: Mapping[str, Any]):
        self.source = source
        self.partition_id = partition_id
        self.context = context
        self.state = ContextState(context)
        self.run_config = source.run_config(values)

    @property
    def noise_secret(self) -> int | None:
        """The seed of this site's private noise (docs/ALGORITHMS.md section 2.13); read only by a private request.

        The node config's ``dp-noise-seed`` (its operator's choice), else, under fedica's local
        engines (:data:`LOCAL_ENGINE_VARIABLE`: the server and the sites are one user's), None
        (the run's seed: reproducible), else fresh OS entropy drawn once and kept in the Flower
        context, which stays on the node: a message answered twice repeats its noise rather than
        releasing a second, independent one. Never anything the server sent.
        """
        node_config = self.context.node_config
        if NOISE_SECRET_KEY in node_config:
            secret = node_config[NOISE_SECRET_KEY]
            if isinstance(secret, bool) or not isinstance(secret, int) or secret < 0:
                raise ValueError(f"node config {NOISE_SECRET_KEY}={secret!r}: this site's secret noise seed must be "
                                 f"a non-negative int")
            return secret
        if os.environ.get(LOCAL_ENGINE_VARIABLE) == "1":
            return None
        if NOISE_SECRET_STATE not in self.context.state:
            self.context.state[NOISE_SECRET_STATE] = ConfigRecord({"entropy": str(np.random.SeedSequence().entropy)})
        return int(self.context.state[NOISE_SECRET_STATE]["entropy"])

    def points(self, values: Mapping[str, Any]) -> ClientData:
        return self.source.gem_data(values, self.partition_id, self.context)

    def training_points(self, values: Mapping[str, Any]) -> np.ndarray:
        return self.source.gem_training_points(values, self.partition_id, self.context)

    def observations(self, values: Mapping[str, Any]) -> np.ndarray:
        return self.source.ica_data(values, self.partition_id, self.context)


def make_client_app(load_data: Callable[[Context], Any], n_components: int | None = None,
                    max_components: int = 10, *, path_keys: Sequence[str] = ()) -> ClientApp:
    """A ClientApp that answers fedica's tasks on the site's own data.

    Parameters
    ----------
    load_data : callable
        ``load_data(context)`` returns the site's array of shape (n_samples, n_features), e.g.
        ``np.load(context.node_config["data-path"])``.
    n_components : int or None, default=None
        FedGEM's K_g for this site; None: the site chooses (the ICL over 1..``max_components``, at most ``sqrt(n / 2)``).
    max_components : int, default=10
    path_keys : str or sequence of str, default=()
        Node-config or run-config keys that hold the paths ``load_data`` reads: before it is
        called, each must be there and absolute, or the site replies with a one-line error.

    Returns
    -------
    flwr.clientapp.ClientApp
    """
    keys = (path_keys,) if isinstance(path_keys, str) else tuple(path_keys)  # one key, not its letters
    return _client_app(ArraySource(load_data, n_components, max_components, keys))


def _check_absolute_path(context: Context, key: str) -> None:
    """Refuse the path under ``key`` in the node config (a SuperNode's own), else in the run config, unless absolute.

    A ClientApp runs in the working folder of the SuperLink or SuperNode that started it, not in
    its app's folder, so a relative path would read whatever files that folder holds.
    """
    for name, config in (("node config", context.node_config), ("run config", context.run_config)):
        if key in config:
            path = str(config[key])
            if not os.path.isabs(path):
                raise ValueError(f"{name} {key}={path!r} is a relative path; data paths must be absolute "
                                 f"(a relative one resolves against the folder the SuperLink or SuperNode runs in)")
            return
    raise ValueError(f"neither the node config nor the run config has {key!r}, the absolute path of this site's data")


class _FedicaClientApp(ClientApp):
    """fedica's own ClientApp (``app``), which pickles as a reference to this module's ``app``.

    Flower's simulation hands the ClientApp to a Ray actor with every message, pickled: by value,
    its nested handlers cost about 10 ms of the server process's time and 10 KB per message.
    Every actor imports fedica, so the name is enough, and the actor keeps one ``app``.
    """

    def __reduce__(self):
        return _module_app, ()


def _module_app() -> ClientApp:
    return app


def _client_app(source, app_class: type[ClientApp] = ClientApp) -> ClientApp:
    client_app = app_class()
    for task in CLIENT_TASKS.handlers:
        register = client_app.evaluate if CATEGORY[task] == EVALUATE else client_app.train
        register(task)(_responder(task, source))
    return client_app


def _responder(task: str, source) -> Callable[[Message, Context], Message]:
    """The Flower handler of ``task``: decode, answer through the task registry, encode (or reply with the error)."""
    def respond(msg: Message, context: Context) -> Message:
        partition_id = None
        try:
            partition_id = _partition_id(context)
            arrays, values = unpack(msg.content)
            site = FlowerSite(source, partition_id, context, values)
            reply_arrays, reply_values = CLIENT_TASKS.answer(task, site, arrays, values)
            reply_values.setdefault("partition-id", partition_id)  # a hostile client may claim another
            columns = source.columns(site)
            if columns is not None:  # the server holds every site to the columns most sites name
                reply_values.setdefault(COLUMNS_KEY, json.dumps(list(columns)))
            node = _ray_node_id()
            if node is not None:
                reply_values.setdefault(RAY_NODE_KEY, node)
            return Message(pack(reply_arrays, reply_values), reply_to=msg)
        except Exception as err:  # noqa: BLE001 - any failure becomes a reply the server can log
            reason = f"{type(err).__name__}: {err}"
            log.warning("client %s replies with an error: %s", partition_id, reason)
            if partition_id is None:
                return Message(Error(code=CLIENT_ERROR_CODE, reason=reason), reply_to=msg)
            # A client that knows who it is says so, so that the server's books name it.
            return Message(pack({}, {"partition-id": partition_id, ERROR_KEY: reason}), reply_to=msg)

    return respond


def _ray_node_id() -> str | None:
    """The id of the Ray node this worker runs on, or None outside Ray.

    A Ray worker has always imported ray, so a process that has not is not one (and the
    in-process engine pays no import).
    """
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    return ray.get_runtime_context().get_node_id()


def _partition_id(context: Context) -> int:
    node_config = context.node_config
    if "partition-id" not in node_config:
        raise ValueError("this SuperNode has no 'partition-id' in its node config (--node-config \"partition-id=0 num-partitions=N\")")
    return int(node_config["partition-id"])


def _run_config(values: Mapping[str, Any]) -> dict[str, Any]:
    if "cfg" not in values:
        raise ValueError("the message carries no run config ('cfg'); fedica's own ClientApp needs fedica's ServerApp")
    return json.loads(values["cfg"])


app = _client_app(ScenarioSource(), _FedicaClientApp)
