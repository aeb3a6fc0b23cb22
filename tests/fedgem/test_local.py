"""Properties of the client-side FedGEM mathematics (fedica.fedgem.local)."""

import warnings

import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import multivariate_normal

from fedica.fedgem.local import (
    _kmeanspp_seedings,
    assign_labels,
    em_step,
    final_radius,
    kmeanspp_init,
    local_objective,
    local_round,
    min_centroid_distance,
    responsibilities,
    uncertainty_radius,
)


def _mixture(rng, n=120, d=3, k=3, spread=4.0):
    centres = rng.normal(scale=spread, size=(k, d))
    labels = rng.integers(k, size=n)
    return centres[labels] + rng.normal(size=(n, d))


def _log_density(X, mean):
    """log N(x_n | mean, I) for every row, straight from scipy (independent of fedica)."""
    return multivariate_normal(mean=mean, cov=np.eye(X.shape[1])).logpdf(X).reshape(-1)


def _independent_responsibilities(X, centroids, weights):
    log_joint = np.column_stack(
        [np.log(w) + _log_density(X, c) for c, w in zip(centroids, weights)]
    )
    return np.exp(log_joint - logsumexp(log_joint, axis=1, keepdims=True))


def _component_q(X, gamma_k, weight_k, mean):
    """Component k's expected complete-data log-likelihood at ``mean`` (paper eq. 3)."""
    return float(np.sum(gamma_k * (np.log(weight_k) + _log_density(X, mean))))


def _component_q_many(X, gamma_k, weight_k, means):
    """``_component_q`` for many means (rows) at once, from the Gaussian log density."""
    d = X.shape[1]
    squared = ((means[:, None, :] - X[None, :, :]) ** 2).sum(axis=2)
    log_density = -0.5 * d * np.log(2 * np.pi) - 0.5 * squared
    return (gamma_k[None, :] * (np.log(weight_k) + log_density)).sum(axis=1)


def _unit_directions(rng, n, d):
    u = rng.normal(size=(n, d))
    u = np.vstack([u, np.eye(d), -np.eye(d)])
    return u / np.linalg.norm(u, axis=1, keepdims=True)


def _log_likelihood(X, centroids, weights):
    log_joint = np.column_stack(
        [np.log(w) + _log_density(X, c) for c, w in zip(centroids, weights)]
    )
    return float(logsumexp(log_joint, axis=1).sum())


# ------------------------------------------------------------------ radius


