"""Federated standardisation (``standardize="federated"``): a result that no feature's unit decides.

The sites send their columns' means and standard deviations, the server takes medians over the
sites, and every site standardises by them before anything else. Tested on scikit-learn's wine
(features from hue near 1 to proline in the hundreds), as a user brings it: one unit per feature,
split over sites, through the library, a user's Flower app and fedica-run's files scenario.
"""

import json
import warnings

import numpy as np
import pytest
from fedica.clients import make_client_app
from fedica.server import FedGEMStrategy
from fedica.server.inprocess import InProcessGrid
from sklearn.datasets import load_wine
from sklearn.metrics import adjusted_rand_score

from fedica import FedGEM
from fedica.data.common import ClientData
from fedica.data.scenarios import scenario_client_data
from fedica.fedgem.coordinator import FedGEMServer, FedGEMSettings
from fedica.fedgem.standardisation import (
    STANDARDISATION_KEY, decode_standardisation, encode_standardisation, federated_scale, site_moments,
)
from fedica.protocol import GEM_MOMENTS, ArraySite, Reply
from fedica.tasks import CLIENT_TASKS

# Every feature in its own unit: 1e-3 to 1e3, and moved by an origin of its own.
WINE_FEATURES = 13
UNITS = np.logspace(-3, 3, WINE_FEATURES)
ORIGINS = np.linspace(-50.0, 50.0, WINE_FEATURES)


def wine_sites(n_sites=4, seed=0):
    X, y = load_wine(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(X))
    parts = np.array_split(order, n_sites)
    return [X[p] for p in parts], np.concatenate([y[p] for p in parts])


def quiet_fit(sites, **params):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the sites' K_g bounds and the raw data's scale check
        return FedGEM(random_state=0, **params).fit(sites)


def test_the_medians_equal_the_pooled_moments_on_sites_of_one_distribution_and_no_minority_moves_them():
    rng = np.random.default_rng(0)
    scales, centres = np.array([1e-3, 1.0, 1e4]), np.array([5.0, -2.0, 300.0])
    sites = [centres + scales * rng.normal(size=(20_000, 3)) for _ in range(5)]
    location, scale = federated_scale(*zip(*map(site_moments, sites)))
    pooled = np.vstack(sites)
    assert np.all(np.abs(location - pooled.mean(axis=0)) <= 0.02 * scales)
    np.testing.assert_allclose(scale, pooled.std(axis=0), rtol=0.02)
    # Two of five sites claiming absurd moments leave both within the honest sites' range.
    honest = [site_moments(X) for X in sites[:3]]
    forged = [(np.full(3, 1e9), np.full(3, 1e9)), (np.full(3, -1e9), np.zeros(3))]
    location_h, scale_h = federated_scale(*zip(*(honest + forged)))
    honest_means = np.vstack([m for m, _ in honest])
    assert np.all((honest_means.min(axis=0) <= location_h) & (location_h <= honest_means.max(axis=0)))
    np.testing.assert_allclose(scale_h, scale, rtol=0.05)
    # A feature constant at every site keeps its unit.
    assert federated_scale([np.array([2.0])] * 3, [np.zeros(1)] * 3)[1][0] == 1.0


def test_every_features_unit_and_origin_leave_k_hat_and_the_labels_exactly_as_they_were():
    sites, y = wine_sites()
    plain = quiet_fit(sites, standardize="federated")
    moved = quiet_fit([X * UNITS + ORIGINS for X in sites], standardize="federated")
    assert plain.n_clusters_ == moved.n_clusters_
    for ours, theirs in zip(plain.labels_, moved.labels_):
        np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(plain.n_local_clusters_, moved.n_local_clusters_)
    # The centres come back in each run's own units; new points are labelled and scored in them.
    np.testing.assert_allclose(moved.means_, plain.means_ * UNITS + ORIGINS, rtol=1e-9, atol=1e-9)
    X_all = np.vstack(sites)
    np.testing.assert_array_equal(plain.predict(X_all), moved.predict(X_all * UNITS + ORIGINS))
    # A density in the data's units: the Jacobian of each unit is in it.
    np.testing.assert_allclose(moved.score_samples(X_all * UNITS + ORIGINS),
                               plain.score_samples(X_all) - np.log(UNITS).sum(), rtol=1e-9)
    # Without it the units decide: wine as shipped and in these units do not agree.
    assert (quiet_fit(sites, standardize=None).n_clusters_
            != quiet_fit([X * UNITS + ORIGINS for X in sites], standardize=None).n_clusters_)
    # It is the default (issue 44).
    assert quiet_fit(sites).n_clusters_ == plain.n_clusters_


