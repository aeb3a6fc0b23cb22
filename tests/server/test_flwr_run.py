"""The federation's size under ``flwr run``: Flower's simulation runtime refuses a wrong one at once (issue 13, item 7).

The fast tests drive :meth:`Federation.connect` over the Grid that Flower's simulation runtime
gives the ServerApp (an ``InMemoryGrid``, its SuperNodes registered the way the runtime does);
the last one runs ``flwr run`` itself, with its own ``FLWR_HOME`` and local SuperLink port, and
stops that SuperLink by the id of the process that listens on the port.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from fedica.clients.app import app as client_app
from fedica.scripts.deploy import processes
from fedica.server.federation import SIMULATION_SETTLE_SECONDS, Federation
from fedica.server.inprocess import InProcessGrid
from flwr.proto.task_pb2 import Task
from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid

from fedica.protocol import NotEnoughClients

REPO = Path(__file__).resolve().parents[2]
# Long enough that a run which waited for it would be stopped by the hang guard below instead.
LONG_WAIT = 300


def _line(supernodes, clients, scenario="blobs"):
    return (f"the simulation federation has {supernodes} SuperNodes but scenario {scenario} has {clients} clients: "
            f"run flwr run with --federation-config num-supernodes={clients}")


def _simulation_grid(supernodes, *, delay=0.0):
    """The ServerApp's Grid under Flower's simulation runtime, whose SuperNodes register ``delay`` seconds from now.

    Built as ``flwr.simulation.run_simulation._main_loop`` builds it: the run and its task
    pre-registered in an in-memory LinkState, the nodes added by the runtime's own loop.
    """
    state_factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    run = Run.create_empty(run_id=7)
    run.primary_task_id, run.federation_id = 11, NOOP_FEDERATION_ID
    state = state_factory.state()
    state.run_ids[run.run_id] = RunRecord(run=run)
    state.task_store[11] = Task(task_id=11, run_id=run.run_id)
    grid = InMemoryGrid(state_factory=state_factory)
    grid.set_run(run)
    register = threading.Timer(delay, _register_nodes, kwargs={"num_nodes": supernodes, "state_factory": state_factory})
    register.start()
    return grid, register


def _federation(grid, **changes):
    return Federation(grid, **{"expected": 5, "node_wait_timeout": LONG_WAIT, "scenario_name": "blobs", **changes})


@pytest.mark.parametrize("supernodes, error", [(3, NotEnoughClients), (7, ValueError)])
def test_a_simulated_federation_of_the_wrong_size_is_refused_in_one_line(supernodes, error):
    grid, register = _simulation_grid(supernodes)
    with pytest.raises(error) as raised:
        _federation(grid).connect()
    register.join()
    assert str(raised.value) == _line(supernodes, 5)


def test_a_simulated_federation_goes_on_with_fewer_supernodes_when_min_nodes_allows(caplog):
    grid, register = _simulation_grid(3)
    federation = _federation(grid, min_nodes=3)
    assert len(federation.connect()) == 3
    register.join()
    assert "only 3 of 5 nodes connected" in caplog.text


def test_supernodes_that_register_after_the_serverapp_starts_are_all_used():
    # Flower starts the ServerApp's thread before its runtime registers the SuperNodes.
    grid, register = _simulation_grid(5, delay=0.3)
    nodes = _federation(grid).connect()
    register.join()
    assert sorted(nodes) == sorted(grid.get_node_ids()) and len(nodes) == 5


class _LateGrid(InProcessGrid):
    """Real SuperNodes: the last one connects ``late`` seconds after the others (outside any simulation)."""

    def __init__(self, *args, late, **kwargs):
        super().__init__(*args, **kwargs)
        self._all_from = time.monotonic() + late

    def get_node_ids(self):
        nodes = list(super().get_node_ids())
        return nodes if time.monotonic() >= self._all_from else nodes[:-1]


def test_in_deployment_the_server_keeps_waiting_for_nodes_that_connect_late():
    configs = [{"partition-id": p, "num-partitions": 3} for p in range(3)]
    grid = _LateGrid(client_app, configs, late=2 * SIMULATION_SETTLE_SECONDS)
    assert len(_federation(grid, expected=3).connect()) == 3


# ---------------------------------------------------------------- a real `flwr run` (conftest.py's flwr_env)


@pytest.mark.slow
def test_flwr_run_with_too_few_supernodes_fails_at_once_with_one_clear_line(flwr_env, tmp_path):
    out = tmp_path / "out"
    overrides = f"overrides='algorithm=fedgem scenario=blobs node_wait_timeout={LONG_WAIT}' out-dir='{out}'"
    flwr = processes.flower_executable("flwr")
    # The timeout is a hang guard: waiting for nodes that never come would take LONG_WAIT seconds.
    done = subprocess.run([flwr, "run", ".", "--stream", "--federation-config", "num-supernodes=3", "-c", overrides],
                          cwd=REPO, env=flwr_env, capture_output=True, text=True, timeout=LONG_WAIT / 3)
    assert _line(3, 5) in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]
    listed = subprocess.run([flwr, "ls", "--format", "json"], cwd=REPO, env=flwr_env, capture_output=True, text=True, timeout=60)
    [run] = json.loads(listed.stdout)["runs"]
    assert run["status"] == "finished:failed" and _line(3, 5) in run["status-details"]
    partial = json.loads((out / "partial_result.json").read_text())
    assert partial["status"] == f"stopped: {_line(3, 5)}"
