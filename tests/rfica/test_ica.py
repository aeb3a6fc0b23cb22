"""Properties of RF-ICA: the paper's simulation (fedica.data.ica_paper), client FastICA (fedica.rfica.local), server aggregation (fedica.rfica.aggregation), the error (fedica.evaluation.ica)."""

import itertools
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedica.data.ica_paper import (
    client_sample_size,
    corrupted_mask,
    ica_client_data,
    ica_true_mixing,
    make_mixing_matrix,
)
from fedica.evaluation.ica import ica_error
from fedica.rfica.aggregation import (
    RfIcaAggregate,
    align_signs,
    choose_benchmark,
    rf_ica_aggregate,
)
from fedica.rfica.local import local_fastica, normalize_columns

FAST = settings(max_examples=40, deadline=None)

seeds = st.integers(0, 2**32 - 1)

SCENARIO = dict(
    n_clients=12, r=4, corrupt_ratio=0.25, n_normal=400, n_corrupt=50, sparsity=0.1, orthogonal=True, seed=5
)


def _signed_permutation(rng, r):
    return np.eye(r)[:, rng.permutation(r)] * rng.choice([-1.0, 1.0], size=r)


def _signed_copies(rng, mixing, n_clients, noise=0.0):
    """(K, r, r) copies of ``mixing``, each under its own random signed permutation, plus noise."""
    r = mixing.shape[0]
    copies = np.stack([mixing @ _signed_permutation(rng, r) for _ in range(n_clients)])
    return copies + noise * rng.standard_normal(copies.shape)


def _unit_columns(stack):
    return stack / np.linalg.norm(stack, axis=1, keepdims=True)


def _sparse_sources(rng, r, n, sparsity=0.1):
    return (rng.random((r, n)) < sparsity) * rng.standard_normal((r, n))


# --------------------------------------------------------------------------- helpers


@FAST
@given(rows=st.integers(1, 6), cols=st.integers(1, 6), seed=seeds)
def test_normalize_columns_gives_unit_columns_with_the_same_directions(rows, cols, seed):
    rng = np.random.default_rng(seed)
    matrix = rng.standard_normal((rows, cols)) * rng.uniform(1e-3, 1e3, cols)
    unit = normalize_columns(matrix)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=0), 1.0)
    np.testing.assert_allclose(unit * np.linalg.norm(matrix, axis=0), matrix)


@pytest.mark.parametrize(
    ("matrix", "message"),
    [
        (np.array([[1.0, 0.0], [2.0, 0.0]]), r"non-zero columns: column\(s\) \[1\]"),
        (np.array([[1.0, np.nan], [2.0, 1.0]]), r"finite: column\(s\) \[1\]"),
        (np.array([[np.inf, 1.0], [2.0, 1.0]]), r"finite: column\(s\) \[0\]"),
        (np.ones(3), "2-D"),
    ],
)
def test_normalize_columns_rejects_zero_and_non_finite_columns(matrix, message):
    with pytest.raises(ValueError, match=message):
        normalize_columns(matrix)


@FAST
@given(r=st.integers(1, 8), seed=st.integers(0, 2**31))
def test_orthogonal_mixing_matrix_is_the_polar_factor_of_a_gaussian_matrix(r, seed):
    mixing = make_mixing_matrix(r, orthogonal=True, random_state=seed)
    gaussian = np.random.default_rng(seed).standard_normal((r, r))
    np.testing.assert_allclose(mixing.T @ mixing, np.eye(r), atol=1e-12)
    # G = A H with H symmetric positive definite.
    stretch = mixing.T @ gaussian
    np.testing.assert_allclose(stretch, stretch.T, atol=1e-10)
    assert np.linalg.eigvalsh((stretch + stretch.T) / 2).min() > 0


@FAST
@given(r=st.integers(1, 8), seed=st.integers(0, 2**31))
def test_non_orthogonal_mixing_matrix_is_a_gaussian_matrix_with_unit_columns(r, seed):
    mixing = make_mixing_matrix(r, orthogonal=False, random_state=seed)
    gaussian = np.random.default_rng(seed).standard_normal((r, r))
    np.testing.assert_allclose(mixing, gaussian / np.linalg.norm(gaussian, axis=0))


# --------------------------------------------------------------------------- simulation


