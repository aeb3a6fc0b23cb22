"""The client side of every fedica protocol: one registry of tasks, and the chain of reply transforms.

A client answers a request with the handler its task names; the handler sees the site's data and
the site's state between messages (:class:`Site`), the request's arrays and values, and returns
the reply's arrays and values. After the handler, every transform of the registry's chain sees
the task, the site, the request and the reply so far, and returns the reply to send: the hostile
behaviour of a robustness run is such a transform (:func:`fedica.attacks.hostile.hostile_reply`), and so
would be a privacy step that adds noise to what leaves the site.

fedica's Flower ClientApp (``fedica.clients.app``), the library's estimators and the in-memory
comparators all answer through one registry (:data:`fedica.tasks.CLIENT_TASKS`), so a client
computes the same reply whatever carries its messages.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from fedica.protocol.messages import (
    CATEGORY,
    DATA_DIGEST,
    DATA_DIGEST_KEY,
    DIGEST_FOR_TASK_KEY,
    DIGEST_SALT_KEY,
    OBSERVATION_TASKS,
)
from fedica.sites import ClientData

# Set by fedica's in-process and simulation engines, for their clients and their server (the user's own): the
# clients may read the files the run config names, and a private run's sites draw their noise from the run's seed.
LOCAL_ENGINE_VARIABLE = "FEDICA_LOCAL_ENGINE"

# How a site's points are brought into the units a request names: the request value's key, and the function that
# gives the site's data in those units. An algorithm that sends such a value registers its own when its module is
# imported (FedGEM's standardisation: fedica.fedgem.standardisation), so that the kit names no algorithm.
POINT_UNITS: dict[str, Callable[[ClientData, Mapping[str, Any]], ClientData]] = {}

Arrays = dict[str, np.ndarray]
Values = dict[str, Any]
ReplyParts = tuple[Arrays, Values]


class Site(Protocol):
    """What a task handler may know of the client it runs for.

    Attributes
    ----------
    partition_id : int
    state : mutable mapping of str to ndarray
        What the site keeps between messages (FedGEM's current centroids).
    run_config : mapping or None
        fedica's own run configuration (its scenario, seed and attack), for fedica's own clients;
        None for a user's site.
    noise_secret : int or None
        The seed of a private run's noise known to this site alone (docs/ALGORITHMS.md section
        2.13); None: the noise is drawn from the run's seed, which the server knows (the library
        and fedica's local engines, where the server and the sites are one user's process).
    """

    partition_id: int
    state: MutableMapping[str, np.ndarray]
    run_config: Mapping[str, Any] | None
    noise_secret: int | None

    def points(self, values: Mapping[str, Any]) -> ClientData:
        """The site's points for clustering (FedGEM, FFCM, AFCL): train and test rows, K_g.

        In the units the request names (:data:`POINT_UNITS`): standardised when ``values`` names a
        standardisation (:func:`fedica.fedgem.standardisation.in_request_units`; a site that chooses its own K_g
        chooses on the standardised points), else the data's own.
        """

    def training_points(self, values: Mapping[str, Any]) -> np.ndarray:
        """The site's training rows (n, d) in the data's own units, whatever the request names; K_g is not chosen."""

    def observations(self, values: Mapping[str, Any]) -> np.ndarray:
        """The site's observations for ICA, shape (n_channels, n_samples)."""


@dataclass
class ArraySite:
    """A site held in memory: its points (and, transposed, its observations) and a dict for its state.

    Parameters
    ----------
    data : ClientData
    partition_id : int
    run_config : mapping or None, default=None
    noise_secret : int or None, default=None
        None: a private run's noise comes from the run's seed, reproducibly (see :class:`Site`).
    """

    data: ClientData
    partition_id: int
    run_config: Mapping[str, Any] | None = None
    state: dict[str, np.ndarray] = field(default_factory=dict)
    noise_secret: int | None = None
    # The points in the last units a request named, and those units: a run names one standardisation in every
    # request after its first, so the site standardises once, not once a message.
    _in_units: tuple[Any, ClientData] | None = field(default=None, init=False, repr=False)

    def points(self, values: Mapping[str, Any]) -> ClientData:
        key = next((key for key in POINT_UNITS if values.get(key) is not None), None)
        if key is None:
            return self.data
        if self._in_units is None or self._in_units[0] != values[key]:
            self._in_units = (values[key], POINT_UNITS[key](self.data, values))
        return self._in_units[1]

    def training_points(self, values: Mapping[str, Any]) -> np.ndarray:
        return self.data.X_train

    def observations(self, values: Mapping[str, Any]) -> np.ndarray:
        return self.data.X_train.T


