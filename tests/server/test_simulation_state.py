"""The simulation's per-node message lookup against the installed Flower's own (server/simulation_state.py)."""

from __future__ import annotations

import time
from typing import cast

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.server.superlink.fleet.vce.vce_api import _register_nodes
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState, RunRecord
from flwr.simulation.run_simulation import NOOP_FEDERATION_ID, SUPERLINK_NODE_ID
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid
from flwr.proto.task_pb2 import Task  # pylint: disable=no-name-in-module

from fedica.server.simulation_state import node_filtered_get_message_ins, node_filtered_message_lookup

RUN_ID = 4242


@pytest.fixture
def task_identity():
    """The process-wide identity Flower's Message needs, restored afterwards."""
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, RUN_ID, SUPERLINK_NODE_ID
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def _simulated_state(n_nodes: int):
    """A SuperLink state as Flower's simulation builds it (one run, ``n_nodes`` registered nodes) and its Grid."""
    factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    state = cast(InMemoryLinkState, factory.state())
    run = Run.create_empty(run_id=RUN_ID)
    run.primary_task_id, run.federation_id = 1, NOOP_FEDERATION_ID
    state.run_ids[RUN_ID] = RunRecord(run=run)
    state.task_store[1] = Task(task_id=1, run_id=RUN_ID)
    nodes = list(_register_nodes(n_nodes, factory))
    grid = InMemoryGrid(state_factory=factory)
    grid.set_run(run)
    return state, grid, nodes


def _message(node: int, tag: int, ttl: float | None = None) -> Message:
    content = RecordDict({"arrays": ArrayRecord([np.full(2, float(tag))]), "config": ConfigRecord({"tag": tag})})
    return Message(content, dst_node_id=node, message_type="train", ttl=ttl)


def _tag(message: Message) -> int:
    return int(message.content["config"]["tag"])


def _polls(lookup, layout: list[tuple[int, float | None]], passes: int) -> tuple[list[list[int]], list[int]]:
    """Store messages to nodes (index, ttl) in order, let some expire, then poll every node ``passes`` times
    as Flower's simulation loop does (``limit=1``); returns each poll's tags and the tags still stored."""
    state, grid, nodes = _simulated_state(4)
    pushed = list(grid.push_messages([_message(nodes[index], tag, ttl) for tag, (index, ttl) in enumerate(layout)]))
    assert len(pushed) == len(layout)
    time.sleep(0.05)  # the messages stored with a ttl of 0.01 s have expired
    polls = []
    for _ in range(passes):
        for node in nodes:
            polls.append([_tag(message) for message in lookup(state, node_id=node, limit=1)])
    stored = sorted(_tag(message) for message in state.message_ins_store.values())
    return polls, stored


LAYOUTS = {
    "one per node": [(0, None), (1, None), (2, None), (3, None)],
    "several to one node, in order": [(1, None), (1, None), (0, None), (1, None), (2, None), (1, None)],
    "expired among them": [(0, 0.01), (0, None), (1, None), (2, 0.01), (3, None), (3, 0.01), (3, None)],
    "a node with none": [(0, None), (0, None), (2, None)],
}


@pytest.mark.parametrize("layout", list(LAYOUTS.values()), ids=list(LAYOUTS))
def test_same_messages_same_order_same_deletions(task_identity, layout):
    original = InMemoryLinkState.get_message_ins
    expected = _polls(original, layout, passes=3)
    assert sum(len(poll) for poll in expected[0]) > 0
    assert _polls(node_filtered_get_message_ins, layout, passes=3) == expected


def test_run_id_and_limit_as_flower_reads_them(task_identity):
    state, grid, nodes = _simulated_state(2)
    grid.push_messages([_message(nodes[0], tag) for tag in range(3)])
    assert node_filtered_get_message_ins(state, nodes[0], 1, run_id=RUN_ID + 1) == []
    assert [_tag(m) for m in node_filtered_get_message_ins(state, nodes[0], None, run_id=RUN_ID)] == [0, 1, 2]
    assert node_filtered_get_message_ins(state, nodes[0], None) == []  # all delivered now
    with pytest.raises(AssertionError, match="limit"):
        node_filtered_get_message_ins(state, nodes[0], 0)


def test_the_lookup_is_restored_after_the_simulation_even_on_error():
    original = InMemoryLinkState.get_message_ins
    with pytest.raises(RuntimeError, match="the run failed"):
        with node_filtered_message_lookup():
            assert InMemoryLinkState.get_message_ins is node_filtered_get_message_ins
            raise RuntimeError("the run failed")
    assert InMemoryLinkState.get_message_ins is original
