"""RF-ICA's server, as a protocol any transport can drive: one exchange, then the robust aggregation.

:func:`rfica_protocol` is a generator like :meth:`fedica.fedgem.server.FedGEMServer.run`: it
yields one :class:`~fedica.protocol.Request` (every client's local FastICA) and is sent the
replies. :class:`fedica.RFICA` answers in memory, ``RFICAStrategy`` over a Flower Grid.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedica.protocol import (
    RFICA_FIT,
    InvalidReply,
    Reply,
    Request,
    majority_width,
    reported_seconds,
    require_replies,
    validate_ica_reply,
)
from fedica.rfica.aggregation import RfIcaAggregate, rf_ica_aggregate

log = logging.getLogger("fedica.server")


@dataclass
class RFICAState:
    """RF-ICA's parameters and, once the protocol has run, what it computed.

    Parameters
    ----------
    contrast, init, benchmark, kmeans_restarts, gm_tol
        As for :class:`fedica.RFICA`.
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
    seed: int = 0
    min_clients: int = 2
    r: int | None = None
    rejected: list[dict[str, Any]] = field(default_factory=list)
    estimates: list[np.ndarray] = field(default_factory=list)
    n_samples: list[int] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)
    client_seconds: list[float] = field(default_factory=list)
    server_seconds: float = 0.0
    aggregate: RfIcaAggregate | None = None

    def reject(self, client: int, round_label: int | str, reason: str) -> None:
        log.warning("client %s, round %s: reply rejected: %s", client, round_label, reason)
        self.rejected.append({"client": client, "round": round_label, "reason": reason})


def rfica_protocol(state: RFICAState):
    """The whole RF-ICA protocol (one round of communication); results land in ``state``."""
    replies = yield Request(RFICA_FIT, 1, None, {"contrast": state.contrast, "init": state.init, "seed": state.seed})
    receive_estimates(state, replies)
    require_replies(len(state.estimates), state.min_clients, "RF-ICA round 1", state.rejected)
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
        state.client_seconds.append(reported_seconds(reply))


def aggregate_estimates(state: RFICAState) -> None:
    """The robust one-shot aggregation of the received estimates."""
    start = time.perf_counter()
    state.aggregate = rf_ica_aggregate(
        np.stack(state.estimates), np.asarray(state.n_samples), benchmark=state.benchmark,
        kmeans_restarts=state.kmeans_restarts, gm_tol=state.gm_tol, random_state=state.seed)
    state.server_seconds += time.perf_counter() - start

