"""fedica-deploy exits 1 with one line whenever the run did not finish as finished:completed (issue 26, item 3).

``flwr run`` itself exits 0 whatever became of the run, so the launcher's exit status is the only
one that tells; the deployment itself is stubbed out here (tests/scripts/test_deployment.py runs real ones).
"""

from __future__ import annotations

import pytest
from fedica.scripts.deploy import cli
from fedica.scripts.deploy.errors import RunFailed

RFICA = ["scenario.n_clients=3", "scenario.n_normal=2000", "scenario.n_corrupt=200", "scenario.r=3"]


@pytest.mark.parametrize("status, details", [
    ("finished:failed", "ServerApp failed with exception: Error composing config:\n  scenario.n_clients must be\n positive"),
    ("finished:stopped", ""),
    ("running", "did not finish within 5 s (engine.run_timeout); stopped"),
])
def test_a_run_that_did_not_complete_exits_1_with_one_line(monkeypatch, capsys, tmp_path, status, details):
    def failing_run(cfg):
        raise RunFailed(7, status, details, tmp_path / "run-7.serverapp.log")

    monkeypatch.setattr(cli, "run_deployment", failing_run)
    assert cli.main(RFICA + ["--out-dir", str(tmp_path / "out")]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"fedica-deploy: the run failed: run 7 ended as {status}")
    assert " ".join(details.split()) in line
