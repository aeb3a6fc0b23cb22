"""A site's own choice of K_g (fedica.fedgem.local.choose_n_components) and the estimator's record of it."""

import warnings

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from fedica.fedgem.estimator import FedGEM
from fedica.fedgem.local import choose_n_components, estimate_n_components, local_bound


def _blobs(n_per, centres, seed=0, scale=0.3):
    rng = np.random.default_rng(seed)
    return np.vstack([c + scale * rng.standard_normal((n_per, len(c))) for c in centres])


CENTRES = [(0.0, 0.0), (6.0, 0.0), (0.0, 6.0)]


@pytest.mark.parametrize("n, max_components, expected", [(2, 10, 1), (10, 10, 2), (70, 10, 5), (800, 10, 10),
                                                         (800, 4, 4)])
def test_the_bound_grows_with_the_site(n, max_components, expected):
    X = np.random.default_rng(0).standard_normal((n, 2))
    assert local_bound(X, max_components) == expected


def test_the_bound_counts_distinct_rows():
    X = np.repeat([[0.0, 0.0], [1.0, 1.0]], 50, axis=0)
    assert local_bound(X, 10) == 2


def test_three_clusters_are_found():
    assert estimate_n_components(_blobs(40, CENTRES), 10, random_state=0) == 3


def test_one_cluster_is_allowed():
    choice = choose_n_components(_blobs(60, CENTRES[:1]), 10, random_state=0)
    assert choice.n_components == 1 and not choice.at_bound and choice.scores.shape == (choice.bound,)


def test_duplicated_rows_do_not_make_components():
    # Every row five times: without the relative variance floor, components collapse onto the ties.
    X = np.repeat(np.round(_blobs(20, CENTRES), 1), 5, axis=0)
    assert estimate_n_components(X, 10, random_state=0) == 3


@pytest.mark.parametrize("criterion", ["icl", "bic"])
def test_both_criteria_choose(criterion):
    assert choose_n_components(_blobs(40, CENTRES), 10, criterion=criterion, random_state=0).n_components == 3


def test_an_unknown_criterion_is_refused():
    with pytest.raises(ValueError, match="criterion='aic'"):
        choose_n_components(_blobs(10, CENTRES), 10, criterion="aic")


def test_the_choice_is_unit_free():
    X = _blobs(40, CENTRES)
    assert [estimate_n_components(c * X, 10, random_state=0) for c in (1e-3, 1.0, 1e3)] == [3, 3, 3]


def test_a_site_at_its_bound_warns_and_is_recorded():
    many = _blobs(12, [(6.0 * i, 0.0) for i in range(8)])  # 96 points, 8 clusters, bound 6
    sites = [many, _blobs(40, CENTRES, seed=1)]
    # One warning naming the site, the server's, as a federation's (each site said it apart before).
    with pytest.warns(UserWarning, match=r"1 of 2 sites chose their K_g at their bound \(sites 0\)") as record:
        model = FedGEM(upsilon=1.0, random_state=0).fit(sites)
    assert len([w for w in record if "bound" in str(w.message)]) == 1
    assert model.local_clusters_at_bound_.tolist() == [True, False]
    assert model.n_local_clusters_.tolist() == [6, 3]


def test_a_site_too_small_for_two_components_is_at_its_bound_and_cannot_cap_a_larger_one():
    # Sites of 5, 16 and 54 rows of four clusters (issue 44): the two small ones fit one component, the 54-row site
    # four. Before, the median K_g (1) capped every site at 3 components and the 54-row site was refused without a
    # word: K_hat 1, ARI 0 on 14 of 20 seeds. A site at its bound counts as unbounded in the cap's median. Under the
    # default family its BIC needs the sites' robust log-likelihood scaled to every point (ALGORITHMS.md 2.14,
    # "The candidates and the federated EM"): unscaled, the three sites weighed 37 of 75 points and it chose 2.
    rng = np.random.default_rng(4)
    centres = np.array([[0.0, 0.0], [5.0, 0.0], [0.0, 5.0], [5.0, 5.0]])  # 16 rows may hold 2; this site chooses 1
    labels = [rng.integers(4, size=n) for n in (5, 16, 54)]
    sites = [centres[y] + rng.standard_normal((y.size, 2)) for y in labels]
    with pytest.warns(UserWarning, match=r"1 of 3 sites chose their K_g at their bound \(sites 0\)"):
        model = FedGEM(standardize=None, random_state=0).fit(sites)
    assert model.n_local_clusters_.tolist() == [1, 1, 4]
    assert model.local_clusters_at_bound_.tolist() == [True, False, False]
    assert model.rejected_ == []
    assert model.n_clusters_ == 4
    assert adjusted_rand_score(np.concatenate(labels), np.concatenate(model.labels_)) > 0.9


