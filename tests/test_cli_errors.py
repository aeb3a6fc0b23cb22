"""A new user's mistakes on the command line: each is one line on stderr and exit status 2, before anything starts.

Hydra's own composition errors (a key typed without ``+``, an unknown group option, a malformed override), every
configuration error of a command at once, and ``scenario=files`` with a file a site could not use.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedica.config import ConfigError, composition_error, validate_config
from fedica.server.app import compose_config

REPO = Path(__file__).resolve().parents[1]
PREFIX = "fedica-run: configuration error: "


def _run(tmp_path, *overrides, command=("fedica.scripts.run",)):
    """``fedica-run`` (or another module) in a child that imports this checkout."""
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": str(REPO)}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, "-m", *command, *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


def _lines(done) -> list[str]:
    return done.stderr.splitlines()


def _site(path: Path, rows: int = 30, bad_line: int | None = None) -> str:
    """A labelled CSV site (header volts,amps,label); ``bad_line`` (1-based, the header is line 1) reads n/a."""
    lines = ["volts,amps,label"] + [f"{i}.5,{(i * 7) % 5}.25,{i % 3}" for i in range(rows)]
    if bad_line is not None:
        lines[bad_line - 1] = "n/a,1.0,0"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("overrides, line", [
    (["algorithm=fedgem", "scenario=files", "scenario.label_colum=label"],
     "scenario.label_colum: unknown key; scenario 'files' has keys paths, label_column, n_components, test_fraction, "
     "write_sources, standardize (did you mean scenario.label_column?)"),
    (["seed2=3"], "seed2: unknown key; the top level has keys seed,"),
    (["algorithm=fedgm"], "algorithm=fedgm: no such option; algorithm has fedgem, fedgem_paper, rfica, rfica_paper (did you mean algorithm=fedgem?)"),
    (["seed=[1"], "seed=[1: not a valid override (no viable alternative at input '[1')"),
])
@pytest.mark.slow
def test_hydra_composition_errors_are_one_line_and_status_2(tmp_path, overrides, line):
    done = _run(tmp_path, *overrides)
    assert done.returncode == 2, done.stderr
    assert len(_lines(done)) == 1 and _lines(done)[0].startswith(PREFIX + line), done.stderr
    assert "HYDRA_FULL_ERROR" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow
def test_fedica_deploy_says_a_composition_error_the_same_way(tmp_path):
    done = _run(tmp_path, "algorithm=fedgem", "scenario=files", "scenario.label_colum=label",
                command=("fedica.scripts.deploy",))
    assert done.returncode == 2, done.stderr
    assert _lines(done) == ["fedica-deploy: configuration error: scenario.label_colum: unknown key; scenario 'files' "
                            "has keys paths, label_column, n_components, test_fraction, write_sources, standardize "
                            "(did you mean scenario.label_column?)"]


def test_compose_config_raises_one_line():
    with pytest.raises(ConfigError, match=r"^algorithm=fedgm: no such option; algorithm has fedgem, fedgem_paper, rfica, rfica_paper"):
        compose_config(["algorithm=fedgm"])
    with pytest.raises(ConfigError, match=r"^engine\.hots: unknown key; engine 'deployment' has keys host,"):
        compose_config(["engine=deployment", "engine.hots=a"])


def test_composition_error_falls_back_to_the_first_lines():
    cause = KeyError("the cause")
    err = RuntimeError("Could not delete from config.\nmore")
    err.__cause__ = cause
    assert composition_error(err) == "Could not delete from config.: 'the cause'"


@pytest.mark.slow
def test_every_configuration_error_is_reported_at_once(tmp_path):
    missing = tmp_path / "site1.csv"
    done = _run(tmp_path, "algorithm=fedgem", "scenario=files", f"scenario.paths=[{_site(tmp_path / 's0.csv')},{missing}]",
                "seed=-1", "algorithm.rounds=-1", "attack.fraction=2")
    assert done.returncode == 2, done.stderr
    assert _lines(done) == [PREFIX + line for line in [
        "seed=-1: must be >= 0",
        "algorithm.rounds=-1: must be >= 0",
        "attack.fraction=2: must be in [0, 1)",
        f"scenario.paths[1]={missing}: no such file",
    ]], done.stderr


def test_the_first_line_is_the_first_error_and_dependent_rules_are_skipped():
    cfg = compose_config(["algorithm=fedgem", "scenario.n_clients=0", "min_clients=5", "+scenario.n_client=3",
                          "engine.client_num_cpus=0"])
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    # min_clients <= n_clients needs a valid n_clients: not checked while n_clients is wrong; the engine's own
    # rules need nothing of the scenario's.
    assert info.value.errors == [
        "scenario.n_client: unknown key; scenario 'blobs' has keys n_clients, n_clusters, dim, r_min, n_train, n_test, "
        "setting, k_min, k_max (did you mean scenario.n_clients?)",
        "scenario.n_clients=0: must be >= 1",
        "engine.client_num_cpus=0: must be > 0",
    ]


def _files_cfg(paths, *overrides):
    return compose_config(["algorithm=fedgem", "scenario=files", "engine=inprocess",
                           f"scenario.paths=[{','.join(paths)}]", *overrides])


def test_a_bad_cell_names_the_file_the_line_the_column_and_the_cell(tmp_path):
    paths = [_site(tmp_path / "site0.csv"), _site(tmp_path / "site1.csv", bad_line=17)]
    with pytest.raises(ConfigError) as info:
        validate_config(_files_cfg(paths, "scenario.label_column=label"))
    assert info.value.errors == [f"scenario.paths[1]={paths[1]}: line 17, column 0 ('volts'): 'n/a' is not a number"]


@pytest.mark.slow
def test_a_text_column_is_refused_not_dropped(tmp_path):
    good = _site(tmp_path / "site0.csv")
    text = tmp_path / "site1.csv"
    text.write_text("volts,amps,label\n" + "\n".join(f"{i}.5,high,{i % 3}" for i in range(30)) + "\n")
    done = _run(tmp_path, "algorithm=fedgem", "scenario=files", "engine=inprocess", f"scenario.paths=[{good},{text}]",
                "scenario.label_column=label")
    assert done.returncode == 2, done.stderr
    assert _lines(done) == [PREFIX + f"scenario.paths[1]={text}: line 2, column 1 ('amps'): 'high' is not a number"]
    assert not (tmp_path / "run" / "result.json").exists()


@pytest.mark.parametrize("label, problem", [
    ("lable", "label_column='lable' is none of the header's 3 names; its 3 columns are 0: 'volts', 1: 'amps', "
              "2: 'label'"),
    ("5", "label_column=5 is out of range for 3 columns; its 3 columns are 0: 'volts', 1: 'amps', 2: 'label'"),
])
def test_label_column_is_checked_against_every_file(tmp_path, label, problem):
    paths = [_site(tmp_path / "site0.csv"), _site(tmp_path / "site1.csv")]
    with pytest.raises(ConfigError) as info:
        validate_config(_files_cfg(paths, f"scenario.label_column={label}"))
    assert info.value.errors == [f"scenario.paths[{g}]={path}: {problem}" for g, path in enumerate(paths)]


def test_a_file_too_small_for_its_components_is_refused_up_front(tmp_path):
    paths = [_site(tmp_path / "site0.csv"), _site(tmp_path / "site1.csv", rows=3), _site(tmp_path / "site2.csv", rows=5)]
    with pytest.raises(ConfigError) as info:
        validate_config(_files_cfg(paths, "scenario.n_components=4", "scenario.test_fraction=0.5"))
    assert info.value.errors == [
        f"scenario.paths[1]={paths[1]}: has 3 points, fewer than n_components=4",
        f"scenario.paths[2]={paths[2]}: after the test_fraction=0.5 split only 2 training points remain, fewer than "
        "n_components=4",
    ]


def test_a_deployment_checks_only_the_keys(tmp_path):
    # The sites' files are on their own machines: nothing is read here, so files this machine lacks pass,
    # where a local engine, which reads them, refuses the same config in one line.
    overrides = ["algorithm=fedgem", "scenario=files", f"scenario.paths=[{tmp_path / 'a.csv'},{tmp_path / 'b.csv'}]",
                 "scenario.n_components=2"]
    checked = validate_config(compose_config([*overrides, "engine=deployment"]))
    assert checked["scenario"]["paths"] == [str(tmp_path / "a.csv"), str(tmp_path / "b.csv")]
    assert not any(tmp_path.iterdir())
    with pytest.raises(ConfigError, match=r"^scenario\.paths"):
        validate_config(compose_config([*overrides, "engine=inprocess"]))


@pytest.mark.parametrize("overrides, rule", [
    ([], "scenario.test_fraction=None holds no rows out to score a comparator on (null: 0 without a label_column)"),
    (["engine=deployment"], "on scenario=files the comparators read the sites' files, which a deployment keeps"),
])
def test_a_comparator_on_files_that_cannot_be_scored_is_refused(tmp_path, overrides, rule):
    paths = [_site(tmp_path / "site0.csv"), _site(tmp_path / "site1.csv")]
    with pytest.raises(ConfigError) as info:
        validate_config(_files_cfg(paths, "scenario.n_components=2", "baseline_methods=[central-gmm]", *overrides))
    assert len(info.value.errors) == 1, str(info.value)
    assert info.value.errors[0].startswith(f"baseline_methods=['central-gmm']: {rule}"), str(info.value)
    # The default list asks for no comparator on files: nothing new is required.
    validate_config(_files_cfg(paths, "scenario.n_components=2", *overrides))
