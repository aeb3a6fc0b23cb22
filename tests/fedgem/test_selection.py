"""Properties of the likelihood criterion for K_hat (fedica.fedgem.selection)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp
from scipy.stats import multivariate_normal

import fedica
from fedica.fedgem.merging import FinalAggregation
from fedica.fedgem.selection import MAX_PATH_CANDIDATES, MAX_PATH_CENTRES, bic, log_likelihoods, merge_path, path_sizes, relabel


def _two_client_points(gap, rng, n=300):
    """Client 0 holds a cluster at the origin, client 1 one at (gap, 0); unit variance."""
    return [rng.standard_normal((n, 2)), rng.standard_normal((n, 2)) + [gap, 0.0]]


def _criterion(points, centres_per_candidate, k_hats):
    totals = sum(log_likelihoods(X, centres_per_candidate)[0] for X in points)
    return bic(totals, np.asarray(k_hats) * 2, sum(len(X) for X in points))  # K_hat d parameters, d = 2


def test_merging_two_separated_clusters_that_share_no_client_raises_the_criterion():
    rng = np.random.default_rng(0)
    points = _two_client_points(8.0, rng)
    apart = np.array([[0.0, 0.0], [8.0, 0.0]])
    merged = np.array([[4.0, 0.0]])
    score_apart, score_merged = _criterion(points, [apart, merged], [2, 1])
    assert score_merged > score_apart + 100


def test_merging_two_halves_of_one_cluster_lowers_the_criterion():
    rng = np.random.default_rng(1)
    points = _two_client_points(0.0, rng)
    split = np.array([[-0.05, 0.0], [0.05, 0.0]])
    merged = np.array([[0.0, 0.0]])
    score_split, score_merged = _criterion(points, [split, merged], [2, 1])
    assert score_merged < score_split


def test_log_likelihood_is_the_isotropic_mixture_with_the_clients_shares_and_variance():
    rng = np.random.default_rng(2)
    X = np.vstack([rng.standard_normal((200, 3)) * 1.5, rng.standard_normal((100, 3)) * 1.5 + 9])
    centres = np.array([[0.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    nearest = np.argmin(((X[:, None] - centres[None]) ** 2).sum(2), axis=1)
    variance = ((X - centres[nearest]) ** 2).sum() / X.size
    shares = np.bincount(nearest) / len(X)
    density = np.stack([multivariate_normal(c, variance * np.eye(3)).logpdf(X) for c in centres], axis=1)
    expected = logsumexp(density + np.log(shares), axis=1).sum()
    assert np.isclose(log_likelihoods(X, [centres])[0][0], expected, rtol=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 5), st.integers(2, 4))
def test_merge_path_never_joins_clusters_that_share_a_client(seed, n_clients, per_client):
    rng = np.random.default_rng(seed)
    owners = np.repeat(np.arange(n_clients), per_client)
    centers = rng.standard_normal((owners.size, 2)) * 5
    weights = rng.uniform(1, 10, owners.size)
    start = relabel(np.arange(owners.size), centers, weights)
    for step in merge_path(start, centers, owners, weights, min_clusters=per_client):
        for cluster in range(step.k_hat):
            members = owners[step.labels == cluster]
            assert members.size == np.unique(members).size
        mass = np.bincount(step.labels, weights=weights)
        centroids = np.stack([np.average(centers[step.labels == k], axis=0, weights=weights[step.labels == k])
                              for k in range(step.k_hat)])
        np.testing.assert_allclose(step.global_centroids, centroids, atol=1e-12)
        assert np.all(mass > 0)


def _recomputed_merge_path(start, centers, owners, weights, min_clusters):
    """The specification: every step recomputes all clusters' costs and shared clients."""
    labels, clients, path = start.labels.copy(), np.unique(owners), []
    while np.unique(labels).size > min_clusters:
        ids = np.unique(labels)
        index = np.searchsorted(ids, labels)
        membership = np.zeros((ids.size, clients.size), dtype=bool)
        membership[index, np.searchsorted(clients, owners)] = True
        mass = np.bincount(index, weights=weights, minlength=ids.size)
        sums = np.zeros((ids.size, centers.shape[1]))
        np.add.at(sums, index, centers * weights[:, None])
        centroids = sums / mass[:, None]
        cost = mass[:, None] * mass / (mass[:, None] + mass) * ((centroids[:, None] - centroids) ** 2).sum(axis=2)
        cost[(membership.astype(int) @ membership.T.astype(int)) > 0] = np.inf
        a, b = np.unravel_index(np.argmin(cost), cost.shape)
        if not np.isfinite(cost[a, b]):
            break
        labels[labels == ids[b]] = ids[a]
        path.append(relabel(labels, centers, weights))
    return path


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 7), st.integers(2, 4), st.booleans())
def test_the_updated_merge_path_makes_the_merges_of_the_recomputed_one(seed, n_clients, per_client, integer):
    rng = np.random.default_rng(seed)
    owners = np.repeat(np.arange(n_clients), per_client)
    centers = rng.standard_normal((owners.size, 2)) * 5
    centers = np.round(centers) if integer else centers  # ties
    weights = np.ones(owners.size) if integer else rng.uniform(1, 10, owners.size)
    start = relabel(np.arange(owners.size), centers, weights)
    expected = _recomputed_merge_path(start, centers, owners, weights, per_client)
    path = merge_path(start, centers, owners, weights, min_clusters=per_client)
    assert [p.labels.tolist() for p in path] == [p.labels.tolist() for p in expected]
    sizes = {p.k_hat for p in expected[::2]}
    assert [p.k_hat for p in merge_path(start, centers, owners, weights, min_clusters=per_client, sizes=sizes)] == \
        [p.k_hat for p in expected if p.k_hat in sizes]
    ends = []
    chosen = merge_path(start, centers, owners, weights, min_clusters=per_client, sizes=lambda end: ends.append(end) or {end})
    assert ends == [expected[-1].k_hat if expected else owners.size]
    assert [p.labels.tolist() for p in chosen] == [p.labels.tolist() for p in expected[-1:]]


