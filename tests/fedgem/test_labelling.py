"""How a site labels its points (labelling, docs/ALGORITHMS.md 2.8): its consensus model, or its own mixture."""

import json

import numpy as np
import pytest
from sklearn.datasets import load_iris
from sklearn.exceptions import NotFittedError
from sklearn.metrics import adjusted_rand_score

import fedica
from fedica.fedgem.client import adapted_labels, consensus_labels
from fedica.fedgem.geometry import LABELLINGS, geometry


def _two_clusters_and_a_stranger(seed=0, n=400, d=4):
    """A site's points from two clusters 6 apart, and three global centres: the two, and one the site never saw
    3.5 from the first (nearer to some of its points than their own centre)."""
    rng = np.random.default_rng(seed)
    centres = np.zeros((3, d))
    centres[1, 0] = 6.0
    centres[2, 1] = 3.5
    truth = rng.integers(2, size=n)
    return centres[truth] + rng.standard_normal((n, d)), truth, centres


def _log_likelihood(X, centres, weights, variance):
    d = X.shape[1]
    log_joint = (np.log(np.maximum(weights, 1e-300))[None]
                 - ((X[:, None, :] - centres[None]) ** 2).sum(axis=2) / (2 * variance)
                 - 0.5 * d * np.log(2 * np.pi * variance))
    peak = log_joint.max(axis=1)
    return float((peak + np.log(np.exp(log_joint - peak[:, None]).sum(axis=1))).sum())


def test_the_options_are_the_declared_ones():
    assert LABELLINGS == ("consensus", "adapted")
    assert fedica.parameters.FEDGEM_PARAMETERS["labelling"].paper == "consensus"


@pytest.mark.parametrize("covariance_type", ["identity", "spherical"])
def test_a_cluster_the_site_does_not_hold_gets_almost_no_weight(covariance_type):
    X, truth, centres = _two_clusters_and_a_stranger()
    weights, variance = geometry(covariance_type).site_mixture(X, centres)
    assert weights.sum() == pytest.approx(1.0)
    assert weights[2] < 1e-3 and abs(weights[0] - np.mean(truth == 0)) < 0.02
    assert variance == 1.0 if covariance_type == "identity" else abs(variance - 1.0) < 0.1
    labels = geometry(covariance_type).site_labels(X, centres, weights, variance)
    assert adjusted_rand_score(truth, labels) > 0.98 and not np.any(labels == 2)
    # The nearest centre alone would hand some of the site's points to the cluster it does not hold.
    assert np.any(((X[:, None, :] - centres[None]) ** 2).sum(axis=2).argmin(axis=1) == 2)


def test_the_weights_are_the_likelihoods_maximum_over_the_simplex():
    # With the variance fixed the log-likelihood is concave in the weights: no other point of the simplex beats them.
    X, _, centres = _two_clusters_and_a_stranger(seed=1, n=150)
    centres = centres + np.random.default_rng(2).standard_normal(centres.shape)  # centres off the clusters' means
    weights, variance = geometry("identity").site_mixture(X, centres)
    best = _log_likelihood(X, centres, weights, variance)
    others = np.random.default_rng(3).dirichlet(np.ones(3), size=300)
    assert all(_log_likelihood(X, centres, w, variance) <= best + 1e-6 for w in others)
    for step in (np.array([1e-3, -1e-3, 0.0]), np.array([-1e-3, 1e-3, 0.0])):
        assert _log_likelihood(X, centres, weights + step, variance) < best


def test_the_spherical_mixture_does_not_depend_on_the_units_or_the_memory_order():
    X, _, centres = _two_clusters_and_a_stranger(seed=4)
    model = geometry("spherical")
    weights, variance = model.site_mixture(X, centres)
    for scale in (1e-3, 1e3):
        scaled_weights, scaled_variance = model.site_mixture(np.asfortranarray(X * scale), centres * scale)
        np.testing.assert_allclose(scaled_weights, weights, rtol=1e-9, atol=1e-12)
        assert scaled_variance == pytest.approx(variance * scale ** 2, rel=1e-9)
        np.testing.assert_array_equal(model.site_labels(X * scale, centres * scale, scaled_weights, scaled_variance),
                                      model.site_labels(X, centres, weights, variance))


