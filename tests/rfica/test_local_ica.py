"""RF-ICA's sites: the local solvers, their convergence, the memory order, n_components and the federated whitening."""


import numpy as np
import pytest

import fedica
from fedica.data.common import ClientData
from fedica.evaluation.ica import ica_error
from fedica.protocol import RFICA_FIT, ArraySite, InMemoryFederation, InvalidReply, validate_ica_reply
from fedica.protocol.messages import RFICA_COVARIANCE, validate_covariance_reply, validate_ica_convergence
from fedica.rfica.coordinator import RFICAState, receive_estimates, rfica_protocol
from fedica.rfica.local import (
    RETRY_ITERATIONS_FACTOR,
    bad_channels,
    components_for_share,
    local_ica,
    normalize_columns,
    site_covariance,
)
from fedica.data.recordings import recordings_site, recordings_true_mixing
from fedica.rfica.whitening import federated_whitening, pooled_subspace
from fedica.seeding import STREAMS
from fedica.tasks import CLIENT_TASKS


def _laplace_sites(seed, n_sites=5, n=3000, p=4, r=4, noise=0.0):
    """Sites (n, p) observing r Laplace sources through one (p, r) mixing with unit columns, plus sensor noise."""
    rng = np.random.default_rng(seed)
    mixing = normalize_columns(rng.standard_normal((p, r)))
    sites = [rng.laplace(size=(n, r)) @ mixing.T + noise * rng.standard_normal((n, p)) for _ in range(n_sites)]
    return sites, mixing


def _gaussian_site():
    """A site of Gaussian noise on which FastICA from the client.fastica start of partition 1 never converges (seeded)."""
    return np.random.default_rng(3).standard_normal((2000, 4))


def _subspace_distance(a, b):
    """sin of the largest principal angle between the column spans of ``a`` and ``b``."""
    qa, qb = np.linalg.qr(a)[0], np.linalg.qr(b)[0]
    return float(np.linalg.norm(qa @ qa.T - qb @ qb.T, 2))


# ---------------------------------------------------------------- convergence, retries


@pytest.mark.parametrize("solver", ["fastica", "picard"])
@pytest.mark.parametrize("contrast", ["cube", "logcosh"])
def test_both_solvers_recover_the_mixing_and_report_their_convergence(solver, contrast):
    (site, *_), mixing = _laplace_sites(0, n_sites=1, n=5000)
    result = local_ica(site.T, solver=solver, contrast=contrast, random_state=1)
    assert result.mixing.shape == (4, 4) and result.converged and result.attempts == 1 and 1 <= result.n_iter < 1000
    np.testing.assert_allclose(np.linalg.norm(result.mixing, axis=0), 1.0)
    assert ica_error(result.mixing, mixing) < 0.1


@pytest.mark.parametrize("solver", ["fastica", "picard"])
@pytest.mark.parametrize("unit", [1e-6, 1e-9])
def test_a_channel_in_far_smaller_units_leaves_the_site_s_estimate_as_it_was(solver, unit):
    # Before, its covariance looked singular (eigenvalues 1e-12 apart and more): the site took the scalar whitening
    # that singular data need, and its estimate was wrong (RF-ICA error 1.2-1.6 on the recordings scenario).
    (site, *_), mixing = _laplace_sites(0, n_sites=1, n=5000)
    units = np.array([unit, 1.0, 1.0, 1.0])
    own = local_ica(site.T, solver=solver, random_state=1)
    scaled = local_ica((site * units).T, solver=solver, random_state=1)
    assert scaled.converged
    back = normalize_columns(scaled.mixing / units[:, None])
    assert ica_error(back, mixing) == pytest.approx(ica_error(own.mixing, mixing), abs=1e-3)
    # Data that are singular in every unit (a channel copying another) still take the scalar whitening.
    copied = np.column_stack([site[:, :3], site[:, 0]])
    assert np.all(np.isfinite(local_ica(copied.T, solver=solver, random_state=1).mixing))


