"""One client's data for a scenario config: the dispatch from ``scenario.name`` to its generator or loader.

FedGEM's scenarios (:data:`SCENARIO_NAMES`) go through :func:`scenario_client_data`, RF-ICA's
(:data:`ICA_SCENARIOS`) through :func:`ica_scenario_data`, with the truth of each in :func:`true_n_clusters`
and :func:`ica_scenario_truth`; ``files`` serves both algorithms.

Every client builds only its own share, deterministically from ``(seed, partition_id)``. The global structure of
a scenario (cluster centres, which clusters each client holds, client shares, the generated or loaded data set
and its train/test split, the true mixing and which sites are poor) depends on ``seed`` only, so a client
generated alone gets exactly the data it would get if all clients were generated together.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping, Sequence

import numpy as np

from fedica.data.blobs import blobs_client_data
from fedica.data.classes import digits_client_data, waveform_client_data
from fedica.data.common import ClientData
from fedica.data.files import load_client_file, load_ica_file
from fedica.data.ica_paper import (
    ica_client_data,
    ica_corrupted_clients,
    ica_true_mixing,
)
from fedica.data.mnist import mnist_client_data
from fedica.data.signals import signals_client_data, signals_roles, signals_true_mixing
from fedica.validation import check_partition, check_seed

SCENARIO_NAMES = ("blobs", "waveform", "digits", "mnist", "files")  # FedGEM's
ICA_SCENARIO = "ica_paper"  # RF-ICA's default scenario (fedica.data.ica_paper)
ICA_SCENARIOS = (ICA_SCENARIO, "signals", "files")  # RF-ICA's


_SCENARIO_KEYS = {
    "blobs": ("n_clients", "n_clusters", "dim", "r_min", "n_train", "n_test", "setting", "k_min", "k_max"),
    "waveform": ("n_clients", "n_samples", "test_fraction", "k_min", "k_max"),
    "digits": ("n_clients", "test_fraction", "k_min", "k_max"),
    "mnist": ("n_clients", "test_fraction", "k_min", "k_max"),
    "files": ("paths", "label_column", "n_components", "test_fraction", "write_sources"),
}

_ICA_SCENARIO_KEYS = {
    "ica_paper": ("n_clients", "r", "corrupt_ratio", "n_normal", "n_corrupt", "sparsity", "orthogonal"),
    "signals": ("n_clients", "r", "n_samples", "n_noisy", "noise_level", "n_short", "short_samples", "orthogonal"),
    "files": _SCENARIO_KEYS["files"],
}


def _freeze(value):
    """Hashable copy of a config value (lists, e.g. OmegaConf ListConfig, become tuples)."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(key), _freeze(item)) for key, item in value.items()))
    if isinstance(value, Sequence) and not isinstance(value, str):
        return tuple(_freeze(item) for item in value)
    return value


def _scenario_key(scenario: Mapping, table: Mapping[str, tuple] = _SCENARIO_KEYS) -> tuple[str, tuple]:
    """The scenario's name and its known items (hashable); ``table`` holds FedGEM's or RF-ICA's schemas."""
    names = tuple(table)
    if not isinstance(scenario, Mapping) or "name" not in scenario:
        raise ValueError(f"scenario must be a mapping with a 'name' key, one of {names}")
    name = scenario["name"]
    if name not in table:
        raise ValueError(f"unknown scenario name {name!r}; known names: {names}")
    unknown = sorted(set(scenario) - {"name", *table[name]})
    if unknown:
        raise ValueError(f"scenario {name!r} has unknown keys {unknown}; its keys are {table[name]}")
    return name, tuple((key, _freeze(scenario[key])) for key in table[name] if key in scenario)


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
        ``name`` in {"blobs", "waveform", "digits", "mnist", "files"} plus that scenario's keys; missing keys
        take the defaults of the matching ``*_client_data`` function. ``files`` needs ``paths`` (one per client);
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


# Every message to a client needs its data, and one process serves all the clients (the in-process engine) or
# any of them (a Ray actor). The cache must hold a whole federation: at 512 entries a 1,000-client run visited
# in turn never hit it and regenerated each client's data for every message (about 1 ms each at 500 points).
CLIENT_CACHE_SIZE = 4096