@FAST
@given(n_clients=st.integers(1, 200), corrupt_ratio=st.floats(0.0, 1.0), seed=st.integers(0, 2**31))
def test_corrupted_mask_has_exactly_the_rounded_count_and_is_seeded(n_clients, corrupt_ratio, seed):
    mask = corrupted_mask(n_clients, corrupt_ratio, random_state=seed)
    assert mask.shape == (n_clients,) and mask.dtype == bool
    assert mask.sum() == round(corrupt_ratio * n_clients)
    np.testing.assert_array_equal(mask, corrupted_mask(n_clients, corrupt_ratio, random_state=seed))


def test_corrupted_mask_choice_depends_on_the_seed():
    masks = {corrupted_mask(30, 0.1, random_state=seed).tobytes() for seed in range(10)}
    assert len(masks) > 5


@pytest.mark.parametrize(
    ("n_clients", "corrupt_ratio", "message"),
    [
        (0, 0.1, "n_clients"),
        (10, -0.1, "corrupt_ratio"),
        (10, 1.5, "corrupt_ratio"),
        (10, float("nan"), "corrupt_ratio"),
    ],
)
def test_corrupted_mask_rejects_bad_arguments(n_clients, corrupt_ratio, message):
    with pytest.raises(ValueError, match=message):
        corrupted_mask(n_clients, corrupt_ratio)


def test_true_mixing_depends_only_on_the_seed():
    first = ica_true_mixing(r=5, orthogonal=True, seed=3)
    np.testing.assert_array_equal(first, ica_true_mixing(r=5, orthogonal=True, seed=3))
    assert not np.allclose(first, ica_true_mixing(r=5, orthogonal=True, seed=4))
    np.testing.assert_allclose(first.T @ first, np.eye(5), atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(ica_true_mixing(r=5, orthogonal=False, seed=3), axis=0), 1.0)


def test_true_mixing_is_not_the_shared_fastica_start_of_the_same_seed():
    # The shared start is make_mixing_matrix(r, random_state=shared_init_seed).
    assert ica_error(ica_true_mixing(r=5, orthogonal=True, seed=0), make_mixing_matrix(5, random_state=0)) > 0.5


def test_client_data_follows_the_model():
    mixing = ica_true_mixing(r=SCENARIO["r"], orthogonal=True, seed=SCENARIO["seed"])
    mask = np.array([client_sample_size(k, **_sizes(SCENARIO)) == SCENARIO["n_corrupt"] for k in range(12)])
    assert mask.sum() == round(0.25 * 12)
    nonzero_share = []
    for k in range(SCENARIO["n_clients"]):
        data = ica_client_data(k, **SCENARIO)
        expected_n = SCENARIO["n_corrupt"] if mask[k] else SCENARIO["n_normal"]
        assert data.shape == (SCENARIO["r"], expected_n)
        assert client_sample_size(k, **_sizes(SCENARIO)) == expected_n
        sources = mixing.T @ data  # A* is orthogonal: the sources are recovered exactly
        assert np.mean(np.abs(sources) > 1e-12) <= 0.3
        nonzero_share.append(np.mean(np.abs(sources) > 1e-12))
    assert np.mean(nonzero_share) == pytest.approx(SCENARIO["sparsity"], abs=0.03)


def _sizes(scenario):
    return {key: scenario[key] for key in ("n_clients", "corrupt_ratio", "n_normal", "n_corrupt", "seed")}


def test_client_data_is_deterministic_and_clients_differ():
    first = ica_client_data(2, **SCENARIO)
    np.testing.assert_array_equal(first, ica_client_data(2, **SCENARIO))
    assert not np.array_equal(first, ica_client_data(3, **SCENARIO)[:, : first.shape[1]])
    other_seed = dict(SCENARIO, seed=SCENARIO["seed"] + 1)
    assert not np.array_equal(first[:, :10], ica_client_data(2, **other_seed)[:, :10])


def test_a_client_draws_only_its_own_stream():
    # Without corruption the other clients' number and sizes cannot change client 1's data.
    base = dict(SCENARIO, corrupt_ratio=0.0)
    np.testing.assert_array_equal(
        ica_client_data(1, **base), ica_client_data(1, **dict(base, n_clients=50, n_corrupt=7))
    )


@pytest.mark.parametrize("partition_id", [-1, 12, 1.5, True, "0"])
def test_client_data_rejects_a_bad_partition_id(partition_id):
    with pytest.raises(ValueError, match="partition_id"):
        ica_client_data(partition_id, **SCENARIO)
    with pytest.raises(ValueError, match="partition_id"):
        client_sample_size(partition_id, **_sizes(SCENARIO))


