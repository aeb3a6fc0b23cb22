"""scenario=files for RF-ICA on EEG recordings read through MNE: real files written by MNE and read back.

Known sources are mixed by a known matrix into a few sites' EEG channels (in volts, as MNE holds EEG),
written as FIF, EDF, BrainVision and EEGLAB files, and read back by fedica's reader, by ``fedica.RFICA`` and
by a whole ``fedica-run``; the mixing recovered is scored against the truth. Without MNE (CI installs it with
the ``test`` extra) every test that writes files is skipped.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fedica import RFICA
from fedica.config import ConfigError, validate_config
from fedica.data.files import DataFileError, load_ica_file, read_recording, site_columns
from fedica.data.scenarios import ica_channel_names, ica_scenario_data
from fedica.evaluation.ica import ica_error

mne = pytest.importorskip("mne")

CHANNELS = ["Fp1", "Fz", "Cz", "Pz"]
SFREQ = 250.0
# The writers each format needs beside MNE (EDF: edfio, BrainVision: pybv, EEGLAB: eeglabio).
WRITERS = {"fif": None, "edf": "edfio", "vhdr": "pybv", "set": "eeglabio"}


def true_mixing() -> np.ndarray:
    rng = np.random.default_rng(7)
    A = np.eye(4) + 0.6 * rng.standard_normal((4, 4))  # non-orthogonal
    return A / np.linalg.norm(A, axis=0)


def sources(n: int, seed: int) -> np.ndarray:
    """Four independent non-Gaussian sources, (4, n): an alpha-like sine, a square wave, a sawtooth, Laplace."""
    t = np.arange(n) / SFREQ
    rng = np.random.default_rng(seed)
    S = np.vstack([np.sin(2 * np.pi * 10.0 * t + seed), np.sign(np.sin(2 * np.pi * 1.3 * t + seed)),
                   2 * ((0.7 * t + 0.1 * seed) % 1) - 1, rng.laplace(size=n)])
    return (S - S.mean(axis=1, keepdims=True)) / S.std(axis=1, keepdims=True)


def write_site(folder: Path, site: int, fmt: str, *, n: int = 3000, names=CHANNELS, types=None) -> Path:
    """One site's recording: the sources mixed by the true mixing, 10 microvolts a unit, written by MNE."""
    if WRITERS[fmt] is not None:
        pytest.importorskip(WRITERS[fmt])
    data = 1e-5 * true_mixing() @ sources(n, site)
    # Channels beyond the four EEG ones (an ECG, a trigger) hold other signals.
    data = np.vstack([data, 1e-5 * np.random.default_rng(site).standard_normal((len(names) - 4, n))])
    info = mne.create_info(list(names), SFREQ, types or "eeg")
    raw = mne.io.RawArray(data, info, verbose="error")
    path = folder / f"site{site}_raw.{fmt}"
    if fmt == "fif":
        raw.save(path, verbose="error")
    else:
        mne.export.export_raw(path, raw, fmt={"edf": "edf", "vhdr": "brainvision", "set": "eeglab"}[fmt],
                              verbose="error")
    return path


def config(paths, *overrides):
    from fedica.server.app import compose_config

    return compose_config(["algorithm=rfica", "scenario=files", "engine=inprocess",
                           f"scenario.paths=[{','.join(map(str, paths))}]", *overrides])


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_a_recording_reads_back_as_its_eeg_channels_in_volts(tmp_path, fmt):
    path = write_site(tmp_path, 0, fmt)
    recording = read_recording(path)
    expected = 1e-5 * true_mixing() @ sources(3000, 0)
    assert recording.channel_names == tuple(CHANNELS)
    assert recording.data.dtype == np.float64 and recording.data.flags.c_contiguous
    assert recording.data.shape == (4, 3000)
    # EDF stores 16-bit samples over the channel's range; the others keep (nearly) every digit.
    np.testing.assert_allclose(recording.data, expected, atol=1e-3 * np.abs(expected).max())
    np.testing.assert_array_equal(load_ica_file(path), recording.data.T)  # rows = samples, as for tables


def test_the_stretches_a_recording_marks_bad_are_left_out_and_an_edf_copy_reads_as_its_fif(tmp_path):
    # 12.4 s at 250 Hz: MNE's EDF export pads the last 1 s record and marks the padding BAD_ACQ_SKIP (issue 45: read
    # as signal, 150 samples of zeros). A FIF with a stretch annotated bad leaves it out, as MNE's ICA does.
    pytest.importorskip("edfio")
    n = 3100
    data = 1e-5 * true_mixing() @ sources(n, 0)
    raw = mne.io.RawArray(data, mne.create_info(CHANNELS, SFREQ, "eeg"), verbose="error")
    fif, edf = tmp_path / "site0_raw.fif", tmp_path / "site0.edf"
    raw.save(fif, verbose="error")
    mne.export.export_raw(edf, raw, fmt="edf", verbose="error")
    assert any(a["description"] == "BAD_ACQ_SKIP" for a in mne.io.read_raw(edf, verbose="error").annotations)
    from_fif, from_edf = read_recording(fif), read_recording(edf)
    assert from_fif.data.shape == from_edf.data.shape == (4, n)
    np.testing.assert_allclose(from_edf.data, from_fif.data, atol=1e-3 * np.abs(data).max())
    marked = raw.copy().set_annotations(mne.Annotations([2.0], [1.0], ["BAD_blink"]))
    marked.save(tmp_path / "site1_raw.fif", verbose="error")
    kept = read_recording(tmp_path / "site1_raw.fif").data
    assert kept.shape == (4, n - int(SFREQ))
    np.testing.assert_array_equal(kept, np.hstack([from_fif.data[:, :500], from_fif.data[:, 750:]]))


