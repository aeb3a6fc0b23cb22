"""An ordinary ``fedica-run`` on Flower's simulation engine prints fedica's lines, not Ray's or Flower's (issue 13, item 8).

The patterns are the noise a bare ``flwr.simulation.run_simulation`` prints on this Flower and
Ray: Flower's deprecation banner and log lines, Ray's accelerator FutureWarning, the client
actors' forwarded output and Ray's note on deduplicating it. The run has one client that fails
where it runs, so that the quiet settings are seen not to hide a real client error: fedica's
server still says which client failed and why.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import pytest

# Every test here reads the runs that its module's fixtures start as real processes.
pytestmark = pytest.mark.slow

NOISE = {
    "Flower's deprecation banner": re.compile(r"DEPRECATED FEATURE|This is a deprecated feature"),
    "a Flower log line": re.compile(r"^(\x1b\[\d+m)?(DEBUG|INFO|WARNING) *(\x1b\[0m)? *:", re.MULTILINE),
    "Ray's accelerator FutureWarning": re.compile(r"FutureWarning|In future versions of Ray"),
    "a client actor's forwarded output": re.compile(r"\(ClientAppActor pid=\d+\)|\(raylet\)|\(pid=\d+\)"),
    "Ray's log deduplication note": re.compile(r"\[repeated \d+x across cluster\]|RAY_DEDUP_LOGS"),
    "Ray's start-up lines": re.compile(r"Started a local Ray instance|Connecting to existing Ray cluster|Usage stats"),
    "a Python warning's source line": re.compile(r"^\s+warnings\.warn\(", re.MULTILINE),
    "the database's log line (alembic's plugins, on Flower's state import)": re.compile(r"\]\[(alembic|sqlalchemy)[\w.]*\]\["),
}
QUIETING_VARIABLES = ("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "RAY_DEDUP_LOGS", "FLWR_TELEMETRY_ENABLED", "FLWR_TELEMETRY_LOGGING")


@pytest.fixture(scope="module")
def broken_site_run(tmp_path_factory):
    """A FedGEM simulation (Ray) over three unlabelled files, one client of which fails inside its Ray worker.

    Every file is checked before the run starts, so the failure is one the check cannot see: the
    hostile client of a ``split_components`` attack needs known labels to plant its centroids, and
    these files have none, so it raises where it runs.
    """
    folder = tmp_path_factory.mktemp("quiet")
    rng = np.random.default_rng(0)
    paths = []
    for site in range(3):
        labels = np.arange(60) % 2
        paths.append(folder / f"site{site}.csv")
        np.savetxt(paths[-1], rng.standard_normal((60, 2)) + 8 * labels[:, None], delimiter=",", fmt="%.6f")
    overrides = ["algorithm=fedgem", "scenario=files", f"scenario.paths=[{','.join(map(str, paths))}]",
                 "scenario.n_components=2", "attack=split_components", "attack.fraction=0.34", "baselines=false",
                 "algorithm.rounds=2", "engine=simulation"]
    # fedica's own settings, not the caller's, decide what Ray and Flower print.
    env = {k: v for k, v in os.environ.items() if k not in QUIETING_VARIABLES}
    ray_dir = tempfile.mkdtemp(prefix="fedica-ray-")  # short: Ray's socket paths live under it
    try:
        yield subprocess.run([sys.executable, "-m", "fedica", *overrides, f"hydra.run.dir={folder / 'run'}"],
                             capture_output=True, text=True, timeout=300, env={**env, "RAY_TMPDIR": ray_dir}, cwd=folder)
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)


@pytest.mark.parametrize("stream", ["stderr", "stdout"])
def test_a_simulation_prints_no_ray_or_flower_noise(broken_site_run, stream):
    text = getattr(broken_site_run, stream)
    found = {what: pattern.search(text).group(0) for what, pattern in NOISE.items() if pattern.search(text)}
    assert found == {}, text[-3000:]


def test_a_simulation_prints_fedicas_result_and_the_failing_client(broken_site_run):
    assert broken_site_run.returncode == 0, broken_site_run.stderr[-3000:]
    printed = broken_site_run.stdout + broken_site_run.stderr
    assert "fedgem on files (engine simulation, seed 0, attack split_components" in broken_site_run.stdout
    assert "clients: 2 of 3 answered" in broken_site_run.stdout
    assert re.search(r"^result: .*result\.json$", broken_site_run.stdout, re.MULTILINE)
    # The failing client's error, raised inside a Ray worker whose own output Ray does not forward.
    assert re.search(r"client \d, round init: reply rejected: client error: .*needs a scenario with known labels",
                     printed), printed[-3000:]
