"""The in-process Grid: a Flower ``Grid`` that hands each message straight to a ClientApp in this process.

No Ray and no transport, for fast sweeps and tests; the strategies and the ServerApp logic run
over it exactly as over Flower's own runtimes. ``fedica-run engine=inprocess``
(:func:`fedica.scripts.engines.run_inprocess`) builds one from the run's node configs.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable
from typing import Any
from uuid import uuid4

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from fedica.concurrency import thread_map


class InProcessGrid(Grid):
    """A Grid that delivers each message straight to a ClientApp in this process.

    Every node keeps its own :class:`flwr.app.Context` (so per-node state persists
    across rounds as under Flower's runtimes), and an exception in the ClientApp
    becomes an error reply, as a SuperNode would send. Node ids are random 64-bit
    integers whose order does not follow the partition ids, as in Flower.

    Parameters
    ----------
    client_app : flwr.clientapp.ClientApp
    node_configs : list of dict
        One node config per node (``partition-id``, ``num-partitions``, ...).
    seed : int
        Seeds the node ids.
    concurrent_types : collection of str, default=()
        The message types the ClientApp may answer for several nodes at once, on threads of this
        process (:mod:`fedica.concurrency`; fedica's are its registry's concurrent tasks).
    n_jobs : int or None, default=None
        Threads for those messages (None: one, -1: every core); the replies are the same for every value.
    """

    def __init__(self, client_app: ClientApp, node_configs: list[dict[str, Any]], *, seed: int = 0,
                 concurrent_types: Collection[str] = (), n_jobs: int | None = None):
        self._client_app = client_app
        self._concurrent_types = frozenset(concurrent_types)
        self._n_jobs = n_jobs
        rng = random.Random(seed)
        self._run = Run.create_empty(run_id=rng.getrandbits(63))
        self._contexts: dict[int, Context] = {}
        for node_config in node_configs:
            node_id = rng.getrandbits(63) + 2  # 0 and 1 are reserved by Flower
            self._contexts[node_id] = Context(self._run.run_id, node_id, dict(node_config), RecordDict(), {})
        self._replies: dict[str, Message] = {}
        # Messages take their run and source ids from the task identity, as inside a ServerApp process.
        TaskIdentity.task_id = 1
        TaskIdentity.run_id = self._run.run_id
        TaskIdentity.node_id = SUPERLINK_NODE_ID

    @property
    def node_partitions(self) -> dict[int, int]:
        """The partition id of every node, from the node configs this grid was built with."""
        return {node: int(context.node_config["partition-id"]) for node, context in self._contexts.items()}

    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self._contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        delivered = []
        for message in messages:
            message_id = str(uuid4())
            message.metadata.__dict__["_message_id"] = message_id
            context = self._contexts.get(message.metadata.dst_node_id)
            if context is not None:
                delivered.append((message_id, message, context))
        # Several nodes at once only when every message may be answered so (one node's messages stay in order).
        concurrent = all(m.metadata.message_type in self._concurrent_types for _, m, _ in delivered) and (
            len({m.metadata.dst_node_id for _, m, _ in delivered}) == len(delivered))
        replies = thread_map(self._answer, [(m, c) for _, m, c in delivered], self._n_jobs if concurrent else None)
        for (message_id, _, _), reply in zip(delivered, replies):
            self._replies[message_id] = reply
        return [message_id for message_id, _, _ in delivered]

    def _answer(self, delivery: tuple[Message, Context]) -> Message:
        """The ClientApp's reply to one message; an exception becomes an error reply, as a SuperNode sends it."""
        message, context = delivery
        try:
            return self._client_app(message, context)
        except Exception as err:  # noqa: BLE001 - a SuperNode turns a ClientApp exception into an error reply
            return Message(
                Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(err).__name__}: {err}"),
                reply_to=message,
            )

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in message_ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))
