"""Clustering scenarios for FedGEM: synthetic blobs, Breiman's waveform, scikit-learn's digits, user files.

Every client builds only its own share, deterministically from ``(seed, partition_id)``. The global structure of
a scenario (cluster centres, which clusters each client holds, client shares, the generated or loaded data set
and its train/test split) depends on ``seed`` only, so a client generated alone gets exactly the data it would
get if all clients were generated together.

Random streams are independent: each comes from ``np.random.SeedSequence(seed, spawn_key=(stream, ...))`` with
its own stream code (and the client index for per-client streams), so changing, say, how many points a client
draws never changes the centres or another client's points.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.spatial.distance import pdist
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

__all__ = [
    "ClientData",
    "DataFileError",
    "SCENARIO_NAMES",
    "SETTINGS",
    "blobs_centers",
    "blobs_client_data",
    "client_cluster_sets",
    "client_shares",
    "digits_client_data",
    "load_client_file",
    "scenario_client_data",
    "true_n_clusters",
    "waveform",
    "waveform_client_data",
]

SETTINGS = ("nominal", "client_imbalance", "cluster_imbalance")
SCENARIO_NAMES = ("blobs", "waveform", "digits", "files")

# The paper's client-imbalance profile (40/24/16/16/4 %) as integer weights; see `client_shares`.
_CLIENT_IMBALANCE_WEIGHTS = np.array([10, 6, 4, 4, 1])

# Stream codes: the first spawn-key entry of every random stream (never reuse one for another purpose).
_STREAM_CENTERS = 1
_STREAM_CLUSTER_SETS = 2
_STREAM_SHARES = 3
_STREAM_PROPORTIONS = 4  # per client: spawn key (code, partition_id)
_STREAM_POINTS = 5  # per client: spawn key (code, partition_id)
_STREAM_WAVEFORM = 6
_STREAM_SPLIT = 7
_STREAM_ASSIGN = 8
_STREAM_FILE_SPLIT = 9

_SKLEARN_SEED_MAX = np.iinfo(np.int32).max


class DataFileError(ValueError):
    """A client's data file is missing or malformed; the message names the file, the place and the rule."""


@dataclass(frozen=True)
class ClientData:
    """One client's data.

    Attributes
    ----------
    X_train : ndarray of shape (n, d), float64
        Training points.
    y_train : ndarray of shape (n,), int64, or None
        Global class labels of the training points, None if unknown.
    X_test : ndarray of shape (m, d), float64
        Test points.
    y_test : ndarray of shape (m,), int64, or None
        Global class labels of the test points, None if unknown.
    n_components : int
        K_g, the number of local mixture components this client fits.
    """

    X_train: np.ndarray
    y_train: np.ndarray | None
    X_test: np.ndarray
    y_test: np.ndarray | None
    n_components: int

    def __post_init__(self):
        if self.X_train.ndim != 2 or self.X_test.ndim != 2:
            raise ValueError(
                f"X_train and X_test must be 2-D, got shapes {self.X_train.shape} and {self.X_test.shape}"
            )
        if self.X_train.shape[1] != self.X_test.shape[1]:
            raise ValueError(
                f"X_train and X_test must have the same number of columns, got {self.X_train.shape[1]} "
                f"and {self.X_test.shape[1]}"
            )
        for name, X, y in (("train", self.X_train, self.y_train), ("test", self.X_test, self.y_test)):
            if y is not None and y.shape != (X.shape[0],):
                raise ValueError(f"y_{name} must have shape ({X.shape[0]},) to match X_{name}, got {y.shape}")
        if int(self.n_components) < 1:
            raise ValueError(f"n_components must be >= 1, got {self.n_components}")

    @property
    def n_train(self) -> int:
        """N_g, the number of training points."""
        return int(self.X_train.shape[0])


# ----------------------------------------------------------------------------------------------------------------
# Helpers


def _stream(seed: int, *key: int) -> np.random.Generator:
    """Independent generator for one named stream of one seed (see the module docstring)."""
    return np.random.default_rng(np.random.SeedSequence(_check_seed(seed), spawn_key=key))


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return int(seed)


def _sklearn_seed(rng: np.random.Generator) -> int:
    return int(rng.integers(_SKLEARN_SEED_MAX))


