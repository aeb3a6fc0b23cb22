"""The library API (fedica.RFICA, fedica.FedGEM): scikit-learn conventions, and the same numbers as the federated run."""

import copy
import subprocess
import sys
import warnings

import numpy as np
import pytest
from fedica.scripts.engines import run_inprocess
from fedica.server.app import compose_config
from sklearn.base import clone

import fedica
from fedica.data.ica_paper import ica_client_data, ica_true_mixing
from fedica.data.scenarios import scenario_client_data
from fedica.evaluation.ica import ica_error

BLOBS = ["algorithm=fedgem", "scenario=blobs", "scenario.n_clients=5", "scenario.n_clusters=6", "scenario.r_min=4",
         "engine=inprocess", "baselines=false", "seed=3"]
ICA = ["scenario.n_clients=8", "scenario.r=4", "scenario.n_normal=2000", "scenario.n_corrupt=100",
       "scenario.corrupt_ratio=0.25", "engine=inprocess", "seed=5"]


@pytest.mark.slow
def test_import_fedica_imports_no_flower_hydra_or_ray():
    # Nor any experiment room: only what the estimators need (no config, scenarios, comparators, attacks).
    code = ("import sys, fedica; fedica.FedGEM; fedica.RFICA; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'flwr', 'hydra', 'omegaconf', 'ray'})); "
            "print(sorted({'.'.join(m.split('.')[:2]) for m in sys.modules if m.startswith('fedica.')}))")
    frameworks, rooms = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                       check=True).stdout.splitlines()
    assert frameworks == "[]"
    loaded = set(eval(rooms))  # noqa: S307 - our own subprocess's printed list
    assert not loaded & {"fedica.config", "fedica.data", "fedica.evaluation", "fedica.attacks",
                         "fedica.tasks", "fedica.results"}, loaded


def _blobs_sites(cfg):
    scenario = cfg["scenario"]
    return [scenario_client_data(scenario, p, cfg["seed"]) for p in range(scenario["n_clients"])]


@pytest.mark.parametrize("extra", [[], ["algorithm.upsilon=1.0"], ["algorithm.participation=0.6", "scenario.n_clients=8"],
                                   ["algorithm.covariance_type=spherical"]])
def test_fedgem_fit_equals_the_inprocess_federated_run(extra):
    cfg = compose_config(BLOBS + extra)
    result = run_inprocess(cfg)
    sites = _blobs_sites(cfg)
    alg = cfg["algorithm"]
    model = fedica.FedGEM(rounds=alg["rounds"], upsilon=alg["upsilon"], upsilon_grid=alg["upsilon_grid"],
                          participation=alg["participation"], covariance_type=alg["covariance_type"],
                          random_state=cfg["seed"])
    model.fit([s.X_train for s in sites], [s.n_components for s in sites])
    np.testing.assert_allclose(model.means_, np.asarray(result["fedgem"]["global_centroids"]), rtol=0, atol=1e-12)
    assert model.n_clusters_ == result["metrics"]["fedgem"]["super_clusters"]
    assert model.upsilon_ == result["fedgem"]["upsilon"]
    for g, mapping in result["fedgem"]["client_mapping"].items():
        assert model.site_mapping_[int(g)].tolist() == mapping
    for ours, theirs in zip(model.history_, result["history"]):
        assert ours["super_clusters"] == theirs["super_clusters"]
        assert ours["mean_radius"] == pytest.approx(theirs["mean_radius"], abs=1e-12)


def test_fedgem_estimator_conventions_and_predict():
    cfg = compose_config(BLOBS)
    sites = _blobs_sites(cfg)
    model = fedica.FedGEM(upsilon=1.0, random_state=0)
    assert model.fit([s.X_train for s in sites], 3) is model
    assert clone(model).get_params() == model.get_params()
    assert model.means_.shape == (model.n_clusters_, 2)
    for g, site in enumerate(sites):
        assert model.labels_[g].shape == (site.X_train.shape[0],)
        np.testing.assert_array_equal(model.predict(site.X_train, site=g), model.labels_[g])
    assert set(np.unique(model.predict(sites[0].X_test))) <= set(range(model.n_clusters_))
    with pytest.raises(ValueError, match="features"):
        model.fit([np.zeros((10, 2)), np.zeros((10, 3))], 2)
    with pytest.raises(ValueError, match="^X has 5 features, but FedGEM is expecting 2 features as input"):
        model.predict(np.zeros((4, 5)))


