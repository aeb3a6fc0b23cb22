"""Properties of AFCL (fedica.evaluation.afcl): the client statistics, the server steps, the protocol."""

import numpy as np
import pytest
from sklearn.metrics import davies_bouldin_score

from fedica.data.blobs import blobs_client_data
from fedica.data.classes import waveform_client_data
from fedica.evaluation.afcl import (
    AFCLState,
    afcl,
    afcl_protocol,
    afcl_result,
    client_reply,
    competitive_pass,
    feature_weights,
    federated_davies_bouldin,
    merge_seeds,
)
from fedica.evaluation.baselines import evaluate_clustering
from fedica.protocol import AFCL_INIT, AFCL_ROUND, Reply

# Each client holds 2 or 3 of the 4 clusters.
SEPARATED = {"n_clients": 5, "n_clusters": 4, "dim": 2, "r_min": 8.0, "n_train": 1000, "n_test": 1000}


@pytest.fixture(scope="module")
def separated_blobs():
    return [blobs_client_data(g, seed=1, **SEPARATED) for g in range(5)]


def _answer(request, client, g):
    arrays = {} if request.payloads is None else request.payloads[g]
    return Reply(g, *client_reply(request.task, client.X_train, client.n_components, arrays, request.values, g))


def test_afcl_finds_k_on_separated_blobs(separated_blobs):
    # The authors' learning rate (0.001) merges seeds too slowly for 20 rounds; 0.01 is their cap on a_c.
    result = afcl(separated_blobs, learning_rate=0.01, random_state=0)
    assert result.info["k_initial"] == sum(c.n_components for c in separated_blobs)
    assert result.k_hat == 4
    assert evaluate_clustering(separated_blobs, result.test_labels)["global_ari"] > 0.95
    # One float64 d-vector per training point and round: the data set itself, every round.
    assert result.info["residual_bytes"] == result.info["rounds"] * 1000 * 2 * 8
    assert "x = r / w + m" in result.info["privacy"]


def test_seeds_merge_once_after_the_last_round(separated_blobs):
    # AFCL_main.m keeps every row of server_miu_numer through the rounds (its in-loop merge only fills
    # k_record) and merges coinciding seeds once, after the loop, before counting K.
    state = AFCLState(learning_rate=0.01, seed=0)
    protocol = afcl_protocol(state)
    request = next(protocol)
    with pytest.raises(StopIteration):
        while True:
            request = protocol.send([_answer(request, separated_blobs[g], g) for g in range(len(separated_blobs))])
    assert state.seeds.shape[0] == state.k_initial > 4
    assert merge_seeds(state.seeds, state.merge_tol).shape[0] == 4  # the cooperating seeds did coincide
    result = afcl_result(state, separated_blobs)
    assert result.info["seeds"] == result.k_hat == 4


def test_on_waveform_afcl_keeps_its_starting_seeds_only_for_its_first_rounds():
    # The FedGEM paper's AFCL on Waveform (K_hat 12.52 +- 1.11, ARI .157) is what the first round gives: every
    # one of the sum_g K_g starting seeds (K_g from 2 to 3) still receives test points. The cooperating sets then
    # pull the seeds of the overlapping classes together until one is left (ALGORITHMS.md 2.10.2).
    clients = [waveform_client_data(g, seed=0, n_samples=1500, k_max=3) for g in range(5)]
    k_max = sum(c.n_components for c in clients)
    first = afcl(clients, rounds=1, random_state=0)
    assert first.k_hat == k_max > 10
    assert 0.1 < evaluate_clustering(clients, first.test_labels)["global_ari"] < 0.3
    assert afcl(clients, rounds=20, random_state=0).k_hat == 1


def test_the_server_rebuilds_every_training_point(separated_blobs):
    state = AFCLState(seed=3)
    protocol = afcl_protocol(state)
    request = next(protocol)
    assert request.task == AFCL_INIT
    request = protocol.send([_answer(request, c, g) for g, c in enumerate(separated_blobs)])
    assert request.task == AFCL_ROUND
    reply = _answer(request, separated_blobs[2], 2)
    rebuilt = reply.arrays["residuals"] / state.weights + state.seeds[reply.arrays["winners"]]
    np.testing.assert_allclose(rebuilt * state.scale + state.offset, separated_blobs[2].X_train, atol=1e-9)