@pytest.mark.parametrize(
    ("override", "message"),
    [({"sparsity": 0.0}, "sparsity"), ({"sparsity": 1.5}, "sparsity"), ({"r": 0}, "r must"), ({"seed": -1}, "seed")],
)
def test_client_data_rejects_bad_scenarios(override, message):
    with pytest.raises(ValueError, match=message):
        ica_client_data(0, **dict(SCENARIO, **override))


# --------------------------------------------------------------------------- client FastICA


@pytest.fixture(scope="module")
def five_thousand_samples():
    rng = np.random.default_rng(11)
    mixing = make_mixing_matrix(5, random_state=rng)
    return mixing, mixing @ _sparse_sources(rng, 5, 5000)


@pytest.mark.parametrize("contrast", ["cube", "logcosh"])
@pytest.mark.parametrize("init", ["random", "shared"])
def test_local_fastica_recovers_the_mixing_matrix(five_thousand_samples, contrast, init):
    mixing, data = five_thousand_samples
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        estimate = local_fastica(data, contrast=contrast, init=init, random_state=1)
    assert estimate.shape == (5, 5)
    np.testing.assert_allclose(np.linalg.norm(estimate, axis=0), 1.0)
    assert ica_error(estimate, mixing) < 0.1


def test_local_fastica_random_init_recovers_a_non_orthogonal_mixing_matrix():
    rng = np.random.default_rng(12)
    mixing = make_mixing_matrix(4, orthogonal=False, random_state=rng)
    assert ica_error(local_fastica(mixing @ _sparse_sources(rng, 4, 5000), random_state=0), mixing) < 0.1


def test_shared_init_puts_every_client_in_the_same_column_order():
    # The point of appendix D: no permutation is needed between clients' estimates.
    rng = np.random.default_rng(13)
    mixing = make_mixing_matrix(4, random_state=rng)
    estimates = [
        local_fastica(mixing @ _sparse_sources(rng, 4, 3000), init="shared", shared_init_seed=9, random_state=k)
        for k in range(3)
    ]
    for first, second in itertools.combinations(estimates, 2):
        assert np.linalg.norm(first - second) < 0.2


def test_local_fastica_is_deterministic_given_its_seed(five_thousand_samples):
    _, data = five_thousand_samples
    np.testing.assert_array_equal(local_fastica(data, random_state=4), local_fastica(data, random_state=4))


def test_local_fastica_is_quiet_and_finite_when_it_cannot_converge_or_data_are_degenerate():
    rng = np.random.default_rng(14)
    mixing = make_mixing_matrix(4, random_state=rng)
    sources = _sparse_sources(rng, 4, 40)
    sources[1] = 0.0  # a small client whose sparse source never fired: singular covariance
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for init in ("random", "shared"):
            for data in (mixing @ sources, rng.standard_normal((4, 30))):
                estimate = local_fastica(data, init=init, max_iter=2, random_state=0)
                assert np.all(np.isfinite(estimate))
                np.testing.assert_allclose(np.linalg.norm(estimate, axis=0), 1.0)


@pytest.mark.parametrize(
    ("data", "kwargs", "message"),
    [
        (np.ones(10), {}, r"shape \(r, n_samples\)"),
        (np.full((3, 10), np.nan), {}, "finite"),
        (np.random.default_rng(0).standard_normal((3, 3)), {}, "more samples"),
        (np.ones((3, 10)), {}, "constant"),
        (np.random.default_rng(0).standard_normal((3, 10)), {"contrast": "exp2"}, "contrast"),
        (np.random.default_rng(0).standard_normal((3, 10)), {"init": "pca"}, "init"),
    ],
)
def test_local_fastica_rejects_bad_input(data, kwargs, message):
    with pytest.raises(ValueError, match=message):
        local_fastica(data, **kwargs)


# --------------------------------------------------------------------------- sign alignment


@FAST
@given(n_clients=st.integers(1, 12), r=st.integers(1, 7), benchmark=st.integers(0, 11), seed=seeds)
def test_align_signs_undoes_random_sign_flips_exactly(n_clients, r, benchmark, seed):
    benchmark %= n_clients
    rng = np.random.default_rng(seed)
    mixing = rng.standard_normal((r, r)) * rng.uniform(0.5, 2.0, r)  # unnormalised columns on purpose
    flips = rng.choice([-1.0, 1.0], size=(n_clients, 1, r))
    aligned = align_signs(mixing * flips, benchmark)
    np.testing.assert_array_equal(aligned, np.broadcast_to(mixing * flips[benchmark], aligned.shape))


