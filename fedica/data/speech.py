"""Real speech for the RF-ICA scenarios: eSpeak NG's voices, through the library the ``speech`` extra ships.

``pip install "fedica[speech]"`` installs ``espeakng-loader``, a wheel that carries eSpeak NG's shared library
and its voice data (the engine Debian's ``espeak-ng`` package is). Each source of ``scenario=recordings
scenario.source_kind=speech`` is one voice, in its own language, speaking a long run of numbers the run's
seed draws: speech with its pauses, bursts and heavy tails (kurtosis 12 to 19), reproducible bit for bit
from the seed, and any length, where a recorded corpus would have to be downloaded.

Why ctypes: ``espeakng-loader`` gives the library's path and nothing to call it with, and the Python
wrappers on PyPI drive the ``espeak-ng`` program, which the wheel does not ship. eSpeak NG keeps one
global synthesiser whose state outlives each synthesis, so every text is spoken in a fresh process.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from fractions import Fraction

import numpy as np
from scipy.signal import resample_poly

from fedica.seeding import generator

__all__ = ["SPEECH_VOICES", "speech_available", "speech_recordings", "synthesise"]

# One voice (and language) per source, in this order: eSpeak NG's names.
SPEECH_VOICES = ("en", "de", "fr", "es", "it", "pl", "nl", "sv", "cs", "pt")
# Numbers each voice speaks for one recording: 60 to 120 s of speech, longer than any site's stretch.
SPEECH_NUMBERS = 60

_AUDIO_OUTPUT_SYNCHRONOUS = 2
_POSITION_CHARACTER = 1
_CHARS_UTF8 = 1
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)
# One synthesis at a time: threads that build sites side by side share one recording.
_LOCK = threading.Lock()


def speech_available() -> bool:
    """Whether the ``speech`` extra (``espeakng-loader``) is installed."""
    return importlib.util.find_spec("espeakng_loader") is not None


@functools.lru_cache(maxsize=1)
def _library() -> tuple[ctypes.CDLL, bytes]:
    """eSpeak NG's library and the path of its voice data."""
    try:
        import espeakng_loader
    except ImportError:
        raise RuntimeError('speech needs the speech extra: pip install "fedica[speech]"') from None
    library = ctypes.CDLL(espeakng_loader.get_library_path())
    library.espeak_Initialize.restype = ctypes.c_int
    library.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int, ctypes.c_uint,
                                     ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
    return library, espeakng_loader.get_data_path().encode()


def _speak(texts: tuple[tuple[str, str], ...]) -> tuple[list[np.ndarray], int]:
    """:func:`synthesise`'s work, in the process that calls it (a fresh one): every ``(voice, text)`` in order."""
    library, data = _library()
    rate = library.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, data, 0)
    if rate <= 0:
        raise RuntimeError(f"eSpeak NG did not start (espeak_Initialize returned {rate})")
    chunks: list[np.ndarray] = []

    def collect(wave, count, _events):
        if wave and count > 0:
            chunks.append(np.ctypeslib.as_array(wave, shape=(count,)).copy())
        return 0

    callback = _CALLBACK(collect)  # referenced until the last synthesis returns
    library.espeak_SetSynthCallback(callback)
    waveforms = []
    for voice, text in texts:
        chunks.clear()
        if library.espeak_SetVoiceByName(voice.encode()) != 0:
            raise ValueError(f"eSpeak NG has no voice {voice!r}")
        encoded = text.encode("utf-8")
        library.espeak_Synth(encoded, len(encoded) + 1, 0, _POSITION_CHARACTER, 0, _CHARS_UTF8, None, None)
        library.espeak_Synchronize()
        if not chunks:
            raise ValueError(f"eSpeak NG gave no sound for voice {voice!r}")
        waveforms.append(np.concatenate(chunks).astype(np.float64) / 32768.0)
    return waveforms, rate


def synthesise(*texts: tuple[str, str]) -> tuple[list[np.ndarray], int]:
    """Each ``(voice, text)`` spoken by eSpeak NG, in order: ``(waveforms, sample rate)``, each float64 in [-1, 1).

    The texts are spoken in order in a fresh process: eSpeak NG carries state from one synthesis to
    the next that neither ``espeak_Terminate`` nor its random seed resets (the same text spoken twice
    in one process differs by a few samples of timing, measured), so a waveform depends on its text
    and on the texts before it in the call, and on nothing else.

    Raises
    ------
    ValueError
        On a voice eSpeak NG does not have, or a text it gives no sound for.
    """
    _library()  # the extra's absence is one line here, not a worker's traceback
    context = multiprocessing.get_context("spawn")
    with _LOCK, ProcessPoolExecutor(max_workers=1, mp_context=context, max_tasks_per_child=1) as pool:
        return pool.submit(_speak, tuple(texts)).result()


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
