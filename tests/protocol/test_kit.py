"""The protocol kit: one task registry with its chain of reply transforms, one in-memory driver, one books base."""

import json
import logging

import numpy as np
import pytest
from fedica.clients.app import app as fedica_client_app
from fedica.server.app import compose_config
from fedica.server.records import pack, unpack
from flwr.app import Context, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from fedica import FedGEM, RFICA
from fedica.config import validate_config
from fedica.data.common import ClientData
from fedica.data.scenarios import scenario_client_data
from fedica.fedgem.coordinator import FedGEMServer, FedGEMSettings
from fedica.attacks.hostile import hostile_kind, hostile_reply
from fedica.protocol import (
    GEM_INIT,
    GEM_ROUND,
    ArraySite,
    ClientTasks,
    InMemoryFederation,
    NotEnoughClients,
    ProtocolState,
    Reply,
    Request,
    drive,
    message_type,
)
from fedica.tasks import CLIENT_TASKS


@pytest.fixture
def server_identity():
    """Messages take their run and source ids from the task identity, as inside a ServerApp process
    (fedica's in-process Grid sets it the same way)."""
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, SUPERLINK_NODE_ID


def _site(n=40, d=2, k=2, partition=0, run_config=None, seed=0):
    X = np.random.default_rng(seed).normal(size=(n, d))
    return ArraySite(ClientData(X, None, X[:0], None, k), partition, run_config)


def test_a_registry_answers_with_the_handler_then_every_transform_in_order():
    calls = []

    def handler(site, arrays, values):
        calls.append("handler")
        return {"x": np.array([1.0])}, {"n": 1}

    def double(task, site, arrays, values, reply):
        calls.append("double")
        return {"x": 2 * reply[0]["x"]}, reply[1]

    def shift(task, site, arrays, values, reply):
        calls.append(f"shift {task}")
        return {"x": reply[0]["x"] + 1}, reply[1]

    tasks = ClientTasks({"t": handler}, (double,)).with_transforms(shift)
    arrays, values = tasks.answer("t", _site(), {}, {})
    assert calls == ["handler", "double", "shift t"]
    assert arrays["x"].tolist() == [3.0] and values == {"n": 1}


def test_a_registry_names_the_tasks_it_answers_when_asked_another():
    with pytest.raises(ValueError, match=r"answers no task 'nope' \(it answers a, b\)"):
        ClientTasks({"b": None, "a": None}).answer("nope", _site(), {}, {})


def test_the_in_memory_driver_leaves_a_refusing_site_out_with_its_reason_and_sends_the_round_label():
    seen = []

    def handler(site, arrays, values):
        seen.append((site.partition_id, values["server-round"], sorted(arrays)))
        if site.partition_id == 1:
            raise ValueError("cannot fit this")
        return {}, {"n-points": 3}

    books = []
    federation = InMemoryFederation({2: _site(partition=2), 0: _site(), 1: _site(partition=1)},
                                    ClientTasks({"t": handler}), books)
    replies = federation.answer(Request("t", 7, {2: {"a": np.ones(1)}, 1: {"a": np.ones(1)}}))
    assert [r.partition_id for r in replies] == [2]
    assert seen == [(1, "7", ["a"]), (2, "7", ["a"])]
    assert books == [{"client": 1, "round": 7, "reason": "client error: ValueError: cannot fit this"}]
    # No payloads: every site is asked, in partition order.
    assert [r.partition_id for r in federation.answer(Request("t", "init", None))] == [0, 2]


def test_drive_runs_a_protocol_to_its_end():
    def protocol(log):
        replies = yield Request("t", 1, None)
        log.append(len(replies))
        replies = yield Request("t", 2, None)
        log.append(len(replies))

    log = []
    drive(protocol(log), lambda request: [Reply(0, {}, {})] * request.round_label)
    assert log == [1, 2]


def test_a_protocol_state_books_rejections_and_stops_with_the_last_ones_named(caplog):
    class Toy(ProtocolState):
        min_clients = 2
        log_label = "TOY "

    state = Toy()
    with caplog.at_level(logging.WARNING, logger="fedica.server"):
        state.reject(4, "init", "invalid reply: missing array 'x'")
    assert state.rejected == [{"client": 4, "round": "init", "reason": "invalid reply: missing array 'x'"}]
    assert "TOY client 4, round init: reply rejected: invalid reply: missing array 'x'" in caplog.text
    state.require(2, "toy round")
    with pytest.raises(NotEnoughClients, match=r"toy round: only 1 valid replies, min_clients=2 \(rejected: 4: invalid"):
        state.require(1, "toy round")
    with state.server_time():
        sum(range(1000))
    assert state.server_seconds > 0