@FAST
@given(n_clients=st.integers(1, 12), r=st.integers(1, 7), benchmark=st.integers(0, 11), seed=seeds)
def test_align_signs_undoes_flips_under_column_permutations(n_clients, r, benchmark, seed):
    benchmark %= n_clients
    rng = np.random.default_rng(seed)
    mixing = make_mixing_matrix(r, orthogonal=bool(rng.integers(2)), random_state=rng)
    permutations = np.stack([rng.permutation(r) for _ in range(n_clients)])
    flips = rng.choice([-1.0, 1.0], size=(n_clients, r))
    reference_signs = rng.choice([-1.0, 1.0], size=r)  # the benchmark's own signs, per true column
    estimates = mixing[:, permutations].transpose(1, 0, 2) * flips[:, None, :]
    estimates[benchmark] = mixing[:, permutations[benchmark]] * reference_signs[permutations[benchmark]]
    aligned = align_signs(estimates, benchmark)
    # Every client's column for true column a now carries the benchmark's sign for a.
    expected = mixing[:, permutations].transpose(1, 0, 2) * reference_signs[permutations][:, None, :]
    np.testing.assert_array_equal(aligned, expected)
    np.testing.assert_array_equal(aligned[benchmark], estimates[benchmark])


def test_align_signs_rejects_bad_input():
    with pytest.raises(ValueError, match=r"shape \(K, p, r\) with p >= r"):
        align_signs(np.ones((2, 3, 4)), 0)
    with pytest.raises(ValueError, match="benchmark"):
        align_signs(np.ones((2, 3, 3)), 2)
    with pytest.raises(ValueError, match="finite"):
        align_signs(np.full((2, 3, 3), np.nan), 0)


# --------------------------------------------------------------------------- benchmark choice


@FAST
@given(sizes=st.lists(st.integers(0, 5), min_size=1, max_size=20))
def test_largest_benchmark_is_the_first_client_with_the_most_samples(sizes):
    estimates = np.tile(np.eye(2), (len(sizes), 1, 1))
    assert choose_benchmark(estimates, sizes, rule="largest") == sizes.index(max(sizes))


def test_best_objective_benchmark_minimises_the_kmeans_objective():
    rng = np.random.default_rng(21)
    mixing = make_mixing_matrix(4, random_state=rng)
    estimates = _signed_copies(rng, mixing, 8, noise=0.25)  # noisy enough for alignments to differ
    sizes = np.full(8, 100)
    objectives = [rf_ica_aggregate(estimates, sizes, benchmark=k, random_state=0).inertia for k in range(8)]
    assert len(set(np.round(objectives, 9))) > 1
    best = choose_benchmark(estimates, sizes, rule="best_objective", random_state=0)
    assert objectives[best] == pytest.approx(min(objectives), rel=1e-9)
    # The aggregate reuses the winning candidate's clustering (same k-means seed).
    chosen = rf_ica_aggregate(estimates, sizes, benchmark="best_objective", random_state=0)
    assert chosen.benchmark == best
    assert chosen.inertia == pytest.approx(min(objectives), rel=1e-9)


def test_choose_benchmark_rejects_an_unknown_rule():
    with pytest.raises(ValueError, match="rule"):
        choose_benchmark(np.tile(np.eye(2), (3, 1, 1)), [1, 2, 3], rule="smallest")


# --------------------------------------------------------------------------- aggregation