def test_a_site_whose_component_holds_two_clusters_labels_them_apart():
    X, truth, centres = _two_clusters_and_a_stranger(seed=5)
    ids = np.array([7, 3, 11])
    # The site's consensus model: its one component joined global cluster 7.
    assert np.all(consensus_labels(X, centres[:1], ids[:1]) == 7)
    adapted = adapted_labels(X, X, centres, ids, geometry("spherical"))
    assert set(adapted.tolist()) == {7, 3} and adjusted_rand_score(truth, adapted) > 0.98


@pytest.mark.parametrize("centres, ids, message", [
    (np.zeros((2, 3)), np.arange(2), "global centres of shape \\(2, 3\\); this client's points have d=4"),
    (np.full((2, 4), np.nan), np.arange(2), "global centres of shape"),
    (np.zeros((2, 4)), np.arange(3), "global-ids of shape \\(3,\\) do not name the 2 global centres"),
    (np.zeros((2, 4)), np.array([0.5, 1.0]), "do not name the 2 global centres"),
])
def test_a_malformed_evaluation_request_is_one_line(centres, ids, message):
    X, _, _ = _two_clusters_and_a_stranger()
    with pytest.raises(ValueError, match=message):
        adapted_labels(X, X, centres, ids, geometry("identity"))


def _iris_sites():
    X, y = load_iris(return_X_y=True)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(X))
    # Site 0 holds two classes and is told K_g = 1: its one component covers both.
    site0 = order[np.isin(y[order], [1, 2])][:60]
    rest = np.setdiff1d(order, site0)
    return [X[site0], X[rest[: len(rest) // 2]], X[rest[len(rest) // 2:]]], [y[site0]], [1, 3, 3]


def test_the_estimator_labels_a_site_with_its_own_mixture_by_default():
    # The spheres' labelling (under a covariance family the labelling also decides the moments the family starts
    # from, so the means differ too).
    sites, (truth0,), counts = _iris_sites()
    adapted = fedica.FedGEM(covariance_type="spherical", random_state=0).fit(sites, n_local_clusters=counts)
    consensus = fedica.FedGEM(covariance_type="spherical", random_state=0, labelling="consensus").fit(
        sites, n_local_clusters=counts)
    np.testing.assert_array_equal(adapted.means_, consensus.means_)  # the labelling changes the labels only
    assert np.unique(consensus.labels_[0]).size == 1
    assert adjusted_rand_score(truth0, adapted.labels_[0]) > adjusted_rand_score(truth0, consensus.labels_[0]) + 0.3
    np.testing.assert_array_equal(adapted.predict(sites[0], site=0), adapted.labels_[0])
    assert len(adapted.site_weights_) == 3 and all(w.shape == (adapted.n_clusters_,) for w in adapted.site_weights_)
    assert consensus.site_weights_ is None


def test_a_global_cluster_no_site_gives_a_point_is_not_counted():
    # Site 3 fits 3 components to 4 clusters: one lies between two clusters the other sites resolve and forms a global
    # cluster of its own, which every site's mixture (site 3's too) leaves without a point (issue 44: n_clusters_ 5
    # where labels_ used 4 ids). The model drops it; its component maps to the nearest global centre left.
    rng = np.random.default_rng(0)
    centres = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 8.0], [8.0, 8.0]])
    sites = [np.vstack([rng.normal(c, 0.7, size=(80, 2)) for c in centres]) for _ in range(4)]
    truth = np.repeat(np.arange(4), 80)
    spheres = {"covariance_type": "spherical", "standardize": None, "random_state": 0}
    consensus = fedica.FedGEM(labelling="consensus", **spheres).fit(sites, n_local_clusters=[4, 4, 4, 3])
    assert consensus.n_clusters_ == 5
    model = fedica.FedGEM(**spheres).fit(sites, n_local_clusters=[4, 4, 4, 3])
    assert model.n_clusters_ == 4 == np.unique(np.concatenate(model.labels_)).size
    assert model.means_.shape == (4, 2) and model.weights_.shape == (4,)
    assert all(weights.shape == (4,) for weights in model.site_weights_)
    assert all(mapping.max() < 4 for mapping in model.site_mapping_)
    assert np.unique(model.site_mapping_[3]).size == 3  # its in-between component went to one of the two
    for labels in model.labels_:
        assert adjusted_rand_score(truth, labels) > 0.95  # clusters 0 and 1 touch (4 apart, sd 0.7)
    assert np.unique(model.predict(np.vstack(sites))).size == 4


