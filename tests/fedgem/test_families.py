"""Covariance families of the global clusters (fedica.fedgem.families; docs/ALGORITHMS.md 2.14)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import multivariate_normal
from sklearn.metrics import adjusted_rand_score
from sklearn.mixture._gaussian_mixture import _estimate_gaussian_parameters

import fedica
from fedica.fedgem import client as fedgem_client
from fedica.fedgem import families
from fedica.fedgem.families import (FAMILIES, FamilyModel, agglomeration_candidates, checked_cluster_moments, cluster_moments,
                                    shape_parameters)
from fedica.protocol import InvalidReply


def _two_long_clusters(seed: int = 0, n: int = 400, offset=(-4.0, 8.0)) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two parallel clusters 12 times longer than wide, correlated features: spheres need several each."""
    rng = np.random.default_rng(seed)
    rotation = np.array([[np.cos(0.5), -np.sin(0.5)], [np.sin(0.5), np.cos(0.5)]])
    points = [rng.normal(size=(n, 2)) * [6.0, 0.5] @ rotation.T + offset for offset in ([0, 0], offset)]
    X, y = np.vstack(points), np.repeat([0, 1], n)
    return X, y, rng.integers(0, 4, X.shape[0])


def test_pooled_site_moments_are_the_pooled_points_moments():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 3)) @ rng.normal(size=(3, 3))
    labels = rng.integers(0, 4, 300)
    sites = rng.integers(0, 3, 300)
    replies = [fedgem_client.cluster_moments_reply(X[sites == g], labels[sites == g], 4)[0] for g in range(3)]
    masses = np.concatenate([r["masses"] for r in replies])
    counts, means, covariances = cluster_moments(np.tile(np.arange(4), 3), 4, masses,
                                                 np.vstack([r["means"] for r in replies]),
                                                 np.concatenate([r["scatters"] for r in replies]))
    for j in range(4):
        members = X[labels == j]
        assert counts[j] == members.shape[0]
        np.testing.assert_allclose(means[j], members.mean(axis=0), atol=1e-12)
        np.testing.assert_allclose(covariances[j], np.cov(members.T, bias=True), atol=1e-10)


def test_a_full_family_joins_the_spheres_of_elongated_clusters():
    X, y, groups = _two_long_clusters()
    spheres = fedica.FedGEM(covariance_type="spherical", random_state=0).fit(X, groups=groups)
    full = fedica.FedGEM(covariance_type="full", random_state=0).fit(X, groups=groups)
    assert spheres.n_clusters_ > 2  # the spheres count each cluster several times
    assert full.n_clusters_ == 2 and full.covariance_family_ == "full"
    assert adjusted_rand_score(y, full.labels_) > 0.98
    assert full.covariances_.shape == (2, 2, 2)
    # Each cluster's covariance is its points' (in the standardised units the sites clustered).
    standardised = (X - full.feature_location_) / full.feature_scale_
    for j in range(2):
        members = standardised[full.labels_ == j]
        np.testing.assert_allclose(full.covariances_[j], np.cov(members.T, bias=True), rtol=0.05, atol=0.01)
    probabilities = full.predict_proba(X)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0)
    assert np.array_equal(full.predict(X), probabilities.argmax(axis=1))
    assert adjusted_rand_score(y, full.predict(X)) > 0.98


@pytest.mark.parametrize("seed", range(5))
def test_touching_elongated_clusters_are_two_once_the_federated_em_has_fitted_them(seed):
    # Spheres straddle the two clusters where they touch; the agglomeration alone left 3 to 5 clusters (seeds 1, 2).
    X, y, groups = _two_long_clusters(seed=seed, offset=(-2.5, 4.5))
    model = fedica.FedGEM(covariance_type="full", random_state=0).fit(X, groups=groups)
    assert model.n_clusters_ == 2 and adjusted_rand_score(y, model.labels_) > 0.99
    assert model.tuning_["family_em_steps"] >= 1 and not model.rejected_