@pytest.mark.parametrize("seed", range(6))
def test_radius_equals_independent_numerical_solution_of_eq3(seed):
    rng = np.random.default_rng(seed)
    d = int(rng.integers(1, 5))
    k = int(rng.integers(2, 4))
    X = _mixture(rng, n=80, d=d, k=k)
    theta = X.mean(axis=0) + rng.normal(scale=2.0, size=(k, d))
    weights = rng.dirichlet(np.ones(k))

    gamma = _independent_responsibilities(X, theta, weights)
    np.testing.assert_allclose(responsibilities(X, theta, weights), gamma, atol=1e-12)
    maximisers = em_step(X, theta, weights)
    eps = uncertainty_radius(maximisers, theta)

    directions = _unit_directions(rng, 400, d)
    # Bracket generously: far beyond any distance in the data.
    upper_bound = 100.0 * (np.ptp(X, axis=0) ** 2).sum() + 100.0 * (theta**2).sum()
    for j in range(k):
        q_at_theta = _component_q(X, gamma[:, j], weights[j], theta[j])
        probe = maximisers[j] + directions[:3]
        np.testing.assert_allclose(
            _component_q_many(X, gamma[:, j], weights[j], probe),
            [_component_q(X, gamma[:, j], weights[j], m) for m in probe],
            rtol=1e-12,
        )

        def feasible(candidate_eps, j=j, q_at_theta=q_at_theta):
            sphere = maximisers[j] + np.sqrt(candidate_eps) * directions
            return _component_q_many(X, gamma[:, j], weights[j], sphere).min() >= q_at_theta

        low, high = 0.0, upper_bound
        assert feasible(low) and not feasible(high)
        for _ in range(80):
            middle = 0.5 * (low + high)
            low, high = (middle, high) if feasible(middle) else (low, middle)
        np.testing.assert_allclose(eps[j], low, rtol=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_points_inside_the_ball_are_gem_steps_and_just_outside_are_not(seed):
    rng = np.random.default_rng(100 + seed)
    d, k = 3, 3
    X = _mixture(rng, n=150, d=d, k=k)
    theta = X[rng.choice(X.shape[0], size=k, replace=False)] + rng.normal(size=(k, d))
    weights = np.full(k, 1.0 / k)
    maximisers, eps = local_round(X, theta, weights)
    radius = np.sqrt(eps)
    gamma = _independent_responsibilities(X, theta, weights)

    def full_q(means):
        return sum(_component_q(X, gamma[:, j], weights[j], means[j]) for j in range(k))

    q_at_theta = full_q(theta)
    for _ in range(200):
        u = _unit_directions(rng, k, d)[:k]
        inside = maximisers + (radius * rng.uniform(0, 1, size=k) ** (1 / d))[:, None] * u
        assert full_q(inside) >= q_at_theta - 1e-9 * abs(q_at_theta)
    # Boundary (any direction: the component's Q is isotropic around M) and just beyond.
    for j in range(k):
        q_j = _component_q(X, gamma[:, j], weights[j], theta[j])
        u = _unit_directions(rng, 50, d)
        on_sphere = [
            _component_q(X, gamma[:, j], weights[j], maximisers[j] + radius[j] * v) for v in u
        ]
        np.testing.assert_allclose(on_sphere, q_j, rtol=1e-9)
        worst = min(
            _component_q(X, gamma[:, j], weights[j], maximisers[j] + 1.001 * radius[j] * v)
            for v in u
        )
        assert worst < q_j


def test_local_round_radius_is_relative_to_the_last_step():
    rng = np.random.default_rng(7)
    X = _mixture(rng, d=2, k=3)
    theta = X[:3].copy()
    weights = np.array([0.2, 0.3, 0.5])
    step1 = em_step(X, theta, weights)
    step2 = em_step(X, step1, weights)
    step3 = em_step(X, step2, weights)
    maximisers, eps = local_round(X, theta, weights, n_steps=3)
    np.testing.assert_allclose(maximisers, step3)
    np.testing.assert_allclose(eps, np.sum((step3 - step2) ** 2, axis=1))
    with pytest.raises(ValueError, match="n_steps"):
        local_round(X, theta, weights, n_steps=0)


# ------------------------------------------------------------------ EM


@pytest.mark.parametrize("seed", range(5))
def test_em_step_never_decreases_the_log_likelihood(seed):
    rng = np.random.default_rng(200 + seed)
    d = int(rng.integers(1, 6))
    k = int(rng.integers(2, 5))
    X = _mixture(rng, n=200, d=d, k=k, spread=3.0)
    weights = rng.dirichlet(np.ones(k) * 2)
    centroids = rng.normal(scale=3.0, size=(k, d))
    previous = _log_likelihood(X, centroids, weights)
    for _ in range(15):
        centroids = em_step(X, centroids, weights)
        current = _log_likelihood(X, centroids, weights)
        assert current >= previous - 1e-9 * abs(previous)
        previous = current


def test_em_step_is_the_responsibility_weighted_mean():
    rng = np.random.default_rng(3)
    X = _mixture(rng, d=2, k=2)
    theta = rng.normal(size=(2, 2))
    weights = np.array([0.4, 0.6])
    gamma = _independent_responsibilities(X, theta, weights)
    expected = np.array([np.average(X, axis=0, weights=gamma[:, j]) for j in range(2)])
    np.testing.assert_allclose(em_step(X, theta, weights), expected, rtol=1e-10)


def test_responsibilities_are_stable_for_far_points():
    centroids = np.array([[0.0, 0.0], [1.0, 0.0]])
    weights = np.array([0.5, 0.5])
    X = np.array([[1e3, 0.0], [-1e3, 0.0], [0.5, 1e3], [1e4, 1e4]])
    gamma = responsibilities(X, centroids, weights)
    assert np.all(np.isfinite(gamma))
    np.testing.assert_allclose(gamma.sum(axis=1), 1.0)
    np.testing.assert_allclose(gamma[0], [0.0, 1.0])
    np.testing.assert_allclose(gamma[1], [1.0, 0.0])
    np.testing.assert_allclose(gamma[2], [0.5, 0.5])  # equidistant from both


def test_component_without_responsibility_keeps_its_centroid():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 2))
    centroids = np.array([[0.0, 0.0], [1e4, 1e4]])
    maximisers, eps = local_round(X, centroids, np.array([0.5, 0.5]))
    np.testing.assert_array_equal(maximisers[1], centroids[1])
    assert eps[1] == 0.0
    np.testing.assert_allclose(maximisers[0], X.mean(axis=0))


