"""The two tiers: ``-m "not slow"`` runs every module in minutes; ``.ci/run`` runs everything on both cores.

A test is ``slow`` when it starts another program: ``fedica-run`` or any Python in a subprocess, Flower's
SuperLink and SuperNodes, ``flwr run``, pip, or Ray (which Flower's simulation starts). The fast tier holds
that rule itself: a test not marked ``slow`` that starts one of those fails, naming the command, so a test
cannot drift into the wrong tier unseen.
"""

import os
import subprocess
import sys

import pytest

# The programs whose start makes a test slow: interpreters, our own and Flower's command lines, pip, and the
# processes Ray starts for a simulation. Anything else (a library asking `ldconfig` or `fc-list`) is left alone.
_SLOW_PROGRAMS = ("python", "fedica-", "flwr", "flower-", "pip", "ray", "raylet", "gcs_server")

_current_test = None  # the test whose setup, call or teardown runs now (a module fixture starts in its setup)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "slow: starts another program (a subprocess, Ray, a deployment, flwr run, pip); "
        "the fast tier is -m 'not slow'",
    )
    config.addinivalue_line(
        "markers",
        "deployment: starts real flower-superlink and flower-supernode processes on loopback (about two minutes); "
        "deselect with -m 'not deployment'",
    )
    config.addinivalue_line(
        "markers",
        "ray_cluster: starts a real two-node Ray cluster (two `ray start` processes) on this machine (about a minute); "
        "deselect with -m 'not ray_cluster'",
    )
    _guard_process_starts()


def pytest_collection_modifyitems(items):
    for item in items:  # a deployment or a Ray cluster starts processes by definition
        if item.get_closest_marker("deployment") or item.get_closest_marker("ray_cluster"):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _current_test
    _current_test = item
    try:
        return (yield)
    finally:
        _current_test = None


def _program(args) -> str:
    first = args if isinstance(args, (str, bytes, os.PathLike)) else next(iter(args), "")
    first = os.fsdecode(first).split()[0] if os.fsdecode(first).strip() else ""
    return os.path.basename(first)


def _guard_process_starts() -> None:
    original = subprocess.Popen.__init__

    def guarded(self, args, *rest, **kwargs):
        test = _current_test
        program = _program(args)
        if (test is not None and test.get_closest_marker("slow") is None
                and (program.startswith(_SLOW_PROGRAMS) or program == os.path.basename(sys.executable))):
            raise AssertionError(f"{test.nodeid} starts {program!r} but is not marked slow "
                                 "(@pytest.mark.slow: the fast tier starts no other program)")
        original(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = guarded
