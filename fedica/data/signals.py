"""Blind source separation of waveforms, in the spirit of scikit-learn's FastICA example: RF-ICA's ``signals``.

``r`` sources are periodic waveforms of time, cycling through four shapes: a sine, a square wave, a
sawtooth and a train of narrow spikes (sub-Gaussian, sub-Gaussian, sub-Gaussian and super-Gaussian, so
both signs of kurtosis occur). Every source is scaled to zero mean and unit variance over a period; the
``k``-th shape's angular frequency is its base one times ``1 + 0.618 (k // 4)`` (incommensurate, so that the
repeats of a shape for ``r > 4`` are different signals) and its phase is random. All sites share the
sources' definitions and one random mixing ``A*`` (unit-norm columns, orthogonal or not); each site
observes ``Y = A* S(t) (+ noise)`` at its own sample of time points, uniform on [0, DURATION], sorted.

Some sites are poor: ``n_noisy`` of them add Gaussian noise of standard deviation ``noise_level`` to every
observed channel, ``n_short`` others hold only ``short_samples`` time points instead of ``n_samples``.

Random streams (:mod:`fedica.seeding`): ``signals.mixing`` (A*), ``signals.phases`` (the sources' phases),
``signals.roles`` (which sites are noisy or short), ``signals.site`` with the partition id (the site's time
points, then its noise), so any site can be built alone, in any order.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.signal import sawtooth

from fedica.rfica.local import make_mixing_matrix
from fedica.seeding import generator
from fedica.validation import check_index, check_int

SHAPES = ("sine", "square", "sawtooth", "spikes")
# Angular frequencies of the four shapes (the first three are those of scikit-learn's example).
_BASE_FREQUENCIES = np.array([2.0, 3.0, 2.0 * np.pi, 3.7])
# Time span of every site's observations: five times scikit-learn's [0, 8], so that every source runs through
# many periods and the sources are nearly uncorrelated over the span (largest |correlation| ~0.02 instead of
# ~0.1 on [0, 8], which would put a floor of ~0.1 under any estimate's error against A*).
DURATION = 40.0
# Width of a spike, in radians of its period: narrow, so the spike train is strongly super-Gaussian.
_SPIKE_WIDTH = 0.15
# Grid of one period on which each shape is standardised (deterministic, fine enough for 1e-6).
_PERIOD_GRID = np.linspace(0.0, 2.0 * np.pi, 1 << 16, endpoint=False)


class SignalsSite(NamedTuple):
    """One site of the ``signals`` scenario.

    Attributes
    ----------
    times : ndarray of shape (n_k,)
        Sorted time points in [0, DURATION].
    sources : ndarray of shape (r, n_k)
        The true sources at those times.
    observations : ndarray of shape (r, n_k)
        ``A* @ sources``, plus the site's noise if it is noisy.
    """

    times: np.ndarray
    sources: np.ndarray
    observations: np.ndarray


def _shape(kind: int, phase: np.ndarray) -> np.ndarray:
    """Raw waveform ``kind`` (index into SHAPES) at phases ``phase`` (radians), period 2 pi."""
    if kind == 0:
        return np.sin(phase)
    if kind == 1:
        return np.sign(np.sin(phase))
    if kind == 2:
        return sawtooth(phase)
    offset = np.mod(phase, 2.0 * np.pi) - np.pi
    return np.exp(-0.5 * (offset / _SPIKE_WIDTH) ** 2)


_SHAPE_MOMENTS = [(float(np.mean(v)), float(np.std(v))) for v in (_shape(k, _PERIOD_GRID) for k in range(4))]


def signal_sources(times, *, r: int, seed: int) -> np.ndarray:
    """The scenario's ``r`` true sources at ``times`` (see the module docstring).

    Parameters
    ----------
    times : array-like of shape (n,)
    r : int
        Number of sources, ``>= 2``.
    seed : int
        Scenario seed (the phases come from stream ``signals.phases``).

    Returns
    -------
    sources : ndarray of shape (r, n)
        Zero mean and unit variance over a period, each.
    """
    r = check_int(r, "r", minimum=2)
    times = np.asarray(times, dtype=np.float64)
    phases = generator(seed, "signals.phases").uniform(0.0, 2.0 * np.pi, r)
    sources = np.empty((r, times.size))
    for k in range(r):
        kind = k % len(SHAPES)
        frequency = _BASE_FREQUENCIES[kind] * (1.0 + 0.618 * (k // len(SHAPES)))
        mean, std = _SHAPE_MOMENTS[kind]
        sources[k] = (_shape(kind, frequency * times + phases[k]) - mean) / std
    return sources


def signals_true_mixing(*, r: int, orthogonal: bool, seed: int) -> np.ndarray:
    """The ``A*`` every site shares, shape (r, r), unit-norm columns (stream ``signals.mixing``)."""
    return make_mixing_matrix(r, orthogonal=orthogonal, random_state=generator(seed, "signals.mixing"))


def signals_roles(*, n_clients: int, n_noisy: int, n_short: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Which sites are noisy and which are short (disjoint sets, drawn from stream ``signals.roles``).

    Returns
    -------
    noisy, short : ndarray of shape (n_clients,), bool
    """
    n_clients = check_int(n_clients, "n_clients", minimum=1)
    n_noisy = check_int(n_noisy, "n_noisy", minimum=0)
    n_short = check_int(n_short, "n_short", minimum=0)
    if n_noisy + n_short > n_clients:
        raise ValueError(f"n_noisy + n_short must be <= n_clients, got {n_noisy} + {n_short} > {n_clients}")
    order = generator(seed, "signals.roles").permutation(n_clients)
    noisy = np.zeros(n_clients, dtype=bool)
    short = np.zeros(n_clients, dtype=bool)
    noisy[order[:n_noisy]] = True
    short[order[n_noisy:n_noisy + n_short]] = True
    return noisy, short


