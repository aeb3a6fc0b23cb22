"""The common machinery of fedica's Flower strategies: a fedica protocol run as a ``Strategy``.

A fedica algorithm's server is a generator of :class:`~fedica.protocol.Request` objects
(:meth:`fedica.fedgem.coordinator.FedGEMServer.run`, :func:`fedica.rfica.coordinator.rfica_protocol`).
A strategy turns each request into Flower messages in ``configure_train`` or
``configure_evaluate`` (by the task's category), and feeds the decoded replies back to the
protocol in ``aggregate_train`` or ``aggregate_evaluate``. ``start`` runs the stages until the
protocol ends, so the number of rounds is the algorithm's, not the caller's.
"""

from __future__ import annotations

import logging
import time
from abc import abstractmethod
from collections.abc import Callable, Generator, Iterable
from typing import Any

from fedica.server.federation import Federation
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import FLOWER_LOGGER
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedica.protocol import CATEGORY, EVALUATE, TRAIN, JournalError, Reply, Request, journaled

log = logging.getLogger("fedica.server")


class FlowerHandOver(logging.Handler):
    """Hands fedica's records to the handlers of Flower's logger, which reach the ServerApp's terminal.

    Only to Flower's own handlers, not up to the root logger: a root handler added later prints
    fedica's records once, through fedica's own propagation.
    """

    def emit(self, record: logging.LogRecord) -> None:
        for handler in FLOWER_LOGGER.handlers:
            if record.levelno >= handler.level:
                handler.handle(record)


def reach_flower_console() -> None:
    """Let fedica's progress lines reach the terminal the way Flower's own strategies' lines do.

    A user's own ServerApp configures no handler for ``fedica``: its INFO lines would be lost
    (Python prints bare warnings only, as a last resort). When nothing in the process prints them,
    no handler on ``fedica`` or above it, they go to Flower's handlers at INFO. fedica's own
    ServerApp (:func:`fedica.server.app.configure_logging` adds a handler, or leaves it to Hydra's
    root handler) is left as it is, so that no line is printed twice.
    """
    fedica_log = logging.getLogger("fedica")
    if fedica_log.hasHandlers():
        return
    fedica_log.addHandler(FlowerHandOver())
    if fedica_log.level == logging.NOTSET:
        fedica_log.setLevel(logging.INFO)


