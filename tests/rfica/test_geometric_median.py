"""Properties of fedica.rfica.geometric_median.geometric_median."""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedica.rfica.geometric_median import geometric_median

FAST = settings(max_examples=60, deadline=None)

seeds = st.integers(0, 2**32 - 1)


def _objective(points, weights, y):
    return float(weights @ np.linalg.norm(points - y, axis=1))


def _gradient_norm(points, weights, y):
    """Norm of the gradient of the objective at a point that is no data point."""
    diff = y - points
    dist = np.linalg.norm(diff, axis=1)
    assert dist.min() > 0
    return float(np.linalg.norm((weights / dist) @ diff))


def _random_rotation(rng, d):
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    return q * np.sign(np.diag(r))


def _line(rng, d, t):
    """Points offset + t_i * direction in R^d."""
    direction = rng.standard_normal(d)
    direction /= np.linalg.norm(direction)
    offset = rng.standard_normal(d)
    return offset + np.outer(t, direction)


# --------------------------------------------------------------------------- collinear points


@FAST
@given(
    t=st.lists(st.integers(-1000, 1000), min_size=1, max_size=25, unique=True).filter(lambda v: len(v) % 2 == 1),
    d=st.integers(1, 5),
    seed=seeds,
)
def test_odd_collinear_points_give_exactly_the_middle_point(t, d, seed):
    t = np.array(t, dtype=float) / 100
    points = _line(np.random.default_rng(seed), d, t)
    middle = int(np.argsort(t)[len(t) // 2])
    np.testing.assert_array_equal(geometric_median(points), points[middle])


@FAST
@given(
    data=st.lists(
        st.tuples(st.integers(-1000, 1000), st.integers(1, 5)), min_size=1, max_size=20, unique_by=lambda p: p[0]
    ).filter(lambda v: sum(w for _, w in v) % 2 == 1),
    d=st.integers(1, 4),
    seed=seeds,
)
def test_weighted_collinear_points_give_the_weighted_median(data, d, seed):
    # An odd total of integer weights makes the weighted 1-D median unique and a data point.
    t = np.array([p[0] for p in data], dtype=float) / 100
    weights = np.array([p[1] for p in data], dtype=float)
    points = _line(np.random.default_rng(seed), d, t)
    order = np.argsort(t)
    cumulative = np.cumsum(weights[order])
    median_index = order[np.searchsorted(cumulative, weights.sum() / 2)]
    np.testing.assert_array_equal(geometric_median(points, weights), points[median_index])


@FAST
@given(
    t=st.lists(st.integers(-1000, 1000), min_size=2, max_size=24, unique=True).filter(lambda v: len(v) % 2 == 0),
    seed=seeds,
)
def test_even_collinear_points_give_a_point_of_the_middle_segment(t, seed):
    t = np.sort(np.array(t, dtype=float)) / 100
    rng = np.random.default_rng(seed)
    points = _line(rng, 3, t)
    y = geometric_median(points)
    low, high = points[len(t) // 2 - 1], points[len(t) // 2]
    # y is on the segment [low, high]: the distances add up.
    assert np.linalg.norm(y - low) + np.linalg.norm(y - high) == pytest.approx(np.linalg.norm(high - low), abs=1e-9)


@FAST
@given(
    t=st.lists(st.floats(0.01, 100), min_size=1, max_size=12),
    d=st.integers(1, 5),
    seed=seeds,
)
def test_collinear_symmetric_set_with_its_centre_gives_the_centre_exactly(t, d, seed):
    t = np.array(t)
    points = _line(np.random.default_rng(seed), d, np.concatenate([[0.0], t, -t]))
    np.testing.assert_array_equal(geometric_median(points), points[0])


@FAST
@given(n=st.integers(2, 15), d=st.integers(2, 5), with_centre=st.booleans(), seed=seeds)
def test_centrally_symmetric_set_gives_its_centre(n, d, with_centre, seed):
    rng = np.random.default_rng(seed)
    centre = rng.standard_normal(d) * 10
    offsets = rng.standard_normal((n, d))
    points = np.vstack([centre + offsets, centre - offsets] + ([centre[None]] if with_centre else []))
    np.testing.assert_allclose(geometric_median(points), centre, atol=1e-9)


# --------------------------------------------------------------------------- equivariance, accuracy


@FAST
@given(n=st.integers(3, 30), d=st.integers(2, 5), weighted=st.booleans(), seed=seeds)
def test_rotation_translation_and_scale_equivariance(n, d, weighted, seed):
    rng = np.random.default_rng(seed)
    points = rng.standard_normal((n, d))
    weights = rng.uniform(0.1, 2.0, n) if weighted else None
    rotation = _random_rotation(rng, d)
    shift = rng.standard_normal(d) * 10
    scale = rng.uniform(0.5, 2.0)
    moved = scale * points @ rotation.T + shift
    expected = scale * rotation @ geometric_median(points, weights) + shift
    np.testing.assert_allclose(geometric_median(moved, weights), expected, atol=1e-8)


@FAST
@given(n=st.integers(3, 40), d=st.integers(1, 6), weighted=st.booleans(), seed=seeds)
def test_result_is_a_minimiser(n, d, weighted, seed):
    rng = np.random.default_rng(seed)
    points = rng.standard_normal((n, d)) * rng.choice([1.0, 1e3, 1e6], size=(n, 1))
    weights = rng.uniform(0.1, 2.0, n) if weighted else np.ones(n)
    y = geometric_median(points, weights)
    best = _objective(points, weights, y)
    # No data point and no small perturbation does better.
    for candidate in np.vstack([points, y + 1e-6 * rng.standard_normal((20, d))]):
        assert best <= _objective(points, weights, candidate) * (1 + 1e-12)


@FAST
@given(n=st.integers(3, 12), d=st.integers(2, 4), seed=seeds)
def test_integer_weights_equal_repeated_points(n, d, seed):
    # n >= 3 generic points in d >= 2 dimensions: not collinear, so the median is unique.
    rng = np.random.default_rng(seed)
    points = rng.standard_normal((n, d))
    counts = rng.integers(1, 4, n)
    np.testing.assert_allclose(
        geometric_median(points, counts), geometric_median(np.repeat(points, counts, axis=0)), atol=1e-8
    )


def test_accuracy_against_a_long_run():
    rng = np.random.default_rng(7)
    for _ in range(30):
        points = rng.standard_normal((rng.integers(3, 30), rng.integers(2, 6)))
        precise = geometric_median(points, tol=1e-300, max_iter=100_000)
        np.testing.assert_allclose(geometric_median(points), precise, atol=1e-8)


# --------------------------------------------------------------------------- the data-point guard


def test_guard_when_the_first_iterate_is_a_data_point_that_is_not_the_median():
    # The mean (the start) is the data point (0, 0); plain Weiszfeld divides by zero there.
    points = np.array([[0.0, 0.0], [1.0, 1.0], [1.0, -1.0], [2.0, 0.0], [-4.0, 0.0]])
    assert np.all(points.mean(axis=0) == 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = geometric_median(points)
    assert np.all(np.isfinite(y))
    assert np.linalg.norm(y) > 0.1  # moved off the non-optimal data point
    assert _gradient_norm(points, np.ones(5), y) < 1e-7


def test_guard_when_the_first_iterate_is_the_median_data_point():
    points = np.array([[0.0, 0.0], [1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    np.testing.assert_array_equal(geometric_median(points), [0.0, 0.0])


@FAST
@given(n=st.integers(1, 20), d=st.integers(1, 5), seed=seeds)
def test_heavy_data_point_is_the_median_exactly(n, d, seed):
    # A point whose weight exceeds all the others together is the median: ||R_k|| < w_k.
    rng = np.random.default_rng(seed)
    points = rng.standard_normal((n + 1, d))
    weights = rng.uniform(0.1, 1.0, n + 1)
    heavy = int(rng.integers(n + 1))
    weights[heavy] = weights.sum() * 1.01
    np.testing.assert_array_equal(geometric_median(points, weights), points[heavy])


@FAST
@given(n_other=st.integers(0, 10), d=st.integers(1, 4), seed=seeds)
def test_a_majority_of_identical_points_is_the_median(n_other, d, seed):
    rng = np.random.default_rng(seed)
    repeated = rng.standard_normal(d)
    points = np.vstack([np.tile(repeated, (n_other + 1, 1)), rng.standard_normal((n_other, d)) * 100])
    np.testing.assert_array_equal(geometric_median(points[rng.permutation(len(points))]), repeated)


# --------------------------------------------------------------------------- robustness (paper Lemma 2)


@FAST
@given(
    n_good=st.integers(2, 30),
    bad_share=st.floats(0.0, 0.99),
    d=st.integers(1, 5),
    distance=st.floats(1.0, 1e6),
    one_direction=st.booleans(),
    seed=seeds,
)
def test_moving_fewer_than_half_the_points_keeps_the_median_within_the_lemma_2_bound(
    n_good, bad_share, d, distance, one_direction, seed
):
    rng = np.random.default_rng(seed)
    n_bad = min(int(bad_share * n_good), n_good - 1)  # strictly fewer bad than good points
    alpha = n_bad / (n_good + n_bad)
    target = rng.standard_normal(d)
    good = target + rng.standard_normal((n_good, d)) * rng.uniform(0.01, 1.0)
    if one_direction:  # the worst case pushes all outliers the same way
        bad = target + distance * np.tile(rng.standard_normal(d), (n_bad, 1))
    else:
        bad = target + distance * rng.standard_normal((n_bad, d))
    radius = np.linalg.norm(good - target, axis=1).max()
    c_alpha = (1 - alpha) / (1 - 2 * alpha)
    error = np.linalg.norm(geometric_median(np.vstack([good, bad])) - target)
    assert error <= c_alpha * radius + 1e-8 * (1 + distance)


@FAST
@given(n=st.integers(3, 25), d=st.integers(2, 5), stretch=st.floats(1.0, 1e4), seed=seeds)
def test_pushing_points_away_from_the_median_along_their_rays_does_not_move_it(n, d, stretch, seed):
    # The optimality condition sees only the directions from the median to the points
    # (generic points, d >= 2: the median is unique).
    rng = np.random.default_rng(seed)
    points = rng.standard_normal((n, d))
    # A tight anchor: far points amplify an anchor error by up to ~stretch.
    median = geometric_median(points, tol=1e-15)
    moved = rng.random(n) < 0.5
    pushed = points.copy()
    pushed[moved] = median + stretch * (points[moved] - median)
    np.testing.assert_allclose(geometric_median(pushed), median, atol=1e-7)


# --------------------------------------------------------------------------- small cases, input checks


def test_single_point_and_zero_weights():
    np.testing.assert_array_equal(geometric_median([[1.5, -2.0]]), [1.5, -2.0])
    points = np.array([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [100.0, 100.0]])
    np.testing.assert_array_equal(geometric_median(points, [1, 1, 1, 0]), [1.0, 0.0])


def test_does_not_modify_its_input():
    points = np.array([[0.0, 0.0], [1.0, 1.0], [3.0, -1.0]])
    before = points.copy()
    geometric_median(points, np.ones(3))
    np.testing.assert_array_equal(points, before)


@pytest.mark.parametrize(
    ("points", "weights", "message"),
    [
        (np.zeros((0, 2)), None, "n_points >= 1"),
        (np.zeros(3), None, r"shape \(n_points, n_dims\)"),
        (np.zeros((2, 2, 2)), None, r"shape \(n_points, n_dims\)"),
        ([[0.0, np.nan], [1.0, 1.0]], None, "finite"),
        ([[0.0, np.inf], [1.0, 1.0]], None, "finite"),
        ([[0.0, 0.0], [1.0, 1.0]], [1.0], r"weights must have shape \(2,\)"),
        ([[0.0, 0.0], [1.0, 1.0]], [1.0, -1.0], "non-negative"),
        ([[0.0, 0.0], [1.0, 1.0]], [1.0, np.nan], "finite"),
        ([[0.0, 0.0], [1.0, 1.0]], [0.0, 0.0], "positive sum"),
    ],
)
def test_bad_input_raises_a_clear_value_error(points, weights, message):
    with pytest.raises(ValueError, match=message):
        geometric_median(points, weights)


def test_bad_tolerance_or_iteration_budget_raise():
    with pytest.raises(ValueError, match="tol"):
        geometric_median([[0.0], [1.0]], tol=0)
    with pytest.raises(ValueError, match="max_iter"):
        geometric_median([[0.0], [1.0]], max_iter=0)
