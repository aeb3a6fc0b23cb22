"""Counts and sizes a run cannot hold in this machine's memory or a stated time are refused up front, one line each."""

import numpy as np
import pytest
from fedica.server.app import compose_config

from fedica.config import ConfigError, validate_config
from fedica.parameters import MAX_KMEANS_RESTARTS, MAX_ROUNDS, MAX_SEEDINGS

MEMORY = "fedica.config.scenario._physical_memory"


def _refusal(*overrides):
    with pytest.raises(ConfigError) as info:
        validate_config(compose_config(["engine=inprocess", *overrides]))
    return info.value.errors


def test_counts_beyond_a_runs_time_or_memory_bound_are_refused_one_line_each():
    assert _refusal("algorithm=fedgem", "algorithm.rounds=1000000000", "algorithm.n_init=1000000000") == [
        f"algorithm.rounds=1000000000: must be <= {MAX_ROUNDS}", f"algorithm.n_init=1000000000: must be <= {MAX_SEEDINGS}"]
    assert _refusal("algorithm.kmeans_restarts=1000000000") == [
        f"algorithm.kmeans_restarts=1000000000: must be <= {MAX_KMEANS_RESTARTS}"]
    validate_config(compose_config(["engine=inprocess", "algorithm=fedgem", f"algorithm.rounds={MAX_ROUNDS}"]))


def test_an_upsilon_beyond_any_radius_ratio_is_refused_up_front():
    # Row 13 of issue 43: algorithm.upsilon_grid=[1e308] passed validation and crashed mid-run (48 lines).
    assert _refusal("algorithm=fedgem", "algorithm.upsilon_grid=[1e308]", "algorithm.upsilon=1e300") == [
        "algorithm.upsilon=1e+300: must be a number in (0, 1000000] or auto",
        "algorithm.upsilon_grid=[1e+308]: must be a non-empty list of positive numbers of at most 1000000"]


def test_a_blobs_dimension_is_held_to_what_a_run_holds_not_to_the_points_alone(monkeypatch):
    # 725 points in d=10^6 are 5.4 GiB: they passed a machine of 16 GiB; a run holds three copies (16.2 GiB).
    monkeypatch.setattr(MEMORY, lambda: 16.0 * 2**30)
    big = ["algorithm=fedgem", "scenario=blobs", "scenario.dim=1000000", "scenario.n_train=250", "scenario.n_test=475"]
    [line] = _refusal(*big)
    assert line.startswith("scenario.n_train=250: the scenario's data would take 16.2 GiB, more than half")
    validate_config(compose_config(["engine=inprocess", *big[:2], "scenario.dim=100000", *big[3:]]))


def _table(path, rows, columns):
    np.savetxt(path, np.random.default_rng(0).normal(size=(rows, columns)), delimiter=",", fmt="%.3f")
    return str(path)


def test_files_that_cannot_fit_are_refused_before_any_is_parsed(tmp_path, monkeypatch):
    paths = [_table(tmp_path / f"site{g}.csv", 20_000, 10) for g in range(2)]
    files = ["scenario=files", f"scenario.paths=[{','.join(paths)}]"]
    monkeypatch.setattr(MEMORY, lambda: 8.0 * 2**20)
    monkeypatch.setattr("fedica.config.scenario.file_table", lambda *args: pytest.fail("a file was parsed"))
    [line] = _refusal("algorithm=fedgem", *files, "scenario.n_components=auto")
    assert line.startswith("scenario.paths: the 2 files' tables may hold") and "more than half of this machine's" in line


def test_rfica_files_with_more_channels_than_the_servers_matrices_can_hold_are_refused(tmp_path, monkeypatch):
    paths = [_table(tmp_path / f"wide{g}.csv", 3, 20_000) for g in range(2)]
    monkeypatch.setattr(MEMORY, lambda: 16.0 * 2**30)
    [line] = _refusal("algorithm=rfica", "scenario=files", f"scenario.paths=[{','.join(paths)}]")
    assert line.startswith(f"scenario.paths[0]={paths[0]}: its 20000 columns are RF-ICA's channels, and the server "
                           "holds 4 20000 x 20000 matrices per site (23.8 GiB for 2 sites)")
