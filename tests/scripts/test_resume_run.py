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


def fedica_run(*args: str, run: list[str] = RUN) -> subprocess.CompletedProcess:
    return subprocess.run([*run, *args], capture_output=True, text=True, timeout=300)


def stages(folder: Path) -> int:
    return len(list((folder / JOURNAL_DIR).glob("stage_*.npz")))


def without_timings(folder: Path) -> dict:
    """A result without its timings, and without the note that it was resumed (the numbers are the same)."""
    result = json.loads((folder / "result.json").read_text())
    result.pop("timings")
    result.pop("resumed", None)
    return result


def stopped_run(folder: Path, sig: int, after: int = 2, run: list[str] = RUN) -> tuple[subprocess.Popen, int]:
    """A run sent ``sig`` by its pid once its journal holds ``after`` completed stages; and the stages then."""
    process = subprocess.Popen([*run, f"hydra.run.dir={folder}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
    deadline = time.monotonic() + 240
    while stages(folder) < after and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(process.pid, sig)
    process.wait(timeout=60)
    return process, stages(folder)


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    """A run killed with SIGKILL after its second completed stage, and the stages its journal held then."""
    folder = tmp_path_factory.mktemp("killed") / "run"
    process, completed = stopped_run(folder, signal.SIGKILL)
    assert process.returncode == -signal.SIGKILL
    return folder, completed


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("whole")
    whole = fedica_run(f"hydra.run.dir={folder}")
    assert whole.returncode == 0, whole.stderr[-3000:]
    return folder


@pytest.mark.slow
def test_a_run_killed_mid_run_resumes_to_the_uninterrupted_result(tmp_path, killed_run, uninterrupted):
    folder, completed = killed_run
    assert 2 <= completed < 20 and not (folder / "result.json").exists()
    # What it had done is saved after every stage (the kill may fall between a stage's file and this one), with how to go on.
    partial = json.loads((folder / "partial_result.json").read_text())
    assert partial["status"].split(" (")[0] in {f"saved after stage {completed - 1}", f"saved after stage {completed}"}
    assert f"resume={folder} (fedica-deploy: --resume {folder}) goes on" in partial["status"] and partial["participation"]

    done = fedica_run(f"resume={folder}", f"hydra.run.dir={tmp_path / 'resume-log'}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"replaying its {completed} completed stages" in done.stdout + done.stderr
    assert without_timings(folder) == without_timings(uninterrupted)
    # The result and the summary say that it was resumed, and from where.
    assert json.loads((folder / "result.json").read_text())["resumed"]["replayed_stages"] == completed
    assert "resumed: the first" in (folder / "summary.txt").read_text()
    assert "resumed" not in json.loads((uninterrupted / "result.json").read_text())
    assert stages(folder) == stages(uninterrupted)
    assert not (folder / "partial_result.json").exists()  # superseded by the result


@pytest.mark.slow
def test_ctrl_c_leaves_a_partial_result_and_the_run_resumes(tmp_path, uninterrupted):
    folder = tmp_path / "run"
    process, completed = stopped_run(folder, signal.SIGINT, after=3)
    assert process.returncode == 130, process.stderr.read()[-3000:]
    partial = json.loads((folder / "partial_result.json").read_text())
    assert partial["status"].startswith("interrupted (Ctrl-C); its journal holds") and f"resume={folder}" in partial["status"]
    done = fedica_run(f"resume={folder}", f"hydra.run.dir={tmp_path / 'resume-log'}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert without_timings(folder) == without_timings(uninterrupted)


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_same_command_in_the_same_folder_goes_on_and_another_is_refused(tmp_path, uninterrupted):
    # Row 9 of issue 43: the same command again, without resume=, deleted the interrupted run's journal.
    folder = tmp_path / "run"
    process, completed = stopped_run(folder, signal.SIGKILL)
    other = fedica_run("seed=1", f"hydra.run.dir={folder}")
    assert other.returncode == 2 and stages(folder) == completed
    (line,) = other.stderr.strip().splitlines()
    assert f"{folder} holds the journal of an earlier run ({completed} completed stages); resume it" in line
    again = fedica_run(f"hydra.run.dir={folder}")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "holds this configuration's interrupted run: resuming it" in again.stdout + again.stderr
    assert without_timings(folder) == without_timings(uninterrupted)


@pytest.mark.slow
def test_a_journal_that_fails_a_check_on_replay_ends_the_run_in_one_line(tmp_path):
    # Row 7 of issue 43: an edit the digest check caught was a 29-line traceback.
    import numpy as np

    from fedica.protocol.journal import stage_file

    run = [*RUN, "algorithm.rounds=2", "baselines=false"]
    assert fedica_run(f"hydra.run.dir={tmp_path / 'whole'}", run=run).returncode == 0
    folder = tmp_path / "whole"
    (folder / "result.json").unlink()
    stage = folder / JOURNAL_DIR / stage_file(2)
    with np.load(stage, allow_pickle=False) as archive:
        members = {key: archive[key] for key in archive.files}
    meta = json.loads(str(members["meta"][()]))
    meta["digest"] = "0" * 64  # as if the protocol had been asked something else
    members["meta"] = np.array(json.dumps(meta))
    np.savez(stage, **members)
    done = fedica_run(f"resume={folder}", f"hydra.run.dir={tmp_path / 'resume-log'}", run=run)
    assert done.returncode == 2
    (line,) = [line for line in done.stderr.strip().splitlines() if line.startswith("fedica-run")]
    assert line.startswith("fedica-run: the journal cannot be resumed: journal stage 2") and "asked something else" in line
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_spherical_run_killed_mid_rounds_resumes_to_the_uninterrupted_result(tmp_path):
    """A spherical site's variances come back with every round's centroids: the resumed sites, fresh, compute the
    same rounds as the uninterrupted run's, which kept theirs."""
    run = [*RUN, "algorithm.covariance_type=spherical", "baselines=false"]
    whole = fedica_run(f"hydra.run.dir={tmp_path / 'whole'}", run=run)
    assert whole.returncode == 0, whole.stderr[-3000:]
    folder = tmp_path / "run"
    process, completed = stopped_run(folder, signal.SIGKILL, after=6, run=run)
    assert process.returncode == -signal.SIGKILL and 6 <= completed < 20
    done = fedica_run(f"resume={folder}", f"hydra.run.dir={tmp_path / 'resume-log'}", run=run)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"replaying its {completed} completed stages" in done.stdout + done.stderr
    assert without_timings(folder) == without_timings(tmp_path / "whole")


@pytest.mark.parametrize("overrides, reason", [
    (["engine=simulation"], "engine=simulation: its nodes say which site they are only in their replies")])
def test_a_run_whose_clients_or_nodes_cannot_be_replayed_to_is_refused_resume_in_one_line(tmp_path, overrides, reason):
    from fedica.server.app import compose_config

    from fedica.config import ConfigError, validate_config
    from fedica.protocol import Journal

    Journal.create(tmp_path, {})
    with pytest.raises(ConfigError) as err:
        validate_config(compose_config([*overrides, f"resume={tmp_path}"]))
    (line,) = err.value.errors
    assert line.startswith(f"resume={str(tmp_path)!r}: {reason}")


@pytest.mark.slow
def test_a_site_whose_file_changed_before_the_resume_is_named_and_the_resume_refused(tmp_path):
    # Row 8 of issue 43: a site's file changed between the kill and the resume gave exit 0, no warning, and a result
    # equal to neither uninterrupted run.
    import numpy as np

    rng = np.random.default_rng(0)
    paths = []
    for site in range(3):
        points = np.concatenate([rng.normal(0, 1, (60, 2)), rng.normal(8, 1, (60, 2))])
        paths.append(tmp_path / f"site{site}.csv")
        np.savetxt(paths[-1], points, delimiter=",", header="a,b", comments="")
    run = [sys.executable, "-m", "fedica", "engine=inprocess", "algorithm=fedgem", "scenario=files",
           f"scenario.paths=[{','.join(map(str, paths))}]", "scenario.n_components=2", "algorithm.rounds=3"]
    folder = tmp_path / "run"
    assert fedica_run(f"hydra.run.dir={folder}", run=run).returncode == 0
    whole = without_timings(folder)
    (folder / "result.json").unlink()  # as if killed before its result: every stage is in the journal
    original = paths[1].read_text()
    lines = original.splitlines()
    paths[1].write_text("\n".join([*lines[:5], "0.5,0.5", *lines[6:]]) + "\n")  # one row of site 1 edited
    done = fedica_run(f"resume={folder}", f"hydra.run.dir={tmp_path / 'log'}", run=run)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    (line,) = [line for line in done.stderr.strip().splitlines() if line.startswith("fedica-run")]
    assert line.startswith("fedica-run: the journal cannot be resumed: the data of site 1 changed since the run began")
    assert not (folder / "result.json").exists()
    paths[1].write_text(original)  # the site's own data again: the run goes on to its result
    done = fedica_run(f"resume={folder}", f"hydra.run.dir={tmp_path / 'log2'}", run=run)
    assert done.returncode == 0, done.stderr[-3000:]
    assert without_timings(folder) == whole
