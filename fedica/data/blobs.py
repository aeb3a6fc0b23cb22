"""Synthetic isotropic blobs of the FedGEM paper (section 6.2, appendix D.2.2): centres at least
``r_min`` apart (two exactly), a random subset of the clusters per client, three settings.
"""

from __future__ import annotations

import functools

import numpy as np
from scipy.spatial.distance import pdist

from fedica.data.common import ClientData, apportion, mark_readonly, resolve_k_range
from fedica.seeding import generator
from fedica.validation import check_partition, check_seed

SETTINGS = ("nominal", "client_imbalance", "cluster_imbalance")


# The paper's client-imbalance profile (40/24/16/16/4 %) as integer weights; see `client_shares`.
_CLIENT_IMBALANCE_WEIGHTS = np.array([10, 6, 4, 4, 1])


# Stream codes: the first spawn-key entry of every random stream (never reuse one for another purpose).










def blobs_centers(n_clusters: int, dim: int, r_min: float, *, random_state=None) -> np.ndarray:
    """Cluster centres at least ``r_min`` apart, the closest pair exactly ``r_min`` apart.

    Centres are drawn uniformly in a ``make_blobs``-style box ``[-h, h]^dim`` with
    ``h = max(10, r_min * n_clusters ** (1 / dim))`` (scikit-learn's default box is ``[-10, 10]``; it is widened
    so that the packing stays loose for large ``r_min``). Each centre is drawn by rejection sampling: candidates
    closer than ``r_min`` to an accepted centre are discarded; if a centre cannot be placed, the box grows by 1.5x
    and sampling restarts. Finally the whole layout is shrunk about the box centre by ``r_min / d_min <= 1``,
    where ``d_min`` is its closest-pair distance: all distances scale alike, so every pair stays ``>= r_min``,
    the closest pair becomes exactly ``r_min`` and the centres stay in the box.

    Parameters
    ----------
    n_clusters : int
        K >= 2.
    dim : int
        d >= 1.
    r_min : float
        Minimum distance between centres, > 0.
    random_state : int, numpy.random.Generator or None

    Returns
    -------
    centers : ndarray of shape (n_clusters, dim)
    """
    if n_clusters < 2:
        raise ValueError(f"n_clusters must be >= 2 (a closest pair must exist), got {n_clusters}")
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    if not r_min > 0:
        raise ValueError(f"r_min must be > 0, got {r_min}")
    rng = np.random.default_rng(random_state)
    half_width = max(10.0, r_min * n_clusters ** (1.0 / dim))
    batch, max_batches = 64, 20
    while True:
        centers = np.empty((0, dim))
        for _ in range(n_clusters):  # sequential by nature: each centre must respect the ones already placed
            for _ in range(max_batches):
                candidates = rng.uniform(-half_width, half_width, size=(batch, dim))
                far = np.all(np.linalg.norm(candidates[:, None] - centers[None], axis=2) >= r_min, axis=1)
                if far.any():
                    centers = np.vstack([centers, candidates[np.argmax(far)]])
                    break
            else:
                break
        if len(centers) == n_clusters:
            return centers * (r_min / pdist(centers).min())
        half_width *= 1.5


def client_cluster_sets(n_clients: int, n_clusters: int, k_min: int, k_max: int, *, random_state=None
                        ) -> list[np.ndarray]:
    """Which global clusters each client holds: K_g in [k_min, k_max] each, every cluster on some client.

    Construction (no rejection loop, so it always terminates): draw every K_g uniformly from
    ``{k_min, ..., k_max}``; while the sizes cannot cover all clusters, add one to a random client below
    ``k_max``; deal every cluster to one random free slot (slots: client g repeated K_g times, shuffled), then
    fill each client's remaining slots with random clusters it does not hold yet. Clients are exchangeable.

    Parameters
    ----------
    n_clients : int
        G >= 1.
    n_clusters : int
        K.
    k_min, k_max : int
        Range of K_g; need ``1 <= k_min <= k_max <= n_clusters`` and ``n_clients * k_max >= n_clusters``.
    random_state : int, numpy.random.Generator or None

    Returns
    -------
    sets : list of n_clients ndarrays, each of shape (K_g,)
        Sorted global cluster ids.
    """
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1, got {n_clients}")
    k_min, k_max = resolve_k_range(n_clusters, k_min, k_max)
    if n_clients * k_max < n_clusters:
        raise ValueError(
            f"n_clients * k_max must be >= n_clusters so that every cluster is on some client, got "
            f"{n_clients} * {k_max} < {n_clusters}"
        )
    rng = np.random.default_rng(random_state)
    sizes = rng.integers(k_min, k_max + 1, size=n_clients)
    while sizes.sum() < n_clusters:
        sizes[rng.choice(np.flatnonzero(sizes < k_max))] += 1
    slots = rng.permutation(np.repeat(np.arange(n_clients), sizes))
    owner_of_cluster = slots[:n_clusters]
    sets = []
    for g in range(n_clients):
        dealt = np.flatnonzero(owner_of_cluster == g)
        others = np.setdiff1d(np.arange(n_clusters), dealt)
        extra = rng.choice(others, size=sizes[g] - dealt.size, replace=False)
        sets.append(np.sort(np.concatenate([dealt, extra])).astype(np.int64))
    return sets