def _check_partition(partition_id, n_clients: int) -> int:
    if isinstance(partition_id, bool) or not isinstance(partition_id, (int, np.integer)):
        raise ValueError(f"partition_id must be an int, got {partition_id!r}")
    if not 0 <= partition_id < n_clients:
        raise ValueError(f"partition_id must be in [0, n_clients={n_clients}), got {partition_id}")
    return int(partition_id)


def _check_test_fraction(test_fraction) -> float:
    if not 0.0 < float(test_fraction) < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    return float(test_fraction)


def _apportion(total: int, fractions: np.ndarray, minimum: int = 0) -> np.ndarray:
    """Integer counts summing exactly to ``total``, proportional to ``fractions`` (largest-remainder method).

    Every entry first gets ``minimum``; the rest is split by the fractions, floors first, then one extra unit each
    to the largest fractional parts (ties: lower index). Rounding therefore never loses or adds a point.
    """
    fractions = np.asarray(fractions, dtype=float)
    free = total - minimum * fractions.size
    if free < 0:
        raise ValueError(f"cannot give {fractions.size} parts at least {minimum} each out of {total}")
    raw = free * fractions / fractions.sum()
    counts = np.floor(raw).astype(np.int64)
    short = free - int(counts.sum())
    counts[np.argsort(-(raw - counts), kind="stable")[:short]] += 1
    return counts + minimum


def _resolve_k_range(n_clusters: int, k_min: int, k_max: int | None) -> tuple[int, int]:
    k_max = n_clusters - 1 if k_max is None else k_max
    if not 1 <= k_min <= k_max <= n_clusters:
        raise ValueError(
            f"need 1 <= k_min <= k_max <= n_clusters, got k_min={k_min}, k_max={k_max}, n_clusters={n_clusters} "
            "(FedGEM's setting is 2 <= K_g < K: k_min=2, k_max=n_clusters-1)"
        )
    return int(k_min), int(k_max)


def _readonly(*arrays: np.ndarray) -> None:
    """Cached arrays are shared between calls; make accidental in-place edits fail loudly."""
    for array in arrays:
        array.setflags(write=False)


# ----------------------------------------------------------------------------------------------------------------
# Global structure


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
    k_min, k_max = _resolve_k_range(n_clusters, k_min, k_max)
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


# ----------------------------------------------------------------------------------------------------------------
# Blobs


@functools.lru_cache(maxsize=64)
def _blobs_structure(n_clients, n_clusters, dim, r_min, n_train, n_test, setting, k_min, k_max, seed):
    centers = blobs_centers(n_clusters, dim, r_min, random_state=_stream(seed, _STREAM_CENTERS))
    sets = client_cluster_sets(n_clients, n_clusters, k_min, k_max,
                               random_state=_stream(seed, _STREAM_CLUSTER_SETS))
    shares = client_shares(setting, n_clients, random_state=_stream(seed, _STREAM_SHARES))
    train_counts = _apportion(n_train, shares)
    test_counts = _apportion(n_test, shares)
    too_small = np.flatnonzero((train_counts < [s.size for s in sets]) | (test_counts < 1))
    if too_small.size:
        g = int(too_small[0])
        raise ValueError(
            f"n_train={n_train} / n_test={n_test} too small: client {g} would get {train_counts[g]} training and "
            f"{test_counts[g]} test points for its {sets[g].size} clusters (need >= K_g training, >= 1 test)"
        )
    _readonly(centers, train_counts, test_counts, *sets)
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
    k_min, k_max = _resolve_k_range(n_clusters, k_min, k_max)
    g = _check_partition(partition_id, n_clients)
    centers, sets, train_counts, test_counts = _blobs_structure(
        int(n_clients), int(n_clusters), int(dim), float(r_min), int(n_train), int(n_test), setting,
        k_min, k_max, _check_seed(seed))
    clusters = sets[g]
    if setting == "cluster_imbalance":
        proportions = _stream(seed, _STREAM_PROPORTIONS, g).dirichlet(np.ones(clusters.size))
    else:
        proportions = np.full(clusters.size, 1.0 / clusters.size)
    rng = _stream(seed, _STREAM_POINTS, g)

    def draw(total):
        counts = _apportion(total, proportions, minimum=1 if total >= clusters.size else 0)
        labels = rng.permutation(np.repeat(clusters, counts))
        return centers[labels] + rng.standard_normal((labels.size, centers.shape[1])), labels

    X_train, y_train = draw(int(train_counts[g]))
    X_test, y_test = draw(int(test_counts[g]))
    return ClientData(X_train, y_train, X_test, y_test, int(clusters.size))


