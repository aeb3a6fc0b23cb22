"""The server's clusterings of RF-ICA columns (fedica.rfica.aggregation): ``clustering="matched"`` keeps each site's
columns in distinct clusters; estimates in channel space (p >= r) and of any scale are compared alike."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fedica
from fedica.data.ica_paper import make_mixing_matrix
from fedica.evaluation.ica import ica_error
from fedica.rfica.aggregation import CLUSTERINGS, _columns, rf_ica_aggregate
from fedica.rfica.geometric_median import geometric_median

FAST = settings(max_examples=30, deadline=None)


def _signed_permutation(rng, r):
    return np.eye(r)[:, rng.permutation(r)] * rng.choice([-1.0, 1.0], size=r)


def _close_columns_mixing(rng):
    """A 4 x 4 mixing whose columns 0 and 1 have cosine 0.9 (the issue's failure: k-means merges them)."""
    mixing = np.linalg.qr(rng.standard_normal((4, 4)))[0]
    mixing[:, 1] = 0.9 * mixing[:, 0] + np.sqrt(1 - 0.9**2) * mixing[:, 1]
    return mixing


def _five_noisy_sites_and_one_stray(seed):
    """Five sites' noisy signed-permuted copies of a mixing with two close columns, and one random estimate."""
    rng = np.random.default_rng(seed)
    mixing = _close_columns_mixing(rng)
    good = [mixing @ _signed_permutation(rng, 4) + 0.08 * rng.standard_normal((4, 4)) for _ in range(5)]
    return mixing, np.stack([*good, rng.standard_normal((4, 4))])


def _is_permutation_per_site(labels):
    return np.array_equal(np.sort(labels, axis=1), np.tile(np.arange(labels.shape[1]), (labels.shape[0], 1)))


def test_the_clusterings_are_kmeans_and_matched():
    assert CLUSTERINGS == ("kmeans", "matched")
    with pytest.raises(ValueError, match="clustering must be one of"):
        rf_ica_aggregate(np.tile(np.eye(2), (3, 1, 1)), np.ones(3), clustering="spectral")


def test_matched_repairs_kmeans_putting_two_columns_of_a_site_in_one_cluster():
    # Seed 28: aligned to site 0, k-means merges the two close true columns and gives the stray site's columns a cluster.
    mixing, estimates = _five_noisy_sites_and_one_stray(28)
    kmeans = rf_ica_aggregate(estimates, np.ones(6), benchmark=0, random_state=0)
    matched = rf_ica_aggregate(estimates, np.ones(6), benchmark=0, clustering="matched", random_state=0)
    assert not _is_permutation_per_site(kmeans.labels[:5])
    assert ica_error(kmeans.rf_ica, mixing) > 0.8
    assert _is_permutation_per_site(matched.labels)
    assert ica_error(matched.rf_ica, mixing) < 0.25
    assert matched.clustering == "matched" and matched.matched_iterations >= 2
    # The comparators are the paper's, whatever the clustering.
    np.testing.assert_array_equal(matched.f_ica, kmeans.f_ica)
    np.testing.assert_array_equal(matched.simple_median, kmeans.simple_median)


@FAST
@given(n_sites=st.integers(1, 12), r=st.integers(1, 6), noise=st.floats(0.0, 1.0), seed=st.integers(0, 2**32 - 1))
def test_matched_puts_every_sites_columns_in_distinct_clusters(n_sites, r, noise, seed):
    rng = np.random.default_rng(seed)
    mixing = make_mixing_matrix(r, orthogonal=False, random_state=rng)
    estimates = np.stack([mixing @ _signed_permutation(rng, r) for _ in range(n_sites)])
    estimates += noise * rng.standard_normal(estimates.shape)
    result = rf_ica_aggregate(estimates, rng.integers(10, 100, n_sites), clustering="matched", random_state=0)
    assert _is_permutation_per_site(result.labels)
    assert set(np.unique(result.signs)) <= {-1.0, 1.0}


def test_matched_ends_at_a_fixed_point_of_both_steps():
    """Each centre is the geometric median of its signed columns, and no site's assignment can be improved."""
    _, estimates = _five_noisy_sites_and_one_stray(28)
    result = rf_ica_aggregate(estimates, np.ones(6), clustering="matched", random_state=0)
    unit = estimates / np.linalg.norm(estimates, axis=1, keepdims=True)
    signed = _columns(unit * result.signs[:, None, :])
    for j in range(4):
        np.testing.assert_allclose(result.rf_ica[:, j], geometric_median(signed[result.labels.ravel() == j]), atol=1e-8)
    centres = result.rf_ica.T
    for k in range(6):
        # Cost of column i in cluster j: the distance from the nearer of +-a_i to centre j.
        cost = np.minimum(np.linalg.norm(unit[k].T[:, None] - centres[None], axis=2),
                          np.linalg.norm(unit[k].T[:, None] + centres[None], axis=2))
        chosen = cost[np.arange(4), result.labels[k]].sum()
        best = min(cost[np.arange(4), list(p)].sum() for p in itertools.permutations(range(4)))
        assert chosen <= best + 1e-9
        signed_k = unit[k] * result.signs[k]
        np.testing.assert_array_less(-1e-12, np.einsum("pi,pi->i", signed_k, result.rf_ica[:, result.labels[k]]))


@pytest.mark.parametrize("seed", [3, 17, 28, 32])
@pytest.mark.parametrize("site", [1, 5])
def test_matched_is_invariant_to_a_signed_permutation_of_a_sites_columns(seed, site):
    _, estimates = _five_noisy_sites_and_one_stray(seed)
    sizes = np.r_[100, np.full(5, 50)]  # site 0 is the benchmark
    result = rf_ica_aggregate(estimates, sizes, benchmark="largest", clustering="matched", random_state=0)
    rng = np.random.default_rng(seed + 1)
    order, flips = rng.permutation(4), rng.choice([-1.0, 1.0], size=4)
    moved = estimates.copy()
    moved[site] = estimates[site][:, order] * flips
    again = rf_ica_aggregate(moved, sizes, benchmark="largest", clustering="matched", random_state=0)
    np.testing.assert_allclose(again.rf_ica, result.rf_ica, atol=1e-7)
    np.testing.assert_array_equal(again.labels[site], result.labels[site][order])
    np.testing.assert_array_equal(again.signs[site], result.signs[site][order] * flips)


@pytest.mark.parametrize("seed", [3, 28])
def test_matched_is_invariant_to_a_signed_permutation_of_the_benchmarks_columns(seed):
    _, estimates = _five_noisy_sites_and_one_stray(seed)
    sizes = np.r_[100, np.full(5, 50)]
    result = rf_ica_aggregate(estimates, sizes, clustering="matched", random_state=0)
    moved = estimates.copy()
    moved[0] = estimates[0] @ _signed_permutation(np.random.default_rng(seed), 4)
    again = rf_ica_aggregate(moved, sizes, benchmark="largest", clustering="matched", random_state=0)
    # The output follows the benchmark's column order and sign: the same estimate up to that signed permutation.
    assert ica_error(again.rf_ica, result.rf_ica) < 1e-7


@FAST
@given(n_sites=st.integers(1, 15), r=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_matched_equals_kmeans_when_kmeans_already_gives_one_column_per_site_per_cluster(n_sites, r, seed):
    rng = np.random.default_rng(seed)
    mixing = make_mixing_matrix(r, orthogonal=True, random_state=rng)  # well separated columns
    estimates = np.stack([mixing @ _signed_permutation(rng, r) for _ in range(n_sites)])
    estimates += 0.02 * rng.standard_normal(estimates.shape)
    sizes = rng.integers(10, 100, n_sites)
    kmeans = rf_ica_aggregate(estimates, sizes, random_state=seed % 100)
    assert _is_permutation_per_site(kmeans.labels)
    matched = rf_ica_aggregate(estimates, sizes, clustering="matched", random_state=seed % 100)
    np.testing.assert_array_equal(matched.rf_ica, kmeans.rf_ica)
    np.testing.assert_array_equal(matched.labels, kmeans.labels)
    np.testing.assert_array_equal(matched.signs, kmeans.signs)
    assert matched.matched_iterations == 1 and kmeans.matched_iterations == 0


def test_matched_is_deterministic_for_a_seed():
    _, estimates = _five_noisy_sites_and_one_stray(29)
    first, second = (rf_ica_aggregate(estimates, np.ones(6), clustering="matched", random_state=4) for _ in range(2))
    for name in ("rf_ica", "labels", "signs"):
        np.testing.assert_array_equal(getattr(first, name), getattr(second, name))


# --------------------------------------------------------------------------- channel space, any scale


@pytest.mark.parametrize("clustering", CLUSTERINGS)
@pytest.mark.parametrize("p, r", [(8, 3), (16, 4), (5, 5)])
def test_estimates_in_channel_space_recover_the_mixing(clustering, p, r):
    rng = np.random.default_rng(p * r)
    mixing = rng.standard_normal((p, r))
    mixing /= np.linalg.norm(mixing, axis=0)
    estimates = np.stack([mixing @ _signed_permutation(rng, r) * rng.uniform(0.1, 10, r) for _ in range(7)])
    estimates += 0.01 * rng.standard_normal(estimates.shape)
    result = rf_ica_aggregate(estimates, np.ones(7), clustering=clustering, random_state=0)
    for estimate in (result.rf_ica, result.f_ica, result.simple_median, result.simple_mean):
        assert estimate.shape == (p, r)
    assert result.labels.shape == (7, r)
    assert ica_error(result.rf_ica, mixing) < 0.05


@pytest.mark.parametrize("clustering", CLUSTERINGS)
@pytest.mark.parametrize("scale", [1e200, 1e-170, 1e300, 1e-300])
def test_a_sites_scale_does_not_matter_even_near_the_limits_of_float64(clustering, scale):
    _, estimates = _five_noisy_sites_and_one_stray(3)
    reference = rf_ica_aggregate(estimates, np.ones(6), clustering=clustering, random_state=0)
    scaled = estimates.copy()
    scaled[2] *= scale
    scaled[4, :, 1] *= scale  # one column alone, too
    result = rf_ica_aggregate(scaled, np.ones(6), clustering=clustering, random_state=0)
    np.testing.assert_allclose(result.rf_ica, reference.rf_ica, atol=1e-10)
    np.testing.assert_array_equal(result.labels, reference.labels)


def test_an_ordinary_column_is_divided_by_its_norm_exactly_as_before():
    rng = np.random.default_rng(5)
    estimates = rng.standard_normal((6, 4, 4)) * rng.uniform(1e-3, 1e3, (6, 1, 4))
    result = rf_ica_aggregate(estimates, np.ones(6), random_state=0)
    unit = estimates / np.linalg.norm(estimates, axis=1, keepdims=True)
    aligned = unit * result.signs[:, None, :]
    np.testing.assert_array_equal(result.simple_mean, aligned.mean(axis=0))


def test_only_an_all_zero_column_is_a_zero_column():
    estimates = np.tile(np.eye(3), (3, 1, 1))
    estimates[1, :, 2] = [0.0, 5e-324, 0.0]  # the smallest subnormal: tiny, not zero
    rf_ica_aggregate(estimates, np.ones(3))
    estimates[1, :, 2] = 0.0
    with pytest.raises(ValueError, match="column 2 of client 1 is zero"):
        rf_ica_aggregate(estimates, np.ones(3))


# --------------------------------------------------------------------------- the estimator


def test_the_estimator_passes_clustering_and_reports_the_matched_labels():
    mixing, estimates = _five_noisy_sites_and_one_stray(28)
    # Equal counts: "largest" aligns to site 0, as in the k-means failure above.
    kmeans = fedica.RFICA(clustering="kmeans", benchmark="largest").aggregate(estimates)
    matched = fedica.RFICA(benchmark="largest").aggregate(estimates)  # the library's default clustering
    assert not _is_permutation_per_site(kmeans.labels_[:5])
    assert _is_permutation_per_site(matched.labels_)
    assert ica_error(matched.mixing_, mixing) < 0.25
    with pytest.raises(ValueError, match=r"^clustering='spectral': must be one of kmeans, matched$"):
        fedica.RFICA(clustering="spectral").aggregate(estimates)


def test_the_issues_noisy_site_failure_is_repaired_by_the_default():
    """One site of six with noise at 3 sd (benchmark (a) of fedica.scripts.bench_rfica_clustering, data seed 0)."""
    from fedica.scripts.bench_rfica_clustering import noisy_site_workload

    mixing, sites = noisy_site_workload(0)
    # The paper's one-shot protocol, solver and contrast, under which k-means failed (under Picard and logcosh it
    # happens not to here, and the refinement repairs it too).
    paper_local = {"local_solver": "fastica", "contrast": "cube", "refine_rounds": 0}
    kmeans = fedica.RFICA(clustering="kmeans", random_state=0, **paper_local).fit(sites)
    matched = fedica.RFICA(random_state=0).fit(sites)
    assert not _is_permutation_per_site(kmeans.labels_) and ica_error(kmeans.mixing_, mixing) > 1.0
    assert _is_permutation_per_site(matched.labels_) and ica_error(matched.mixing_, mixing) < 0.06
