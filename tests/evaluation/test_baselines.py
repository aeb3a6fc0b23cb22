"""Properties of the clustering metrics (fedica.evaluation.metrics) and the FedGEM comparators (fedica.evaluation.baselines)."""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.exceptions import ConvergenceWarning
from sklearn.metrics import adjusted_rand_score, silhouette_score

from fedica.data.blobs import blobs_client_data
from fedica.data.common import ClientData
from fedica.evaluation.baselines import (
    BASELINE_METHODS,
    DP_GMM_MIN_TRUNCATION,
    SILHOUETTE_MAX_POINTS,
    BaselineResult,
    central_gmm,
    dp_gmm,
    dp_gmm_truncation,
    evaluate_clustering,
    fed_kmeans,
    k_fed,
    run_baselines,
)
from fedica.evaluation.metrics import (
    adjusted_rand,
    ari_from_contingency,
    contingency,
    k_hat_from_predictions,
    mean_silhouettes,
    silhouette,
    weighted_local_ari,
    weighted_mean,
)

SEPARATED = {"n_clients": 5, "n_clusters": 6, "dim": 2, "r_min": 8.0, "n_train": 2500, "n_test": 5000}


@pytest.fixture(scope="module")
def separated_blobs():
    return [blobs_client_data(g, seed=11, **SEPARATED) for g in range(5)]


# ------------------------------------------------------------------------------------------------ metrics

@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(-2, 5)), min_size=1, max_size=80), st.data())
def test_pooled_ari_from_client_triplets_equals_ari_of_pooled_labels(pairs, data):
    labels_true, labels_pred = (np.array(column) for column in zip(*pairs))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(pairs)), max_size=4)))
    triplets = [contingency(t, p) for t, p in zip(np.split(labels_true, cuts), np.split(labels_pred, cuts))
                if t.size]
    true_values, pred_values, counts = (np.concatenate(parts) for parts in zip(*triplets))
    assert ari_from_contingency(true_values, pred_values, counts) == pytest.approx(
        adjusted_rand_score(labels_true, labels_pred), abs=1e-12)
    assert adjusted_rand(labels_true, labels_pred) == adjusted_rand_score(labels_true, labels_pred)
    assert k_hat_from_predictions(pred_values, counts) == np.unique(labels_pred).size


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 40), st.integers(1, 4), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_mean_silhouettes_equal_scikit_learns(n, d, k, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X[: n // 2] += 3.0
    labelings = rng.integers(0, k, size=(3, n))
    expected = [
        silhouette_score(X, labels) if 2 <= np.unique(labels).size < n else np.nan for labels in labelings
    ]
    np.testing.assert_allclose(mean_silhouettes(X, labelings), expected, rtol=1e-10, atol=1e-12)


def test_mean_silhouettes_rejects_mismatched_labelings():
    with pytest.raises(ValueError, match="labelings"):
        mean_silhouettes(np.zeros((5, 2)), np.zeros((2, 4), dtype=int))


def test_contingency_triplets():
    true_values, pred_values, counts = contingency([0, 0, 1, 1, 1, 2], [5, 5, 5, 7, 7, 7])
    table = {(t, p): c for t, p, c in zip(true_values, pred_values, counts)}
    assert table == {(0, 5): 2, (1, 5): 1, (1, 7): 2, (2, 7): 1}
    with pytest.raises(ValueError, match="equal length"):
        contingency([0, 1], [0])


def test_k_hat_counts_only_clusters_with_points():
    assert k_hat_from_predictions(np.array([3, 3, 4, 9]), np.array([1, 2, 0, 5])) == 2


def test_weighted_local_ari():
    assert weighted_local_ari([1.0, 0.0, 0.5], [2, 1, 1]) == pytest.approx(0.625)
    with pytest.raises(ValueError, match="weights"):
        weighted_local_ari([1.0, 0.0], [0, 0])
    with pytest.raises(ValueError, match="equal length"):
        weighted_local_ari([1.0, 0.0], [1])


def test_evaluate_clustering_perfect_and_merged_labels(separated_blobs):
    permuted = [(c.y_test * 7 + 3) for c in separated_blobs]  # perfect up to renaming
    result = evaluate_clustering(separated_blobs, permuted)
    assert {k: result[k] for k in ("local_ari", "global_ari", "k_hat")} == {"local_ari": 1.0, "global_ari": 1.0,
                                                                            "k_hat": 6}
    pooled, pooled_labels = np.concatenate([c.X_test for c in separated_blobs]), np.concatenate(permuted)
    # 5000 points: scored on the documented deterministic subsample of SILHOUETTE_MAX_POINTS, close to the exact score.
    chosen = np.sort(np.random.default_rng(0).choice(pooled.shape[0], size=SILHOUETTE_MAX_POINTS, replace=False))
    assert result["silhouette"] == pytest.approx(silhouette_score(pooled[chosen], pooled_labels[chosen]), rel=1e-12)
    assert result["silhouette"] == pytest.approx(silhouette_score(pooled, pooled_labels), abs=0.01)
    # Each client labels its clusters 0..K_g-1 locally: every local ARI stays 1, but clusters collide globally.
    local_ids = [np.searchsorted(np.unique(c.y_test), c.y_test) for c in separated_blobs]
    merged = evaluate_clustering(separated_blobs, local_ids)
    assert merged["local_ari"] == pytest.approx(1.0)
    assert merged["global_ari"] < 0.9
    assert merged["k_hat"] == max(c.n_components for c in separated_blobs)


def test_evaluate_clustering_weights_by_training_size():
    rng = np.random.default_rng(0)
    clients = [ClientData(rng.normal(size=(n, 2)), None, rng.normal(size=(4, 2)), np.array([0, 0, 1, 1]), 2)
               for n in (30, 10)]
    result = evaluate_clustering(clients, [np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])])
    expected = (30 * 1.0 + 10 * adjusted_rand_score([0, 0, 1, 1], [0, 1, 0, 1])) / 40
    assert result["local_ari"] == pytest.approx(expected)
    unlabelled = [ClientData(c.X_train, None, c.X_test, None, 2) for c in clients]
    assert np.isnan(evaluate_clustering(unlabelled, [np.zeros(4), np.zeros(4)])["global_ari"])


