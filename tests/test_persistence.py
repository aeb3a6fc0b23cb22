"""Keeping a fitted estimator: save/load in one portable .npz, and rebuilding from a run's result.json."""

import copy
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from fedica.server.app import compose_config
from sklearn.exceptions import NotFittedError

import fedica
from fedica.data.scenarios import scenario_client_data
from fedica.persistence import DOCUMENT_MEMBER, FORMAT_VERSION

ROOT = Path(__file__).resolve().parent.parent
BLOBS = ["algorithm=fedgem", "scenario=blobs", "scenario.n_clients=5", "scenario.n_clusters=6", "scenario.r_min=4",
         "engine=inprocess", "baselines=false", "seed=3"]


def _blob_sites():
    cfg = compose_config(BLOBS)
    return [scenario_client_data(cfg["scenario"], p, cfg["seed"]).X_train for p in range(cfg["scenario"]["n_clients"])]


def _ica_sites(n_sites=5, seed=0):
    rng = np.random.default_rng(seed)
    mixing = np.linalg.qr(rng.standard_normal((3, 3)))[0]
    return [rng.laplace(size=(2000, 3)) @ mixing.T + rng.standard_normal(3) for _ in range(n_sites)]


def assert_identical(ours, theirs, where="value"):
    """The same types all the way down, and every array with the same dtype, shape and bits."""
    assert type(ours) is type(theirs), f"{where}: {type(ours).__name__} != {type(theirs).__name__}"
    if isinstance(ours, np.ndarray):
        assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape), where
        assert ours.tobytes() == theirs.tobytes(), where
    elif isinstance(ours, dict):
        assert list(ours) == list(theirs), where
        for key in ours:
            assert_identical(ours[key], theirs[key], f"{where}[{key!r}]")
    elif isinstance(ours, (list, tuple)):
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert_identical(a, b, f"{where}[{i}]")
    elif isinstance(ours, float) and np.isnan(ours):
        assert np.isnan(theirs), where
    else:
        assert ours == theirs, where


def _fitted(estimator):
    return {name: value for name, value in vars(estimator).items() if name.endswith("_") and not name.startswith("_")}


# ---------------------------------------------------------------- save and load


@pytest.fixture(scope="module")
def fedgem_models():
    sites = _blob_sites()
    # A tuning with a skipped upsilon (a dict inside tuning_), and a fit where site 4 is left out
    # (it declares more components than the cap admits): its labels_, site_mapping_, site_means_ are None.
    tuned = fedica.FedGEM(max_overlap_pairs=40, random_state=0).fit(sites, 3)
    with_left_out_site = fedica.FedGEM(upsilon=1.0, random_state=0).fit(sites, [2, 2, 2, 2, 7])
    assert with_left_out_site.labels_[4] is None and with_left_out_site.site_mapping_[4] is None
    return sites, [tuned, with_left_out_site]


def test_fedgem_round_trip_is_bit_identical(tmp_path, fedgem_models):
    sites, models = fedgem_models
    for number, model in enumerate(models):
        path = model.save(tmp_path / f"model{number}.npz")
        assert path == tmp_path / f"model{number}.npz"  # written as named, no suffix appended
        loaded = fedica.FedGEM.load(path)
        assert type(loaded) is fedica.FedGEM
        assert_identical(loaded.get_params(), model.get_params(), "params")
        assert_identical(_fitted(loaded), _fitted(model), "attributes")
        X = np.vstack(sites)
        assert_identical(loaded.predict(X), model.predict(X))
        assert_identical(loaded.predict(sites[1], site=1), model.predict(sites[1], site=1))
        assert_identical(loaded.predict_proba(X), model.predict_proba(X))
        assert_identical(loaded.score_samples(X), model.score_samples(X))


