"""RF-ICA's coordinator: the server side of its protocol, which any transport can drive: the local ICA exchange, the robust
aggregation, then (``refine_rounds``) the federated refinement.

:func:`rfica_protocol` is a generator like :meth:`fedica.fedgem.coordinator.FedGEMServer.run`: it
yields one :class:`~fedica.protocol.Request` (every client's local ICA) and is sent the replies;
with the federated whitening (docs/ALGORITHMS.md section 1.8) it first asks every site for its
channel covariance and sends each the shared whitening with the ICA request. With
``refine_rounds`` it then runs FastICA's fixed point on the federation's data from the
aggregate, one exchange a step (section 1.10).
:class:`fedica.RFICA` answers in memory, ``RFICAStrategy`` over a Flower Grid.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from numbers import Integral

import numpy as np

from fedica.privacy import PrivacyPlan
from fedica.protocol import (
    RFICA_FIT,
    InvalidReply,
    ProtocolState,
    Reply,
    Request,
    RunStopped,
    majority_width,
    reported_seconds,
    validate_ica_reply,
)
from fedica.protocol.messages import (
    COLUMN_VARIANCES_KEY,
    RFICA_COVARIANCE,
    RFICA_REFINE,
    validate_bad_channel_list,
    validate_channel_means,
    validate_covariance_reply,
    validate_column_variances,
    validate_ica_convergence,
    validate_refinement_blocks,
    validate_refinement_reply,
)
from fedica.rfica.aggregation import (
    CHANNEL_SCALE_SPREAD_LIMIT,
    SMALLEST_CHANNEL_SCALE_LIMIT,
    RfIcaAggregate,
    channel_scale_spread,
    smallest_channel_scale,
    channel_scales,
    in_channel_units,
    normalise_estimates,
    rf_ica_aggregate,
)
from fedica.rfica.filling import bad_rows, fill_alone, fill_from_reference
from fedica.rfica.geometric_median import geometric_median
from fedica.rfica.privacy import check_covered, rfica_plan
from fedica.rfica.refinement import (
    REFINEMENT_TOLERANCE,
    RefinementStatistics,
    direction_change,
    refinement_step,
    within_one_shot_spread,
)
from fedica.rfica.trust import estimate_defects
from fedica.rfica.uncertainty import column_weights
from fedica.rfica.whitening import robust_covariance, site_noise, square_site_noise, whitening_of



@dataclass(kw_only=True)
class RFICAState(ProtocolState):
    """RF-ICA's parameters and, once the protocol has run, what it computed (its books: :class:`~fedica.protocol.ProtocolState`).

    Parameters
    ----------
    contrast, init, benchmark, kmeans_restarts, gm_tol, local_solver, n_components, clustering, center
        As for :class:`fedica.RFICA` (``clustering``'s and ``center``'s defaults here are the paper's
        k-means and geometric median).
    whitening : {"federated", "local"} or None
        As for :class:`fedica.RFICA`; None: federated when ``n_components`` is set, local otherwise.
    dp_epsilon, dp_delta : float or None, float
        As for :class:`fedica.RFICA`: the sites release their estimates privately (docs/ALGORITHMS.md section 1.9).
    refine_rounds : int
        As for :class:`fedica.RFICA` (its default here is the paper's one-shot protocol, 0).
    seed : int
        The run's seed: the clients' ICA starts and the server's k-means restarts.
    min_clients : int
    r : int or None
        The number of channels; None: the one most clients report.

    Attributes
    ----------
    components : int or None
        The number of components every site estimates, once known: ``n_components`` as an int,
        the federated whitening's count for a share, the majority's width otherwise.
    global_eigenvalues : ndarray of shape (r,) or None
        The robust global covariance's eigenvalues, in decreasing order (federated whitening).
    global_covariance, global_mean : ndarray of shape (r, r) and (r,), or None
        The federation's robust channel covariance and centre (:func:`federation_moments`), once the
        sites have sent their covariances (federated whitening, or the refinement's covariance exchange).
    explained_variance : ndarray of shape (components,) or None
        The variance each column of the estimate explains in ``global_covariance``, in the columns'
        order, which is decreasing (:func:`order_by_explained_variance`); None without a covariance.
    whitening_matrix : ndarray of shape (components, r) or None
        The whitening the sites received (federated whitening).
    covariance_partitions : list of int
        The sites whose covariance was accepted (federated whitening); only they are asked for their ICA.
    site_covariances : dict of int to ndarray
        Every accepted channel covariance by site, from whichever exchange sent it: the refinement reads
        each site's sensor noise from it (:func:`fedica.rfica.whitening.site_noise`).
    n_iter, converged : list
        Per accepted estimate (in ``partitions`` order): the solver's iterations and whether it
        converged (None where the reply does not say).
    column_variances : list of ndarray or None
        Per accepted estimate: the variance of each column's direction, as the site reported it
        (:mod:`fedica.rfica.uncertainty`); None where the reply does not say.
    unconverged : list of int
        The partitions whose local ICA did not converge, after its retry.
    privacy : fedica.privacy.PrivacyPlan or None
        A private run's noise and what it spends, once the protocol has started; None without ``dp_epsilon``.
    one_shot_mixing : ndarray of shape (r, components) or None
        The one-shot aggregate's mixing when the refinement replaced it in ``aggregate.rf_ica``.
    refinement : list of dict
        One entry per refinement step: its round, the sites it averaged and those it set aside, the
        largest turn of an unmixing row (``1 - |cos|``).
    refinement_reverted : list of int
        The columns whose refined value left the spread of their one-shot cluster, where the one-shot
        column stands (:func:`fedica.rfica.refinement.within_one_shot_spread`); every column when the
        refinement did not converge.
    channel_scale_spread : float or None
        The largest of the channels' scales in the accepted estimates over the median
        (:func:`fedica.rfica.aggregation.channel_scales`); None before any estimate.
    smallest_channel_scale : float or None
        The smallest of the channels' scales over the median; None before any estimate.
    bad_channels : dict of int to list of int
        The sites (partition ids) whose estimates marked bad channels, and those channels; their
        estimates were filled from the complete sites' (:func:`fill_bad_channels`).
    subspace_left_out : list of int
        The sites (partition ids) the pooled subspace left out as deciding a direction alone
        (:func:`fedica.rfica.whitening.pooled_subspace`); a warning names them.
    noisy_sites : list of int
        The sites (partition ids) whose covariance reads them noisy (sensor noise beyond the others':
        :func:`fedica.rfica.whitening.site_noise`, :func:`~fedica.rfica.whitening.square_site_noise`); the
        refinement never averages them, and a warning names them whether or not it converges.
    channel_scales : ndarray of shape (r,) or None
        The scales the columns were compared with (each channel divided by its own), set when the
        spread is over :data:`~fedica.rfica.aggregation.CHANNEL_SCALE_SPREAD_LIMIT` or the smallest
        scale under :data:`~fedica.rfica.aggregation.SMALLEST_CHANNEL_SCALE_LIMIT`; None: in the
        channels' own units, the paper's.
    """

    contrast: str = "cube"
    init: str = "random"
    benchmark: str = "medoid"
    kmeans_restarts: int = 10
    gm_tol: float = 1e-10
    clustering: str = "kmeans"
    center: str = "geometric_median"
    local_solver: str = "fastica"
    n_components: int | float | None = None
    whitening: str | None = None
    dp_epsilon: float | None = None
    dp_delta: float = 1e-5
    refine_rounds: int = 0
    seed: int = 0
    min_clients: int = 2
    r: int | None = None
    estimates: list[np.ndarray] = field(default_factory=list)
    n_samples: list[int] = field(default_factory=list)
    partitions: list[int] = field(default_factory=list)
    n_iter: list[int | None] = field(default_factory=list)
    converged: list[bool | None] = field(default_factory=list)
    column_variances: list[np.ndarray | None] = field(default_factory=list)
    unconverged: list[int] = field(default_factory=list)
    components: int | None = None
    global_eigenvalues: np.ndarray | None = None
    global_covariance: np.ndarray | None = None
    global_mean: np.ndarray | None = None
    explained_variance: np.ndarray | None = None
    whitening_matrix: np.ndarray | None = None
    covariance_partitions: list[int] = field(default_factory=list)
    site_covariances: dict[int, np.ndarray] = field(default_factory=dict)
    aggregate: RfIcaAggregate | None = None
    privacy: PrivacyPlan | None = None
    one_shot_mixing: np.ndarray | None = None
    refinement: list[dict] = field(default_factory=list)
    refinement_reverted: list[int] = field(default_factory=list)
    channel_scale_spread: float | None = None
    smallest_channel_scale: float | None = None
    channel_scales: np.ndarray | None = None
    bad_channels: dict[int, list[int]] = field(default_factory=dict)
    subspace_left_out: list[int] = field(default_factory=list)
    noisy_sites: list[int] = field(default_factory=list)

    @property
    def federated_whitening(self) -> bool:
        """Whether the protocol starts with the covariance exchange."""
        return self.whitening == "federated" or (self.whitening is None and self.n_components is not None)



def _warn(message: str) -> None:
    """A warning about the result, where its reader looks: a ``UserWarning`` (the library's caller sees it; a run's
    harness counts it in result.json's warnings and prints it in summary.txt), not a log line only (issue 45)."""
    warnings.warn(message, UserWarning, stacklevel=3)

def rfica_protocol(state: RFICAState):
    """The whole RF-ICA protocol (one exchange, two with the federated whitening); results land in ``state``."""
    values = {"contrast": state.contrast, "init": state.init, "seed": state.seed, "solver": state.local_solver}
    if state.center != "geometric_median":  # the trimmed centres weigh each column by how well its site sees it
        values[COLUMN_VARIANCES_KEY] = True
    check_covered(vars(state))
    state.privacy = rfica_plan(state.dp_epsilon, state.dp_delta)
    if state.privacy is not None:  # the sites add the noise the plan names (fedica.rfica.privacy.private_mixing_reply)
        values.update(state.privacy.request_values(state.seed))
    if state.federated_whitening:
        replies = yield Request(RFICA_COVARIANCE, 1, None, {})
        receive_covariances(state, replies)
        state.require(len(state.covariance_partitions), "RF-ICA covariance round")
        payloads = {g: {"whitening": state.whitening_matrix} for g in state.covariance_partitions}
        replies = yield Request(RFICA_FIT, 2, payloads, values)
        receive_estimates(state, replies, round_label=2)
        state.require(len(state.estimates), "RF-ICA round 2")
    else:
        if state.n_components is not None:
            values["n-components"] = state.n_components
        replies = yield Request(RFICA_FIT, 1, None, values)
        receive_estimates(state, replies)
        state.require(len(state.estimates), "RF-ICA round 1")
    aggregate_estimates(state)
    if state.refine_rounds > 0:
        yield from refinement_protocol(state, first_round=3 if state.federated_whitening else 2)
    if state.global_covariance is not None:
        order_by_explained_variance(state)


def explained_variances(mixing, covariance) -> np.ndarray:
    """The variance each column of ``mixing`` explains in data of channel covariance ``covariance``.

    The sources of the unmixing ``pinv(mixing)`` are uncorrelated, so the data's variance splits
    into one share per component, ``|a_k|^2 var(s_k)``, plus what lies outside ``mixing``'s span
    (docs/ALGORITHMS.md section 1.11).
    """
    unmixing = np.linalg.pinv(mixing)
    source_variances = np.einsum("kc,cd,kd->k", unmixing, covariance, unmixing)
    return np.sum(mixing**2, axis=0) * source_variances


def explained_variance_record(state: RFICAState) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(explained_variance, explained_variance_ratio)`` of the estimate: None, None without a covariance."""
    if state.explained_variance is None:
        return None, None
    return state.explained_variance, state.explained_variance / np.trace(state.global_covariance)


def order_by_explained_variance(state: RFICAState) -> None:
    """Order the estimate's columns by the variance they explain in the federation's covariance, largest first.

    The columns otherwise follow the benchmark site's, an order that means nothing to the reader,
    where MNE's ICA (and PCA) list the components that matter first. Everything indexed by column
    follows: the comparators' centroids, the sites' labels, the one-shot estimate and the reverted
    columns. Ties keep their order (a stable sort), so the result is a function of the estimate alone.
    """
    aggregate = state.aggregate
    variances = explained_variances(aggregate.rf_ica, state.global_covariance)
    order = np.argsort(-variances, kind="stable")
    rank = np.argsort(order)
    state.aggregate = replace(aggregate, rf_ica=aggregate.rf_ica[:, order], f_ica=aggregate.f_ica[:, order],
                              labels=rank[aggregate.labels])
    if state.one_shot_mixing is not None:
        state.one_shot_mixing = state.one_shot_mixing[:, order]
    state.refinement_reverted = sorted(int(rank[j]) for j in state.refinement_reverted)
    state.explained_variance = variances[order]


def refinement_protocol(state: RFICAState, *, first_round: int):
    """FastICA's fixed point on the federation's data, from the aggregate (docs/ALGORITHMS.md section 1.10).

    Only the sites whose estimate was accepted take part. Without the federated whitening they
    first send their channel covariance (one more exchange), from which the server forms the
    shared whitening exactly as :func:`fedica.rfica.whitening.federated_whitening` does. Every step then sends each site
    the whitening and the current unmixing; the replies' averages are combined robustly and give
    the next unmixing (:func:`fedica.rfica.refinement.refinement_step`). The stage
    stops after ``refine_rounds`` steps, once no row turns by more than
    :data:`~fedica.rfica.refinement.REFINEMENT_TOLERANCE`, or when fewer than ``min_clients``
    valid replies arrive (the last unmixing is kept). If it has converged, the refined mixing
    replaces the aggregate's ``rf_ica``, each column signed as the one-shot column it started
    from, except a column that left the spread of its one-shot cluster: there the one-shot column
    stands. If it has not, the one-shot aggregate stands.
    """
    round_label = first_round
    participants = list(state.partitions)
    whitening = state.whitening_matrix
    if whitening is None:
        replies = yield Request(RFICA_COVARIANCE, round_label, {g: {} for g in participants}, {})
        covariances, means, participants, complete = _valid_covariances(state, replies, round_label,
                                                                        state.aggregate.rf_ica.shape[0])
        if len(covariances) < state.min_clients:
            _warn(f"RF-ICA: the refinement needs {state.min_clients} covariances, {len(covariances)} were valid; the "
                  "one-shot aggregate stands")
            return
        federation_moments(state, covariances, means)
        decisive: list[int] = []
        whitening, _ = whitening_of(state.global_covariance, state.components, covariances, complete=complete,
                                    decisive=decisive, gm_tol=state.gm_tol)
        _warn_decisive(state, [participants[i] for i in decisive])
        round_label += 1
    good = sum(g not in state.bad_channels for g in participants)
    if good < state.min_clients:
        _warn(f"RF-ICA: the refinement needs {state.min_clients} site(s) without bad channels, only {good} have; the "
              "one-shot aggregate stands")
        return
    one_shot = state.aggregate.rf_ica
    unmixing = np.linalg.pinv(whitening @ one_shot)
    noise, noisy = _sensor_noise(state, whitening, unmixing)
    state.noisy_sites = sorted(noisy)
    for step in range(state.refine_rounds):
        payload = {"whitening": whitening, "unmixing": unmixing}
        replies = yield Request(RFICA_REFINE, round_label, {g: payload for g in participants},
                                {"contrast": state.contrast})
        statistics, partitions = _refinement_statistics(state, replies, round_label, unmixing.shape[0])
        if len(statistics) < state.min_clients:
            _warn(f"RF-ICA: refinement step {step + 1} had {len(statistics)} valid replies, fewer than "
                  f"{state.min_clients}; it stops there")
            break
        with state.server_time():
            good = [g not in state.bad_channels for g in partitions]
            averaged = [ok and g not in noisy for g, ok in zip(partitions, good)]
            known = noise is not None and all(g in noise for g in partitions)
            step_noise = [noise[g] for g in partitions] if known else None
            updated, kept = refinement_step(statistics, unmixing, gm_tol=state.gm_tol, averaged=averaged,
                                            noise=step_noise)
            change = direction_change(unmixing, updated)
        # A site with bad channels is never averaged, and was named already (fill_bad_channels): not set aside. A site
        # whose noise floor marks it noisy is never averaged either, and is named with those the evidence set aside.
        state.refinement.append({"round": round_label, "change": change,
                                 "sites": [g for g, k, ok in zip(partitions, kept, averaged) if k and ok],
                                 "set_aside": [g for g, k, ok, av in zip(partitions, kept, good, averaged)
                                               if ok and not (k and av)]})
        unmixing, round_label = updated, round_label + 1
        if change < REFINEMENT_TOLERANCE:
            break
    if not state.refinement:
        _warn_noisy(state)
        return
    state.one_shot_mixing = one_shot
    if state.refinement[-1]["change"] >= REFINEMENT_TOLERANCE:
        # FastICA converges quadratically from a start this close; steps that keep turning the rows are what a
        # minority steering within the cut produces (measured: 40 % of sites, 4e-3 a step for 20 steps).
        state.refinement_reverted = list(range(one_shot.shape[1]))
        _warn(f"RF-ICA: the refinement did not converge in {len(state.refinement)} steps (last change "
              f"{state.refinement[-1]['change']:.2e}); the one-shot aggregate stands")
        _warn_noisy(state)
        return
    refined = np.linalg.pinv(whitening) @ np.linalg.inv(unmixing)
    refined /= np.linalg.norm(refined, axis=0)
    refined *= np.where(np.sum(refined * one_shot, axis=0) < 0, -1.0, 1.0)
    with state.server_time():
        inside = within_one_shot_spread(refined, _one_shot_clusters(state), gm_tol=state.gm_tol)
    state.refinement_reverted = [int(j) for j in np.flatnonzero(~inside)]
    if state.refinement_reverted:
        refined[:, ~inside] = one_shot[:, ~inside] / np.linalg.norm(one_shot[:, ~inside], axis=0)
        _warn(f"RF-ICA: the refinement moved column(s) {', '.join(map(str, state.refinement_reverted))} beyond the "
              "spread of their sites' estimates; the one-shot column(s) stand")
    state.aggregate = replace(state.aggregate, rf_ica=refined)
    # The sites the converged step set aside: those the result leaves out. A site set aside at an earlier step only,
    # where the start's error is largest and the evidence's first-order model least exact (an honest site at 6 to 7
    # cuts at the first step, within one at the last: 16 channels, 8 sources), took part in the fixed point.
    set_aside = sorted(state.refinement[-1]["set_aside"])
    if set_aside:
        _warn(f"RF-ICA: the refinement set aside the averages of site(s) {', '.join(map(str, set_aside))}, far beyond "
              "the others'")


def _sensor_noise(state: RFICAState, whitening: np.ndarray,
                  unmixing: np.ndarray) -> tuple[dict[int, np.ndarray] | None, set[int]]:
    """Each site's sensor noise in the whitened coordinates, by site, and the sites whose noise marks them noisy:
    read outside the sources' subspace (:func:`fedica.rfica.whitening.site_noise`), or with as many components as
    channels at the one-shot ``unmixing`` (:func:`fedica.rfica.whitening.square_site_noise`); None and none without
    covariances."""
    participants = set(state.partitions)
    partitions = [g for g in state.site_covariances if g in participants]
    if not partitions:
        return None, set()
    with state.server_time():
        covariances = np.stack([state.site_covariances[g] for g in partitions])
        complete = [g not in state.bad_channels for g in partitions]
        if whitening.shape[0] < whitening.shape[1]:
            noise, noisy = site_noise(covariances, whitening, complete=complete)
        else:
            noise, noisy = square_site_noise(covariances, whitening, unmixing, complete=complete)
    flagged = {g for g, flag in zip(partitions, noisy) if flag and g not in state.bad_channels}
    return (None if noise is None else dict(zip(partitions, noise))), flagged


def _one_shot_clusters(state: RFICAState) -> list[np.ndarray]:
    """Each one-shot cluster's signed unit columns (``(members, p)``), as the aggregation grouped them."""
    aggregate = state.aggregate
    signed = normalise_estimates(np.stack(state.estimates)) * aggregate.signs[:, None, :]
    columns = np.transpose(signed, (0, 2, 1)).reshape(-1, signed.shape[1])
    return [columns[aggregate.labels.ravel() == j] for j in range(signed.shape[2])]


def _valid_covariances(state: RFICAState, replies: list[Reply], round_label: int, channels: int):
    """The valid channel covariances and means of a covariance exchange, their sites (the others refused), and which
    of them named no bad channel."""
    covariances, means, partitions, complete = [], [], [], []
    for reply in replies:
        try:
            covariance, _ = validate_covariance_reply(reply.arrays, reply.values, r=channels)
            mean = validate_channel_means(reply.arrays, r=channels)
            bad = validate_bad_channel_list(reply.arrays, r=channels)
        except InvalidReply as err:
            state.reject(reply.partition_id, round_label, f"invalid reply: {err}")
            continue
        covariances.append(covariance)
        means.append(mean)
        partitions.append(reply.partition_id)
        complete.append(bad.size == 0)
        state.site_covariances[reply.partition_id] = covariance
        state.client_seconds += reported_seconds(reply)
    return covariances, means, partitions, np.array(complete, dtype=bool)


def federation_moments(state: RFICAState, covariances: list[np.ndarray], means: list[np.ndarray]) -> None:
    """The federation's robust channel covariance (:func:`fedica.rfica.whitening.robust_covariance`) and centre, into ``state``.

    The centre is the geometric median of the sites' means: breakdown point 1/2, as the covariance's,
    so that no minority of sites can move where new observations are centred by more than the
    honest sites' own spread. It serves only to centre observations the run did not see (the
    sources' constant offsets); the estimate does not depend on it.
    """
    with state.server_time():
        state.global_covariance = robust_covariance(np.stack(covariances), gm_tol=state.gm_tol)
        state.global_mean = geometric_median(np.stack(means), tol=state.gm_tol)


def _refinement_statistics(state: RFICAState, replies: list[Reply], round_label: int, r: int):
    """The valid averages of one refinement step, and their sites."""
    statistics, partitions = [], []
    for reply in replies:
        try:
            covariance, moments, slopes, n_samples = validate_refinement_reply(reply.arrays, reply.values, r=r)
            blocks = validate_refinement_blocks(reply.arrays, r=r) or (None, None, None)
        except InvalidReply as err:
            state.reject(reply.partition_id, round_label, f"invalid reply: {err}")
            continue
        statistics.append(RefinementStatistics(covariance, moments, slopes, n_samples, *blocks))
        partitions.append(reply.partition_id)
        state.client_seconds += reported_seconds(reply)
    return statistics, partitions


def receive_covariances(state: RFICAState, replies: list[Reply]) -> None:
    """Validate the sites' channel covariances and form the shared whitening from them (robustly).

    The federation's channel count is the majority's unless given; the number of components is
    ``n_components`` (at most the channel count), or for a share the count the robust global
    covariance needs (:func:`fedica.rfica.whitening.federated_whitening`).
    """
    r = state.r if state.r is not None else (majority_width(replies, "covariance") or 0)
    covariances, means, state.covariance_partitions, complete = _valid_covariances(state, replies, 1, r)
    if not covariances:
        return
    if isinstance(state.n_components, Integral) and state.n_components > r:
        raise RunStopped(f"n_components={state.n_components} is more than the federation's {r} channels")
    state.r = r
    federation_moments(state, covariances, means)
    decisive: list[int] = []
    with state.server_time():
        state.whitening_matrix, state.global_eigenvalues = whitening_of(state.global_covariance, state.n_components,
                                                                        covariances, complete=complete,
                                                                        decisive=decisive, gm_tol=state.gm_tol)
    state.components = state.whitening_matrix.shape[0]
    _warn_decisive(state, [state.covariance_partitions[i] for i in decisive])


def _warn_noisy(state: RFICAState) -> None:
    """Name the sites read noisy where the refinement names no site (it stopped or did not converge): their evidence is
    their covariance, whatever became of the refinement (the converged step's warning names them with the others)."""
    if state.noisy_sites:
        _warn(f"RF-ICA: site(s) {', '.join(map(str, state.noisy_sites))} read noisy from their covariances (sensor "
              "noise far beyond the other sites'); the refinement did not average them")


def _warn_decisive(state: RFICAState, partitions: list[int]) -> None:
    """Record and say which sites the pooled subspace left out as deciding a direction alone."""
    if not partitions:
        return
    state.subspace_left_out = sorted(set(state.subspace_left_out) | set(partitions))
    _warn(f"RF-ICA: the shared subspace leaves out site(s) {', '.join(map(str, partitions))}: a direction no other "
          "site holds (a source no other site sees, or a made-up one; one site alone does not decide a component), or "
          "a covariance outside the others' subspace")


def receive_estimates(state: RFICAState, replies: list[Reply], *, round_label: int = 1) -> None:
    """Validate the clients' local mixing matrices (n_channels x components) and their convergence reports.

    The federation's channel count is the majority's unless given, and so is the number of
    components unless ``n_components`` (an int) or the federated whitening fixed it. One warning
    line names the sites whose local ICA did not converge after its retry.
    """
    r = state.r if state.r is not None else _majority_rows(replies)
    if state.components is None:
        state.components = (state.n_components if isinstance(state.n_components, Integral)
                            else majority_width(replies, "mixing") if state.n_components is not None else r)
    for reply in replies:
        try:
            mixing, n_k = validate_ica_reply(reply.arrays, reply.values, r=r, n_components=state.components)
            n_iter, converged = validate_ica_convergence(reply.values)
            variances = validate_column_variances(reply.arrays, mixing)
        except InvalidReply as err:
            state.reject(reply.partition_id, round_label, f"invalid reply: {err}")
            continue
        state.estimates.append(mixing)
        state.n_samples.append(n_k)
        state.partitions.append(reply.partition_id)
        state.n_iter.append(n_iter)
        state.converged.append(converged)
        state.column_variances.append(variances)
        state.client_seconds += reported_seconds(reply)
    fill_bad_channels(state, round_label)
    compare_channels_alike(state)
    refuse_degenerate(state, round_label)
    state.unconverged = [g for g, ok in zip(state.partitions, state.converged) if ok is False]
    if state.unconverged:
        iterations = ", ".join(str(n) for n, ok in zip(state.n_iter, state.converged) if ok is False)
        _warn(f"RF-ICA: the local ICA of site(s) {', '.join(map(str, state.unconverged))} did not converge, even "
              f"after a retry (iterations: {iterations}); their estimates are kept for the robust aggregation")


def compare_channels_alike(state: RFICAState) -> None:
    """Measure the channels' scales in the estimates; when they are far apart, compare columns with each channel scaled.

    Below :data:`~fedica.rfica.aggregation.CHANNEL_SCALE_SPREAD_LIMIT`, with no channel's scale under
    :data:`~fedica.rfica.aggregation.SMALLEST_CHANNEL_SCALE_LIMIT` of the median's, nothing changes (the paper's
    comparison in the channels' units). Above it the degeneracy check and the aggregation see every
    channel divided by its scale, the aggregate's columns go back to the channels' units, and one
    warning line says so (docs/ALGORITHMS.md section 1.4.3).
    """
    if not state.estimates:
        return
    with state.server_time():
        scales = channel_scales(np.stack(state.estimates))
        state.channel_scale_spread = channel_scale_spread(scales)
        state.smallest_channel_scale = smallest_channel_scale(scales)
    if state.channel_scale_spread > CHANNEL_SCALE_SPREAD_LIMIT:
        state.channel_scales = scales
        warnings.warn(f"RF-ICA: the channels' scales differ {state.channel_scale_spread:.3g}-fold (largest over the "
                      "median, in the sites' estimates); the sites' columns were compared with each channel divided by "
                      "its scale, so that no channel's unit decides the clusters", UserWarning, stacklevel=2)
    elif state.smallest_channel_scale < SMALLEST_CHANNEL_SCALE_LIMIT:
        state.channel_scales = scales
        warnings.warn(f"RF-ICA: a channel's scale is {state.smallest_channel_scale:.3g} of the median channel's (in the "
                      "sites' estimates: a channel in far smaller units); the sites' columns were compared with each "
                      "channel divided by its scale, so that no channel's unit decides the clusters", UserWarning,
                      stacklevel=2)


def _compared(state: RFICAState) -> np.ndarray:
    """The accepted estimates as the server compares them: in the channels' units, or each channel scaled."""
    stack = np.stack(state.estimates)
    return stack if state.channel_scales is None else stack / state.channel_scales[:, None]


def refuse_degenerate(state: RFICAState, round_label: int = 1) -> None:
    """Refuse the accepted estimates :func:`fedica.rfica.trust.estimate_defects` finds degenerate, each with its reason."""
    if not state.estimates:
        return
    with state.server_time():
        defects = estimate_defects(_compared(state))
    for index in sorted(defects, reverse=True):
        state.reject(state.partitions[index], round_label, f"degenerate estimate: {defects[index]}")
        for books in (state.estimates, state.n_samples, state.partitions, state.n_iter, state.converged,
                      state.column_variances):
            del books[index]


def fill_bad_channels(state: RFICAState, round_label: int = 1) -> None:
    """Complete the estimates of sites with bad channels from the complete sites' aggregate (section 1.12).

    The reference is the one-shot aggregate of the sites that sent every channel, with the run's
    own settings; each incomplete estimate is filled from it (:func:`fedica.rfica.filling.fill_from_reference`)
    and enters the aggregation as any other. One warning names the sites and their bad channels.
    With fewer than two complete sites there is no consensus to fill from: each estimate is filled on
    its own (:func:`fedica.rfica.filling.fill_alone`: zeros on the bad rows), as a federation of one
    with a constant column needs.
    """
    incomplete = [i for i, estimate in enumerate(state.estimates) if np.isnan(estimate).any()]
    if not incomplete:
        return
    complete = [i for i in range(len(state.estimates)) if i not in incomplete]
    bad = {state.partitions[i]: [int(c) for c in bad_rows(state.estimates[i])] for i in incomplete}
    with state.server_time():
        if len(complete) < 2:
            for i in incomplete:
                state.estimates[i] = fill_alone(state.estimates[i])
        else:
            reference = rf_ica_aggregate(
                np.stack([state.estimates[i] for i in complete]), np.asarray(state.n_samples)[complete],
                benchmark=state.benchmark, kmeans_restarts=state.kmeans_restarts, gm_tol=state.gm_tol,
                clustering=state.clustering, center=state.center, random_state=state.seed,
                column_weights=site_column_weights(state, complete)).rf_ica
            for i in incomplete:
                state.estimates[i] = fill_from_reference(state.estimates[i], reference)
    state.bad_channels = bad
    _warn("RF-ICA: bad channels (flat: dead, disconnected, constant or not recorded; or saturated: clipped at a rail): "
          + "; ".join(f"site {g}: channel(s) {', '.join(map(str, channels))}" for g, channels in bad.items())
          + ". These sites estimated their columns on their other channels, the server filled those channels from "
          "the sites that have them, and they take no part in the refinement")


def _majority_rows(replies: list[Reply]) -> int:
    """The row count (channels) of the 2-D ``mixing`` most replies report, so that one client cannot set it; 0 for none."""
    rows = [r.arrays["mixing"].shape[0] for r in replies
            if isinstance(r.arrays.get("mixing"), np.ndarray) and r.arrays["mixing"].ndim == 2]
    if not rows:
        return 0
    values, counts = np.unique(rows, return_counts=True)
    return int(values[np.argmax(counts)])


def site_column_weights(state: RFICAState, indices=None) -> np.ndarray | None:
    """Each accepted estimate's column weights (:func:`fedica.rfica.uncertainty.column_weights`), shape (K, r).

    A site that reported no variances weighs 1 in every column, as an ordinary site; None when no
    site reported any (estimates handed to the server directly, or a private run's releases).
    """
    indices = range(len(state.estimates)) if indices is None else indices
    reported = [state.column_variances[i] for i in indices]
    if all(variances is None for variances in reported):
        return None
    width = state.estimates[0].shape[1]
    return np.stack([np.ones(width) if variances is None else column_weights(variances) for variances in reported])


def aggregate_estimates(state: RFICAState) -> None:
    """The robust one-shot aggregation of the received estimates."""
    with state.server_time():
        state.aggregate = rf_ica_aggregate(
            _compared(state), np.asarray(state.n_samples), benchmark=state.benchmark,
            kmeans_restarts=state.kmeans_restarts, gm_tol=state.gm_tol, clustering=state.clustering,
            center=state.center, random_state=state.seed, column_weights=site_column_weights(state))
        scales = state.channel_scales
        if scales is not None:
            state.aggregate = replace(state.aggregate, **{
                name: in_channel_units(getattr(state.aggregate, name), scales)
                for name in ("rf_ica", "f_ica", "simple_mean", "simple_median")})

