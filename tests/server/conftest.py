"""A real local SuperLink for the tests that run ``flwr run`` (``flwr_env``), and their ``flwr_run`` mark.

Each such test gets its own ``FLWR_HOME`` and free ports on 127.0.0.1; the SuperLink that the
first ``flwr run`` starts is stopped afterwards by the id of the process that listens on its port.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest
from fedica.scripts.deploy import processes
from local_ports import free_ports

FLWR_RUN_MARK = "flwr_run"


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        f"{FLWR_RUN_MARK}: starts a local SuperLink and runs `flwr run` on Flower's simulation runtime (about 20-40 s a run); "
        f"deselect with -m 'not {FLWR_RUN_MARK}'",
    )


def pytest_collection_modifyitems(items):
    # Marked by what they use, so that no test which starts a SuperLink escapes the mark.
    for item in items:
        if "flwr_env" in getattr(item, "fixturenames", ()):
            item.add_marker(FLWR_RUN_MARK)


def listening_pid(port):
    """The id of the process that listens on TCP ``port`` (Linux: /proc/net/tcp and the processes' sockets), or None."""
    sockets = {f"socket:[{fields[9]}]" for fields in (line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:])
               if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port}
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in sockets for fd in fd_dir.iterdir()):
                return int(fd_dir.parent.name)
    return None


def stop_tree(pid, timeout=30.0):
    """SIGTERM ``pid`` and what it started; whatever is left after ``timeout`` gets SIGKILL."""
    tree = processes.descendants([pid], processes.process_table())
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for each in sorted(tree):
            with contextlib.suppress(ProcessLookupError):
                os.kill(each, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            table = processes.process_table()
            if all(each not in table or table[each][2] == "Z" for each in tree):
                return
            time.sleep(0.2)


@pytest.fixture
def flwr_env(tmp_path):
    """``flwr``'s environment with its own FLWR_HOME and local SuperLink port; that SuperLink is stopped afterwards."""
    if not Path("/proc/net/tcp").exists():
        pytest.skip("finding the local SuperLink by its port reads /proc (Linux)")
    port = free_ports()
    ray_tmp = tempfile.mkdtemp(prefix="fedica-ray-")  # short: Ray's socket paths have a length limit
    # What earlier tests left in this process's environment (fedica's engine switch, Ray's and Python's settings) stays out.
    inherited = {k: v for k, v in processes.flower_environment(tmp_path / "flwr-home").items()
                 if not k.startswith(("FEDICA_", "RAY_", "HYDRA_", "PYTHONPATH", "PYTHONHOME"))}
    # The SuperLink's processes import the installed fedica, as a user's do. Not a checkout on PYTHONPATH: there
    # fedica.server and fedica.clients come from fedica's __path__, extended while the package initialises, and
    # Flower's simulation loads the ServerApp and the ClientApp in two threads at once, so the ClientApp's thread
    # could look for fedica.clients before the extension (CI: ModuleNotFoundError: No module named 'fedica.clients').
    env = {**inherited, "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(port),
           "FLWR_LOCAL_CONTROL_API_PORT": str(free_ports()), "RAY_TMPDIR": ray_tmp, "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}
    try:
        yield env
    finally:
        pid = listening_pid(port)
        if pid is not None:
            stop_tree(pid)
        shutil.rmtree(ray_tmp, ignore_errors=True)