def test_rfica_round_trip_is_bit_identical(tmp_path):
    sites = _ica_sites()
    fitted = fedica.RFICA(contrast="logcosh", random_state=2).fit(sites)
    aggregated = fedica.RFICA(random_state=1).aggregate(fitted.site_mixings_, [2000] * len(sites))
    for number, model in enumerate([fitted, aggregated]):
        loaded = fedica.RFICA.load(model.save(tmp_path / f"ica{number}.npz"))
        assert_identical(loaded.get_params(), model.get_params(), "params")
        assert_identical(_fitted(loaded), _fitted(model), "attributes")
        assert_identical(loaded.transform(sites[0]), model.transform(sites[0]))
        assert_identical(loaded.inverse_transform(sites[1]), model.inverse_transform(sites[1]))


def test_the_file_is_numpy_arrays_and_one_json_document_without_pickle(tmp_path, fedgem_models):
    model = fedgem_models[1][1]
    path = model.save(tmp_path / "model.npz")
    with np.load(path, allow_pickle=False) as archive:
        assert all(not archive[name].dtype.hasobject for name in archive.files)
        document = json.loads(archive[DOCUMENT_MEMBER].item())
        np.testing.assert_array_equal(archive["means_"], model.means_)
        np.testing.assert_array_equal(archive["labels_.0"], model.labels_[0])
    assert {k: document[k] for k in ("format", "format_version", "fedica_version", "estimator")} == {
        "format": "fedica.estimator", "format_version": FORMAT_VERSION, "fedica_version": fedica.__version__,
        "estimator": "FedGEM"}
    assert document["params"]["upsilon"] == 1.0
    assert document["attributes"]["n_clusters_"] == model.n_clusters_
    assert document["attributes"]["labels_"][4] is None


def test_every_kind_of_value_comes_back_with_its_type(tmp_path, fedgem_models):
    model = copy.copy(fedgem_models[1][0])
    model.tuning_ = {"nan": float("nan"), "inf": -float("inf"), "pair": (1, (2.5, "x")), 3: np.int32(7),
                     "__hidden": [None, True, np.float32(0.5)], "empty": np.zeros((0, 3), dtype=np.int16),
                     "a.0": np.arange(2), "a": [np.arange(3)]}
    loaded = fedica.FedGEM.load(model.save(tmp_path / "extra.npz"))
    assert_identical(loaded.tuning_, model.tuning_, "tuning_")
    model.tuning_ = np.array([object()])
    with pytest.raises(TypeError, match="tuning_: an array of Python objects cannot be saved without pickle"):
        model.save(tmp_path / "objects.npz")
    assert not (tmp_path / "objects.npz").exists()


def test_saving_an_unfitted_estimator_raises_not_fitted_error(tmp_path):
    for estimator in (fedica.FedGEM(), fedica.RFICA()):
        with pytest.raises(NotFittedError):
            estimator.save(tmp_path / "unfitted.npz")
    assert not list(tmp_path.iterdir())


def _rewrite(source, target, change):
    """Copy the archive ``source`` to ``target``, its members passed through ``change(members)``."""
    with np.load(source, allow_pickle=False) as archive:
        members = {name: archive[name] for name in archive.files}
    change(members)
    with open(target, "wb") as handle:
        np.savez(handle, **members)
    return target


def _with_document(**changes):
    def change(members):
        document = json.loads(members[DOCUMENT_MEMBER].item())
        members[DOCUMENT_MEMBER] = np.array(json.dumps({**document, **changes}))
    return change


