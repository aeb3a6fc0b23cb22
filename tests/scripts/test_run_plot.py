"""``fedica-plot RUN_DIR`` on real small runs of ``fedica-run``: one picture per run, for both algorithms.

Each algorithm's runs come from one ``fedica-run`` process (a two-run sweep for FedGEM: 2-D and 4-D
blobs), so that the test pays Python's and Flower's start-up once; the picture of each run is then
opened and checked for its size and that it is not blank.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fedica.scripts import plot

from fedica.data.scenarios import ica_scenario_data, scenario_client_data

# Every test here reads the runs that its module's fixtures start as real processes.
pytestmark = pytest.mark.slow

SMALL_BLOBS = ["algorithm=fedgem", "scenario=blobs", "scenario.n_clients=4", "scenario.n_train=1000",
               "scenario.n_test=1000", "algorithm.rounds=3", "baselines=false"]


def fedica_run(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "fedica", *args, "engine=inprocess"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def fedgem_sweep(tmp_path_factory) -> Path:
    sweep = tmp_path_factory.mktemp("fedgem")
    fedica_run("-m", *SMALL_BLOBS, "scenario.dim=2,4", f"hydra.sweep.dir={sweep}")
    return sweep


@pytest.fixture(scope="module")
def rfica_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("rfica") / "run"
    fedica_run("scenario.n_clients=6", "scenario.n_normal=2000", f"hydra.run.dir={folder}")
    return folder


def run_dir(sweep: Path, dim: int) -> Path:
    return next(f for f in sweep.iterdir() if (f / "result.json").is_file()
                and json.loads((f / "result.json").read_text())["scenario"]["dim"] == dim)


def draw(capsys, folder: Path, *args: str) -> tuple[np.ndarray, str]:
    """fedica-plot on ``folder``; the picture as an (height, width, channels) array and what was printed."""
    import matplotlib.image

    plot.main([str(folder), *args])
    out = capsys.readouterr().out
    path = Path(out.strip().splitlines()[-1].removeprefix("figure -> "))
    return matplotlib.image.imread(path), out


def assert_a_picture(image: np.ndarray, min_width: int, min_height: int, min_colours: int = 4) -> None:
    """Large enough, and not blank: several colours (not the greys of axes and text) of 50 pixels or more each."""
    height, width = image.shape[:2]
    assert width >= min_width and height >= min_height, image.shape
    pixels = (image[..., :3] * 255).round().astype(np.int64).reshape(-1, 3)
    coloured = pixels[pixels.max(axis=1) - pixels.min(axis=1) > 60]
    _, counts = np.unique(coloured, axis=0, return_counts=True)
    assert np.sum(counts >= 50) >= min_colours


@pytest.mark.parametrize("dim", [2, 4])
def test_a_fedgem_run_draws_its_sites_clusters(fedgem_sweep, capsys, dim):
    folder = run_dir(fedgem_sweep, dim)
    image, out = draw(capsys, folder)
    assert out == f"figure -> {folder / 'run.png'}\n"
    assert_a_picture(image, 1000, 700)


def test_the_sweep_folder_is_still_a_sweep(fedgem_sweep, capsys):
    image, out = draw(capsys, fedgem_sweep, "--metric", "global_ari")
    assert "| scenario.dim | fedgem |" in out
    assert out.endswith(f"figure -> {fedgem_sweep / 'figure.png'}\n")
    assert_a_picture(image, 300, 200, min_colours=1)  # one method, one line


def test_sweep_options_are_refused_for_one_run(fedgem_sweep):
    folder = run_dir(fedgem_sweep, 2)
    with pytest.raises(SystemExit, match=r"is one run \(it holds result.json\); --x, --no-figure is for a sweep's folder$"):
        plot.main([str(folder), "--x", "seed", "--no-figure"])


def test_a_files_run_reads_the_sites_files(fedgem_sweep, tmp_path, capsys):
    # The blobs run's consensus models over files holding its sites' points: the points are read from the files.
    result = json.loads((run_dir(fedgem_sweep, 2) / "result.json").read_text())
    paths = []
    for partition in result["fedgem"]["client_mapping"]:
        path = tmp_path / f"site{partition}.csv"
        np.savetxt(path, scenario_client_data(result["scenario"], int(partition), result["seed"]).X_test, delimiter=",")
        paths.append(str(path))
    result["scenario"] = {"name": "files", "paths": paths, "label_column": None, "n_components": 3,
                          "test_fraction": 0.3, "write_sources": False}
    (tmp_path / "result.json").write_text(json.dumps(result))
    image, _ = draw(capsys, tmp_path)
    assert_a_picture(image, 1000, 700)


def test_a_deployments_picture_holds_only_the_result(fedgem_sweep, rfica_run, tmp_path, capsys):
    for name, source in (("fedgem", run_dir(fedgem_sweep, 4)), ("rfica", rfica_run)):
        result = json.loads((source / "result.json").read_text())
        result["engine"] = "deployment"
        folder = tmp_path / name
        folder.mkdir()
        (folder / "result.json").write_text(json.dumps(result))
        image, out = draw(capsys, folder)
        assert "fedica-plot: deployment: the sites keep their data; drawn is only what the result holds" in out
        assert_a_picture(image, 500, 250)


def test_an_rfica_run_draws_its_mixing_and_one_sites_sources(rfica_run, capsys):
    image, out = draw(capsys, rfica_run, "--out", str(rfica_run / "picture.png"))
    assert out == f"figure -> {rfica_run / 'picture.png'}\n"
    assert_a_picture(image, 1000, 900)


def test_an_rfica_files_run_draws_the_unmixing_beside_the_estimate(rfica_run, tmp_path, capsys):
    # The run's estimate over files holding its sites' observations, as a files run has no A*.
    result = json.loads((rfica_run / "result.json").read_text())
    paths = []
    for site in range(result["scenario"]["n_clients"]):
        path = tmp_path / f"site{site}.csv"
        np.savetxt(path, ica_scenario_data(result["scenario"], site, result["seed"]).T, delimiter=",")
        paths.append(str(path))
    result["scenario"] = {"name": "files", "paths": paths, "label_column": None, "n_components": None,
                          "test_fraction": 0.3, "write_sources": False}
    result["rfica"]["true_mixing"] = None
    (tmp_path / "result.json").write_text(json.dumps(result))
    image, _ = draw(capsys, tmp_path)
    assert_a_picture(image, 1000, 900)


def test_an_rfica_run_on_recordings_draws_each_components_channel_weights(rfica_run, tmp_path, capsys):
    # The run's sites' observations as EEG recordings (FIF, in volts) with named channels, as a files run of
    # recordings records them: each source is drawn beside its channel weights, the channels named.
    mne = pytest.importorskip("mne")
    result = json.loads((rfica_run / "result.json").read_text())
    names = [f"EEG{i:02d}" for i in range(len(result["rfica"]["estimate"]))]
    paths = []
    for site in range(result["scenario"]["n_clients"]):
        Y = ica_scenario_data(result["scenario"], site, result["seed"])
        raw = mne.io.RawArray(1e-5 * Y, mne.create_info(names, 250.0, "eeg"), verbose="error")
        paths.append(str(tmp_path / f"site{site}_raw.fif"))
        raw.save(paths[-1], verbose="error")
    result["scenario"] = {"name": "files", "paths": paths, "label_column": None, "n_components": None,
                          "test_fraction": 0.3, "write_sources": False}
    result["rfica"]["true_mixing"] = None
    result["rfica"]["channel_names"] = names
    (tmp_path / "result.json").write_text(json.dumps(result))
    image, _ = draw(capsys, tmp_path)
    assert_a_picture(image, 1000, 900)


def test_an_eeg_files_run_draws_mne_s_topomaps_of_its_components(tmp_path, capsys, monkeypatch):
    """Recordings named by the 10-05 system: each component's channel weights as MNE's topomap, with its share of the
    variance (issue 45); channels of other names keep the bars."""
    mne = pytest.importorskip("mne")
    from fedica.scripts import plot_run

    names = ["Fp1", "Fp2", "F3", "F4", "C3", "C4", "P3", "P4"]
    rng = np.random.default_rng(0)
    mixing = rng.standard_normal((8, 4))
    paths = []
    for site in range(3):
        sources = rng.laplace(size=(4, 4000))
        raw = mne.io.RawArray(1e-5 * (mixing @ sources + 0.01 * rng.standard_normal((8, 4000))),
                              mne.create_info(names, 200.0, ch_types="eeg"), verbose="error")
        paths.append(tmp_path / f"site{site}_raw.fif")
        raw.save(paths[-1], verbose="error")
    folder = tmp_path / "run"
    fedica_run("algorithm=rfica", "scenario=files", f"scenario.paths=[{','.join(map(str, paths))}]",
               "algorithm.n_components=4", f"hydra.run.dir={folder}")
    drawn = []
    monkeypatch.setattr(plot_run, "draw_topomaps", lambda axes, *rest: drawn.append(len(axes)) or
                        plot_run.draw_weights(axes, rest[0], names))
    image, _ = draw(capsys, folder)
    assert drawn == [4]
    assert_a_picture(image, 700, 500)
    assert plot_run.scalp_positions(names)["ch_names"] == names
    assert plot_run.scalp_positions(["c0", "c1"]) is None and plot_run.scalp_positions(None) is None
    monkeypatch.undo()
    image, _ = draw(capsys, folder)  # MNE's own topomaps, drawn for real
    assert_a_picture(image, 700, 500)
