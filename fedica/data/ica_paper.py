"""The RF-ICA paper's simulation (section 4): orthogonal A*, Bernoulli-Gaussian sources, corrupted clients.

Random streams come from :mod:`fedica.seeding`: ``A*`` is stream ``ica.mixing``, the corrupted mask
``ica.corrupted`` and client ``k``'s sources ``ica.sources`` with index ``k``.
"""

from __future__ import annotations

import numpy as np

from fedica.rfica.local import make_mixing_matrix
from fedica.seeding import generator
from fedica.validation import check_index, check_int, check_ratio


def corrupted_mask(n_clients, corrupt_ratio, *, random_state=None) -> np.ndarray:
    """Which clients are corrupted (have few samples).

    Exactly ``round(corrupt_ratio * n_clients)`` clients, chosen uniformly
    without replacement. ``round`` is Python's (ties to even: 4.5 -> 4).

    Parameters
    ----------
    n_clients : int
        Number of clients ``K >= 1``.
    corrupt_ratio : float
        Share of corrupted clients, in ``[0, 1]``.
    random_state : int, numpy.random.Generator or None, default=None
        Source of the choice.

    Returns
    -------
    mask : ndarray of shape (n_clients,), dtype bool
        True for corrupted clients.
    """
    n_clients = check_int(n_clients, "n_clients", minimum=1)
    corrupt_ratio = check_ratio(corrupt_ratio, "corrupt_ratio")
    n_corrupted = int(round(corrupt_ratio * n_clients))
    chosen = np.random.default_rng(random_state).choice(n_clients, size=n_corrupted, replace=False)
    mask = np.zeros(n_clients, dtype=bool)
    mask[chosen] = True
    return mask


def ica_true_mixing(*, r, orthogonal, seed) -> np.ndarray:
    """The ``A*`` every client of a scenario shares, derived only from ``seed``.

    Parameters
    ----------
    r : int
        Dimension, ``r >= 1``.
    orthogonal : bool
        See :func:`make_mixing_matrix`.
    seed : int
        Scenario seed, ``>= 0``.

    Returns
    -------
    A_true : ndarray of shape (r, r)
        Unit-norm columns; orthogonal if ``orthogonal``.
    """
    return make_mixing_matrix(r, orthogonal=orthogonal, random_state=generator(seed, "ica.mixing"))


def ica_corrupted_clients(*, n_clients, corrupt_ratio, seed) -> np.ndarray:
    """Which clients of a scenario are corrupted, derived only from ``seed``.

    Parameters
    ----------
    n_clients : int
        Number of clients ``K >= 1``.
    corrupt_ratio : float
        Share of corrupted clients, in ``[0, 1]``.
    seed : int
        Scenario seed, ``>= 0``.

    Returns
    -------
    mask : ndarray of shape (n_clients,), dtype bool
    """
    return corrupted_mask(n_clients, corrupt_ratio, random_state=generator(seed, "ica.corrupted"))


def client_sample_size(partition_id, *, n_clients, corrupt_ratio, n_normal, n_corrupt, seed) -> int:
    """Number of samples ``n_k`` of client ``partition_id``.

    Parameters
    ----------
    partition_id : int
        Client index in ``[0, n_clients)``.
    n_clients : int
        Number of clients ``K``.
    corrupt_ratio : float
        Share of corrupted clients, in ``[0, 1]`` (see :func:`corrupted_mask`).
    n_normal, n_corrupt : int
        Sample sizes of normal and corrupted clients, ``>= 1``.
    seed : int
        Scenario seed, ``>= 0``.

    Returns
    -------
    n_k : int
        ``n_corrupt`` if the client is corrupted, else ``n_normal``.
    """
    n_clients = check_int(n_clients, "n_clients", minimum=1)
    partition_id = check_index(partition_id, "partition_id", n_clients)
    n_normal = check_int(n_normal, "n_normal", minimum=1)
    n_corrupt = check_int(n_corrupt, "n_corrupt", minimum=1)
    mask = ica_corrupted_clients(n_clients=n_clients, corrupt_ratio=corrupt_ratio, seed=seed)
    return n_corrupt if mask[partition_id] else n_normal


def ica_client_data(
    partition_id, *, n_clients, r, corrupt_ratio, n_normal, n_corrupt, sparsity, orthogonal, seed
) -> np.ndarray:
    """Observations ``Y = A* X`` of one client in the paper's simulation.

    Sources are Bernoulli-Gaussian: ``X = B * W`` entrywise with
    ``B ~ Bernoulli(sparsity)`` and ``W ~ N(0, 1)``. The client draws only its
    own sources, from a stream derived from ``(seed, partition_id)``; ``A*`` and
    the corrupted mask come from streams derived from ``seed`` only (see the
    module docstring), so any client can be built alone, in any order, and the
    result is deterministic.

    Parameters
    ----------
    partition_id : int
        Client index in ``[0, n_clients)``.
    n_clients : int
        Number of clients ``K >= 1``.
    r : int
        Number of sources and of observed signals, ``>= 1``.
    corrupt_ratio : float
        Share of corrupted clients, in ``[0, 1]``.
    n_normal, n_corrupt : int
        Sample sizes of normal and corrupted clients, ``>= 1``.
    sparsity : float
        Probability that a source entry is non-zero, in ``(0, 1]``.
    orthogonal : bool
        Whether ``A*`` is orthogonal (see :func:`make_mixing_matrix`).
    seed : int
        Scenario seed, ``>= 0``.

    Returns
    -------
    Y : ndarray of shape (r, n_k)
        ``n_k`` from :func:`client_sample_size`.

    Raises
    ------
    ValueError
        If ``partition_id`` is not an integer in ``[0, n_clients)`` or another
        argument is out of range.
    """
    n_k = client_sample_size(
        partition_id,
        n_clients=n_clients,
        corrupt_ratio=corrupt_ratio,
        n_normal=n_normal,
        n_corrupt=n_corrupt,
        seed=seed,
    )
    sparsity = check_ratio(sparsity, "sparsity")
    if sparsity == 0:
        raise ValueError("sparsity must be in (0, 1]: all sources would be zero")
    mixing = ica_true_mixing(r=r, orthogonal=orthogonal, seed=seed)
    rng = generator(seed, "ica.sources", int(partition_id))
    active = rng.random((mixing.shape[0], n_k)) < sparsity
    sources = active * rng.standard_normal((mixing.shape[0], n_k))
    return mixing @ sources
