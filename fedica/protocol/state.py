"""The server side of every fedica protocol: the books a protocol's state keeps, and its base class.

Every protocol's server (FedGEM's, RF-ICA's, the FFCM and AFCL comparators') is a generator of
:class:`~fedica.protocol.messages.Request` objects over a state object derived from
:class:`ProtocolState`: the state records every reply it leaves out, with its round and reason
(:meth:`ProtocolState.reject`), stops the run when too few replies are valid
(:meth:`ProtocolState.require`), and counts the clients' and its own time. A transport that leaves
a reply out before the protocol sees it (no reply, a client error, a forged partition id) records it
in the same book with :func:`record_rejection`, so a run has one list of what was left out and why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fedica.protocol.messages import MAX_REASON_TEXT, NotEnoughClients, client_text

log = logging.getLogger("fedica.server")

# One entry of the books: {"client": partition id (or "node-<id>"), "round": label, "reason": text}.
Rejection = dict[str, Any]


def record_rejection(book: list[Rejection], client: int | str, round_label: int | str, reason: str, *,
                     logger: logging.Logger = log, label: str = "") -> None:
    """Append ``{client, round, reason}`` to ``book`` and log it (``label`` names the protocol, e.g. "FFCM ").

    The reason is cut to :data:`~fedica.protocol.messages.MAX_REASON_TEXT` characters: it may quote a client.
    """
    reason = client_text(reason, MAX_REASON_TEXT)
    logger.warning("%sclient %s, round %s: reply rejected: %s", label, client, round_label, reason)
    book.append({"client": client, "round": round_label, "reason": reason})


@dataclass(kw_only=True)
class ProtocolState:
    """The books every protocol's server-side state keeps.

    Subclasses add their parameters and results, and a ``min_clients`` attribute (a field, or a
    property reading it from their settings).

    Attributes
    ----------
    rejected : list of dict
        ``{client, round, reason}`` of every reply left out (pass the transport's list to keep one book).
    client_seconds : float
        The clients' own reported work (``fit-seconds``) in the valid replies, summed.
    server_seconds : float
        The server's own work (:meth:`server_time`).
    """

    rejected: list[Rejection] = field(default_factory=list)
    client_seconds: float = 0.0
    server_seconds: float = 0.0

    # How the protocol's log lines begin (e.g. "FFCM "), and where they go.
    log_label: ClassVar[str] = ""
    logger: ClassVar[logging.Logger] = log

    def reject(self, client: int | str, round_label: int | str, reason: str) -> None:
        """Record (and log) a reply that was left out."""
        record_rejection(self.rejected, client, round_label, reason, logger=self.logger, label=self.log_label)

    def require(self, count: int, what: str) -> None:
        """Raise :class:`~fedica.protocol.messages.NotEnoughClients` when fewer than ``min_clients`` replies are valid."""
        if count < self.min_clients:
            last = "; ".join(f"{r['client']}: {r['reason']}" for r in self.rejected[-5:])
            raise NotEnoughClients(f"{what}: only {count} valid replies, min_clients={self.min_clients} (rejected: {last})")

    @contextmanager
    def server_time(self) -> Iterator[None]:
        """Count the enclosed work as the server's own (``server_seconds``)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.server_seconds += time.perf_counter() - start