@FAST
@given(n_clients=st.integers(1, 15), r=st.integers(1, 6), seed=seeds)
def test_aggregating_exact_signed_permuted_copies_recovers_the_truth(n_clients, r, seed):
    rng = np.random.default_rng(seed)
    mixing = make_mixing_matrix(r, orthogonal=bool(rng.integers(2)), random_state=rng)
    estimates = _signed_copies(rng, mixing, n_clients) * rng.uniform(0.2, 5.0, (n_clients, 1, r))  # unnormalised
    sizes = rng.integers(50, 5000, n_clients)
    result = rf_ica_aggregate(estimates, sizes, random_state=seed % 1000)
    assert isinstance(result, RfIcaAggregate)
    assert result.benchmark == choose_benchmark(estimates, sizes)  # the medoid; with rule "largest" the largest site
    assert rf_ica_aggregate(estimates, sizes, benchmark="largest", random_state=0).benchmark == int(np.argmax(sizes))
    assert ica_error(result.rf_ica, mixing) < 1e-8
    assert ica_error(result.f_ica, mixing) < 1e-8
    assert result.inertia < 1e-12
    # Output columns follow the benchmark's (normalised) columns, in order and sign.
    benchmark = normalize_columns(estimates[result.benchmark])
    np.testing.assert_allclose(result.rf_ica, benchmark, atol=1e-8)
    # Each client puts exactly one column into every cluster, the one of its true column.
    assert result.labels.shape == (n_clients, r)
    np.testing.assert_array_equal(np.sort(result.labels, axis=1), np.tile(np.arange(r), (n_clients, 1)))
    true_column = np.abs(np.einsum("kdi,dj->kij", _unit_columns(estimates), mixing)).argmax(axis=2)
    label_of_true_column = np.empty(r, dtype=int)
    label_of_true_column[true_column[result.benchmark]] = np.arange(r)
    np.testing.assert_array_equal(result.labels, label_of_true_column[true_column])


@FAST
@given(n_clients=st.integers(2, 10), r=st.integers(2, 5), seed=seeds)
def test_baselines_are_exact_when_all_clients_share_one_column_order(n_clients, r, seed):
    rng = np.random.default_rng(seed)
    mixing = make_mixing_matrix(r, random_state=rng)
    flips = rng.choice([-1.0, 1.0], size=(n_clients, 1, r))
    result = rf_ica_aggregate(mixing * flips, np.ones(n_clients), random_state=0)
    benchmark = mixing * flips[result.benchmark]
    np.testing.assert_allclose(result.simple_mean, benchmark, atol=1e-12)
    np.testing.assert_allclose(result.simple_median, benchmark, atol=1e-8)


def test_one_garbage_client_among_ten_good_ones():
    rng = np.random.default_rng(31)
    r = 5
    mixing = make_mixing_matrix(r, random_state=rng)
    good = mixing + 0.01 * rng.standard_normal((10, r, r))  # same column order: fair to simple_mean
    garbage = make_mixing_matrix(r, random_state=rng)
    estimates = np.concatenate([good, garbage[None]])
    sizes = np.r_[np.full(10, 5000), 50]
    result = rf_ica_aggregate(estimates, sizes, random_state=0)
    rf_ica_error = ica_error(result.rf_ica, mixing)
    assert rf_ica_error < 0.05
    assert rf_ica_error < ica_error(result.simple_mean, mixing) / 2
    assert rf_ica_error < ica_error(result.f_ica, mixing)


def test_one_garbage_client_among_ten_good_permuted_ones():
    rng = np.random.default_rng(32)
    r = 5
    mixing = make_mixing_matrix(r, random_state=rng)
    estimates = np.concatenate(
        [_signed_copies(rng, mixing, 10, noise=0.01), make_mixing_matrix(r, random_state=rng)[None]]
    )
    result = rf_ica_aggregate(estimates, np.r_[np.full(10, 5000), 50], random_state=0)
    rf_ica_error = ica_error(result.rf_ica, mixing)
    assert rf_ica_error < 0.05
    assert rf_ica_error < ica_error(result.f_ica, mixing)
    assert ica_error(result.simple_mean, mixing) > 0.5  # no clustering: permutations wreck it


def test_thousand_clients_of_dimension_ten():
    rng = np.random.default_rng(41)
    r, n_clients = 10, 1000
    mixing = make_mixing_matrix(r, random_state=rng)
    estimates = _signed_copies(rng, mixing, n_clients, noise=0.02)
    result = rf_ica_aggregate(estimates, rng.integers(100, 5000, n_clients), random_state=0)
    assert ica_error(result.rf_ica, mixing) < 0.01
    assert ica_error(result.f_ica, mixing) < 0.01
    assert np.all(np.sort(result.labels, axis=1) == np.arange(r))


def test_end_to_end_on_the_simulated_scenario():
    scenario = dict(SCENARIO, n_normal=3000, n_corrupt=60)
    mixing = ica_true_mixing(r=scenario["r"], orthogonal=True, seed=scenario["seed"])
    estimates, sizes = [], []
    for k in range(scenario["n_clients"]):
        data = ica_client_data(k, **scenario)
        estimates.append(local_fastica(data, random_state=k))
        sizes.append(data.shape[1])
    result = rf_ica_aggregate(np.stack(estimates), sizes, random_state=0)
    assert ica_error(result.rf_ica, mixing) < 0.1
    assert ica_error(result.rf_ica, mixing) < ica_error(result.simple_mean, mixing)


