"""The experiment's own records of a run: what ``result.json`` reports and the server never uses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunBooks:
    """What the harness records beside the federation's transport books (:class:`fedica.server.federation.Federation`).

    Parameters
    ----------
    hostile_partitions : list of int
        The clients an ``attack`` config made hostile: recorded in the result (and used to score
        the honest clients apart), never told to the server.
    history : list of dict
        FedGEM's round records so far: a run that stops still reports the rounds it finished.
    """

    hostile_partitions: list[int] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
