"""A site with bad (flat or saturated) channels takes part with the channels it has (docs/ALGORITHMS.md section 1.12)."""

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import fedica
from fedica.data.recordings import recordings_roles, recordings_site, recordings_true_mixing
from fedica.evaluation.ica import ica_error
from fedica.protocol import InvalidReply
from fedica.protocol.messages import validate_ica_reply
from fedica.rfica.filling import fill_from_reference
from fedica.rfica.local import bad_channels, flat_channels, local_ica, normalize_columns, saturated_channels

WORKLOAD = dict(n_clients=8, n_channels=16, n_sources=8, n_noisy=0, min_samples=3000, max_samples=6000)


def _recordings(seed, dead, saturated=False):
    sites = [recordings_site(g, **WORKLOAD, dead_channel=dead, saturated_channel=saturated, seed=seed).observations.T
             for g in range(8)]
    roles = recordings_roles(n_clients=8, n_noisy=0, dead_channel=dead, saturated_channel=saturated, seed=seed)
    return sites, sorted(np.flatnonzero(roles["dead_channel"] | roles["saturated_channel"]).tolist())


def test_bad_channels_are_constant_or_negligible_beside_the_others():
    rng = np.random.default_rng(0)
    centred = rng.standard_normal((5, 100))
    centred[1] = 0.0
    centred[3] *= 1e-13
    centred[4] *= 1e-9  # a channel in nanovolts beside volts is live
    assert flat_channels(centred).tolist() == [False, True, False, True, False]


def test_a_channel_clipped_at_a_rail_is_saturated_and_a_quantised_one_is_not():
    rng = np.random.default_rng(1)
    data = rng.standard_normal((4, 5000))
    data[1] = np.clip(data[1], -3.0, 1.5)  # an amplifier's rail at 1.5 sd: 7 % of the samples there
    data[2] = np.round(data[2] * 20) / 20  # quantised: its extremes still hold a sample or two
    data[3] = 2.0
    assert saturated_channels(data).tolist() == [False, True, False, False]
    # In a site of 50 samples one sample is 2 % of them: a continuous channel's extreme is not a rail.
    assert not saturated_channels(rng.standard_normal((3, 50))).any()
    # Coarse measurements repeat their extremes, less often than their common values (iris: 3 of 150 at 2.5 cm).
    from sklearn.datasets import load_iris
    assert not saturated_channels(load_iris().data.T).any()
    assert bad_channels(data).tolist() == [False, True, False, True]


def test_a_site_s_ica_skips_its_bad_channel_and_marks_it():
    rng = np.random.default_rng(1)
    mixing = normalize_columns(rng.standard_normal((5, 5)))
    Y = mixing @ rng.laplace(size=(5, 4000))
    Y[2] = 3.0  # a disconnected channel at a constant offset
    every = local_ica(Y, solver="picard", contrast="logcosh", random_state=0, retry_random_state=1)
    assert every.converged and every.attempts == 1
    assert np.isnan(every.mixing[2]).all() and np.isnan(every.mixing).all(axis=0).sum() == 1
    assert np.all(np.isfinite(np.delete(every.mixing[:, ~np.isnan(every.mixing).all(axis=0)], 2, axis=0)))
    four = local_ica(Y, solver="picard", contrast="logcosh", n_components=4, random_state=0)
    assert four.mixing.shape == (5, 4) and np.isnan(four.mixing[2]).all() and np.isfinite(np.delete(four.mixing, 2, 0)).all()
    with pytest.raises(ValueError, match=r"^n_components=5 is more than the 4 channels that are not flat or saturated \(bad: 2\)$"):
        local_ica(Y, n_components=5)


@pytest.mark.parametrize("mixing, reason", [
    (np.where(np.eye(4, dtype=bool), np.nan, 1.0), "'mixing' holds NaN outside whole rows (bad channels) and whole columns"),
    (np.vstack([np.full((2, 4), np.nan), np.ones((2, 4))]), "'mixing' marks 2 of 4 channels bad; fewer than half may be"),
    (np.hstack([np.vstack([np.full((1, 2), np.nan), np.ones((3, 2))]), np.full((4, 2), np.nan)]),
     "'mixing' lacks 2 columns for 1 bad channel(s); a site lacks a column only for a channel it lacks"),
])
def test_a_reply_s_nan_must_be_whole_bad_rows_and_fewer_missing_columns(mixing, reason):
    with pytest.raises(InvalidReply) as info:
        validate_ica_reply({"mixing": mixing}, {"n-samples": 100}, r=4)
    assert str(info.value) == reason


