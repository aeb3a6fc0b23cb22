"""The iterative federated comparators (FFCM, AFCL) over Flower: their protocols' messages go through the run's Grid.

:func:`fedica.evaluation.baselines.run_baselines` runs every comparator; the ones that are
federated protocols take a ``driver`` that answers their requests. :func:`flower_driver`
makes one from the run's federation, so that the comparators' clients answer on the same engine
as FedGEM's (the in-process grid, Flower's simulation or a deployment), each comparator with
books of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any

from fedica.server.federation import Federation
from fedica.server.strategy import ProtocolStrategy
from flwr.app import ArrayRecord

from fedica.protocol import ProtocolDriver
from fedica.protocol import Reply, Request

log = logging.getLogger("fedica.server")


class ComparatorStrategy(ProtocolStrategy):
    """A Flower strategy that runs one given protocol generator (a comparator's server) to its end."""

    def __init__(self, protocol: Generator[Request, list[Reply], None], **kwargs: Any):
        super().__init__(**kwargs)
        self._given = protocol

    def protocol(self) -> Generator[Request, list[Reply], None]:
        return self._given

    def model_arrays(self) -> ArrayRecord:
        return ArrayRecord()


def flower_driver(federation: Federation) -> ProtocolDriver:
    """A driver that runs a comparator's protocol over the federation's Grid, with its own books.

    The comparator's replies are checked by its own server code; what the transport leaves out
    (no reply, a node that is not the partition it claims) is recorded in the comparator's
    federation and logged, not mixed into FedGEM's ``clients`` entry.
    """
    def drive(protocol: Generator[Request, list[Reply], None]) -> None:
        books = Federation(federation.grid, expected=federation.expected, min_clients=1,
                           round_timeout=federation.round_timeout, node_wait_timeout=federation.node_wait_timeout,
                           min_nodes=federation.min_nodes,
                           common_values=federation.common_values, bound_partitions=federation.bound_partitions,
                           journal=federation.journal)
        strategy = ComparatorStrategy(protocol, min_available_nodes=federation.expected, min_clients=1,
                                      node_wait_timeout=federation.node_wait_timeout,
                                      client_config=federation.common_values)
        strategy.start(federation.grid, timeout=federation.round_timeout, federation=books)
        if books.rejected:
            log.warning("comparator transport: %d replies left out (%s)", len(books.rejected), books.rejected[:3])

    return drive