def test_federated_davies_bouldin_of_one_client_is_sklearns(separated_blobs):
    X = separated_blobs[0].X_train
    seeds = X[:6]
    reply = client_reply(AFCL_ROUND, X, 2, {"seeds": seeds, "feature-weights": np.ones(2), "offset": np.zeros(2),
                                            "scale": np.ones(2)}, {}, 0)[0]
    counts = np.bincount(reply["winners"], minlength=6)[None]
    value = federated_davies_bouldin(counts, reply["centroids"][None], reply["scatter"][None])
    assert value == pytest.approx(davies_bouldin_score(X, reply["winners"]), rel=1e-10)
    assert np.isnan(federated_davies_bouldin(np.array([[5, 0]]), np.zeros((1, 2, 2)), np.zeros((1, 2))))


def test_merge_seeds_joins_chains_and_keeps_the_first():
    seeds = np.array([[0.0, 0.0], [0.0006, 0.0], [0.0012, 0.0], [0.5, 0.5], [0.5, 0.5009]])
    np.testing.assert_array_equal(merge_seeds(seeds, 1e-3), [[0.0, 0.0], [0.5, 0.5]])
    np.testing.assert_array_equal(merge_seeds(seeds, 1e-4), seeds)


def test_feature_weights_average_the_learning_rate_and_favour_tight_features():
    weights = feature_weights(np.array([1.0, 4.0, 0.0]), np.array([0.1, 0.1, 0.7]), beta=2.0, learning_rate=0.01)
    expected = 3 * 0.01 / np.array([1 + 0.5, 2 + 1])  # sum_h (D_j / D_h)^(1/2) over the two used features
    np.testing.assert_allclose(weights, [*expected, 0.7])  # an unused feature keeps its weight
    assert weights[0] > weights[1]


def test_competitive_pass_moves_the_winner_and_its_cooperating_set():
    seeds = np.array([[0.0, 0.0], [0.1, 0.0], [5.0, 0.0]])
    moved = competitive_pass(seeds, [(np.array([[-1.0, 0.0]]), np.array([0.5, 0.5]))])
    # Winner 0; seed 1 is closer to it than the point is, so it cooperates; seed 2 does not.
    np.testing.assert_allclose(moved, [[-0.5, 0.0], [-0.45, 0.0], [5.0, 0.0]])
    pushed = competitive_pass(seeds, [(np.array([[-1.0, 0.0]]), np.array([0.5, 0.5]))], rival_rate=1.0)
    assert pushed[2, 0] > 5.0  # the rival is penalised
    # Frequency sensitivity: having won the first point, seed 0 loses the second, nearer to it, to seed 1
    # (2 wins x 1.4^2 > 1 win x 1.6^2).
    twice = competitive_pass(np.array([[0.0, 0.0], [3.0, 0.0]]),
                             [(np.array([[0.0, 0.0], [1.4, 0.0]]), np.array([0.5, 0.5]))])
    np.testing.assert_allclose(twice, [[0.0, 0.0], [2.2, 0.0]])


def test_invalid_replies_are_skipped(separated_blobs):
    state = AFCLState(rounds=2, seed=0)
    protocol = afcl_protocol(state)
    request = next(protocol)
    replies = [_answer(request, c, g) for g, c in enumerate(separated_blobs)]
    replies[4].arrays["seeds"] = replies[4].arrays["seeds"] + 100.0  # outside its own data's box
    request = protocol.send(replies)
    assert sorted(request.payloads) == [0, 1, 2, 3]
    replies = [_answer(request, separated_blobs[g], g) for g in request.payloads]
    replies[0].arrays["winners"] = replies[0].arrays["winners"] + 1000  # no such seed
    replies[1].arrays["residuals"] = replies[1].arrays["residuals"][:-1]  # a point missing
    replies[2].arrays["scatter"] = -np.ones_like(replies[2].arrays["scatter"])
    replies.append(Reply(9, {}, {"error": "ValueError: gone"}))
    protocol.send(replies)
    assert [(r["client"], r["round"]) for r in state.rejected] == [(4, "init"), (0, 1), (1, 1), (2, 1), (9, 1)]
    assert state.history[0]["clients"] == 1 and state.participations == {3: 1}