def _one_line_error(load, path):
    with pytest.raises(ValueError) as info:
        load(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return message[len(f"{path}: "):]


def test_loading_a_wrong_file_raises_one_line_naming_the_file_and_the_problem(tmp_path, fedgem_models):
    saved = fedgem_models[1][0].save(tmp_path / "model.npz")
    ica = fedica.RFICA(random_state=0).fit(_ica_sites()).save(tmp_path / "ica.npz")

    assert _one_line_error(fedica.FedGEM.load, ica) == "holds a fedica.RFICA, not a fedica.FedGEM"
    assert _one_line_error(fedica.RFICA.load, saved) == "holds a fedica.FedGEM, not a fedica.RFICA"

    newer = _rewrite(saved, tmp_path / "newer.npz", _with_document(format_version=FORMAT_VERSION + 1))
    assert _one_line_error(fedica.FedGEM.load, newer) == (
        f"format version {FORMAT_VERSION + 1} is newer than the {FORMAT_VERSION} this fedica reads "
        f"(written by fedica {fedica.__version__}); load it with that version")

    missing = _rewrite(saved, tmp_path / "missing.npz", lambda members: members.pop("means_"))
    assert _one_line_error(fedica.FedGEM.load, missing) == (
        "member 'means_' is missing (the file is incomplete or was altered)")

    not_fedica = "not a fedica estimator file"
    text = tmp_path / "notes.txt"
    text.write_text("not an archive\n")
    assert _one_line_error(fedica.FedGEM.load, text).startswith(f"{not_fedica} (not a readable .npz archive")
    broken = tmp_path / "broken.npz"
    broken.write_bytes(saved.read_bytes()[:200])
    assert _one_line_error(fedica.FedGEM.load, broken).startswith(f"{not_fedica} (not a readable .npz archive")
    np.save(tmp_path / "array.npy", np.zeros(3))
    assert _one_line_error(fedica.FedGEM.load, tmp_path / "array.npy") == (
        f"{not_fedica} (a single .npy array, not a .npz archive)")
    plain = tmp_path / "plain.npz"
    np.savez(plain, means_=np.zeros((2, 2)))
    assert _one_line_error(fedica.FedGEM.load, plain) == (
        f"{not_fedica} (no {DOCUMENT_MEMBER} document of format fedica.estimator)")
    other_format = _rewrite(saved, tmp_path / "other.npz", _with_document(format="something.else"))
    assert _one_line_error(fedica.FedGEM.load, other_format).startswith(not_fedica)
    assert zipfile.is_zipfile(other_format)


def _npy(array_header: dict, data: bytes) -> bytes:
    import io

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, array_header)
    return header.getvalue() + data


