"""docs/FLOWER_APP.md (linked from README) runs as written: its three files under ``flwr run`` on a local SuperLink.

The files are that document's own code blocks, written unchanged into an app folder (the RF-ICA
app is built from them by the substitutions its sentence on it names); the commands are
its ``flwr run`` line with the site folder filled in, then ``flwr ls --run-id`` for the
final status, because ``flwr run`` exits 0 whatever happened. Each test gets its own SuperLink
(conftest.py's ``flwr_env``, which marks it ``flwr_run``); the last test, without one, checks the
refusal of a relative path in-process.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pytest
from fedica.clients.app import ArraySource
from fedica.scripts.deploy import processes
from flwr.app import Context, RecordDict

REPO = Path(__file__).resolve().parents[2]
SECTION = REPO.joinpath("docs", "FLOWER_APP.md").read_text()
# A hang guard: a run of these apps takes well under a minute here.
RUN_TIMEOUT = 240


def _block(language, first_line):
    """The code block of ``language`` in the document whose first line is ``first_line``."""
    [block] = [b.split("```", 1)[0] for b in SECTION.split(f"```{language}\n")[1:] if b.startswith(first_line + "\n")]
    return block


def _inline(prefix):
    """The document's one inline code span (outside its code blocks, line breaks as spaces) that starts with ``prefix``."""
    prose = re.sub(r"```.*?```", "", SECTION, flags=re.S)
    [span] = {" ".join(s.split()) for s in re.findall(r"`([^`]+)`", prose) if " ".join(s.split()).startswith(prefix)}
    return span


def _rfica_server(fedgem_server):
    """The RF-ICA server file, by the document's sentence: RFICAStrategy for FedGEMStrategy, the mixing printed for the two prints."""
    lines = fedgem_server.replace("import FedGEMStrategy", "import RFICAStrategy").splitlines()
    lines = [f"    strategy = {_inline('RFICAStrategy(')}" if "FedGEMStrategy(" in line else line for line in lines]
    prints = [i for i, line in enumerate(lines) if line.startswith("    print(")]  # main's own, not the except clause's
    assert len(prints) == 2 and prints[1] == prints[0] + 1
    lines[prints[0]:prints[1] + 1] = [f"    {_inline('print(result.arrays')}"]
    return "\n".join(lines) + "\n"


def _app(folder, server_code):
    folder.mkdir()
    folder.joinpath("pyproject.toml").write_text(_block("toml", "# pyproject.toml"))
    folder.joinpath("server_app.py").write_text(server_code)
    folder.joinpath("client_app.py").write_text(_block("python", "# client_app.py"))
    return folder


def _blob_sites(folder):
    """3 sites, each holding 3 of 4 well-separated blob clusters (FedGEM should find K_hat = 4)."""
    folder.mkdir()
    rng = np.random.default_rng(1)
    centres = np.array([[0.0, 0.0], [7.0, 0.0], [0.0, 7.0], [7.0, 7.0]])
    for site, held in enumerate(([0, 1, 2], [1, 2, 3], [0, 2, 3])):
        np.save(folder / f"site{site}.npy", np.vstack([c + rng.standard_normal((150, 2)) for c in centres[held]]))
    return folder


def _recording_sites(folder):
    """3 sites' recordings of the same 4 Laplace sources through one 4 x 4 mixing matrix."""
    folder.mkdir()
    rng = np.random.default_rng(2)
    mixing = np.linalg.qr(rng.standard_normal((4, 4)))[0]
    for site in range(3):
        np.save(folder / f"site{site}.npy", rng.laplace(size=(2000, 4)) @ mixing.T)
    return folder


def _readme_run_command(data_dir, **federation):
    """The document's ``flwr run`` line, its data-dir set to ``data_dir`` (and its federation config replaced, if given)."""
    [line] = [line.strip() for line in SECTION.splitlines() if line.strip().startswith("flwr run .")]
    args = shlex.split(line)
    args[args.index("-c") + 1] = f"data-dir='{data_dir}'"
    if federation:
        args[args.index("--federation-config") + 1] = " ".join(f"{k}={v}" for k, v in federation.items())
    return args