def test_silhouettes_match_scikit_learn_on_a_small_case():
    rng = np.random.default_rng(3)
    tests = [rng.normal(size=(n, 2)) + shift for n, shift in ((12, 0.0), (9, 4.0), (7, 8.0))]
    clients = [ClientData(rng.normal(size=(n_train, 2)), None, X, None, 2) for n_train, X in zip((30, 10, 20), tests)]
    labels = [(X[:, 0] > np.median(X[:, 0])).astype(int) for X in tests[:2]] + [np.zeros(7, dtype=int)]  # client 2: one label
    scores = evaluate_clustering(clients, labels)
    assert scores["silhouette"] == pytest.approx(silhouette_score(np.concatenate(tests), np.concatenate(labels)))
    local = [silhouette_score(X, y) for X, y in zip(tests[:2], labels[:2])]
    assert scores["local_silhouette"] == pytest.approx((30 * local[0] + 10 * local[1]) / 40)  # client 2 left out
    assert np.isnan(scores["global_ari"])  # no true labels, yet silhouettes
    single = evaluate_clustering(clients, [np.zeros(len(X), dtype=int) for X in tests])
    assert np.isnan(single["silhouette"]) and np.isnan(single["local_silhouette"])


def test_silhouette_subsamples_large_pools_deterministically():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 2))
    labels = (X[:, 0] > 0).astype(int)
    chosen = np.sort(np.random.default_rng(0).choice(400, size=150, replace=False))
    value = silhouette(X, labels, max_points=150)
    assert value == pytest.approx(silhouette_score(X[chosen], labels[chosen]))
    assert value == silhouette(X, labels, max_points=150)
    assert silhouette(X, labels) == pytest.approx(silhouette_score(X, labels))
    assert np.isnan(silhouette(X[:2], np.array([0, 1])))  # as many labels as points


def test_weighted_mean_drops_undefined_values():
    assert weighted_mean([1.0, np.nan, 0.0], [1, 5, 3]) == pytest.approx(0.25)
    assert np.isnan(weighted_mean([np.nan], [1]))


# ------------------------------------------------------------------------------------------------ baselines

