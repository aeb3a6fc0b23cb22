"""``RFICA.to_mne``: the federation's estimate as a fitted MNE ICA, used on a real ``Raw`` (MNE is the ``eeg`` extra)."""

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

import fedica  # noqa: E402

mne = pytest.importorskip("mne")

CHANNELS = ["Fp1", "Fp2", "F3", "F4", "C3", "C4", "P3", "P4", "O1", "O2"]


def _recording(seed=0, n_sources=4, seconds=60.0, sfreq=200.0):
    """A ten-channel EEG ``Raw`` (volts, 10-20 montage): four non-Gaussian sources, a little sensor noise."""
    rng = np.random.default_rng(seed)
    n = int(seconds * sfreq)
    t = np.arange(n) / sfreq
    sources = np.stack([np.sign(np.sin(2 * np.pi * 1.3 * t)), np.sin(2 * np.pi * 10 * t) ** 3,
                        rng.laplace(size=n), ((t * 0.7) % 1.0) - 0.5][:n_sources])
    sources *= np.array([3.0, 2.0, 1.0, 0.5])[:n_sources, None] / sources.std(axis=1, keepdims=True)
    mixing = rng.standard_normal((len(CHANNELS), n_sources))
    data = 1e-5 * (mixing @ sources + 0.01 * rng.standard_normal((len(CHANNELS), n)))
    info = mne.create_info(CHANNELS, sfreq, ch_types="eeg")
    raw = mne.io.RawArray(data, info, verbose="error")
    raw.set_montage("standard_1020", verbose="error")
    return raw


def _sites(raw, n_sites=4):
    """The recording's stretches, one per site, as DataFrames named by channel (samples x channels)."""
    data = raw.get_data().T
    return [pd.DataFrame(part, columns=raw.ch_names) for part in np.array_split(data, n_sites)]


@pytest.fixture(scope="module")
def fitted():
    raw = _recording()
    model = fedica.RFICA(n_components=4, random_state=0).fit(_sites(raw))
    return raw, model, model.to_mne(raw.info)


def test_mne_s_sources_are_the_estimators(fitted):
    raw, model, ica = fitted
    assert ica.n_components_ == 4 and ica.current_fit == "raw" and ica.ch_names == raw.ch_names
    sources = ica.get_sources(raw).get_data()
    expected = model.transform(pd.DataFrame(raw.get_data().T, columns=raw.ch_names)).T
    np.testing.assert_allclose(sources, expected, rtol=1e-9, atol=1e-9 * np.abs(expected).max())


def test_apply_removes_the_excluded_component_and_keeps_the_rest(fitted):
    raw, model, ica = fitted
    data = raw.get_data()
    np.testing.assert_allclose(ica.apply(raw.copy(), exclude=[]).get_data(), data, atol=1e-12 * np.abs(data).max())
    cleaned = ica.apply(raw.copy(), exclude=[0]).get_data()
    component = np.outer(model.mixing_[:, 0], model.transform(pd.DataFrame(data.T, columns=raw.ch_names))[:, 0])
    # What the excluded component explained is gone; the residual subspace (sensor noise) stays.
    np.testing.assert_allclose(cleaned, data - component, atol=1e-9 * np.abs(data).max())


def test_mne_s_plots_and_its_file_work_on_the_federations_model(fitted, tmp_path):
    raw, model, ica = fitted
    figures = ica.plot_components(show=False)
    assert figures is not None
    assert len(ica.plot_properties(raw, picks=[0], show=False)) == 1
    ica.save(tmp_path / "federated-ica.fif", verbose="error")
    again = mne.preprocessing.read_ica(tmp_path / "federated-ica.fif", verbose="error")
    np.testing.assert_allclose(again.get_sources(raw).get_data(), ica.get_sources(raw).get_data(), rtol=1e-12,
                               atol=1e-15)
    # The components come in the order of the variance they explain, by MNE's count (over the channels at each
    # instant, EEGLAB's) as by the estimator's (over time, each channel's).
    ratios = [ica.get_explained_variance_ratio(raw, components=[k])["eeg"] for k in range(4)]
    assert ratios == sorted(ratios, reverse=True)
    assert np.all(np.diff(model.explained_variance_ratio_) < 0)


def test_info_is_picked_by_name_and_a_missing_channel_is_one_line(fitted):
    raw, model, _ = fitted
    reordered = raw.copy().reorder_channels(CHANNELS[::-1])
    assert model.to_mne(reordered.info).ch_names == CHANNELS
    with pytest.raises(ValueError, match="^info lacks the estimate's channel\\(s\\) O2$"):
        model.to_mne(raw.copy().drop_channels(["O2"]).info)
    unnamed = fedica.RFICA(n_components=4, random_state=0).fit([site.to_numpy() for site in _sites(raw)])
    with pytest.raises(ValueError, match="^info has 9 channels, the estimate 10"):
        unnamed.to_mne(raw.copy().drop_channels(["O2"]).info)
    with pytest.raises(TypeError, match="info must be an mne.Info"):
        model.to_mne({"ch_names": CHANNELS})
