"""Sweeps through Hydra's submitit launchers: the same results as the joblib default, resume, progress, presets."""

import pytest
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from fedica.server.app import CONF_DIR
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from fedica.results import is_complete_result

# The experiment's own sweep, shrunk to two runs of a few seconds (baselines off, three rounds).
SMALL_SENSITIVITY = [
    "+experiment=fedgem_sensitivity", "seed=range(2)", "scenario.setting=nominal", "scenario.r_min=4",
    "scenario.n_train=500", "scenario.n_test=500", "algorithm.rounds=3", "baselines=false",
]


def _fedica_run(cwd, *args):
    script = Path(sys.executable).with_name("fedica-run")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "fedica"]
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=180, env=env, cwd=cwd)


def _results(sweep_dir):
    return {path.parent.name: json.loads(path.read_text()) for path in sorted(sweep_dir.glob("*/result.json"))}


def _in_process_result(seed):
    # The same run, composed and run in this process (no launcher): the reference the sweep's runs must equal.
    from fedica.config import validate_config
    from fedica.results import to_jsonable
    from fedica.scripts.engines import run_engine
    from fedica.server.app import compose_config

    overrides = [o for o in SMALL_SENSITIVITY if not o.startswith("seed=")] + [f"seed={seed}"]
    result = run_engine(validate_config(compose_config(overrides)))
    return json.loads(json.dumps(to_jsonable(result)))


def _without_clock(result):
    """A result without its timings, and without the note that a repeated sweep resumed it (the numbers are the same)."""
    return {key: value for key, value in result.items() if key not in ("timings", "resumed")}


@pytest.mark.slow
def test_a_submitit_local_sweep_writes_the_runs_results_and_resumes(tmp_path):
    # The command line's launcher wins over the experiment's (conf/sweep.yaml: fedica_joblib).
    first = _fedica_run(tmp_path, "-m", *SMALL_SENSITIVITY, "hydra/launcher=submitit_local", "hydra.sweep.dir=sweep")
    assert first.returncode == 0, first.stderr
    assert "Submitit 'local' sweep output dir" in first.stdout and "Joblib" not in first.stdout
    # The jobs ran in other processes; the progress still reaches the terminal of the command.
    assert "[sweep] 2 runs into sweep (0 already complete: skipped)" in first.stdout
    assert "[sweep] 2/2 runs done" in first.stdout

    sweep_dir = tmp_path / "sweep"
    paths = {json.loads(p.read_text())["seed"]: p for p in sweep_dir.glob("*/result.json")}
    assert sorted(paths) == [0, 1]
    for seed, path in paths.items():
        assert is_complete_result(path)
        assert (path.parent / ".hydra" / "config.yaml").exists()
        # Seeding comes from the config: everything but the clock is what the run gives without a launcher.
        assert _without_clock(json.loads(path.read_text())) == _without_clock(_in_process_result(seed))
    # Every file the sweep wrote is inside its folder; submitit's job logs are in .submitit.
    assert [p.name for p in tmp_path.iterdir()] == ["sweep"]
    assert len(list((sweep_dir / ".submitit").glob("*/*_log.out"))) == 2

    kept_mtime = paths[0].stat().st_mtime_ns
    expected = paths[1].read_text()
    paths[1].unlink()  # as if the sweep had stopped during this run
    again = _fedica_run(tmp_path, "-m", *SMALL_SENSITIVITY, "hydra/launcher=submitit_local", "hydra.sweep.dir=sweep")
    assert again.returncode == 0, again.stderr
    assert "(1 already complete: skipped)" in again.stdout and "[sweep] 2/2 runs done" in again.stdout
    assert paths[0].stat().st_mtime_ns == kept_mtime
    assert _without_clock(json.loads(paths[1].read_text())) == _without_clock(json.loads(expected))


@pytest.mark.slow
def test_a_failed_submitit_run_ends_the_sweep_with_its_own_message(tmp_path):
    overrides = [o for o in SMALL_SENSITIVITY if not o.startswith(("seed=", "algorithm.rounds="))]
    done = _fedica_run(tmp_path, "-m", *overrides, "seed=0", "algorithm.rounds=-1",
                       "hydra/launcher=submitit_local", "hydra.sweep.dir=bad")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == "fedica-run: configuration error: algorithm.rounds=-1: must be >= 0"
    assert not list((tmp_path / "bad").glob("*/result.json"))


def _compose(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


def test_the_launcher_presets_compose_with_the_experiments():
    default = _compose("+experiment=fedgem_sensitivity").hydra
    assert default.launcher._target_.endswith("JoblibLauncher")
    assert (default.launcher.n_jobs, default.launcher.verbose) == (2, 0)

    slurm = _compose("+experiment=fedgem_sensitivity", "hydra/launcher=fedica_slurm", "hydra.launcher.partition=cpu").hydra
    assert slurm.launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    chosen = {key: slurm.launcher[key] for key in ("timeout_min", "cpus_per_task", "mem_gb", "array_parallelism", "name", "partition")}
    assert chosen == {"timeout_min": 120, "cpus_per_task": 2, "mem_gb": 4, "array_parallelism": 64, "name": "fedica", "partition": "cpu"}
    assert "n_jobs" not in slurm.launcher
    # The experiment's sweep is untouched: same folder, parameters and progress callback.
    assert slurm.sweep.dir == "multirun/fedgem_sensitivity"
    assert OmegaConf.to_container(slurm.sweep)["subdir"] == "${hydra.job.override_dirname}"
    assert slurm.sweeper.params == default.sweeper.params
    assert slurm.callbacks.progress._target_ == "fedica.scripts.progress.SweepProgress"

    local = _compose("+experiment=rfica_fig1_k", "hydra/launcher=submitit_local").hydra
    assert local.launcher._target_.endswith("submitit_launcher.LocalLauncher")
    assert local.launcher.submitit_folder == "multirun/rfica_fig1_k/.submitit/%j"


@pytest.mark.slow
def test_help_names_launchers_that_exist(tmp_path):
    help_text = _fedica_run(tmp_path, "--help").stdout
    named = re.search(r"^Sweep launchers.*?(?=^\s*$)", help_text, re.MULTILINE | re.DOTALL).group(0)
    for name in ("fedica_joblib", "submitit_local", "fedica_slurm"):
        assert re.search(rf"\b{name}\b", named), name
        assert _compose("+experiment=rfica_fig1_k", f"hydra/launcher={name}").hydra.runtime.choices["hydra/launcher"] == name