# ------------------------------------------------------------------ init & labels


def test_kmeanspp_init_returns_the_best_of_its_seedings():
    rng = np.random.default_rng(11)
    X = _mixture(rng, n=300, d=2, k=4, spread=2.0)
    seedings, objectives = _kmeanspp_seedings(X, 4, 6, np.random.default_rng(5))
    assert seedings.shape == (6, 4, 2)
    np.testing.assert_allclose(objectives, [local_objective(X, s) for s in seedings])
    assert len({tuple(s.ravel()) for s in seedings}) > 1  # the seedings differ
    seeds = kmeanspp_init(X, 4, n_init=6, random_state=np.random.default_rng(5))
    np.testing.assert_array_equal(seeds, seedings[np.argmin(objectives)])
    # Seeds are distinct data points.
    assert all(np.any(np.all(X == row, axis=1)) for row in seeds)
    assert len({tuple(row) for row in seeds}) == 4
    np.testing.assert_array_equal(
        kmeanspp_init(X, 4, random_state=9), kmeanspp_init(X, 4, random_state=9)
    )


def test_kmeanspp_seeding_matches_scikit_learns_in_distribution():
    """Same algorithm as sklearn's greedy k-means++: same objective on average, one seed
    per cluster on well-separated clusters."""
    from sklearn.cluster import kmeans_plusplus

    rng = np.random.default_rng(2)
    k, d = 8, 10
    truth = rng.normal(scale=6.0, size=(k, d))
    labels = np.repeat(np.arange(k), 60)
    X = truth[labels] + rng.normal(size=(labels.size, d))
    ours = [kmeanspp_init(X, k, n_init=1, random_state=s) for s in range(200)]
    theirs = [kmeans_plusplus(X, k, random_state=s)[0] for s in range(200)]
    mean_ours = np.mean([local_objective(X, s) for s in ours])
    mean_theirs = np.mean([local_objective(X, s) for s in theirs])
    assert abs(mean_ours - mean_theirs) < 0.05 * mean_theirs

    def clusters_hit(seeds):
        return len(set(assign_labels(seeds, truth).tolist()))

    assert np.mean([clusters_hit(s) == k for s in ours]) >= np.mean([clusters_hit(s) == k for s in theirs]) - 0.05


def test_kmeanspp_init_rejects_bad_sizes():
    X = np.zeros((3, 2))
    with pytest.raises(ValueError, match="n_components"):
        kmeanspp_init(X, 4)
    with pytest.raises(ValueError, match="n_components"):
        kmeanspp_init(X, 0)


