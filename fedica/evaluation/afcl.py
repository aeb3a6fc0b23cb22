"""AFCL: federated competitive learning with unknown K (Zhang et al. 2025, AAAI; arXiv 2412.20341).

A comparator of FedGEM (FedGEM paper, section 6.1), the only other federated method without a known K,
written as a real federated protocol: :func:`afcl_protocol` is the server, a generator of
:class:`~fedica.protocol.Request` that is sent the clients' :class:`~fedica.protocol.Reply` lists;
:func:`client_reply` is the whole client side; :func:`afcl` drives both in memory and labels the test points.

This follows the authors' MATLAB code (github.com/Yunfan-Zhang/AFCL: ``AFCL_main.m``, ``AFCL_client.m``,
``AFCL_server.m``, ``AFCL_aggregation.m``; the paper itself was not reachable, its appendix is there), run
synchronously (every client in every round; the paper's asynchrony is a participation pattern, not part of the updates):

1. Initialisation: every client sends K_g k-means++ seeds drawn from its own points (so the server starts
   with K_max = sum_g K_g seeds, the upper bound the FedGEM paper gives AFCL) and its per-feature min and
   max; all later work is in the federation's min-max normalised units.
2. Client step: every point goes to its nearest seed; the client sends, per point, its winner and the
   weighted residual ``w * (x - m_winner)``, and per seed the centroid and mean distance to it of its points.
3. Server step: a federated Davies-Bouldin index from the per-seed statistics; the run stops once it
   changes by at most ``db_tol``. Otherwise the server rebuilds every point as ``x = r / w + m_winner`` and
   runs one pass of frequency-sensitive competitive learning over them: the winner minimises
   ``wins_l * ||x - m_l||^2``; the winner and its cooperating set (seeds no farther from it than x) move
   toward x by ``balance_g * w`` per feature; optionally (``rival_rate`` > 0, not in the authors' code) the
   nearest seed outside that set is pushed away as in RPCCL. The feature weights become proportional to
   ``1 / sum_h (D_j / D_h)^(1/beta)``, D being the summed absolute residuals per feature, with a mean of
   ``learning_rate``. Every seed is kept from round to round.
4. After the last round, seeds that coincide to ``merge_tol`` in every coordinate are merged (as the authors'
   code does once, after its loop); test points go to the nearest merged seed.

docs/ALGORITHMS.md section 2.10.2 gives the same steps, compared line by line with the authors' code, and why
on overlapping clusters (Waveform) the seeds collapse into one.

Every round's upload therefore carries one d-vector per training point, from which the server recovers the
client's data exactly: the privacy cost the FedGEM paper criticises. :func:`afcl` reports its size.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.sparse.csgraph import connected_components
from scipy.spatial.distance import cdist, pdist, squareform
from sklearn.cluster import kmeans_plusplus

from fedica.sites import ClientData
from fedica.evaluation.comparison import (
    BaselineResult,
    answer_on_array,
    baseline_result,
    check_clients,
    comparator_task,
    run_protocol,
    run_seed,
)
from fedica.protocol import (
    AFCL_INIT,
    AFCL_ROUND,
    ClientTasks,
    Handler,
    InvalidReply,
    ProtocolDriver,
    ProtocolState,
    Reply,
    Request,
    majority_width,
    reported_seconds,
    require_array,
    require_int,
)
from fedica.seeding import generator, sklearn_seed

__all__ = [
    "AFCLState",
    "afcl",
    "afcl_protocol",
    "client_reply",
    "competitive_pass",
    "feature_weights",
    "federated_davies_bouldin",
    "merge_seeds",
]

log = logging.getLogger("fedica.baselines")

# The authors' code also lets a seed within this squared distance of the winner cooperate (a near-duplicate).
DUPLICATE_SQUARED_DISTANCE = 1e-4

PRIVACY_NOTE = ("every AFCL round uploads one residual w * (x - m) per training point; the server, which chose w "
                "and m, recovers each point exactly as x = r / w + m (and the initial seeds are raw data points)")


# ------------------------------------------------------------------------------------------------ client side

def _client_init(X: np.ndarray, n_components: int, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any],
                 partition_id: int) -> dict[str, np.ndarray]:
    rng = generator(int(values["seed"]), "afcl.client_init", partition_id)
    seeds, _ = kmeans_plusplus(X, min(int(n_components), X.shape[0]), random_state=sklearn_seed(rng))
    return {"seeds": seeds, "feature-min": X.min(axis=0), "feature-max": X.max(axis=0)}


def _client_round(X: np.ndarray, n_components: int, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any],
                  partition_id: int) -> dict[str, np.ndarray]:
    seeds, weights, offset, scale = (np.asarray(arrays[key], dtype=np.float64)
                                     for key in ("seeds", "feature-weights", "offset", "scale"))
    dim = X.shape[1]
    if seeds.ndim != 2 or seeds.shape[1] != dim or any(a.shape != (dim,) for a in (weights, offset, scale)):
        raise ValueError(f"the server sent seeds of shape {seeds.shape} and weights of shape {weights.shape} "
                         f"for data with d={dim}")
    Z = (X - offset) / scale
    n_seeds = seeds.shape[0]
    winners = np.argmin(cdist(Z, seeds, "sqeuclidean"), axis=1)
    counts = np.bincount(winners, minlength=n_seeds)[:, None]
    sums = np.zeros_like(seeds)
    np.add.at(sums, winners, Z)
    # A seed without points reports itself as its centroid (the server sees its zero count).
    centroids = np.divide(sums, counts, out=seeds.copy(), where=counts > 0)
    distances = np.linalg.norm(Z - centroids[winners], axis=1)
    scatter = np.divide(np.bincount(winners, distances, minlength=n_seeds), counts[:, 0], out=np.zeros(n_seeds),
                        where=counts[:, 0] > 0)
    return {"residuals": weights * (Z - seeds[winners]), "winners": winners.astype(np.int64),
            "centroids": centroids, "scatter": scatter}


# AFCL's entries in the client task registry (fedica.tasks.CLIENT_TASKS).
TASKS: dict[str, Handler] = {AFCL_INIT: comparator_task(_client_init), AFCL_ROUND: comparator_task(_client_round)}


def client_reply(task: str, X: np.ndarray, n_components: int, arrays: Mapping[str, np.ndarray],
                 values: Mapping[str, Any], partition_id: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """One client's answer to one AFCL request (the registry's handler, on points given as an array).

    Parameters
    ----------
    task : {"afcl_init", "afcl_round"}
    X : ndarray of shape (n, d)
        The client's training points.
    n_components : int
        K_g, the number of seeds this client proposes at initialisation.
    arrays : mapping
        For a round: ``seeds`` (k, d) and ``feature-weights``, ``offset``, ``scale`` (d,) (the normalisation
        ``(x - offset) / scale``); nothing for the initialisation.
    values : mapping
        ``seed`` for the initialisation.
    partition_id : int

    Returns
    -------
    arrays : dict
        Initialisation: ``seeds`` (K_g, d), ``feature-min``, ``feature-max`` (d,). Round: ``residuals`` (n, d),
        ``winners`` (n,), ``centroids`` (k, d) and ``scatter`` (k,) (mean distance of a seed's points to their
        centroid).
    values : dict
        ``n-points`` and the client's own ``fit-seconds``.
    """
    return answer_on_array(TASKS, task, X, n_components, arrays, values, partition_id)


# ------------------------------------------------------------------------------------------------ server side

def federated_davies_bouldin(counts: np.ndarray, centroids: np.ndarray, scatter: np.ndarray) -> float:
    """The Davies-Bouldin index of the seeds' clusters from the clients' per-seed statistics.

    A seed's centroid and scatter are the count-weighted means of the clients' ones; then, as in
    scikit-learn's ``davies_bouldin_score``, ``DB = mean_l max_{j != l} (S_l + S_j) / ||c_l - c_j||`` over
    the seeds that received points. With one client this equals ``davies_bouldin_score`` on its points;
    with several, a seed's scatter is the mean of the clients' scatters about their own centroids, not
    about the pooled one (the clients never see it).

    Parameters
    ----------
    counts : ndarray of shape (G, k)
    centroids : ndarray of shape (G, k, d)
    scatter : ndarray of shape (G, k)

    Returns
    -------
    float
        NaN when fewer than two seeds received points.
    """
    totals = counts.sum(axis=0)
    live = totals > 0
    if live.sum() < 2:
        return float("nan")
    pooled = np.einsum("gk,gkd->kd", counts[:, live], centroids[:, live]) / totals[live, None]
    spread = (counts[:, live] * scatter[:, live]).sum(axis=0) / totals[live]
    separation = squareform(pdist(pooled))
    np.fill_diagonal(separation, np.inf)
    with np.errstate(divide="ignore"):
        ratios = (spread[:, None] + spread[None, :]) / separation
    return float(np.mean(ratios.max(axis=1)))


def competitive_pass(seeds: np.ndarray, batches: Sequence[tuple[np.ndarray, np.ndarray]], *,
                     rival_rate: float = 0.0) -> np.ndarray:
    """One pass of AFCL's server-side competitive learning over the rebuilt points, in order.

    For every point x: the winner c minimises ``wins_l * ||x - m_l||^2`` (frequent winners are penalised);
    every seed no farther from m_c than x is (the cooperating set, c included) moves by ``rate * (x - m_l)``;
    with ``rival_rate`` > 0 the rival r, the winner among the seeds outside that set, is pushed back by
    ``rival_rate * rate * min(1, ||x - m_c|| / ||m_r - m_c||) * (x - m_r)`` (RPCCL's rival penalty).

    Parameters
    ----------
    seeds : ndarray of shape (k, d)
    batches : sequence of (points of shape (n_g, d), rate of shape (d,))
        One batch per client, its points and its per-feature learning rate.
    rival_rate : float

    Returns
    -------
    ndarray of shape (k, d)
        The updated seeds (the input is not changed).
    """
    seeds = np.array(seeds, dtype=np.float64)
    wins = np.ones(seeds.shape[0])
    for points, rate in batches:
        for x in points:
            diff = x - seeds
            squared = np.einsum("kd,kd->k", diff, diff)
            winner = int(np.argmin(wins * squared))
            wins[winner] += 1
            gap = seeds - seeds[winner]
            gap_squared = np.einsum("kd,kd->k", gap, gap)
            cooperating = gap_squared <= max(squared[winner], DUPLICATE_SQUARED_DISTANCE)
            seeds[cooperating] += rate * diff[cooperating]
            if rival_rate > 0 and not cooperating.all():
                rival = int(np.argmin(np.where(cooperating, np.inf, wins * squared)))
                strength = min(1.0, float(np.sqrt(squared[winner] / gap_squared[rival])))
                seeds[rival] -= rival_rate * strength * rate * diff[rival]
    return seeds


def merge_seeds(seeds: np.ndarray, tol: float) -> np.ndarray:
    """Merge seeds that agree to within ``tol`` in every coordinate (chains included); keep each group's first.

    Parameters
    ----------
    seeds : ndarray of shape (k, d)
    tol : float

    Returns
    -------
    ndarray of shape (k', d), k' <= k, in the original order.
    """
    if seeds.shape[0] < 2:
        return seeds
    close = squareform(pdist(seeds, "chebyshev")) < tol
    _, groups = connected_components(close, directed=False)
    _, first = np.unique(groups, return_index=True)
    return seeds[np.sort(first)]


def feature_weights(absolute_residuals: np.ndarray, previous: np.ndarray, *, beta: float,
                    learning_rate: float) -> np.ndarray:
    """AFCL's per-feature learning rates ``w_j = d * learning_rate / sum_h (D_j / D_h)^(1/beta)``.

    Parameters
    ----------
    absolute_residuals : ndarray of shape (d,)
        D, the summed absolute residuals of all points per feature.
    previous : ndarray of shape (d,)
        Kept for a feature with D_j = 0 (the authors' code sets its weight to 1 there, a full step).
    beta : float
    learning_rate : float

    Returns
    -------
    ndarray of shape (d,)
    """
    spread = np.asarray(absolute_residuals, dtype=np.float64)
    used = spread > 0
    weights = previous.copy()
    if used.any():
        ratios = (spread[used][:, None] / spread[used][None, :]) ** (1.0 / beta)
        weights[used] = spread.size * learning_rate / ratios.sum(axis=1)
    return weights


@dataclass(kw_only=True)
class AFCLState(ProtocolState):
    """AFCL's parameters and, once the protocol has run, what it computed.

    Parameters
    ----------
    learning_rate : float
        The mean per-feature learning rate (the authors' ``a_r`` = 0.001).
    beta : float
        Exponent of the feature weighting (the authors' 7).
    rounds : int
        At most this many rounds (the FedGEM paper runs every iterative comparator for T=20).
    merge_tol : float
        After the last round, seeds that agree to within this in every normalised coordinate merge (the
        authors' 0.001).
    db_tol : float
        Stop once the federated Davies-Bouldin index changes by at most this (the authors' 1e-4).
    rival_rate : float
        Strength of an RPCCL rival penalty relative to the learning rate; 0 (the authors' code) disables it.
    seed : int
    min_clients : int

    Attributes
    ----------
    seeds : ndarray of shape (k, d) or None
        The current seeds, in normalised units ``(x - offset) / scale``.
    history : list of dict
        One entry per round: ``round``, ``clients``, ``seeds``, ``live_seeds``, ``davies_bouldin``.
    residual_bytes : int
        Bytes of the per-point residual arrays all clients sent.
    upload_bytes : int
        Bytes of all arrays all clients sent.
    """

    learning_rate: float = 1e-3
    beta: float = 7.0
    rounds: int = 20
    merge_tol: float = 1e-3
    db_tol: float = 1e-4
    rival_rate: float = 0.0
    seed: int = 0
    min_clients: int = 1
    dim: int | None = None
    offset: np.ndarray | None = None
    scale: np.ndarray | None = None
    seeds: np.ndarray | None = None
    weights: np.ndarray | None = None
    k_initial: int = 0
    davies_bouldin: float = float("nan")
    n_points: dict[int, int] = field(default_factory=dict)
    participations: dict[int, int] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    upload_bytes: int = 0
    residual_bytes: int = 0

    log_label = "AFCL "
    logger = log

    def payloads(self) -> dict[int, dict[str, np.ndarray]]:
        sent = {"seeds": self.seeds, "feature-weights": self.weights, "offset": self.offset, "scale": self.scale}
        return {p: dict(sent) for p in sorted(self.n_points)}

    def account(self, reply: Reply) -> None:
        self.client_seconds += reported_seconds(reply)
        self.upload_bytes += sum(a.nbytes for a in reply.arrays.values() if isinstance(a, np.ndarray))


def _validate_init(reply: Reply, dim: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    n_points = require_int(reply.values, "n-points", minimum=1)
    seeds = require_array(reply.arrays, "seeds", (None, dim))
    low = require_array(reply.arrays, "feature-min", (dim,))
    high = require_array(reply.arrays, "feature-max", (dim,))
    if not 1 <= seeds.shape[0] <= n_points:
        raise InvalidReply(f"'seeds' has {seeds.shape[0]} rows; a client with {n_points} points sends 1 to {n_points}")
    if np.any(low > high) or np.any(seeds < low) or np.any(seeds > high):
        raise InvalidReply("'seeds' lie outside the client's own [feature-min, feature-max] box, or min > max")
    return seeds, low, high, n_points


def receive_init(state: AFCLState, replies: list[Reply]) -> None:
    """Validate the initial seeds; set the federation's normalisation, the K_max seeds and uniform feature weights."""
    state.dim = majority_width(replies, "seeds")
    seeds, lows, highs = [], [], []
    for reply in replies:
        try:
            client_seeds, low, high, n_points = _validate_init(reply, state.dim)
        except InvalidReply as err:
            state.reject(reply.partition_id, "init", f"invalid reply: {err}")
            continue
        seeds.append(client_seeds)
        lows.append(low)
        highs.append(high)
        state.n_points[reply.partition_id] = n_points
        state.account(reply)
    state.require(len(seeds), "AFCL initialisation")
    with state.server_time():
        state.offset = np.min(lows, axis=0)
        span = np.max(highs, axis=0) - state.offset
        state.scale = np.where(span > 0, span, 1.0)  # a constant feature stays as it is
        stacked = (np.concatenate(seeds) - state.offset) / state.scale
        state.k_initial = stacked.shape[0]
        state.seeds = merge_seeds(stacked, state.merge_tol)
        state.weights = np.full(state.dim, state.learning_rate)


def _validate_round(state: AFCLState, reply: Reply) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if reply.partition_id not in state.n_points:
        raise InvalidReply("this client was not initialised")
    n_points, n_seeds = state.n_points[reply.partition_id], state.seeds.shape[0]
    residuals = require_array(reply.arrays, "residuals", (n_points, state.dim))
    winners = require_array(reply.arrays, "winners", (n_points,))
    if np.any(winners != np.round(winners)) or np.any(winners < 0) or np.any(winners >= n_seeds):
        raise InvalidReply(f"'winners' must be seed indices in [0, {n_seeds})")
    centroids = require_array(reply.arrays, "centroids", (n_seeds, state.dim))
    scatter = require_array(reply.arrays, "scatter", (n_seeds,), nonnegative=True)
    return residuals, winners.astype(np.int64), centroids, scatter


def receive_round(state: AFCLState, replies: list[Reply], round_number: int) -> list[tuple[int, tuple]]:
    """The valid round replies as ``(partition, (residuals, winners, centroids, scatter))``; invalid ones are skipped."""
    valid = []
    for reply in replies:
        try:
            parts = _validate_round(state, reply)
        except InvalidReply as err:
            state.reject(reply.partition_id, round_number, f"invalid reply: {err}")
            continue
        valid.append((reply.partition_id, parts))
        state.account(reply)
        state.residual_bytes += reply.arrays["residuals"].nbytes
        state.participations[reply.partition_id] = state.participations.get(reply.partition_id, 0) + 1
    state.require(len(valid), f"AFCL round {round_number}")
    return valid


def server_round(state: AFCLState, round_number: int, valid: list[tuple[int, tuple]]) -> bool:
    """The server's step on one round's replies; False once the Davies-Bouldin index has settled."""
    start = time.perf_counter()
    n_seeds = state.seeds.shape[0]
    counts = np.stack([np.bincount(winners, minlength=n_seeds) for _, (_, winners, _, _) in valid])
    db = federated_davies_bouldin(counts, np.stack([p[2] for _, p in valid]), np.stack([p[3] for _, p in valid]))
    state.history.append({"round": round_number, "clients": len(valid), "seeds": n_seeds,
                          "live_seeds": int((counts.sum(axis=0) > 0).sum()), "davies_bouldin": db})
    settled = abs(db - state.davies_bouldin) <= state.db_tol
    state.davies_bouldin = db
    if not settled:
        total = sum(state.participations.values())
        batches = []
        for partition, (residuals, winners, _, _) in valid:
            order = np.argsort(winners, kind="stable")  # seed by seed, as the authors' server reads them
            points = residuals[order] / state.weights + state.seeds[winners[order]]  # the client's data, rebuilt
            # The balancing mechanism: a client that took part less often moves the seeds more.
            batches.append((points, state.weights / (1.0 + state.participations[partition] / total)))
        seeds = competitive_pass(state.seeds, batches, rival_rate=state.rival_rate)
        absolute = sum(np.abs(residuals).sum(axis=0) for _, (residuals, _, _, _) in valid)
        state.weights = feature_weights(absolute, state.weights, beta=state.beta, learning_rate=state.learning_rate)
        # No merge here: the authors' main loop only counts the merged seeds (k_record) and keeps every row of
        # server_miu_numer; afcl_result merges once, after the last round.
        state.seeds = seeds
    state.server_seconds += time.perf_counter() - start
    log.debug("AFCL round %d: %d seeds (%d with points), Davies-Bouldin %.6g", round_number, n_seeds,
              state.history[-1]["live_seeds"], db)
    return not settled


def afcl_protocol(state: AFCLState):
    """The whole AFCL protocol: the initialisation exchange, then rounds until the DB index settles; results land in ``state``."""
    receive_init(state, (yield Request(AFCL_INIT, "init", None, {"seed": int(state.seed)})))
    for round_number in range(1, state.rounds + 1):
        valid = receive_round(state, (yield Request(AFCL_ROUND, round_number, state.payloads())), round_number)
        if not server_round(state, round_number, valid):
            break


def afcl(clients: Sequence[ClientData], *, learning_rate: float = 1e-3, beta: float = 7.0, rounds: int = 20,
         merge_tol: float = 1e-3, db_tol: float = 1e-4, rival_rate: float = 0.0, min_clients: int = 1,
         random_state=None, driver: ProtocolDriver | None = None,
         partitions: Sequence[int] | None = None) -> BaselineResult:
    """AFCL with unknown K, run in memory over the clients (see the module docstring).

    Parameters
    ----------
    clients : sequence of ClientData
        Client g proposes ``n_components`` (K_g) initial seeds, so K_max = sum_g K_g.
    learning_rate, beta, rounds, merge_tol, db_tol, rival_rate
        As for :class:`AFCLState`.
    min_clients : int
        Fewer valid replies in an exchange stop the run (:class:`~fedica.protocol.NotEnoughClients`).
    random_state : int, numpy.random.Generator or None
        An int is the run's seed (the clients' k-means++ streams); otherwise an int seed is drawn from it.
    driver : callable, optional
        ``driver(protocol)`` answers the protocol's requests over some transport (Flower's, in
        ``fedica.server.harness.comparators``); None: the clients' data, in memory.
    partitions : sequence of int, optional
        The partition id of each client (default: its position in ``clients``).

    Returns
    -------
    BaselineResult
        ``fit_seconds`` is the clients' and the server's own work.
        Test points go to their nearest final seed (after the merge); K_hat counts the seeds that receive some.
        ``info`` holds ``rounds``, ``k_initial`` (K_max), ``seeds`` (final), ``residual_bytes`` and
        ``upload_bytes`` (what the clients sent, the residuals being one d-vector per training point and round),
        ``privacy``, ``client_seconds``, ``server_seconds`` and ``rejected``.
    """
    check_clients(clients, "afcl")
    state = AFCLState(learning_rate=learning_rate, beta=beta, rounds=rounds, merge_tol=merge_tol, db_tol=db_tol,
                      rival_rate=rival_rate, seed=run_seed(random_state), min_clients=min_clients)
    run_protocol(state, afcl_protocol(state), ClientTasks(TASKS), clients, driver, partitions)
    return afcl_result(state, clients)


def afcl_result(state: AFCLState, clients: Sequence[ClientData]) -> BaselineResult:
    """What a finished AFCL protocol gives: every client's test labels (nearest final seed) and its books.

    Any transport's run ends here (:func:`afcl` in memory, ``fedica.server.harness.comparators`` over Flower).
    """
    final = merge_seeds(state.seeds, state.merge_tol)
    labels = [np.argmin(cdist((c.X_test - state.offset) / state.scale, final, "sqeuclidean"), axis=1)
              for c in clients]
    info = {"rounds": len(state.history), "k_initial": state.k_initial, "seeds": int(final.shape[0]),
            "residual_bytes": int(state.residual_bytes), "upload_bytes": int(state.upload_bytes),
            "privacy": PRIVACY_NOTE, "client_seconds": state.client_seconds, "server_seconds": state.server_seconds,
            "rejected": list(state.rejected)}
    return baseline_result("afcl", labels, state.client_seconds + state.server_seconds, info)