def test_auto_chooses_the_family_and_its_choice_does_not_depend_on_units():
    X, y, groups = _two_long_clusters(seed=2)
    model = fedica.FedGEM(covariance_type="auto", random_state=0).fit(X, groups=groups)
    assert model.covariance_family_ == "full" and model.n_clusters_ == 2
    assert set(model.tuning_["family_paths"]) == {"spherical", "diag", "full"}
    scaled = fedica.FedGEM(covariance_type="auto", random_state=0).fit(X * [1e-3, 1e3], groups=groups)
    assert scaled.n_clusters_ == 2 and np.array_equal(scaled.labels_, model.labels_)
    assert model.k_support_["criterion"] == "bic"  # each K's best over the three families
    assert fedica.FedGEM(covariance_type="full", random_state=0).fit(X, groups=groups).k_support_["criterion"] == "full-bic"


def test_a_diag_family_keeps_axis_aligned_clusters_apart():
    rng = np.random.default_rng(3)
    X = np.vstack([rng.normal(size=(300, 2)) * [5.0, 0.4] + [0, 0], rng.normal(size=(300, 2)) * [5.0, 0.4] + [0, 3]])
    y = np.repeat([0, 1], 300)
    model = fedica.FedGEM(covariance_type="diag", random_state=0).fit(X, groups=rng.integers(0, 3, 600))
    assert model.covariance_family_ == "diag" and model.n_clusters_ == 2
    assert adjusted_rand_score(y, model.labels_) > 0.98
    off_diagonal = model.covariances_[:, 0, 1]
    assert np.all(off_diagonal == 0)


def test_the_agglomeration_joins_the_halves_of_one_cluster_and_not_two_clusters():
    rng = np.random.default_rng(4)
    points = [rng.normal(size=(200, 2)) * [3.0, 0.3], rng.normal(size=(200, 2)) * [3.0, 0.3] + [0, 4]]
    halves = [p[p[:, 0] < 0] for p in points] + [p[p[:, 0] >= 0] for p in points]
    counts = np.array([h.shape[0] for h in halves], dtype=float)
    means = np.array([h.mean(axis=0) for h in halves])
    covariances = np.array([np.cov(h.T, bias=True) for h in halves])
    model = agglomeration_candidates(counts, means, covariances, ("full",), reg=1e-6, width=0)[0]  # the path's best
    assert model.n_clusters == 2
    assert model.merged[0] == model.merged[2] and model.merged[1] == model.merged[3]
    assert model.merged[0] != model.merged[1]


@pytest.mark.parametrize("field, value, reason", [
    ("masses", np.array([3.0, 4.0]), "sum to"),
    ("masses", np.array([5.5, 4.5]), "whole counts"),
    ("scatters", np.array([[[1.0, 2.0], [0.0, 1.0]], np.eye(2)]), "not symmetric"),
    ("scatters", np.array([[[1.0, 0.0], [0.0, -1.0]], np.eye(2)]), "not positive semi-definite"),
    ("means", np.array([[np.nan, 0.0], [0.0, 0.0]]), "'means' must be finite"),
])
def test_a_reply_s_moments_are_refused_with_the_rule_they_break(field, value, reason):
    arrays = {"masses": np.array([6.0, 4.0]), "means": np.zeros((2, 2)), "scatters": np.stack([np.eye(2)] * 2)}
    checked_cluster_moments(arrays, 2, 2, 10)
    with pytest.raises(InvalidReply, match=reason):
        checked_cluster_moments({**arrays, field: value}, 2, 2, 10)


