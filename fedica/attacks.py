"""Hostile clients on demand, for robustness runs (the ``attack`` config group).

A hostile client computes its honest reply and then replaces part of it. The
server is never told which clients are hostile; only the result records it.
"""

from __future__ import annotations

import numpy as np

from fedica.seeding import generator

ICA_ATTACKS = ("random_orthogonal", "scaled_junk", "permuted_truth")
GEM_ATTACKS = ("inflated_radius", "inflated_count", "random_centroids")

# Magnitudes of the FedGEM attacks: far beyond anything an honest client reports.
INFLATED_RADIUS = 1.0e6
INFLATED_COUNT = 10**9
RANDOM_CENTROID_SCALE = 1.0e3


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
    true_mixing : ndarray of shape (r, r)
        The attacker is assumed to know A* (the worst case).
    rng : numpy.random.Generator

    Returns
    -------
    estimate : ndarray of shape (r, r)
    """
    r = true_mixing.shape[0]
    if kind == "random_orthogonal":
        q, upper = np.linalg.qr(rng.standard_normal((r, r)))
        return q * np.sign(np.diag(upper))
    if kind == "scaled_junk":
        return rng.standard_normal((r, r)) * 10.0 ** rng.uniform(0, 4, r) * rng.choice([-1.0, 1.0], r)
    if kind == "permuted_truth":
        return true_mixing[:, rng.permutation(r)] * rng.choice([-1.0, 1.0], r) * 10.0 ** rng.uniform(-2, 2, r)
    raise ValueError(f"unknown RF-ICA attack {kind!r}; known: {', '.join(ICA_ATTACKS)}")


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
