"""Engines: the ways one configured run is driven. Each calls :func:`fedica.server.app.run_federation`.

- ``simulation``: Flower's simulation runtime (Ray), one ClientApp per simulated SuperNode.
- ``inprocess``: the same ServerApp logic and the same ClientApp, with messages handed
  over in memory by :class:`InProcessGrid` (no Ray, no transport) for fast sweeps.
- ``deployment``: real SuperLink and SuperNode processes (``scripts.deploy``).
"""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterable, Mapping
from typing import Any
from uuid import uuid4

from fedica.clients.app import LOCAL_ENGINE_VARIABLE
from fedica.scripts.nodes import node_configs
from fedica.server.app import configure_logging, run_federation
from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from fedica.config import client_count

log = logging.getLogger("fedica.server")


def run_engine(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Run ``cfg`` on the engine it names (``cfg["engine"]["name"]``) and return the result."""
    configure_logging(cfg.get("log_level", "INFO"))
    engine = cfg["engine"]["name"]
    if engine == "simulation":
        return run_simulation_engine(cfg)
    if engine == "inprocess":
        return run_inprocess(cfg)
    from fedica.scripts.deploy import run_deployment

    return run_deployment(cfg)


def run_inprocess(cfg: Mapping[str, Any], client_app: ClientApp | None = None) -> dict[str, Any]:
    """Drive the federation with :class:`InProcessGrid`: same code, no transport."""
    from fedica.clients.app import app as default_client_app

    os.environ[LOCAL_ENGINE_VARIABLE] = "1"  # the clients are this user's: they read the files the config names
    grid = InProcessGrid(client_app or default_client_app, node_configs(cfg), seed=int(cfg["seed"]))
    return run_federation(grid, cfg, bound_partitions=grid.node_partitions)


def run_simulation_engine(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Drive the federation with Flower's simulation runtime: on a local Ray, or the cluster ``engine.ray_address`` names."""
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ[LOCAL_ENGINE_VARIABLE] = "1"  # inherited by Ray's workers, which run this user's clients
    import warnings

    from fedica.clients.app import app as client_app
    from flwr.simulation import run_simulation

    outcome: dict[str, Any] = {}
    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        try:
            outcome["result"] = run_federation(grid, cfg)
        except BaseException as err:  # re-raised in the caller's thread below
            outcome["error"] = err

    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    # run_simulation announces its own deprecation at WARNING on every call; the engine is deliberate.
    flwr_log.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", (DeprecationWarning, FutureWarning))
        run_simulation(
            server_app=server_app,
            client_app=client_app,
            num_supernodes=client_count(cfg["scenario"]),
            backend_config={
                "client_resources": {"num_cpus": float(cfg["engine"].get("client_num_cpus", 1)), "num_gpus": 0.0},
                "init_args": {"logging_level": "ERROR", "log_to_driver": False, "address": ray_address(cfg["engine"])},
            },
        )
    flwr_log.setLevel(level)
    if "error" in outcome:
        raise outcome["error"]
    if "result" not in outcome:
        raise RuntimeError("the Flower simulation ended without a result (see the log above)")
    return outcome["result"]


def ray_address(engine: Mapping[str, Any]) -> str:
    """The ``address`` Flower's Ray backend passes to ``ray.init``: the configured cluster, or a new local Ray.

    ``"local"`` rather than no address: Ray would otherwise join a cluster that ``ray start`` left
    running on this machine (or the one ``RAY_ADDRESS`` names), which ``ray_address=null`` does not ask for.
    """
    return engine.get("ray_address") or "local"


class InProcessGrid(Grid):
    """A Grid that delivers each message straight to a ClientApp in this process.

    Every node keeps its own :class:`flwr.app.Context` (so per-node state persists
    across rounds as under Flower's runtimes), and an exception in the ClientApp
    becomes an error reply, as a SuperNode would send. Node ids are random 64-bit
    integers whose order does not follow the partition ids, as in Flower.

    Parameters
    ----------
    client_app : flwr.clientapp.ClientApp
    node_configs : list of dict
        One node config per node (``partition-id``, ``num-partitions``, ...).
    seed : int
        Seeds the node ids.
    """

    def __init__(self, client_app: ClientApp, node_configs: list[dict[str, Any]], *, seed: int = 0):
        self._client_app = client_app
        rng = random.Random(seed)
        self._run = Run.create_empty(run_id=rng.getrandbits(63))
        self._contexts: dict[int, Context] = {}
        for node_config in node_configs:
            node_id = rng.getrandbits(63) + 2  # 0 and 1 are reserved by Flower
            self._contexts[node_id] = Context(self._run.run_id, node_id, dict(node_config), RecordDict(), {})
        self._replies: dict[str, Message] = {}
        # Messages take their run and source ids from the task identity, as inside a ServerApp process.
        TaskIdentity.task_id = 1
        TaskIdentity.run_id = self._run.run_id
        TaskIdentity.node_id = SUPERLINK_NODE_ID

    @property
    def node_partitions(self) -> dict[int, int]:
        """The partition id of every node, from the node configs this grid was built with."""
        return {node: int(context.node_config["partition-id"]) for node, context in self._contexts.items()}

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self._contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for message in messages:
            message_id = str(uuid4())
            message.metadata.__dict__["_message_id"] = message_id
            context = self._contexts.get(message.metadata.dst_node_id)
            if context is None:
                continue
            try:
                reply = self._client_app(message, context)
            except Exception as err:  # noqa: BLE001 - a SuperNode turns a ClientApp exception into an error reply
                reply = Message(
                    Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(err).__name__}: {err}"),
                    reply_to=message,
                )
            self._replies[message_id] = reply
            ids.append(message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))
