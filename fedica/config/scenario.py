"""The ``scenario`` section: each scenario's keys and rules come from its registry entry.

:data:`fedica.data.scenarios.SCENARIOS` holds, per scenario, its keys, its rules (by algorithm), and how much
memory its generated data takes; this module applies them, refuses a federation no engine here can hold, and,
for ``files``, checks the data files on the engines that read them on this machine.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedica.config.checker import Checker, ConfigError
from fedica.data.files import DataFileError
from fedica.data.scenarios import ICA_SCENARIOS, SCENARIO_NAMES, SCENARIOS, ica_scenario_data

__all__ = ["SCENARIO_KEYS", "SCENARIOS_BY_ALGORITHM", "MAX_CLIENTS", "MEMORY_SHARE", "check_scenario",
           "check_affordable", "check_files_engine", "client_count"]

SCENARIOS_BY_ALGORITHM = {"rfica": ICA_SCENARIOS, "fedgem": SCENARIO_NAMES}
# The keys of conf/scenario/<name>.yaml besides ``name``.
SCENARIO_KEYS: dict[str, tuple[str, ...]] = {name: scenario.keys for name, scenario in SCENARIOS.items()}

# The largest federations fedica's engines hold (every client has a context and its data in one
# process of the in-process engine).
MAX_CLIENTS = 100_000
# A generated scenario may take at most this share of the machine's memory.
MEMORY_SHARE = 0.5


def client_count(scenario: Mapping[str, Any]) -> int:
    """Number of clients a scenario defines.

    Parameters
    ----------
    scenario : mapping
        The ``scenario`` section of a run configuration.

    Returns
    -------
    n_clients : int
    """
    if scenario["name"] == "files":
        return len(scenario["paths"])
    return int(scenario["n_clients"])


def check_scenario(sc: Checker, algorithm: str) -> None:
    """The rules of the section's scenario as ``algorithm`` reads it (the scenario serves that algorithm)."""
    SCENARIOS[sc.get("name")].checks[algorithm](sc)


def check_affordable(sc: Checker, n_clients: int) -> None:
    """Refuse a scenario no engine here can hold before anything starts (instead of a MemoryError or a hang)."""
    if n_clients > MAX_CLIENTS:
        sc.fail("n_clients", f"{n_clients} clients are more than fedica's engines hold (at most {MAX_CLIENTS})")
    scenario = SCENARIOS[sc.get("name")]
    if scenario.data_values is None:
        return
    needed, available = 8 * scenario.data_values(sc.section, n_clients), MEMORY_SHARE * _physical_memory()
    if needed > available:
        sc.fail(scenario.memory_key, f"the scenario's data would take {needed / 2**30:.1f} GiB, more than half of "
                                     f"this machine's memory ({available / 2**30:.1f} GiB)")


def _physical_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not POSIX: no limit known, none imposed
        return math.inf


def check_files_engine(sc: Mapping[str, Any], algorithm: str, engine: str, ray_address: str | None) -> None:
    """The data files are there (and for RF-ICA readable, with one channel count) on local engines."""
    if ray_address is not None:  # a cluster's workers are not this user's local clients (clients/app.py)
        raise ConfigError(f"engine.ray_address={ray_address!r}: scenario=files runs on this machine's own Ray only; "
                          "on several machines use engine=deployment, each SuperNode with its own data-path")
    if sc["write_sources"] and engine == "deployment":
        raise ConfigError("scenario.write_sources=true: sources are written only by engines that run every site "
                          "on this machine (inprocess, simulation); in a deployment each site holds its own data")
    if engine == "deployment":
        return
    _check_local_files(sc["paths"])
    if algorithm == "rfica":
        _check_ica_channels(sc)


def _check_ica_channels(sc: Mapping[str, Any]) -> None:
    """Every RF-ICA site's file reads as observations, and all have the first one's number of channels.

    This reads the files (cached: the sites of an in-process run reuse what was read), so a malformed file or
    a site with other channels stops the run before it starts, with one line.
    """
    width = None
    for index, path in enumerate(sc["paths"]):
        try:
            n_channels = ica_scenario_data(sc, index, 0).shape[0]
        except DataFileError as err:
            raise ConfigError(f"scenario.paths[{index}]: {err}") from None
        width = n_channels if width is None else width
        if n_channels != width:
            raise ConfigError(f"scenario.paths[{index}]={path}: has {n_channels} channels (columns) but "
                              f"scenario.paths[0] has {width}; every site must observe the same channels")


def _check_local_files(paths: Sequence[str]) -> None:
    """Every client's file exists here, so that a misspelt path stops the run before it starts (local engines
    only: in a deployment each SuperNode reads its own ``data-path``, maybe on another machine)."""
    for index, path in enumerate(paths):
        location = Path(path)
        if location.is_dir():
            raise ConfigError(f"scenario.paths[{index}]={path}: is a directory, not a data file")
        if not location.is_file():
            raise ConfigError(f"scenario.paths[{index}]={path}: no such file")
