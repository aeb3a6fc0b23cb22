"""The one in-memory driver: a protocol generator run to its end, its requests answered by sites in this process.

A protocol's server yields :class:`~fedica.protocol.messages.Request` objects and is sent the
replies (a list of :class:`~fedica.protocol.messages.Reply`, sorted by partition id). :func:`drive`
runs any protocol with any ``answer(request)``; :class:`InMemoryFederation` is the answer of sites
held in memory, through the client task registry, exactly as fedica's ClientApp answers over
Flower: the same handlers and reply transforms, the same ``server-round`` value, and a site that
refuses a request (``ValueError``) is left out with its reason as a Flower transport leaves out a
client's error reply. The estimators (:class:`fedica.FedGEM`, :class:`fedica.RFICA`) and the
in-memory comparators (:mod:`fedica.evaluation.comparison`) use it; over Flower, fedica's
strategies drive the same generators (``fedica.server.strategy``).

Given a :class:`~fedica.protocol.journal.Journal`, either records every completed stage and
replays those a journal already holds (:func:`~fedica.protocol.journal.journaled`): an interrupted
run resumes from its last completed stage to the result an uninterrupted one gives.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping

from fedica.concurrency import thread_map
from fedica.protocol.journal import Journal, journaled
from fedica.protocol.messages import (
    InvalidReply,
    Reply,
    Request,
    check_reply_size,
    client_text,
    payload_bytes,
    reply_size_limits,
)
from fedica.protocol.state import Rejection, record_rejection
from fedica.protocol.tasks import ClientTasks, Site

ProtocolRun = Generator[Request, list[Reply], None]
# Answers a protocol's requests over some transport: ``driver(protocol)`` runs it to its end.
ProtocolDriver = Callable[[ProtocolRun], None]


def drive(protocol: ProtocolRun, answer: Callable[[Request], list[Reply]], journal: Journal | None = None,
          books: Mapping[str, list] | None = None) -> None:
    """Run ``protocol`` to its end, sending it ``answer(request)`` for every request it yields.

    With a ``journal``, the stages it holds are replayed (not asked) and every new stage is recorded
    in it, with what it appended to ``books`` (the transport's lists, see
    :func:`~fedica.protocol.journal.journaled`).
    """
    if journal is not None:
        protocol = journaled(protocol, journal, books)
    try:
        request = next(protocol)
        while True:
            request = protocol.send(answer(request))
    except StopIteration:
        pass


class InMemoryFederation:
    """Sites in this process that answer a protocol's requests through a task registry.

    Parameters
    ----------
    sites : mapping of int to Site
        Each site by its partition id.
    tasks : ClientTasks
        The registry the sites answer with.
    rejected : list of dict
        The protocol's books (its ``rejected``): a site's refusal is recorded there as
        ``client error: <Error>: <message>``, and the site is left out of that exchange.
    n_jobs : int or None, default=None
        Threads on which the sites answer a task the registry declares concurrent
        (:mod:`fedica.concurrency`; None: one, -1: every core). The replies are the same for every value.
    """

    def __init__(self, sites: Mapping[int, Site], tasks: ClientTasks, rejected: list[Rejection],
                 n_jobs: int | None = None):
        self.sites = dict(sites)
        self.tasks = tasks
        self.rejected = rejected
        self.n_jobs = n_jobs

    def answer(self, request: Request) -> list[Reply]:
        """Every asked site's reply (all sites for a request without payloads), sorted by partition id."""
        targets = sorted(self.sites) if request.payloads is None else sorted(request.payloads)
        values = {**request.values, "server-round": str(request.round_label)}

        def site_reply(partition: int) -> Reply | ValueError:
            arrays = {} if request.payloads is None else request.payloads[partition]
            try:
                return Reply(partition, *self.tasks.answer(request.task, self.sites[partition], arrays, values))
            except ValueError as err:
                return err

        n_jobs = self.n_jobs if request.task in self.tasks.concurrent else None
        replies = []
        for partition, outcome in zip(targets, thread_map(site_reply, targets, n_jobs)):
            if isinstance(outcome, ValueError):
                record_rejection(self.rejected, partition, request.round_label,
                                 f"client error: {type(outcome).__name__}: {client_text(outcome)}")
            else:
                replies.append(outcome)
        return self._within_size(request, replies)

    def _within_size(self, request: Request, replies: list[Reply]) -> list[Reply]:
        """The replies the exchange's size limits admit (:func:`~fedica.protocol.messages.reply_size_limits`), as over Flower."""
        sent = {p: payload_bytes(arrays) for p, arrays in (request.payloads or {}).items()}
        sizes = {reply.partition_id: payload_bytes(reply.arrays, reply.values) for reply in replies}
        limits = reply_size_limits(sent, sizes)
        kept = []
        for reply in replies:
            try:
                check_reply_size(sizes[reply.partition_id], limits[reply.partition_id])
            except InvalidReply as err:
                record_rejection(self.rejected, reply.partition_id, request.round_label, f"malformed reply: {err}")
                continue
            kept.append(reply)
        return kept

    def run(self, protocol: ProtocolRun, journal: Journal | None = None) -> None:
        """Drive ``protocol`` to its end with these sites (a :data:`ProtocolDriver`); ``journal``: as for :func:`drive`.

        A site's refusal is the transport's entry in ``rejected``: a journal records it with its stage.
        """
        drive(protocol, self.answer, journal, {"rejected": self.rejected})
