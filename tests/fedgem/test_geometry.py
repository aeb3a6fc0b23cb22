"""FedGEM's component geometry (fedica.fedgem.geometry): identity as before, spherical learned per site, K_g = 1."""

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer
from sklearn.metrics import adjusted_rand_score
from sklearn.mixture import GaussianMixture

import fedica
from fedica.data.blobs import blobs_client_data
from fedica.fedgem import local
from fedica.fedgem.components import ClientModel, Components
from fedica.fedgem.geometry import COVARIANCE_TYPES, geometry
from fedica.fedgem.trust import final_radii, separation_scale
from fedica.protocol import InvalidReply, validate_gem_components


def _site(seed=0, n=200, d=3):
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0] * d, [6.0] + [0.0] * (d - 1), [0.0, 6.0] + [0.0] * (d - 2)])
    X = centres[rng.integers(3, size=n)] + rng.standard_normal((n, d)) * rng.choice([0.5, 1.5], size=(n, 1))
    return X, centres + rng.standard_normal(centres.shape)


def _q(X, gamma_k, mean, variance):
    """A component's term of the expected complete-data log-likelihood, Q_k(mean, variance) (up to log pi_k)."""
    d = X.shape[1]
    return float(np.sum(gamma_k * (-0.5 * d * np.log(2 * np.pi * variance) - ((X - mean) ** 2).sum(axis=1) / (2 * variance))))


def test_the_types_are_the_declared_options():
    assert COVARIANCE_TYPES == ("identity", "spherical", "diag", "full", "auto")
    with pytest.raises(ValueError, match="covariance_type='tied': must be one of identity, spherical, diag, full, auto"):
        geometry("tied")


def test_identity_is_the_papers_kernels_bit_for_bit():
    X, theta = _site()
    weights = np.full(3, 1 / 3)
    identity = geometry("identity")
    for steps in (1, 3):
        maximisers, eps, variances = identity.em_steps(X, theta, weights, None, steps)
        expected = local.local_round(X, theta, weights, n_steps=steps)
        assert variances is None
        np.testing.assert_array_equal(maximisers, expected[0])
        np.testing.assert_array_equal(eps, expected[1])
    np.testing.assert_array_equal(identity.final_radius(maximisers, weights, 200, 2.0),
                                  local.final_radius(maximisers, weights, 200, 2.0))
    assert identity.initial_variances(X, theta) is None and identity.adopted_variances(None, theta, theta) is None


def test_the_spherical_m_step_is_the_weighted_maximum_likelihood():
    X, theta = _site(1)
    weights = np.array([0.2, 0.3, 0.5])
    variances = np.array([0.5, 1.0, 2.0])
    maximisers, eps, new = geometry("spherical").em_steps(X, theta, weights, variances, 1)
    # The E-step written out per component: log pi_k + log N(x | theta_k, sigma_k^2 I).
    log_joint = np.stack([np.log(w) - 0.5 * X.shape[1] * np.log(2 * np.pi * v) - ((X - t) ** 2).sum(axis=1) / (2 * v)
                          for t, v, w in zip(theta, variances, weights)], axis=1)
    gamma = np.exp(log_joint - log_joint.max(axis=1, keepdims=True))
    gamma /= gamma.sum(axis=1, keepdims=True)
    expected_means = gamma.T @ X / gamma.sum(axis=0)[:, None]
    expected_variances = np.array([np.sum(gamma[:, k] * ((X - expected_means[k]) ** 2).sum(axis=1))
                                   for k in range(3)]) / (X.shape[1] * gamma.sum(axis=0))
    np.testing.assert_allclose(maximisers, expected_means, rtol=1e-10)
    np.testing.assert_allclose(new, expected_variances, rtol=1e-10)
    np.testing.assert_allclose(eps, ((maximisers - theta) ** 2).sum(axis=1), rtol=1e-12)