@pytest.mark.parametrize("solver", ["fastica", "picard"])
def test_an_unconverged_start_is_retried_with_more_iterations_and_then_flagged(solver):
    (site, *_), _ = _laplace_sites(1, n_sites=1)
    alone = local_ica(site.T, solver=solver, max_iter=1, random_state=0)
    assert not alone.converged and alone.attempts == 1 and alone.n_iter == 1
    retried = local_ica(site.T, solver=solver, max_iter=1, random_state=0, retry_random_state=7)
    assert retried.attempts == 2 and retried.n_iter <= RETRY_ITERATIONS_FACTOR
    assert not retried.converged  # RETRY_ITERATIONS_FACTOR iterations do not suffice either: flagged
    assert not np.array_equal(retried.mixing, alone.mixing)  # another start


def test_a_converged_first_attempt_ignores_the_retry_stream():
    (site, *_), _ = _laplace_sites(2, n_sites=1)
    first = local_ica(site.T, random_state=3)
    assert first.converged
    for retry in (0, 99):
        again = local_ica(site.T, random_state=3, retry_random_state=retry)
        np.testing.assert_array_equal(again.mixing, first.mixing)
        assert (again.n_iter, again.attempts) == (first.n_iter, 1)


def test_the_retry_has_its_own_stream():
    assert STREAMS["client.ica_retry"].indices == ("partition",)
    codes = [(s.layout, s.code) for name, s in STREAMS.items() if s.layout == "entropy" and name != "attack.reply"]
    assert len(codes) == len(set(codes))


# ---------------------------------------------------------------- memory order


@pytest.mark.parametrize("solver", ["fastica", "picard"])
@pytest.mark.parametrize("unconverged", [False, True])
def test_a_site_s_estimate_does_not_depend_on_the_memory_order(solver, unconverged):
    site = _gaussian_site() if unconverged else _laplace_sites(3, n_sites=1)[0][0]
    c_ordered = local_ica(np.ascontiguousarray(site.T), solver=solver, random_state=1, retry_random_state=2)
    f_ordered = local_ica(np.asfortranarray(site.T), solver=solver, random_state=1, retry_random_state=2)
    np.testing.assert_array_equal(c_ordered.mixing, f_ordered.mixing)
    assert (c_ordered.n_iter, c_ordered.converged) == (f_ordered.n_iter, f_ordered.converged)


def _mixed_federation():
    sites, _ = _laplace_sites(4, n_sites=4, n=2000)
    return [sites[0], _gaussian_site(), *sites[1:]]


def test_the_estimator_gives_the_same_numbers_for_c_and_f_ordered_sites():
    sites = _mixed_federation()
    c_model = fedica.RFICA(random_state=0).fit([np.ascontiguousarray(X) for X in sites])
    f_model = fedica.RFICA(random_state=0).fit([np.asfortranarray(X) for X in sites])
    np.testing.assert_array_equal(c_model.mixing_, f_model.mixing_)
    np.testing.assert_array_equal(c_model.site_mixings_, f_model.site_mixings_)
    np.testing.assert_array_equal(c_model.site_iterations_, f_model.site_iterations_)


def test_the_client_app_gives_the_estimator_s_numbers_for_c_and_f_ordered_sites():
    from fedica.clients.app import make_client_app
    from fedica.server.inprocess import InProcessGrid
    from fedica.server.rfica import RFICAStrategy

    sites = _mixed_federation()
    expected = fedica.RFICA(random_state=0).fit(sites)
    for order in ("C", "F"):
        app = make_client_app(lambda context: np.asarray(sites[int(context.node_config["partition-id"])], order=order))
        grid = InProcessGrid(app, [{"partition-id": p, "num-partitions": len(sites)} for p in range(len(sites))])
        strategy = RFICAStrategy(random_state=0, min_available_nodes=len(sites))
        strategy.start(grid)
        np.testing.assert_array_equal(strategy.mixing_, expected.mixing_)
        assert strategy.state.converged == expected.site_converged_.tolist()


# ---------------------------------------------------------------- sites that fit badly: seen, named once


