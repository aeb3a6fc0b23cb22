"""FedGEM's server-side records of the clients' models: what the protocol and its trust rules share.

The FedGEM server (:mod:`fedica.fedgem.coordinator`) fills them from the clients' replies; the trust
rules (:mod:`fedica.fedgem.trust`) read them (docs/ALGORITHMS.md section 2.5).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class ClientModel:
    """What the server knows of one client: its declared sizes and the centroids it was sent last."""

    n_points: int            # the count the server uses (declared, capped by count_cap_factor)
    weights: np.ndarray      # (K_g,) pi
    centroids: np.ndarray    # (K_g, d) the centroids the server sent (or the client reported at initialisation)

    declared_points: int = 0
    # (K_g,) a spherical site's variances at ``centroids`` (sent back with them, so that a site keeps no state
    # the journal cannot give back); None: unit variance
    variances: np.ndarray | None = None

    @property
    def n_components(self) -> int:
        return self.weights.shape[0]


@dataclass
class Components:
    """All clients' components stacked for a server step."""

    partitions: list[int]
    centers: np.ndarray   # (m, d)
    eps: np.ndarray       # (m,)
    owners: np.ndarray    # (m,) partition id of each component
    weights: np.ndarray   # (m,) N_g * pi_k
    variances: np.ndarray | None = None   # (m,) sigma_k^2 of a spherical site's final components; None: unit variance

    def slices(self) -> dict[int, slice]:
        """Each client's rows: its components are stacked contiguously, in the order of ``partitions``."""
        starts = np.flatnonzero(np.r_[True, self.owners[1:] != self.owners[:-1]]) if self.owners.size else []
        ends = list(starts[1:]) + [self.owners.size]
        return {int(self.owners[a]): slice(int(a), int(b)) for a, b in zip(starts, ends)}


@dataclass(frozen=True)
class Support:
    """What a global cluster needs to be counted (:func:`fedica.fedgem.trust.unsupported_clusters`)."""

    quorum: int
    typical_mass: float
    masses: np.ndarray   # (m,) each final component's weight, its client's count capped at the median