def test_fedgem_estimates_each_sites_k_when_not_told():
    cfg = compose_config(BLOBS + ["scenario.r_min=8"])
    sites = _blobs_sites(cfg)
    model = fedica.FedGEM(upsilon=1.0, random_state=1).fit([s.X_train for s in sites])
    assert model.n_local_clusters_.tolist() == [s.n_components for s in sites]
    assert model.n_clusters_ == 6


def test_fedgem_tunes_over_the_upsilons_within_the_pair_budget_and_stops_beyond_it():
    from fedica.protocol import OverBudget

    sites = [s.X_train for s in _blobs_sites(compose_config(BLOBS))]
    spheres = {"covariance_type": "spherical", "random_state": 0}  # the spheres' selection, which the budget bounds
    model = fedica.FedGEM(max_overlap_pairs=40, **spheres).fit(sites, 3)
    skipped = model.tuning_["skipped"]
    assert skipped and all("more than max_overlap_pairs=40" in why for why in skipped.values())
    assert set(map(float, skipped)) | set(model.tuning_["grid"]) == set(model.upsilon_grid)
    assert set(map(float, skipped)).isdisjoint(model.tuning_["grid"])
    # The candidates the budget leaves out do not win without it: the same partition (the library's evidence rule
    # joins one site's over-split here, K_hat 5 and a training ARI of .715; the strict rule's 6 scores .543).
    unbudgeted = fedica.FedGEM(**spheres).fit(sites, 3)
    assert unbudgeted.n_clusters_ == model.n_clusters_ == 5
    assert all(np.array_equal(a, b) for a, b in zip(unbudgeted.labels_, model.labels_))
    with pytest.raises(OverBudget, match="FedGEM round 1: about .* more than max_overlap_pairs=5"):
        fedica.FedGEM(max_overlap_pairs=5, **spheres).fit(sites, 3)


def test_rfica_fit_equals_the_inprocess_federated_run():
    cfg = compose_config(ICA)
    result = run_inprocess(cfg)
    sc = cfg["scenario"]
    sites = [ica_client_data(p, n_clients=sc["n_clients"], r=sc["r"], corrupt_ratio=sc["corrupt_ratio"],
                             n_normal=sc["n_normal"], n_corrupt=sc["n_corrupt"], sparsity=sc["sparsity"],
                             orthogonal=sc["orthogonal"], seed=cfg["seed"]).T for p in range(sc["n_clients"])]
    # The run's algorithm settings: the library's defaults (one set for both).
    defaults = fedica.RFICA().get_params()
    assert {k: v for k, v in cfg["algorithm"].items() if k != "name"} == {k: defaults[k] for k in cfg["algorithm"]
                                                                          if k != "name"}
    settings = {k: v for k, v in cfg["algorithm"].items() if k != "name"}
    model = fedica.RFICA(random_state=cfg["seed"], **settings).fit(sites)
    np.testing.assert_allclose(model.mixing_, np.asarray(result["rfica"]["estimate"]), rtol=0, atol=1e-12)
    np.testing.assert_allclose(model.f_ica_, np.asarray(result["rfica"]["estimates"]["f-ica"]), rtol=0, atol=1e-12)
    assert ica_error(model.mixing_, ica_true_mixing(r=sc["r"], orthogonal=True, seed=cfg["seed"])) == pytest.approx(
        result["metrics"]["rf-ica"]["error"], abs=1e-12)
    # aggregate() on the sites' own estimates is the server step alone: the one-shot estimate, before the refinement.
    again = fedica.RFICA(random_state=cfg["seed"], **settings).aggregate(model.site_mixings_, [s.shape[0] for s in sites],
                                                                        model.site_column_variances_)
    # The same columns; the fit's in the order of the variance they explain (its sites sent covariances).
    order = [int(np.argmax(np.abs(column @ again.mixing_))) for column in model.one_shot_mixing_.T]
    np.testing.assert_allclose(again.mixing_[:, order], model.one_shot_mixing_, rtol=0, atol=1e-12)
    assert model.refinement_ and np.abs(model.mixing_ - model.one_shot_mixing_).max() > 1e-6


