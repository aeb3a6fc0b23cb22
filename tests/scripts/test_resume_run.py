"""``fedica-run ... resume=RUN_DIR``: a ``fedica-run`` killed with SIGKILL mid-run resumes to the uninterrupted result.json.

Real processes: the run is killed by its pid once its journal holds at least two completed
stages, then the same command with ``resume=`` finishes it; both result.json files are compared
whole, but for their ``timings``.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedica.protocol.journal import JOURNAL_DIR

RUN = [sys.executable, "-m", "fedica", "engine=inprocess", "algorithm=fedgem", "scenario=blobs", "algorithm.rounds=20",
       "baselines=true", "baseline_methods=[ffcm-avg1]"]


def fedica_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*RUN, *args], capture_output=True, text=True, timeout=300)


def stages(folder: Path) -> int:
    return len(list((folder / JOURNAL_DIR).glob("stage_*.npz")))


def without_timings(folder: Path) -> dict:
    result = json.loads((folder / "result.json").read_text())
    result.pop("timings")
    return result


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    """A run killed with SIGKILL after its second completed stage, and the stages its journal held then."""
    folder = tmp_path_factory.mktemp("killed") / "run"
    process = subprocess.Popen([*RUN, f"hydra.run.dir={folder}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while stages(folder) < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(timeout=30) == -signal.SIGKILL
    return folder, stages(folder)


def test_a_run_killed_mid_run_resumes_to_the_uninterrupted_result(tmp_path, killed_run):
    folder, completed = killed_run
    assert 2 <= completed < 20 and not (folder / "result.json").exists()

    done = fedica_run(f"resume={folder}", f"hydra.run.dir={tmp_path / 'resume-log'}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"replaying its {completed} completed stages" in done.stdout + done.stderr
    whole = fedica_run(f"hydra.run.dir={tmp_path / 'whole'}")
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert without_timings(folder) == without_timings(tmp_path / "whole")
    assert stages(folder) == stages(tmp_path / "whole")


def test_a_missing_or_foreign_journal_is_refused_in_one_line(tmp_path, killed_run):
    folder, _ = killed_run
    foreign = fedica_run("seed=1", f"resume={folder}", f"hydra.run.dir={tmp_path / 'foreign'}")
    assert foreign.returncode == 2
    assert foreign.stderr.strip().splitlines() == [
        f"fedica-run: configuration error: resume: {folder}: its journal was written by another configuration "
        "(differs in seed); resume it with the same one"]
    missing = fedica_run(f"resume={tmp_path}", f"hydra.run.dir={tmp_path / 'missing'}")
    assert missing.returncode == 2
    (line,) = missing.stderr.strip().splitlines()
    assert line.startswith(f"fedica-run: configuration error: resume={str(tmp_path)!r}: must be the folder of an "
                           "interrupted run") and "journal.json is missing" in line