def test_the_server_fills_a_bad_row_and_a_missing_column_from_the_reference():
    rng = np.random.default_rng(2)
    reference = normalize_columns(rng.standard_normal((6, 6)))
    estimate = -reference[:, [3, 0, 5, 1, 2, 4]].copy()
    estimate[4] = np.nan
    estimate[:, 2] = np.nan
    filled = fill_from_reference(estimate, reference)
    expected = -reference[:, [3, 0, 5, 1, 2, 4]]
    expected[:, 2] = reference[:, 5]  # the column the site lacks: the reference's unmatched one
    np.testing.assert_allclose(filled, expected, atol=1e-12)


def test_a_dead_channel_site_is_named_costs_what_a_clean_site_does_and_keeps_pooled_accuracy():
    for seed in range(2):
        sites, dead = _recordings(seed, dead=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = fedica.RFICA(n_components=8, random_state=seed).fit(sites)
        assert list(model.bad_channels_) == dead and len(dead) == 1
        lines = [str(w.message) for w in caught if "bad channels" in str(w.message)]
        assert len(lines) == 1 and f"site {dead[0]}: channel(s) " in lines[0]
        assert not any("set aside" in str(w.message) for w in caught)  # no honest site is blamed
        assert all(dead[0] not in step["sites"] for step in model.refinement_)
        truth = recordings_true_mixing(n_channels=16, n_sources=8, condition_number=10.0, seed=seed)
        clean, _ = _recordings(seed, dead=False)
        reference = fedica.RFICA(n_components=8, random_state=seed).fit(clean)
        assert ica_error(model.mixing_, truth) < 1.2 * ica_error(reference.mixing_, truth) + 0.01
        # Every channel, 16 components: the dead site's ICA converges in its usual iterations (it crawled to 4,000).
        every = fedica.RFICA(random_state=seed).fit(sites)
        assert every.site_converged_.all() and every.site_iterations_.max() < 500


@pytest.mark.slow
def test_fedica_run_names_the_dead_channel_site_in_its_result(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([str(Path(sys.executable).with_name("fedica-run")), "engine=inprocess", "algorithm=rfica",
                           "scenario=recordings", "scenario.n_channels=8", "scenario.n_sources=4",
                           "scenario.dead_channel=true", "scenario.n_noisy=0", "algorithm.n_components=4",
                           f"hydra.run.dir={out}"], capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((out / "result.json").read_text())
    dead = result["rfica"]["poor_sites"]["dead_channel"]
    assert len(dead) == 1 and [int(g) for g in result["rfica"]["bad_channels"]] == dead
    assert any("bad channels" in line for line in result["warnings"])
    assert "bad channels" in (out / "summary.txt").read_text()


def test_a_private_run_releases_bad_rows_as_zeros_within_its_sensitivity():
    sites, dead = _recordings(0, dead=True)
    model = fedica.RFICA(dp_epsilon=5.0, n_components=8, whitening="local", refine_rounds=0, random_state=0).fit(sites)
    assert model.bad_channels_ == {} and np.all(np.isfinite(model.site_mixings_))
    shared = fedica.RFICA(init="shared", n_components=8, random_state=0).fit(sites)  # appendix D's start, the same path
    assert list(shared.bad_channels_) == dead and np.all(np.isfinite(shared.mixing_))


def test_the_dead_and_the_saturated_channel_sites_and_no_other_are_named():
    for seed in range(3):
        sites, bad = _recordings(seed, dead=True, saturated=True)
        model = fedica.RFICA(n_components=8, random_state=seed).fit(sites)
        assert sorted(model.bad_channels_) == bad and len(bad) == 2
        assert all(len(channels) == 1 for channels in model.bad_channels_.values())


def test_a_federation_of_one_with_a_constant_column_fits_its_other_channels():
    rng = np.random.default_rng(6)
    mixing = normalize_columns(rng.standard_normal((3, 3)))
    X = np.column_stack([rng.laplace(size=(3000, 3)) @ mixing.T, np.full(3000, 7.0)])
    with pytest.warns(UserWarning, match=r"site 0: channel\(s\) 3"):
        model = fedica.RFICA(random_state=0).fit(X)
    assert model.bad_channels_ == {0: [3]} and model.site_converged_.all()
    found = model.mixing_[:3][:, np.abs(model.mixing_[3]) < 1e-12]  # the constant channel's row is zero
    assert found.shape[1] == 3 and ica_error(normalize_columns(found), mixing) < 0.05
