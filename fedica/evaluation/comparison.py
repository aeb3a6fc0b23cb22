"""What every FedGEM comparator shares: its result, its input check, its seed, and how its protocol runs.

The one-shot comparators (:mod:`fedica.evaluation.baselines`) and the iterative federated ones
(:mod:`fedica.evaluation.ffcm`, :mod:`fedica.evaluation.afcl`) all return a :class:`BaselineResult`.
A federated comparator's protocol runs over a transport's ``driver`` (Flower's, in
``fedica.server.harness.comparators``) or, with none, in memory over the clients' data with the one
in-memory driver of the protocol kit (:class:`fedica.protocol.InMemoryFederation`), the clients
answering with the comparator's own entries of the client task registry (its ``TASKS``, which
:data:`fedica.tasks.CLIENT_TASKS` holds too).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedica.sites import ClientData
from fedica.protocol import (
    ArraySite,
    ClientTasks,
    Handler,
    InMemoryFederation,
    ProtocolDriver,
    ProtocolRun,
    ProtocolState,
)
from fedica.seeding import sklearn_seed
from fedica.validation import check_seed

log = logging.getLogger("fedica.baselines")


@dataclass(frozen=True)
class BaselineResult:
    """Output of a baseline.

    Attributes
    ----------
    test_labels : list of G ndarrays, each of shape (m_g,)
        Predicted global cluster ids of each client's test points.
    k_hat : int
        Number of global clusters that receive at least one test point.
    fit_seconds : float
        Wall time of fitting (client and server work).
    info : dict
        What a baseline reports beyond its labels (rounds run, bytes the clients sent, ...); empty for the
        one-shot baselines. :func:`fedica.evaluation.baselines.run_baselines` copies its numeric entries
        into the method's scores.
    """

    test_labels: list[np.ndarray]
    k_hat: int
    fit_seconds: float
    info: dict[str, Any] = field(default_factory=dict)


def check_clients(clients: Sequence[ClientData], method: str) -> None:
    """Refuse an empty federation or mixed dimensions; log the start of ``method``."""
    if len(clients) == 0:
        raise ValueError("clients must not be empty")
    dims = {c.X_train.shape[1] for c in clients}
    if len(dims) != 1:
        raise ValueError(f"all clients must have the same number of features, got {sorted(dims)}")
    log.info("%s: fitting on %d clients, %d training points", method, len(clients), sum(c.n_train for c in clients))


def baseline_result(method: str, test_labels: list[np.ndarray], fit_seconds: float,
                    info: dict[str, Any] | None = None) -> BaselineResult:
    """The BaselineResult of ``method``; logs its fitting time."""
    test_labels = [np.asarray(labels, dtype=np.int64) for labels in test_labels]
    result = BaselineResult(test_labels, int(np.unique(np.concatenate(test_labels)).size), float(fit_seconds),
                            dict(info or {}))
    log.info("%s: fitted in %.2f s, K_hat %d", method, result.fit_seconds, result.k_hat)
    return result


def run_seed(random_state) -> int:
    """The int seed of a federated comparator's run: ``random_state`` itself when it is an int, else one drawn from it."""
    if isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool):
        return check_seed(int(random_state))
    return sklearn_seed(np.random.default_rng(random_state))


def run_protocol(state: ProtocolState, protocol: ProtocolRun, tasks: ClientTasks, clients: Sequence[ClientData],
                 driver: ProtocolDriver | None, partitions: Sequence[int] | None = None) -> None:
    """Run a comparator's protocol with ``driver``, or in memory over ``clients``.

    Parameters
    ----------
    state : ProtocolState
        The protocol's state: in memory, a client's refusal is recorded in its books.
    protocol : generator
    tasks : ClientTasks
        What the clients answer with in memory.
    clients : sequence of ClientData
        Each client answers from its ``X_train`` and ``n_components`` only.
    driver : callable or None
        ``driver(protocol)`` runs the protocol over a transport; None: in memory.
    partitions : sequence of int, optional
        The partition id of each client (default: its position), as a transport would report it.
    """
    if driver is not None:
        driver(protocol)
        return
    ids = range(len(clients)) if partitions is None else partitions
    sites = {p: ArraySite(client, p) for p, client in zip(ids, clients)}
    InMemoryFederation(sites, tasks, state.rejected).run(protocol)


# step(X, n_components, arrays, values, partition_id) -> the reply's arrays: a comparator client's work.
ClientStep = Callable[[np.ndarray, int, Mapping[str, np.ndarray], Mapping[str, Any], int], dict[str, np.ndarray]]


def comparator_task(step: ClientStep) -> Handler:
    """A comparator's task handler: ``step`` on the site's training points and K_g, with its point count and its own time."""
    def handle(site, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any]) -> tuple[dict, dict]:
        data = site.points(values)
        X = np.asarray(data.X_train, dtype=np.float64)
        start = time.perf_counter()
        reply = step(X, int(data.n_components), arrays, values, site.partition_id)
        return reply, {"n-points": int(X.shape[0]), "fit-seconds": time.perf_counter() - start}

    return handle


def answer_on_array(tasks: Mapping[str, Handler], task: str, X, n_components: int, arrays: Mapping[str, np.ndarray],
                    values: Mapping[str, Any], partition_id: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """What the registry's handler of ``task`` replies for a client whose training points are the array ``X``."""
    X = np.asarray(X, dtype=np.float64)
    return tasks[task](ArraySite(ClientData(X, None, X[:0], None, n_components), partition_id), arrays, values)