# ----------------------------------------------------------------------------------------------------------------
# Labelled data sets split among clients by class (waveform, digits)


def waveform(n_samples: int, *, random_state=None) -> tuple[np.ndarray, np.ndarray]:
    """Breiman's waveform generator (Breiman et al. 1984; the UCI Waveform data set, version 1).

    With ``h1(i) = max(6 - |i - 11|, 0)``, ``h2(i) = h1(i - 4)``, ``h3(i) = h1(i + 4)`` for i = 1..21 and
    ``u ~ U(0, 1)`` per point: class 0 is ``u h1 + (1 - u) h2``, class 1 is ``u h1 + (1 - u) h3``, class 2 is
    ``u h2 + (1 - u) h3``, each plus independent N(0, 1) noise per feature; classes are equally likely (drawn,
    not balanced exactly). UCI numbers the classes differently and rounds to 2 decimals; neither changes ARI.

    Parameters
    ----------
    n_samples : int
    random_state : int, numpy.random.Generator or None

    Returns
    -------
    X : ndarray of shape (n_samples, 21)
    y : ndarray of shape (n_samples,), int64 in {0, 1, 2}
    """
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples}")
    rng = np.random.default_rng(random_state)
    waves = _waveform_base_waves()
    pairs = np.array([[waves[0], waves[1]], [waves[0], waves[2]], [waves[1], waves[2]]])  # (3 classes, 2, 21)
    y = rng.integers(0, 3, size=n_samples)
    u = rng.uniform(size=(n_samples, 1))
    X = u * pairs[y, 0] + (1.0 - u) * pairs[y, 1] + rng.standard_normal((n_samples, 21))
    return X, y.astype(np.int64)


def _waveform_base_waves() -> np.ndarray:
    """h1, h2, h3 of `waveform`, shape (3, 21)."""
    i = np.arange(1, 22)
    h1 = lambda t: np.maximum(6 - np.abs(t - 11), 0)  # noqa: E731
    return np.array([h1(i), h1(i - 4), h1(i + 4)], dtype=float)


@functools.lru_cache(maxsize=8)
def _waveform_dataset(n_samples: int, seed: int):
    X, y = waveform(n_samples, random_state=_stream(seed, _STREAM_WAVEFORM))
    _readonly(X, y)
    return X, y


@functools.lru_cache(maxsize=1)
def _digits_dataset():
    X, y = load_digits(return_X_y=True)
    X, y = X.astype(np.float64), y.astype(np.int64)
    _readonly(X, y)
    return X, y


@functools.lru_cache(maxsize=32)
def _class_partition(dataset: str, dataset_args: tuple, n_clients: int, test_fraction: float, k_min: int,
                     k_max: int, seed: int):
    """Split a labelled data set train/test (stratified) and deal every class evenly among its holders.

    Returns ``(X, y, train_idx, test_idx, train_owner, test_owner, sets)``: the owner arrays give the client
    of every train/test index.
    """
    X, y = _waveform_dataset(*dataset_args, seed) if dataset == "waveform" else _digits_dataset()
    classes = np.unique(y)
    sets = client_cluster_sets(n_clients, classes.size, k_min, k_max,
                               random_state=_stream(seed, _STREAM_CLUSTER_SETS))
    train_idx, test_idx = train_test_split(
        np.arange(y.size), test_size=test_fraction, stratify=y,
        random_state=_sklearn_seed(_stream(seed, _STREAM_SPLIT)))
    holds = np.zeros((n_clients, classes.size), dtype=bool)
    holds[np.repeat(np.arange(n_clients), [s.size for s in sets]), np.concatenate(sets)] = True
    rng = _stream(seed, _STREAM_ASSIGN)
    owners = []
    for idx in (train_idx, test_idx):
        owner = np.empty(idx.size, dtype=np.int64)
        for c in range(classes.size):  # a handful of classes; each class's points are dealt in one shot
            members = rng.permutation(np.flatnonzero(y[idx] == classes[c]))
            holders = np.flatnonzero(holds[:, c])
            chunk = np.arange(members.size) * holders.size // members.size  # even split, sizes differ by <= 1
            owner[members] = holders[chunk]
        owners.append(owner)
    train_counts = np.bincount(owners[0], minlength=n_clients)
    short = np.flatnonzero(train_counts < [s.size for s in sets])
    if short.size:
        g = int(short[0])
        raise ValueError(f"client {g} gets only {train_counts[g]} training points for {sets[g].size} classes; "
                         "use fewer clients or more data")
    _readonly(train_idx, test_idx, *owners, *sets)
    return X, y, train_idx, test_idx, owners[0], owners[1], tuple(sets)