def test_only_the_eeg_channels_are_kept(tmp_path):
    path = write_site(tmp_path, 0, "fif", names=[*CHANNELS, "ECG", "STI"],
                      types=["eeg"] * 4 + ["ecg", "stim"])
    recording = read_recording(path)
    assert recording.channel_names == tuple(CHANNELS) and recording.data.shape == (4, 3000)


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_a_deployed_site_reports_the_channels_it_reads_from_the_header_alone(tmp_path, fmt):
    """What a SuperNode sends with its replies (fedica.protocol.column_majority): the channels read_recording keeps."""
    path = write_site(tmp_path, 0, fmt, names=[*CHANNELS, "ECG"], types=["eeg"] * 4 + ["ecg"])
    # (Not every format keeps a channel's type: an EDF file's ECG reads back as EEG, for both.)
    assert site_columns(path) == read_recording(path).channel_names
    assert site_columns(path)[:4] == tuple(CHANNELS)
    raw = mne.io.read_raw(write_site(tmp_path, 1, "fif"), preload=True, verbose="error")
    raw.info["bads"] = ["Cz"]
    marked = tmp_path / "marked_raw.fif"
    raw.save(marked, verbose="error")
    # A channel the file marks bad is kept, held at zero: the site's ICA leaves it out, the server fills it.
    recording = read_recording(marked)
    assert site_columns(marked) == recording.channel_names == tuple(CHANNELS) and recording.bad_channels == ("Cz",)
    assert np.all(recording.data[CHANNELS.index("Cz")] == 0) and np.all(recording.data[CHANNELS.index("Fz")] != 0)


def test_a_site_whose_file_marks_a_channel_bad_takes_part_and_is_named(tmp_path):
    paths = [write_site(tmp_path, site, "fif") for site in range(4)]
    raw = mne.io.read_raw(paths[2], preload=True, verbose="error")
    raw.info["bads"] = ["Pz"]
    raw.save(paths[2], overwrite=True, verbose="error")
    sites = [load_ica_file(path) for path in paths]
    model = RFICA(random_state=0).fit(sites)
    assert model.bad_channels_ == {2: [CHANNELS.index("Pz")]}
    assert ica_error(model.mixing_, true_mixing()) < 0.1


def test_rfica_recovers_the_mixing_from_the_files(tmp_path):
    paths = [write_site(tmp_path, site, fmt) for site, fmt in enumerate(["fif", "fif", "edf"])]
    sites = [load_ica_file(path) for path in paths]
    model = RFICA(random_state=0).fit(sites)
    assert ica_error(model.mixing_, true_mixing()) < 0.1


def test_the_config_reads_each_recording_once_and_the_run_uses_it(tmp_path, monkeypatch):
    from fedica.data import scenarios

    paths = [write_site(tmp_path, site, "fif") for site in range(2)]
    reads = []
    monkeypatch.setattr(scenarios, "read_recording", lambda path: reads.append(path) or read_recording(path))
    cfg = validate_config(config(paths))
    Y = ica_scenario_data(cfg["scenario"], 1, cfg["seed"])
    assert Y.shape == (4, 3000) and Y.flags.c_contiguous and Y.flags.writeable
    assert ica_channel_names(cfg["scenario"]) == CHANNELS
    assert reads == [str(path) for path in paths]  # the check's reads serve the run and the channel names
    np.testing.assert_array_equal(Y, read_recording(paths[1]).data)


def test_a_file_without_eeg_is_one_line_listing_its_channel_types(tmp_path):
    good = write_site(tmp_path, 0, "fif")
    no_eeg = write_site(tmp_path, 1, "fif", types=["misc", "misc", "ecg", "stim"])
    with pytest.raises(ConfigError) as info:
        validate_config(config([good, no_eeg]))
    assert str(info.value) == (f"scenario.paths[1]={no_eeg}: has no EEG channel (its channel types: ecg (1), "
                               "misc (2), stim (1)); RF-ICA reads the EEG channels")


MONTAGE = ["Fp1", "Fz", "Cz", "Pz", "O1", "O2"]


def write_montage_site(folder: Path, site: int, names) -> Path:
    """A site recording ``names`` (any subset of MONTAGE, any order) of one six-channel field of the four sources."""
    mixing = np.vstack([true_mixing(), 0.5 * true_mixing()[:2] + 0.5 * true_mixing()[2:]])  # six channels, one field
    mixing /= np.linalg.norm(mixing, axis=0)
    data = 1e-5 * mixing[[MONTAGE.index(name) for name in names]] @ sources(3000, site)
    path = folder / f"site{site}_raw.fif"
    mne.io.RawArray(data, mne.create_info(list(names), SFREQ, "eeg"), verbose="error").save(path, verbose="error")
    return path, mixing


