"""README stays true: its set-up commands, its library example and its Flower app example run as written."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands():
    lines = ROOT.joinpath("README.md").read_text().splitlines()
    return [line.strip() for line in lines[:12] if line.startswith("    ")]


def test_ci_runs_the_readme_test_command():
    run_command, test_command = _readme_commands()[:2]
    ci_lines = ROOT.joinpath(".ci", "run").read_text().splitlines()
    ci_command = ci_lines[ci_lines.index("# README test command:") + 1]
    assert test_command.endswith(ci_command)
    assert run_command.endswith("python -m pip install . && fedica-run")


def test_readme_run_command_is_an_installed_console_script():
    pyproject = ROOT.joinpath("pyproject.toml").read_text()
    assert 'fedica-run = "fedica.scripts.run:cli"' in pyproject


def _python_blocks():
    """README's python code blocks, in order."""
    text = ROOT.joinpath("README.md").read_text()
    return [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]


def test_readme_library_example_runs_and_finds_the_global_k():
    library_example = _python_blocks()[0]
    out = subprocess.run([sys.executable, "-c", library_example], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout
    assert out.splitlines()[0] == "4"


def test_readme_flower_app_runs_on_the_simulation_engine(tmp_path, monkeypatch):
    server_code, client_code = (b for b in _python_blocks() if b.startswith(("# server_app.py", "# client_app.py")))
    rng = np.random.default_rng(1)
    centres = np.array([[0.0, 0.0], [7.0, 0.0], [0.0, 7.0], [7.0, 7.0]])
    for site, held in enumerate(([0, 1, 2], [1, 2, 3], [0, 2, 3])):
        np.save(tmp_path / f"site{site}.npy", np.vstack([c + rng.standard_normal((150, 2)) for c in centres[held]]))
    (tmp_path / "server_app.py").write_text(server_code)
    (tmp_path / "client_app.py").write_text(client_code)
    script = (
        "import logging, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "from flwr.simulation import run_simulation\n"
        "from server_app import app as server_app\n"
        "from client_app import app as client_app\n"
        "run_simulation(server_app=server_app, client_app=client_app, num_supernodes=3,\n"
        "               backend_config={'client_resources': {'num_cpus': 1, 'num_gpus': 0.0},\n"
        "                               'init_args': {'logging_level': 'ERROR', 'log_to_driver': True}})\n"
    )
    env = {**os.environ, "SITE_DATA": str(tmp_path), "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "K_hat = 4" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