def _flwr_run(app_dir, env, args):
    """Run ``args`` (a ``flwr run`` line) in ``app_dir``; return its output and the run's final ``flwr ls`` entry."""
    flwr = processes.flower_executable("flwr")
    done = subprocess.run([flwr, *args[1:]], cwd=app_dir, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]  # flwr's own exit code says nothing about the run
    run_id = re.search(r"Successfully started run (\d+)", out)
    assert run_id, out[-3000:]
    listed = subprocess.run([flwr, "ls", "--run-id", run_id.group(1), "--format", "json"], cwd=app_dir, env=env,
                            capture_output=True, text=True, timeout=60)
    [entry] = json.loads(listed.stdout)["runs"]
    return out, entry


@pytest.mark.slow
def test_the_readme_fedgem_app_and_its_rfica_variant_run_on_one_superlink(flwr_env, tmp_path):
    assert "export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1" in SECTION
    assert flwr_env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"  # as the document says, where the SuperLink starts
    fedgem_server = _block("python", "# server_app.py")
    fedgem = _app(tmp_path / "fedgem-app", fedgem_server)
    out, entry = _flwr_run(fedgem, flwr_env, _readme_run_command(_blob_sites(tmp_path / "blobs")))
    assert entry["status"] == "finished:completed", (entry, out[-3000:])
    assert "K_hat = 4" in out, out[-3000:]

    # The second app on the same SuperLink reads its own folder's files: 4 channels, so a 4 x 4 mixing.
    rfica = _app(tmp_path / "rfica-app", _rfica_server(fedgem_server))
    out, entry = _flwr_run(rfica, flwr_env, _readme_run_command(_recording_sites(tmp_path / "recordings")))
    assert entry["status"] == "finished:completed", (entry, out[-3000:])
    [printed] = re.findall(r"^\[\[.*?\]\]$", out, flags=re.S | re.M)
    rows = re.findall(r"\[([^\[\]]+)\]", printed)
    assert len(rows) == 4 and all(len(row.split()) == 4 for row in rows), printed


@pytest.mark.slow
def test_a_relative_data_path_and_too_few_supernodes_fail_the_run_in_one_line(flwr_env, tmp_path):
    app = _app(tmp_path / "fedgem-app", _block("python", "# server_app.py"))
    _blob_sites(app / "sites")  # a relative 'sites' would name these only if the SuperLink ran in the app's folder
    refusal = _inline("run config data-dir='sites' is a relative path").removesuffix(" ...")
    out, entry = _flwr_run(app, flwr_env, _readme_run_command("sites"))
    assert entry["status"] == "finished:failed" and refusal in entry["status-details"], entry
    assert f"ValueError: {refusal}" in out, out[-3000:]

    too_few = "the simulation federation has 2 SuperNodes but scenario (unnamed) has 3 clients"
    out, entry = _flwr_run(app, flwr_env, _readme_run_command(app / "sites", **{"num-supernodes": 2}))
    assert entry["status"] == "finished:failed" and too_few in entry["status-details"], entry
    assert f"server_app: the run stopped: {too_few}" in out, out[-3000:]


@pytest.mark.parametrize("node_config, run_config, refused", [
    ({}, {"data-dir": "sites"}, "run config data-dir='sites' is a relative path; data paths must be absolute"),
    ({"data-dir": "here"}, {"data-dir": "/srv"}, "node config data-dir='here' is a relative path"),  # a node's own wins
    ({}, {}, "neither the node config nor the run config has 'data-dir'"),
])
def test_a_path_key_that_is_not_absolute_is_refused_before_load_data_runs(node_config, run_config, refused):
    loads = []
    source = ArraySource(loads.append, None, 10, ("data-dir",))
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 0, **node_config}, state=RecordDict(),
                      run_config=run_config)
    with pytest.raises(ValueError, match=re.escape(refused)):
        source.ica_data({}, 0, context)
    assert loads == []