def _class_client_data(partition_id, dataset, dataset_args, n_clients, test_fraction, k_min, k_max, seed):
    g = _check_partition(partition_id, n_clients)
    k_min, k_max = _resolve_k_range(3 if dataset == "waveform" else 10, k_min, k_max)
    X, y, train_idx, test_idx, train_owner, test_owner, sets = _class_partition(
        dataset, dataset_args, int(n_clients), _check_test_fraction(test_fraction), k_min, k_max,
        _check_seed(seed))
    train = train_idx[train_owner == g]
    test = test_idx[test_owner == g]
    return ClientData(X[train], y[train], X[test], y[test], int(sets[g].size))


def waveform_client_data(partition_id: int, *, n_clients: int = 5, n_samples: int = 5000,
                         test_fraction: float = 0.3, k_min: int = 2, k_max: int | None = None,
                         seed: int = 0) -> ClientData:
    """One client's share of a generated Waveform data set (stand-in for the paper's UCI Waveform).

    The whole data set (`waveform`, ``n_samples`` points) and its stratified train/test split come from
    ``seed``; every client holds a random set of K_g classes (`client_cluster_sets`; ``k_max=None`` means 2, the
    paper's text; the authors' code allows 3) and every class's train and test points are dealt evenly at random
    among the clients holding it, so each point is on exactly one client. No standardisation (the paper's
    setting).

    Parameters
    ----------
    partition_id : int
        Client index in [0, n_clients).
    n_clients : int
    n_samples : int
        Size of the whole data set.
    test_fraction : float
        In (0, 1).
    k_min : int
    k_max : int or None
    seed : int

    Returns
    -------
    ClientData
        21 features; labels in {0, 1, 2}; ``n_components`` is the number of classes the client holds.
    """
    return _class_client_data(partition_id, "waveform", (int(n_samples),), n_clients, test_fraction, k_min,
                              k_max, seed)


def digits_client_data(partition_id: int, *, n_clients: int = 10, test_fraction: float = 0.3, k_min: int = 2,
                       k_max: int | None = None, seed: int = 0) -> ClientData:
    """One client's share of scikit-learn's handwritten digits (1797 x 64, 10 classes, shipped with sklearn).

    Split and dealt among clients exactly as in `waveform_client_data` (``k_max=None`` means 9). Features are
    used as loaded: pixel intensities 0..16, not standardised.

    Parameters
    ----------
    partition_id : int
    n_clients : int
    test_fraction : float
    k_min : int
    k_max : int or None
    seed : int

    Returns
    -------
    ClientData
        64 features; labels in 0..9.
    """
    return _class_client_data(partition_id, "digits", (), n_clients, test_fraction, k_min, k_max, seed)


# ----------------------------------------------------------------------------------------------------------------
# User files


