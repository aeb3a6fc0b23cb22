"""Hostile clients on demand, for robustness runs (the ``attack`` config group).

A hostile client computes its honest reply and then replaces part of it. The
server is never told which clients are hostile; only the result records it.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from fedica.metrics import PooledTables, ari_from_contingency
from fedica.sites import apportion
from fedica.fedgem.geometry import CLUSTER_ANISOTROPY_LIMIT
from fedica.fedgem.tables import TABLE_INFLUENCE_LIMIT
from fedica.rfica.aggregation import trim_cut
from fedica.seeding import generator

# RF-ICA: a junk estimate instead of the honest one (hostile_ica_estimate) ...
ICA_REPLACEMENTS = ("random_orthogonal", "scaled_junk", "permuted_truth")
# ... or attacks that know RF-ICA's defences: they target its benchmark, its clusters and its medians.
ICA_ADAPTIVE_ATTACKS = ("benchmark_hijack", "rank_one_collusion", "midpoint_columns", "rotated_truth", "inlier_drift")
# inlier_drift: how far inside the trimmed centre's cut the colluders place their columns (the cut itself is where a
# column starts to be left out; just inside it, every colluder's column is averaged).
INLIER_DRIFT_SHARE_OF_CUT = 0.95
ICA_ATTACKS = (*ICA_REPLACEMENTS, *ICA_ADAPTIVE_ATTACKS)
# rotated_truth: the sample count it claims, far beyond any site's (the benchmark rule "largest" picks it).
ROTATED_TRUTH_COUNT = 10**9
# Attacks on FedGEM's collaborative rounds (they replace a round reply) ...
GEM_ATTACKS = ("inflated_radius", "inflated_count", "random_centroids")
# ... and on the rest of its protocol: the components a client declares, the tuning, the evaluation
# (the last four know the defences: docs/ALGORITHMS.md section 3.2).
GEM_PROTOCOL_ATTACKS = ("split_components", "poison_tuning", "fake_evaluation",
                        "overflow_row", "likelihood_shift", "midpoint_cluster", "forged_metrics", "consistent_forgery", "tuned_forgery",
                        "skewed_moments", "forged_shape", "widened_moments")
# Either algorithm: a node answers under another client's partition id.
SPOOF_PARTITION = "spoof_partition"
ATTACKS = ("none", *ICA_ATTACKS, *GEM_ATTACKS, *GEM_PROTOCOL_ATTACKS, SPOOF_PARTITION)

# Magnitudes of the FedGEM attacks: far beyond anything an honest client reports.
INFLATED_RADIUS = 1.0e6
INFLATED_COUNT = 10**9
RANDOM_CENTROID_SCALE = 1.0e3
# split_components: copies planted around every true centre, jittered by this share of the
# smallest distance between two true centres, plus one anchor this many spreads away.
SPLIT_COPIES = 4
SPLIT_JITTER = 0.1
SPLIT_ANCHOR_DISTANCE = 10.0
# poison_tuning: the count the client claims, as a multiple of its own; fake_evaluation: the
# test points it claims, as a multiple of its training points (the server's loosest bound).
POISON_COUNT_FACTOR = 10
FAKE_TEST_FACTOR = 100
# overflow_row: in this collaborative round one maximiser row of magnitude 10^155 to 10^160
# (its squared distance to anything overflows a double).
OVERFLOW_ROUND = 2
OVERFLOW_EXPONENTS = (155.0, 160.0)
# likelihood_shift: a constant added to every candidate's honest log-likelihood.
LIKELIHOOD_SHIFT = -1.0e13
# forged_metrics: the count claimed at initialisation (a multiple of the client's own: 5,000 for
# a client of 125 points), the local ARI it reports, and its contingency table's size as a
# multiple of its own test count (a typical client's: just under the count cap's 10x the median).
# skewed_moments: the factor by which a client shrinks its first feature's deviation and inflates every other's.
SKEW_FACTOR = 1.0e6
# forged_shape: the anisotropy a client claims where its own is under the shape check's limit (a false alarm).
FORGED_ANISOTROPY = 1.0e6
# widened_moments: under a covariance family, every point a client holds claimed for the first global cluster, and
# every scatter it sends (the cluster moments and each federated EM step) this many times wider.
WIDENED_SCATTER = 100.0
FORGED_COUNT_FACTOR = 40
FORGED_LOCAL_ARI = -1.0
FORGED_TEST_FACTOR = 9.9


def hostile_mask(n_clients: int, fraction: float, *, seed: int) -> np.ndarray:
    """Which clients are hostile: exactly ``round(fraction * n_clients)``, chosen from ``seed``.

    Parameters
    ----------
    n_clients : int
    fraction : float in [0, 1)
    seed : int

    Returns
    -------
    mask : ndarray of shape (n_clients,), dtype bool
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"fraction={fraction} must be in [0, 1)")
    rng = generator(seed, "attack.hostile")
    mask = np.zeros(n_clients, dtype=bool)
    mask[rng.permutation(n_clients)[: int(round(fraction * n_clients))]] = True
    return mask