def _check_shapes(result: BaselineResult, clients):
    assert len(result.test_labels) == len(clients)
    for labels, client in zip(result.test_labels, clients):
        assert labels.shape == (client.X_test.shape[0],)
    assert result.k_hat == np.unique(np.concatenate(result.test_labels)).size
    assert result.fit_seconds > 0


def test_central_gmm_recovers_separated_blobs(separated_blobs):
    result = central_gmm(separated_blobs, 6, random_state=0)
    _check_shapes(result, separated_blobs)
    assert evaluate_clustering(separated_blobs, result.test_labels)["global_ari"] > 0.95
    again = central_gmm(separated_blobs, 6, random_state=0)
    for a, b in zip(result.test_labels, again.test_labels):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("baseline", [k_fed, fed_kmeans])
def test_federated_kmeans_baselines_recover_separated_blobs(baseline, separated_blobs):
    result = baseline(separated_blobs, 6, random_state=0)
    _check_shapes(result, separated_blobs)
    scores = evaluate_clustering(separated_blobs, result.test_labels)
    assert scores["global_ari"] > 0.9 and scores["local_ari"] > 0.9
    assert result.k_hat == 6


def test_k_fed_labels_each_client_with_at_most_its_k_g_clusters():
    clients = [blobs_client_data(g, seed=2, n_clients=5, n_clusters=6, dim=2, r_min=1.0, n_train=1000,
                                 n_test=1000) for g in range(5)]
    result = k_fed(clients, 6, random_state=1)
    for labels, client in zip(result.test_labels, clients):
        assert np.unique(labels).size <= client.n_components


def test_k_fed_needs_enough_local_centres(separated_blobs):
    with pytest.raises(ValueError, match="n_clusters=50"):
        k_fed(separated_blobs, 50)


def test_dp_gmm_runs_with_unknown_k():
    clients = [blobs_client_data(g, seed=4, **{**SEPARATED, "n_train": 600, "n_test": 600}) for g in range(5)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        result = dp_gmm(clients, random_state=0)
    _check_shapes(result, clients)
    assert result.info["truncation"] == sum(c.n_components for c in clients)  # below the cap
    assert 1 <= result.k_hat <= sum(c.n_components for c in clients)


def _with_k_g(k_gs):
    rng = np.random.default_rng(0)
    return [ClientData(rng.normal(size=(40, 2)), None, rng.normal(size=(5, 2)), None, k) for k in k_gs]


def test_dp_gmm_caps_its_default_truncation():
    assert dp_gmm_truncation(_with_k_g([2, 3, 5])) == 10  # sum_g K_g below the cap: as in the paper
    assert dp_gmm_truncation(_with_k_g([4] * 30)) == DP_GMM_MIN_TRUNCATION
    assert dp_gmm_truncation(_with_k_g([30] * 3 + [2] * 20)) == 60  # twice the largest K_g
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        result = dp_gmm(_with_k_g([4] * 30), max_iter=5, random_state=0)
    assert result.info["truncation"] == DP_GMM_MIN_TRUNCATION


def test_run_baselines_runs_every_method(caplog):
    scenario = {"name": "blobs", "n_clients": 3, "n_clusters": 3, "dim": 2, "r_min": 8.0, "n_train": 300,
                "n_test": 150}
    with warnings.catch_warnings(), caplog.at_level("INFO", logger="fedica.baselines"):
        warnings.simplefilter("ignore", ConvergenceWarning)
        metrics, timings = run_baselines(scenario, BASELINE_METHODS, seed=0, n_init=1)
    assert list(metrics) == list(BASELINE_METHODS)
    for name, scores in metrics.items():
        assert scores["k_true"] == 3 and -1 <= scores["global_ari"] <= 1 and timings[name] > 0
        assert f"{name}: fitted in" in caplog.text and f"{name}: fitting on 3 clients" in caplog.text
    assert metrics["afcl"]["residual_bytes"] >= 300 * 2 * 8 and metrics["ffcm-avg2"]["rounds"] >= 1
    assert timings["afcl_server"] > 0 and timings["ffcm-avg1_clients_sum"] > 0
    with pytest.raises(ValueError, match="unknown baseline"):
        run_baselines(scenario, ["k-means"], seed=0)
