"""One seeding scheme: every random stream of a run comes from the run's seed through a named stream.

A run is reproducible from its config alone: each random draw, on the server or on any client,
comes from a :class:`numpy.random.SeedSequence` built from the run's ``seed``, the stream's id
and, for per-client or per-round streams, the client's partition id or the round. Streams are
independent of each other and of the order in which clients are built or asked, so a client
generated alone gets exactly the data it would get if all clients were generated together.

The table :data:`STREAMS` is the whole scheme. Three layouts exist, each kept because the
published results (docs/RESULTS.md) were produced with it:

- ``spawn``: ``SeedSequence(seed, spawn_key=(code, *indices))`` (the scenarios' data);
- ``entropy``: ``SeedSequence([seed, *indices, code])`` (the clients' own draws, the attacks and
  the participation sampling);
- ``root``: ``SeedSequence(seed)``, i.e. ``numpy.random.default_rng(seed)`` (server-side
  k-means restarts, the shared FastICA start, the comparators).

Codes are unique within a layout among the streams one run can use; RF-ICA's scenario and the
clustering scenarios reuse small codes because no run uses both (tests check both sets).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedica.validation import check_seed

__all__ = ["STREAMS", "Stream", "generator", "sequence", "sklearn_seed"]

SKLEARN_SEED_MAX = np.iinfo(np.int32).max


@dataclass(frozen=True)
class Stream:
    """A named random stream: its layout, its code and what its indices mean."""

    layout: str
    code: int | None
    indices: tuple[str, ...] = ()


STREAMS: dict[str, Stream] = {
    # RF-ICA's scenario (the paper's section 4 simulation).
    "ica.mixing": Stream("spawn", 0),
    "ica.corrupted": Stream("spawn", 1),
    "ica.sources": Stream("spawn", 2, ("partition",)),
    # RF-ICA's signals scenario (fedica.data.signals); codes clear of every other scenario's.
    "signals.mixing": Stream("spawn", 11),
    "signals.phases": Stream("spawn", 12),
    "signals.roles": Stream("spawn", 13),
    "signals.site": Stream("spawn", 14, ("partition",)),
    # RF-ICA's recordings scenario (fedica.data.recordings); codes clear of every other scenario's.
    "recordings.mixing": Stream("spawn", 15),
    "recordings.roles": Stream("spawn", 16),
    "recordings.site": Stream("spawn", 17, ("partition",)),
    # Its sources' strengths at each site (strength_spread): a stream of its own, so that the sites' other draws stay.
    "recordings.strength": Stream("spawn", 19, ("partition",)),
    # Its speech sources (source_kind: speech, fedica.data.speech): the numbers each voice speaks, by source, and the
    # stretch of the recordings each site holds, by partition.
    "recordings.speech": Stream("spawn", 20, ("source",)),
    "recordings.stretch": Stream("spawn", 21, ("partition",)),
    # Clustering scenarios.
    "blobs.centers": Stream("spawn", 1),
    "scenario.cluster_sets": Stream("spawn", 2),
    "blobs.shares": Stream("spawn", 3),
    "blobs.proportions": Stream("spawn", 4, ("partition",)),
    "blobs.points": Stream("spawn", 5, ("partition",)),
    "waveform.points": Stream("spawn", 6),
    "classes.split": Stream("spawn", 7),
    "classes.assign": Stream("spawn", 8),
    "files.split": Stream("spawn", 9),
    # scikit-learn's bundled data sets (fedica.data.real); codes clear of the signals scenario's.
    "real.sites": Stream("spawn", 15),
    "real.split": Stream("spawn", 16),
    "real.assign": Stream("spawn", 17),
    "real.components": Stream("spawn", 18, ("partition",)),
    # Each client's own draws.
    "client.fastica": Stream("entropy", 1, ("partition",)),
    # The second start of a site whose local ICA did not converge (docs/ALGORITHMS.md section 1.2).
    "client.ica_retry": Stream("entropy", 6, ("partition",)),
    "client.kmeanspp": Stream("entropy", 2, ("partition",)),
    "client.silhouette_sample": Stream("entropy", 3, ("partition",)),
    # The FFCM and AFCL comparators' clients: their k-means++ starts.
    "ffcm.client_init": Stream("entropy", 4, ("partition",)),
    "afcl.client_init": Stream("entropy", 5, ("partition",)),
    # Hostile clients (robustness runs): who is hostile, and each one's junk per protocol stage.
    "attack.hostile": Stream("entropy", 0xA77AC),
    "attack.reply": Stream("entropy", 0xA77AC, ("partition", "stage")),
    # A private run's noise (fedica.privacy): each site's per protocol stage (seeded by the run, or in a deployment
    # by the site's own secret in place of the seed: Site.noise_secret), and its seeds' directions.
    "privacy.noise": Stream("entropy", 0xD1FF, ("partition", "stage")),
    "privacy.seeds": Stream("entropy", 0xD1F5, ("partition",)),
    # Which clients a FedGEM round asks when participation < 1.
    "server.participation": Stream("entropy", 0x9A27, ("round",)),
    # Server-side restarts and starts that depend on the seed alone.
    "server.kmeans": Stream("root", None),
    "client.shared_init": Stream("root", None),
    "baselines": Stream("root", None),
}


def sequence(seed: int, name: str, *indices: int) -> np.random.SeedSequence:
    """The SeedSequence of stream ``name`` of the run seeded with ``seed``.

    Parameters
    ----------
    seed : int
        The run's seed (non-negative).
    name : str
        A key of :data:`STREAMS`.
    *indices : int
        The stream's indices, as many as its ``Stream.indices`` names (partition id, round, ...).

    Returns
    -------
    numpy.random.SeedSequence
    """
    try:
        stream = STREAMS[name]
    except KeyError:
        raise ValueError(f"unknown random stream {name!r}; known streams: {sorted(STREAMS)}") from None
    if len(indices) != len(stream.indices):
        raise ValueError(f"stream {name!r} takes {len(stream.indices)} indices {stream.indices}, got {len(indices)}")
    seed = check_seed(seed)
    indices = tuple(int(i) for i in indices)
    if stream.layout == "spawn":
        return np.random.SeedSequence(seed, spawn_key=(stream.code, *indices))
    if stream.layout == "entropy":
        return np.random.SeedSequence([seed, *indices, stream.code])
    return np.random.SeedSequence(seed)


def generator(seed: int, name: str, *indices: int) -> np.random.Generator:
    """A fresh generator of stream ``name`` (see :func:`sequence`)."""
    return np.random.default_rng(sequence(seed, name, *indices))


def sklearn_seed(rng: np.random.Generator) -> int:
    """An int seed for a scikit-learn estimator, drawn from ``rng`` (scikit-learn takes 32-bit seeds)."""
    return int(rng.integers(SKLEARN_SEED_MAX))
