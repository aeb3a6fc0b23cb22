"""RF-ICA on the signals scenario and on the user's own files, through the library and fedica-run's engine."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedica import RFICA
from fedica.config import validate_config
from fedica.data.signals import signals_site, signals_true_mixing
from fedica.evaluation.ica import ica_error

PARAMS = {"n_clients": 10, "r": 4, "n_samples": 2000, "n_noisy": 2, "noise_level": 1.0, "n_short": 2,
          "short_samples": 40, "orthogonal": True}


def _inprocess(overrides):
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    return run_inprocess(validate_config(compose_config(["engine=inprocess", "algorithm=rfica", *overrides])))


def test_library_rfica_recovers_a_star_despite_noisy_and_short_sites():
    sites = [signals_site(g, **PARAMS, seed=0).observations.T for g in range(10)]
    model = RFICA(random_state=0).fit(sites)
    truth = signals_true_mixing(r=4, orthogonal=True, seed=0)
    assert ica_error(model.mixing_, truth) < 0.06
    assert ica_error(model.mixing_, truth) < ica_error(model.f_ica_, truth)
    assert ica_error(model.simple_mean_, truth) > 0.5  # without alignment the columns cancel


@pytest.fixture(scope="module")
def signals_result():
    return _inprocess(["scenario=signals"])


def test_fedica_run_on_signals_scores_every_method_against_a_star(signals_result):
    sites = [signals_site(g, **PARAMS, seed=0).observations.T for g in range(10)]
    model = RFICA(random_state=0).fit(sites)  # fedica-run's defaults are the library's
    rfica = signals_result["rfica"]
    np.testing.assert_allclose(rfica["estimate"], model.mixing_, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rfica["unmixing"], np.linalg.inv(model.mixing_), atol=1e-9)
    truth = signals_true_mixing(r=4, orthogonal=True, seed=0)
    np.testing.assert_array_equal(rfica["true_mixing"], truth)
    assert signals_result["metrics"]["rf-ica"]["error"] == pytest.approx(ica_error(model.mixing_, truth), abs=1e-12)
    assert signals_result["metrics"]["rf-ica"]["error"] < signals_result["metrics"]["f-ica"]["error"]
    np.testing.assert_allclose(rfica["explained_variance"], model.explained_variance_, rtol=1e-9)
    np.testing.assert_allclose(rfica["explained_variance_ratio"], model.explained_variance_ratio_, rtol=1e-9)
    assert np.all(np.diff(rfica["explained_variance"]) <= 0)
    assert sorted(rfica["n_samples"]).count(40) == 2
    poor = rfica["poor_sites"]
    assert len(poor["noisy"]) == 2 and len(poor["short"]) == 2
    assert rfica["corrupted_clients"] == sorted(poor["noisy"] + poor["short"])


def _site_files(tmp_path):
    sites = [signals_site(g, **{**PARAMS, "n_clients": 3, "n_noisy": 0, "n_short": 0}, seed=1) for g in range(3)]
    csv, npy, npz = tmp_path / "a.csv", tmp_path / "b.npy", tmp_path / "c.npz"
    np.savetxt(csv, sites[0].observations.T, delimiter=",", header="c0,c1,c2,c3", comments="")
    np.save(npy, sites[1].observations.T)
    np.savez(npz, X=sites[2].observations.T)
    return sites, [str(csv), str(npy), str(npz)]


def test_files_run_has_no_error_against_a_truth_and_writes_sources(tmp_path, monkeypatch):
    sites, paths = _site_files(tmp_path)
    out = tmp_path / "out"
    monkeypatch.setenv("FEDICA_OUT", str(out))  # no Hydra run folder here
    result = _inprocess(["scenario=files", f"scenario.paths=[{','.join(paths)}]", "scenario.write_sources=true"])
    assert all(values == {"error": None} for values in result["metrics"].values())
    rfica = result["rfica"]
    assert rfica["true_mixing"] is None and rfica["corrupted_clients"] is None
    np.testing.assert_allclose(np.asarray(rfica["unmixing"]) @ rfica["estimate"], np.eye(4), atol=1e-9)
    # The data's own A* is recovered (the test knows it, the run does not).
    truth = signals_true_mixing(r=4, orthogonal=True, seed=1)
    assert ica_error(rfica["estimate"], truth) < 0.1
    assert rfica["sources_files"] == [str((out / f"sources_site{g}.csv").resolve()) for g in range(3)]
    for site, written in zip(sites, rfica["sources_files"]):
        S = np.loadtxt(written, delimiter=",", skiprows=1)
        assert S.shape == (site.times.size, 4)
        assert Path(written).read_text().splitlines()[0] == "s0,s1,s2,s3"
        corr = np.abs(np.corrcoef(S.T, site.sources)[:4, 4:])
        assert np.all(corr.max(axis=1) > 0.99)  # every recovered source is one true source


@pytest.mark.slow
def test_fedica_run_writes_sources_next_to_result_json(tmp_path):
    _, paths = _site_files(tmp_path)
    out = tmp_path / "run"
    done = subprocess.run(
        [str(Path(sys.executable).with_name("fedica-run")), "engine=inprocess", "algorithm=rfica", "scenario=files",
         f"scenario.paths=[{','.join(paths)}]", "scenario.write_sources=true", f"hydra.run.dir={out}"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads((out / "result.json").read_text())
    assert result["metrics"]["rf-ica"]["error"] is None
    assert sorted(p.name for p in out.glob("sources_site*.csv")) == [f"sources_site{g}.csv" for g in range(3)]
    assert len(result["rfica"]["estimate"]) == 4 and len(result["rfica"]["unmixing"]) == 4


def test_the_signals_figure(tmp_path):
    from fedica.scripts.plot_signals import matched_sources, plot_signals

    errors = plot_signals(tmp_path / "signals.png", seed=0)
    assert (tmp_path / "signals.png").stat().st_size > 10_000
    assert errors["rf-ica"] < errors["f-ica"] < errors["simple-mean"]
    truth = np.random.default_rng(0).standard_normal((3, 50))
    matched, corr = matched_sources(-2.0 * truth[[2, 0, 1]], truth)
    np.testing.assert_allclose(matched, (truth - truth.mean(axis=1, keepdims=True)) / truth.std(axis=1, keepdims=True))
    np.testing.assert_allclose(corr, 1.0)