def test_on_wine_as_shipped_it_finds_the_three_cultivars_where_the_shipped_units_do_not():
    # The spheres, whose balls the shipped units stretch (the families start from them).
    sites, y = wine_sites()
    with pytest.warns(UserWarning, match="standardize='federated'"):  # the scale check names the remedy
        FedGEM(standardize=None, covariance_type="spherical", random_state=0).fit(sites)
    raw = quiet_fit(sites, standardize=None, covariance_type="spherical")
    fitted = quiet_fit(sites, standardize="federated", covariance_type="spherical")
    raw_ari = adjusted_rand_score(y, np.concatenate(raw.labels_))
    ari = adjusted_rand_score(y, np.concatenate(fitted.labels_))
    assert fitted.n_clusters_ in (3, 4) and raw.n_clusters_ >= 6
    assert ari > 0.85 > 0.3 > raw_ari
    assert fitted.feature_scale_spread_ < 2  # the sites report their standardised points: no warning
    assert fitted.feature_location_.shape == fitted.feature_scale_.shape == (WINE_FEATURES,)


def test_a_saved_estimator_keeps_its_standardisation(tmp_path):
    sites, _ = wine_sites()
    fitted = quiet_fit(sites, standardize="federated")
    path = fitted.save(tmp_path / "wine.npz")
    loaded = FedGEM.load(path)
    X_all = np.vstack(sites)
    np.testing.assert_array_equal(loaded.predict(X_all), fitted.predict(X_all))
    np.testing.assert_array_equal(loaded.score_samples(X_all), fitted.score_samples(X_all))


def test_a_private_fit_refuses_it_in_one_line():
    sites, _ = wine_sites()
    with pytest.raises(ValueError, match=r"standardize.*without noise"):
        FedGEM(standardize="federated", covariance_type="identity", dp_epsilon=1.0, dp_clip=5.0).fit(
            sites, n_local_clusters=3)


def moments_protocol(replies):
    """The server's first stage, with the given (arrays) replies of four sites."""
    server = FedGEMServer(FedGEMSettings(standardize="federated", min_clients=2))
    protocol = server.run()
    request = next(protocol)
    assert request.task == GEM_MOMENTS
    init = protocol.send([Reply(p, arrays, {"n-points": 10}) for p, arrays in replies.items()])
    return server, init


@pytest.mark.parametrize("arrays, reason", [
    ({"moments": np.array([[0.0, 1.0], [-1.0, 1.0]])}, "negative standard deviation"),
    ({"moments": np.array([[0.0, np.inf], [1.0, 1.0]])}, "non-finite"),
    ({"moments": np.zeros((2, 3))}, "shape"),
    ({}, "missing array 'moments'"),
])
def test_a_malformed_moments_reply_is_left_out_with_its_reason(arrays, reason):
    honest = {p: {"moments": np.array([[p, 2.0 * p], [1.0, 10.0]])} for p in range(3)}
    server, init = moments_protocol({**honest, 3: arrays})
    assert [r["client"] for r in server.rejected] == [3]
    assert reason in server.rejected[0]["reason"]
    np.testing.assert_array_equal(server.feature_location, [1.0, 2.0])
    location, scale = decode_standardisation(init.values[STANDARDISATION_KEY], 2)
    np.testing.assert_array_equal(location, server.feature_location)
    np.testing.assert_array_equal(scale, server.feature_scale)


