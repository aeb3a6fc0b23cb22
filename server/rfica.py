"""``RFICAStrategy``: RF-ICA as a Flower strategy, and fedica's RF-ICA run (the result it writes)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from fedica.server.federation import Federation
from fedica.server.records import run_output_dir
from fedica.server.strategy import ProtocolStrategy
from flwr.app import Array, ArrayRecord

from fedica.data.scenarios import ica_poor_sites, ica_scenario_data, ica_scenario_truth
from fedica.evaluation.ica import ica_error
from fedica.parameters import RFICA_PARAMETERS as _P
from fedica.rfica.server import RFICAState, rfica_protocol

METHODS = ("rf-ica", "f-ica", "simple-mean", "simple-median")
SOURCES_FILE = "sources_site{site}.csv"

log = logging.getLogger("fedica.server")


class RFICAStrategy(ProtocolStrategy):
    """RF-ICA (one-shot robust federated ICA) as a Flower ``Strategy``.

    The clients must run a ClientApp that answers fedica's RF-ICA task, e.g.
    ``fedica.clients.make_client_app(load_data)``. ``start(grid)`` asks every client for its
    local FastICA estimate once, then aggregates them robustly: the same numerical path as
    :class:`fedica.RFICA`. The Result's ``arrays`` hold ``mixing`` and ``unmixing``.

    Parameters
    ----------
    contrast, init, benchmark, kmeans_restarts, gm_tol, random_state
        As for :class:`fedica.RFICA`: declared in :data:`fedica.parameters.RFICA_PARAMETERS`, and checked
        against it here (``ValueError`` or ``TypeError`` naming the parameter).
    r : int or None, default=None
        The number of channels; None: the one most clients report.
    min_available_nodes, min_clients, node_wait_timeout, client_config
        As for :class:`fedica.server.strategy.ProtocolStrategy`.

    Attributes
    ----------
    mixing_, components_ : ndarray of shape (r, r)
    state : RFICAState
        Everything the run computed (estimates, partitions, the aggregate and its comparators).
    """

    # The defaults and rules are fedica.parameters.RFICA_PARAMETERS', as for fedica.RFICA.
    def __init__(self, *, contrast: str = _P["contrast"].default, init: str = _P["init"].default,
                 benchmark: str = _P["benchmark"].default, kmeans_restarts: int = _P["kmeans_restarts"].default,
                 gm_tol: float = _P["gm_tol"].default, random_state: int = _P["random_state"].default,
                 r: int | None = None, **kwargs: Any):
        # At construction: a bad value is one line now, not a failure once the clients have answered.
        _P.check(dict(contrast=contrast, init=init, benchmark=benchmark, kmeans_restarts=kmeans_restarts,
                      gm_tol=gm_tol, random_state=random_state))
        super().__init__(**kwargs)
        self.contrast, self.init, self.benchmark = contrast, init, benchmark
        self.kmeans_restarts, self.gm_tol, self.random_state, self.r = kmeans_restarts, gm_tol, int(random_state), r
        self.state: RFICAState | None = None

    def protocol(self):
        self.state = RFICAState(contrast=self.contrast, init=self.init, benchmark=self.benchmark,
                                kmeans_restarts=self.kmeans_restarts, gm_tol=self.gm_tol, seed=self.random_state,
                                min_clients=self.min_clients, r=self.r, rejected=self.federation.rejected)
        return rfica_protocol(self.state)

    def model_arrays(self) -> ArrayRecord:
        if self.state is None or self.state.aggregate is None:
            return ArrayRecord()
        return ArrayRecord({"mixing": Array(np.ascontiguousarray(self.mixing_)),
                            "unmixing": Array(np.ascontiguousarray(self.components_))})

    @property
    def mixing_(self) -> np.ndarray:
        return self.state.aggregate.rf_ica

    @property
    def components_(self) -> np.ndarray:
        return np.linalg.pinv(self.state.aggregate.rf_ica)


def run_rfica(federation: Federation, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """fedica's RF-ICA run: the strategy, then every method scored against the scenario's A* (if it has one).

    Returns
    -------
    partial_result : dict
        The ``metrics``, ``clients``, ``timings`` and ``rfica`` entries of the result. Without a ground truth
        (scenario ``files``) every ``error`` and ``rfica.true_mixing`` are None. ``rfica.estimate`` is the
        aggregated mixing matrix, ``rfica.unmixing`` its inverse; with ``scenario.write_sources`` the sites'
        recovered sources are written (:func:`write_site_sources`) and ``rfica.sources_files`` lists them.
    """
    sc, alg, seed = cfg["scenario"], cfg["algorithm"], int(cfg["seed"])
    strategy = RFICAStrategy(contrast=alg["contrast"], init=alg["init"], benchmark=alg["benchmark"],
                             kmeans_restarts=alg["kmeans_restarts"], gm_tol=alg["gm_tol"], random_state=seed,
                             r=sc.get("r"), min_available_nodes=federation.expected, min_clients=federation.min_clients,
                             client_config=federation.common_values)
    strategy.start(federation.grid, timeout=federation.round_timeout, federation=federation)
    state = strategy.state
    aggregate = state.aggregate
    truth = ica_scenario_truth(sc, seed)
    estimates_by_method = {"rf-ica": aggregate.rf_ica, "f-ica": aggregate.f_ica,
                           "simple-mean": aggregate.simple_mean, "simple-median": aggregate.simple_median}
    metrics = {name: {"error": None if truth is None else ica_error(estimate, truth)}
               for name, estimate in estimates_by_method.items()}
    clients_sum = float(np.sum(state.client_seconds))
    # Every method starts from the same local estimates (the clients' work), then takes its own server step.
    fit_seconds = {name: clients_sum + aggregate.method_seconds[name] for name in METHODS}
    poor = ica_poor_sites(sc, seed)
    rfica = {
        "benchmark_client": state.partitions[aggregate.benchmark],
        "estimate": aggregate.rf_ica,
        "unmixing": strategy.components_,
        "estimates": estimates_by_method,
        "true_mixing": truth,
        "client_partitions": state.partitions,
        "n_samples": state.n_samples,
        # The sites the scenario makes poor on purpose (all kinds together), None when unknown.
        "corrupted_clients": None if poor is None else sorted(g for sites in poor.values() for g in sites),
        "poor_sites": poor,
        "hostile_clients": federation.hostile_partitions,
        "participation": federation.participation,
    }
    if sc.get("write_sources"):
        rfica["sources_files"] = write_site_sources(sc, strategy.components_, seed, run_output_dir())
    return {
        "metrics": metrics,
        "clients": federation.clients_record(len(state.estimates)),
        "timings": {**fit_seconds, "clients_sum": clients_sum, "server": state.server_seconds},
        "rfica": rfica,
    }


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
