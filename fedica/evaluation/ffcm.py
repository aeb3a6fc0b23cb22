"""FFCM-avg1 and FFCM-avg2: federated fuzzy c-means with known K (Stallmann & Wilbik 2022, arXiv 2201.07316).

A comparator of FedGEM (FedGEM paper, section 6.1), written as a real federated protocol:
:func:`ffcm_protocol` is the server, a generator of :class:`~fedica.protocol.Request` that is sent
the clients' :class:`~fedica.protocol.Reply` lists (like :func:`fedica.rfica.coordinator.rfica_protocol`);
:func:`client_reply` is the whole client side, a pure function of one client's training points and
one request; :func:`ffcm` drives both in memory and labels the test points.

Every client runs fuzzy c-means (fuzzifier m) warm-started from the global centres and sends its K
local centres with their supports ``s_k = sum_i u_ik``. The server then forms the new global centres:

- ``avg1``: centre k is the support-weighted average over clients of their centre k;
- ``avg2``: k-means with K clusters over all clients' centres, weighted by their supports, warm-started
  from the previous global centres.

The paper leaves the initial global centres open (the authors' code draws random integers in
[-10, 10)); here an initialisation exchange asks every client for fuzzy c-means from its own k-means++
start, and the server runs weighted k-means++ k-means on the stacked local centres (avg2's first round;
avg1 starts from the same centres). A test point gets the global centre of its largest membership,
i.e. the nearest global centre.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.spatial.distance import cdist
from sklearn.cluster import KMeans, kmeans_plusplus

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
    FFCM_INIT,
    FFCM_ROUND,
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

__all__ = ["FFCM_VARIANTS", "FFCMState", "avg1_step", "avg2_step", "client_reply", "ffcm", "ffcm_protocol",
           "fuzzy_memberships", "local_fuzzy_c_means", "nearest_centre"]

log = logging.getLogger("fedica.baselines")

FFCM_VARIANTS = ("avg1", "avg2")

# A client's supports are its memberships summed over its points, so they add up to its point count;
# allow float rounding, nothing more.
SUPPORT_SUM_RTOL = 1e-6


# ------------------------------------------------------------------------------------------------ client side

def fuzzy_memberships(X: np.ndarray, centres: np.ndarray, m: float = 2.0) -> np.ndarray:
    """Fuzzy c-means memberships ``u_ik = 1 / sum_j (d_ik / d_ij)^(2/(m-1))``.

    A point at distance zero from some centres splits its membership equally among them (membership 1
    when it sits on one centre), where the formula would divide by zero.

    Parameters
    ----------
    X : ndarray of shape (n, d)
    centres : ndarray of shape (K, d)
    m : float
        The fuzzifier, > 1.

    Returns
    -------
    memberships : ndarray of shape (n, K)
        Non-negative, every row sums to 1.
    """
    squared = cdist(X, centres, "sqeuclidean")
    nearest = squared.min(axis=1, keepdims=True)
    # (d_ik/d_ij)^(2/(m-1)) = (D_ik/D_ij)^(1/(m-1)) with squared distances D. Using the ratio of the row's
    # smallest D to D_ik keeps every term in (0, 1], so nothing overflows.
    ratios = (nearest / np.where(squared > 0, squared, 1.0)) ** (1.0 / (m - 1.0))
    on_centre = nearest[:, 0] == 0
    ratios[on_centre] = squared[on_centre] == 0
    return ratios / ratios.sum(axis=1, keepdims=True)


def _fuzzy_centres(X: np.ndarray, memberships: np.ndarray, previous: np.ndarray, m: float) -> np.ndarray:
    weights = memberships**m
    totals = weights.sum(axis=0)
    centres = previous.copy()
    # A centre no point belongs to (possible only when every point sits on another centre) stays put.
    alive = totals > 0
    centres[alive] = (weights[:, alive].T @ X) / totals[alive, None]
    return centres


def local_fuzzy_c_means(X: np.ndarray, centres: np.ndarray, *, m: float = 2.0, iterations: int = 5,
                        tol: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """A client's fuzzy c-means from given centres: alternate memberships and ``sum u^m x / sum u^m``.

    Parameters
    ----------
    X : ndarray of shape (n, d)
    centres : ndarray of shape (K, d)
        The start (the global centres).
    m : float
    iterations : int
        At most this many centre updates; fewer once no centre moves by more than ``tol``.
    tol : float

    Returns
    -------
    centres : ndarray of shape (K, d)
    supports : ndarray of shape (K,)
        ``sum_i u_ik`` under the returned centres (they add up to n).
    """
    centres = np.asarray(centres, dtype=np.float64)
    for _ in range(iterations):
        updated = _fuzzy_centres(X, fuzzy_memberships(X, centres, m), centres, m)
        moved = float(np.max(np.linalg.norm(updated - centres, axis=1)))
        centres = updated
        if moved <= tol:
            break
    return centres, fuzzy_memberships(X, centres, m).sum(axis=0)


def nearest_centre(X: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """The index of the largest membership of every point, i.e. of its nearest centre, shape (n,)."""
    return np.argmin(cdist(X, centres, "sqeuclidean"), axis=1)


def _client_init(X: np.ndarray, n_components: int, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any],
                 partition_id: int) -> dict[str, np.ndarray]:
    n_clusters = int(values["n-clusters"])
    if X.shape[0] < n_clusters:
        raise ValueError(f"this client has {X.shape[0]} points, fewer than the K={n_clusters} centres it must fit")
    rng = generator(int(values["seed"]), "ffcm.client_init", partition_id)
    start, _ = kmeans_plusplus(X, n_clusters, random_state=sklearn_seed(rng))
    return _fuzzy_reply(X, start, values)


def _client_round(X: np.ndarray, n_components: int, arrays: Mapping[str, np.ndarray], values: Mapping[str, Any],
                  partition_id: int) -> dict[str, np.ndarray]:
    centres = np.asarray(arrays["centres"], dtype=np.float64)
    if centres.ndim != 2 or centres.shape[1] != X.shape[1]:
        raise ValueError(f"the server sent centres of shape {centres.shape} for data with d={X.shape[1]}")
    return _fuzzy_reply(X, centres, values)


def _fuzzy_reply(X: np.ndarray, start: np.ndarray, values: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The client's fuzzy c-means from ``start``: its K centres and their supports (``n_components`` is unused: K is global)."""
    centres, supports = local_fuzzy_c_means(X, start, m=float(values["m"]), iterations=int(values["local-iterations"]),
                                            tol=float(values["tol"]))
    return {"centres": centres, "supports": supports}