def test_a_spherical_site_adopting_a_point_of_its_ball_takes_a_gem_step_of_both_parameters():
    # Every m on the GEM ball's boundary, with the variance's conditional M-step at m, scores Q_k no lower
    # than the old pair (theta_k, sigma_old^2), whatever the old variance was (docs/ALGORITHMS.md 2.11).
    X, theta = _site(2)
    weights = np.full(3, 1 / 3)
    spherical = geometry("spherical")
    rng = np.random.default_rng(0)
    for old in (np.full(3, 0.05), np.full(3, 1.0), np.array([9.0, 0.3, 2.0])):
        maximisers, eps, variances = spherical.em_steps(X, theta, weights, old, 1)
        log_joint = np.stack([-((X - t) ** 2).sum(axis=1) / (2 * v) - 0.5 * X.shape[1] * np.log(v)
                              for t, v in zip(theta, old)], axis=1)
        gamma = np.exp(log_joint - log_joint.max(axis=1, keepdims=True))
        gamma /= gamma.sum(axis=1, keepdims=True)
        directions = rng.standard_normal((50, 3, X.shape[1]))
        directions /= np.linalg.norm(directions, axis=2, keepdims=True)
        for direction in directions:
            m = maximisers + direction * np.sqrt(eps)[:, None] * (1 - 1e-9)
            adopted = spherical.adopted_variances(variances, maximisers, m)
            for k in range(3):
                assert _q(X, gamma[:, k], m[k], adopted[k]) >= _q(X, gamma[:, k], theta[k], old[k]) - 1e-9
        # Just outside the ball, along the step, the pair is worse than the old mean with the conditional variance.
        outside = maximisers + 1.01 * (theta - maximisers)
        for k in range(3):
            at_theta = spherical.adopted_variances(variances, maximisers, theta)[k]
            assert _q(X, gamma[:, k], outside[k], spherical.adopted_variances(variances, maximisers, outside)[k]) < \
                _q(X, gamma[:, k], theta[k], at_theta)


def test_the_spherical_final_radius_is_the_papers_in_units_of_sigma():
    maximisers = np.array([[0.0, 0.0], [3.0, 4.0], [10.0, 0.0]])
    weights = np.array([0.5, 0.25, 0.25])
    variances = np.array([4.0, 1.0, 0.25])
    eps = geometry("spherical").final_radius(maximisers, weights, 400, 2.0, variances)
    np.testing.assert_allclose(eps, 2.0 * 5.0 * np.sqrt(variances) / (weights * 20.0))
    # Data, centres and sigma scaled by c: the squared radius scales by c^2, as the squared distances do.
    np.testing.assert_allclose(geometry("spherical").final_radius(7 * maximisers, weights, 400, 2.0, 49 * variances),
                               49 * eps)


def _components(centres_per_site, variances=None):
    owners = np.concatenate([np.full(len(c), g) for g, c in enumerate(centres_per_site)])
    centres = np.vstack(centres_per_site)
    return Components(list(range(len(centres_per_site))), centres, np.zeros(len(owners)), owners,
                      np.ones(len(owners)), variances)


def test_a_site_with_one_cluster_borrows_the_federations_separation():
    sites = [np.array([[0.0, 0.0], [4.0, 0.0]]), np.array([[0.0, 1.0], [0.0, 7.0]]), np.array([[9.0, 9.0]]),
             np.array([[1.0, 1.0], [1.0, 6.0]])]
    models = {g: ClientModel(100, np.full(len(c), 1 / len(c)), c) for g, c in enumerate(sites)}
    final = _components(sites)
    radii = final_radii(models, final, 1.0, geometry("identity"))
    # R for the one-cluster site: the median Rmin of the others (4, 6, 5) -> 5; pi = 1, N = 100.
    assert radii[4] == pytest.approx(5.0 / 10.0)
    for g in (0, 1, 3):  # the others: the paper's heuristic, unchanged
        part = final.slices()[g]
        np.testing.assert_array_equal(radii[part], local.final_radius(sites[g], models[g].weights, 100, 1.0))
    assert separation_scale(final) == 5.0
    # Under spherical it is scaled by the site's own sigma, like every final radius.
    spherical = _components(sites, np.full(7, 0.25))
    assert final_radii(models, spherical, 1.0, geometry("spherical"))[4] == pytest.approx(5.0 * 0.5 / 10.0)


def test_the_reply_checks_accept_one_component_and_refuse_none():
    assert validate_gem_components({"m": np.zeros((1, 3))}, "m", dim=3, n_components=None).shape == (1, 3)
    with pytest.raises(InvalidReply, match="no component"):
        validate_gem_components({"m": np.zeros((0, 3))}, "m", dim=3, n_components=None)