def test_a_site_refused_at_initialisation_is_said_in_a_warning():
    sites = [_blobs(40, CENTRES, seed=g) for g in range(4)]
    with pytest.warns(UserWarning, match=r"FedGEM: 1 of 4 sites' local models were refused at initialisation.*site 3: "
                                         r"declares 12 components; at most 9"):
        model = FedGEM(upsilon=1.0, random_state=0).fit(sites, n_local_clusters=[3, 3, 3, 12])
    assert [r["client"] for r in model.rejected_] == [3]


def test_given_counts_are_not_chosen():
    sites = [_blobs(40, CENTRES, seed=g) for g in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = FedGEM(upsilon=1.0, random_state=0).fit(sites, n_local_clusters=[3, 3])
    assert model.n_local_clusters_.tolist() == [3, 3] and not model.local_clusters_at_bound_.any()


def _wine_files(folder, n_sites=4):
    """scikit-learn's wine as users write it: CSV files with a header and a class column, rows dealt to the sites."""
    from sklearn.datasets import load_wine

    frame = load_wine(as_frame=True).frame.rename(columns={"target": "class"}).sample(frac=1.0, random_state=7)
    paths = []
    for g, rows in enumerate(np.array_split(np.arange(len(frame)), n_sites)):
        paths.append(folder / f"site{g}.csv")
        frame.iloc[rows].to_csv(paths[-1], index=False)
    return paths


def test_a_run_says_which_sites_chose_their_bound(tmp_path):
    """Before, a files site that chose its bound said nothing; a deployed site said it in its own log only."""
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    paths = _wine_files(tmp_path)
    overrides = ["algorithm=fedgem", "scenario=files", f"scenario.paths=[{','.join(map(str, paths))}]",
                 "scenario.label_column=class", "algorithm.standardize=federated", "engine=inprocess"]
    result = run_inprocess(compose_config([*overrides, "scenario.n_components=auto"]))
    assert result["fedgem"]["local_clusters_at_bound"] == [0, 1, 2, 3]
    assert any(w.startswith("UserWarning: FedGEM: 4 of 4 sites chose their K_g at their bound (sites 0, 1, 2, 3)")
               for w in result["warnings"])  # the run's warnings, which its summary prints too
    given = run_inprocess(compose_config([*overrides, "scenario.n_components=3"]))
    assert "local_clusters_at_bound" not in given["fedgem"]  # a site told its K_g chose nothing


def test_a_users_site_at_its_bound_is_named_by_the_strategy():
    from sklearn.datasets import load_wine

    from fedica.clients import make_client_app
    from fedica.server.fedgem import FedGEMStrategy
    from fedica.server.inprocess import InProcessGrid

    X = load_wine().data
    sites = np.array_split(X[np.random.default_rng(0).permutation(len(X))], 4)
    grid = InProcessGrid(make_client_app(lambda context: sites[int(context.node_config["partition-id"])]),
                         [{"partition-id": g, "num-partitions": 4} for g in range(4)])
    strategy = FedGEMStrategy(standardize="federated", min_available_nodes=4, min_clients=2)
    with pytest.warns(UserWarning, match="sites chose their K_g at their bound"):
        strategy.start(grid=grid)
    assert strategy.server.local_clusters_at_bound
    bounds = [local_bound(s, 10) for s in sites]
    assert all(m.n_components == bounds[g] for g, m in strategy.server.models.items()
               if g in strategy.server.local_clusters_at_bound)
