"""RF-ICA's client side of the protocol: the local FastICA a client runs on its own observations.

:data:`TASKS` is its entry in fedica's one task registry (:data:`fedica.tasks.CLIENT_TASKS`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedica.protocol.messages import RFICA_FIT
from fedica.protocol.tasks import Handler, Site
from fedica.rfica.local import local_fastica
from fedica.seeding import generator

Reply = tuple[dict[str, np.ndarray], dict[str, Any]]


def fit(Y: np.ndarray, values: Mapping[str, Any], partition_id: int) -> Reply:
    """The client's mixing estimate (unit-norm columns) and its sample count.

    Parameters
    ----------
    Y : ndarray of shape (r, n_samples)
        The client's observations, one column per sample.
    values : mapping
        ``contrast``, ``init`` and ``seed`` from the server.
    partition_id : int
    """
    seed = int(values["seed"])
    start = time.perf_counter()
    estimate = local_fastica(Y, contrast=str(values["contrast"]), init=str(values["init"]),
                             random_state=generator(seed, "client.fastica", partition_id), shared_init_seed=seed)
    return {"mixing": estimate}, {"n-samples": Y.shape[1], "fit-seconds": time.perf_counter() - start}


def _fit_task(site: Site, arrays: Mapping[str, Any], values: Mapping[str, Any]) -> Reply:
    return fit(site.observations(values), values, site.partition_id)


TASKS: dict[str, Handler] = {RFICA_FIT: _fit_task}