@pytest.mark.parametrize("arrays, reason", [
    ({}, "'scatter-diagonals' is missing"),
    ({"scatter-diagonals": np.array([[1.0, -1e-6]])}, "negative variance"),
    ({"scatter-diagonals": np.ones((2, 2))}, r"'scatter-diagonals' must be finite, of shape \(1, 2\)"),
    ({"scatter-diagonals": np.ones((1, 2)), "scatters": np.stack([np.eye(2)] * 2)},
     r"'scatters' must be .* \(1, 2, 2\)"),
])
def test_a_reply_s_scatter_diagonals_are_refused_with_the_rule_they_break(arrays, reason):
    honest = {"masses": np.array([6.0, 4.0]), "means": np.zeros((2, 2)), "scatters": np.eye(2)[None],
              "scatter-diagonals": np.array([[2.0, 0.5]])}
    diagonal_rows = np.array([False, True])
    _, _, scatters = checked_cluster_moments(honest, 2, 2, 10, diagonal_rows)
    np.testing.assert_array_equal(scatters, [np.eye(2), np.diag([2.0, 0.5])])
    with pytest.raises(InvalidReply, match=reason):
        checked_cluster_moments({key: value for key, value in {**honest, **arrays}.items()
                                 if arrays or key != "scatter-diagonals"}, 2, 2, 10, diagonal_rows)


def test_diagonal_candidates_send_their_scatters_diagonals_and_step_as_with_the_whole_scatters():
    # The diag and spherical M-steps read only the scatters' diagonals (and the robust sum their traces), so their
    # sites send d numbers a cluster for d^2, and the step is the same to the bit.
    from fedica.fedgem.family_stage import FamilyStage

    rng = np.random.default_rng(6)
    X = np.vstack([rng.normal(size=(150, 3)) @ rng.normal(size=(3, 3)) + shift for shift in (0.0, 4.0)])
    sites = rng.integers(0, 3, X.shape[0])

    def candidates():
        return [FamilyModel(family, np.arange(2), np.array([100.0, 200.0]), np.array([[0.0, 0, 0], [4.0, 4, 4]]),
                            np.stack([np.eye(3), 2 * np.eye(3)])) for family in FAMILIES]

    payload = FamilyStage._family_payload(candidates())
    assert payload["diagonal"].tolist() == [family != "full" for family in FAMILIES]
    arguments = [payload[key] for key in ("weights", "means", "covariances", "sizes")]
    whole = [fedgem_client.family_em_reply(X[sites == g], *arguments)[0] for g in range(3)]
    split = [fedgem_client.family_em_reply(X[sites == g], *arguments, payload["diagonal"])[0] for g in range(3)]
    assert split[0]["scatter-diagonals"].shape == (4, 3) and split[0]["scatters"].shape == (2, 3, 3)
    sent = split[0]["scatters"].nbytes + split[0]["scatter-diagonals"].nbytes
    assert sent == (2 * 9 + 4 * 3) / (6 * 9) * whole[0]["scatters"].nbytes
    stepped = []
    for replies, diagonal in ((whole, None), (split, payload["diagonal"].astype(bool))):
        moments = [families.checked_mixture_moments(reply, payload["sizes"], 3, int((sites == g).sum()), diagonal)
                   for g, reply in enumerate(replies)]
        models = candidates()
        for index, model in enumerate(models):
            part = slice(2 * index, 2 * index + 2)
            model.m_step(*(np.stack([m[i][part] for m in moments]) for i in range(3)), reg=1e-6, hostile_fraction=0.25)
        stepped.append(models)
    for model, other in zip(*stepped):
        np.testing.assert_array_equal(model.covariances, other.covariances)
        np.testing.assert_array_equal(model.means, other.means)
        np.testing.assert_array_equal(model.counts, other.counts)


def test_a_site_whose_moments_break_the_rules_is_left_out_and_named(monkeypatch):
    X, y, groups = _two_long_clusters(seed=5)
    honest = fedgem_client.cluster_moments_reply

    def not_positive(X, labels, n_clusters):
        arrays, values = honest(X, labels, n_clusters)
        if X.shape[0] == int((groups == 1).sum()):
            arrays["scatters"] = -arrays["scatters"]
        return arrays, values

    monkeypatch.setattr(fedgem_client, "cluster_moments_reply", not_positive)
    model = fedica.FedGEM(covariance_type="full", random_state=0).fit(X, groups=groups)
    refused = [entry for entry in model.rejected_ if entry["round"] == "cluster-moments"]
    assert [entry["client"] for entry in refused] == [1]
    assert "not positive semi-definite" in refused[0]["reason"]
    assert model.n_clusters_ == 2 and adjusted_rand_score(y, model.labels_) > 0.98