def test_a_long_merge_path_is_sampled_at_geometric_cluster_counts_dense_at_the_small_ones():
    assert path_sizes(20, 5) == set(range(5, 20))
    sizes = sorted(path_sizes(1450, 30, max_centres=10**9))
    assert len(sizes) <= MAX_PATH_CANDIDATES and sizes[0] == 30 and sizes[-1] == 1449
    bounded = sorted(path_sizes(1450, 30))
    assert bounded == sizes[: len(bounded)] and sum(bounded) <= MAX_PATH_CENTRES < sum(sizes[: len(bounded) + 1])
    assert sizes[: MAX_PATH_CANDIDATES // 2] == list(range(30, 30 + MAX_PATH_CANDIDATES // 2))
    gaps = np.diff(sizes)
    assert np.all(gaps[1:] >= gaps[:-1] - 1)  # spacing grows with the count (rounding aside)


def test_relabel_numbers_clusters_by_first_appearance():
    centers = np.array([[0.0], [1.0], [10.0], [11.0]])
    agg = relabel(np.array([7, 3, 7, 3]), centers, np.array([1.0, 1.0, 3.0, 1.0]))
    assert isinstance(agg, FinalAggregation) and agg.k_hat == 2
    assert agg.labels.tolist() == [0, 1, 0, 1]
    np.testing.assert_allclose(agg.global_centroids, [[7.5], [6.0]])


def test_fedgem_finds_k_when_each_cluster_lives_on_its_own_clients():
    # Ten well-separated clusters, each client holding two neighbours in a ring of clusters.
    rng = np.random.default_rng(3)
    centres = rng.uniform(-30, 30, (10, 4))
    sites = []
    for k in range(10):
        for _ in range(2):
            other = (k + 1) % 10
            sites.append(np.vstack([centres[k] + rng.standard_normal((150, 4)), centres[other] + rng.standard_normal((150, 4))]))
    model = fedica.FedGEM(random_state=0).fit(sites, 2)
    assert model.n_clusters_ == 10


def test_entropy_counts_how_ambiguously_a_model_assigns_the_points():
    rng = np.random.default_rng(4)
    X = np.vstack([rng.standard_normal((200, 2)), rng.standard_normal((200, 2)) + [30.0, 0.0]])
    _, (separated, duplicated) = log_likelihoods(X, [np.array([[0.0, 0.0], [30.0, 0.0]]),
                                                      np.array([[15.0, 1.0], [15.0, -1.0]])])
    assert separated < 1e-6
    # Two centres between the clusters split every point nearly evenly: close to log 2 nats a point.
    assert 0.9 * X.shape[0] * np.log(2) < duplicated <= X.shape[0] * np.log(2)


def test_candidates_scored_together_equal_each_scored_alone():
    rng = np.random.default_rng(8)
    X = rng.normal(size=(200, 3))
    candidates = [rng.normal(size=(k, 3)) for k in (1, 4, 2, 9)]
    together = log_likelihoods(X, candidates)
    alone = np.array([[part[0] for part in log_likelihoods(X, [c])] for c in candidates]).T
    np.testing.assert_allclose(together, alone, rtol=1e-12)