@pytest.mark.parametrize(
    ("estimates", "sizes", "kwargs", "message"),
    [
        (np.zeros((0, 3, 3)), np.zeros(0), {}, r"K >= 1"),
        (np.ones((2, 3, 4)), np.ones(2), {}, r"shape \(K, p, r\) with p >= r"),
        (np.ones((3, 3)), np.ones(3), {}, r"shape \(K, p, r\) with p >= r"),
        (np.where(np.eye(3) > 0, np.nan, 1.0)[None].repeat(2, 0), np.ones(2), {}, "finite"),
        (np.stack([np.eye(3), np.diag([1.0, 0.0, 1.0])]), np.ones(2), {}, "column 1 of client 1 is zero"),
        (np.tile(np.eye(3), (2, 1, 1)), np.ones(3), {}, r"n_samples must have shape \(2,\)"),
        (np.tile(np.eye(3), (2, 1, 1)), np.array([1.0, -1.0]), {}, "non-negative"),
        (np.tile(np.eye(3), (2, 1, 1)), np.ones(2), {"benchmark": "median"}, "rule"),
        (np.tile(np.eye(3), (2, 1, 1)), np.ones(2), {"benchmark": 5}, "benchmark"),
        (np.tile(np.eye(3), (2, 1, 1)), np.ones(2), {"kmeans_restarts": 0}, "kmeans_restarts"),
    ],
)
def test_rf_ica_aggregate_rejects_bad_input_clearly(estimates, sizes, kwargs, message):
    with pytest.raises(ValueError, match=message):
        rf_ica_aggregate(estimates, sizes, **kwargs)


# --------------------------------------------------------------------------- error


@FAST
@given(r=st.integers(1, 7), orthogonal=st.booleans(), seed=seeds)
def test_error_is_zero_for_every_signed_permutation_of_the_truth(r, orthogonal, seed):
    rng = np.random.default_rng(seed)
    mixing = make_mixing_matrix(r, orthogonal=orthogonal, random_state=rng)
    assert ica_error(mixing @ _signed_permutation(rng, r), mixing) == 0.0


@FAST
@given(r=st.integers(1, 7), seed=seeds)
def test_error_is_invariant_under_signed_permutations_and_symmetric(r, seed):
    rng = np.random.default_rng(seed)
    estimate, truth = rng.standard_normal((2, r, r))
    error = ica_error(estimate, truth)
    assert ica_error(estimate @ _signed_permutation(rng, r), truth) == pytest.approx(error, rel=1e-12, abs=1e-12)
    assert ica_error(truth, estimate) == pytest.approx(error, rel=1e-12, abs=1e-12)
    assert error <= np.linalg.norm(estimate - truth) + 1e-12


@FAST
@given(r=st.integers(1, 4), seed=seeds)
def test_error_equals_the_brute_force_minimum_over_signed_permutations(r, seed):
    rng = np.random.default_rng(seed)
    estimate, truth = rng.standard_normal((2, r, r))
    brute = min(
        np.linalg.norm(estimate - truth[:, list(order)] * np.array(signs))
        for order in itertools.permutations(range(r))
        for signs in itertools.product([-1.0, 1.0], repeat=r)
    )
    assert ica_error(estimate, truth) == pytest.approx(brute, rel=1e-10, abs=1e-12)


def test_error_rejects_bad_input():
    with pytest.raises(ValueError, match="same shape"):
        ica_error(np.eye(3), np.eye(4))
    with pytest.raises(ValueError, match="finite"):
        ica_error(np.full((2, 2), np.nan), np.eye(2))


def test_every_aggregation_method_reports_its_own_server_time():
    from fedica.rfica.aggregation import rf_ica_aggregate

    rng = np.random.default_rng(0)
    estimates = rng.standard_normal((40, 5, 5))
    seconds = rf_ica_aggregate(estimates, np.full(40, 100), random_state=0).method_seconds
    assert set(seconds) == {"rf-ica", "f-ica", "simple-mean", "simple-median"}
    # RF-ICA is F-ICA's clustering plus the geometric medians; the simple mean needs no clustering.
    assert seconds["rf-ica"] > seconds["f-ica"] > seconds["simple-mean"] > 0