@pytest.mark.parametrize("change, problem", [
    # Row 11 of issue 43: crafted files loaded and predicted silently wrong answers, set any attribute, or
    # raised RecursionError, MemoryError, TypeError; a 2 MB one took 2.2 GB to load.
    (lambda m: m.update({"means_": m["means_"][: len(m["means_"]) // 2, :1]}), "means_ has"),
    (lambda m: m.update({"means_": m["means_"].astype(complex)}), "holds complex128 values, not numbers"),
    (lambda m: m.update({"means_": np.full_like(m["means_"], np.nan)}), "means_ holds NaN or infinite values"),
    (lambda m: m.update({"weights_": m["weights_"][:-1]}), "weights_ has shape"),
    (_with_document(attributes={"predict": 1}), "attributes ['predict'] are not fitted attributes of FedGEM"),
    (_with_document(attributes={"__dict__": {}}), "are not fitted attributes of FedGEM"),
    (_with_document(params={"upsilon": -3.0}), "upsilon=-3.0"),
    (_with_document(attributes={"means_": {"__array__": ["means_"]}}), "member ['means_'] is missing"),
    (_with_document(attributes={"tuning_": {"__float__": "1e999999"}}), "is not a non-finite float"),
    (_with_document(attributes={"tuning_": {"__dict__": [[[1], 2]]}}), "not a fedica estimator file"),
    (lambda m: m.update({"junk": np.zeros(3)}), "members ['junk'] belong to no parameter or attribute"),
])
def test_a_crafted_model_file_is_refused_in_one_line_before_anything_is_set(tmp_path, fedgem_models, change, problem):
    saved = fedgem_models[1][0].save(tmp_path / "model.npz")
    crafted = _rewrite(saved, tmp_path / "crafted.npz", change)
    assert problem in _one_line_error(fedica.FedGEM.load, crafted)


def test_a_model_files_members_are_checked_against_their_headers_and_bounded(tmp_path, fedgem_models):
    saved = fedgem_models[1][0].save(tmp_path / "model.npz")
    bomb = tmp_path / "bomb.npz"
    with zipfile.ZipFile(saved) as source, zipfile.ZipFile(bomb, "w") as target:
        for item in source.infolist():
            target.writestr(item, source.read(item) if item.filename != "means_.npy" else
                            _npy({"descr": "<f8", "fortran_order": False, "shape": (10**9, 50)}, b"\0" * 64))
    assert "declares shape (1000000000, 50)" in _one_line_error(fedica.FedGEM.load, bomb)
    empty = _rewrite(saved, tmp_path / "empty.npz", _with_document(attributes={}))
    assert "means_ is a NoneType" in _one_line_error(fedica.FedGEM.load, empty)
    folder = tmp_path / "folder.npz"
    folder.mkdir()
    assert _one_line_error(fedica.FedGEM.load, folder).startswith("not a fedica estimator file")
    recursive = tmp_path / "recursive.npz"
    with np.load(saved, allow_pickle=False) as archive:
        members = {name: archive[name] for name in archive.files}
    members[DOCUMENT_MEMBER] = np.array(members[DOCUMENT_MEMBER].item().replace('"tuning_": ', '"tuning_": ' + "[" * 100000, 1)
                                        .replace('"upsilon_"', "]" * 100000 + ', "upsilon_"', 1))
    np.savez(recursive, **members)
    assert _one_line_error(fedica.FedGEM.load, recursive).startswith("not a fedica estimator file")


def test_every_attribute_a_fit_sets_is_one_a_file_may_set(fedgem_models):
    ica = fedica.RFICA(random_state=0).fit(_ica_sites())
    for estimator in (fedgem_models[1][0], fedgem_models[1][1], ica):
        fitted = {name for name in vars(estimator) if name.endswith("_") and not name.startswith("_")}
        assert fitted <= type(estimator)._FITTED_ATTRIBUTES, fitted - type(estimator)._FITTED_ATTRIBUTES


# ---------------------------------------------------------------- from a run's result.json


def _fedica_run(out_dir, *overrides):
    command = [sys.executable, "-m", "fedica", "engine=inprocess", "log_level=WARNING", f"hydra.run.dir={out_dir}",
               *overrides]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    return done, Path(out_dir)


@pytest.fixture(scope="module")
def fedgem_run(tmp_path_factory):
    done, out = _fedica_run(tmp_path_factory.mktemp("fedgem"), "algorithm=fedgem_paper", "scenario.n_clients=5",
                            "baselines=false", "seed=4", "algorithm.rounds=6")
    assert done.returncode == 0, done.stderr[-2000:]
    return out / "result.json"


@pytest.fixture(scope="module")
def rfica_run(tmp_path_factory):
    done, out = _fedica_run(tmp_path_factory.mktemp("rfica"), "scenario.n_clients=6", "algorithm.contrast=logcosh")
    assert done.returncode == 0, done.stderr[-2000:]
    return out / "result.json"


@pytest.mark.slow
def test_fedgem_from_result_is_the_runs_model(fedgem_run, tmp_path):
    result = json.loads(fedgem_run.read_text())
    section, config = result["fedgem"], result["config"]
    model = fedica.FedGEM.from_result(fedgem_run)
    centroids = np.asarray(section["global_centroids"])
    np.testing.assert_array_equal(model.means_, centroids)
    assert model.n_clusters_ == result["metrics"]["fedgem"]["super_clusters"]
    assert model.upsilon_ == section["upsilon"]
    assert model.feature_scale_spread_ == section["feature_scale_spread"] and model.feature_scale_spread_ >= 1
    assert model.cluster_anisotropy_ == section["cluster_anisotropy"] and model.cluster_anisotropy_ > 0
    assert model.history_ == result["history"] and model.rejected_ == result["clients"]["rejected"]
    assert model.get_params()["rounds"] == 6 and model.random_state == 4
    assert {k: v for k, v in model.get_params().items() if k in config["algorithm"]} == {
        k: v for k, v in config["algorithm"].items() if k != "name"}
    assert model.labels_ is None and model.weights_ is None and model.covariance_ is None
    assert model.n_local_clusters_.tolist() == [section["local_clusters"][str(g)] for g in range(5)]

    X = np.random.default_rng(0).uniform(centroids.min(0) - 1, centroids.max(0) + 1, size=(300, centroids.shape[1]))
    for g, global_ids in section["client_mapping"].items():
        global_ids = np.asarray(global_ids)
        # The site labels a point with the global id of its nearest own component (its consensus model).
        nearest = ((X[:, None, :] - centroids[global_ids][None]) ** 2).sum(axis=2).argmin(axis=1)
        np.testing.assert_array_equal(model.predict(X, site=int(g)), global_ids[nearest])
    np.testing.assert_array_equal(model.predict(X), ((X[:, None, :] - centroids[None]) ** 2).sum(axis=2).argmin(axis=1))
    with pytest.raises(NotFittedError, match="rebuilt from a run's result"):
        model.predict_proba(X)

    # A rebuilt estimator is kept like a fitted one.
    again = fedica.FedGEM.load(model.save(tmp_path / "from_result.npz"))
    assert_identical(_fitted(again), _fitted(model), "attributes")


@pytest.mark.slow
def test_rfica_from_result_is_the_runs_model(rfica_run):
    result = json.loads(rfica_run.read_text())
    section = result["rfica"]
    model = fedica.RFICA.from_result(rfica_run)
    np.testing.assert_array_equal(model.mixing_, np.asarray(section["estimate"]))
    np.testing.assert_array_equal(model.components_, np.asarray(section["unmixing"]))
    np.testing.assert_array_equal(model.f_ica_, np.asarray(section["estimates"]["f-ica"]))
    assert model.benchmark_site_ == int(section["benchmark_client"])
    assert model.channel_scale_spread_ == section["channel_scale_spread"] and model.channel_scale_spread_ >= 1
    assert model.contrast == "logcosh" and model.random_state == result["seed"]
    # The sites sent their means beside their covariances (the refinement's exchange): new data is centred.
    np.testing.assert_array_equal(model.mean_, np.asarray(section["mean"]))
    np.testing.assert_array_equal(model.explained_variance_, np.asarray(section["explained_variance"]))
    assert np.all(np.diff(model.explained_variance_) <= 0)
    assert model.site_mixings_ is None and model.labels_ is None
    X = np.random.default_rng(1).standard_normal((50, model.mixing_.shape[0]))
    np.testing.assert_allclose(model.transform(X), (X - model.mean_) @ np.asarray(section["unmixing"]).T, rtol=0,
                               atol=1e-12)
    np.testing.assert_allclose(model.inverse_transform(model.transform(X)), X, rtol=0, atol=1e-10)


@pytest.mark.slow
def test_from_result_refuses_the_other_algorithm_a_stopped_run_and_non_results(fedgem_run, rfica_run, tmp_path):
    assert _one_line_error(fedica.RFICA.from_result, fedgem_run) == "a result of algorithm 'fedgem', not 'rfica'"
    assert _one_line_error(fedica.FedGEM.from_result, rfica_run) == "a result of algorithm 'rfica', not 'fedgem'"

    # A FedGEM round over the pair budget stops the run: it writes partial_result.json only.
    done, out = _fedica_run(tmp_path / "stopped", "algorithm=fedgem", "scenario.n_clients=5", "baselines=false",
                            "algorithm.upsilon=1.0", "algorithm.max_overlap_pairs=1")
    assert done.returncode == 1 and not (out / "result.json").exists()
    partial = out / "partial_result.json"
    status = json.loads(partial.read_text())["status"]
    assert _one_line_error(fedica.FedGEM.from_result, partial) == (
        f"the partial result of a stopped run ({status}); only a complete result.json holds a fitted model")

    text = tmp_path / "notes.json"
    text.write_text("{not json")
    assert _one_line_error(fedica.FedGEM.from_result, text) == "not a fedica-run result (not JSON)"
    lacking = tmp_path / "lacking.json"
    result = json.loads(fedgem_run.read_text())
    del result["fedgem"]["client_mapping"]
    lacking.write_text(json.dumps(result))
    assert _one_line_error(fedica.FedGEM.from_result, lacking) == "the result lacks fedgem.client_mapping"
