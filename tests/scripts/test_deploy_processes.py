"""The launcher's signal handling leaves other processes interruptible."""

import signal
import subprocess
import sys

import pytest
from fedica.scripts.deploy import processes


def _ignored_signals(pid):
    with open(f"/proc/{pid}/status") as status:
        mask = next(int(line.split()[1], 16) for line in status if line.startswith("SigIgn:"))
    return {sig for sig in (signal.SIGINT, signal.SIGTERM) if mask & (1 << (sig - 1))}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/status")
@pytest.mark.slow
def test_a_process_started_during_the_shutdown_can_still_be_interrupted():
    with processes.uninterruptible():
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert _ignored_signals(child.pid) == set()
            assert signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
        finally:
            child.kill()
            child.wait()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