def load_client_file(path, *, label_column: int | str | None = None, n_components: int | None = None,
                     test_fraction: float = 0.3, seed: int = 0, delimiter: str = ",") -> ClientData:
    """Load one client's data from a CSV, ``.npy`` or ``.npz`` file and split it train/test.

    Formats (chosen by suffix; anything other than ``.npy``/``.npz`` is read as CSV):

    - CSV: numbers separated by ``delimiter``; blank lines are skipped. The first non-blank line is a header
      exactly when at least one of its cells is not a number (Python ``float`` syntax, so ``nan``/``inf`` count
      as numbers and are then rejected as non-finite).
    - ``.npy``: one 2-D numeric array.
    - ``.npz``: a 2-D array ``X`` and optionally a 1-D array ``y`` of labels.

    ``label_column`` (an int index, negative allowed, or a header name) takes that column out of the features as
    labels; with ``.npz`` it indexes ``X`` and must not be combined with a ``y`` array. Labels must be integers
    (written as such or as integral floats); they are global class ids shared by all clients.

    The split is seeded by ``seed``; it is stratified by label when labels exist and every label has at least
    two points (and both parts can hold every label), otherwise a plain random split.

    Parameters
    ----------
    path : str or os.PathLike
    label_column : int, str or None
    n_components : int or None
        K_g; None means the number of distinct labels (an error without labels).
    test_fraction : float
        In (0, 1).
    seed : int
    delimiter : str
        CSV field separator.

    Returns
    -------
    ClientData

    Raises
    ------
    DataFileError
        For a missing or empty file, a non-numeric cell (line and column named), a NaN or infinite value (row or
        line, and column), a non-integer label, a wrong number of dimensions, a ragged CSV, fewer than 2
        components, or fewer points than components. The message starts with the file's path.
    """
    path = Path(path)
    test_fraction = _check_test_fraction(test_fraction)
    if not path.is_file():
        raise DataFileError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise DataFileError(f"{path}: file is empty")
    suffix = path.suffix.lower()
    if suffix in (".npy", ".npz"):
        X, y = _read_numpy_file(path, suffix, label_column)
    else:
        X, y = _read_csv_file(path, label_column, delimiter)

    if n_components is None:
        if y is None:
            raise DataFileError(f"{path}: n_components is not given and the file has no labels to count it from")
        n_components = int(np.unique(y).size)
    if n_components < 2:
        raise DataFileError(f"{path}: needs at least 2 components (clusters), got n_components={n_components}")
    if X.shape[0] < n_components:
        raise DataFileError(f"{path}: has {X.shape[0]} points, fewer than n_components={n_components}")

    indices = np.arange(X.shape[0])
    stratify = None
    if y is not None:
        _, label_counts = np.unique(y, return_counts=True)
        n_test = math.ceil(test_fraction * X.shape[0])
        if label_counts.min() >= 2 and min(n_test, X.shape[0] - n_test) >= label_counts.size:
            stratify = y
    train, test = train_test_split(indices, test_size=test_fraction, stratify=stratify,
                                   random_state=_sklearn_seed(_stream(seed, _STREAM_FILE_SPLIT)))
    if train.size < n_components:
        raise DataFileError(
            f"{path}: after the test_fraction={test_fraction} split only {train.size} training points remain, "
            f"fewer than n_components={n_components}")
    y_train = None if y is None else y[train]
    y_test = None if y is None else y[test]
    return ClientData(X[train], y_train, X[test], y_test, int(n_components))


def _cell_name(column: int, header: list[str] | None) -> str:
    return f"column {column}" + (f" ({header[column]!r})" if header is not None else "")


