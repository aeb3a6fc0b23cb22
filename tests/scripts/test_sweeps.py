"""Sweeps: atomic results, resuming, sweep size, plotting."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from fedica.scripts import plot
from fedica.scripts.progress import sweep_size
from fedica.server.app import CONF_DIR
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

from fedica.results import is_complete_result, write_json_atomic


def test_atomic_write_leaves_nothing_half_written(tmp_path):
    target = tmp_path / "result.json"
    write_json_atomic(target, {"metrics": {"a": 1.0}, "timings": {}})
    with pytest.raises(TypeError):
        write_json_atomic(target, {"metrics": object(), "timings": {}})
    # The old complete file is still there, and no temporary file is left behind.
    assert json.loads(target.read_text())["metrics"] == {"a": 1.0}
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_is_complete_result(tmp_path):
    path = tmp_path / "result.json"
    assert not is_complete_result(path)
    path.write_text('{"metrics": {"a": 1}')
    assert not is_complete_result(path)
    path.write_text('{"metrics": {}, "timings": {}}')
    assert is_complete_result(path)


@pytest.mark.parametrize(
    "experiment, size",
    [("rfica_fig1_k", 100), ("rfica_fig1_ratio", 180), ("rfica_init", 360), ("fedgem_sensitivity", 360), ("fedgem_tables", 60), ("fedgem_attacks", 108), ("rfica_attacks", 72), ("fedgem_privacy", 80), ("fedgem_privacy_client", 24), ("fedgem_privacy_mnist", 80)],
)
def test_sweep_size_counts_every_run(experiment, size):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=[f"+experiment={experiment}"], return_hydra_config=True)
    assert sweep_size(cfg) == size


def test_rfica_privacys_sweep_counts_its_35_runs():
    # 7 epsilons (null: no privacy) x seeds 0-4 (docs/RESULTS.md, "RF-ICA with differential privacy per site").
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=["+experiment=rfica_privacy"], return_hydra_config=True)
    assert sweep_size(cfg) == 35


def _sweep(sweep_dir, *extra):
    command = [
        sys.executable, "-m", "fedica", "-m", "+experiment=rfica_fig1_k", f"hydra.sweep.dir={sweep_dir}",
        "scenario.n_clients=4", "seed=0,1", "scenario.n_normal=400", "scenario.n_corrupt=100",
        "scenario.r=3", *extra,
    ]
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
    # A bound on a hang, not a speed test: the two sweeps take 11 s alone and took 346 s in `.ci/run` beside the
    # deployment tests on two cores (one sweep passed 300 s there once).
    return subprocess.run(command, capture_output=True, text=True, timeout=900, env=env, cwd=Path(__file__).resolve().parents[2])


@pytest.mark.slow
def test_a_sweep_started_again_skips_complete_runs_and_plots(tmp_path):
    sweep_dir = tmp_path / "sweep"
    first = _sweep(sweep_dir)
    assert first.returncode == 0, first.stderr
    results = sorted(sweep_dir.glob("*/result.json"))
    assert len(results) == 2
    assert "[sweep] 2/2 runs done" in first.stdout
    kept = results[0].stat().st_mtime_ns
    results[1].unlink()  # as if the sweep had been interrupted during its second run

    second = _sweep(sweep_dir)
    assert second.returncode == 0, second.stderr
    assert "(1 already complete: skipped)" in second.stdout
    assert results[0].stat().st_mtime_ns == kept
    assert results[1].exists()

    plot.main([str(sweep_dir), "--out", str(tmp_path / "fig.png"), "--table", str(tmp_path / "table.md")])
    assert (tmp_path / "fig.png").stat().st_size > 1000
    table = (tmp_path / "table.md").read_text()
    assert "| scenario.n_clients | rf-ica | f-ica | simple-mean | simple-median |" in table
    assert table.count("\n| 4 |") == 1


EXPERIMENT_FILES = sorted((CONF_DIR / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("path", EXPERIMENT_FILES, ids=lambda p: p.stem)
def test_experiment_header_shows_small_and_full_commands_and_the_plot_call(path):
    name = path.stem
    header = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    sweep_dir = yaml.safe_load(path.read_text())["hydra"]["sweep"]["dir"]
    text = "\n".join(header)
    assert re.search(rf"^#\s+full:\s+fedica-run -m \+experiment={name}$", text, re.MULTILINE), text
    assert re.search(rf"^#\s+(figure|table):\s+fedica-plot {re.escape(sweep_dir)}$", text, re.MULTILINE), text
    assert sweep_dir.startswith("multirun/")
    small = re.search(rf"^#\s+small:\s+fedica-run -m \+experiment={name} (.+)$", text, re.MULTILINE)
    assert small, text
    # The small command's values replace the sweeper's: it really is a smaller sweep.
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=[f"+experiment={name}"], return_hydra_config=True)
    full = sweep_size(cfg)
    with open_dict(cfg):
        cfg.hydra.overrides.task = list(cfg.hydra.overrides.task) + shlex.split(small.group(1))
    assert 1 <= sweep_size(cfg) < full


def _fedica_run(*args):
    script = Path(sys.executable).with_name("fedica-run")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "fedica"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=120, check=False,
                          cwd=Path(__file__).resolve().parents[2])


@pytest.mark.slow
def test_fedica_run_help_says_what_fedica_is_and_how_to_run_it():
    done = _fedica_run("--help")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "powered by Hydra" not in text and "Powered by Hydra" not in text
    assert "fedica" in text and "RF-ICA" in text and "FedGEM" in text
    for group in ("algorithm", "scenario", "engine", "attack", "experiment"):
        assert re.search(rf"^{group}: ", text, re.MULTILINE), group
    assert re.search(r"^algorithm: fedgem, fedgem_paper, rfica, rfica_paper$", text, re.MULTILINE)
    for command in ("fedica-run ", "fedica-run algorithm=fedgem scenario=blobs", "fedica-run -m +experiment=fedgem_sensitivity"):
        assert re.search(rf"^\s+{re.escape(command)}\s+#", text, re.MULTILINE), command
    # Hydra's own help is still there.
    hydra_help = _fedica_run("--hydra-help")
    assert hydra_help.returncode == 0, hydra_help.stderr
    assert "--hydra-help" in hydra_help.stdout and "--multirun" in hydra_help.stdout


@pytest.mark.slow
def test_ctrl_c_in_a_sweep_ends_in_one_line_and_keeps_the_completed_runs(tmp_path):
    script = Path(sys.executable).with_name("fedica-run")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "fedica"]
    # As from a terminal: a SIGINT that this test's own parent ignores (a background job's) must not be inherited.
    with_default_sigint = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                           "os.execv(sys.argv[1], sys.argv[1:])"]
    sweep = subprocess.Popen([*with_default_sigint, *command, "-m", "+experiment=fedgem_k_selection", "seed=range(8)",
                              "+workload=s62_nominal", f"hydra.sweep.dir={tmp_path}"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("*/result.json")) and time.monotonic() < deadline:
        time.sleep(0.2)
    sweep.send_signal(signal.SIGINT)
    _, stderr = sweep.communicate(timeout=120)
    assert sweep.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith("fedica-run: interrupted; completed runs keep their result.json")
    assert list(tmp_path.glob("*/result.json"))


def test_the_progress_line_does_not_count_a_corrupt_result(tmp_path):
    from fedica.scripts.progress import _count_complete

    for name, text in (("a", '{"metrics": {}, "timings": {}}'), ("b", '{"metrics": '), ("c", "[]")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "result.json").write_text(text)
    assert _count_complete(tmp_path) == 1