@pytest.mark.parametrize("task", sorted(CLIENT_TASKS.handlers))
def test_fedicas_client_app_routes_every_task_of_the_registry_to_it(task, server_identity):
    # Without a run config, fedica's own client names what is missing in an error reply: the message
    # reached the registry's handler (a message type Flower had no route for would not get that far).
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 1},
                      state=RecordDict(), run_config={})
    reply = fedica_client_app(Message(pack({}, {}), dst_node_id=1, message_type=message_type(task)), context)
    assert not reply.has_error()
    assert "carries no run config" in unpack(reply.content)[1]["error"]


def _attack_config(kind, fraction=0.5):
    return validate_config(compose_config(["engine=inprocess", "algorithm=fedgem", "scenario.n_clients=4",
                                           f"attack={kind}", f"attack.fraction={fraction}", "baselines=false"]))


@pytest.mark.parametrize("task, attack, key", [(GEM_INIT, "split_components", "centroids"),
                                               (GEM_ROUND, "random_centroids", "maximisers")])
def test_a_hostile_site_replies_the_same_in_memory_and_through_the_flower_client_app(task, attack, key,
                                                                                      server_identity):
    cfg = _attack_config(attack)
    partition = next(p for p in range(4) if hostile_kind(cfg, p) is not None)
    data = scenario_client_data(cfg["scenario"], partition, cfg["seed"])
    values = {"cfg": json.dumps(cfg), "n-init": 3, "seed": 0, "local-steps": 1, "server-round": "1"}
    centroids = data.X_train[: data.n_components]
    arrays = {} if task == GEM_INIT else {"centroids": centroids}
    in_memory = CLIENT_TASKS.answer(task, ArraySite(data, partition, cfg), arrays, values)
    honest = CLIENT_TASKS.answer(task, ArraySite(data, partition, None), arrays, values)

    context = Context(run_id=1, node_id=1, node_config={"partition-id": partition, "num-partitions": 4},
                      state=RecordDict(), run_config={})
    message = Message(pack(arrays, values), dst_node_id=1, message_type=message_type(task))
    reply = fedica_client_app(message, context)
    flower_arrays, _ = unpack(reply.content)
    assert in_memory[0][key].shape != honest[0][key].shape or not np.allclose(in_memory[0][key], honest[0][key])  # the transform acted in memory
    np.testing.assert_array_equal(flower_arrays[key], in_memory[0][key])


def test_the_estimators_answer_through_their_own_tasks_without_the_hostile_transform(monkeypatch):
    import fedica.fedgem.estimator as gem_estimator
    import fedica.rfica.estimator as ica_estimator

    seen = []

    def count(task, site, arrays, values, reply):
        seen.append(task)
        return reply

    for module in (gem_estimator, ica_estimator):
        # A library fit is no robustness run: no hostile-client transform, only the algorithm's privacy step.
        assert hostile_reply not in module.SITE_TASKS.transforms and len(module.SITE_TASKS.transforms) == 1
        monkeypatch.setattr(module, "SITE_TASKS", module.SITE_TASKS.with_transforms(count))
    rng = np.random.default_rng(0)
    sites = [np.vstack([rng.normal(0, 0.3, (40, 2)), rng.normal(5, 0.3, (40, 2))]) for _ in range(3)]
    FedGEM(rounds=2, upsilon=1.0).fit(sites, n_local_clusters=2)
    assert seen.count("fedgem_round") == 6 and seen.count("fedgem_init") == 3
    RFICA().fit([rng.laplace(size=(200, 2)) @ np.array([[1.0, 0.5], [0.2, 1.0]]) for _ in range(3)])
    assert seen.count("rfica_fit") == 3


def test_a_fedgem_server_is_a_protocol_state():
    server = FedGEMServer(FedGEMSettings(min_clients=3))
    assert isinstance(server, ProtocolState) and server.min_clients == 3 and server.rejected == []
