"""One set of defaults: ``fedica-run`` on a user's files with no other override computes what the library computes.

The files are written as users write them (CSV with a header row); the data are scikit-learn's bundled iris
(FedGEM) and Laplace sources mixed over sites (RF-ICA). Nothing here sets a parameter: both sides run their
defaults, which are one declaration (fedica/parameters.py).
"""

import numpy as np
from fedica.scripts.engines import run_inprocess
from fedica.server.app import compose_config
from sklearn.datasets import load_iris

import fedica
from fedica.config import validate_config


def _write_sites(tmp_path, sites, names):
    paths = []
    for g, X in enumerate(sites):
        path = tmp_path / f"site{g}.csv"
        np.savetxt(path, X, delimiter=",", header=",".join(names), comments="")
        paths.append(str(path))
    return paths


def _files_run(algorithm, paths):
    return run_inprocess(validate_config(compose_config([
        f"algorithm={algorithm}", "scenario=files", f"scenario.paths=[{','.join(paths)}]", "engine=inprocess",
        "baselines=false", "log_level=WARNING"])))


def test_fedgem_on_files_without_labels_is_the_librarys_fit(tmp_path):
    iris = load_iris()
    sites = [iris.data[g::3] for g in range(3)]  # files of rows, no label column: each site chooses its K_g
    result = _files_run("fedgem", _write_sites(tmp_path, sites, iris.feature_names))
    model = fedica.FedGEM().fit(sites)
    assert [result["fedgem"]["local_clusters"][str(g)] for g in range(3)] == model.n_local_clusters_.tolist()
    assert result["metrics"]["fedgem"]["super_clusters"] == model.n_clusters_
    np.testing.assert_allclose(np.asarray(result["fedgem"]["global_centroids"]), model.means_, rtol=0, atol=1e-12)


def test_rfica_on_files_is_the_librarys_fit(tmp_path):
    rng = np.random.default_rng(7)
    mixing = rng.standard_normal((4, 4))
    sites = [rng.laplace(size=(1500, 4)) @ mixing.T for _ in range(5)]
    result = _files_run("rfica", _write_sites(tmp_path, sites, ["c0", "c1", "c2", "c3"]))
    model = fedica.RFICA().fit(sites)
    assert model.refinement_  # the library's default refines, and so does the run
    np.testing.assert_allclose(np.asarray(result["rfica"]["estimate"]), model.mixing_, rtol=0, atol=1e-12)
