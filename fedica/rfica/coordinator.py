"""RF-ICA's coordinator: the server side of its protocol, which any transport can drive: one exchange, then the robust aggregation.

:func:`rfica_protocol` is a generator like :meth:`fedica.fedgem.coordinator.FedGEMServer.run`: it
yields one :class:`~fedica.protocol.Request` (every client's local FastICA) and is sent the
replies. :class:`fedica.RFICA` answers in memory, ``RFICAStrategy`` over a Flower Grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedica.protocol import (
    RFICA_FIT,
    InvalidReply,
    ProtocolState,
    Reply,
    Request,
    majority_width,
    reported_seconds,
    validate_ica_reply,
)
from fedica.rfica.aggregation import RfIcaAggregate, rf_ica_aggregate

@dataclass(kw_only=True)
class RFICAState(ProtocolState):
    """RF-ICA's parameters and, once the protocol has run, what it computed (its books: :class:`~fedica.protocol.ProtocolState`).

    Parameters
    ----------
    contrast, init, benchmark, kmeans_restarts, gm_tol, clustering
        As for :class:`fedica.RFICA` (``clustering``'s default here is the paper's k-means).
    seed : int
        The run's seed: the clients' FastICA starts and the server's k-means restarts.
    min_clients : int
    r : int or None
        The sources' dimension; None: the one most clients report.
    """

    contrast: str = "cube"
    init: str = "random"
    benchmark: str = "largest"
    kmeans_restarts: int = 10
    gm_tol: float = 1e-10
    clustering: str = "kmeans"
    seed: int = 0
    min_clients: int = 2
    r: int | None = None
    estimates: list[np.ndarray] = field(default_factory=list)
    n_samples: list[int] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)
    aggregate: RfIcaAggregate | None = None


def rfica_protocol(state: RFICAState):
    """The whole RF-ICA protocol (one round of communication); results land in ``state``."""
    replies = yield Request(RFICA_FIT, 1, None, {"contrast": state.contrast, "init": state.init, "seed": state.seed})
    receive_estimates(state, replies)
    state.require(len(state.estimates), "RF-ICA round 1")
    aggregate_estimates(state)


def receive_estimates(state: RFICAState, replies: list[Reply]) -> None:
    """Validate the clients' local mixing matrices (the federation's r is the majority's, unless given)."""
    r = state.r if state.r is not None else (majority_width(replies, "mixing") or 0)
    for reply in replies:
        try:
            mixing, n_k = validate_ica_reply(reply.arrays, reply.values, r=r)
        except InvalidReply as err:
            state.reject(reply.partition_id, 1, f"invalid reply: {err}")
            continue
        state.estimates.append(mixing)
        state.n_samples.append(n_k)
        state.partitions.append(reply.partition_id)
        state.client_seconds += reported_seconds(reply)


def aggregate_estimates(state: RFICAState) -> None:
    """The robust one-shot aggregation of the received estimates."""
    with state.server_time():
        state.aggregate = rf_ica_aggregate(
            np.stack(state.estimates), np.asarray(state.n_samples), benchmark=state.benchmark,
            kmeans_restarts=state.kmeans_restarts, gm_tol=state.gm_tol, clustering=state.clustering,
            random_state=state.seed)

