"""Flower's simulation runtime as fedica drives it: its in-memory SuperLink state, looked up per node.

Flower 1.42's simulation hands messages to its Ray actors from one loop
(``flwr.server.superlink.fleet.vce.vce_api.add_messages_to_queue``) that, every 0.1 s, asks the
in-memory SuperLink state for each simulated node's next message. That lookup,
``InMemoryLinkState.get_message_ins``, re-checks every stored message (its expiry and federation,
under the state's lock) before reading whom it is addressed to: about 4 us per node and stored
message, so one pass over 1,000 nodes with 50 messages in flight takes 0.2 s, 4 ms for each
message it delivers. That, not Ray nor the ClientApps, was most of the simulation's cost at
1,000 SuperNodes (docs/PERFORMANCE.md, "Flower's simulation at 1,000 SuperNodes"), and the loop
holds the server process's interpreter while it runs.

:func:`node_filtered_message_lookup` replaces that lookup, for the duration of one simulation,
by one that reads the destination first and re-checks only the node's own messages, in the same
order, with the same checks: the same messages are returned and marked delivered, and a node's
expired message is deleted when that node is asked (every pass asks every node) rather than when
any node is. Written here because Flower offers no way to give its simulation another state;
``tests/server/test_simulation_state.py`` holds it equal to the installed Flower's own lookup,
so an upgrade that changes the original fails there first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from flwr.app import Message
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
from flwr.supercore.date import now


def node_filtered_get_message_ins(self: InMemoryLinkState, node_id: int, limit: int | None, *,
                                  run_id: int | None = None) -> list[Message]:
    """``InMemoryLinkState.get_message_ins`` that re-checks only the messages addressed to ``node_id``."""
    if limit is not None and limit < 1:
        raise AssertionError("`limit` must be >= 1")
    found: list[Message] = []
    with self.lock:
        for message_id, message in list(self.message_ins_store.items()):
            metadata = message.metadata
            if metadata.dst_node_id != node_id:
                continue
            self._check_stored_messages({message_id})  # may delete it (expired, or a node left the federation)
            if (message_id in self.message_ins_store and (run_id is None or metadata.run_id == run_id)
                    and metadata.delivered_at == ""):
                found.append(message)
            if limit and len(found) == limit:
                break
    delivered_at = now().isoformat()
    for message in found:
        message.metadata.delivered_at = delivered_at
    return found


@contextlib.contextmanager
def node_filtered_message_lookup() -> Iterator[None]:
    """Within the block, Flower's in-memory SuperLink state looks messages up per node (see the module)."""
    original = InMemoryLinkState.get_message_ins
    InMemoryLinkState.get_message_ins = node_filtered_get_message_ins
    try:
        yield
    finally:
        InMemoryLinkState.get_message_ins = original
