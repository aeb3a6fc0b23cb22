"""fedica-superlink's bound on a site's reply, for real: a ``bloated_reply`` SuperNode's reply (an extra 32 MiB array
and a 20 MB error text) is refused by the SuperLink before Flower stores it, the ServerApp records that site's reply
as missing, and the run completes with the two honest sites.

One real deployment: a SuperLink and three SuperNodes, RF-ICA (about a minute here).
"""

import json
import subprocess
import sys

import pytest
from local_ports import free_ports

from fedica.server.federation import UNAVAILABLE_HINT

pytestmark = pytest.mark.deployment


def test_a_bloated_reply_is_refused_at_the_superlink_and_the_run_goes_on(tmp_path):
    first = free_ports(1 + 3)  # the SuperLink and the scenario's three SuperNodes
    out_dir = tmp_path / "run"
    command = [sys.executable, "-c", "import sys; from fedica.scripts.deploy import main; sys.exit(main())",
               "algorithm=rfica", "scenario=ica_paper", "scenario.n_clients=3", "scenario.n_normal=500",
               "attack=bloated_reply", "attack.fraction=0.34", "baselines=false",
               "--max-reply-mib", "8", "--superlink-port", str(first), "--supernode-port", str(first + 1),
               "--out-dir", str(out_dir)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out_dir / "result.json").read_text())
    assert result["deployment"]["status"] == "finished:completed"
    assert result["rfica"]["hostile_clients"] == [2]
    [rejected] = result["clients"]["rejected"]
    assert rejected["client"] == 2 and rejected["round"] == 1
    assert UNAVAILABLE_HINT in rejected["reason"]
    assert result["clients"]["answered"] == 2
    superlink_log = (out_dir / "deployment" / "superlink.log").read_text(errors="replace")
    assert "refused /v1/fleet/push-object" in superlink_log and "--max-reply-mib" in superlink_log
    # Nothing of the bulk reached the books: the reason is Flower's short one, not the 20 MB text.
    assert len((out_dir / "result.json").read_bytes()) < 200_000