def test_a_federated_em_step_is_the_pooled_points_em_step():
    rng = np.random.default_rng(6)
    X = np.vstack([rng.normal(size=(150, 3)) @ rng.normal(size=(3, 3)) + shift for shift in (0.0, 4.0)])
    sites = rng.integers(0, 3, X.shape[0])
    covariances = np.stack([np.eye(3), 2 * np.eye(3)])
    model = FamilyModel("full", np.arange(2), np.array([100.0, 200.0]), np.array([[0.0, 0, 0], [4.0, 4, 4]]), covariances)
    replies = [fedgem_client.family_em_reply(X[sites == g], model.weights, model.means, model.covariances, [2])[0]
               for g in range(3)]
    model.m_step(np.stack([r["masses"] for r in replies]), np.stack([r["means"] for r in replies]),
                 np.stack([r["scatters"] for r in replies]), reg=1e-6)
    # scikit-learn's E-step and M-step on the pooled points from the same mixture.
    log_joint = np.log([1 / 3, 2 / 3]) + np.column_stack([multivariate_normal(m, c).logpdf(X) for m, c in
                                                         zip([[0.0, 0, 0], [4.0, 4, 4]], covariances)])
    responsibilities = np.exp(log_joint - logsumexp(log_joint, axis=1, keepdims=True))
    weights, means, pooled = _estimate_gaussian_parameters(X, responsibilities, 1e-6, "full")
    np.testing.assert_allclose(model.weights, weights / X.shape[0], atol=1e-12)
    np.testing.assert_allclose(model.means, means, atol=1e-10)
    np.testing.assert_allclose(model.covariances, pooled, atol=1e-10)
    assert sum(r["log-likelihoods"][0] for r in replies) == pytest.approx(logsumexp(log_joint, axis=1).sum(), rel=1e-12)


