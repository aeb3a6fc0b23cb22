"""``fedica-deploy --resume RUN_DIR`` for real: the ServerApp (``flwr-serverapp``) is killed with SIGKILL after its first
stage, the launcher is stopped, and the resumed deployment writes the uninterrupted deployment's result.json.

RF-ICA with the federated whitening: two stages (the covariances, then the local ICA), so the resumed
run replays the first and asks the second. Three real deployments (about three minutes each here).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from local_ports import free_ports

from fedica.protocol.journal import JOURNAL_DIR

pytestmark = pytest.mark.deployment

OVERRIDES = ["algorithm=rfica", "scenario=ica_paper", "scenario.n_clients=3", "scenario.n_normal=500",
             "algorithm.whitening=federated", "algorithm.n_components=5"]


def deploy(*args: str) -> list[str]:
    # Ports of their own: other deployments may run on this machine at the same time.
    first = free_ports(1 + 3)  # the SuperLink and the scenario's three SuperNodes
    ports = ["--superlink-port", str(first), "--supernode-port", str(first + 1)]
    return [sys.executable, "-c", "import sys; from fedica.scripts.deploy import main; sys.exit(main())",
            *OVERRIDES, *ports, *args]


def descendants(pid: int) -> set[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def serverapp(launcher: int) -> int | None:
    for pid in descendants(launcher):
        try:
            if b"flwr-serverapp" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


def without_run_specifics(folder: Path) -> dict:
    result = json.loads((folder / "result.json").read_text())
    for key in ("timings", "deployment"):  # the deployment entry names the run id and its log folder
        result.pop(key)
    result.pop("resumed", None)  # said of a resumed run only
    result["config"].pop("engine")  # each deployment's own ports and folder
    return result


def _saved_after_first_stage(out_dir) -> bool:
    try:
        status = json.loads((out_dir / "partial_result.json").read_text()).get("status", "")
    except (OSError, ValueError):
        return False
    return status.startswith("saved after stage 1 ")


def test_a_deployment_whose_serverapp_is_killed_resumes_to_the_uninterrupted_result(tmp_path):
    killed = tmp_path / "killed"
    launcher = subprocess.Popen(deploy("--out-dir", str(killed)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)
    deadline = time.monotonic() + 600
    # Killed once stage 1 is saved and its status written (the ServerApp writes the stage file first, then
    # partial_result.json: killed in between, the status would not exist yet).
    while not _saved_after_first_stage(killed) and launcher.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = serverapp(launcher.pid)
    assert pid is not None, "no flwr-serverapp under the launcher"
    os.kill(pid, signal.SIGKILL)
    launcher.send_signal(signal.SIGTERM)  # rather than wait for Flower to give the killed run up (about 100 s)
    assert launcher.wait(timeout=300) == 130, launcher.stderr.read()[-3000:]
    assert len(list((killed / JOURNAL_DIR).glob("stage_*.npz"))) == 1 and not (killed / "result.json").exists()
    partial = json.loads((killed / "partial_result.json").read_text())
    assert partial["status"].startswith("interrupted") and partial["last_status"].startswith("saved after stage 1 ")

    resumed = subprocess.run(deploy("--resume", str(killed)), capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    whole = subprocess.run(deploy("--out-dir", str(tmp_path / "whole")), capture_output=True, text=True, timeout=900)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert without_run_specifics(killed) == without_run_specifics(tmp_path / "whole")
    assert (killed / "deployment").is_dir() and list(killed.glob("deployment-resumed-*"))  # both attempts' logs


def test_fedica_deploy_refuses_a_foreign_journal_in_one_line(tmp_path):
    from fedica.protocol import Journal

    Journal.create(tmp_path, {"seed": 5})
    done = subprocess.run(deploy("--resume", str(tmp_path)), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"fedica-deploy: configuration error: {tmp_path}: its journal was written by another configuration")
