"""One client's data for a scenario config: the dispatch from ``scenario.name`` to its generator or loader.

Every client builds only its own share, deterministically from ``(seed, partition_id)``. The global structure of
a scenario (cluster centres, which clusters each client holds, client shares, the generated or loaded data set
and its train/test split) depends on ``seed`` only, so a client generated alone gets exactly the data it would
get if all clients were generated together.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping, Sequence

from fedica.data.blobs import blobs_client_data
from fedica.data.classes import digits_client_data, waveform_client_data
from fedica.data.common import ClientData
from fedica.data.files import load_client_file
from fedica.validation import check_partition, check_seed

SCENARIO_NAMES = ("blobs", "waveform", "digits", "files")
ICA_SCENARIO = "ica_paper"  # RF-ICA's scenario (fedica.data.ica_paper); the names above are FedGEM's


_SCENARIO_KEYS = {
    "blobs": ("n_clients", "n_clusters", "dim", "r_min", "n_train", "n_test", "setting", "k_min", "k_max"),
    "waveform": ("n_clients", "n_samples", "test_fraction", "k_min", "k_max"),
    "digits": ("n_clients", "test_fraction", "k_min", "k_max"),
    "files": ("paths", "label_column", "n_components", "test_fraction"),
}


def _freeze(value):
    """Hashable copy of a config value (lists, e.g. OmegaConf ListConfig, become tuples)."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(key), _freeze(item)) for key, item in value.items()))
    if isinstance(value, Sequence) and not isinstance(value, str):
        return tuple(_freeze(item) for item in value)
    return value


def _scenario_key(scenario: Mapping) -> tuple[str, tuple]:
    if not isinstance(scenario, Mapping) or "name" not in scenario:
        raise ValueError(f"scenario must be a mapping with a 'name' key, one of {SCENARIO_NAMES}")
    name = scenario["name"]
    if name not in _SCENARIO_KEYS:
        raise ValueError(f"unknown scenario name {name!r}; known names: {SCENARIO_NAMES}")
    unknown = sorted(set(scenario) - {"name", *_SCENARIO_KEYS[name]})
    if unknown:
        raise ValueError(f"scenario {name!r} has unknown keys {unknown}; its keys are {_SCENARIO_KEYS[name]}")
    return name, tuple((key, _freeze(scenario[key])) for key in _SCENARIO_KEYS[name] if key in scenario)


def _file_stamp(path) -> tuple | None:
    """Part of the cache key of a file scenario, so an edited file is re-read."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def scenario_client_data(scenario: Mapping, partition_id: int, seed: int) -> ClientData:
    """One client's data for a scenario config (docs/INTERFACE.md section 2, ``scenario=...``).

    Parameters
    ----------
    scenario : Mapping
        ``name`` in {"blobs", "waveform", "digits", "files"} plus that scenario's keys; missing keys take the
        defaults of the matching ``*_client_data`` function. ``files`` needs ``paths`` (one per client);
        its ``n_components`` may be an int, a list (one per client) or None. Unknown keys are an error.
    partition_id : int
        Client index.
    seed : int

    Returns
    -------
    ClientData
        A fresh copy: results are cached per process (keyed by the scenario, the client and the seed; for files
        also the file's modification time and size), so repeated calls cost one copy.
    """
    name, items = _scenario_key(scenario)
    stamp = None
    if name == "files":
        paths = dict(items).get("paths", ())
        if 0 <= partition_id < len(paths):
            stamp = _file_stamp(paths[partition_id])
    data = _cached_client_data(name, items, int(partition_id), check_seed(seed), stamp)
    return dataclasses.replace(
        data,
        X_train=data.X_train.copy(), X_test=data.X_test.copy(),
        y_train=None if data.y_train is None else data.y_train.copy(),
        y_test=None if data.y_test is None else data.y_test.copy(),
    )


@functools.lru_cache(maxsize=512)
def _cached_client_data(name: str, items: tuple, partition_id: int, seed: int, _stamp) -> ClientData:
    params = dict(items)
    if name == "blobs":
        missing = [key for key in _SCENARIO_KEYS["blobs"][:6] if key not in params]
        if missing:
            raise ValueError(f"scenario 'blobs' needs keys {missing}")
        return blobs_client_data(partition_id, seed=seed, **params)
    if name == "waveform":
        return waveform_client_data(partition_id, seed=seed, **params)
    if name == "digits":
        return digits_client_data(partition_id, seed=seed, **params)
    paths = params.get("paths") or ()
    if not paths:
        raise ValueError("scenario 'files' needs a non-empty 'paths' list (one file per client)")
    check_partition(partition_id, len(paths))
    n_components = params.get("n_components")
    if isinstance(n_components, tuple):
        if len(n_components) != len(paths):
            raise ValueError(f"scenario 'files': n_components has {len(n_components)} entries for "
                             f"{len(paths)} paths; give one per client, one int, or null")
        n_components = n_components[partition_id]
    return load_client_file(paths[partition_id], label_column=params.get("label_column"),
                            n_components=n_components, test_fraction=params.get("test_fraction", 0.3),
                            seed=seed)


def true_n_clusters(scenario: Mapping) -> int | None:
    """The true number of clusters K of a scenario: ``n_clusters`` for blobs, 3 waveform, 10 digits, None files."""
    name, items = _scenario_key(scenario)
    if name == "blobs":
        return int(dict(items)["n_clusters"])
    return {"waveform": 3, "digits": 10, "files": None}[name]