def _read_csv_file(path: Path, label_column, delimiter: str):
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle, delimiter=delimiter)
        rows, lines = [], []
        for row in reader:
            if all(not cell.strip() for cell in row):
                continue
            rows.append([cell.strip() for cell in row])
            lines.append(reader.line_num)
    if not rows:
        raise DataFileError(f"{path}: file has no data (only blank lines)")

    header = None
    if any(not _is_number(cell) for cell in rows[0]):
        header, rows, lines = rows[0], rows[1:], lines[1:]
        if not rows:
            raise DataFileError(f"{path}: file has a header but no data rows")
    width = len(header) if header is not None else len(rows[0])
    for row, line in zip(rows, lines):
        if len(row) != width:
            raise DataFileError(f"{path}: line {line} has {len(row)} cells, expected {width} (every row must "
                                "have as many cells as the first)")
    try:
        table = np.array(rows, dtype=np.float64)
    except ValueError:
        # Only on this error path: find the first offending cell to name it.
        for row, line in zip(rows, lines):
            for column, cell in enumerate(row):
                if not _is_number(cell):
                    raise DataFileError(f"{path}: line {line}, {_cell_name(column, header)}: {cell!r} is not a "
                                        "number (every cell must be numeric)") from None
        raise
    _check_finite(path, table, lambda row: f"line {lines[row]}", header)

    label_index = _resolve_label_column(path, label_column, width, header)
    return _split_label_column(path, table, label_index, lambda row: f"line {lines[row]}", header)


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _read_numpy_file(path: Path, suffix: str, label_column):
    try:
        loaded = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as error:
        raise DataFileError(f"{path}: cannot be read as {suffix} ({error})") from None
    y = None
    if suffix == ".npz":
        with loaded:
            if "X" not in loaded.files:
                raise DataFileError(f"{path}: .npz file has no array 'X' (arrays found: {loaded.files})")
            X = loaded["X"]
            y = loaded["y"] if "y" in loaded.files else None
        if y is not None and label_column is not None:
            raise DataFileError(f"{path}: has a 'y' array and label_column={label_column!r} was given; "
                                "use one source of labels")
    else:
        X = loaded
    if X.ndim != 2:
        raise DataFileError(f"{path}: the data array must be 2-D (points x features), got {X.ndim}-D "
                            f"shape {X.shape}")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise DataFileError(f"{path}: the data array is empty (shape {X.shape})")
    if not (np.issubdtype(X.dtype, np.number) or X.dtype == bool):
        raise DataFileError(f"{path}: the data array must be numeric, got dtype {X.dtype}")
    X = X.astype(np.float64)
    _check_finite(path, X, lambda row: f"row {row}", None)
    where = lambda row: f"row {row}"  # noqa: E731
    if y is not None:
        if y.ndim != 1 or y.shape[0] != X.shape[0]:
            raise DataFileError(f"{path}: 'y' must be 1-D with one label per row of 'X' ({X.shape[0]}), got "
                                f"shape {y.shape}")
        if not np.issubdtype(y.dtype, np.number):
            raise DataFileError(f"{path}: 'y' must be numeric, got dtype {y.dtype}")
        return X, _integer_labels(path, y.astype(np.float64), where, "array 'y'")
    label_index = _resolve_label_column(path, label_column, X.shape[1], None)
    return _split_label_column(path, X, label_index, where, None)


def _check_finite(path: Path, table: np.ndarray, where, header) -> None:
    bad = np.argwhere(~np.isfinite(table))
    if bad.size:
        row, column = bad[0]
        raise DataFileError(f"{path}: {where(row)}, {_cell_name(column, header)}: value {table[row, column]} is "
                            "not finite (NaN and infinity are not allowed)")


def _resolve_label_column(path: Path, label_column, width: int, header) -> int | None:
    if label_column is None:
        return None
    if isinstance(label_column, str):
        if header is None:
            raise DataFileError(f"{path}: label_column={label_column!r} is a name but the file has no header")
        if label_column not in header:
            raise DataFileError(f"{path}: label_column={label_column!r} is not in the header {header}")
        return header.index(label_column)
    if not -width <= int(label_column) < width:
        raise DataFileError(f"{path}: label_column={label_column} is out of range for {width} columns")
    return int(label_column) % width


def _split_label_column(path: Path, table: np.ndarray, label_index: int | None, where, header):
    if label_index is None:
        return table, None
    if table.shape[1] < 2:
        raise DataFileError(f"{path}: only the label column, no feature columns")
    labels = _integer_labels(path, table[:, label_index], where, _cell_name(label_index, header))
    return np.delete(table, label_index, axis=1), labels


def _integer_labels(path: Path, values: np.ndarray, where, column_name: str) -> np.ndarray:
    bad = np.flatnonzero(~np.isfinite(values) | (values != np.round(values)))
    if bad.size:
        raise DataFileError(f"{path}: {where(bad[0])}, {column_name}: label {values[bad[0]]} is not an integer "
                            "(labels must be integer class ids)")
    return values.astype(np.int64)


# ----------------------------------------------------------------------------------------------------------------
# Scenario dispatch

_SCENARIO_KEYS = {
    "blobs": ("n_clients", "n_clusters", "dim", "r_min", "n_train", "n_test", "setting", "k_min", "k_max"),
    "waveform": ("n_clients", "n_samples", "test_fraction", "k_min", "k_max"),
    "digits": ("n_clients", "test_fraction", "k_min", "k_max"),
    "files": ("paths", "label_column", "n_components", "test_fraction"),
}