def test_a_site_answers_every_candidate_mixture_at_once_as_each_one_alone():
    # Three candidates stacked (1, 2 and 3 clusters), the third with a tight cluster far from the site's mean, where a
    # difference of moments would lose its spread: each cluster's moments and each mixture's log-likelihood equal the
    # E-step and M-step of its mixture alone (scikit-learn's), and every scatter stays positive semi-definite.
    rng = np.random.default_rng(11)
    X = np.vstack([rng.normal(size=(200, 3)) @ rng.normal(size=(3, 3)), 100 + 1e-3 * rng.normal(size=(6, 3))])
    sizes = np.array([1, 2, 3])
    means = np.vstack([[0.0, 0, 0], [-1.0, 0, 0], [1.0, 0, 0], [0.0, 1, 0], [0.0, -1, 0], [100.0, 100, 100]])
    covariances = np.stack([np.eye(3) * (1 + k) for k in range(5)] + [1e-6 * np.eye(3)])
    weights = np.array([1.0, 0.5, 0.5, 0.5, 0.49, 0.01])
    reply = fedgem_client.family_em_reply(X, weights, means, covariances, sizes)[0]
    for index, (start, size) in enumerate(zip(np.cumsum(sizes) - sizes, sizes)):
        part = slice(start, start + size)
        log_joint = np.log(weights[part]) + np.column_stack(
            [multivariate_normal(m, c).logpdf(X) for m, c in zip(means[part], covariances[part])])
        responsibilities = np.exp(log_joint - logsumexp(log_joint, axis=1, keepdims=True))
        masses, centres, scatters = _estimate_gaussian_parameters(X, responsibilities, 0.0, "full")
        np.testing.assert_allclose(reply["masses"][part], masses, rtol=1e-10)
        np.testing.assert_allclose(reply["means"][part], centres, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(reply["scatters"][part], scatters, rtol=1e-7, atol=1e-12)
        assert reply["log-likelihoods"][index] == pytest.approx(logsumexp(log_joint, axis=1).sum(), rel=1e-12)
    assert np.linalg.eigvalsh(reply["scatters"][-1]).min() > 0


def test_one_site_of_five_that_widens_its_moments_is_left_out_and_named(monkeypatch):
    X, y, groups = _two_long_clusters(seed=7, offset=(-2.5, 4.5))
    groups = np.random.default_rng(7).integers(0, 5, X.shape[0])
    while np.sum(np.bincount(groups) == np.bincount(groups)[0]) > 1:  # the hostile site is told by its size
        groups = np.random.default_rng(int(groups.sum())).integers(0, 5, X.shape[0])
    hostile_rows = int((groups == 0).sum())
    honest = fedica.FedGEM(covariance_type="full", random_state=0).fit(X, groups=groups)
    honest_moments, honest_em = fedgem_client.cluster_moments_reply, fedgem_client.family_em_reply

    def widened_moments(X, labels, n_clusters):
        arrays, values = honest_moments(X, labels, n_clusters)
        if X.shape[0] == hostile_rows:  # every point in cluster 0, every scatter 100 times wider
            arrays["masses"] = np.eye(n_clusters)[0] * X.shape[0]
            arrays["scatters"] = 100.0 * np.stack([np.eye(X.shape[1])] * n_clusters)
        return arrays, values

    def widened_em(X, weights, means, covariances, sizes, diagonal=None):
        arrays, values = honest_em(X, weights, means, covariances, sizes, diagonal)
        if X.shape[0] == hostile_rows:
            arrays["scatters"] = 100.0 * arrays["scatters"]
            arrays["scatter-diagonals"] = 100.0 * arrays["scatter-diagonals"]
        return arrays, values

    monkeypatch.setattr(fedgem_client, "cluster_moments_reply", widened_moments)
    monkeypatch.setattr(fedgem_client, "family_em_reply", widened_em)
    with pytest.warns(UserWarning, match="covariance family.*sites 0 sent moments"):
        attacked = fedica.FedGEM(covariance_type="full", random_state=0).fit(X, groups=groups)
    # Measured before the rule: one such site of five took penguins from three clusters at ARI .95 to one at 0.
    assert attacked.n_clusters_ == honest.n_clusters_ == 2
    assert adjusted_rand_score(honest.labels_, attacked.labels_) > 0.99
    assert attacked.tuning_["family_left_out"] == [0]


def test_the_summary_names_the_family_a_run_chose():
    from fedica.results import format_summary
    tuning = {"family": "full", "family_em_steps": 9, "family_start_k": 5}
    line = [line for line in format_summary({"fedgem": {"upsilon_tuning": tuning}}).splitlines() if "family" in line]
    assert line == ["covariance family: full, chosen by the BIC after 9 federated EM steps from the 5 clusters of the spheres"]


def test_a_run_records_its_family_and_from_result_rebuilds_the_mixture(tmp_path):
    import json

    from fedica.config import validate_config
    from fedica.data.real import real_dataset
    from fedica.results import to_jsonable
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    result = run_inprocess(validate_config(compose_config([
        "algorithm=fedgem", "scenario=sklearn_real", "scenario.dataset=penguins", "scenario.split=sizes",
        "engine=inprocess", "baselines=false", "algorithm.covariance_type=auto"])))
    section = result["fedgem"]
    n_clusters, dim = np.asarray(section["global_centroids"]).shape
    assert section["covariance_family"] in ("spherical", "diag", "full")
    assert np.asarray(section["covariances"]).shape == (n_clusters, dim, dim)
    assert section["upsilon_tuning"]["family_em_steps"] >= 1 and section["k_support"]["criterion"].endswith("bic")
    path = tmp_path / "result.json"
    path.write_text(json.dumps(to_jsonable(result)))
    model = fedica.FedGEM.from_result(path)
    assert model.covariance_family_ == section["covariance_family"] and model.n_clusters_ == n_clusters
    X, _ = real_dataset("penguins")
    probabilities = model.predict_proba(X)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0)
    assert np.array_equal(model.predict(X), probabilities.argmax(axis=1))
    assert np.isfinite(model.score(X))


