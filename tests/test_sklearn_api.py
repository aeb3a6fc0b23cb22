"""scikit-learn's API: its own estimator checks, one array with groups, clone, Pipeline and GridSearchCV."""

import warnings

import numpy as np
import pytest
import sklearn
from sklearn.base import clone
from sklearn.datasets import make_blobs
from sklearn.decomposition import PCA, FastICA
from sklearn.mixture import GaussianMixture
from sklearn.model_selection import GridSearchCV, GroupKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

import fedica
from fedica.evaluation.ica import ica_error


@pytest.fixture(autouse=True)
def quiet():
    # scikit-learn's checks fit on noise that no mixture or ICA explains: the fits say so, as they should.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


@parametrize_with_checks([fedica.FedGEM(), fedica.FedGEM(covariance_type="auto"), fedica.RFICA()])
def test_scikit_learns_own_estimator_checks(estimator, check):
    check(estimator)


def _blob_rows(seed=0):
    X, truth = make_blobs(n_samples=900, centers=3, cluster_std=0.6, center_box=(-8, 8), random_state=seed)
    groups = np.random.default_rng(seed).choice(["site a", "site b", "site c"], size=X.shape[0])
    return X, truth, groups


def test_fedgem_one_array_with_groups_is_the_federation_of_its_sites():
    X, _, groups = _blob_rows()
    sites = [X[groups == g] for g in ("site a", "site b", "site c")]  # the sites in their sorted order
    by_rows = fedica.FedGEM(random_state=0).fit(X, groups=groups)
    by_sites = fedica.FedGEM(random_state=0).fit(sites)
    np.testing.assert_array_equal(by_rows.means_, by_sites.means_)
    assert isinstance(by_rows.labels_, np.ndarray) and by_rows.labels_.shape == (X.shape[0],)
    for g, name in enumerate(("site a", "site b", "site c")):
        np.testing.assert_array_equal(by_rows.labels_[groups == name], by_sites.labels_[g])
    np.testing.assert_array_equal(fedica.FedGEM(random_state=0).fit_predict(X, groups=groups), by_rows.labels_)
    assert by_rows.n_features_in_ == 2


def test_one_array_without_groups_is_a_federation_of_one():
    X, truth, _ = _blob_rows(1)
    model = fedica.FedGEM(random_state=0).fit(X)
    assert model.n_clusters_ == 3 and len(model.n_local_clusters_) == 1
    assert sklearn.metrics.adjusted_rand_score(truth, model.labels_) > 0.99
    rng = np.random.default_rng(0)
    sources = rng.laplace(size=(4000, 3))
    mixing = rng.standard_normal((3, 3))
    ica = fedica.RFICA(random_state=0).fit(sources @ mixing.T)
    assert ica.n_features_in_ == 3 and ica.site_mixings_.shape == (1, 3, 3)
    # As accurate as scikit-learn's FastICA (the same contrast) on the same rows: .054 and .054.
    central = FastICA(fun="logcosh", whiten="unit-variance", max_iter=1000, random_state=0).fit(sources @ mixing.T)
    truth = mixing / np.linalg.norm(mixing, axis=0)
    assert ica_error(ica.mixing_, truth) <= 1.01 * ica_error(central.mixing_ / np.linalg.norm(central.mixing_, axis=0), truth)


def test_the_federations_list_form_keeps_its_positional_local_counts():
    X, _, groups = _blob_rows(2)
    sites = [X[groups == g] for g in ("site a", "site b", "site c")]
    positional = fedica.FedGEM(random_state=0).fit(sites, 3)
    keyword = fedica.FedGEM(random_state=0).fit(sites, n_local_clusters=3)
    assert positional.n_local_clusters_.tolist() == keyword.n_local_clusters_.tolist() == [3, 3, 3]
    np.testing.assert_array_equal(positional.means_, keyword.means_)
    with pytest.raises(ValueError, match="^groups: give either one array X with groups, or a list of sites without$"):
        fedica.FedGEM().fit(sites, groups=[0, 1, 2])
    with pytest.raises(ValueError, match=r"^groups must hold one site label per row of X \(900\), got shape \(3,\)$"):
        fedica.FedGEM().fit(X, groups=[0, 1, 2])


def test_rfica_one_array_with_groups_is_the_federation_of_its_sites():
    rng = np.random.default_rng(3)
    mixing = rng.standard_normal((4, 4))
    X = rng.laplace(size=(3000, 4)) @ mixing.T
    groups = np.repeat([2, 0, 1], 1000)
    by_rows = fedica.RFICA(random_state=0).fit(X, groups=groups)
    by_sites = fedica.RFICA(random_state=0).fit([X[groups == g] for g in (0, 1, 2)])
    np.testing.assert_array_equal(by_rows.mixing_, by_sites.mixing_)
    np.testing.assert_allclose(by_rows.transform(X), by_sites.transform(X), rtol=0, atol=1e-12)


def test_clone_pipeline_and_grid_search_with_groups_routed():
    X, truth, groups = _blob_rows(4)
    model = fedica.FedGEM(random_state=0, upsilon=1.0)
    copy = clone(model)
    assert copy is not model and copy.get_params() == model.get_params()

    pipeline = make_pipeline(StandardScaler(), fedica.FedGEM(random_state=0)).fit(X)
    central = make_pipeline(StandardScaler(), GaussianMixture(3, covariance_type="spherical", random_state=0)).fit(X)
    ari = sklearn.metrics.adjusted_rand_score
    assert ari(truth, pipeline.predict(X)) >= ari(truth, central.predict(X)) - 0.03
    ica = make_pipeline(fedica.RFICA(random_state=0), PCA(n_components=2)).fit(X)
    assert ica.transform(X).shape == (X.shape[0], 2)

    with sklearn.config_context(enable_metadata_routing=True):
        search = GridSearchCV(fedica.FedGEM(random_state=0).set_fit_request(groups=True),
                              {"covariance_type": ["spherical", "identity"]}, cv=GroupKFold(n_splits=3))
        search.fit(X, groups=groups)
        # Each training fold is the federation of two sites: the refit on all three sees three.
        assert len(search.best_estimator_.n_local_clusters_) == 3
        assert np.isfinite(search.cv_results_["mean_test_score"]).all()
        routed = make_pipeline(StandardScaler(), fedica.FedGEM(random_state=0).set_fit_request(groups=True))
        routed.fit(X, groups=groups)
        assert len(routed[-1].n_local_clusters_) == 3