def _six_clusters():
    sites = [blobs_client_data(g, n_clients=5, n_clusters=6, dim=3, r_min=6.0, n_train=1500, n_test=300, seed=0)
             for g in range(5)]
    return [s.X_train for s in sites], [s.n_components for s in sites], np.concatenate([s.y_train for s in sites])


@pytest.mark.parametrize("covariance_type", ["spherical", "auto"])
def test_spherical_and_default_results_do_not_depend_on_the_datas_units(covariance_type):
    # The acceptance test: every site's data times c gives the same K_hat and the same labels.
    sites, k_local, truth = _six_clusters()
    reference = fedica.FedGEM(covariance_type=covariance_type, random_state=0).fit(sites, k_local)
    assert reference.n_clusters_ == 6
    assert adjusted_rand_score(truth, np.concatenate(reference.labels_)) > 0.99
    for c in (1e-3, 0.1, 10.0, 1e3):
        scaled = fedica.FedGEM(covariance_type=covariance_type, random_state=0).fit([c * X for X in sites], k_local)
        assert scaled.n_clusters_ == reference.n_clusters_, c
        for ours, theirs in zip(scaled.labels_, reference.labels_):
            np.testing.assert_array_equal(ours, theirs)
        # The means to 1e-4 of the clusters' unit spread: late in a run the balls are tiny and nearly
        # touching, so rounding decides a few overlaps of the collaborative rounds differently.
        np.testing.assert_allclose(scaled.means_, c * reference.means_, rtol=0, atol=1e-4 * c)


def test_identity_results_depend_on_the_datas_units():
    # The paper's unit covariance: at a tenth of their scale the same clusters overlap under the model.
    sites, k_local, truth = _six_clusters()
    own = fedica.FedGEM(covariance_type="identity", standardize=None, random_state=0).fit(sites, k_local)
    tenth = fedica.FedGEM(covariance_type="identity", standardize=None, random_state=0).fit([0.1 * X for X in sites],
                                                                                          k_local)
    assert own.n_clusters_ == 6 and adjusted_rand_score(truth, np.concatenate(own.labels_)) > 0.99
    assert tenth.n_clusters_ != 6 and adjusted_rand_score(truth, np.concatenate(tenth.labels_)) < 0.9


@pytest.mark.parametrize("covariance_type", COVARIANCE_TYPES)
def test_breast_cancer_with_three_single_class_sites_runs(covariance_type):
    # Five sites, three of which hold one class (K_g = 1): refused before (a client fitted at least 2).
    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    sets = [{0}, {1}, {1}, {0, 1}, {0, 1}]
    rng = np.random.default_rng(0)
    site = np.empty(y.size, dtype=int)
    for label in (0, 1):
        holders = [g for g, s in enumerate(sets) if label in s]
        site[y == label] = rng.choice(holders, size=int((y == label).sum()))
    sites, labels = [X[site == g] for g in range(5)], [y[site == g] for g in range(5)]
    model = fedica.FedGEM(covariance_type=covariance_type, random_state=0).fit(sites, [len(s) for s in sets])
    assert model.n_local_clusters_.tolist() == [1, 1, 1, 2, 2]
    assert all(len(m) == len(s) for m, s in zip(model.site_mapping_, sets))
    central = adjusted_rand_score(y, GaussianMixture(2, covariance_type="spherical", random_state=0).fit_predict(X))
    ari = adjusted_rand_score(np.concatenate(labels), np.concatenate(model.labels_))
    if covariance_type == "diag":
        # Correlated measurements that axis-aligned clusters fit badly: the diag family's BIC falls with more clusters,
        # centrally too (scikit-learn's diag GMM on these points: 37,877 at 2 clusters, 30,488 at 7, 29,019 at 10),
        # and the path from the finest partition scored (ALGORITHMS.md 2.14) reaches 7 at ARI .20 (central, 7: .22).
        assert model.n_clusters_ >= 2 and ari > 0.15
        return
    assert 2 <= model.n_clusters_ <= 3
    # Measured: K_hat 2-3, ARI .60-.81 against .55; full and auto 2 clusters at .77.
    assert ari > central