def client_shares(setting: str, n_clients: int, *, random_state=None) -> np.ndarray:
    """Fraction of the data each client holds.

    ``nominal`` and ``cluster_imbalance`` (whose imbalance is within clients): equal shares.
    ``client_imbalance``: the paper's profile 40/24/16/16/4 % (integer weights 10, 6, 4, 4, 1), generalised to
    any G by repeating the weights cyclically, client g getting weight ``(10, 6, 4, 4, 1)[g % 5]``, then
    normalising: G=5 gives exactly the paper's vector, G=10 gives 20/12/8/8/2/20/12/8/8/2 %, G=3 gives 50/30/20 %.

    Parameters
    ----------
    setting : {"nominal", "client_imbalance", "cluster_imbalance"}
    n_clients : int
        G >= 1.
    random_state : int, numpy.random.Generator or None
        Accepted for a uniform signature; no current setting draws random numbers (clients are exchangeable,
        so shuffling the profile would change nothing in law).

    Returns
    -------
    shares : ndarray of shape (n_clients,)
        Non-negative, summing to 1.
    """
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1, got {n_clients}")
    if setting == "client_imbalance":
        weights = _CLIENT_IMBALANCE_WEIGHTS[np.arange(n_clients) % _CLIENT_IMBALANCE_WEIGHTS.size]
    else:
        weights = np.ones(n_clients)
    return weights / weights.sum()


@functools.lru_cache(maxsize=64)
def _blobs_structure(n_clients, n_clusters, dim, r_min, n_train, n_test, setting, k_min, k_max, seed):
    centers = blobs_centers(n_clusters, dim, r_min, random_state=generator(seed, "blobs.centers"))
    sets = client_cluster_sets(n_clients, n_clusters, k_min, k_max,
                               random_state=generator(seed, "scenario.cluster_sets"))
    shares = client_shares(setting, n_clients, random_state=generator(seed, "blobs.shares"))
    train_counts = apportion(n_train, shares)
    test_counts = apportion(n_test, shares)
    too_small = np.flatnonzero((train_counts < [s.size for s in sets]) | (test_counts < 1))
    if too_small.size:
        g = int(too_small[0])
        raise ValueError(
            f"n_train={n_train} / n_test={n_test} too small: client {g} would get {train_counts[g]} training and "
            f"{test_counts[g]} test points for its {sets[g].size} clusters (need >= K_g training, >= 1 test)"
        )
    mark_readonly(centers, train_counts, test_counts, *sets)
    return centers, tuple(sets), train_counts, test_counts


def blobs_client_data(partition_id: int, *, n_clients: int, n_clusters: int, dim: int, r_min: float,
                      n_train: int, n_test: int, setting: str = "nominal", k_min: int = 2,
                      k_max: int | None = None, seed: int = 0) -> ClientData:
    """One client's share of the synthetic blobs scenario (FedGEM paper, section 6.2 and appendix D.2.2).

    Unit-variance isotropic Gaussian clusters around `blobs_centers`; the client holds the clusters
    `client_cluster_sets` gives it. ``n_train`` and ``n_test`` are totals over all clients; client g gets its
    `client_shares` share of each, rounded by the largest-remainder method so that the clients' counts add up
    to exactly ``n_train`` and ``n_test``. Within a client the clusters get equal proportions, except for
    ``setting="cluster_imbalance"``, where they get Dirichlet(1, ..., 1) proportions drawn per client (the same
    proportions for train and test); every local cluster gets at least one training and (if the client has at
    least K_g test points) one test point. Test points come from the client's own clusters. Rows are shuffled.

    Parameters
    ----------
    partition_id : int
        Client index g in [0, n_clients).
    n_clients, n_clusters, dim : int
        G, K and d.
    r_min : float
        Distance of the closest pair of centres.
    n_train, n_test : int
        Total numbers of training and test points over all clients.
    setting : {"nominal", "client_imbalance", "cluster_imbalance"}
    k_min : int
    k_max : int or None
        Range of K_g; None means ``n_clusters - 1``.
    seed : int
        Non-negative.

    Returns
    -------
    ClientData
        ``y_*`` are global cluster ids; ``n_components`` is K_g.
    """
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, got {setting!r}")
    k_min, k_max = resolve_k_range(n_clusters, k_min, k_max)
    g = check_partition(partition_id, n_clients)
    centers, sets, train_counts, test_counts = _blobs_structure(
        int(n_clients), int(n_clusters), int(dim), float(r_min), int(n_train), int(n_test), setting,
        k_min, k_max, check_seed(seed))
    clusters = sets[g]
    if setting == "cluster_imbalance":
        proportions = generator(seed, "blobs.proportions", g).dirichlet(np.ones(clusters.size))
    else:
        proportions = np.full(clusters.size, 1.0 / clusters.size)
    rng = generator(seed, "blobs.points", g)

    def draw(total):
        counts = apportion(total, proportions, minimum=1 if total >= clusters.size else 0)
        labels = rng.permutation(np.repeat(clusters, counts))
        return centers[labels] + rng.standard_normal((labels.size, centers.shape[1])), labels

    X_train, y_train = draw(int(train_counts[g]))
    X_test, y_test = draw(int(test_counts[g]))
    return ClientData(X_train, y_train, X_test, y_test, int(clusters.size))
