"""Properties of FFCM-avg1/avg2 (fedica.evaluation.ffcm): the client's fuzzy c-means, the server steps, the protocol."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.cluster import KMeans

from fedica.data.blobs import blobs_client_data
from fedica.data.common import ClientData
from fedica.evaluation.baselines import evaluate_clustering
from fedica.evaluation.ffcm import (
    FFCMState,
    avg1_step,
    avg2_step,
    client_reply,
    ffcm,
    ffcm_protocol,
    fuzzy_memberships,
    local_fuzzy_c_means,
)
from fedica.protocol import FFCM_INIT, FFCM_ROUND, NotEnoughClients, Reply

# Every client holds every cluster: the setting where averaging centre k over clients is meaningful.
SHARED_CLUSTERS = {"n_clients": 4, "n_clusters": 5, "dim": 2, "r_min": 10.0, "n_train": 2000, "n_test": 1000, "k_min": 5, "k_max": 5}


@pytest.fixture(scope="module")
def shared_blobs():
    return [blobs_client_data(g, seed=5, **SHARED_CLUSTERS) for g in range(4)]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.integers(1, 4), st.integers(1, 6), st.sampled_from([1.5, 2.0, 3.0]),
       st.integers(0, 2**32 - 1))
def test_memberships_are_a_fuzzy_partition(n, d, k, m, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    centres = rng.normal(size=(k, d))
    centres[0] = X[0]  # a point on a centre
    if k > 1:
        centres[-1] = X[-1] * rng.integers(0, 2)  # sometimes a coincident point, sometimes the origin
    u = fuzzy_memberships(X, centres, m)
    assert u.shape == (n, k)
    assert np.all(np.isfinite(u)) and np.all(u >= 0) and np.all(u <= 1)
    np.testing.assert_allclose(u.sum(axis=1), 1.0, atol=1e-12)
    assert u[0, 0] == pytest.approx(1.0 / np.sum(np.all(centres == X[0], axis=1)))


def test_memberships_follow_the_fcm_formula():
    X = np.array([[0.0, 0.0], [1.0, 2.0], [3.0, 3.0]])
    centres = np.array([[1.0, 0.0], [0.0, 4.0], [3.0, 3.0]])
    d = np.linalg.norm(X[:, None] - centres[None], axis=2)
    u = fuzzy_memberships(X, centres, 2.0)
    np.testing.assert_allclose(u[:2], 1.0 / ((d[:2, :, None] / d[:2, None, :]) ** 2).sum(axis=2))
    np.testing.assert_array_equal(u[2], [0.0, 0.0, 1.0])  # the point on the third centre


def test_local_fcm_centres_and_supports():
    rng = np.random.default_rng(0)
    X = np.concatenate([rng.normal(size=(50, 2)), rng.normal(size=(50, 2)) + 8])
    centres, supports = local_fuzzy_c_means(X, np.array([[1.0, 1.0], [6.0, 6.0]]), iterations=50)
    np.testing.assert_allclose(centres, [X[:50].mean(axis=0), X[50:].mean(axis=0)], atol=0.1)
    assert supports.sum() == pytest.approx(100.0)
    u = fuzzy_memberships(X, centres)
    np.testing.assert_allclose(supports, u.sum(axis=0))


def test_avg1_is_the_support_weighted_mean_per_centre():
    local = np.array([[[0.0, 0.0], [10.0, 0.0]], [[2.0, 2.0], [20.0, 0.0]]])
    supports = np.array([[1.0, 0.0], [3.0, 0.0]])
    previous = np.array([[9.0, 9.0], [5.0, 5.0]])
    np.testing.assert_allclose(avg1_step(local, supports, previous), [[1.5, 1.5], [5.0, 5.0]])  # no support: kept


@settings(max_examples=8, deadline=None)
@given(st.integers(2, 6), st.integers(2, 4), st.integers(0, 2**32 - 1))
def test_avg2_step_is_sklearn_kmeans_on_the_stacked_weighted_centres(n_clients, k, seed):
    rng = np.random.default_rng(seed)
    local = rng.normal(size=(n_clients, k, 3)) * 5
    supports = rng.uniform(0.1, 10, size=(n_clients, k))
    init = local[0] + 0.1
    expected = KMeans(n_clusters=k, init=init, n_init=1).fit(local.reshape(-1, 3), sample_weight=supports.ravel())
    np.testing.assert_array_equal(avg2_step(local, supports, init), expected.cluster_centers_)
    first = KMeans(n_clusters=k, init="k-means++", n_init=2, random_state=7).fit(local.reshape(-1, 3),
                                                                                 sample_weight=supports.ravel())
    np.testing.assert_array_equal(avg2_step(local, supports, "k-means++", n_init=2, random_state=7),
                                  first.cluster_centers_)


@pytest.mark.parametrize("variant", ["avg1", "avg2"])
def test_ffcm_recovers_shared_well_separated_clusters(variant, shared_blobs):
    result = ffcm(shared_blobs, 5, variant=variant, random_state=0)
    scores = evaluate_clustering(shared_blobs, result.test_labels)
    assert scores["global_ari"] > 0.95 and result.k_hat == 5
    assert result.fit_seconds > 0 and 1 <= result.info["rounds"] <= 20
    assert result.info["upload_bytes"] == (result.info["rounds"] + 1) * 4 * (5 * 2 + 5) * 8
    again = ffcm(shared_blobs, 5, variant=variant, random_state=0)
    for a, b in zip(result.test_labels, again.test_labels):
        np.testing.assert_array_equal(a, b)


def test_avg2_recovers_heterogeneous_clients():
    clients = [blobs_client_data(g, seed=11, n_clients=5, n_clusters=6, dim=2, r_min=8.0, n_train=2500, n_test=2500)
               for g in range(5)]
    result = ffcm(clients, 6, variant="avg2", random_state=0)
    assert evaluate_clustering(clients, result.test_labels)["global_ari"] > 0.95


def _answer(request, X, g):
    arrays = {} if request.payloads is None else request.payloads[g]
    return Reply(g, *client_reply(request.task, X, 2, arrays, request.values, g))


def test_invalid_replies_are_skipped(shared_blobs):
    data = [c.X_train for c in shared_blobs]
    state = FFCMState(n_clusters=5, rounds=2, seed=0)
    protocol = ffcm_protocol(state)
    request = next(protocol)
    assert request.task == FFCM_INIT
    replies = [_answer(request, X, g) for g, X in enumerate(data)]
    replies[1].arrays["centres"] = replies[1].arrays["centres"][:, :1]  # wrong shape
    replies[2].arrays["supports"] = -replies[2].arrays["supports"]  # negative supports
    request = protocol.send(replies)
    assert request.task == FFCM_ROUND and sorted(request.payloads) == [0, 3]
    replies = [_answer(request, data[g], g) for g in request.payloads]
    replies[0].arrays["centres"] = np.full((5, 2), np.nan)  # not finite
    replies.append(Reply(7, {}, {"error": "ValueError: no data"}))
    protocol.send(replies)
    reasons = [(r["client"], r["round"], r["reason"]) for r in state.rejected]
    assert [(c, r) for c, r, _ in reasons] == [(1, "init"), (2, "init"), (0, 1), (7, 1)]
    assert "shape" in reasons[0][2] and "negative" in reasons[1][2] and "non-finite" in reasons[2][2]
    assert state.history[-1]["clients"] == 1


def test_supports_must_add_up_to_the_declared_points(shared_blobs):
    state = FFCMState(n_clusters=5, rounds=0, min_clients=2)
    protocol = ffcm_protocol(state)
    request = next(protocol)
    replies = [_answer(request, c.X_train, g) for g, c in enumerate(shared_blobs[:2])]
    replies[0].arrays["supports"] = replies[0].arrays["supports"] * 2
    with pytest.raises(NotEnoughClients, match="add up to"):
        protocol.send(replies)


def test_a_client_smaller_than_k_is_skipped(shared_blobs):
    tiny = ClientData(np.zeros((3, 2)), None, np.zeros((2, 2)), None, 2)
    result = ffcm([*shared_blobs, tiny], 5, variant="avg2", rounds=2, random_state=1)
    assert [r["client"] for r in result.info["rejected"]] == [4]
    assert result.test_labels[4].shape == (2,)