def _freeze(value):
    """Hashable copy of a config value (lists, e.g. OmegaConf ListConfig, become tuples)."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(key), _freeze(item)) for key, item in value.items()))
    if isinstance(value, Sequence) and not isinstance(value, str):
        return tuple(_freeze(item) for item in value)
    return value


def _scenario_key(scenario: Mapping) -> tuple[str, tuple]:
    if not isinstance(scenario, Mapping) or "name" not in scenario:
        raise ValueError(f"scenario must be a mapping with a 'name' key, one of {SCENARIO_NAMES}")
    name = scenario["name"]
    if name not in _SCENARIO_KEYS:
        raise ValueError(f"unknown scenario name {name!r}; known names: {SCENARIO_NAMES}")
    unknown = sorted(set(scenario) - {"name", *_SCENARIO_KEYS[name]})
    if unknown:
        raise ValueError(f"scenario {name!r} has unknown keys {unknown}; its keys are {_SCENARIO_KEYS[name]}")
    return name, tuple((key, _freeze(scenario[key])) for key in _SCENARIO_KEYS[name] if key in scenario)


def _file_stamp(path) -> tuple | None:
    """Part of the cache key of a file scenario, so an edited file is re-read."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def scenario_client_data(scenario: Mapping, partition_id: int, seed: int) -> ClientData:
    """One client's data for a scenario config (INTERFACE.md, ``scenario=...``).

    Parameters
    ----------
    scenario : Mapping
        ``name`` in {"blobs", "waveform", "digits", "files"} plus that scenario's keys; missing keys take the
        defaults of the matching ``*_client_data`` function. ``files`` needs ``paths`` (one per client);
        its ``n_components`` may be an int, a list (one per client) or None. Unknown keys are an error.
    partition_id : int
        Client index.
    seed : int

    Returns
    -------
    ClientData
        A fresh copy: results are cached per process (keyed by the scenario, the client and the seed; for files
        also the file's modification time and size), so repeated calls cost one copy.
    """
    name, items = _scenario_key(scenario)
    stamp = None
    if name == "files":
        paths = dict(items).get("paths", ())
        if 0 <= partition_id < len(paths):
            stamp = _file_stamp(paths[partition_id])
    data = _cached_client_data(name, items, int(partition_id), _check_seed(seed), stamp)
    return dataclasses.replace(
        data,
        X_train=data.X_train.copy(), X_test=data.X_test.copy(),
        y_train=None if data.y_train is None else data.y_train.copy(),
        y_test=None if data.y_test is None else data.y_test.copy(),
    )


@functools.lru_cache(maxsize=512)
def _cached_client_data(name: str, items: tuple, partition_id: int, seed: int, _stamp) -> ClientData:
    params = dict(items)
    if name == "blobs":
        missing = [key for key in _SCENARIO_KEYS["blobs"][:6] if key not in params]
        if missing:
            raise ValueError(f"scenario 'blobs' needs keys {missing}")
        return blobs_client_data(partition_id, seed=seed, **params)
    if name == "waveform":
        return waveform_client_data(partition_id, seed=seed, **params)
    if name == "digits":
        return digits_client_data(partition_id, seed=seed, **params)
    paths = params.get("paths") or ()
    if not paths:
        raise ValueError("scenario 'files' needs a non-empty 'paths' list (one file per client)")
    _check_partition(partition_id, len(paths))
    n_components = params.get("n_components")
    if isinstance(n_components, tuple):
        if len(n_components) != len(paths):
            raise ValueError(f"scenario 'files': n_components has {len(n_components)} entries for "
                             f"{len(paths)} paths; give one per client, one int, or null")
        n_components = n_components[partition_id]
    return load_client_file(paths[partition_id], label_column=params.get("label_column"),
                            n_components=n_components, test_fraction=params.get("test_fraction", 0.3),
                            seed=seed)


def true_n_clusters(scenario: Mapping) -> int | None:
    """The true number of clusters K of a scenario: ``n_clusters`` for blobs, 3 waveform, 10 digits, None files."""
    name, items = _scenario_key(scenario)
    if name == "blobs":
        return int(dict(items)["n_clusters"])
    return {"waveform": 3, "digits": 10, "files": None}[name]