def site_digest(site: Site, task: str, values: Mapping[str, Any]) -> str:
    """A salted SHA-256 of the data ``task`` reads at ``site`` (its observations for RF-ICA's tasks, its training
    points for the others'): the array's shape and float64 bytes, after the salt of ``values``.

    It tells the server whether the site's data is the same as when the run began, and nothing
    else of it but whether it equals a whole data set the server already holds (docs/ALGORITHMS.md
    section 2.13: outside a private run's guarantee, like the evaluation's counts).
    """
    salt = values.get(DIGEST_SALT_KEY)
    if not (isinstance(salt, str) and re.fullmatch(r"[0-9a-f]{32,128}", salt)):
        raise ValueError(f"a data digest's salt must be 32 to 128 hex digits, got {str(salt)[:40]!r}")
    data = site.observations(values) if task in OBSERVATION_TASKS else site.training_points(values)
    data = np.ascontiguousarray(data, dtype=np.float64)
    digest = hashlib.sha256(bytes.fromhex(salt))
    digest.update(f"{data.shape}".encode())
    digest.update(data.tobytes())
    return digest.hexdigest()


def data_digest(site: Site, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any]) -> ReplyParts:
    """A resumed run's check of the site's data: :func:`site_digest` of the data the run's first task reads (named
    by the request), to compare with the digest the site sent with its first reply."""
    task = values.get(DIGEST_FOR_TASK_KEY)
    if task not in CATEGORY or task == DATA_DIGEST:
        raise ValueError(f"a data check names no task whose data it covers ({DIGEST_FOR_TASK_KEY}={task!r})")
    return {}, {DATA_DIGEST_KEY: site_digest(site, task, values)}


def digest_reply(task: str, site: Site, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any],
                 reply: ReplyParts) -> ReplyParts:
    """The reply transform of a journalled run's first request (it carries the run's salt): the reply also holds
    :func:`site_digest` of the data the task read, which the journal records (:mod:`fedica.protocol.journal`)."""
    if DIGEST_SALT_KEY not in values or task == DATA_DIGEST:
        return reply
    reply_arrays, reply_values = reply
    return reply_arrays, {**reply_values, DATA_DIGEST_KEY: site_digest(site, task, values)}


# The tasks every fedica client answers whatever its algorithm.
KIT_TASKS: dict[str, Callable[..., ReplyParts]] = {DATA_DIGEST: data_digest}


# handler(site, request arrays, request values) -> reply
Handler = Callable[[Site, Mapping[str, np.ndarray], Mapping[str, Any]], ReplyParts]
# transform(task, site, request arrays, request values, reply) -> reply
Transform = Callable[[str, Site, Mapping[str, np.ndarray], Mapping[str, Any], ReplyParts], ReplyParts]


@dataclass(frozen=True)
class ClientTasks:
    """Task name -> handler, and the ordered chain of reply transforms applied after every handler.

    Parameters
    ----------
    handlers : mapping of str to callable
        ``handler(site, arrays, values) -> (arrays, values)``.
    transforms : tuple of callable, default=()
        ``transform(task, site, arrays, values, reply) -> reply``, applied in order.
    concurrent : frozenset of str, default=frozenset()
        The tasks that different sites may answer at once on threads of one process
        (:mod:`fedica.concurrency`): their handlers, and the transforms on them, change nothing
        process-wide but through a :class:`fedica.concurrency.SharedContext`, and one site's reply does
        not depend on when another's is computed.
    """

    handlers: Mapping[str, Handler]
    transforms: tuple[Transform, ...] = ()
    concurrent: frozenset[str] = frozenset()

    def answer(self, task: str, site: Site, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any]) -> ReplyParts:
        """The reply of ``site`` to one request: the task's handler, then every transform in order.

        Raises
        ------
        ValueError
            For a task no handler answers (or whatever the handler refuses).
        """
        handler = self.handlers.get(task)
        if handler is None:
            raise ValueError(f"this client answers no task {task!r} (it answers {', '.join(sorted(self.handlers))})")
        reply = handler(site, arrays, values)
        for transform in self.transforms:
            reply = transform(task, site, arrays, values, reply)
        return reply

    def with_transforms(self, *transforms: Transform) -> ClientTasks:
        """The same handlers, with ``transforms`` appended to the chain (e.g. a privacy step)."""
        return ClientTasks(self.handlers, self.transforms + tuple(transforms), self.concurrent)
