"""RF-ICA against clients that know its rules: the benchmark no claim decides, the degenerate estimates refused."""

import re

import numpy as np
import pytest
from fedica.scripts.engines import run_inprocess
from fedica.server.app import compose_config
from scipy.stats import ortho_group

from fedica import RFICA, attacks
from fedica.evaluation.ica import ica_error
from fedica.protocol import validate_ica_reply
from fedica.rfica.aggregation import choose_benchmark, signed_permutation_distance
from fedica.rfica.trust import estimate_defects

R = 5


def _honest(n_sites, seed, noise=0.01, truth=None):
    """``n_sites`` noisy signed permutations of ``truth`` (a random orthogonal matrix by default)."""
    rng = np.random.default_rng(seed)
    truth = ortho_group.rvs(R, random_state=seed) if truth is None else truth
    sites = []
    for _ in range(n_sites):
        estimate = truth + noise * rng.standard_normal(truth.shape)
        sites.append(estimate[:, rng.permutation(truth.shape[1])] * rng.choice([-1.0, 1.0], truth.shape[1]))
    return truth, np.stack(sites)


def test_signed_permutation_distance_is_zero_exactly_for_signed_permuted_rescaled_copies():
    truth, (estimate, other) = _honest(2, 0)
    copy = estimate[:, [2, 0, 4, 1, 3]] * np.array([-1.0, 3.0, -1e-5, 7.0, 1e4])
    assert signed_permutation_distance(estimate, copy) < 1e-7
    assert signed_permutation_distance(estimate, other) == pytest.approx(signed_permutation_distance(other, estimate))
    assert signed_permutation_distance(estimate, other) > 1e-3
    assert signed_permutation_distance(truth, attacks.rotated_truth_estimate(truth)) > 0.5


def test_the_medoid_ignores_a_claimed_count_and_a_colluding_minority():
    truth, honest = _honest(16, 1)
    colluders = np.repeat(attacks.rotated_truth_estimate(truth)[None], 14, axis=0)
    estimates = np.concatenate([colluders, honest])
    sizes = np.r_[np.full(14, 10**9), np.full(16, 5000)]
    assert choose_benchmark(estimates, sizes, rule="largest") == 0  # the paper's rule: the claim decides
    assert choose_benchmark(estimates, sizes) >= 14
    assert choose_benchmark(estimates, sizes, rule="medoid") == choose_benchmark(estimates, np.ones(30))


@pytest.mark.parametrize("scale", [1.0, 1e200, 1e-170])
def test_honest_estimates_of_any_scale_are_not_refused(scale):
    _, estimates = _honest(30, 2)
    estimates[3] *= scale
    estimates[7, :, 2] *= scale
    assert estimate_defects(estimates) == {}


def test_honest_but_poor_sites_are_not_refused():
    # Fig. 1's hardest point: 40 % of the sites at ten times the others' noise (conditioned up to ~3).
    _, good = _honest(18, 3, noise=0.01)
    _, poor = _honest(12, 3, noise=0.15)
    assert estimate_defects(np.concatenate([good, poor])) == {}


def test_a_scaled_estimate_passes_the_reply_check_and_keeps_its_columns():
    _, (estimate,) = _honest(1, 4)
    for scale in (1e200, 1e-170, 1e-300):
        mixing, _ = validate_ica_reply({"mixing": estimate * scale}, {"n-samples": 10}, r=R)
        assert np.all(np.isfinite(mixing))


