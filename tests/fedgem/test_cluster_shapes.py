"""The shape check: a run whose clusters are not the spheres its model fits says so.

FedGEM fits spherical components. An elongated or correlated cluster (scikit-learn's breast cancer and
digits, Waveform) takes several of them, and K_hat then counts more clusters than the data hold. Each site
reports one number under its final local model (``cluster_anisotropy``), and the server warns on the median.
"""

import warnings

import numpy as np
import pytest
from scipy.stats import special_ortho_group
from sklearn.datasets import load_breast_cancer, load_digits, load_iris, load_wine
from sklearn.preprocessing import StandardScaler

from fedica import FedGEM
from fedica.fedgem.coordinator import FedGEMServer, FedGEMSettings
from fedica.fedgem.geometry import CLUSTER_ANISOTROPY_LIMIT, cluster_anisotropy
from fedica.fedgem.local import kmeans_init
from fedica.protocol import CLUSTER_SHAPE_KEY, GEM_FINAL, REPORT_CLUSTER_SHAPE_KEY, drive

SHAPE_WARNING = "the clusters are not spheres"


def _spheres(rng, n_per_cluster, dim, n_clusters=3, stretch=1.0):
    """Gaussian clusters far apart; with ``stretch`` each cluster's spread along the first axis is that many times the rest."""
    scale = np.ones(dim)
    scale[0] = stretch
    centres = 30.0 * rng.normal(size=(n_clusters, dim))
    X = np.vstack([c + rng.normal(size=(n_per_cluster, dim)) * scale for c in centres])
    return X, centres


@pytest.mark.parametrize("n_per_cluster, dim", [(40, 2), (200, 10), (60, 64), (2000, 5)])
def test_spherical_clusters_score_about_one_at_any_size_and_dimension(n_per_cluster, dim):
    rng = np.random.default_rng(dim)
    X, centres = _spheres(rng, n_per_cluster, dim)
    assert 0.75 < cluster_anisotropy(X, centres) < 1.25


def test_an_elongated_cluster_scores_its_variance_ratio_over_the_noise_edge():
    rng = np.random.default_rng(0)
    X, centres = _spheres(rng, 20_000, 4, stretch=3.0)
    degrees = X.shape[0] - 3
    expected = 9.0 / (1 + 8.0 / 4) / (1 + np.sqrt(4 / degrees)) ** 2  # a^2 / (1 + (a^2 - 1) / p), then the edge
    assert cluster_anisotropy(X, centres) == pytest.approx(expected, rel=0.03)
    assert cluster_anisotropy(X, centres) > CLUSTER_ANISOTROPY_LIMIT


def test_the_anisotropy_is_free_of_the_unit_the_origin_and_a_rotation():
    rng = np.random.default_rng(1)
    X, centres = _spheres(rng, 300, 6, stretch=2.0)
    rotation = special_ortho_group.rvs(6, random_state=2)
    shift = rng.normal(size=6) * 1e3
    reference = cluster_anisotropy(X, centres)
    for c in (1e-3, 1e3):
        moved = cluster_anisotropy((c * X) @ rotation + shift, (c * centres) @ rotation + shift)
        assert moved == pytest.approx(reference, rel=1e-9)


def test_constant_columns_are_no_shape_and_a_site_without_shape_reports_none():
    rng = np.random.default_rng(3)
    X, centres = _spheres(rng, 100, 5)
    padded = np.column_stack([X, np.zeros(len(X)), np.full(len(X), 7.0)])
    padded_centres = np.column_stack([centres, np.zeros(3), np.full(3, 7.0)])
    assert cluster_anisotropy(padded, padded_centres) == pytest.approx(cluster_anisotropy(X, centres), rel=1e-12)
    # A constant column's centroid off by rounding (a weighted mean of one value) is still no shape.
    rounded = padded_centres + np.array([0, 0, 0, 0, 0, 0, 1]) * np.array([[0.0], [8.9e-16], [-8.9e-16]])
    assert cluster_anisotropy(padded, rounded) == pytest.approx(cluster_anisotropy(X, centres), rel=1e-12)
    assert cluster_anisotropy(X[:, :1], centres[:, :1]) is None  # one varying column
    assert cluster_anisotropy(X[:4], X[:3]) is None  # 4 points in 3 clusters: 1 degree of freedom
    assert cluster_anisotropy(np.ones((10, 3)), np.ones((1, 3))) is None


def _sites(X, n_sites, seed=0):
    order = np.random.default_rng(seed).permutation(len(X))
    return [X[part] for part in np.array_split(order, n_sites)]


@pytest.mark.parametrize("loader, n_classes, elongated", [(load_breast_cancer, 2, True), (load_digits, 10, True),
                                                           (load_iris, 3, False), (load_wine, 3, False)])
def test_the_limit_separates_the_bundled_data_sets(loader, n_classes, elongated):
    # Standardised, each site clustered into the classes: breast cancer's and digits' classes are not spheres.
    X, _ = loader(return_X_y=True)
    sites = _sites(StandardScaler().fit_transform(X), 4)
    scores = [cluster_anisotropy(site, kmeans_init(site, n_classes, random_state=0)) for site in sites]
    assert (np.median(scores) > CLUSTER_ANISOTROPY_LIMIT) == elongated