def test_a_rebuilt_estimator_without_the_sites_mixtures_says_so(tmp_path):
    sites, _, counts = _iris_sites()
    model = fedica.FedGEM(random_state=0).fit(sites, n_local_clusters=counts)
    del model.site_weights_  # as a file saved by an older fedica, which had no site mixtures
    with pytest.raises(NotFittedError, match="labelling='adapted' needs the site's own mixture"):
        model.predict(sites[0], site=0)
    np.testing.assert_array_equal(model.set_params(labelling="consensus").predict(sites[1], site=1),
                                  model.site_mapping_[1][fedica.fedgem.local.assign_labels(sites[1], model.site_means_[1])])


def test_a_saved_estimator_keeps_the_sites_mixtures(tmp_path):
    sites, _, counts = _iris_sites()
    model = fedica.FedGEM(random_state=0).fit(sites, n_local_clusters=counts)
    loaded = fedica.FedGEM.load(model.save(tmp_path / "model.npz"))
    for g, X in enumerate(sites):
        np.testing.assert_array_equal(loaded.predict(X, site=g), model.predict(X, site=g))
    assert json.dumps(loaded.get_params()["labelling"]) == '"adapted"'


@pytest.mark.parametrize("labelling", LABELLINGS)
def test_the_protocols_evaluation_labels_as_the_clients_model_says(labelling):
    from fedica.data.blobs import blobs_client_data
    from fedica.fedgem.coordinator import FedGEMServer, FedGEMSettings
    from fedica.protocol import ArraySite, InMemoryFederation
    from fedica.tasks import CLIENT_TASKS

    clients = [blobs_client_data(g, n_clients=8, n_clusters=6, dim=3, r_min=4, n_train=1600, n_test=800, k_min=2,
                                 k_max=5, seed=3) for g in range(8)]
    server = FedGEMServer(FedGEMSettings(upsilon=1.0, covariance_type="spherical", labelling=labelling, standardize=None), evaluate=True)
    sites = {g: ArraySite(c, g) for g, c in enumerate(clients)}
    InMemoryFederation(sites, CLIENT_TASKS, server.rejected).run(server.run())
    payloads = server.evaluation_payloads()
    if labelling == "adapted":  # every client is sent every global centre
        assert all(p["centroids"].shape == server.aggregation.global_centroids.shape for p in payloads.values())
        labels = [adapted_labels(c.X_train, c.X_test, payloads[g]["centroids"], payloads[g]["global-ids"],
                                 geometry("spherical")) for g, c in enumerate(clients)]
    else:
        labels = [consensus_labels(c.X_test, payloads[g]["centroids"], payloads[g]["global-ids"])
                  for g, c in enumerate(clients)]
    assert not server.rejected
    truth = np.concatenate([c.y_test for c in clients])
    assert server.evaluation["global_ari"] == pytest.approx(adjusted_rand_score(truth, np.concatenate(labels)), abs=1e-12)
