"""Real speech in the recordings scenario (fedica.data.speech; the speech extra, which `.[test]` installs)."""

import numpy as np
import pytest

pytest.importorskip("espeakng_loader")

import fedica  # noqa: E402
from fedica.config import ConfigError, validate_config  # noqa: E402
from fedica.data import speech  # noqa: E402
from fedica.data.recordings import recordings_site  # noqa: E402
from fedica.evaluation.ica import ica_error  # noqa: E402
from fedica.rfica.local import normalize_columns  # noqa: E402
from fedica.server.app import compose_config  # noqa: E402

SPEECH = {"n_clients": 8, "n_channels": 6, "n_sources": 6, "sampling_rate": 8000.0, "min_samples": 8000,
          "max_samples": 24000, "condition_number": 20.0, "sensor_noise": 0.03, "n_noisy": 0,
          "source_kind": "speech"}


def _kurtosis(x):
    x = x - x.mean()
    return float((x**4).mean() / (x**2).mean() ** 2)


@pytest.mark.slow  # eSpeak NG speaks in a process of its own
def test_each_voice_speaks_its_own_language_reproducibly():
    (english, german), rate = speech.synthesise(("en", "one, two, three."), ("de", "one, two, three."))
    (again,), _ = speech.synthesise(("en", "one, two, three."))
    assert rate == 22050 and 0.5 < english.size / rate < 5 and np.abs(english).max() < 1
    np.testing.assert_array_equal(english, again)  # a fresh process for every call: no state carried over
    assert german.size != english.size or not np.array_equal(german, english)
    with pytest.raises(ValueError, match="no voice 'xx-nowhere'"):
        speech.synthesise(("xx-nowhere", "one"))


@pytest.mark.slow  # eSpeak NG speaks in a process of its own
def test_recordings_are_drawn_from_the_seed_shared_read_only_and_alike_for_any_source_count():
    first = speech.speech_recordings(2, 8000.0, 0)
    assert first[0].size > 8000 * 40 and not first[0].flags.writeable  # at least 40 s at 8 kHz
    assert min(_kurtosis(recording) for recording in first) > 5  # speech: pauses and bursts
    np.testing.assert_array_equal(speech.speech_recordings(3, 8000.0, 0)[1], first[1])
    other = speech.speech_recordings(1, 8000.0, 1)[0]
    assert other.size != first[0].size or not np.array_equal(other, first[0])
    with pytest.raises(ValueError, match="10 voices, one per source; 11 sources asked"):
        speech.speech_recordings(11, 8000.0, 0)


@pytest.mark.slow  # eSpeak NG speaks in a process of its own
def test_every_site_holds_its_own_stretch_of_every_voice():
    sites = [recordings_site(g, seed=3, **SPEECH) for g in range(3)]
    for site in sites:
        assert site.sources.shape[0] == 6
        np.testing.assert_allclose(site.sources.std(axis=1), 1.0, rtol=1e-9)
        assert min(_kurtosis(row) for row in site.sources) > 3
    # Different stretches: no site's first source is another's.
    assert not np.allclose(sites[0].sources[0, :8000], sites[1].sources[0, :8000])
    np.testing.assert_array_equal(recordings_site(1, seed=3, **SPEECH).observations, sites[1].observations)


@pytest.mark.slow  # eSpeak NG speaks in a process of its own
def test_rfica_separates_six_speakers_as_pooled_fastica_does():
    from sklearn.decomposition import FastICA

    from fedica.data.recordings import recordings_true_mixing

    truth = recordings_true_mixing(n_channels=6, n_sources=6, condition_number=20.0, seed=0)
    sites = [recordings_site(g, seed=0, **SPEECH).observations for g in range(8)]
    model = fedica.RFICA(random_state=0).fit([Y.T for Y in sites])
    pooled = FastICA(6, whiten="unit-variance", max_iter=1000, random_state=0).fit(np.hstack(sites).T)
    assert ica_error(model.mixing_, truth) <= 1.5 * ica_error(normalize_columns(pooled.mixing_), truth)


def test_config_rules():
    base = ["algorithm=rfica", "scenario=recordings", "scenario.source_kind=speech", "scenario.sampling_rate=8000",
            "scenario.min_samples=8000", "scenario.max_samples=24000"]
    validate_config(compose_config(base))
    with pytest.raises(ConfigError, match=r"^scenario\.n_sources=11: speech has 10 voices"):
        validate_config(compose_config([*base, "scenario.n_channels=12", "scenario.n_sources=11"]))
    with pytest.raises(ConfigError, match=r"^scenario\.source_kind='song': must be one of eeg, speech"):
        validate_config(compose_config([*base, "scenario.source_kind=song"]))


def test_without_the_extra_speech_is_one_config_line(monkeypatch):
    monkeypatch.setattr("fedica.data.scenarios.speech_available", lambda: False)
    with pytest.raises(ConfigError, match=r'^scenario\.source_kind=\'speech\': .*pip install "fedica\[speech\]"'):
        validate_config(compose_config(["algorithm=rfica", "scenario=recordings", "scenario.source_kind=speech"]))