def test_an_unconverged_site_is_flagged_on_the_estimator_and_named_in_one_warning():
    sites = _mixed_federation()
    with pytest.warns(UserWarning) as record:
        model = fedica.RFICA(local_solver="fastica", contrast="cube", random_state=0).fit(sites)
    assert model.site_converged_.tolist() == [True, False, True, True, True]
    assert model.site_iterations_[1] == RETRY_ITERATIONS_FACTOR * 1000
    assert np.all(model.site_iterations_[[0, 2, 3, 4]] < 1000)
    lines = [str(w.message) for w in record if "did not converge, even after a retry" in str(w.message)]
    assert len(lines) == 1 and "site(s) 1 " in lines[0]


def test_result_json_records_every_site_s_convergence():
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    result = run_inprocess(compose_config(["scenario.n_clients=4", "scenario.r=3", "scenario.n_normal=800",
                                           "scenario.n_corrupt=100", "engine=inprocess", "seed=2"]))
    rfica = result["rfica"]
    assert rfica["site_converged"] == [True] * 4 and rfica["unconverged_clients"] == []
    assert len(rfica["site_iterations"]) == 4 and all(1 <= n < 1000 for n in rfica["site_iterations"])
    assert rfica["n_components"] == 3 and rfica["whitening"] is None


# ---------------------------------------------------------------- n_components


@pytest.mark.parametrize("share, expected", [(0.4, 1), (0.5, 2), (0.7, 2), (0.9, 3), (0.99, 4)])
def test_a_share_of_variance_counts_components_as_mne_does(share, expected):
    # Cumulative shares .5, .8, .95, 1: MNE keeps one more than the components at or below the share (_exp_var_ncomp).
    assert components_for_share(np.array([5.0, 3.0, 1.5, 0.5]), share) == expected


@pytest.mark.parametrize("n_components", [4, 0.999])
def test_a_site_in_its_own_principal_subspace_replies_in_channel_space(n_components):
    (site, *_), mixing = _laplace_sites(5, n_sites=1, n=5000, p=16, r=4, noise=0.01)
    result = local_ica(site.T, n_components=n_components, contrast="logcosh", random_state=0)
    assert result.mixing.shape == (16, 4) and result.converged
    np.testing.assert_allclose(np.linalg.norm(result.mixing, axis=0), 1.0)
    assert ica_error(result.mixing, mixing) < 0.1


def test_a_site_in_the_federated_subspace_replies_in_channel_space():
    sites, mixing = _laplace_sites(6, n_sites=4, n=3000, p=16, r=4, noise=0.05)
    whitening, eigenvalues = federated_whitening(np.stack([site_covariance(X.T) for X in sites]), 4)
    assert whitening.shape == (4, 16) and np.all(np.diff(eigenvalues) <= 1e-12)
    for solver in ("fastica", "picard"):
        result = local_ica(sites[0].T, solver=solver, contrast="logcosh", whitening=whitening, random_state=0)
        assert result.mixing.shape == (16, 4)
        assert ica_error(result.mixing, mixing) < 0.1


def test_n_components_above_the_channel_count_is_refused():
    (site, *_), _ = _laplace_sites(0, n_sites=1)
    with pytest.raises(ValueError, match="n_components=5 is more than the 4 channels"):
        local_ica(site.T, n_components=5)
    with pytest.raises(ValueError, match=r"n_components=5: must be at most the 4 features"):
        fedica.RFICA(n_components=5).fit([site, site])
    with pytest.raises(ValueError, match=r"whitening must have shape \(r, 4\)"):
        local_ica(site.T, whitening=np.eye(3))


# ---------------------------------------------------------------- the federated whitening is robust


def _honest_covariances(seed, n_sites=9):
    """Sites with their own noise levels (0.1 to 1 sd) over one rank-4 signal in 16 channels."""
    rng = np.random.default_rng(seed)
    mixing = rng.standard_normal((16, 4))
    covariances = []
    for noise in np.linspace(0.1, 1.0, n_sites):
        X = rng.laplace(size=(2000, 4)) @ mixing.T + noise * rng.standard_normal((2000, 16))
        covariances.append(site_covariance(X.T))
    return np.stack(covariances), mixing