def hostile_clients(n_clients: int, attack: dict, *, seed: int) -> list[int]:
    """The partition ids an ``attack`` config (``kind``, ``fraction``) makes hostile; none for kind ``none``."""
    if attack["kind"] == "none":
        return []
    return np.flatnonzero(hostile_mask(n_clients, attack["fraction"], seed=seed)).tolist()


def attack_rng(seed: int, partition_id: int, stage: int = 0) -> np.random.Generator:
    """The random stream of one hostile client at one stage (round) of the protocol, so that its junk is fresh every round."""
    return generator(seed, "attack.reply", partition_id, stage)


def hostile_ica_estimate(kind: str, true_mixing: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """What a hostile RF-ICA client sends instead of its estimate.

    Parameters
    ----------
    kind : {"random_orthogonal", "scaled_junk", "permuted_truth"}
        ``random_orthogonal``: a Haar-random orthogonal matrix. ``scaled_junk``:
        Gaussian junk with columns scaled by up to 1e4 and random signs.
        ``permuted_truth``: the truth with columns permuted, sign-flipped and scaled
        (harmless after the server's normalisation; checks that it is).
    true_mixing : ndarray of shape (p, r)
        The attacker is assumed to know A* (the worst case); in channel space with fewer sources than
        channels (``p > r``), the estimate has its shape, as an honest reply.
    rng : numpy.random.Generator

    Returns
    -------
    estimate : ndarray of shape (p, r)
        For ``p = r`` the same draws as a square matrix's.
    """
    p, r = true_mixing.shape
    if kind == "random_orthogonal":
        q, upper = np.linalg.qr(rng.standard_normal((p, r)))
        return q * np.sign(np.diag(upper))
    if kind == "scaled_junk":
        return rng.standard_normal((p, r)) * 10.0 ** rng.uniform(0, 4, r) * rng.choice([-1.0, 1.0], r)
    if kind == "permuted_truth":
        return true_mixing[:, rng.permutation(r)] * rng.choice([-1.0, 1.0], r) * 10.0 ** rng.uniform(-2, 2, r)
    raise ValueError(f"unknown RF-ICA attack {kind!r}; known: {', '.join(ICA_REPLACEMENTS)}")


def steering_moments(covariance: np.ndarray, moments: np.ndarray, slopes: np.ndarray, unmixing: np.ndarray,
                     target: np.ndarray) -> np.ndarray:
    """A hostile site's refinement moments that make the server's step land on ``target`` (docs/ALGORITHMS.md 1.10).

    The step takes row ``i`` of the unmixing to ``C^(-1) M[:, i] - e_i w_i``; with
    ``M[:, i] = C (t_i + e_i w_i)`` it is ``t_i``, row ``i`` of ``target``, scaled to the length of the
    site's honest update so that the reply looks like one. The covariance and slopes it sends are its
    honest ones: the attacker knows the rules and moves only what steers.

    Parameters
    ----------
    covariance, moments, slopes : ndarray
        The site's honest averages (``r x r``, ``r x r``, ``r``).
    unmixing : ndarray of shape (r, r)
        The server's current unmixing.
    target : ndarray of shape (r, r)
        The unmixing the attacker wants (in the whitened coordinates).

    Returns
    -------
    moments : ndarray of shape (r, r)
    """
    honest_update = np.linalg.solve(covariance, moments).T - slopes[:, None] * unmixing
    scale = np.linalg.norm(honest_update, axis=1) / np.linalg.norm(target, axis=1)
    return covariance @ (target * scale[:, None] + slopes[:, None] * unmixing).T


def benchmark_hijack_estimate(true_mixing: np.ndarray) -> np.ndarray:
    """A ``benchmark_hijack`` client's estimate: every column the first true column (sent with the largest count).

    Chosen as the benchmark, its one direction aligns every site's columns to it, so that the
    signs of all columns but one true one are arbitrary; a rank-one matrix.
    """
    return np.repeat(true_mixing[:, :1], true_mixing.shape[1], axis=1)


def rank_one_estimate(column: np.ndarray, r: int) -> np.ndarray:
    """A ``rank_one_collusion`` client's estimate: one column, ``column`` (one colluder's own), in all ``r`` places.

    The colluders need no knowledge of the truth: all of them send the same honest column, so that
    one cluster holds them all and their geometric medians weigh a direction they all share.
    Any one direction in every column (``(a1 + a2) / sqrt(2)`` for one) is the same attack.
    """
    return np.repeat(np.asarray(column, dtype=np.float64).reshape(-1, 1), r, axis=1)


def midpoint_columns_estimate(true_mixing: np.ndarray) -> np.ndarray:
    """A ``midpoint_columns`` client's estimate: column ``i`` midway between true columns ``i`` and ``i + 1`` (cyclically), unit-norm.

    Every column is at 45 degrees from two true ones (for an orthogonal ``A*``), equally near both
    clusters, so that k-means may gather the midpoints into clusters of their own.
    """
    midpoints = true_mixing + np.roll(true_mixing, -1, axis=1)
    return midpoints / np.linalg.norm(midpoints, axis=0)


def rotated_truth_estimate(true_mixing: np.ndarray) -> np.ndarray:
    """A ``rotated_truth`` client's estimate: ``A*`` with its first two columns rotated 45 degrees in their plane.

    Orthogonal when ``A*`` is, so that no rank or conditioning test can tell it from an honest
    estimate; sent with :data:`ROTATED_TRUTH_COUNT` samples, it is the benchmark of the rule "largest".
    """
    rotated = np.asarray(true_mixing, dtype=np.float64).copy()
    first, second = true_mixing[:, 0], true_mixing[:, 1]
    rotated[:, 0], rotated[:, 1] = (first + second) / np.sqrt(2.0), (second - first) / np.sqrt(2.0)
    return rotated


def inlier_drift_estimate(true_mixing: np.ndarray, own: np.ndarray, n_sites: int) -> np.ndarray:
    """An ``inlier_drift`` colluder's estimate: every true column moved along one shared direction, just inside the cut.

    The attacker knows ``A*`` (the worst case) and the trimmed centre's rule (docs/ALGORITHMS.md
    1.4.2): a column is averaged when it lies within ``c`` median distances of its cluster's
    geometric median, ``c`` the cut for ``n_sites`` points in ``p - 1`` dimensions. It takes the
    honest spread from its own honest estimate (the median distance of its unit columns, matched to
    ``A*``'s and sign-aligned, from them), and sends column ``i`` at ``a_i + lambda s d_i``, with
    ``lambda`` :data:`INLIER_DRIFT_SHARE_OF_CUT` of ``c`` and ``d_i`` the unit direction of the next
    true column orthogonalised against ``a_i``, the same for every colluder (issue 45: against the
    trimmed mean it took the error to 3.9x the attack-free one at 25 % hostile).
    """
    truth = np.asarray(true_mixing, dtype=np.float64)
    truth = truth / np.linalg.norm(truth, axis=0)
    own = np.asarray(own, dtype=np.float64)
    own = own / np.linalg.norm(own, axis=0)
    cosines = truth.T @ own
    rows, columns = linear_sum_assignment(-np.abs(cosines))
    matched = own[:, columns[np.argsort(rows)]] * np.sign(cosines[rows, columns][np.argsort(rows)])
    spread = float(np.median(np.linalg.norm(matched - truth, axis=0)))
    cut = trim_cut(max(truth.shape[0] - 1, 1), n_sites)
    following = np.roll(truth, -1, axis=1)
    directions = following - truth * np.sum(following * truth, axis=0)
    directions /= np.linalg.norm(directions, axis=0)
    drifted = truth + INLIER_DRIFT_SHARE_OF_CUT * cut * spread * directions
    return drifted / np.linalg.norm(drifted, axis=0)


def hostile_gem_reply(
    kind: str, maximisers: np.ndarray, radii: np.ndarray, n_points: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, int]:
    """What a hostile FedGEM client sends instead of its honest round reply.

    Parameters
    ----------
    kind : {"inflated_radius", "inflated_count", "random_centroids"}
    maximisers : ndarray of shape (K_g, d)
    radii : ndarray of shape (K_g,)
        Squared radii eps the client would honestly report.
    n_points : int
    rng : numpy.random.Generator

    Returns
    -------
    maximisers : ndarray of shape (K_g, d)
    radii : ndarray of shape (K_g,)
    n_points : int
    """
    if kind == "inflated_radius":
        return maximisers, np.full_like(radii, INFLATED_RADIUS), n_points
    if kind == "inflated_count":
        return maximisers, radii, INFLATED_COUNT
    if kind == "random_centroids":
        return rng.uniform(-RANDOM_CENTROID_SCALE, RANDOM_CENTROID_SCALE, maximisers.shape), radii, n_points
    raise ValueError(f"unknown FedGEM attack {kind!r}; known: {', '.join(GEM_ATTACKS)}")


def split_components_centroids(true_centres: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """What a ``split_components`` client declares: jittered copies of every true centre and a far anchor.

    Each copy is a valid component (finite, inside the data's range) that the same-client rule
    keeps apart from the client's other copies, so that, believed, every copy can found a
    global cluster of its own; the anchor founds one far from all data.

    Parameters
    ----------
    true_centres : ndarray of shape (K, d)
        The attacker is assumed to know them (the worst case).
    rng : numpy.random.Generator

    Returns
    -------
    centroids : ndarray of shape (K * SPLIT_COPIES + 1, d)
    """
    true_centres = np.asarray(true_centres, dtype=np.float64)
    k, d = true_centres.shape
    gaps = np.linalg.norm(true_centres[:, None] - true_centres[None], axis=2)
    separation = float(gaps[np.triu_indices(k, 1)].min()) if k > 1 else 1.0
    directions = rng.standard_normal((k * SPLIT_COPIES, d))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    copies = np.repeat(true_centres, SPLIT_COPIES, axis=0) + SPLIT_JITTER * separation * directions
    spread = float(np.linalg.norm(true_centres - true_centres.mean(axis=0), axis=1).max()) or separation
    anchor = true_centres.mean(axis=0) + SPLIT_ANCHOR_DISTANCE * spread * directions[0]
    return np.vstack([copies, anchor])


def poisoned_silhouettes(n_candidates: int) -> np.ndarray:
    """A ``poison_tuning`` client's silhouettes: +1 for the largest upsilon of the grid, -1 for every other."""
    scores = np.full(n_candidates, -1.0)
    scores[-1] = 1.0
    return scores


def poisoned_likelihoods(log_likelihoods: np.ndarray, entropies: np.ndarray, sizes: np.ndarray,
                         n_points: int) -> tuple[np.ndarray, np.ndarray]:
    """A ``poison_tuning`` client's model-selection reply: the coarsest candidates far more likely than any other.

    The candidates of the two smallest K_hat: the request also holds neighbours the server scores only for
    ``k_support`` (one merge beyond the coarsest candidate among them), which a client cannot tell from the
    candidates it chooses among, so the attack poisons both counts.

    Parameters
    ----------
    log_likelihoods, entropies : ndarray of shape (L,)
        The client's honest reply.
    sizes : ndarray of shape (L,)
        K_hat of every candidate.
    n_points : int
        The count the client claims.

    Returns
    -------
    log_likelihoods, entropies : ndarray of shape (L,)
    """
    target = np.isin(sizes, np.unique(sizes)[:2])
    scores = np.asarray(log_likelihoods, dtype=np.float64).copy()
    scores[target] = scores.max() + 10.0 * n_points
    poisoned_entropies = np.asarray(entropies, dtype=np.float64).copy()
    poisoned_entropies[target] = 0.0
    return scores, poisoned_entropies


def overflow_maximisers(maximisers: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """An ``overflow_row`` client's maximisers: its first row replaced by one of magnitude 10^155 to 10^160, random signs."""
    overflowing = np.asarray(maximisers, dtype=np.float64).copy()
    magnitude = 10.0 ** rng.uniform(*OVERFLOW_EXPONENTS)
    overflowing[0] = magnitude * rng.choice([-1.0, 1.0], overflowing.shape[1])
    return overflowing


def shifted_likelihoods(log_likelihoods: np.ndarray) -> np.ndarray:
    """A ``likelihood_shift`` client's log-likelihoods: its honest ones plus :data:`LIKELIHOOD_SHIFT` (the same for every candidate)."""
    return np.asarray(log_likelihoods, dtype=np.float64) + LIKELIHOOD_SHIFT


def closest_pair_midpoint(true_centres: np.ndarray) -> np.ndarray:
    """Where a ``midpoint_cluster`` client plants its component: midway between the two closest true centres.

    Parameters
    ----------
    true_centres : ndarray of shape (K, d), K >= 2
        The attacker is assumed to know them (the worst case).

    Returns
    -------
    midpoint : ndarray of shape (d,)
    """
    true_centres = np.asarray(true_centres, dtype=np.float64)
    gaps = np.linalg.norm(true_centres[:, None] - true_centres[None], axis=2)
    gaps[np.diag_indices_from(gaps)] = np.inf
    a, b = np.unravel_index(np.argmin(gaps), gaps.shape)
    return 0.5 * (true_centres[a] + true_centres[b])


def skewed_moments(moments: np.ndarray) -> np.ndarray:
    """A ``skewed_moments`` client's reply to the federated standardisation (``standardize: federated``).

    Its honest (2, d) means and deviations, the first feature's deviation divided by :data:`SKEW_FACTOR` and
    every other's multiplied by it: were its values taken, the first feature would outweigh all others a
    million-fold in every distance, and FedGEM would cluster on it alone. It knows the server takes medians,
    so every hostile client sends the same skew, all pulling each median the same way.
    """
    skewed = np.array(moments, dtype=np.float64)
    skewed[1, 0] /= SKEW_FACTOR
    skewed[1, 1:] *= SKEW_FACTOR
    return skewed


def widened_moments(masses: np.ndarray, scatters: np.ndarray, *, claim_all: bool) -> tuple[np.ndarray, np.ndarray]:
    """A ``widened_moments`` client's cluster moments under a covariance family (docs/ALGORITHMS.md 2.14).

    Its scatters :data:`WIDENED_SCATTER` times wider, and (``claim_all``, the moments of the chosen partition's
    clusters) every one of its points counted in the first cluster: were its moments pooled as sent, that cluster
    would swallow the others (one such site of five took penguins from three clusters to one).
    """
    masses = np.array(masses, dtype=np.float64)
    if claim_all:
        masses = np.eye(masses.shape[0])[0] * masses.sum()
    return masses, WIDENED_SCATTER * np.asarray(scatters, dtype=np.float64)


def forged_anisotropy(honest: float) -> float:
    """A ``forged_shape`` client's ``cluster-anisotropy``: the shape check's verdict turned round.

    It knows the limit (:data:`fedica.fedgem.geometry.CLUSTER_ANISOTROPY_LIMIT`) and that the server takes the
    median: where its own clusters pass as spheres it claims :data:`FORGED_ANISOTROPY`, to raise a false alarm;
    where they do not, it claims 0, to silence the warning. Every hostile client on one data set sends the same.
    """
    return FORGED_ANISOTROPY if honest <= CLUSTER_ANISOTROPY_LIMIT else 0.0


def forged_contingency(global_ids: np.ndarray, true_labels: np.ndarray,
                       n_points: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A ``forged_metrics`` client's contingency counts: about ``n_points`` test points spread evenly over
    every (true label, global id) pair, a table that agrees with no partition (it pulls the pooled ARI to 0).

    Returns
    -------
    true_values, pred_values, counts : ndarray of shape (n_labels * n_ids,)
    """
    ids = np.unique(np.asarray(global_ids, dtype=np.int64))
    labels = np.unique(np.asarray(true_labels, dtype=np.int64))
    true_values, pred_values = (grid.ravel() for grid in np.meshgrid(labels, ids))
    counts = np.full(true_values.size, max(1, n_points // true_values.size), dtype=np.int64)
    return true_values, pred_values, counts


def consistent_forgery(global_ids: np.ndarray, true_labels: np.ndarray,
                       n_points: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """A ``consistent_forgery`` client's evaluation: the table of :func:`forged_contingency` and the ARI that table
    gives, so that the server's recomputation of the local ARI finds nothing to refuse.

    Returns
    -------
    true_values, pred_values, counts : ndarray of shape (n_labels * n_ids,)
    local_ari : float
    """
    true_values, pred_values, counts = forged_contingency(global_ids, true_labels, n_points)
    return true_values, pred_values, counts, ari_from_contingency(true_values, pred_values, counts)


# tuned_forgery: the share of the server's limit on a table's (or its colluders' tables') effect it aims at.
TUNED_SHARE = 0.95


def tuned_forgery(true_values: np.ndarray, pred_values: np.ndarray, counts: np.ndarray, global_ids: np.ndarray,
                  n_clients: int, n_colluders: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """A ``tuned_forgery`` client's evaluation: its honest table moved towards :func:`forged_contingency`'s spread
    table as far as the server's rule on tables lets it (issue 43, row 12), with the ARI of the result.

    The client knows the rule (:func:`fedica.fedgem.tables.outlying_tables`): one table may lower the
    others' pooled ARI by at most ``limit / G``, ``k`` tables together by ``sqrt(k) limit / G``, the
    limit :data:`~fedica.fedgem.tables.TABLE_INFLUENCE_LIMIT`. It does not see the other
    clients' tables: it takes them to be like its own (``n_clients - n_colluders`` copies of its
    honest table, an IID federation), and its ``n_colluders - 1``
    colluders send a table like its own. It sends the largest mixture ``(1 - t) honest + t spread``
    (its own test points in all) whose effect on that federation is :data:`TUNED_SHARE` of the bound.

    Returns
    -------
    true_values, pred_values, counts : ndarray
    local_ari : float
    """
    honest = (np.asarray(true_values, dtype=np.int64), np.asarray(pred_values, dtype=np.int64),
              np.asarray(counts, dtype=np.int64))
    n_points = int(honest[2].sum())
    spread = forged_contingency(global_ids, honest[0], n_points)
    cells_true, cells_pred = np.r_[honest[0], spread[0]], np.r_[honest[1], spread[1]]
    n_colluders = max(1, min(int(n_colluders), int(n_clients) - 1))
    n_others = int(n_clients) - n_colluders
    bound = TUNED_SHARE * np.sqrt(n_colluders) * TABLE_INFLUENCE_LIMIT / n_clients

    def table(share: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        weights = np.r_[(1 - share) * honest[2] / max(n_points, 1), share * spread[2] / max(spread[2].sum(), 1)]
        mixed = apportion(n_points, weights)
        kept = mixed > 0
        return cells_true[kept], cells_pred[kept], mixed[kept]

    def effect(share: float) -> float:
        forged = table(share)
        pool = PooledTables([(honest[0], honest[1], n_others * honest[2]), (forged[0], forged[1], n_colluders * forged[2])])
        everyone = pool.ari()
        pool.take_out(1)
        return everyone - pool.ari()

    low, high = 0.0, 1.0
    if effect(high) >= -bound:
        low = high
    else:
        for _ in range(40):  # bisection to 1e-12 of the mixture
            middle = (low + high) / 2
            low, high = (middle, high) if effect(middle) >= -bound else (low, middle)
    forged = table(low)
    return (*forged, ari_from_contingency(*forged))


def fake_contingency(global_ids: np.ndarray, n_train: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A ``fake_evaluation`` client's contingency counts: a perfect diagonal over every global id it was sent.

    As many test points as the server's loosest bound admits (``FAKE_TEST_FACTOR`` times its
    training size), so that, believed, they outweigh every honest client's counts.

    Returns
    -------
    true_values, pred_values, counts : ndarray of shape (n_ids,)
    """
    ids = np.unique(np.asarray(global_ids, dtype=np.int64))
    counts = np.full(ids.size, FAKE_TEST_FACTOR * n_train // ids.size, dtype=np.int64)
    return ids, ids.copy(), counts


def spoofed_partition(partition_id: int, n_clients: int, hostile: np.ndarray) -> int:
    """The partition id a ``spoof_partition`` client claims: the next honest client's (its own if none)."""
    for step in range(1, n_clients):
        victim = (partition_id + step) % n_clients
        if not hostile[victim]:
            return victim
    return partition_id


# ---------------------------------------------------------------- bloated_reply (either algorithm)

# Every reply of a bloated_reply client carries its honest content plus an extra array of BLOAT_NUMBERS
# float64 (32 MiB) and an error reason of BLOAT_ERROR_CHARS characters (20 MB, every round): the server
# must refuse it by its size before decoding it, and keep none of the reason's bulk in its books.
BLOATED_REPLY = "bloated_reply"
BLOAT_NUMBERS = 2**22
BLOAT_ERROR_CHARS = 20 * 10**6
BLOAT_ARRAY = "padding"


def bloated_reply(arrays: dict[str, np.ndarray], values: dict) -> tuple[dict[str, np.ndarray], dict]:
    """What a ``bloated_reply`` client sends: its honest ``arrays`` and ``values``, an extra array and a long ``error``."""
    return ({**arrays, BLOAT_ARRAY: np.zeros(BLOAT_NUMBERS)},
            {**values, "error": "x" * BLOAT_ERROR_CHARS})
