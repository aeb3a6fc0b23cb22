"""Engines: the ways one configured run is driven. Each calls :func:`fedica.server.harness.runner.run_federation`.

- ``simulation``: Flower's simulation runtime (Ray), one ClientApp per simulated SuperNode.
- ``inprocess``: the same ServerApp logic and the same ClientApp, with messages handed
  over in memory by :class:`fedica.server.inprocess.InProcessGrid` (no Ray, no transport) for fast sweeps.
- ``deployment``: real SuperLink and SuperNode processes (``scripts.deploy``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from fedica.clients.app import LOCAL_ENGINE_VARIABLE
from fedica.scripts.nodes import node_configs
from fedica.server.app import configure_logging
from fedica.server.harness.runner import run_federation
from fedica.server.inprocess import InProcessGrid
from fedica.server.simulation_state import node_filtered_message_lookup
from flwr.app import Context
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedica.config import client_count
from fedica.protocol import message_type
from fedica.tasks import CLIENT_TASKS
from fedica.protocol import Journal

log = logging.getLogger("fedica.server")


def run_engine(cfg: Mapping[str, Any], journal: Journal | None = None) -> dict[str, Any]:
    """Run ``cfg`` on the engine it names (``cfg["engine"]["name"]``) and return the result.

    ``journal`` (the in-process engine; a deployment's ServerApp keeps its own): every stage is
    recorded there and the stages it holds are replayed (:func:`fedica.server.harness.runner.run_federation`).
    """
    configure_logging(cfg.get("log_level", "INFO"))
    engine = cfg["engine"]["name"]
    if engine == "simulation":
        return run_simulation_engine(cfg)
    if engine == "inprocess":
        return run_inprocess(cfg, journal=journal)
    from fedica.scripts.deploy import run_deployment

    return run_deployment(cfg)


def run_inprocess(cfg: Mapping[str, Any], client_app: ClientApp | None = None,
                  journal: Journal | None = None) -> dict[str, Any]:
    """Drive the federation with :class:`InProcessGrid`: same code, no transport (``journal``: as for :func:`run_engine`)."""
    from fedica.clients.app import app as default_client_app

    os.environ[LOCAL_ENGINE_VARIABLE] = "1"  # the clients are this user's: they read the files the config names
    # fedica's ClientApp answers its registry's concurrent tasks on threads; a given ClientApp, one message at a time.
    # A config of another engine (a run driven in-process from it) takes conf/engine/inprocess.yaml's every core.
    concurrent = [] if client_app is not None else [message_type(task) for task in CLIENT_TASKS.concurrent]
    grid = InProcessGrid(client_app or default_client_app, node_configs(cfg), seed=int(cfg["seed"]),
                         concurrent_types=concurrent, n_jobs=cfg["engine"].get("n_jobs", -1))
    return run_federation(grid, cfg, bound_partitions=grid.node_partitions, journal=journal)


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
    with warnings.catch_warnings(), node_filtered_message_lookup():
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
