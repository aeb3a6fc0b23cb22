"""Choosing K_hat by the federated penalised likelihood (docs/ALGORITHMS.md section 2.6).

The candidates are partitions of all clients' final components into global clusters: the final
aggregation at each upsilon of the grid, and the path of merges that starts from the finest of them
and joins, one pair at a time, the two global clusters whose merge costs the least within-cluster
spread (Ward's cost), never two that share a client. Each client scores every candidate by the log-
likelihood of its own points under the candidate's global model, with its own weights and variance
(:func:`log_likelihoods`), and the entropy of its points' assignments; the server adds them up and
picks the candidate with the smallest ICL, ``-2 sum_g LL_g + K_hat d log N + 2 sum_g E_g`` (the
local parameters are the same in every candidate). A merge of
two separated clusters replaces both centres by the merged one, which lowers the likelihood of every
client holding either; a merge of two halves of one cluster costs almost nothing and saves d
parameters. The global model, rather than each client's consensus model (its own components' global
centres), is scored because a client whose local fit went wrong (two components in one true cluster)
cannot place its points in its consensus model under any candidate, which kept such clients' stray
components as clusters of their own (measured on the MNIST-sized workload: K_hat 15.3 against 11.6
with the global model). The silhouette of the clients' local labels sees neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from fedica.fedgem.merging import FinalAggregation

__all__ = ["Candidate", "EVIDENCE_MINORITY", "merge_path", "path_sizes", "evidence_path_sizes", "log_likelihoods", "bic", "icl", "relabel"]

# Merge-path candidates beyond which the path is sampled (path_sizes): the longest paths of the
# paper's workloads here have 52 merges (digits), a federation of 1,000 clients over 1,400.
MAX_PATH_CANDIDATES = 64
# Centres of all path candidates together (the digits workload's whole path: about 1,900).
MAX_PATH_CENTRES = 4096

# The evidence rule (docs/ALGORITHMS.md section 2.6.3): two global clusters may merge on the path when one client
# holds both, or the clients holding both are at most this share of the clients holding either (the Jaccard index
# of their supporting clients). A site's over-split leaves one to a few such clients among tens or hundreds (at most
# .06 in the G=1,000, K=50 workload); two distinct clusters share the clients that happen to hold both
# (from .06, median .38 there).
EVIDENCE_MINORITY = 0.1

# Smallest variance a client's consensus model may have (relative to its data's spread), so
# that a degenerate candidate cannot claim an infinite likelihood.
VARIANCE_FLOOR = 1e-6


@dataclass
class Candidate:
    """One candidate partition: the aggregation it gives and where it came from."""

    aggregation: FinalAggregation
    upsilon: float
    merges: int = 0


def relabel(labels: np.ndarray, centers: np.ndarray, weights: np.ndarray) -> FinalAggregation:
    """The aggregation of a labelling: labels renumbered 0..k-1 by first appearance, weighted-mean centroids."""
    _, first, inverse = np.unique(labels, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))
    dense = order[inverse]
    k_hat = int(dense.max()) + 1 if dense.size else 0
    mass = np.bincount(dense, weights=weights, minlength=k_hat)
    sums = np.zeros((k_hat, centers.shape[1]))
    np.add.at(sums, dense, centers * weights[:, None])
    return FinalAggregation(dense, sums / mass[:, None], k_hat)


def path_sizes(start_k: int, min_clusters: int, limit: int = MAX_PATH_CANDIDATES,
               max_centres: int = MAX_PATH_CENTRES) -> set[int]:
    """The cluster counts of a merge path from ``start_k`` that become candidates.

    Every count below ``start_k`` down to ``min_clusters`` while they are at most ``limit``;
    otherwise the ``limit // 2`` smallest (near the lower bound on K, where one merge changes
    the model most) and about as many more spaced geometrically up to ``start_k - 1``. Then
    the smallest counts are kept while their centres add up to at most ``max_centres``. Every
    client scores every candidate (``n_g`` times its centres), so this bounds the likelihood
    stage's messages and the clients' work.
    """
    counts = np.arange(min_clusters, start_k)
    if counts.size > limit:
        dense = counts[: limit // 2]
        spread = np.round(np.geomspace(dense[-1] + 1, start_k - 1, limit - dense.size)).astype(int)
        counts = np.union1d(dense, spread)
    return set(counts[np.cumsum(counts) <= max_centres].tolist())


def evidence_path_sizes(start_k: int, min_clusters: int, max_centres: int = MAX_PATH_CENTRES) -> set[int]:
    """The cluster counts of an evidence-rule merge path that become candidates (:func:`path_sizes`).

    Such a path may run down to one cluster, far below the truth of a large federation, so the
    dense window of :func:`path_sizes` is widened: every count from ``min_clusters`` while
    their centres add up to half of ``max_centres`` (1 to 63 with the default budget), then as
    many spread geometrically above, within the same budget of centres.
    """
    dense = int(np.searchsorted(np.cumsum(np.arange(min_clusters, start_k)), max_centres // 2, side="right"))
    return path_sizes(start_k, min_clusters, limit=max(2 * dense, MAX_PATH_CANDIDATES), max_centres=max_centres)


def merge_path(start: FinalAggregation, centers: np.ndarray, owners: np.ndarray, weights: np.ndarray,
               *, min_clusters: int, sizes: set[int] | Callable[[int], set[int]] | None = None,
               minority: float = 0.0, only_shared: bool = False) -> list[FinalAggregation]:
    """Greedy merges from ``start`` down to ``min_clusters`` global clusters (or until no pair may merge).

    Each step joins the two clusters with the smallest Ward cost
    ``w_a w_b / (w_a + w_b) ||c_a - c_b||^2`` among the pairs that may merge; of equal costs the
    pair first in (row, column) order, and the later cluster joins the earlier. With
    ``minority`` 0 (the strict same-client rule) a pair may merge when it shares no client (a
    client's components are distinct clusters by the model); with ``minority`` above 0 (the
    evidence rule, docs/ALGORITHMS.md section 2.6.3) also when the clients holding both are one,
    or at most ``minority`` times the clients holding either (the Jaccard index of their
    supporting clients). Only the merged
    cluster's costs change in a step, so they are updated in place, and each cluster keeps the
    cheapest partner it may join (a full recomputation would cost ``k^2 (d + clients)`` per step).

    Parameters
    ----------
    start : FinalAggregation
    centers : ndarray of shape (m, d)
    owners : ndarray of shape (m,)
    weights : ndarray of shape (m,)
    min_clusters : int
    sizes : set of int, or callable, optional
        The cluster counts whose aggregation is returned (default: every step's); a callable
        receives the count the path ended at (``min_clusters`` or where no pair may merge)
        and returns them.
    minority : float, default=0.0
        The largest share of the clients holding either cluster of a merge that may hold both
        (0: none may, the strict rule; above 0, one client may, whatever the share).
    only_shared : bool, default=False
        Merge only pairs that share a client: the joins the strict rule refused (the path of a
        fixed upsilon, whose radii already decided the pairs that share none).

    Returns
    -------
    path : list of FinalAggregation
        The aggregation after each merge whose cluster count is in ``sizes`` (``start`` itself
        not included), in merge order.
    """
    ids, cluster_of = np.unique(start.labels, return_inverse=True)
    cluster_of = cluster_of.reshape(-1)
    k = ids.size
    mass = np.bincount(cluster_of, weights=weights, minlength=k)
    sums = np.zeros((k, centers.shape[1]))
    np.add.at(sums, cluster_of, centers * weights[:, None])
    sharing = _ClientSharing(cluster_of, owners, k, minority, only_shared)
    cost = np.stack([_ward_costs(sums / mass[:, None], mass, row) for row in range(k)]).reshape(k, k)
    cost[sharing.blocked] = np.inf
    partner = np.argmin(cost, axis=1)
    partner_cost = cost[np.arange(k), partner]
    merged_into = np.arange(k)
    merges, alive = [], k
    while alive > min_clusters:
        a = int(np.argmin(partner_cost))
        if not np.isfinite(partner_cost[a]):
            break
        b = int(partner[a])
        mass[a] += mass[b]
        sums[a] += sums[b]
        merged_into[merged_into == b] = a
        blocked = sharing.merge(a, b)
        cost[b, :] = cost[:, b] = partner_cost[b] = np.inf
        row = np.where(blocked, np.inf, _ward_costs(sums / mass[:, None], mass, a))
        row[merged_into != np.arange(k)] = np.inf
        cost[a, :] = cost[:, a] = row
        stale = np.flatnonzero((partner == a) | (partner == b))
        partner[stale] = np.argmin(cost[stale], axis=1)
        partner_cost[stale] = cost[stale, partner[stale]]
        closer = (row < partner_cost) | ((row == partner_cost) & (a < partner))
        partner[closer], partner_cost[closer] = a, row[closer]
        partner_cost[merged_into != np.arange(k)] = np.inf
        alive -= 1
        merges.append((a, b))
    wanted = sizes(alive) if callable(sizes) else sizes
    path, merged_into = [], np.arange(k)
    for step, (a, b) in enumerate(merges, start=1):
        merged_into[merged_into == b] = a
        if wanted is None or k - step in wanted:
            path.append(relabel(ids[merged_into[cluster_of]], centers, weights))
    return path


class _ClientSharing:
    """Which pairs of a merge path's clusters may not merge, by the clients they share.

    Strict (``minority`` 0): a pair that shares a client is blocked, and stays blocked as the
    clusters grow, so a merge ORs the two rows. Evidence (``minority`` > 0, or ``only_shared``):
    a pair is blocked when two or more clients hold both and they outnumber ``minority`` times the
    clients holding either (their Jaccard index exceeds ``minority``): one client never blocks a
    join alone; the counts change with every merge, so each cluster's clients
    are kept (a ``(k, clients)`` 0/1 table) and the merged cluster's row is recounted,
    ``O(k clients)`` a merge.
    """

    def __init__(self, cluster_of: np.ndarray, owners: np.ndarray, k: int, minority: float, only_shared: bool):
        client_of = np.unique(owners, return_inverse=True)[1].reshape(-1)
        membership = sparse.csr_matrix((np.ones(cluster_of.size), (cluster_of, client_of)),
                                       shape=(k, client_of.max() + 1))
        self.minority, self.only_shared = minority, only_shared
        self.clients: np.ndarray | None = None
        if minority <= 0 and not only_shared:
            self.blocked = (membership @ membership.T).toarray() > 0
            return
        self.clients = (membership.toarray() > 0).astype(np.float32)  # a client with two components counts once
        self.supporters = self.clients.sum(axis=1)
        self.blocked = self._blocked(self.clients @ self.clients.T, self.supporters[:, None])
        np.fill_diagonal(self.blocked, True)

    def _blocked(self, shared: np.ndarray, supporters: np.ndarray) -> np.ndarray:
        blocked = shared > np.maximum(1.0, self.minority * (supporters + self.supporters - shared))
        return blocked | (shared == 0) if self.only_shared else blocked

    def merge(self, a: int, b: int) -> np.ndarray:
        """Cluster ``b`` joins ``a``: the new blocked row of ``a`` (k,)."""
        if self.clients is None:
            self.blocked[a] |= self.blocked[b]
        else:
            np.maximum(self.clients[a], self.clients[b], out=self.clients[a])
            self.clients[b] = 0.0
            self.supporters[a] = self.clients[a].sum()
            self.blocked[a] = self._blocked(self.clients @ self.clients[a], self.supporters[a])
            self.blocked[a, a] = True
        self.blocked[:, a] = self.blocked[a]
        return self.blocked[a]


def _ward_costs(centroids: np.ndarray, mass: np.ndarray, row: int) -> np.ndarray:
    """Ward's merge cost (k,) of cluster ``row`` with every cluster."""
    gaps = ((centroids[row] - centroids) ** 2).sum(axis=1)
    return mass[row] * mass / (mass[row] + mass) * gaps


def log_likelihoods(X: np.ndarray, candidates) -> tuple[np.ndarray, np.ndarray]:
    """A client's log-likelihood of its points under each candidate global model, and the entropy of its assignments.

    Each model is an isotropic Gaussian mixture with the candidate's global centres, the
    client's own weights (the shares of its points nearest each centre, at least one point
    each) and its own variance (the maximum likelihood value given those assignments).

    Parameters
    ----------
    X : ndarray of shape (n, d)
    candidates : sequence of ndarray of shape (K_hat_l, d)

    Returns
    -------
    log_likelihoods : ndarray of shape (L,)
    entropies : ndarray of shape (L,)
        ``-sum_n sum_k t_nk log t_nk`` for the posterior probabilities ``t`` of each model: how
        ambiguously the model assigns the client's points (ICL's penalty).
    """
    n, d = X.shape
    floor = VARIANCE_FLOOR * max(float(X.var(axis=0).mean()), np.finfo(float).tiny)
    # All candidates at once: their centres stacked in one (k, n) distance matrix, each
    # candidate a block of rows, so that every per-point value broadcasts over a contiguous
    # block in place (2x faster at 6,000 centres than the (n, k) layout's gathers).
    centres = np.vstack(list(candidates))
    sizes = np.array([len(c) for c in candidates])
    blocks = [slice(start, start + size) for start, size in zip(np.r_[0, np.cumsum(sizes)[:-1]].tolist(), sizes.tolist())]
    distances = centres @ (-2.0 * X).T
    distances += np.einsum("kd,kd->k", centres, centres)[:, None]
    distances += np.einsum("nd,nd->n", X, X)
    np.maximum(distances, 0.0, out=distances)
    nearest = np.empty((len(blocks), n))
    counts = np.empty(centres.shape[0])
    for model, rows in enumerate(blocks):
        nearest[model] = distances[rows].min(axis=0)
        counts[rows] = np.maximum((distances[rows] == nearest[model]).sum(axis=1), 1)
    variances = np.maximum(nearest.mean(axis=1) / d, floor)
    scores, entropies = np.empty(len(blocks)), np.empty(len(blocks))
    for model, rows in enumerate(blocks):
        # The block becomes the log joint density log pi_k + log N(x; c_k, v) (up to the
        # variance's normalising constant, added below), shifted by its maximum per point.
        log_joint = distances[rows]
        log_joint *= -0.5 / variances[model]
        log_joint += np.log(counts[rows] / counts[rows].sum())[:, None]
        peak = log_joint.max(axis=0)
        log_joint -= peak
        weights = np.exp(log_joint)
        totals = weights.sum(axis=0)
        log_totals = np.log(totals)
        scores[model] = (peak + log_totals).sum() - 0.5 * n * d * np.log(2 * np.pi * variances[model])
        # -sum_k t log t with t = w / W and log t = shifted - log W: log W - sum_k w shifted / W.
        weights *= log_joint
        entropies[model] = (log_totals - weights.sum(axis=0) / totals).sum()
    return scores, np.maximum(entropies, 0.0)


def bic(total_log_likelihood: np.ndarray, n_parameters: np.ndarray, n_points: int) -> np.ndarray:
    """BIC of each candidate (L,) from the clients' summed log-likelihoods (smaller is better).

    ``n_parameters`` (L,) is each candidate's count of global parameters (the geometry's,
    :meth:`fedica.fedgem.geometry.Identity.n_parameters`: ``K_hat d``).
    """
    return -2.0 * np.asarray(total_log_likelihood) + np.asarray(n_parameters) * np.log(n_points)


def icl(total_log_likelihood: np.ndarray, total_entropy: np.ndarray, n_parameters: np.ndarray,
        n_points: int) -> np.ndarray:
    """ICL (Biernacki et al. 2000) of each candidate (L,): the BIC plus twice the assignments' entropy (smaller is better)."""
    return bic(total_log_likelihood, n_parameters, n_points) + 2.0 * np.asarray(total_entropy)