def test_a_hostile_site_moves_the_shared_subspace_less_than_the_honest_sites_spread():
    honest, _ = _honest_covariances(7)
    subspace = federated_whitening(honest, 4)[0].T
    # How far each honest site's own top-4 subspace lies from the federation's.
    spread = min(_subspace_distance(np.linalg.eigh(c)[1][:, -4:], subspace) for c in honest)
    rng = np.random.default_rng(8)
    rotation = np.linalg.qr(rng.standard_normal((16, 16)))[0]
    attacks = {"scaled": honest[0] * 1e6, "rotated": rotation @ honest[0] @ rotation.T,
               "rotated and scaled": 1e6 * rotation @ honest[0] @ rotation.T}
    for name, hostile in attacks.items():
        attacked = federated_whitening(np.concatenate([honest, hostile[None]]), 4)[0].T
        assert _subspace_distance(attacked, subspace) < spread, name
    # The plain mean, for contrast, follows the one large covariance.
    mean = np.concatenate([honest, attacks["rotated and scaled"][None]]).mean(axis=0)
    assert _subspace_distance(np.linalg.eigh(mean)[1][:, -4:], subspace) > 0.9


def _trial_covariances(seed):
    """Issue 45's trial in the recordings scenario: 16 channels, 6 sources 10 times louder or softer from site to
    site, A* of condition number 20, 3 % sensor noise, a site at 2 sd of noise and one with a dead channel."""
    settings = dict(n_clients=8, n_channels=16, n_sources=6, condition_number=20.0, sensor_noise=0.03, n_noisy=1,
                    noise_level=2.0, dead_channel=True, strength_spread=10.0)
    sites = [recordings_site(g, seed=seed, **settings).observations for g in range(8)]
    complete = np.array([not bad_channels(Y).any() for Y in sites])
    mixing = recordings_true_mixing(n_channels=16, n_sources=6, condition_number=20.0, seed=seed)
    return np.stack([site_covariance(Y) for Y in sites]), complete, mixing


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_the_pooled_subspace_holds_the_sources_most_sites_cannot_see(seed):
    covariances, complete, mixing = _trial_covariances(seed)
    own = [_subspace_distance(np.linalg.eigh(c)[1][:, -6:], mixing) for c in covariances]
    # Most sites' own top-6 subspace misses a source that lies under its noise; the pooled one holds them all.
    assert np.median(own) > 0.8
    basis, left_out = pooled_subspace(covariances, 6, complete=complete)
    assert _subspace_distance(basis, mixing) < 0.05 and left_out == []


@pytest.mark.parametrize("seed", [1, 3])
def test_a_site_with_a_dead_channel_it_did_not_name_is_left_out_of_the_pooled_subspace(seed):
    covariances, complete, mixing = _trial_covariances(seed)
    basis, left_out = pooled_subspace(covariances, 6)  # not told which site has bad channels
    assert _subspace_distance(basis, mixing) < 0.05 and left_out == np.flatnonzero(~complete).tolist()


def test_one_site_does_not_decide_a_direction_of_the_pooled_subspace():
    covariances, complete, mixing = _trial_covariances(0)
    clean = _subspace_distance(pooled_subspace(covariances, 6, complete=complete)[0], mixing)
    rotation = np.linalg.qr(np.random.default_rng(5).standard_normal((16, 16)))[0]
    for scale in (1.0, 1e3):
        hostile = scale * rotation @ covariances[0] @ rotation.T  # an honest site's signal, elsewhere
        attacked, decisive = pooled_subspace(np.concatenate([covariances, [hostile]]), 6,
                                             complete=np.append(complete, True))
        assert _subspace_distance(attacked, mixing) <= 1.05 * clean and decisive == [len(covariances)], scale
    # Without the rule the made-up directions take a source's place.
    pooled = np.concatenate([covariances[complete], [rotation @ covariances[0] @ rotation.T]])
    pooled = (pooled / np.trace(pooled, axis1=1, axis2=2)[:, None, None]).mean(axis=0)
    assert _subspace_distance(np.linalg.eigh(pooled)[1][:, -6:], mixing) > 0.9