def test_rfica_reports_every_site_s_local_ica():
    rng = np.random.default_rng(1)
    mixing = rng.standard_normal((3, 3))
    sites = [rng.laplace(size=(2000, 3)) @ mixing.T for _ in range(4)]
    for solver in ("fastica", "picard"):
        model = fedica.RFICA(local_solver=solver, random_state=0).fit(sites)
        assert model.site_converged_.dtype == bool and model.site_converged_.tolist() == [True] * 4
        assert model.site_iterations_.shape == (4,) and np.all(model.site_iterations_ >= 1)
        assert model.n_components_ == 3 and model.whitening_ is None
        assert ica_error(model.mixing_, mixing / np.linalg.norm(mixing, axis=0)) < 0.1
    # The server step alone hears nothing of the sites' solvers.
    again = fedica.RFICA(random_state=0).aggregate(model.site_mixings_)
    assert again.site_converged_ is None and again.site_iterations_ is None


def test_rfica_transform_recovers_the_sources():
    rng = np.random.default_rng(0)
    mixing = np.linalg.qr(rng.standard_normal((3, 3)))[0]
    sources = [rng.laplace(size=(4000, 3)) for _ in range(5)]
    model = fedica.RFICA(random_state=0).fit([s @ mixing.T for s in sources])
    recovered = model.transform(sources[0] @ mixing.T)
    correlation = np.abs(np.corrcoef(recovered.T, sources[0].T)[:3, 3:])
    assert np.all(correlation.max(axis=1) > 0.99)
    np.testing.assert_allclose(model.components_ @ model.mixing_, np.eye(3), atol=1e-10)


# ---------------------------------------------------------------- unfitted calls and bad arguments


def test_unfitted_calls_raise_sklearns_not_fitted_error():
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        fedica.FedGEM().predict(np.zeros((3, 2)))
    with pytest.raises(NotFittedError):
        fedica.FedGEM().predict(np.zeros((3, 2)), site=0)
    with pytest.raises(NotFittedError):
        fedica.RFICA().transform(np.zeros((3, 2)))


def test_predict_names_the_valid_sites():
    sites = [s.X_train for s in _blobs_sites(compose_config(BLOBS))]
    model = fedica.FedGEM(upsilon=1.0, random_state=0).fit(sites, 3)
    for site, kind in ((7, ValueError), (-1, ValueError), ("0", TypeError), (1.0, TypeError)):
        with pytest.raises(kind) as info:
            model.predict(sites[0], site=site)
        assert str(info.value) == f"site={site!r}: must be None or a site of the fit with a consensus model: 0..4"
    np.testing.assert_array_equal(model.predict(sites[4], site=np.int64(4)), model.labels_[4])


@pytest.mark.parametrize("kwargs, kind, message", [
    ({"upsilon_criterion": "silhoutte"}, ValueError, "upsilon_criterion='silhoutte': must be one of likelihood, silhouette"),
    ({"upsilon": "Auto"}, ValueError, "upsilon='Auto': must be a number in (0, 1000000] or auto"),
    ({"rounds": "ten"}, TypeError, "rounds='ten': must be an integer in [0, 10000]"),
])
def test_fedgem_refuses_todays_silent_or_late_mistakes_in_one_line(kwargs, kind, message):
    sites = [s.X_train for s in _blobs_sites(compose_config(BLOBS))]
    with pytest.raises(kind) as info:
        fedica.FedGEM(**kwargs).fit(sites, 3)
    assert type(info.value) is kind and str(info.value) == message


def test_fedgem_refuses_n_local_clusters_of_the_wrong_length():
    sites = [s.X_train for s in _blobs_sites(compose_config(BLOBS))]
    with pytest.raises(ValueError, match=r"^n_local_clusters=\[3, 3\]: must be one int or one per site \(5 sites\)"):
        fedica.FedGEM().fit(sites, [3, 3])


# ---------------------------------------------------------------- the global mixture and the inverse transform


@pytest.fixture(scope="module")
def fitted_fedgem():
    sites = [s.X_train for s in _blobs_sites(compose_config(BLOBS))]
    # The spheres' isotropic mixture (a family's is tests/fedgem/test_families.py's), in the data's units, where
    # covariance_ is (tests/fedgem/test_standardisation.py checks the standardised density).
    return sites, fedica.FedGEM(covariance_type="spherical", standardize=None, random_state=0).fit(sites, 3)


