"""The files a run writes: ``result.json`` and ``summary.txt``, and beside them the sites' labels (FedGEM) or sources (RF-ICA).

The sites' files are read on this machine, so only for engines that run every site here (not a
deployment, whose sites keep their files); nothing is sent over the federation for them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedica.data.scenarios import file_site_points, ica_scenario_data
from fedica.fedgem.client import result_labels
from fedica.persistence import write_atomic
from fedica.results import RESULT_FILE, SUMMARY_FILE, format_summary, write_json_atomic

log = logging.getLogger("fedica.server")

SOURCES_FILE = "sources_site{site}.csv"


def write_result(out_dir: str | os.PathLike, result: Mapping[str, Any], *, name: str = RESULT_FILE) -> Path:
    """Write ``result.json`` (atomically; or ``name``) and ``summary.txt`` into ``out_dir``."""
    out_dir = Path(out_dir)
    labels = write_site_labels(result, out_dir) if name == RESULT_FILE else []
    if labels:
        result = {**result, "fedgem": {**result["fedgem"], "labels_files": labels}}
    # The summary first, and atomically: result.json, written last, is what marks a run complete (a sweep
    # skips it), so a disk that fills up between the two never leaves a complete result beside no summary.
    write_atomic(out_dir / SUMMARY_FILE, lambda handle: handle.write((format_summary(result) + "\n").encode()))
    return write_json_atomic(out_dir / name, result)


def run_output_dir() -> Path:
    """Where result.json goes: Hydra's run folder under fedica-run, else ``$FEDICA_OUT``, else the working folder."""
    fallback = Path(os.environ.get("FEDICA_OUT") or ".")
    try:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return fallback
        return Path(HydraConfig.get().runtime.output_dir or fallback)
    except Exception as err:  # noqa: BLE001 - Hydra's compose API (flwr run) sets no run folder
        log.debug("no Hydra run folder (%s); files go to %s", err, fallback)
        return fallback


def write_site_labels(result: Mapping[str, Any], out_dir: str | os.PathLike) -> list[str]:
    """Every site's rows labelled as the site labels its points: ``labels_site<g>.csv`` (``row,cluster``) in ``out_dir``.

    For a FedGEM run on ``scenario=files``: ``row`` counts the file's data rows from 0 (a header is
    not a row), ``cluster`` is the global cluster id, as in ``fedgem.global_centroids``. Each site's
    rows are labelled by the run's ``labelling``, in the units the sites clustered in (the scenario's
    ``standardize``, then the federation's): ``consensus``, the nearest of the site's consensus
    centroids; ``adapted``, the most probable global cluster under the site's own mixture over every
    global centre, fitted to all of the file's rows (as the library's ``labels_`` are). The files are
    read here, so only where every site's file is on this machine (not a deployment, whose sites keep
    their files and labels). Returns the files written (none for other runs).
    """
    scenario = result["scenario"]
    if result["algorithm"] != "fedgem" or scenario["name"] != "files" or result["engine"] == "deployment":
        return []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for partition, global_ids in sorted(result["fedgem"]["client_mapping"].items(), key=lambda item: int(item[0])):
        X = file_site_points(scenario, int(partition))[0]
        clusters = result_labels(X, X, result["fedgem"], result["config"]["algorithm"], global_ids)
        path = out_dir / f"labels_site{partition}.csv"
        np.savetxt(path, np.c_[np.arange(X.shape[0]), clusters], fmt="%d", delimiter=",", header="row,cluster", comments="")
        written.append(str(path))
    return written


def write_site_sources(scenario: Mapping[str, Any], unmixing: np.ndarray, seed: int, out_dir: str | os.PathLike
                       ) -> list[str]:
    """Write every site's recovered sources as ``sources_site<g>.csv`` in ``out_dir``.

    Site ``g``'s sources are ``(X_g - mean(X_g)) @ unmixing.T`` for its observations ``X_g`` of shape
    (n_g, r): each site is centred by its own mean, as its local FastICA was. Only for engines that run every
    site on this machine (the config refuses ``write_sources`` in a deployment), where the launcher can read
    the sites' files; nothing is sent over the federation for it.

    Parameters
    ----------
    scenario : mapping
        The run's ``scenario`` section (any RF-ICA scenario).
    unmixing : ndarray of shape (r, r)
    seed : int
    out_dir : str or os.PathLike

    Returns
    -------
    paths : list of str
        The files written, site by site; each has a header ``s0,...,s<r-1>`` and one row per sample.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    header = ",".join(f"s{i}" for i in range(unmixing.shape[0]))
    written = []
    for site in range(len(scenario["paths"]) if scenario["name"] == "files" else int(scenario["n_clients"])):
        X = ica_scenario_data(scenario, site, seed).T
        path = out_dir / SOURCES_FILE.format(site=site)
        np.savetxt(path, (X - X.mean(axis=0)) @ unmixing.T, delimiter=",", header=header, comments="", fmt="%.10g")
        written.append(str(path.resolve()))
    log.info("wrote the recovered sources of %d sites to %s", len(written), out_dir.resolve())
    return written