def test_a_source_only_one_site_sees_is_left_out_and_the_site_named():
    covariances, complete, _ = _trial_covariances(10)  # site 7 alone sees one of the six sources
    assert pooled_subspace(covariances, 6, complete=complete)[1] == [7]


def test_the_federated_whitening_whitens_the_robust_global_covariance():
    honest, _ = _honest_covariances(9)
    whitening, eigenvalues = federated_whitening(honest, 0.9)
    traces = np.trace(honest, axis1=1, axis2=2)
    # A share is counted by the sites on the pooled directions (share_count): the four sources, where the global
    # covariance's own spectrum, which the noisier sites flatten, would keep three.
    assert whitening.shape[0] == 4 and components_for_share(eigenvalues, 0.9) == 3
    assert np.sum(eigenvalues) == pytest.approx(np.median(traces))
    # Identical sites: the global covariance is theirs, and it comes out white.
    same = federated_whitening(np.stack([honest[0]] * 3), 4)[0]
    np.testing.assert_allclose(same @ honest[0] @ same.T, np.eye(4), atol=1e-8)


# ---------------------------------------------------------------- the replies' checks


def _covariance_reply(covariance, n=100):
    return {"covariance": covariance}, {"n-samples": n}


@pytest.mark.parametrize("arrays, values, reason", [
    ({"covariance": np.eye(3)}, {"n-samples": 100}, "'covariance' has shape (3, 3), expected 4x4"),
    ({"covariance": np.full((4, 4), np.inf)}, {"n-samples": 100}, "'covariance' holds non-finite values"),
    ({"covariance": np.zeros((4, 4))}, {"n-samples": 100}, "'covariance' is zero"),
    ({"covariance": np.triu(np.ones((4, 4)))}, {"n-samples": 100}, "'covariance' is not symmetric"),
    ({"covariance": -np.eye(4)}, {"n-samples": 100}, "'covariance' is not positive semi-definite"),
    ({"covariance": np.diag([1.0, 1.0, 1.0, -0.1])}, {"n-samples": 100}, "'covariance' is not positive semi-definite"),
    ({"covariance": np.eye(4)}, {"n-samples": 4}, "'n-samples'=4 must be >= 5"),
    ({}, {"n-samples": 100}, "missing array 'covariance'"),
])
def test_a_bad_covariance_reply_is_refused_with_its_reason(arrays, values, reason):
    with pytest.raises(InvalidReply) as info:
        validate_covariance_reply(arrays, values, r=4)
    assert str(info.value).startswith(reason)


def test_a_covariance_with_rounding_noise_is_accepted_and_symmetrised():
    covariance = site_covariance(np.random.default_rng(0).standard_normal((4, 50)))
    covariance[0, 1] += 1e-14
    accepted, n = validate_covariance_reply(*_covariance_reply(covariance), r=4)
    np.testing.assert_array_equal(accepted, accepted.T)
    rank_two = np.outer([1.0, 2, 0, 0], [1.0, 2, 0, 0]) + np.outer([0, 0, 1.0, 1], [0, 0, 1.0, 1])
    validate_covariance_reply(*_covariance_reply(rank_two - 1e-15 * np.eye(4)), r=4)


def test_an_ica_reply_is_n_channels_by_n_components():
    mixing, n = validate_ica_reply({"mixing": np.ones((16, 4))}, {"n-samples": 10}, r=16, n_components=4)
    assert mixing.shape == (16, 4) and n == 10
    with pytest.raises(InvalidReply, match=r"'mixing' has shape \(4, 4\), expected 16x4"):
        validate_ica_reply({"mixing": np.ones((4, 4))}, {"n-samples": 10}, r=16, n_components=4)
    with pytest.raises(InvalidReply, match=r"'mixing' has shape \(16, 4\), expected 16x16"):
        validate_ica_reply({"mixing": np.ones((16, 4))}, {"n-samples": 10}, r=16)