class ProtocolStrategy(Strategy):
    """A Flower strategy that runs one of fedica's protocols.

    Parameters
    ----------
    min_available_nodes : int
        Nodes to wait for before the first stage (and the number of clients expected).
    min_clients : int
        Fewest valid replies a stage needs.
    node_wait_timeout : float
        Seconds to wait for ``min_available_nodes`` nodes.
    client_config : dict, optional
        Values sent with every message; fedica's own ClientApp reads its scenario from it.
    """

    def __init__(self, *, min_available_nodes: int = 2, min_clients: int = 2, node_wait_timeout: float = 120.0,
                 client_config: dict[str, Any] | None = None):
        self.min_available_nodes = int(min_available_nodes)
        self.min_clients = int(min_clients)
        self.node_wait_timeout = float(node_wait_timeout)
        self.client_config = dict(client_config or {})
        self.federation: Federation | None = None
        self._protocol: Generator[Request, list[Reply], None] | None = None
        self._request: Request | None = None
        self._sent: list[Message] = []

    @abstractmethod
    def protocol(self) -> Generator[Request, list[Reply], None]:
        """The algorithm's server protocol, freshly started."""

    @abstractmethod
    def model_arrays(self) -> ArrayRecord:
        """The current global model, as the ``arrays`` of the Result."""

    def stage_metrics(self, request: Request) -> MetricRecord | None:
        """Numbers to record for a finished stage (default: none)."""
        return None

    # ------------------------------------------------------------------ Flower's Strategy interface

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        return self._configure(TRAIN)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        request = self._aggregate(TRAIN, replies)
        return (self.model_arrays(), self.stage_metrics(request)) if request is not None else (None, None)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        return self._configure(EVALUATE)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        request = self._aggregate(EVALUATE, replies)
        return self.stage_metrics(request) if request is not None else None

    def summary(self) -> None:
        settings = {k: v for k, v in vars(self).items()
                    if not k.startswith("_") and isinstance(v, (int, float, str, tuple))}
        log.info("%s: %s", type(self).__name__, settings)

    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = None,
              timeout: float = 600.0, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
              federation: Federation | None = None) -> Result:
        """Run the whole protocol over ``grid``.

        ``initial_arrays``, ``num_rounds``, ``train_config`` and ``evaluate_config`` are accepted for
        compatibility with ``Strategy.start`` and not used: the algorithm sets its own stages (its
        round count is a parameter of the strategy). ``evaluate_fn(stage, arrays)``, if given, is
        called after every stage with the current global model. ``federation`` lets fedica's
        own ServerApp keep its books (the result's ``clients`` entry) across the run.
        """
        reach_flower_console()  # before the summary line (begin does it too, for loops that call begin alone)
        self.summary()
        self.begin(grid, timeout, federation)
        result = Result()
        started = time.perf_counter()
        stage = 0
        while self._request is not None:
            stage += 1
            category = CATEGORY[self._request.task]
            messages = list(self.configure_train(stage, ArrayRecord(), ConfigRecord(), grid) if category == TRAIN
                            else self.configure_evaluate(stage, ArrayRecord(), ConfigRecord(), grid))
            received = self.federation.send_and_receive(messages, f"{self._request.task} {self._request.round_label}",
                                                        timeout=timeout)
            if category == TRAIN:
                arrays, metrics = self.aggregate_train(stage, received)
                if metrics is not None:
                    result.train_metrics_clientapp[stage] = metrics
            else:
                arrays, metrics = None, self.aggregate_evaluate(stage, received)
                if metrics is not None:
                    result.evaluate_metrics_clientapp[stage] = metrics
            if arrays is not None:
                result.arrays = arrays
            if evaluate_fn is not None:
                server_metrics = evaluate_fn(stage, self.model_arrays())
                if server_metrics is not None:
                    result.evaluate_metrics_serverapp[stage] = server_metrics
        result.arrays = self.model_arrays()
        log.info("%s finished %d stages in %.2f s", type(self).__name__, stage, time.perf_counter() - started)
        return result

    # ------------------------------------------------------------------ driving the protocol

    def begin(self, grid: Grid, timeout: float, federation: Federation | None = None) -> None:
        """Connect to the nodes and start the protocol (``start`` does this; exposed for custom loops)."""
        reach_flower_console()
        self.federation = federation or Federation(
            grid, expected=self.min_available_nodes, min_clients=self.min_clients, round_timeout=timeout,
            node_wait_timeout=self.node_wait_timeout, common_values=self.client_config)
        self.federation.connect()
        self._protocol = self.protocol()
        if self.federation.journal is not None:
            if self.federation.journal.recorded and self.federation.bound_partitions is None:
                # Nodes that say who they are only in their replies cannot be asked by partition after replayed stages.
                raise JournalError("a resumed run needs the nodes' partitions bound (node-partitions, as fedica-deploy "
                                   "and the in-process engine give them); this federation learns them from replies")
            # The stages the journal holds are replayed here, before any client is asked.
            self._protocol = journaled(self._protocol, self.federation.journal,
                                       {"rejected": self.federation.rejected,
                                        "participation": self.federation.participation})
        # None: the protocol has ended already (a resumed run whose journal holds every stage).
        self._request = next(self._protocol, None)

    def _configure(self, category: str) -> list[Message]:
        if self._request is None or CATEGORY[self._request.task] != category:
            self._sent = []
            return []
        self._sent = self.federation.messages(self._request)
        return self._sent

    def _aggregate(self, category: str, received: Iterable[Message]) -> Request | None:
        request = self._request
        if request is None or CATEGORY[request.task] != category:
            return None
        replies = self.federation.replies(request, self._sent, received)
        try:
            self._request = self._protocol.send(replies)
        except StopIteration:
            self._request = None
        return request