@functools.lru_cache(maxsize=CLIENT_CACHE_SIZE)
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
    if name == "mnist":
        return mnist_client_data(partition_id, seed=seed, **params)
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
    """The true number of clusters K of a scenario: ``n_clusters`` for blobs, 3 waveform, 10 digits and mnist,
    None files."""
    name, items = _scenario_key(scenario)
    if name == "blobs":
        return int(dict(items)["n_clusters"])
    return {"waveform": 3, "digits": 10, "mnist": 10, "files": None}[name]


# ---------------------------------------------------------------- RF-ICA's scenarios


def _ica_params(scenario: Mapping) -> tuple[str, dict]:
    name, items = _scenario_key(scenario, _ICA_SCENARIO_KEYS)
    params = dict(items)
    if name != "files":
        missing = [key for key in _ICA_SCENARIO_KEYS[name] if key not in params]
        if missing:
            raise ValueError(f"scenario {name!r} needs keys {missing}")
    return name, params


def ica_scenario_data(scenario: Mapping, partition_id: int, seed: int) -> np.ndarray:
    """One RF-ICA site's observations for a scenario config.

    Parameters
    ----------
    scenario : Mapping
        ``name`` in :data:`ICA_SCENARIOS` plus all of that scenario's keys (``files``: ``paths``, and
        ``label_column``, a column dropped from the channels; its other keys are FedGEM's or the server's).
    partition_id : int
        Site index.
    seed : int

    Returns
    -------
    Y : ndarray of shape (r, n_k)
        One column per sample. A fresh copy: results are cached per process (for files keyed also by the
        file's modification time and size).

    Raises
    ------
    ValueError
        For an unknown name or key, a missing key, a bad partition id; for files a
        :class:`fedica.data.files.DataFileError` naming the file and the problem.
    """
    name, params = _ica_params(scenario)
    stamp = None
    if name == "files":
        paths = params.get("paths") or ()
        if not paths:
            raise ValueError("scenario 'files' needs a non-empty 'paths' list (one file per site)")
        check_partition(partition_id, len(paths))
        params = {"path": paths[partition_id], "label_column": params.get("label_column")}
        stamp, seed = _file_stamp(params["path"]), 0  # a file does not depend on the seed
    items = tuple(sorted(params.items()))
    return _cached_ica_data(name, items, int(partition_id), check_seed(seed), stamp).copy()


@functools.lru_cache(maxsize=8)
def _cached_ica_data(name: str, items: tuple, partition_id: int, seed: int, _stamp) -> np.ndarray:
    params = dict(items)
    if name == "files":
        return load_ica_file(params["path"], label_column=params["label_column"]).T
    make = ica_client_data if name == ICA_SCENARIO else signals_client_data
    return make(partition_id, seed=seed, **params)


def ica_scenario_truth(scenario: Mapping, seed: int) -> np.ndarray | None:
    """The true mixing ``A*`` of an RF-ICA scenario, shape (r, r); None for files (no ground truth)."""
    name, params = _ica_params(scenario)
    if name == "files":
        return None
    truth = ica_true_mixing if name == ICA_SCENARIO else signals_true_mixing
    return truth(r=params["r"], orthogonal=params["orthogonal"], seed=seed)


def ica_poor_sites(scenario: Mapping, seed: int) -> dict[str, list[int]] | None:
    """The sites an RF-ICA scenario makes poor on purpose, by kind; None for files (unknown).

    Returns
    -------
    dict or None
        ica_paper: ``{"corrupted": [...]}`` (few samples); signals: ``{"noisy": [...], "short": [...]}``.
    """
    name, params = _ica_params(scenario)
    if name == "files":
        return None
    if name == ICA_SCENARIO:
        mask = ica_corrupted_clients(n_clients=params["n_clients"], corrupt_ratio=params["corrupt_ratio"], seed=seed)
        return {"corrupted": np.flatnonzero(mask).tolist()}
    noisy, short = signals_roles(n_clients=params["n_clients"], n_noisy=params["n_noisy"],
                                 n_short=params["n_short"], seed=seed)
    return {"noisy": np.flatnonzero(noisy).tolist(), "short": np.flatnonzero(short).tolist()}