@pytest.mark.parametrize("values, reason", [
    ({"n-iter": -1}, "'n-iter'=-1 must be >= 0"),
    ({"n-iter": 2.5}, "'n-iter'=2.5 is not an integer"),
    ({"converged": "yes"}, "'converged'='yes' is not a bool"),
    ({"converged": 1}, "'converged'=1 is not a bool"),
])
def test_a_bad_convergence_report_is_refused_with_its_reason(values, reason):
    with pytest.raises(InvalidReply) as info:
        validate_ica_convergence(values)
    assert str(info.value) == reason
    assert validate_ica_convergence({}) == (None, None)
    assert validate_ica_convergence({"n-iter": 3, "converged": True}) == (3, True)


# ---------------------------------------------------------------- the protocol with n_components


def _federation(sites):
    return {g: ArraySite(ClientData(X, None, X[:0], None, 1), g) for g, X in enumerate(sites)}


@pytest.mark.parametrize("whitening, n_components, exchanges", [
    ("federated", 4, [RFICA_COVARIANCE, RFICA_FIT]), ("federated", 0.99, [RFICA_COVARIANCE, RFICA_FIT]),
    ("local", 4, [RFICA_FIT]), (None, 4, [RFICA_COVARIANCE, RFICA_FIT])])
def test_with_n_components_every_site_replies_its_channel_space_mixing(whitening, n_components, exchanges):
    sites, mixing = _laplace_sites(10, n_sites=5, n=3000, p=16, r=4, noise=0.01)
    state = RFICAState(n_components=n_components, whitening=whitening, contrast="logcosh", r=16)
    federation = InMemoryFederation(_federation(sites), CLIENT_TASKS, state.rejected)
    protocol = rfica_protocol(state)
    request, asked = next(protocol), []
    while request.task != RFICA_FIT:
        asked.append(request.task)
        request = protocol.send(federation.answer(request))
    asked.append(request.task)
    assert asked == exchanges
    if whitening != "local":
        assert all(p["whitening"].shape == (4, 16) for p in request.payloads.values())
    # The aggregation of (K, p, r) estimates is fedica.rfica.aggregation's; up to it, the replies are checked here.
    receive_estimates(state, federation.answer(request), round_label=request.round_label)
    assert state.rejected == [] and state.components == 4 and state.converged == [True] * 5
    assert all(e.shape == (16, 4) for e in state.estimates)
    assert max(ica_error(e, mixing) for e in state.estimates) < 0.15  # each site alone, 3,000 samples


def test_a_site_rejected_for_its_covariance_is_not_asked_for_its_ica():
    sites, _ = _laplace_sites(11, n_sites=4, n=1000, p=6, r=3, noise=0.01)
    sites[2] = sites[2][:, :5]  # a site with one channel too few
    state = RFICAState(n_components=3, r=None)
    federation = InMemoryFederation(_federation(sites), CLIENT_TASKS, state.rejected)
    protocol = rfica_protocol(state)
    request = protocol.send(federation.answer(next(protocol)))
    assert sorted(request.payloads) == [0, 1, 3]
    assert state.rejected[0]["client"] == 2 and "'covariance' has shape (5, 5), expected 6x6" in state.rejected[0]["reason"]


@pytest.mark.parametrize("whitening", ["federated", "local"])
@pytest.mark.parametrize("solver", ["fastica", "picard"])
def test_rfica_with_fewer_components_than_channels_end_to_end(whitening, solver):
    sites, mixing = _laplace_sites(12, n_sites=6, n=3000, p=16, r=4, noise=0.05)
    model = fedica.RFICA(n_components=4, whitening=whitening, local_solver=solver, contrast="logcosh",
                         random_state=0).fit(sites)
    assert model.mixing_.shape == (16, 4) and model.components_.shape == (4, 16) and model.n_components_ == 4
    assert ica_error(model.mixing_, mixing) < 0.1
    assert model.transform(sites[0]).shape == (3000, 4)
    assert (model.whitening_ is None) == (whitening == "local")
