"""RF-ICA's components in order of the variance they explain (docs/ALGORITHMS.md section 1.11)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fedica
from fedica.protocol import InvalidReply
from fedica.protocol.messages import validate_channel_means
from fedica.rfica.coordinator import RFICAState, explained_variances, federation_moments
from fedica.rfica.local import normalize_columns


def _sites(seed=0, strengths=(0.5, 3.0, 1.0, 2.0), sizes=(3000, 4000, 5000, 6000), noise=0.0):
    """Laplace sources of the given standard deviations through a non-orthogonal mixing of unit columns."""
    rng = np.random.default_rng(seed)
    mixing = normalize_columns(rng.standard_normal((len(strengths), len(strengths))) + 2 * np.eye(len(strengths)))
    scale = np.asarray(strengths) / np.sqrt(2.0)  # a unit Laplace has variance 2
    sites = [rng.laplace(size=(n, len(strengths))) * scale @ mixing.T + noise * rng.standard_normal((n, len(strengths)))
             for n in sizes]
    return mixing, sites


def test_the_components_come_in_decreasing_order_of_the_variance_they_explain():
    mixing, sites = _sites()
    model = fedica.RFICA(random_state=0).fit(sites)
    assert np.all(np.diff(model.explained_variance_) < 0)
    # The true sources' variances, largest first: the estimate's columns follow them.
    for column, true_column in zip(model.mixing_.T, mixing[:, [1, 3, 2, 0]].T):
        assert abs(column @ true_column) > 0.99
    # What each component explains in the pooled data, computed here from the samples themselves.
    pooled = np.concatenate([X - X.mean(axis=0) for X in sites])
    sources = pooled @ model.components_.T
    np.testing.assert_allclose(model.explained_variance_, sources.var(axis=0) * np.sum(model.mixing_**2, axis=0),
                               rtol=0.05)
    # Every channel is a component here: the shares add up to the whole variance.
    assert model.explained_variance_ratio_.sum() == pytest.approx(1.0, abs=0.01)
    np.testing.assert_allclose(model.explained_variance_ratio_, model.explained_variance_ / np.trace(np.cov(pooled.T)),
                               rtol=0.05)


def test_labels_and_the_one_shot_estimate_follow_the_order():
    _, sites = _sites(seed=1)
    model = fedica.RFICA(random_state=1).fit(sites)
    for k, site in enumerate(model.site_mixings_):
        for i, j in enumerate(model.labels_[k]):  # column i of site k is in the cluster of mixing_'s column j
            assert abs(site[:, i] @ model.mixing_[:, j]) > 0.95
    assert np.all(np.abs(np.sum(model.one_shot_mixing_ * model.mixing_, axis=0)) > 0.95)


def test_a_run_whose_sites_send_no_covariance_knows_no_explained_variance():
    _, sites = _sites(seed=2)
    model = fedica.RFICA.paper(random_state=2).fit(sites)
    assert model.explained_variance_ is None and model.explained_variance_ratio_ is None


def test_fewer_components_explain_a_share_below_one():
    rng = np.random.default_rng(3)
    mixing = normalize_columns(rng.standard_normal((8, 3)))
    sites = [rng.laplace(size=(n, 3)) @ mixing.T + 0.1 * rng.standard_normal((n, 8)) for n in (2000, 3000, 4000)]
    model = fedica.RFICA(n_components=3, random_state=0).fit(sites)
    pooled = np.concatenate([X - X.mean(axis=0) for X in sites])
    share = model.explained_variance_ratio_.sum()
    assert 0.9 < share < 1.0
    assert share == pytest.approx(1 - 5 * 0.01 / np.trace(np.cov(pooled.T)), abs=0.02)  # the noise outside the span


def test_explained_variances_of_a_known_covariance():
    mixing = normalize_columns(np.array([[1.0, 1.0], [0.0, 1.0]]))
    covariance = mixing @ np.diag([4.0, 1.0]) @ mixing.T  # unit-variance-scaled sources of variances 4 and 1
    np.testing.assert_allclose(explained_variances(mixing, covariance), [4.0, 1.0])
    np.testing.assert_allclose(explained_variances(2 * mixing, covariance), [4.0, 1.0])  # the column's scale is no matter


@pytest.mark.parametrize("mean, reason", [
    (None, "missing array 'mean'"),
    (np.zeros(3), "'mean' has shape (3,), expected 4"),
    (np.array([0.0, np.nan, 0.0, 0.0]), "'mean' holds non-finite values"),
])
def test_a_site_s_means_are_checked_with_named_reasons(mean, reason):
    arrays = {"covariance": np.eye(4)} if mean is None else {"covariance": np.eye(4), "mean": mean}
    with pytest.raises(InvalidReply) as info:
        validate_channel_means(arrays, r=4)
    assert str(info.value) == reason


def test_a_minority_of_sites_cannot_move_the_centre_far():
    rng = np.random.default_rng(4)
    honest = [rng.normal(size=4) * 0.1 + 5.0 for _ in range(5)]
    state = RFICAState()
    federation_moments(state, [np.eye(4)] * 7, honest + [np.full(4, 1e12)] * 2)
    assert np.max(np.abs(state.global_mean - 5.0)) < 0.5
    np.testing.assert_allclose(state.global_covariance, np.eye(4))


@pytest.mark.slow
def test_an_estimator_rebuilt_from_a_run_s_result_centres_new_data(tmp_path):
    """fedica-run on files: the result's mean and explained variances rebuild the library's estimator."""
    _, sites = _sites(seed=5)
    paths = []
    for g, X in enumerate(sites):
        paths.append(tmp_path / f"site{g}.csv")
        np.savetxt(paths[-1], X + 100.0, delimiter=",", header="a,b,c,d", comments="")
    out = tmp_path / "run"
    done = subprocess.run([str(Path(sys.executable).with_name("fedica-run")), "engine=inprocess", "algorithm=rfica",
                           "scenario=files", f"scenario.paths=[{','.join(map(str, paths))}]", f"hydra.run.dir={out}"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    model = fedica.RFICA.from_result(out / "result.json")
    np.testing.assert_allclose(model.mean_, 100.0, atol=0.2)
    library = fedica.RFICA(random_state=0).fit([X + 100.0 for X in sites])
    np.testing.assert_allclose(model.mixing_, library.mixing_, atol=1e-12)
    np.testing.assert_allclose(model.explained_variance_, library.explained_variance_, rtol=1e-9)
    S = model.transform(sites[0] + 100.0)
    assert np.all(np.abs(S.mean(axis=0)) < 0.2 * S.std(axis=0))  # centred as the sites centred their data


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_n_components_as_a_share_counts_as_pooled_pca_on_the_clean_sites_and_no_noisy_site_inflates_it(seed):
    """Issue 45: sources 10 times louder or softer from site to site, one site at 3 sd of noise (16 channels, 4
    sources). Counted on the robust global covariance's spectrum, 0.99 kept 8 to 12 components: the noisy site's
    pull on its tail. Counted per site on the pooled directions, it is the clean sites' pooled PCA count or one more."""
    from fedica.data.scenarios import ica_poor_sites, ica_scenario_data
    from fedica.rfica.whitening import robust_covariance
    from fedica.rfica.local import components_for_share, site_covariance
    from fedica.scripts.bench_recordings import SIZES, workload

    scenario = workload(SIZES[1], "unequal+noisy")
    sites = [ica_scenario_data(scenario, g, seed) for g in range(scenario["n_clients"])]
    poor = {g for members in ica_poor_sites(scenario, seed).values() for g in members}
    pooled = np.cov(np.hstack([Y for g, Y in enumerate(sites) if g not in poor]))
    central = components_for_share(np.linalg.eigvalsh(pooled)[::-1], 0.99)
    median_spectrum = np.linalg.eigvalsh(robust_covariance(np.stack([site_covariance(Y) for Y in sites])))[::-1]
    assert components_for_share(median_spectrum, 0.99) >= 8
    model = fedica.RFICA(n_components=0.99, refine_rounds=0, random_state=seed).fit([Y.T for Y in sites])
    assert central <= model.n_components_ <= central + 1
