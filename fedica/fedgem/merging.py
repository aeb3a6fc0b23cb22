"""FedGEM's server step of a collaborative round and its final aggregation (docs/ALGORITHMS.md section 2).

Every client component is a ball: centre ``M`` (the client's M-step maximiser) and radius
``sqrt(eps)``. Components of different clients overlap when their balls meet; super-clusters
are built by a union-find that never puts two components of one client together
(:mod:`fedica.fedgem.superclusters`). In a collaborative round every member of a super-cluster
moves to one consensus point inside all member balls (:mod:`fedica.fedgem.consensus`); in the
final aggregation the members are averaged.

Conventions shared by the server-side modules: ``centers`` is ``(m, d)``, ``radii`` are ball
radii (not squared), ``owners`` are integer client ids and ``weights`` are the components'
positive weights ``N_g * pi_k``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedica.fedgem.consensus import consensus_centers, segment_sum
from fedica.fedgem.superclusters import nested_super_clusters, super_clusters
from fedica.validation import as_centers, as_vector


@dataclass(frozen=True)
class ServerStep:
    """Result of one collaborative server step.

    Attributes
    ----------
    new_centers : ndarray of shape (m, d)
        Centroid each component's client adopts.
    labels : ndarray of shape (m,)
        Super-cluster of every component.
    n_super_clusters : int
    """

    new_centers: np.ndarray
    labels: np.ndarray
    n_super_clusters: int


def server_step(centers, eps, owners, weights, *, max_pairs=None):
    """One collaborative server step: super-clusters, then consensus.

    Parameters
    ----------
    centers : array-like of shape (m, d)
        Maximisers ``M`` sent by the clients.
    eps : array-like of shape (m,)
        Squared radii; the balls have radius ``sqrt(eps)``.
    owners : array-like of shape (m,), int
        Client id of every component.
    weights : array-like of shape (m,)
        Positive weights ``N_g * pi_k``.
    max_pairs : int or None, default=None
        Memory budget on the overlapping pairs
        (:class:`fedica.fedgem.overlaps.TooManyOverlaps` above it).

    Returns
    -------
    ServerStep
    """
    centers = as_centers(centers)
    radii = np.sqrt(as_vector(eps, centers.shape[0], "eps"))
    labels = super_clusters(centers, radii, owners, max_pairs=max_pairs)
    new_centers = consensus_centers(centers, radii, weights, labels)
    n_super = int(labels.max()) + 1 if labels.size else 0
    return ServerStep(new_centers=new_centers, labels=labels, n_super_clusters=n_super)


@dataclass(frozen=True)
class FinalAggregation:
    """Result of the final aggregation.

    Attributes
    ----------
    labels : ndarray of shape (m,)
        Global cluster id of every component.
    global_centroids : ndarray of shape (k_hat, d)
        Weighted mean of the members of each global cluster; row ``l`` is cluster ``l``.
    k_hat : int
        Number of global clusters.
    """

    labels: np.ndarray
    global_centroids: np.ndarray
    k_hat: int


def final_aggregation(centers, eps_final, owners, weights, *, max_pairs=None):
    """Final merge: super-clusters on the final radii, then weighted means.

    Parameters
    ----------
    centers : array-like of shape (m, d)
        Final maximisers ``M``.
    eps_final : array-like of shape (m,)
        Squared final radii (see :func:`fedica.fedgem.local.final_radius`); balls have radius
        ``sqrt(eps_final)``.
    owners : array-like of shape (m,), int
        Client id of every component.
    weights : array-like of shape (m,)
        Positive weights ``N_g * pi_k``.
    max_pairs : int or None, default=None
        Memory budget on the overlapping pairs
        (:class:`fedica.fedgem.overlaps.TooManyOverlaps` above it).

    Returns
    -------
    FinalAggregation
    """
    centers = as_centers(centers)
    m = centers.shape[0]
    radii = np.sqrt(as_vector(eps_final, m, "eps_final"))
    weights = as_vector(weights, m, "weights", positive=True)
    return _averaged(centers, super_clusters(centers, radii, owners, max_pairs=max_pairs), weights)


def nested_final_aggregations(centers, eps_final, owners, weights, shares, *, max_pairs=None):
    """:func:`final_aggregation` at the squared radii ``share * eps_final`` for every share, in one sweep.

    An upsilon grid's final radii are such a family (``eps_final`` is proportional to upsilon):
    the super-clusters of all of them come from one union-find run
    (:func:`fedica.fedgem.superclusters.nested_super_clusters`, equal to one run per share except
    where two overlap ratios agree to the last bits).

    Parameters
    ----------
    centers, eps_final, owners, weights
        As :func:`final_aggregation`; ``eps_final`` the largest share's.
    shares : sequence of float
        Increasing, in ``(0, 1]``.
    max_pairs : int or None, default=None

    Returns
    -------
    list of (FinalAggregation or None)
        One per share; None where the sweep went over ``max_pairs`` before reaching it.
    """
    centers = as_centers(centers)
    m = centers.shape[0]
    radii = np.sqrt(as_vector(eps_final, m, "eps_final"))
    weights = as_vector(weights, m, "weights", positive=True)
    labels = nested_super_clusters(centers, radii, owners, np.sqrt(shares), max_pairs=max_pairs)
    return [None if found is None else _averaged(centers, found, weights) for found in labels]


def without_clusters(aggregation, centers, weights, dropped):
    """The final aggregation of the components outside the ``dropped`` clusters, without a new union-find.

    Equal to :func:`final_aggregation` on those components, bit for bit. A dropped cluster is a
    whole final set of the constrained union-find: every pair between it and another set was
    skipped (its ends stayed apart), and every set of the others only ever held the others, so
    each pair among them meets the same two sets, with the same owners, whether the dropped
    components are there or not. The others' partition is the same, and so are their labels,
    numbered by first appearance (the kept clusters keep their order).

    Parameters
    ----------
    aggregation : FinalAggregation
        Of every component (``centers`` and ``weights`` are its inputs).
    centers : array-like of shape (m, d)
    weights : array-like of shape (m,)
    dropped : ndarray of shape (k_hat,), dtype bool
        The clusters to leave out.

    Returns
    -------
    FinalAggregation
        Of the components whose cluster is kept, in their order.
    """
    kept = ~dropped[aggregation.labels]
    renumbered = np.cumsum(~dropped) - 1
    return _averaged(as_centers(centers)[kept], renumbered[aggregation.labels[kept]],
                     np.asarray(weights, dtype=float)[kept])


def _averaged(centers, labels, weights):
    """The weighted mean of each label's members, as a FinalAggregation."""
    k_hat = int(labels.max()) + 1 if labels.shape[0] else 0
    global_centroids = (
        segment_sum(centers, labels, k_hat, weights)
        / np.bincount(labels, weights=weights, minlength=k_hat)[:, None]
    )
    return FinalAggregation(labels=labels, global_centroids=global_centroids, k_hat=k_hat)
