"""Multi-site recordings that look like EEG: RF-ICA's ``recordings`` scenario.

``n_sources`` independent sources, of the kinds a scalp recording holds, are mixed by one ``A*`` of shape
(n_channels, n_sources) shared by all sites; every site records its own stretch of time:

- **alpha**: an 8-12 Hz sinusoid (frequency and phase drawn per site) whose amplitude is the exponential of a
  slow (< 0.5 Hz) Gaussian process, so that it waxes and wanes in bursts as alpha rhythms do;
- **blink**: sparse (about one every two seconds, at least two per site), large, one-sided slow bumps of
  about 0.4 s (a gamma-shaped kernel), of random heights;
- **muscle**: Student-t (5 degrees of freedom) white noise band-passed to 20-100 Hz (below 0.4 of the
  sampling rate), switched on for the 20% of the time where a slow (< 1 Hz) Gaussian gate is highest;
- **line**: a ``line_frequency`` (50 or 60 Hz) sinusoid of random phase (only once: two mains sinusoids of
  one frequency would span a plane no ICA can split);
- **heavy**: white heavy-tailed noise, Laplace and Student-t (5 degrees of freedom) in turn.

The first five sources are one of each, in that order; the further ones cycle alpha, blink, muscle, heavy.
Filters act on the discrete Fourier transform (circular, so that a short site has no filter transient).
Each source is standardised on its site (zero mean, unit variance), so ``A*``'s unit-norm columns carry
the scale. ``A*`` has the condition number ``condition_number`` exactly (to ``1e-9`` relative):
``normalise_columns(U diag(s) V^T)`` with ``U`` (n_channels x n_sources) and ``V`` random orthonormal and
``s`` log-spaced from 1 down to the value (found by bisection) at which the column-normalised matrix has
the asked condition number (:func:`mixing_with_condition`).

Every site adds sensor noise, white Gaussian of ``sensor_noise`` times each channel's standard deviation
(so that ``n_channels > n_sources`` observations have rank ``n_sources`` plus noise, as real ones do).
Some sites are poor on purpose, each in one way: ``n_noisy`` add white Gaussian noise of ``noise_level``
times the channel's standard deviation to every channel; with ``dead_channel`` one other site has a flat
(all-zero) channel; with ``saturated_channel`` one other site has a channel clipped at
``SATURATION_LEVEL`` times its standard deviation (an amplifier at its rail).

With ``strength_spread`` above 1 each source's strength differs from site to site (log-uniform in
``[1 / strength_spread, strength_spread]``), as sources do between subjects and sessions.

With ``source_kind="speech"`` (the ``speech`` extra) the sources are real speech instead: source ``k`` is
eSpeak NG's voice ``SPEECH_VOICES[k]`` (English, German, French, Spanish, Italian, Polish, ...) speaking a
long run of numbers (:func:`fedica.data.speech.speech_recordings`), and every site holds its own stretch of
each voice's recording, at a start drawn per site and source (stream ``recordings.stretch``), as issue 45's
trial had it: eight sites, each a different stretch of the same recordings.

Random streams (:mod:`fedica.seeding`): ``recordings.mixing`` (A*), ``recordings.roles`` (which sites are
poor), ``recordings.site`` with the partition id (the site's length, sources, noise and faulty channel),
``recordings.strength`` with the partition id (the sources' strengths there), ``recordings.speech`` by
source and ``recordings.stretch`` by partition (speech: each voice's numbers, each site's stretch),
so any site can be built alone, in any order, bit-identically for a seed.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.signal import fftconvolve

from fedica.data.speech import SPEECH_VOICES, speech_recordings
from fedica.rfica.local import normalize_columns
from fedica.seeding import generator
from fedica.validation import check_index, check_int

KINDS = ("alpha", "blink", "muscle", "line", "heavy")
# The kinds of the sources after the first five (line noise appears once).
_REPEATED_KINDS = ("alpha", "blink", "muscle", "heavy")
LINE_FREQUENCIES = (50, 60)
# The sources: EEG-like (the module docstring's kinds) or real speech (fedica.data.speech).
SOURCE_KINDS = ("eeg", "speech")
# A saturated channel is clipped at this many of its standard deviations (about a third of its samples).
SATURATION_LEVEL = 1.0
_ALPHA_BAND = (8.0, 12.0)
_BLINK_RATE = 0.5  # blinks per second
_BLINK_SCALE = 0.08  # seconds: the gamma kernel t^2 exp(-t / scale) peaks at 0.16 s, lasts about 0.5 s
_MUSCLE_BAND = (20.0, 100.0)
_MUSCLE_DUTY = 0.2  # share of the time a muscle source is active
# The slow processes that modulate alpha and gate muscle activity: low-pass cut-offs in Hz.
_ALPHA_ENVELOPE_CUTOFF = 0.5
_MUSCLE_GATE_CUTOFF = 1.0


class RecordingsSite(NamedTuple):
    """One site of the ``recordings`` scenario.

    Attributes
    ----------
    sources : ndarray of shape (n_sources, n_k)
        The true sources, each standardised on the site.
    observations : ndarray of shape (n_channels, n_k)
        ``A* @ sources`` plus sensor noise, plus the site's fault if it is poor.
    """

    sources: np.ndarray
    observations: np.ndarray


def source_kinds(n_sources: int) -> tuple[str, ...]:
    """The kind of every source (see the module docstring), a tuple of ``n_sources`` names from KINDS."""
    n_sources = check_int(n_sources, "n_sources", minimum=1)
    return tuple(KINDS[k] if k < len(KINDS) else _REPEATED_KINDS[(k - len(KINDS)) % len(_REPEATED_KINDS)]
                 for k in range(n_sources))


def mixing_with_condition(n_channels: int, n_sources: int, condition_number: float, rng: np.random.Generator
                          ) -> np.ndarray:
    """A random mixing matrix with unit-norm columns and a prescribed condition number.

    ``A(t) = normalise_columns(U diag(exp(-t * linspace(0, 1, n_sources))) V^T)`` with ``U`` and ``V``
    random orthonormal (QR of Gaussian matrices, signs fixed by the diagonal of ``R`` so that they are Haar).
    ``cond(A(0)) = 1`` and ``cond(A(t))`` grows without bound (the columns turn towards the top left singular
    vector), so bisection on ``t`` reaches any ``condition_number >= 1``; the column normalisation changes the
    spectrum, which is why ``t`` is searched for rather than set to ``log(condition_number)``.

    Parameters
    ----------
    n_channels, n_sources : int
        ``n_channels >= n_sources >= 1``.
    condition_number : float
        ``>= 1``: the ratio of ``A``'s largest and smallest singular values.
    rng : numpy.random.Generator

    Returns
    -------
    A : ndarray of shape (n_channels, n_sources)
        Unit-norm columns; ``cond(A)`` equals ``condition_number`` to ``1e-9`` relative.
    """
    if not (np.isfinite(condition_number) and condition_number >= 1):
        raise ValueError(f"condition_number must be a finite number >= 1, got {condition_number!r}")
    left = _haar_orthonormal(rng, n_channels, n_sources)
    right = _haar_orthonormal(rng, n_sources, n_sources)
    steps = np.linspace(0.0, 1.0, n_sources)

    def matrix(t: float) -> np.ndarray:
        return normalize_columns((left * np.exp(-t * steps)) @ right.T)

    def log_condition(t: float) -> float:
        return float(np.log(np.linalg.cond(matrix(t))))

    target = float(np.log(condition_number))
    if target == 0.0:
        return matrix(0.0)
    low, high = 0.0, max(target, 1.0)
    while log_condition(high) < target:
        low, high = high, 2.0 * high
        if high > 1e4:  # exp(-1e4) underflows: the top singular direction alone is left
            raise ValueError(f"cannot build a {n_channels} x {n_sources} mixing of condition {condition_number}")
    while high - low > 1e-12 * high:
        middle = 0.5 * (low + high)
        value = log_condition(middle)
        if abs(value - target) < 1e-10:
            return matrix(middle)
        low, high = (middle, high) if value < target else (low, middle)
    return matrix(0.5 * (low + high))


def _haar_orthonormal(rng: np.random.Generator, rows: int, columns: int) -> np.ndarray:
    """``rows x columns`` orthonormal columns, uniformly distributed (QR of a Gaussian matrix, signs of R's
    diagonal moved into Q)."""
    q, r = np.linalg.qr(rng.standard_normal((rows, columns)))
    return q * np.sign(np.diag(r))


def recordings_true_mixing(*, n_channels: int, n_sources: int, condition_number: float, seed: int) -> np.ndarray:
    """The ``A*`` every site shares, shape (n_channels, n_sources), unit-norm columns (stream
    ``recordings.mixing``)."""
    n_sources = check_int(n_sources, "n_sources", minimum=2)
    n_channels = check_int(n_channels, "n_channels", minimum=n_sources)
    return mixing_with_condition(n_channels, n_sources, condition_number, generator(seed, "recordings.mixing"))


def recordings_roles(*, n_clients: int, n_noisy: int, dead_channel: bool, saturated_channel: bool, seed: int
                     ) -> dict[str, np.ndarray]:
    """Which sites are poor, and how (disjoint sets, drawn from stream ``recordings.roles``).

    Returns
    -------
    roles : dict of str to ndarray of shape (n_clients,), bool
        ``noisy``, ``dead_channel`` (one site if asked, else none), ``saturated_channel`` (likewise).
    """
    n_clients = check_int(n_clients, "n_clients", minimum=1)
    n_noisy = check_int(n_noisy, "n_noisy", minimum=0)
    counts = {"noisy": n_noisy, "dead_channel": int(bool(dead_channel)),
              "saturated_channel": int(bool(saturated_channel))}
    if sum(counts.values()) > n_clients:
        raise ValueError(f"n_noisy + dead_channel + saturated_channel must be <= n_clients ({n_clients}), "
                         f"got {sum(counts.values())}: a site is poor in one way only")
    order = generator(seed, "recordings.roles").permutation(n_clients)
    roles, start = {}, 0
    for kind, count in counts.items():
        roles[kind] = np.zeros(n_clients, dtype=bool)
        roles[kind][order[start:start + count]] = True
        start += count
    return roles


def _band(x: np.ndarray, low: float, high: float, sampling_rate: float) -> np.ndarray:
    """``x`` filtered to the band ``[low, high]`` Hz through its discrete Fourier transform.

    Circular filtering leaves no transient at the ends, which a recursive filter of a slow cut-off does
    (a 0.5 Hz Butterworth at 250 Hz rings for seconds, a whole short site).
    """
    frequencies = np.fft.rfftfreq(x.size, 1.0 / sampling_rate)
    return np.fft.irfft(np.fft.rfft(x) * ((frequencies >= low) & (frequencies <= high)), n=x.size)


def _smooth(rng: np.random.Generator, n: int, cutoff: float, sampling_rate: float) -> np.ndarray:
    """A standardised slow Gaussian process: white noise low-passed to ``cutoff`` Hz (the mean kept out).

    The lowest non-zero frequency is always kept, so that even a site shorter than ``1 / cutoff`` seconds
    has a non-constant process.
    """
    cutoff = max(cutoff, sampling_rate / n)
    return _standardise(_band(rng.standard_normal(n), sampling_rate / (2 * n), cutoff, sampling_rate))


def _standardise(x: np.ndarray) -> np.ndarray:
    return (x - x.mean()) / x.std()


def _source(kind: str, rng: np.random.Generator, n: int, times: np.ndarray, sampling_rate: float,
            line_frequency: float, heavy_index: int) -> np.ndarray:
    """One raw source of ``kind`` at ``times`` (seconds), shape (n,); not yet standardised."""
    phase = rng.uniform(0.0, 2.0 * np.pi)
    if kind == "alpha":
        frequency = rng.uniform(*_ALPHA_BAND)
        envelope = np.exp(0.6 * _smooth(rng, n, _ALPHA_ENVELOPE_CUTOFF, sampling_rate))
        return envelope * np.sin(2.0 * np.pi * frequency * times + phase)
    if kind == "blink":
        # At least two blinks, so that even the shortest site has a blink source to estimate.
        n_blinks = max(2, int(rng.poisson(_BLINK_RATE * n / sampling_rate)))
        impulses = np.zeros(n)
        np.add.at(impulses, rng.integers(0, n, n_blinks), rng.uniform(0.5, 1.5, n_blinks))
        lags = np.arange(int(round(6 * _BLINK_SCALE * sampling_rate))) / sampling_rate
        kernel = lags**2 * np.exp(-lags / _BLINK_SCALE)
        return fftconvolve(impulses, kernel / kernel.max())[:n]
    if kind == "muscle":
        high = min(_MUSCLE_BAND[1], 0.4 * sampling_rate)
        burst = _band(rng.standard_t(5, n), _MUSCLE_BAND[0], high, sampling_rate)
        gate = _smooth(rng, n, _MUSCLE_GATE_CUTOFF, sampling_rate)
        # Active where the gate is in its top _MUSCLE_DUTY, rising from zero (no step at the burst's edges).
        return burst * np.maximum(gate - np.quantile(gate, 1.0 - _MUSCLE_DUTY), 0.0)
    if kind == "line":
        return np.sin(2.0 * np.pi * line_frequency * times + phase)
    return rng.laplace(size=n) if heavy_index % 2 == 0 else rng.standard_t(5, n)


def recordings_sources(rng: np.random.Generator, n: int, *, n_sources: int, sampling_rate: float,
                       line_frequency: float) -> np.ndarray:
    """``n_sources`` standardised sources of the kinds :func:`source_kinds` names, ``n`` samples each.

    Parameters
    ----------
    rng : numpy.random.Generator
        The site's stream.
    n : int
        Samples.
    n_sources : int
    sampling_rate : float
        Hz.
    line_frequency : float
        Hz.

    Returns
    -------
    sources : ndarray of shape (n_sources, n)
        Each row has mean 0 and standard deviation 1.
    """
    times = np.arange(n) / sampling_rate
    kinds = source_kinds(n_sources)
    heavy_before = np.cumsum([kind == "heavy" for kind in kinds]) - 1
    return np.stack([_standardise(_source(kind, rng, n, times, sampling_rate, line_frequency, int(heavy_before[k])))
                     for k, kind in enumerate(kinds)])


def speech_stretches(partition_id: int, n: int, *, n_sources: int, sampling_rate: float, seed: int) -> np.ndarray:
    """Site ``partition_id``'s ``n`` samples of each voice's recording (:func:`fedica.data.speech.speech_recordings`),
    from a start drawn per source (stream ``recordings.stretch``), standardised as every source is.

    Raises
    ------
    ValueError
        When a recording is shorter than ``n`` samples, or there are more sources than voices.
    """
    starts = generator(seed, "recordings.stretch", partition_id)
    stretches = []
    for source, recording in enumerate(speech_recordings(n_sources, sampling_rate, seed)):
        if recording.size < n:
            raise ValueError(f"a site of {n} samples is longer than voice {SPEECH_VOICES[source]!r}'s recording "
                             f"({recording.size} samples at {sampling_rate:g} Hz)")
        start = int(starts.integers(0, recording.size - n + 1))
        stretches.append(_standardise(recording[start:start + n]))
    return np.stack(stretches)


def recordings_site(partition_id, *, n_clients=6, n_channels=4, n_sources=4, sampling_rate=250.0, min_samples=1000,
                    max_samples=5000, condition_number=10.0, sensor_noise=0.02, n_noisy=1, noise_level=3.0,
                    dead_channel=False, saturated_channel=False, line_frequency=50, strength_spread=1.0,
                    source_kind="eeg", seed=0) -> RecordingsSite:
    """One site's true sources and observations.

    Parameters
    ----------
    partition_id : int
        Site index in [0, n_clients).
    n_clients : int
    n_channels : int
        Observed channels, ``>= n_sources``.
    n_sources : int
        ``>= 2``.
    sampling_rate : float
        Hz, above twice ``line_frequency``.
    min_samples, max_samples : int
        The site's length is drawn uniformly from ``[min_samples, max_samples]``; ``min_samples > n_channels``.
    condition_number : float
        Of ``A*``, ``>= 1``.
    sensor_noise : float
        Every site's white noise, in standard deviations of each channel, ``>= 0``.
    n_noisy : int
        Sites with extra noise of ``noise_level`` standard deviations of each channel.
    noise_level : float
        ``>= 0``.
    dead_channel, saturated_channel : bool
        Whether one (other) site has a flat channel, and one a clipped channel.
    line_frequency : {50, 60}
        Hz.
    strength_spread : float
        ``>= 1``: each source's strength at each site is ``strength_spread ** u``, ``u`` uniform in
        ``[-1, 1]`` (stream ``recordings.strength``): a source loud at some sites and faint at others,
        as subjects and sessions differ. 1: every source of unit variance at every site.
    source_kind : {"eeg", "speech"}, default="eeg"
        The EEG-like sources of the module docstring, or real speech, one voice per source (at most
        ``len(SPEECH_VOICES)``; the ``speech`` extra).
    seed : int

    Returns
    -------
    RecordingsSite
        ``sources`` at their strengths at the site.
    """
    g = check_index(partition_id, "partition_id", check_int(n_clients, "n_clients", minimum=1))
    mixing = recordings_true_mixing(n_channels=n_channels, n_sources=n_sources, condition_number=condition_number,
                                    seed=seed)  # checks the channel and source counts first
    min_samples = check_int(min_samples, "min_samples", minimum=n_channels + 1)
    max_samples = check_int(max_samples, "max_samples", minimum=min_samples)
    if line_frequency not in LINE_FREQUENCIES:
        raise ValueError(f"line_frequency must be one of {LINE_FREQUENCIES}, got {line_frequency!r}")
    if not (np.isfinite(sampling_rate) and sampling_rate > 2 * line_frequency):
        raise ValueError(f"sampling_rate must be above twice line_frequency ({2 * line_frequency} Hz), "
                         f"got {sampling_rate!r}")
    for name, value in (("sensor_noise", sensor_noise), ("noise_level", noise_level)):
        if not (np.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    if not (np.isfinite(strength_spread) and strength_spread >= 1):
        raise ValueError(f"strength_spread must be a finite number >= 1, got {strength_spread!r}")
    roles = recordings_roles(n_clients=n_clients, n_noisy=n_noisy, dead_channel=dead_channel,
                             saturated_channel=saturated_channel, seed=seed)
    if source_kind not in SOURCE_KINDS:
        raise ValueError(f"source_kind must be one of {SOURCE_KINDS}, got {source_kind!r}")
    rng = generator(seed, "recordings.site", g)
    n = int(rng.integers(min_samples, max_samples + 1))
    if source_kind == "speech":
        sources = speech_stretches(g, n, n_sources=n_sources, sampling_rate=float(sampling_rate), seed=seed)
    else:
        sources = recordings_sources(rng, n, n_sources=n_sources, sampling_rate=float(sampling_rate),
                                     line_frequency=float(line_frequency))
    if strength_spread > 1:  # a stream of its own: the sites of a spread of 1 are drawn as they always were
        strengths = strength_spread ** generator(seed, "recordings.strength", g).uniform(-1.0, 1.0, size=n_sources)
        sources = sources * strengths[:, None]
    clean = mixing @ sources
    channel_sd = clean.std(axis=1, keepdims=True)
    observations = clean + sensor_noise * channel_sd * rng.standard_normal(clean.shape)
    if roles["noisy"][g]:
        observations += noise_level * channel_sd * rng.standard_normal(clean.shape)
    if roles["dead_channel"][g]:
        observations[rng.integers(n_channels)] = 0.0
    if roles["saturated_channel"][g]:
        channel = rng.integers(n_channels)
        rail = SATURATION_LEVEL * observations[channel].std()
        np.clip(observations[channel], -rail, rail, out=observations[channel])
    return RecordingsSite(sources, observations)


def recordings_client_data(partition_id, **params) -> np.ndarray:
    """One site's observations ``Y``, shape (n_channels, n_k): :func:`recordings_site`'s ``observations``."""
    return recordings_site(partition_id, **params).observations
