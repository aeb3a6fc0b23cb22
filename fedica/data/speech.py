"""Real speech for the RF-ICA scenarios: eSpeak NG's voices, through the library the ``speech`` extra ships.

``pip install "fedica[speech]"`` installs ``espeakng-loader``, a wheel that carries eSpeak NG's shared library
and its voice data (the engine Debian's ``espeak-ng`` package is). Each source of ``scenario=recordings
scenario.source_kind=speech`` is one voice, in its own language, speaking a long run of numbers the run's
seed draws: speech with its pauses, bursts and heavy tails (kurtosis 12 to 19), reproducible bit for bit
from the seed, and any length, where a recorded corpus would have to be downloaded.

Why ctypes: ``espeakng-loader`` gives the library's path and nothing to call it with, and the Python
wrappers on PyPI drive the ``espeak-ng`` program, which the wheel does not ship. eSpeak NG keeps one
global synthesiser whose state outlives each synthesis, so the texts of a call are spoken by a fresh
interpreter (:func:`synthesise`).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import subprocess
import sys
import threading
from fractions import Fraction

import numpy as np
from scipy.signal import resample_poly

from fedica.seeding import generator

__all__ = ["SPEECH_VOICES", "speech_available", "speech_recordings", "synthesise"]

# One voice (and language) per source, in this order: eSpeak NG's names.
SPEECH_VOICES = ("en", "de", "fr", "es", "it", "pl", "nl", "sv", "cs", "pt")
# Numbers each voice speaks for one recording: 80 to 150 s of speech (measured, the ten voices), longer than any
# site's stretch.
SPEECH_NUMBERS = 60

# One synthesis at a time: threads that build sites side by side share one recording.
_LOCK = threading.Lock()


def speech_available() -> bool:
    """Whether the ``speech`` extra (``espeakng-loader``) is installed."""
    return importlib.util.find_spec("espeakng_loader") is not None


# The program that speaks, run as ``python -c`` in a fresh interpreter for every call of :func:`synthesise`: it
# reads ``[[voice, text], ...]`` as JSON on stdin and writes one JSON line (the sample rate and each waveform's
# length, or the error) followed by the waveforms as 16-bit samples. It imports nothing of fedica's, so that
# it starts in a blink and re-runs no user's script (as multiprocessing's spawn would, without a main guard).
_SPEAKER = r"""
import ctypes, json, sys
import espeakng_loader
library = ctypes.CDLL(espeakng_loader.get_library_path())
library.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
                                 ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
rate = library.espeak_Initialize(2, 0, espeakng_loader.get_data_path().encode(), 0)
chunks = []
def collect(wave, count, events):
    if wave and count > 0:
        chunks.append(ctypes.string_at(wave, 2 * count))
    return 0
callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)(collect)
library.espeak_SetSynthCallback(callback)
waves, error = [], None
for voice, text in json.load(sys.stdin):
    chunks.clear()
    if rate <= 0:
        error = f"eSpeak NG did not start (espeak_Initialize returned {rate})"
        break
    if library.espeak_SetVoiceByName(voice.encode()) != 0:
        error = f"eSpeak NG has no voice {voice!r}"
        break
    encoded = text.encode("utf-8")
    library.espeak_Synth(encoded, len(encoded) + 1, 0, 1, 0, 1, None, None)
    library.espeak_Synchronize()
    if not chunks:
        error = f"eSpeak NG gave no sound for voice {voice!r}"
        break
    waves.append(b"".join(chunks))
sys.stdout.buffer.write(json.dumps({"rate": rate, "lengths": [len(w) // 2 for w in waves], "error": error}).encode()
                        + b"\n" + b"".join(waves))
"""
# The longest a speaking process may take (60 numbers in ten voices take about 3 s).
_SPEAKER_TIMEOUT = 300.0


def synthesise(*texts: tuple[str, str]) -> tuple[list[np.ndarray], int]:
    """Each ``(voice, text)`` spoken by eSpeak NG, in order: ``(waveforms, sample rate)``, each float64 in [-1, 1).

    The texts are spoken in order by a fresh interpreter: eSpeak NG carries state from one synthesis
    to the next that neither ``espeak_Terminate`` nor its random seed resets (the same text spoken
    twice in one process differs by a few samples of timing, measured), so a waveform depends on its
    text and on the texts before it in the call, and on nothing else.

    Raises
    ------
    ValueError
        On a voice eSpeak NG does not have, or a text it gives no sound for.
    RuntimeError
        Without the ``speech`` extra, or when the speaking process fails.
    """
    if not speech_available():
        raise RuntimeError('speech needs the speech extra: pip install "fedica[speech]"')
    with _LOCK:
        done = subprocess.run([sys.executable, "-c", _SPEAKER], input=json.dumps([list(t) for t in texts]).encode(),
                              capture_output=True, timeout=_SPEAKER_TIMEOUT, check=False)
    header, _, body = done.stdout.partition(b"\n")
    try:
        report = json.loads(header)
    except ValueError:
        message = done.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"eSpeak NG's process failed (exit {done.returncode}): "
                           f"{message[-1] if message else 'no message'}") from None
    if report["error"] is not None:
        raise ValueError(report["error"])
    samples = np.frombuffer(body, dtype="<i2").astype(np.float64) / 32768.0
    return np.split(samples, np.cumsum(report["lengths"])[:-1]), int(report["rate"])


@functools.lru_cache(maxsize=16)
def speech_recordings(n_sources: int, sampling_rate: float, seed: int) -> tuple[np.ndarray, ...]:
    """The first ``n_sources`` voices' whole recordings, each ``SPEECH_VOICES[k]`` speaking numbers the seed draws.

    The numbers come from the stream ``recordings.speech`` with the source's index, so every site of a
    run cuts its stretch from the same recordings, and source ``k``'s recording is the same whatever
    ``n_sources`` (the voices are spoken in order, in one fresh process). Resampled from eSpeak NG's
    rate to ``sampling_rate`` (a polyphase filter, ``scipy.signal.resample_poly``). Read-only: the
    cache shares them.
    """
    if not 1 <= n_sources <= len(SPEECH_VOICES):
        raise ValueError(f"speech has {len(SPEECH_VOICES)} voices, one per source; {n_sources} sources asked")
    texts = []
    for source in range(n_sources):
        numbers = generator(seed, "recordings.speech", source).integers(1, 10_000, size=SPEECH_NUMBERS)
        texts.append((SPEECH_VOICES[source], ", ".join(map(str, numbers)) + "."))
    waveforms, rate = synthesise(*texts)
    ratio = Fraction(float(sampling_rate) / rate).limit_denominator(1000)
    recordings = []
    for waveform in waveforms:
        recording = resample_poly(waveform, ratio.numerator, ratio.denominator)
        recording.flags.writeable = False
        recordings.append(recording)
    return tuple(recordings)