def test_the_widened_moments_attack_changes_nothing_and_its_site_is_named():
    from fedica.config import validate_config
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    def run(*overrides):
        result = run_inprocess(validate_config(compose_config([
            "algorithm=fedgem", "scenario=sklearn_real", "scenario.dataset=penguins", "scenario.split=sizes",
            "scenario.n_clients=5", "engine=inprocess", "baselines=false", "algorithm.covariance_type=auto",
            *overrides])))
        # The run's warnings as result.json and summary.txt count them.
        return result, [warning for warning in result.get("warnings", {}) if "covariance family" in warning]

    (honest, quiet), (attacked, named) = run(), run("attack=widened_moments", "attack.fraction=0.2")
    assert attacked["fedgem"]["hostile_clients"] == [2] and not quiet
    assert named and all("sites 2 sent" in message for message in named)
    assert attacked["fedgem"]["upsilon_tuning"]["family_left_out"] == [2]
    for key in ("k_hat", "global_ari"):
        assert attacked["metrics"]["fedgem"][key] == pytest.approx(honest["metrics"]["fedgem"][key], abs=0.02)


def test_a_family_path_also_starts_from_the_finest_partition_where_the_chosen_one_cut_a_family_short():
    # Waveform over five sites told K_g = 2 (the classes each holds): the spheres' selection chose 4 clusters, diag's
    # best from them held all 4 and lost to full's one cluster (ARI 0). The finest partition scored (6 clusters)
    # starts a second path, whose diagonal mixture the BIC prefers.
    from fedica.data.classes import waveform_client_data

    sites = [waveform_client_data(g, n_clients=5, seed=0) for g in range(5)]
    model = fedica.FedGEM(random_state=0, covariance_type="auto").fit(
        [s.X_train for s in sites], n_local_clusters=[s.n_components for s in sites])
    starts = {c["start_k"] for c in model.tuning_["family_candidates"]}
    assert starts == {4, 6} and model.tuning_["family_start_k"] == 6
    assert model.covariance_family_ == "diag" and model.n_clusters_ >= 4
    assert adjusted_rand_score(np.concatenate([s.y_train for s in sites]), np.concatenate(model.labels_)) > 0.25


def test_the_family_bic_weighs_every_point_where_the_sites_differ_in_size():
    # Sites of 5, 16 and 54 points of four clusters: the robust sum weighs each site at most the median's count (37 of
    # 75 points); scaled back to every point, each candidate's BIC is the central one's for the same mixture family.
    from sklearn.mixture import GaussianMixture

    rng = np.random.default_rng(4)
    centres = np.array([[0.0, 0.0], [5.0, 0.0], [0.0, 5.0], [5.0, 5.0]])
    labels = [rng.integers(4, size=n) for n in (5, 16, 54)]
    sites = [centres[y] + rng.standard_normal((y.size, 2)) for y in labels]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the small sites' K_g at their bound
        model = fedica.FedGEM(covariance_type="auto", standardize=None, random_state=0).fit(sites)
    assert model.n_clusters_ == 4
    X = np.vstack(sites)
    central = GaussianMixture(4, covariance_type="spherical", n_init=3, random_state=0).fit(X).bic(X)
    ours = next(c["bic"] for c in model.tuning_["family_candidates"] if (c["family"], c["k"]) == ("spherical", 4))
    assert ours == pytest.approx(central, rel=0.03)