# FFCM's entries in the client task registry (fedica.tasks.CLIENT_TASKS).
TASKS: dict[str, Handler] = {FFCM_INIT: comparator_task(_client_init), FFCM_ROUND: comparator_task(_client_round)}


def client_reply(task: str, X: np.ndarray, n_components: int, arrays: Mapping[str, np.ndarray],
                 values: Mapping[str, Any], partition_id: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """One client's answer to one FFCM request (the registry's handler, on points given as an array).

    Parameters
    ----------
    task : {"ffcm_init", "ffcm_round"}
    X : ndarray of shape (n, d)
        The client's training points.
    n_components : int
        The client's K_g; unused (every FFCM client fits the global K).
    arrays : mapping
        The request's arrays: ``centres`` (K, d) for a round, nothing for the initialisation.
    values : mapping
        ``n-clusters``, ``m``, ``local-iterations``, ``tol`` and ``seed`` from the server.
    partition_id : int

    Returns
    -------
    arrays : dict
        ``centres`` (K, d) and ``supports`` (K,).
    values : dict
        ``n-points`` and the client's own ``fit-seconds``.
    """
    return answer_on_array(TASKS, task, X, n_components, arrays, values, partition_id)


# ------------------------------------------------------------------------------------------------ server side

def avg1_step(local_centres: np.ndarray, supports: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """FFCM-avg1: global centre k = support-weighted mean of the clients' centres k.

    Parameters
    ----------
    local_centres : ndarray of shape (G, K, d)
    supports : ndarray of shape (G, K)
    previous : ndarray of shape (K, d)
        Kept for a centre with zero total support.

    Returns
    -------
    ndarray of shape (K, d)
    """
    totals = supports.sum(axis=0)
    centres = previous.copy()
    alive = totals > 0
    centres[alive] = np.einsum("gk,gkd->kd", supports, local_centres)[alive] / totals[alive, None]
    return centres


def avg2_step(local_centres: np.ndarray, supports: np.ndarray, init: np.ndarray | str, *, n_init: int = 1,
              random_state: int | None = None) -> np.ndarray:
    """FFCM-avg2: k-means over all clients' centres, weighted by their supports.

    Parameters
    ----------
    local_centres : ndarray of shape (G, K, d)
    supports : ndarray of shape (G, K)
    init : ndarray of shape (K, d) or "k-means++"
        The previous global centres (a warm start), or k-means++ in the first round.
    n_init : int
        Restarts; used only with "k-means++".
    random_state : int or None

    Returns
    -------
    ndarray of shape (K, d)
    """
    n_clusters, dim = local_centres.shape[1:]
    starts = n_init if isinstance(init, str) else 1
    model = KMeans(n_clusters=n_clusters, init=init, n_init=starts, random_state=random_state)
    model.fit(local_centres.reshape(-1, dim), sample_weight=supports.reshape(-1))
    return model.cluster_centers_


@dataclass(kw_only=True)
class FFCMState(ProtocolState):
    """FFCM's parameters and, once the protocol has run, what it computed.

    Parameters
    ----------
    n_clusters : int
        The known K.
    variant : {"avg1", "avg2"}
    m : float
        Fuzzifier.
    rounds : int
        Collaborative rounds after the initialisation exchange (the FedGEM paper runs T=20).
    local_iterations : int
        Fuzzy c-means updates per client and round.
    tol : float
        Stop once the global centres move less than this (Frobenius norm); also each client's local tolerance.
    n_init : int
        k-means++ restarts of the server's initial k-means.
    seed : int
        Seeds the clients' k-means++ starts and the server's initial k-means.
    min_clients : int

    Attributes
    ----------
    centres : ndarray of shape (K, d) or None
        The global centres.
    partitions : list of int
        The clients whose initialisation reply was valid (the ones asked in every round).
    history : list of dict
        One entry per round: ``round``, ``clients`` (valid replies), ``shift`` (of the global centres).
    rejected : list of dict
        ``{client, round, reason}`` of every reply left out (:class:`~fedica.protocol.ProtocolState`).
    upload_bytes : int
        Bytes of the arrays in the valid replies.
    """

    n_clusters: int
    variant: str = "avg1"
    m: float = 2.0
    rounds: int = 20
    local_iterations: int = 10
    tol: float = 1e-4
    n_init: int = 3
    seed: int = 0
    min_clients: int = 1
    dim: int | None = None
    centres: np.ndarray | None = None
    partitions: list[int] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    upload_bytes: int = 0

    log_label = "FFCM "
    logger = log

    def __post_init__(self) -> None:
        if self.variant not in FFCM_VARIANTS:
            raise ValueError(f"variant must be one of {FFCM_VARIANTS}, got {self.variant!r}")
        if not self.m > 1:
            raise ValueError(f"the fuzzifier m must be > 1, got {self.m}")
        if int(self.n_clusters) < 1 or int(self.rounds) < 0 or int(self.local_iterations) < 1:
            raise ValueError("need n_clusters >= 1, rounds >= 0 and local_iterations >= 1")

    def request_values(self) -> dict[str, Any]:
        return {"n-clusters": int(self.n_clusters), "m": float(self.m), "local-iterations": int(self.local_iterations),
                "tol": float(self.tol), "seed": int(self.seed)}


def validate_reply(reply: Reply, *, n_clusters: int, dim: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Check one FFCM reply: finite (K, d) centres, non-negative (K,) supports adding up to ``n-points``.

    Returns
    -------
    centres : ndarray of shape (K, d)
    supports : ndarray of shape (K,)
    """
    centres = require_array(reply.arrays, "centres", (n_clusters, dim))
    supports = require_array(reply.arrays, "supports", (n_clusters,), nonnegative=True)
    n_points = require_int(reply.values, "n-points", minimum=1)
    if not np.isclose(supports.sum(), n_points, rtol=SUPPORT_SUM_RTOL, atol=0.0):
        raise InvalidReply(f"'supports' add up to {supports.sum():.6g}, not to the {n_points} points the client declares")
    return centres, supports


def receive_centres(state: FFCMState, replies: list[Reply], round_label: int | str) -> tuple[np.ndarray, np.ndarray]:
    """The valid replies' centres, shape (G', K, d), and supports, shape (G', K); invalid ones are recorded and skipped."""
    if state.dim is None:
        state.dim = majority_width(replies, "centres")
    centres, supports, partitions = [], [], []
    for reply in replies:
        try:
            reply_centres, reply_supports = validate_reply(reply, n_clusters=state.n_clusters, dim=state.dim)
        except InvalidReply as err:
            state.reject(reply.partition_id, round_label, f"invalid reply: {err}")
            continue
        centres.append(reply_centres)
        supports.append(reply_supports)
        partitions.append(reply.partition_id)
        state.client_seconds += reported_seconds(reply)
        state.upload_bytes += reply_centres.nbytes + reply_supports.nbytes
    state.require(len(partitions), f"FFCM round {round_label}")
    if round_label == "init":
        state.partitions = partitions
    return np.stack(centres), np.stack(supports)


def ffcm_protocol(state: FFCMState):
    """The whole FFCM protocol: the initialisation exchange, then up to ``rounds`` rounds; results land in ``state``."""
    local, supports = receive_centres(state, (yield Request(FFCM_INIT, "init", None, state.request_values())), "init")
    with state.server_time():
        rng = np.random.default_rng(state.seed)
        state.centres = avg2_step(local, supports, "k-means++", n_init=state.n_init, random_state=sklearn_seed(rng))
    for round_number in range(1, state.rounds + 1):
        payloads = {p: {"centres": state.centres} for p in state.partitions}
        replies = yield Request(FFCM_ROUND, round_number, payloads, state.request_values())
        local, supports = receive_centres(state, replies, round_number)
        with state.server_time():
            previous = state.centres
            state.centres = (avg1_step(local, supports, previous) if state.variant == "avg1"
                             else avg2_step(local, supports, previous))
        shift = float(np.linalg.norm(state.centres - previous))
        state.history.append({"round": round_number, "clients": len(local), "shift": shift})
        if shift < state.tol:
            break


def ffcm(clients: Sequence[ClientData], n_clusters: int, *, variant: str = "avg1", m: float = 2.0, rounds: int = 20,
         local_iterations: int = 10, tol: float = 1e-4, n_init: int = 3, min_clients: int = 1,
         random_state=None, driver: ProtocolDriver | None = None,
         partitions: Sequence[int] | None = None) -> BaselineResult:
    """FFCM-avg1 or FFCM-avg2 with known K, run in memory over the clients (see the module docstring).

    Parameters
    ----------
    clients : sequence of ClientData
    n_clusters : int
        The true K.
    variant : {"avg1", "avg2"}
    m : float
        Fuzzifier (the paper's m = 2).
    rounds : int
        Collaborative rounds after the initialisation (the FedGEM paper runs every iterative comparator for 20).
    local_iterations : int
        Fuzzy c-means updates per client and round.
    tol : float
        Stop once the global centres move less than this.
    n_init : int
        k-means++ restarts of the server's initial k-means.
    min_clients : int
        Fewer valid replies in an exchange stop the run (:class:`~fedica.protocol.NotEnoughClients`).
    random_state : int, numpy.random.Generator or None
        An int is the run's seed; otherwise an int seed is drawn from it.
    driver : callable, optional
        ``driver(protocol)`` answers the protocol's requests over some transport (Flower's, in
        ``fedica.server.harness.comparators``); None: the clients' data, in memory.
    partitions : sequence of int, optional
        The partition id of each client (default: its position in ``clients``).

    Returns
    -------
    BaselineResult
        ``fit_seconds`` is the clients' and the server's own work; ``info`` holds ``rounds`` (rounds run), ``upload_bytes`` (the arrays all clients sent),
        ``client_seconds``, ``server_seconds`` and ``rejected``.
    """
    check_clients(clients, f"ffcm-{variant}")
    state = FFCMState(n_clusters=int(n_clusters), variant=variant, m=m, rounds=rounds, local_iterations=local_iterations,
                      tol=tol, n_init=n_init, seed=run_seed(random_state), min_clients=min_clients)
    run_protocol(state, ffcm_protocol(state), ClientTasks(TASKS), clients, driver, partitions)
    return ffcm_result(state, clients)


def ffcm_result(state: FFCMState, clients: Sequence[ClientData]) -> BaselineResult:
    """What a finished FFCM protocol gives: every client's test labels (nearest global centre) and its books.

    Any transport's run ends here (:func:`ffcm` in memory, ``fedica.server.harness.comparators`` over Flower).
    """
    labels = [nearest_centre(c.X_test, state.centres) for c in clients]
    info = {"rounds": len(state.history), "upload_bytes": int(state.upload_bytes), "client_seconds": state.client_seconds,
            "server_seconds": state.server_seconds, "rejected": list(state.rejected)}
    return baseline_result(f"ffcm-{state.variant}", labels, state.client_seconds + state.server_seconds, info)