def test_sites_with_other_montages_take_part_and_their_missing_channels_are_named(tmp_path):
    """Issue 45: a site that records other channels, or the same in another order, was refused; the federation's
    channels are now all of the sites', and a site's channels it does not record are filled from the others'."""
    montages = [MONTAGE, MONTAGE, MONTAGE, MONTAGE[:5], ["Fz", "Cz", "Pz", "O2", "O1"]]
    paths = [write_montage_site(tmp_path, site, names)[0] for site, names in enumerate(montages)]
    mixing = write_montage_site(tmp_path, 9, MONTAGE)[1]
    cfg = validate_config(config(paths))
    assert ica_channel_names(cfg["scenario"]) == MONTAGE
    sites = [ica_scenario_data(cfg["scenario"], g, cfg["seed"]).T for g in range(5)]
    assert np.all(sites[3][:, 5] == 0) and np.all(sites[4][:, 0] == 0)  # held at zero: left out, filled by the server
    model = RFICA(n_components=4, random_state=0).fit(sites)
    assert model.bad_channels_ == {3: [5], 4: [0]}
    assert ica_error(model.mixing_, mixing) < 0.05


def test_a_site_that_records_at_most_half_of_the_federations_channels_is_one_line(tmp_path):
    paths = [write_montage_site(tmp_path, site, names)[0]
             for site, names in enumerate([MONTAGE, MONTAGE, ["Fp1", "Fz", "Cz"]])]
    with pytest.raises(ConfigError) as info:
        validate_config(config(paths))
    assert str(info.value).splitlines() == [
        f"scenario.paths[2]={paths[2]}: records 3 of the federation's 6 EEG channels (missing here: Pz, O1, O2); a "
        "site must record more than half of them, as the others fill the rest"]


def test_tables_and_recordings_are_not_mixed_and_fedgem_refuses_recordings(tmp_path):
    recording = write_site(tmp_path, 0, "fif")
    table = tmp_path / "site1.npy"
    np.save(table, read_recording(recording).data.T)
    with pytest.raises(ConfigError, match=r"^scenario\.paths\[1\]=.*site1\.npy: is a table but scenario\.paths\[0\] "
                                          r"is a recording; every site's file must be of one kind"):
        validate_config(config([recording, table]))
    from fedica.server.app import compose_config

    with pytest.raises(ConfigError) as info:
        validate_config(compose_config(["algorithm=fedgem", "scenario=files", "engine=inprocess",
                                        f"scenario.paths=[{recording},{table}]", "scenario.n_components=2"]))
    assert str(info.value) == (f"scenario.paths[0]={recording}: is a recording (.fif); FedGEM reads tables (CSV, "
                               "NPY, NPZ), recordings are RF-ICA's (algorithm=rfica)")
    with pytest.raises(ConfigError, match=r"label_column=0 applies to tables"):
        validate_config(config([recording, recording], "scenario.label_column=0"))


def test_without_mne_a_recording_is_one_line_saying_how_to_install_it(tmp_path, monkeypatch):
    paths = [write_site(tmp_path, site, "edf") for site in range(2)]
    monkeypatch.setitem(sys.modules, "mne", None)  # `import mne` now raises ImportError, as when absent
    with pytest.raises(DataFileError) as error:
        read_recording(paths[0])
    assert str(error.value) == f'{paths[0]}: reading .edf files needs MNE: pip install "fedica[eeg]"'
    with pytest.raises(ConfigError) as info:
        validate_config(config(paths))
    assert str(info.value).splitlines() == [
        f'scenario.paths[{site}]={path}: reading .edf files needs MNE: pip install "fedica[eeg]"'
        for site, path in enumerate(paths)]


@pytest.mark.slow
def test_fedica_run_on_recordings_end_to_end_and_its_picture(tmp_path):
    import matplotlib.image

    paths = [write_site(tmp_path, site, fmt, n=4000) for site, fmt in enumerate(["fif", "edf", "vhdr"])]
    folder = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "fedica", "engine=inprocess", "algorithm=rfica", "scenario=files",
                           f"scenario.paths=[{','.join(map(str, paths))}]", f"hydra.run.dir={folder}"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((folder / "result.json").read_text())
    assert result["rfica"]["channel_names"] == CHANNELS
    assert ica_error(np.asarray(result["rfica"]["estimate"]), true_mixing()) < 0.1

    plotted = subprocess.run([sys.executable, "-m", "fedica.scripts.plot", str(folder)],
                             capture_output=True, text=True, timeout=300)
    assert plotted.returncode == 0, plotted.stderr[-3000:]
    image = matplotlib.image.imread(plotted.stdout.strip().splitlines()[-1].removeprefix("figure -> "))
    assert image.shape[0] > 900 and image.shape[1] > 1000
    assert len(np.unique(image[..., :3].reshape(-1, 3), axis=0)) > 50  # the heat maps' and the traces' colours
