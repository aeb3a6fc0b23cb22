"""The Amari index (fedica.evaluation.ica.amari_index): its range, its zeros and its invariances."""

import numpy as np
import pytest

from fedica.evaluation.ica import amari_index


def _truth(p, r, seed=0):
    A = np.random.default_rng(seed).standard_normal((p, r))
    return A / np.linalg.norm(A, axis=0)


def _signed_scaled_permutation(r, seed=1):
    rng = np.random.default_rng(seed)
    return np.eye(r)[rng.permutation(r)] * rng.choice([-1.0, 1.0], r) * rng.uniform(0.1, 10.0, r)


@pytest.mark.parametrize("p, r", [(4, 4), (16, 4), (64, 20)])
def test_zero_for_a_signed_scaled_permutation_of_the_columns(p, r):
    A = _truth(p, r)
    estimate = A @ _signed_scaled_permutation(r)
    assert amari_index(estimate, A) == pytest.approx(0.0, abs=1e-12)
    assert amari_index(np.linalg.pinv(estimate), A, unmixing=True) == pytest.approx(0.0, abs=1e-12)


def test_invariant_to_the_scale_of_the_estimates_columns_and_of_the_truth():
    A = _truth(8, 5)
    estimate = A + 0.2 * np.random.default_rng(3).standard_normal(A.shape)
    value = amari_index(estimate, A)
    assert 0.01 < value < 1
    scales = np.array([1e-3, -2.0, 5.0, 1.0, -40.0])
    assert amari_index(estimate * scales, A) == pytest.approx(value, rel=1e-10)
    assert amari_index(estimate, A * scales[::-1]) == pytest.approx(value, rel=1e-10)
    # The same estimate given as an unmixing, with rows of any scale.
    W = np.linalg.pinv(estimate)
    assert amari_index(W * scales[:, None], A, unmixing=True) == pytest.approx(value, rel=1e-10)


def test_in_zero_one_and_one_when_every_component_holds_every_source_equally():
    A = _truth(4, 4)
    values = [amari_index(np.random.default_rng(s).standard_normal((4, 4)), A) for s in range(50)]
    assert all(0 <= v <= 1 for v in values) and np.median(values) > 0.2
    worst = np.ones((4, 4)) @ np.linalg.inv(A)  # W A = ones: every component is every source's equal sum
    assert amari_index(worst, A, unmixing=True) == pytest.approx(1.0, abs=1e-9)


def test_formula_on_a_small_example():
    # W A = [[1, 0.5], [0.25, 1]]: rows (0.5 + 0.25), columns (0.25 + 0.5) over 2 r (r - 1) = 4.
    P = np.array([[1.0, 0.5], [0.25, 1.0]])
    assert amari_index(P, np.eye(2), unmixing=True) == pytest.approx(1.5 / 4)


def test_shapes_are_checked():
    A = _truth(6, 3)
    with pytest.raises(ValueError, match="must have shape \\(6, 3\\)"):
        amari_index(np.ones((6, 6)), A)
    with pytest.raises(ValueError, match="must have shape \\(3, 6\\)"):
        amari_index(np.ones((6, 3)), A, unmixing=True)
    with pytest.raises(ValueError, match="p >= r"):
        amari_index(np.ones((3, 6)), A.T)
    with pytest.raises(ValueError, match="finite"):
        amari_index(np.full((6, 3), np.nan), A)