def test_fedgem_weights_and_variance_are_the_sites_labelled_points_shares_and_spread(fitted_fedgem):
    sites, model = fitted_fedgem
    points, labels = np.vstack(sites), np.concatenate(model.labels_)
    counts = np.bincount(labels, minlength=model.n_clusters_)
    assert counts.min() >= 1  # no floor at work here: the weights are the plain shares
    np.testing.assert_allclose(model.weights_, counts / counts.sum(), rtol=1e-15)
    residuals = points - model.means_[labels]
    assert isinstance(model.covariance_, float)
    assert model.covariance_ == pytest.approx(np.mean(residuals ** 2), rel=1e-12)


def test_fedgem_global_mixture_floors_empty_clusters_and_a_degenerate_spread():
    from fedica.fedgem.estimator import _global_mixture

    means = np.array([[0.0, 0.0], [1.0, 1.0], [5.0, 5.0]])
    points = np.repeat(means[:2], 3, axis=0)  # every point on its centre: no spread; cluster 2 empty
    weights, variance = _global_mixture([points, points], [np.repeat([0, 1], 3)] * 2, means)
    np.testing.assert_allclose(weights, np.array([6, 6, 1]) / 13)
    assert variance == pytest.approx(1e-6 * points.var(axis=0).mean())


def test_fedgem_predict_proba_and_score_samples_are_the_isotropic_mixtures_density(fitted_fedgem):
    from scipy.stats import multivariate_normal

    sites, model = fitted_fedgem
    X = np.vstack([site[:40] for site in sites])
    d = X.shape[1]
    joint = np.column_stack([w * multivariate_normal(mean=c, cov=model.covariance_ * np.eye(d)).pdf(X)
                             for w, c in zip(model.weights_, model.means_)])
    proba = model.predict_proba(X)
    assert proba.shape == (X.shape[0], model.n_clusters_)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(proba, joint / joint.sum(axis=1, keepdims=True), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(model.score_samples(X), np.log(joint.sum(axis=1)), rtol=1e-12)
    assert model.score(X) == pytest.approx(np.log(joint.sum(axis=1)).mean(), rel=1e-12)


def test_fedgem_predict_is_the_most_probable_cluster_when_the_weights_are_equal(fitted_fedgem):
    sites, model = fitted_fedgem
    X = np.vstack(sites + [np.random.default_rng(2).uniform(-15, 15, size=(500, 2))])
    equal = copy.copy(model)  # the module's fitted model stays as it is
    equal.weights_ = np.full(model.n_clusters_, 1.0 / model.n_clusters_)
    np.testing.assert_array_equal(equal.predict(X), equal.predict_proba(X).argmax(axis=1))


def test_fedgem_fit_predict_returns_the_fits_labels(fitted_fedgem):
    sites, model = fitted_fedgem
    labels = fedica.FedGEM(covariance_type="spherical", standardize=None, random_state=0).fit_predict(sites, 3)
    assert isinstance(labels, list) and len(labels) == len(sites)
    for ours, theirs in zip(labels, model.labels_):
        np.testing.assert_array_equal(ours, theirs)


def test_rfica_inverse_transform_undoes_transform():
    rng = np.random.default_rng(3)
    mixing = rng.standard_normal((4, 4))
    sites = [rng.laplace(size=(3000, 4)) @ mixing.T + 10.0 for _ in range(5)]
    fitted = fedica.RFICA(random_state=0).fit(sites)
    aggregated = fedica.RFICA(random_state=0).aggregate(fitted.site_mixings_)
    for model in (fitted, aggregated):
        X = sites[2]
        np.testing.assert_allclose(model.inverse_transform(model.transform(X)), X, rtol=0, atol=1e-10)
        S = rng.standard_normal((7, 4))
        np.testing.assert_allclose(model.inverse_transform(S), S @ model.mixing_.T + model.mean_, rtol=0, atol=0)
    with pytest.raises(ValueError) as info:
        fitted.inverse_transform(np.zeros((5, 3)))
    assert str(info.value) == "S must have shape (n_samples, 4), got (5, 3)"


def test_the_new_methods_refuse_unfitted_estimators_and_wrong_widths(fitted_fedgem):
    from sklearn.exceptions import NotFittedError

    X = np.zeros((3, 2))
    for method in ("predict_proba", "score_samples", "score"):
        with pytest.raises(NotFittedError):
            getattr(fedica.FedGEM(), method)(X)
        with pytest.raises(ValueError) as info:
            getattr(fitted_fedgem[1], method)(np.zeros((4, 5)))
        assert str(info.value) == "X has 5 features, but FedGEM is expecting 2 features as input."  # scikit-learn's
    with pytest.raises(NotFittedError):
        fedica.RFICA().inverse_transform(X)


@pytest.mark.parametrize("estimator", [lambda: fedica.FedGEM(rounds=2, upsilon=1.0), lambda: fedica.RFICA()])
def test_sites_given_as_dataframes_must_name_the_same_columns_in_the_same_order(estimator):
    # A DataFrame is read by position: two exports of one table in another column order put another feature in
    # each place. scikit-learn's wine, split over three sites, one of them with its columns reversed.
    from sklearn.datasets import load_wine

    frame = load_wine(as_frame=True).data
    sites = [frame.iloc[g::3] for g in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # wine's units, as shipped: the scale check's line
        estimator().fit(sites)  # the same columns everywhere: fitted as before
    reordered = [sites[0], sites[1][list(frame.columns[::-1])], sites[2]]
    with pytest.raises(ValueError, match=r"^site 1's columns differ from site 0's \(the same columns in another order "
                                         r"\(first difference: position 0: 'proline' for 'alcohol'\)\)"):
        estimator().fit(reordered)
    renamed = [sites[0], sites[1], sites[2].rename(columns={"hue": "hue_ratio"})]
    with pytest.raises(ValueError, match=r"only here: hue_ratio; missing here: hue"):
        estimator().fit(renamed)


@pytest.mark.parametrize("estimator, apply", [
    (lambda: fedica.FedGEM(rounds=2, upsilon=1.0), lambda model, X: model.predict(X)),
    (lambda: fedica.FedGEM(rounds=2, upsilon=1.0), lambda model, X: model.score_samples(X)),
    (lambda: fedica.RFICA(), lambda model, X: model.transform(X)),
])
def test_a_fit_on_dataframes_keeps_their_columns_and_new_rows_must_name_them_in_that_order(estimator, apply, tmp_path):
    from sklearn.datasets import load_wine

    frame = load_wine(as_frame=True).data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        model = estimator().fit([frame.iloc[g::3] for g in range(3)])
    assert model.feature_names_in_ == tuple(frame.columns)
    np.testing.assert_array_equal(apply(model, frame), apply(model, frame.to_numpy()))  # arrays: by position
    with pytest.raises(ValueError, match=r"^X's columns differ from the fit's \(the same columns in another order"):
        apply(model, frame[list(frame.columns[::-1])])
    loaded = type(model).load(model.save(tmp_path / "model.npz"))
    assert loaded.feature_names_in_ == model.feature_names_in_
    with pytest.raises(ValueError, match=r"^X's columns differ"):
        apply(loaded, frame[list(frame.columns[::-1])])
    arrays = estimator()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        arrays.fit([frame.iloc[g::3].to_numpy() for g in range(3)])
    assert arrays.feature_names_in_ is None


@pytest.mark.parametrize("estimator", [fedica.FedGEM, fedica.RFICA])
@pytest.mark.parametrize("case, reason", [
    ("text", "site 1 cannot be read as numbers"),
    ("repeated", "site 1: all its 40 rows are the same row"),
    ("mapping", "the sites are given as a mapping of 3 entries: give a list"),
    ("one-dimensional", r"site 1 must be a 2-D array \(n_samples, n_features\), got shape \(40,\)"),
])
def test_a_federation_the_library_cannot_read_is_one_line_naming_the_site(estimator, case, reason):
    # Issue 44: a text cell, a site of one repeated row and a dict of sites gave errors that named no site (or a fit).
    rng = np.random.default_rng(0)
    sites = [rng.normal(size=(40, 2)) for _ in range(3)]
    if case == "text":
        sites[1] = sites[1].astype(object)
        sites[1][5, 1] = "n/a"
    elif case == "repeated":
        sites[1] = np.ones((40, 2))
    elif case == "one-dimensional":
        sites[1] = sites[1][:, 0]
    federation = dict(zip("abc", sites)) if case == "mapping" else sites
    with pytest.raises(ValueError, match=reason) as err:
        estimator(random_state=0).fit(federation)
    assert "\n" not in str(err.value)