@pytest.mark.parametrize(
    "degenerate, reason",
    [
        (lambda truth, own: attacks.benchmark_hijack_estimate(truth), "duplicated or near-parallel columns 0 and 1"),
        (lambda truth, own: attacks.rank_one_estimate(own[:, 0], R), "duplicated or near-parallel columns 0 and 1"),
        # The (a1 + a2) / sqrt(2) variant of rank_one_collusion: one direction, any direction.
        (lambda truth, own: attacks.rank_one_estimate((truth[:, 0] + truth[:, 1]) / np.sqrt(2), R),
         "duplicated or near-parallel"),
        (lambda truth, own: np.column_stack([truth[:, :4], (truth[:, 0] + truth[:, 1]) / np.sqrt(2)]),
         "rank-deficient"),
        # No two columns alike (|cos| 0.5), but the fifth nearly in the others' span: conditioned about 40.
        (lambda truth, own: np.column_stack([truth[:, :4], truth[:, :4].sum(axis=1) / 2 + 0.05 * truth[:, 4]]),
         "condition number .* far beyond the federation's"),
        (lambda truth, own: 1e200 * attacks.benchmark_hijack_estimate(truth), "duplicated or near-parallel"),
    ],
)
def test_degenerate_estimates_are_refused_with_their_reason(degenerate, reason):
    truth, estimates = _honest(30, 5)
    for k in (4, 11, 20):
        estimates[k] = degenerate(truth, estimates[k])
    defects = estimate_defects(estimates)
    assert sorted(defects) == [4, 11, 20]
    for text in defects.values():
        assert re.search(reason, text), text


def test_the_estimator_refuses_degenerate_sites_and_names_them():
    truth, estimates = _honest(12, 6)
    estimates[[2, 5]] = attacks.benchmark_hijack_estimate(truth)
    model = RFICA(random_state=0).aggregate(estimates, np.r_[np.full(11, 5000), 5001])
    assert [entry["client"] for entry in model.rejected_] == [5, 2]
    assert all(entry["reason"].startswith("degenerate estimate: duplicated") for entry in model.rejected_)
    assert ica_error(model.mixing_, truth) < 0.05


def test_the_estimator_says_which_sites_were_refused_when_none_is_left():
    truth, _ = _honest(1, 10)
    with pytest.raises(ValueError, match=r"no estimate left to aggregate \(site 0: .*rank-deficient"):
        RFICA().aggregate(np.column_stack([truth[:, :4], truth[:, :2].sum(axis=1)])[None])


def test_attack_estimates_are_what_their_names_say():
    truth = ortho_group.rvs(R, random_state=7)
    hijack = attacks.benchmark_hijack_estimate(truth)
    np.testing.assert_array_equal(hijack, np.repeat(truth[:, :1], R, axis=1))
    midpoints = attacks.midpoint_columns_estimate(truth)
    np.testing.assert_allclose(np.linalg.norm(midpoints, axis=0), 1.0)
    np.testing.assert_allclose(np.abs(midpoints.T @ truth)[0, :2], np.sqrt(0.5))
    rotated = attacks.rotated_truth_estimate(truth)
    np.testing.assert_allclose(rotated.T @ rotated, np.eye(R), atol=1e-12)
    np.testing.assert_array_equal(rotated[:, 2:], truth[:, 2:])
    assert ica_error(rotated, truth) > 0.5


def test_midpoints_of_an_even_number_of_columns_are_refused_as_rank_deficient():
    # (a1 + a2) - (a2 + a3) + (a3 + a4) - (a4 + a1) = 0; for an odd r the midpoints are full rank.
    truth, estimates = _honest(10, 9, truth=ortho_group.rvs(4, random_state=9))
    estimates[3] = attacks.midpoint_columns_estimate(truth)
    assert list(estimate_defects(estimates)) == [3]
    assert estimate_defects(estimates)[3].startswith("rank-deficient")


ADAPTIVE = ["engine=inprocess", "scenario.n_clients=20", "scenario.corrupt_ratio=0.0", "scenario.n_normal=2000",
            "scenario.r=5", "attack.fraction=0.4"]


@pytest.mark.parametrize("kind, refused", [("benchmark_hijack", True), ("rank_one_collusion", True),
                                           ("midpoint_columns", False), ("rotated_truth", False)])
def test_rfica_withstands_forty_percent_adaptive_clients(kind, refused):
    honest = run_inprocess(compose_config(ADAPTIVE[:-1]))
    result = run_inprocess(compose_config(ADAPTIVE + [f"attack={kind}"]))
    hostile = result["rfica"]["hostile_clients"]
    assert len(hostile) == 8
    degenerate = sorted(entry["client"] for entry in result["clients"]["rejected"]
                        if entry["reason"].startswith("degenerate estimate"))
    assert degenerate == (sorted(hostile) if refused else [])
    error, honest_error = result["metrics"]["rf-ica"]["error"], honest["metrics"]["rf-ica"]["error"]
    assert error < max(0.1, 3 * honest_error), (error, honest_error)

