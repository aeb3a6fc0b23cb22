"""Talking to the clients over a Flower Grid: who is there, one exchange per round, what was rejected.

Everything algorithm-specific lives in ``server.rfica`` and ``server.fedgem``; this
module only moves messages and keeps the books: which node is which client
(partition id), and every reply that was left out, with its round and reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fedica.server.records import (
    ERROR_KEY,
    MalformedMessage,
    config_to_json,
    pack,
    unpack,
)
from flwr.app import Message, MessageType
from flwr.serverapp import Grid

from fedica import attacks
from fedica.config import client_count
from fedica.protocol import InvalidReply, require_int

log = logging.getLogger("fedica.server")


class NotEnoughClients(RuntimeError):
    """Fewer valid replies than ``min_clients``: the run cannot go on.

    ``partial`` holds what the run had computed when it stopped (set by ``run_federation``).
    """

    partial: dict[str, Any] | None = None


@dataclass
class Reply:
    """A decoded reply of one client."""

    node_id: int
    partition_id: int
    arrays: dict[str, np.ndarray]
    values: dict[str, Any]


@dataclass
class Federation:
    """The server's view of the federation during one run.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
    cfg : mapping
        The resolved, validated run configuration.
    """

    grid: Grid
    cfg: Mapping[str, Any]
    rejected: list[dict[str, Any]] = field(default_factory=list)
    partition_of: dict[int, int] = field(default_factory=dict)
    participation: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.expected = client_count(self.cfg["scenario"])
        self._cfg_json = config_to_json(self.cfg)

    def connect(self) -> list[int]:
        """Wait until the expected number of nodes is connected (or the wait times out).

        Returns
        -------
        node_ids : list of int
            The connected nodes; fewer than expected after the timeout is logged, and
            too few for ``min_clients`` raises :class:`NotEnoughClients`.
        """
        deadline = time.monotonic() + float(self.cfg["node_wait_timeout"])
        while True:
            nodes = sorted(self.grid.get_node_ids())
            if len(nodes) >= self.expected or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if len(nodes) < self.expected:
            log.warning("only %d of %d nodes connected within %.0f s; going on with them",
                        len(nodes), self.expected, self.cfg["node_wait_timeout"])
        if len(nodes) < self.cfg["min_clients"]:
            raise NotEnoughClients(f"{len(nodes)} nodes connected; min_clients={self.cfg['min_clients']}")
        return nodes

    def exchange(
        self,
        task: str,
        round_label: int | str,
        payloads: Mapping[int, Mapping[str, np.ndarray]],
        *,
        message_type: str = MessageType.TRAIN,
        values: Mapping[str, Any] | None = None,
    ) -> list[Reply]:
        """Send one message to each node in ``payloads`` and collect the valid replies.

        Parameters
        ----------
        task : str
            The client task (``fedica.server.records.TASK_*``).
        round_label : int or str
            The round, for the books (an int for collaborative rounds, a stage name otherwise).
        payloads : mapping of node id to mapping of str to ndarray
            The arrays each node receives.
        message_type : str
        values : mapping, optional
            Extra scalar values sent to every node.

        Returns
        -------
        replies : list of Reply, sorted by partition id
            Error replies, malformed replies, replies from an unexpected or duplicate
            partition and missing replies are left out and recorded in ``rejected``.
        """
        common = {"task": task, "cfg": self._cfg_json, "server-round": str(round_label), **(values or {})}
        # A node the SuperLink has marked offline is not asked (it would only cost the round its timeout).
        online = set(self.grid.get_node_ids())
        for node in payloads:
            if node not in online:
                self.reject(node, round_label, "the node is offline (lost by the SuperLink)")
        messages = [
            Message(pack(arrays, common), dst_node_id=node, message_type=message_type, group_id=str(round_label))
            for node, arrays in payloads.items()
            if node in online
        ]
        received = list(self.grid.send_and_receive(messages, timeout=float(self.cfg["round_timeout"])))
        # The SuperLink answers for an unreachable node itself (source node 1): the node is the message's destination.
        destination = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}
        answered: set[int] = set()
        replies: list[Reply] = []
        seen_partitions: set[int] = set()
        for message in received:
            node = destination.get(message.metadata.reply_to_message_id, message.metadata.src_node_id)
            answered.add(node)
            if message.has_error():
                self.reject(node, round_label, f"client error (code {message.error.code}): {message.error.reason}")
                continue
            try:
                arrays, reply_values = unpack(message.content)
                partition = require_int(reply_values, "partition-id", minimum=0, maximum=self.expected - 1)
                if self.partition_of.setdefault(node, partition) != partition:
                    raise InvalidReply(f"partition-id {partition} differs from the {self.partition_of[node]} this node sent before")
                if partition in seen_partitions:
                    raise InvalidReply(f"partition-id {partition} was already claimed by another node in this round")
            except (MalformedMessage, InvalidReply) as err:
                self.reject(node, round_label, f"malformed reply: {err}")
                continue
            if ERROR_KEY in reply_values:
                self.reject(node, round_label, f"client error: {reply_values[ERROR_KEY]}")
                continue
            seen_partitions.add(partition)
            replies.append(Reply(node, partition, arrays, reply_values))
        for node in payloads:
            if node in online and node not in answered:
                self.reject(node, round_label, f"no reply within {self.cfg['round_timeout']} s")
        replies.sort(key=lambda reply: reply.partition_id)
        self.participation.append({"round": round_label, "task": task, "clients": [r.partition_id for r in replies]})
        return replies

    def reject(self, node: int, round_label: int | str, reason: str) -> None:
        """Record (and log) a reply that was left out."""
        client = self.partition_of.get(node, f"node-{node}")
        log.warning("client %s, round %s: reply rejected: %s", client, round_label, reason)
        self.rejected.append({"client": client, "round": round_label, "reason": reason})

    def require(self, replies: Iterable[Reply], what: str) -> None:
        """Raise :class:`NotEnoughClients` when fewer than ``min_clients`` replies are valid."""
        count = len(list(replies))
        if count < self.cfg["min_clients"]:
            raise NotEnoughClients(
                f"{what}: only {count} valid replies, min_clients={self.cfg['min_clients']} "
                f"(rejected: {'; '.join(str(r['client']) + ': ' + r['reason'] for r in self.rejected[-5:])})"
            )

    def hostile_partitions(self) -> list[int]:
        """The clients the ``attack`` config made hostile (recorded in the result only; the server never uses it)."""
        attack = self.cfg["attack"]
        if attack["kind"] == "none":
            return []
        return np.flatnonzero(attacks.hostile_mask(self.expected, attack["fraction"], seed=self.cfg["seed"])).tolist()

    def clients_record(self, answered: int) -> dict[str, Any]:
        """The ``clients`` entry of the result."""
        return {"expected": self.expected, "answered": answered, "rejected": self.rejected}