def test_a_fit_on_breast_cancer_warns_and_records_the_anisotropy_and_one_on_spheres_does_not():
    X, _ = load_breast_cancer(return_X_y=True)
    sites = _sites(StandardScaler().fit_transform(X), 4)
    with pytest.warns(UserWarning, match=SHAPE_WARNING + r": .* \d\.\d+ times .*median of 4 sites"):
        elongated = FedGEM(covariance_type="spherical", random_state=0).fit(sites)
    assert elongated.cluster_anisotropy_ > CLUSTER_ANISOTROPY_LIMIT
    # The default family takes the clusters' shapes: the number is kept, and there is nothing to warn of.
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*" + SHAPE_WARNING)
        family = FedGEM(random_state=0).fit(sites)
    assert family.cluster_anisotropy_ == elongated.cluster_anisotropy_ and family.covariance_family_ == "full"
    rng = np.random.default_rng(4)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*" + SHAPE_WARNING)
        # In their own units: standardising each feature by its total spread (the default) stretches spheres whose
        # centres spread more along some features than others.
        spheres = FedGEM(covariance_type="spherical", standardize=None, random_state=0).fit(
            [_spheres(rng, 80, 4)[0] for _ in range(4)], 3)
    assert 0.5 < spheres.cluster_anisotropy_ < 1.5


def _server_after_run(federation_of, sites, transform=None):
    server = FedGEMServer(FedGEMSettings(rounds=2, upsilon=1.0, same_client_rule="strict", min_clients=2, seed=0,
                                         standardize=None, covariance_type="spherical"),
                          evaluate=False)
    federation = federation_of(server, sites, 3, transform)
    asked = []

    def answer(request):
        if request.task == GEM_FINAL:
            asked.append(request.values.get(REPORT_CLUSTER_SHAPE_KEY))
        return federation.answer(request)

    drive(server.run(), answer)
    assert asked == [True]
    return server


def test_a_minority_of_clients_can_neither_raise_nor_silence_the_warning(sending, federation_of):
    rng = np.random.default_rng(5)
    round_sites = [_spheres(np.random.default_rng(0), 60, 3)[0] + 0.1 * rng.normal(size=(180, 3)) for _ in range(5)]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*" + SHAPE_WARNING)
        server = _server_after_run(federation_of, round_sites, sending(GEM_FINAL, CLUSTER_SHAPE_KEY, {0: 1e9, 1: 1e9}))
    assert server.cluster_anisotropy < 1.5
    long_sites = [_spheres(np.random.default_rng(0), 60, 3, stretch=4.0)[0] + 0.1 * rng.normal(size=(180, 3))
                  for _ in range(5)]
    with pytest.warns(UserWarning, match=SHAPE_WARNING):
        server = _server_after_run(federation_of, long_sites, sending(GEM_FINAL, CLUSTER_SHAPE_KEY, {0: 1.0, 1: 1.0}))
    assert server.cluster_anisotropy > CLUSTER_ANISOTROPY_LIMIT


@pytest.mark.parametrize("value, reason", [(float("nan"), "must be a finite number >= 0"),
                                           (-1.0, "must be a finite number >= 0"),
                                           ("long", "is not a number"), (True, "is not a number")])
def test_a_malformed_anisotropy_rejects_the_final_reply_with_its_reason(value, reason, sending, federation_of):
    sites = [_spheres(np.random.default_rng(0), 60, 3)[0] + 0.1 * np.random.default_rng(g).normal(size=(180, 3))
             for g in range(3)]
    server = _server_after_run(federation_of, sites, sending(GEM_FINAL, CLUSTER_SHAPE_KEY, {1: value}))
    assert server.final.partitions == [0, 2]
    rejection = next(r for r in server.rejected if r["client"] == 1)
    assert rejection["round"] == "final" and CLUSTER_SHAPE_KEY in rejection["reason"] and reason in rejection["reason"]



@pytest.mark.parametrize("workload, elongated", [("s62_nominal", False), ("digits", True)])
def test_hostile_sites_that_know_the_rule_can_neither_raise_nor_silence_the_warning_in_a_run(workload, elongated):
    """``forged_shape``: a quarter of the sites claim an anisotropy of 1e6 where theirs passes and 0 where it does not."""
    from fedica.config import validate_config
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    def run(*overrides):
        result = run_inprocess(validate_config(compose_config([
            "algorithm=fedgem", "algorithm.covariance_type=spherical", f"+workload={workload}", "engine=inprocess",
            "baselines=false", *overrides])))
        return result, any(SHAPE_WARNING in warning for warning in result["warnings"])

    (honest, honest_warned), (attacked, attacked_warned) = run(), run("attack=forged_shape")
    assert attacked["fedgem"]["hostile_clients"] and honest_warned == attacked_warned == elongated
    assert (attacked["fedgem"]["cluster_anisotropy"] > CLUSTER_ANISOTROPY_LIMIT) == elongated
    assert attacked["metrics"]["fedgem"]["k_hat"] == honest["metrics"]["fedgem"]["k_hat"]
