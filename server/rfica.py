"""``RFICAStrategy``: RF-ICA as a Flower strategy, and fedica's RF-ICA run (the result it writes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from fedica.server.federation import Federation
from fedica.server.strategy import ProtocolStrategy
from flwr.app import Array, ArrayRecord

from fedica.data.ica_paper import ica_corrupted_clients, ica_true_mixing
from fedica.evaluation.ica import ica_error
from fedica.rfica.server import RFICAState, rfica_protocol

METHODS = ("rf-ica", "f-ica", "simple-mean", "simple-median")


class RFICAStrategy(ProtocolStrategy):
    """RF-ICA (one-shot robust federated ICA) as a Flower ``Strategy``.

    The clients must run a ClientApp that answers fedica's RF-ICA task, e.g.
    ``fedica.clients.make_client_app(load_data)``. ``start(grid)`` asks every client for its
    local FastICA estimate once, then aggregates them robustly: the same numerical path as
    :class:`fedica.RFICA`. The Result's ``arrays`` hold ``mixing`` and ``unmixing``.

    Parameters
    ----------
    contrast, init, benchmark, kmeans_restarts, gm_tol, random_state
        As for :class:`fedica.RFICA`.
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

    def __init__(self, *, contrast: str = "cube", init: str = "random", benchmark: str = "largest",
                 kmeans_restarts: int = 10, gm_tol: float = 1e-10, random_state: int = 0, r: int | None = None,
                 **kwargs: Any):
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
    """fedica's RF-ICA run: the strategy, then every method scored against the scenario's A*.

    Returns
    -------
    partial_result : dict
        The ``metrics``, ``clients``, ``timings`` and ``rfica`` entries of the result.
    """
    sc, alg = cfg["scenario"], cfg["algorithm"]
    strategy = RFICAStrategy(contrast=alg["contrast"], init=alg["init"], benchmark=alg["benchmark"],
                             kmeans_restarts=alg["kmeans_restarts"], gm_tol=alg["gm_tol"], random_state=cfg["seed"],
                             r=sc["r"], min_available_nodes=federation.expected, min_clients=federation.min_clients,
                             client_config=federation.common_values)
    strategy.start(federation.grid, timeout=federation.round_timeout, federation=federation)
    state = strategy.state
    aggregate = state.aggregate
    truth = ica_true_mixing(r=sc["r"], orthogonal=sc["orthogonal"], seed=cfg["seed"])
    estimates_by_method = {"rf-ica": aggregate.rf_ica, "f-ica": aggregate.f_ica,
                           "simple-mean": aggregate.simple_mean, "simple-median": aggregate.simple_median}
    metrics = {name: {"error": ica_error(estimate, truth)} for name, estimate in estimates_by_method.items()}
    clients_sum = float(np.sum(state.client_seconds))
    fit_seconds = clients_sum + state.server_seconds
    return {
        "metrics": metrics,
        "clients": federation.clients_record(len(state.estimates)),
        "timings": {**{name: fit_seconds for name in METHODS}, "clients_sum": clients_sum, "server": state.server_seconds},
        "rfica": {
            "benchmark_client": state.partitions[aggregate.benchmark],
            "estimate": aggregate.rf_ica,
            "estimates": estimates_by_method,
            "true_mixing": truth,
            "client_partitions": state.partitions,
            "n_samples": state.n_samples,
            "corrupted_clients": np.flatnonzero(
                ica_corrupted_clients(n_clients=sc["n_clients"], corrupt_ratio=sc["corrupt_ratio"], seed=cfg["seed"])
            ).tolist(),
            "hostile_clients": federation.hostile_partitions,
        },
    }
