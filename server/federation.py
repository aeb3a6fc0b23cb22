"""Talking to the clients over a Flower Grid: who is there, the messages of one request, what was rejected.

The algorithms live in :mod:`fedica`; this module only moves their requests and replies and
keeps the books: which node is which client (partition id), and every reply that was left out,
with its round and reason.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fedica.server.records import MalformedMessage, content_bytes, pack, unpack
from flwr.app import Message
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from fedica.protocol import (
    ERROR_KEY,
    REPLY_SIZE_FLOOR,
    InvalidReply,
    Journal,
    NotEnoughClients,
    Reply,
    Request,
    check_reply_size,
    client_text,
    column_majority,
    message_type,
    record_rejection,
    reply_size_limits,
    reported_columns,
    reported_ray_node,
    require_int,
)
from fedica.validation import name_difference

log = logging.getLogger("fedica.server")

# While it waits for its nodes or for a stage's replies, the server says how far it is this often (seconds).
PROGRESS_SECONDS = 5.0
# How often the server asks for replies when the Grid does not say (Flower's own HttpGrid waits 3 s).
PULL_SECONDS = 0.5
# Under Flower's simulation runtime, a node count unchanged this long (seconds) is the federation's size.
SIMULATION_SETTLE_SECONDS = 1.0
# Flower's simulation hands messages to its Ray actors from a loop that, every 0.1 s, asks for each simulated
# node's next message; even with the lookup per node (fedica.server.simulation_state), every ask reads every
# stored message's destination (about 0.3 us per node and message), and the loop holds the server process's
# interpreter meanwhile. With a stage's 1,000 messages stored at once, a pass takes 0.3 s: at G=1,000 a round
# took 4.2 to 6.3 s and the first stage 36 s, against 3.6 to 4.5 s and 12 s paced. So, there only, a stage
# keeps in flight what the actors take in about IN_FLIGHT_SECONDS (from the replies' rate since the first
# reply), and at least MIN_IN_FLIGHT: a few per local CPU, so that stages of slow messages still keep every
# actor of this machine's Ray busy.
MIN_IN_FLIGHT = max(16, 4 * (os.cpu_count() or 1))
IN_FLIGHT_SECONDS = 0.5

# Flower's reason for a reply whose objects never all arrived; fedica-superlink's size bound
# (scripts/deploy/superlink.py) is one way to get there, a node lost mid-upload the other.
UNAVAILABLE_HINT = ("a reply over the SuperLink's bound, engine.max_reply_mib, is refused this way; "
                    "the SuperLink's log names it")


def message_sizes(request: Request, replies: list[Reply]) -> dict[str, float]:
    """The numbers (array entries) one client receives and sends in an exchange, averaged over the clients.

    What the protocol moves, independent of the transport's encoding: FedGEM's rounds move about
    3 d K_g numbers per client (the paper's appendix B.5.2), RF-ICA's one exchange r^2 per client;
    neither grows with a client's data.
    """
    def numbers(arrays: dict) -> int:
        return int(sum(np.asarray(a).size for a in arrays.values()))

    sent = [numbers(arrays) for arrays in (request.payloads or {}).values()]
    received = [numbers(reply.arrays) for reply in replies]
    return {"numbers_to_client": float(np.mean(sent)) if sent else 0.0,
            "numbers_from_client": float(np.mean(received)) if received else 0.0}


def ray_node_counts(replies: list[Reply]) -> dict[str, int]:
    """How many of the replies each Ray node computed (by the node id the clients report); empty off Ray."""
    nodes = Counter(reported_ray_node(reply) for reply in replies)
    nodes.pop(None, None)
    return dict(sorted(nodes.items()))


@dataclass
class Federation:
    """The server's view of the federation during one run.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
    expected : int
        The number of clients (partitions) the run expects.
    min_clients : int
        Fewest valid replies a stage needs.
    round_timeout : float
        Seconds to wait for the replies of one exchange.
    node_wait_timeout : float
        Seconds to wait for ``expected`` nodes to connect.
    min_nodes : int, optional
        Fewest nodes to go on with once the wait is over; None: all ``expected``.
    common_values : dict
        Values sent with every message (fedica's own ClientApp reads its scenario from ``cfg``).
    scenario_name : str
        The scenario's name, for the message that a simulated federation does not fit it.
    bound_partitions : dict of int to int, optional
        The partition id of every node the run expects, from a source the nodes cannot forge
        (the in-process grid's node configs; in deployment the launcher's SuperNodes). Only
        these nodes are asked, and a reply claiming another partition is rejected. Without it,
        claims are believed, but a partition claimed by two nodes is contested: neither is used
        again (the server cannot tell which is genuine, so one hostile node cannot evict an
        honest one and take its place).
    journal : fedica.protocol.Journal, optional
        The run's journal: every protocol a strategy drives over this federation replays the
        stages it holds and records every new one there, with this federation's books of it
        (``rejected``, ``participation``), so that an interrupted run resumes.
    """

    grid: Grid
    expected: int
    min_clients: int = 2
    round_timeout: float = 600.0
    node_wait_timeout: float = 120.0
    min_nodes: int | None = None
    common_values: dict[str, Any] = field(default_factory=dict)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    partition_of: dict[int, int] = field(default_factory=dict)
    participation: list[dict[str, Any]] = field(default_factory=list)
    bound_partitions: dict[int, int] | None = None
    scenario_name: str = ""
    journal: Journal | None = None

    def __post_init__(self) -> None:
        self.node_of: dict[int, int] = {}
        self.nodes: list[int] = []
        self.contested: set[int] = set()
        # The column names each site reported first, and the sites left out for naming other columns than most.
        self.columns_of: dict[int, tuple[str, ...]] = {}
        self.misaligned: set[int] = set()
        self.paced = False  # True under Flower's simulation runtime (see MIN_IN_FLIGHT), set by connect
        if self.bound_partitions is not None:
            self.bound_partitions = {int(n): int(p) for n, p in self.bound_partitions.items()}
            self.partition_of.update(self.bound_partitions)
            self.node_of.update({p: n for n, p in self.bound_partitions.items()})

    def connect(self) -> list[int]:
        """Wait until the expected number of nodes is connected (or the wait times out).

        Under Flower's simulation runtime (``flwr run`` with a local SuperLink, or
        ``run_simulation``) every SuperNode exists from the start, so a federation of the wrong
        size is refused at once instead of after ``node_wait_timeout``.

        Returns
        -------
        node_ids : list of int
            The connected nodes. Fewer than ``min_nodes`` (default: all expected) when the wait
            is over raises :class:`NotEnoughClients`; fewer than expected but enough is logged.
        """
        # Imported here: flwr.superlink brings Alembic, whose import logs at INFO unless configure_logging ran first.
        from flwr.superlink.grid import InMemoryGrid

        deadline = time.monotonic() + float(self.node_wait_timeout)
        needed = self.expected if self.min_nodes is None else int(self.min_nodes)
        self.paced = isinstance(self.grid, InMemoryGrid)
        if self.paced:
            connected = self._simulated_nodes(deadline)
            self._check_simulation_size(len(connected), needed)
        else:
            connected = self._wait_for_nodes(deadline)
        nodes = [n for n in connected if self.bound_partitions is None or n in self.bound_partitions]
        if len(nodes) < needed:
            raise NotEnoughClients(
                f"only {len(nodes)} of the scenario's {self.expected} clients connected within {self.node_wait_timeout:.0f} s; "
                f"start one node per client (flwr run: --federation-config \"num-supernodes={self.expected}\"), "
                f"or allow fewer with min_nodes={len(nodes)}")
        if len(nodes) < self.expected:
            log.warning("only %d of %d nodes connected within %.0f s; going on with them (min_nodes=%d)",
                        len(nodes), self.expected, self.node_wait_timeout, needed)
        for node in sorted(set(connected) - set(nodes)):
            self.reject_node(node, "connect", "not one of the run's nodes; it is never asked")
        if len(nodes) < self.min_clients:
            raise NotEnoughClients(f"{len(nodes)} nodes connected; min_clients={self.min_clients}")
        self.nodes = nodes
        return nodes

    def _wait_for_nodes(self, deadline: float) -> list[int]:
        """The connected nodes once the run's are all there or at ``deadline`` (real SuperNodes connect over time)."""
        started = said = time.monotonic()
        while True:
            connected = sorted(self.grid.get_node_ids())
            nodes = [n for n in connected if self.bound_partitions is None or n in self.bound_partitions]
            if len(nodes) >= self.expected or time.monotonic() > deadline:
                return connected
            if time.monotonic() - said >= PROGRESS_SECONDS:
                said = time.monotonic()
                log.info("waiting for nodes: %d of %d connected (%.0f of %.0f s)", len(nodes), self.expected,
                         said - started, self.node_wait_timeout)
            time.sleep(0.1)

    def _simulated_nodes(self, deadline: float) -> list[int]:
        """The simulation's SuperNodes, once their number has held still (or at ``deadline``).

        Flower registers them all in one quick loop as the run starts, alongside the ServerApp,
        so a count that has not changed for a moment is the federation's size.
        """
        nodes: list[int] = []
        changed = time.monotonic()
        while time.monotonic() <= deadline:
            now_nodes = sorted(self.grid.get_node_ids())
            if now_nodes != nodes:
                nodes, changed = now_nodes, time.monotonic()
            elif nodes and time.monotonic() - changed >= SIMULATION_SETTLE_SECONDS:
                break
            time.sleep(0.1)
        return nodes

    def _check_simulation_size(self, supernodes: int, needed: int) -> None:
        """Refuse a simulated federation with too few (below ``needed``) or more SuperNodes than the scenario's clients."""
        if needed <= supernodes <= self.expected:
            return
        message = (f"the simulation federation has {supernodes} SuperNodes but scenario {self.scenario_name or '(unnamed)'} "
                   f"has {self.expected} clients: run flwr run with --federation-config num-supernodes={self.expected}")
        raise NotEnoughClients(message) if supernodes < needed else ValueError(message)

    def messages(self, request: Request) -> list[Message]:
        """The Flower messages of a request: one per asked client that the SuperLink still has online."""
        targets = self._targets(request)
        online = set(self.grid.get_node_ids())
        common = {**self.common_values, **request.values, "server-round": str(request.round_label)}
        messages = []
        encoded: dict = {}  # a payload array that several clients receive is encoded once (see pack)
        for node, arrays in targets.items():
            if node not in online:
                # A node the SuperLink has marked offline is not asked (it would only cost the round its timeout).
                self.reject_node(node, request.round_label, "the node is offline (lost by the SuperLink)")
                continue
            messages.append(Message(pack(arrays, common, encoded=encoded), dst_node_id=node, message_type=message_type(request.task),
                                    group_id=str(request.round_label)))
        return messages

    def replies(self, request: Request, sent: list[Message], received: Iterable[Message]) -> list[Reply]:
        """Decode the replies to ``sent``; error, malformed, duplicate and missing replies are recorded and left out.

        Returns
        -------
        replies : list of Reply, sorted by partition id
        """
        # The SuperLink answers for an unreachable node itself (source node 1): the node is the message's destination.
        destination = {m.metadata.message_id: m.metadata.dst_node_id for m in sent}
        received = list(received)
        limits = self._size_limits(sent, received)
        answered: set[int] = set()
        replies: list[Reply] = []
        seen_partitions: set[int] = set()
        for message in received:
            node = destination.get(message.metadata.reply_to_message_id, message.metadata.src_node_id)
            answered.add(node)
            reply = self._decode(node, message, request.round_label, seen_partitions,
                                 limits.get(message.metadata.reply_to_message_id, REPLY_SIZE_FLOOR))
            if reply is not None:
                seen_partitions.add(reply.partition_id)
                replies.append(reply)
        for message in sent:  # also those a paced stage had not pushed yet when its time was up
            if message.metadata.dst_node_id not in answered:
                self.reject_node(message.metadata.dst_node_id, request.round_label, f"no reply within {self.round_timeout} s")
        replies = self._aligned(replies, request.round_label)
        replies = [reply for reply in replies if reply.partition_id not in self.contested]
        replies.sort(key=lambda reply: reply.partition_id)
        self.participation.append({"round": request.round_label, "task": request.task,
                                   "clients": [r.partition_id for r in replies], **message_sizes(request, replies),
                                   "ray_nodes": ray_node_counts(replies)})
        return replies

    def exchange(self, request: Request) -> list[Reply]:
        """Send a request's messages, wait for the replies and decode them."""
        sent = self.messages(request)
        received = self.send_and_receive(sent, f"{request.task} {request.round_label}", timeout=float(self.round_timeout))
        return self.replies(request, sent, received)

    def send_and_receive(self, messages: list[Message], stage: str, *, timeout: float) -> list[Message]:
        """Flower's push-then-pull of ``Grid.send_and_receive``, saying every few seconds how many replies are in.

        Written out (rather than calling the Grid's) to report progress while a stage waits, and
        to pace the pushes under Flower's simulation runtime (see :data:`MIN_IN_FLIGHT`).
        """
        unsent = list(messages)
        pending: set[str] = set()
        total, started = len(unsent), time.monotonic()
        said, interval = started, float(getattr(self.grid, "pull_interval", PULL_SECONDS))
        received: list[Message] = []
        answering_since: float | None = None  # the first reply's arrival: the rate excludes the nodes' start-up
        while True:
            answering = 0.0 if answering_since is None else time.monotonic() - answering_since
            room = len(unsent) if not self.paced else self._in_flight(len(received), answering) - len(pending)
            if room > 0 and unsent:
                pending.update(self.grid.push_messages(unsent[:room]))
                del unsent[:room]
            replies = list(self.grid.pull_messages(pending)) if pending else []
            received.extend(replies)
            if replies and answering_since is None:
                answering_since = time.monotonic()
            pending.difference_update(m.metadata.reply_to_message_id for m in replies)
            now = time.monotonic()
            if not (pending or unsent) or now - started >= timeout:
                break
            if now - said >= PROGRESS_SECONDS:
                said = now
                log.info("%s: %d of %d replies after %.0f s", stage, len(received), total, now - started)
            time.sleep(interval)
        return received

    @staticmethod
    def _in_flight(replies: int, seconds: float) -> int:
        """How many messages a paced stage keeps pushed and unanswered, from its replies' rate so far.

        ``seconds`` count from the stage's first reply, so that the actors' start-up (several
        seconds before a run's first reply) does not hold the rate down for the whole stage. Over
        the first IN_FLIGHT_SECONDS the rate is not known yet: the limit is the replies so far,
        doubling while they keep up.
        """
        return max(MIN_IN_FLIGHT, math.ceil(replies * IN_FLIGHT_SECONDS / max(seconds, IN_FLIGHT_SECONDS)))

    def _aligned(self, replies: list[Reply], round_label: int | str) -> list[Reply]:
        """The replies of the sites whose columns are the ones most sites name (:func:`fedica.protocol.column_majority`).

        A site that reports column names (:data:`fedica.protocol.COLUMNS_KEY`: a deployed site reads its own
        file, which the server never sees) is held to the names of more than half of the reporting sites from
        its first reply on; a site that names others, or changes its names during the run, is left out of the
        run with the difference named. With no such majority the run stops (:class:`MisalignedSites`).
        """
        kept = []
        for reply in replies:
            try:
                columns = reported_columns(reply.values)
            except InvalidReply as err:
                self.reject_node(self.node_of[reply.partition_id], round_label, f"malformed reply: {err}")
                continue
            if columns is not None:
                first = self.columns_of.setdefault(reply.partition_id, columns)
                if first != columns and reply.partition_id not in self.misaligned:
                    self.misaligned.add(reply.partition_id)
                    self.reject_node(self.node_of[reply.partition_id], round_label,
                                     f"its columns changed during the run ({name_difference(columns, first)}); none of "
                                     "its replies is used from now on")
            kept.append(reply)
        reference, differing = column_majority(self.columns_of)
        for partition in differing:
            if partition not in self.misaligned:
                self.misaligned.add(partition)
                agreeing = len(self.columns_of) - len(differing)
                self.reject_node(self.node_of[partition], round_label,
                                 f"its columns differ from those of {agreeing} of the {len(self.columns_of)} sites that "
                                 f"name theirs ({name_difference(self.columns_of[partition], reference)}); every site's "
                                 "data must have the same columns in the same order (they are read by position); "
                                 "none of its replies is used")
        return [reply for reply in kept if reply.partition_id not in self.misaligned]

    def reject_node(self, node: int, round_label: int | str, reason: str) -> None:
        """Record (and log) a reply that was left out, naming its client if known."""
        record_rejection(self.rejected, self.partition_of.get(node, f"node-{node}"), round_label, reason)

    def clients_record(self, answered: int) -> dict[str, Any]:
        """The ``clients`` entry of the result."""
        return {"expected": self.expected, "answered": answered, "rejected": self.rejected}

    def _check_claim(self, node: int, partition: int, seen: set[int]) -> None:
        """Raise :class:`InvalidReply` unless ``node`` may answer as ``partition`` (see ``bound_partitions``)."""
        if self.bound_partitions is not None:
            if self.bound_partitions.get(node) != partition:
                raise InvalidReply(f"claims partition-id {partition}; this node is partition {self.bound_partitions.get(node)}")
            return
        if self.partition_of.setdefault(node, partition) != partition:
            raise InvalidReply(f"partition-id {partition} differs from the {self.partition_of[node]} this node sent before")
        if partition in self.contested:
            raise InvalidReply(f"partition-id {partition} is contested by several nodes; none of them is used")
        if partition in seen or self.node_of.get(partition, node) != node:
            self.contested.add(partition)
            self.node_of.pop(partition, None)
            raise InvalidReply(f"partition-id {partition} is claimed by another node too; neither is used from now on")

    def _targets(self, request: Request) -> dict[int, dict[str, Any]]:
        if request.payloads is None:
            return {node: {} for node in self.nodes}
        return {self.node_of[p]: arrays for p, arrays in request.payloads.items() if p in self.node_of}

    @staticmethod
    def _size_limits(sent: list[Message], received: list[Message]) -> dict[str, int]:
        """The most bytes each reply (by its reply-to id) may hold, from what its node was sent and the others' replies."""
        sent_bytes = {m.metadata.message_id: content_bytes(m.content) for m in sent}
        sizes = {m.metadata.reply_to_message_id: content_bytes(m.content) for m in received if not m.has_error()}
        return reply_size_limits(sent_bytes, sizes)

    def _decode(self, node: int, message: Message, round_label: int | str, seen: set[int],
                size_limit: int) -> Reply | None:
        if message.has_error():
            reason = f"client error (code {message.error.code}): {client_text(message.error.reason)}"
            if message.error.code == ErrorCode.MESSAGE_UNAVAILABLE:
                reason += f" ({UNAVAILABLE_HINT})"
            self.reject_node(node, round_label, reason)
            return None
        try:
            check_reply_size(content_bytes(message.content), size_limit)
            arrays, values = unpack(message.content)
            partition = require_int(values, "partition-id", minimum=0, maximum=self.expected - 1)
            self._check_claim(node, partition, seen)
        except (MalformedMessage, InvalidReply) as err:
            self.reject_node(node, round_label, f"malformed reply: {err}")
            return None
        self.node_of.setdefault(partition, node)
        if ERROR_KEY in values:
            self.reject_node(node, round_label, f"client error: {client_text(values[ERROR_KEY])}")
            return None
        return Reply(partition, arrays, values)
