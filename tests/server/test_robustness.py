"""Hostile clients and malformed replies: the aggregates stay sound, the books say what happened."""

import numpy as np
import pytest
from fedica.scripts.engines import run_inprocess
from fedica.server.app import compose_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedica.protocol import (
    InvalidReply,
    validate_gem_components,
    validate_ica_reply,
    validate_weights,
)

HOSTILE_ICA = [
    "engine=inprocess",
    "scenario.n_clients=20",
    "scenario.corrupt_ratio=0.0",
    "scenario.n_normal=2000",
    "scenario.r=4",
    "attack.fraction=0.4",
]
GEM = [
    "engine=inprocess",
    "algorithm=fedgem",
    "scenario.n_clients=8",
    "scenario.n_clusters=5",
    "scenario.r_min=8",
    "scenario.n_train=2400",
    "scenario.n_test=1600",
    "algorithm.rounds=4",
    "algorithm.upsilon=1.0",
    "baselines=false",
]


@pytest.mark.parametrize("kind", ["random_orthogonal", "scaled_junk"])
def test_rfica_withstands_forty_percent_hostile_clients(kind):
    result = run_inprocess(compose_config(HOSTILE_ICA + [f"attack.kind={kind}"]))
    errors = {name: m["error"] for name, m in result["metrics"].items()}
    assert len(result["rfica"]["hostile_clients"]) == 8
    assert errors["rf-ica"] < 0.15, errors
    assert errors["f-ica"] > 2 * errors["rf-ica"], errors
    assert errors["simple-mean"] > 0.5, errors


def test_rfica_renormalises_scaled_copies_of_the_truth():
    result = run_inprocess(compose_config(HOSTILE_ICA + ["attack.kind=permuted_truth"]))
    assert result["metrics"]["rf-ica"]["error"] < 0.1


@pytest.fixture(scope="module")
def honest_gem():
    return run_inprocess(compose_config(GEM))


def _honest_ari(result):
    hostile = {str(p) for p in result["fedgem"]["hostile_clients"]}
    return {p: a for p, a in result["fedgem"]["client_local_ari"].items() if p not in hostile}


@pytest.mark.parametrize("kind", ["inflated_radius", "inflated_count", "random_centroids"])
def test_fedgem_hostile_clients_change_neither_k_hat_nor_honest_ari(kind, honest_gem):
    attacked = run_inprocess(compose_config(GEM + [f"attack.kind={kind}", "attack.fraction=0.25"]))
    assert len(attacked["fedgem"]["hostile_clients"]) == 2
    assert attacked["metrics"]["fedgem"]["k_hat"] == honest_gem["metrics"]["fedgem"]["k_hat"] == 5
    honest_before, honest_after = _honest_ari(honest_gem), _honest_ari(attacked)
    for partition, ari in honest_after.items():
        assert ari >= honest_before[partition] - 0.02, (partition, ari, honest_before[partition])


def test_fedgem_partial_participation_records_who_took_part():
    result = run_inprocess(compose_config(GEM + ["algorithm.participation=0.5", "min_clients=3"]))
    rounds = result["history"]
    assert all(len(r["clients"]) == 4 for r in rounds)
    assert len({tuple(r["clients"]) for r in rounds}) > 1
    assert result["metrics"]["fedgem"]["k_hat"] == 5
    assert result["metrics"]["fedgem"]["global_ari"] > 0.9


finite = st.floats(allow_nan=True, allow_infinity=True, width=64)
arrays = hnp.arrays(
    dtype=st.sampled_from([np.float64, np.float32, np.int64, np.bool_, np.complex128, np.dtype("U3")]),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=5),
    elements=None,
)
values = st.one_of(st.integers(-5, 10**12), finite, st.text(max_size=3), st.booleans(), st.none())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reply_arrays=st.dictionaries(st.sampled_from(["mixing", "maximisers", "weights", "x"]), arrays, max_size=3),
    reply_values=st.dictionaries(st.sampled_from(["n-samples", "n-points", "y"]), values, max_size=3),
    r=st.integers(2, 5),
)
def test_random_malformed_replies_only_raise_invalid_reply(reply_arrays, reply_values, r):
    for check in (
        lambda: validate_ica_reply(reply_arrays, reply_values, r=r),
        lambda: validate_gem_components(reply_arrays, "maximisers", dim=r, n_components=None),
        lambda: validate_weights(reply_arrays, "weights", r),
    ):
        try:
            check()
        except InvalidReply:
            pass


@pytest.mark.parametrize("tamper, reason", [
    ({"values": {"local-ari": float("nan")}}, "'local-ari'=nan"),
    ({"values": {"local-ari": 5e7}}, "'local-ari'=50000000.0"),
    ({"drop": "local-ari"}, "'local-ari'=None"),
    ({"pred-offset": 500}, "not sent"),
    ({"count-scale": 10**6}, "more than 100 x"),
])
def test_forged_evaluation_replies_are_rejected(tamper, reason):
    """A client that forges its evaluation (ARI out of range or missing, unknown cluster ids, impossible counts) is left out."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
    from flwr.clientapp import ClientApp

    from fedica.clients.app import app as client_app
    from fedica.protocol import CATEGORY, GEM_EVALUATE, TRAIN

    def handler(msg, context):
        reply = client_app(msg, context)
        if msg.metadata.message_type != f"evaluate.{GEM_EVALUATE}" or int(context.node_config["partition-id"]) != 1:
            return reply
        arrays = {k: v.numpy() for k, v in reply.content["arrays"].items()}
        values = dict(reply.content["values"].items())
        values.update(tamper.get("values", {}))
        values.pop(tamper.get("drop", ""), None)
        arrays["pred-values"] = arrays["pred-values"] + tamper.get("pred-offset", 0)
        arrays["counts"] = arrays["counts"] * tamper.get("count-scale", 1)
        content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}), "values": ConfigRecord(values)})
        return Message(content, reply_to=msg)

    app = ClientApp()
    for task, category in CATEGORY.items():
        (app.train if category == TRAIN else app.evaluate)(task)(handler)
    cfg = compose_config(["engine=inprocess", "algorithm=fedgem", "baselines=false", "algorithm.rounds=3", "seed=1"])
    result = run_inprocess(cfg, client_app=app)
    rejected = [r for r in result["clients"]["rejected"] if r["round"] == "evaluate"]
    assert [r["client"] for r in rejected] == [1] and reason in rejected[0]["reason"], rejected
    assert result["metrics"]["fedgem"]["k_hat"] <= 6 and -1 <= result["metrics"]["fedgem"]["global_ari"] <= 1