def test_assign_labels_and_local_objective_match_brute_force():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(40, 3))
    centroids = rng.normal(size=(5, 3))
    squared = ((X[:, None, :] - centroids[None]) ** 2).sum(axis=2)
    np.testing.assert_array_equal(assign_labels(X, centroids), squared.argmin(axis=1))
    np.testing.assert_allclose(local_objective(X, centroids), squared.min(axis=1).sum())


# ------------------------------------------------------------------ final radius


def test_final_radius_formula():
    maximisers = np.array([[0.0, 0.0], [3.0, 4.0], [10.0, 0.0]])  # Rmin = 5
    weights = np.array([0.5, 0.25, 0.25])
    assert min_centroid_distance(maximisers) == 5.0
    eps_final = final_radius(maximisers, weights, n_points=400, upsilon=2.0)
    np.testing.assert_allclose(eps_final, 2.0 * 5.0 / (weights * 20.0))
    np.testing.assert_array_equal(final_radius(maximisers, weights, 400, 0.0), 0.0)


def test_final_radius_and_min_distance_reject_bad_input():
    maximisers = np.array([[0.0, 0.0], [1.0, 0.0]])
    with pytest.raises(ValueError, match="at least 2"):
        min_centroid_distance(maximisers[:1])
    with pytest.raises(ValueError, match="weights"):
        final_radius(maximisers, np.array([0.5, 0.0]), 10, 1.0)
    with pytest.raises(ValueError, match="upsilon"):
        final_radius(maximisers, np.array([0.5, 0.5]), 10, -1.0)
    with pytest.raises(ValueError, match="n_points"):
        final_radius(maximisers, np.array([0.5, 0.5]), 0, 1.0)


def test_shape_errors_name_the_argument():
    X = np.zeros((5, 2))
    with pytest.raises(ValueError, match="centroids"):
        responsibilities(X, np.zeros((2, 3)), np.ones(2))
    with pytest.raises(ValueError, match="weights"):
        responsibilities(X, np.zeros((2, 2)), np.ones(3))
    with pytest.raises(ValueError, match="maximisers"):
        uncertainty_radius(np.zeros((2, 2)), np.zeros((3, 2)))


def test_a_zero_weight_component_takes_no_responsibility():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(30, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gamma = responsibilities(X, np.array([[0.0, 0.0], [3.0, 0.0]]), np.array([0.0, 1.0]))
    np.testing.assert_array_equal(gamma[:, 0], 0.0)
    np.testing.assert_allclose(gamma[:, 1], 1.0)


def test_the_kmeans_start_refines_the_same_seedings_and_misses_fewer_clusters():
    from fedica.fedgem.local import kmeans_init, local_objective

    rng = np.random.default_rng(0)
    centres = rng.uniform(-6, 6, (12, 4))  # close enough for seedings to miss some (7 misses in 20 seeds)
    X = np.vstack([c + rng.standard_normal((15, 4)) for c in centres])
    missed = {"seeds": 0, "kmeans": 0}
    for seed in range(20):
        seeds = kmeanspp_init(X, 12, n_init=3, random_state=seed)
        refined = kmeans_init(X, 12, n_init=3, random_state=seed)
        assert local_objective(X, refined) <= local_objective(X, seeds) + 1e-9
        for name, start in (("seeds", seeds), ("kmeans", refined)):
            nearest = np.argmin(((centres[:, None] - start[None]) ** 2).sum(axis=2), axis=1)
            missed[name] += 12 - np.unique(nearest).size  # true clusters sharing their nearest start
    assert missed["kmeans"] < missed["seeds"]


def test_a_private_run_refuses_the_kmeans_start():
    import fedica

    rng = np.random.default_rng(0)
    sites = [rng.standard_normal((40, 2)) for _ in range(3)]
    with pytest.raises(ValueError, match="local_start='kmeans': a private run starts from its private initialisation"):
        fedica.FedGEM(covariance_type="identity", dp_epsilon=1.0, dp_clip=3.0, local_start="kmeans").fit(sites, n_local_clusters=2)