@pytest.mark.parametrize("text", ["not json", json.dumps({"location": [0.0]}), json.dumps({"location": [0.0, 1.0],
                                  "scale": [1.0, 0.0]}), json.dumps({"location": [0.0], "scale": [1.0]})])
def test_a_site_refuses_a_standardisation_it_cannot_apply(text):
    site = ArraySite(ClientData(np.ones((5, 2)), None, np.ones((0, 2)), None, 1), 0)
    with pytest.raises(ValueError, match=STANDARDISATION_KEY):
        CLIENT_TASKS.answer("fedgem_init", site, {}, {STANDARDISATION_KEY: text, "seed": 0, "n-init": 1})


def test_the_encoding_gives_back_every_bit():
    values = np.random.default_rng(1).normal(size=7) * np.logspace(-300, 300, 7)
    location, scale = decode_standardisation(encode_standardisation(values, np.abs(values)), 7)
    np.testing.assert_array_equal(location, values)
    np.testing.assert_array_equal(scale, np.abs(values))


def test_a_users_flower_app_choosing_its_k_g_gives_the_librarys_result():
    """make_client_app (each site choosing K_g on the standardised points) with FedGEMStrategy, as fedica.FedGEM."""
    sites, _ = wine_sites()
    moved = [X * UNITS + ORIGINS for X in sites]
    grid = InProcessGrid(make_client_app(lambda context: moved[int(context.node_config["partition-id"])]),
                         [{"partition-id": g, "num-partitions": 4} for g in range(4)])
    strategy = FedGEMStrategy(standardize="federated", min_available_nodes=4, min_clients=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        strategy.start(grid=grid)
    library = quiet_fit(moved, standardize="federated")
    assert strategy.n_clusters_ == library.n_clusters_
    np.testing.assert_allclose(strategy.means_, library.means_, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(strategy.feature_scale_, library.feature_scale_)
    assert [m.n_components for _, m in sorted(strategy.server.models.items())] == list(library.n_local_clusters_)


def test_a_files_site_chooses_its_k_g_and_draws_its_held_out_rows_on_the_standardised_points(tmp_path):
    X, y = load_wine(return_X_y=True)
    path = tmp_path / "site.csv"
    np.savetxt(path, np.c_[X * UNITS, y], delimiter=",", fmt="%.17g")
    scenario = {"name": "files", "paths": [str(path)], "label_column": X.shape[1], "n_components": "auto",
                "test_fraction": 0.3}
    location, scale = federated_scale([X.mean(axis=0) * UNITS], [X.std(axis=0) * UNITS])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        raw = scenario_client_data(scenario, 0, 0)
        standardised = scenario_client_data(scenario, 0, 0, encode_standardisation(location, scale))
    np.testing.assert_array_equal(standardised.y_test, raw.y_test)  # the same rows held out
    np.testing.assert_allclose(standardised.X_train.std(axis=0), 1.0, rtol=0.1)
    assert raw.n_components != standardised.n_components  # chosen on the points the site fits


def test_a_quarter_of_the_sites_skewing_their_moments_changes_neither_k_hat_nor_the_clusters():
    """``skewed_moments``: hostile sites that know the medians all claim the first feature's deviation a million
    times smaller and every other's a million times larger; their one vote each moves no median far."""
    from fedica.config import validate_config
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    def run(*overrides):
        return run_inprocess(validate_config(compose_config([
            "algorithm=fedgem_paper", "scenario=sklearn_real", "scenario.dataset=wine", "scenario.n_clients=4",
            "engine=inprocess", "baselines=false", "algorithm.standardize=federated", *overrides])))

    honest, attacked = run(), run("attack=skewed_moments", "attack.fraction=0.25")
    assert attacked["fedgem"]["hostile_clients"] == [2]
    # Each median moves at most to the next honest site's value (a million-fold skew asked): within 2x here.
    ratio = np.asarray(attacked["fedgem"]["feature_scale"]) / np.asarray(honest["fedgem"]["feature_scale"])
    assert np.all((0.5 < ratio) & (ratio < 2.0))
    assert attacked["metrics"]["fedgem"]["super_clusters"] == honest["metrics"]["fedgem"]["super_clusters"]
    # The attack touches the moments alone (its sites label their points honestly): every site's ARI compares.
    assert attacked["metrics"]["fedgem"]["global_ari"] > honest["metrics"]["fedgem"]["global_ari"] - 0.05


@pytest.mark.parametrize("covariance_type", ["spherical", "auto"])
@pytest.mark.parametrize("dataset", ["iris", "wine", "penguins", "crabs", "faithful",
                                     pytest.param("breast_cancer", marks=pytest.mark.slow),
                                     pytest.param("digits", marks=pytest.mark.slow)])
def test_every_feature_in_a_unit_of_its_own_gives_the_same_clusters(dataset, covariance_type):
    # Issue 44, item 2: each feature times its own c in 1e-3..1e3. Digits' border pixels, blank at most sites, took
    # the scale 1 in their own unit before, and the clusters changed with it (K_hat 17 against 19).
    from fedica.data.real import real_dataset

    X, _ = real_dataset(dataset)
    parts = np.array_split(np.random.default_rng(0).permutation(len(X)), 4)
    units = np.logspace(-3, 3, X.shape[1])[np.random.default_rng(1).permutation(X.shape[1])]
    fits = []
    for scale in (1.0, units):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fits.append(FedGEM(standardize="federated", covariance_type=covariance_type,
                               random_state=0).fit([X[p] * scale for p in parts]))
    assert fits[0].n_clusters_ == fits[1].n_clusters_
    for ours, theirs in zip(fits[0].labels_, fits[1].labels_):
        np.testing.assert_array_equal(ours, theirs)
    # The same to the EM tolerance (its last step differs by rounding).
    # (Digits' blank pixels: means of 1e-17 against 1e-16, the rounding of the location; hence the absolute part.)
    np.testing.assert_allclose(fits[1].means_ / units, fits[0].means_, rtol=1e-6, atol=1e-9 * np.abs(X).max())


def test_a_feature_most_sites_hold_constant_takes_the_scale_of_the_sites_that_vary_it():
    from fedica.fedgem.standardisation import federated_scale

    means = [np.array([0.0, 5.0]), np.array([0.0, 6.0]), np.array([0.0, 7.0]), np.array([2.0, 8.0])]
    stds = [np.array([0.0, 1.0]), np.array([0.0, 1.0]), np.array([0.0, 1.0]), np.array([3.0, 1.0])]
    location, scale = federated_scale(means, stds)
    assert location[0] == 0.0 and scale[0] == pytest.approx(np.sqrt(9.0 + 4.0))  # the one site that varies it
    for c in (1e-3, 1e3):
        np.testing.assert_allclose(federated_scale([m * c for m in means], [s * c for s in stds])[1], scale * c)
    assert federated_scale([np.zeros(1)] * 3, [np.zeros(1)] * 3)[1].tolist() == [1.0]  # constant everywhere


def test_a_feature_constant_but_for_rounding_is_constant():
    # Digits standardised on the pool: a blank pixel is -0.003 +- 1e-18 at most sites. Its rounding was taken for its
    # spread, and the sites that vary it went to 1e17 (refused as far from the federation; the run stopped).
    from fedica.fedgem.standardisation import federated_scale

    means = [np.array([-0.003]), np.array([-0.003]), np.array([-0.003]), np.array([0.5])]
    stds = [np.array([1e-18]), np.array([2e-18]), np.array([1e-18]), np.array([2.0])]
    location, scale = federated_scale(means, stds)
    assert scale[0] == pytest.approx(np.sqrt(4.0 + 0.503 ** 2))  # the site that varies it
    # Constant everywhere, rounding included: the values stay near 0 once standardised.
    _, scale = federated_scale([np.array([5.0])] * 3, [np.array([1e-15])] * 3)
    assert scale[0] == 1.0