def test_spheres_of_standardised_features_count_the_shape_the_standardisation_estimated():
    # Penguins (bill and flipper lengths in mm, body mass in g) over four sites: spheres of the standardised features
    # share the features' pooled deviations as one shape, d - 1 parameters more than the spheres' own count. Without
    # them `auto` chose 6 spheres (ARI .59) where the central BIC on the data's units chooses 2-3 full clusters.
    from fedica.data.real import real_client_data

    assert [shape_parameters(f, 4, True) for f in FAMILIES] == [3, 0, 0]
    assert [shape_parameters(f, 4, False) for f in FAMILIES] == [0, 0, 0]
    spheres = FamilyModel("spherical", np.zeros(2, dtype=int), np.array([60.0, 60.0]), np.zeros((2, 4)),
                          np.stack([np.eye(4)] * 2), log_likelihood=-100.0)
    counted = FamilyModel("spherical", spheres.merged, spheres.counts, spheres.means, spheres.covariances,
                          log_likelihood=-100.0, unit_parameters=3)
    assert counted.bic(120.0) - spheres.bic(120.0) == pytest.approx(3 * np.log(120.0))

    sites = [real_client_data(g, dataset="penguins", split="classes", standardize="none", n_clients=4,
                              n_components="auto", seed=9) for g in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a site's K_g at its bound
        model = fedica.FedGEM(random_state=9).fit([s.X_train for s in sites])
    assert model.covariance_family_ == "full" and model.n_clusters_ in (2, 3)


def test_the_small_partitions_are_fitted_only_where_the_path_best_holds_few_clusters():
    # Twenty well-separated clusters: the path's best holds all twenty, and every partition of at most 8 lies far
    # above it in BIC; at G=1,000 (K=50) those partitions were 24 of 30 candidates. Four clusters keep them all.
    rng = np.random.default_rng(5)
    for n_clusters, expected in ((20, {19, 20}), (4, {1, 2, 3, 4})):
        centres = 20.0 * rng.standard_normal((n_clusters, 3))
        blobs = [centre + rng.standard_normal((60, 3)) for centre in centres]
        counts = np.full(n_clusters, 60.0)
        means = np.vstack([b.mean(axis=0) for b in blobs])
        covariances = np.stack([np.cov(b.T, bias=True) for b in blobs])
        candidates = agglomeration_candidates(counts, means, covariances, ("diag",), reg=1e-6)
        assert {c.n_clusters for c in candidates} == expected


@pytest.mark.parametrize("covariance_type", ["full", "diag"])
def test_bic_and_aic_are_scikit_learns_for_the_federations_mixture(covariance_type):
    from sklearn.datasets import load_iris
    from sklearn.mixture import GaussianMixture
    from sklearn.mixture._gaussian_mixture import _compute_precision_cholesky

    X, _ = load_iris(return_X_y=True)
    sites = np.array_split(X[np.random.default_rng(0).permutation(len(X))], 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = fedica.FedGEM(random_state=0, covariance_type=covariance_type).fit(sites)
    assert model.covariance_family_ == covariance_type and model.feature_scale_ is not None
    # The same mixture in the data's units, as scikit-learn holds it.
    covariances = model.covariances_ * np.outer(model.feature_scale_, model.feature_scale_)
    theirs = GaussianMixture(model.n_clusters_, covariance_type=covariance_type)
    theirs.weights_, theirs.means_ = model.weights_, model.means_
    theirs.covariances_ = covariances if covariance_type == "full" else np.diagonal(covariances, axis1=1, axis2=2)
    theirs.precisions_cholesky_ = _compute_precision_cholesky(theirs.covariances_, covariance_type)
    assert model.bic(X) == pytest.approx(theirs.bic(X), rel=1e-10)
    assert model.aic(X) == pytest.approx(theirs.aic(X), rel=1e-10)


def test_the_bic_of_standardised_spheres_counts_their_shape():
    from sklearn.datasets import load_iris

    X, _ = load_iris(return_X_y=True)
    sites = np.array_split(X[np.random.default_rng(0).permutation(len(X))], 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        family = fedica.FedGEM(random_state=0, covariance_type="auto").fit(sites)
        spheres = fedica.FedGEM(random_state=0, covariance_type="spherical").fit(sites)
    (n, d), log_n = X.shape, np.log(X.shape[0])
    family.covariance_family_ = "spherical"  # the count alone: K variances, K d means, K - 1 weights, d - 1 shape
    k = family.n_clusters_
    assert family.bic(X) == pytest.approx(-2 * family.score(X) * n + (k * (d + 2) - 1 + d - 1) * log_n, rel=1e-12)
    # The spheres alone: one variance for every cluster.
    assert spheres.covariance_family_ is None
    k = spheres.n_clusters_
    assert spheres.bic(X) == pytest.approx(-2 * spheres.score(X) * n + (k * (d + 1) + d - 1) * log_n, rel=1e-12)


def test_a_yardstick_run_scores_the_federations_mixture_by_the_central_bic_on_the_pooled_points(tmp_path):
    import json

    from fedica.config import validate_config
    from fedica.data.scenarios import scenario_client_data
    from fedica.evaluation.baselines import central_gmm_bic
    from fedica.results import format_summary, to_jsonable
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    cfg = validate_config(compose_config([
        "algorithm=fedgem", "scenario=sklearn_real", "scenario.dataset=breast_cancer", "scenario.split=classes",
        "scenario.standardize=none", "scenario.n_clients=4", "scenario.n_components=auto", "engine=inprocess",
        "baseline_methods=[central-gmm-bic]", "seed=0"]))
    result = run_inprocess(cfg)
    path = tmp_path / "result.json"
    path.write_text(json.dumps(to_jsonable(result)))
    sites = [scenario_client_data(cfg["scenario"], g, 0) for g in range(4)]
    pooled = np.vstack([s.X_train for s in sites])
    ours, central = result["metrics"]["fedgem"]["pooled_bic"], result["metrics"]["central-gmm-bic"]["pooled_bic"]
    assert ours == pytest.approx(fedica.FedGEM.from_result(path).bic(pooled), rel=1e-9)
    assert central == pytest.approx(central_gmm_bic(sites, random_state=0).info["pooled_bic"], rel=1e-12)
    # Breast cancer's 30 features span ten orders of magnitude in variance: scored in the data's units (the
    # Jacobian of the standardisation counted), the federation's full mixture is the better fit here.
    assert ours < central
    assert not any("central-gmm-bic's by" in warning for warning in result["warnings"])
    assert (f"pooled BIC (the central analyst's criterion, on the pooled training points; lower is better): fedgem "
            f"{ours:.1f}, central-gmm-bic {central:.1f}: FedGEM's mixture the better fit by {central - ours:.1f}"
            in format_summary(result).splitlines())


def test_the_pooled_bic_line_says_which_mixture_fits_better():
    from fedica.results import pooled_bic_line

    def line(ours, central):
        return pooled_bic_line({"fedgem": {"pooled_bic": ours}, "central-gmm-bic": {"pooled_bic": central}})

    assert line(10.0, 12.5).endswith("fedgem 10.0, central-gmm-bic 12.5: FedGEM's mixture the better fit by 2.5")
    assert line(12.5, 10.0).endswith(": the central mixture the better fit by 2.5")
    assert line(10.0, 10.0).endswith(": the same fit")
    assert line(10.0, 11.5).endswith(": within 2 of each other, no evidence either way")
    assert pooled_bic_line({"fedgem": {"pooled_bic": 1.0}, "central-gmm": {"pooled_bic": 2.0}}) is None


def test_a_run_whose_central_mixture_is_strongly_likelier_says_so():
    # Crabs over 4 sites (classes split, seed 1): the federation's full path scores nothing between its start and one
    # cluster (ALGORITHMS.md 2.14), and the central analyst's two full clusters fit the pooled points better.
    from fedica.config import validate_config
    from fedica.results import format_summary
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    result = run_inprocess(validate_config(compose_config([
        "algorithm=fedgem", "scenario=sklearn_real", "scenario.dataset=crabs", "scenario.split=classes",
        "scenario.standardize=none", "scenario.n_clients=4", "scenario.n_components=auto", "engine=inprocess",
        "baseline_methods=[central-gmm-bic]", "seed=1"])))
    gap = result["metrics"]["fedgem"]["pooled_bic"] - result["metrics"]["central-gmm-bic"]["pooled_bic"]
    assert gap > 6
    message = (f"FedGEM's mixture fits the pooled training points worse than central-gmm-bic's by {gap:.1f} in BIC "
               "(strong evidence, above 6): the federation missed a likelier mixture of the same data")
    assert f"UserWarning: {message}" in result["warnings"]
    summary = format_summary(result).splitlines()
    assert f"warning: {message}" in summary
    assert summary[summary.index(f"warning: {message}") + 1].endswith(f": the central mixture the better fit by {gap:.1f}")