def signals_site(partition_id, *, n_clients=10, r=4, n_samples=2000, n_noisy=2, noise_level=1.0, n_short=2,
                 short_samples=40, orthogonal=False, seed=0) -> SignalsSite:
    """One site's time points, true sources and observations.

    Parameters
    ----------
    partition_id : int
        Site index in [0, n_clients).
    n_clients : int
    r : int
        Number of sources and of observed channels, ``>= 2``.
    n_samples : int
        Time points of a site that is not short, ``> r``.
    n_noisy : int
        Number of noisy sites.
    noise_level : float
        Standard deviation of a noisy site's noise, ``>= 0`` (the sources have unit variance).
    n_short : int
        Number of short sites (disjoint from the noisy ones).
    short_samples : int
        Time points of a short site, ``> r``.
    orthogonal : bool
        Whether ``A*`` is orthogonal (see :func:`fedica.rfica.local.make_mixing_matrix`).
    seed : int

    Returns
    -------
    SignalsSite
    """
    g = check_index(partition_id, "partition_id", check_int(n_clients, "n_clients", minimum=1))
    r = check_int(r, "r", minimum=2)
    n_samples = check_int(n_samples, "n_samples", minimum=r + 1)
    short_samples = check_int(short_samples, "short_samples", minimum=r + 1)
    if not np.isfinite(noise_level) or noise_level < 0:
        raise ValueError(f"noise_level must be a finite number >= 0, got {noise_level!r}")
    noisy, short = signals_roles(n_clients=n_clients, n_noisy=n_noisy, n_short=n_short, seed=seed)
    rng = generator(seed, "signals.site", g)
    times = np.sort(rng.uniform(0.0, DURATION, short_samples if short[g] else n_samples))
    sources = signal_sources(times, r=r, seed=seed)
    observations = signals_true_mixing(r=r, orthogonal=orthogonal, seed=seed) @ sources
    if noisy[g]:
        observations = observations + noise_level * rng.standard_normal(observations.shape)
    return SignalsSite(times, sources, observations)


def signals_client_data(partition_id, **params) -> np.ndarray:
    """One site's observations ``Y``, shape (r, n_k): :func:`signals_site`'s ``observations``."""
    return signals_site(partition_id, **params).observations
