"""FedGEM's coordinator: the server side of its protocol, which any transport can drive (docs/ALGORITHMS.md section 2).

:meth:`FedGEMServer.run` is a generator: it yields a :class:`~fedica.protocol.Request` (what to
ask which clients), and is sent back the valid-looking :class:`~fedica.protocol.Reply` list.
The estimator :class:`fedica.FedGEM` answers the requests in memory; Flower's
``FedGEMStrategy`` answers them over a Grid. Both run this one numerical path: the
initialisation exchange, T collaborative rounds, the final stage, the upsilon tuning and the
final aggregation, with the server's trust rules (:mod:`fedica.fedgem.trust`).
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedica.fedgem import privacy
from fedica.fedgem.components import ClientModel, Components, Support
from fedica.fedgem.evaluation import ClientEvaluation, EvaluationStage
from fedica.fedgem.families import FamilyModel
from fedica.fedgem.family_stage import FamilyStage
from fedica.fedgem.geometry import CLUSTER_ANISOTROPY_LIMIT, FEATURE_SCALE_SPREAD_LIMIT, families_of, geometry
from fedica.fedgem.merging import FinalAggregation
from fedica.fedgem.overlaps import TooManyOverlaps
from fedica.fedgem.selection import Candidate
from fedica.fedgem.selection_stage import Protocol, SelectionStage
from fedica.fedgem.standardisation import STANDARDISATION_KEY, encode_standardisation, federated_scale
from fedica.fedgem.trust import (
    FederationExtent,
    admit_components,
    cap_counts,
    cluster_support,
    final_radii,
    hostile_count,
    log_excluded,
    refuse_far_components,
    trusted_final_aggregation,
    trusted_grid_aggregations,
    trusted_server_step,
)
from fedica.protocol import (
    CLUSTER_SHAPE_KEY,
    GEM_EVALUATE,
    GEM_FINAL,
    GEM_INIT,
    GEM_MOMENTS,
    GEM_ROUND,
    GEM_SILHOUETTE,
    K_AT_BOUND_KEY,
    REPORT_CLUSTER_SHAPE_KEY,
    REPORT_SCALE_SPREAD_KEY,
    SCALE_SPREAD_KEY,
    InvalidReply,
    OverBudget,
    ProtocolState,
    Reply,
    Request,
    client_text,
    majority_width,
    optional_float,
    reported_seconds,
    require_array,
    require_int,
    validate_gem_components,
    validate_weights,
)
from fedica.parameters import FEDGEM_PARAMETERS
from fedica.seeding import generator

log = logging.getLogger("fedica.server")


def _default(name: str) -> Any:
    """A FedGEM parameter's default, declared once with its rule in :data:`fedica.parameters.FEDGEM_PARAMETERS`."""
    return FEDGEM_PARAMETERS[name].default


@dataclass
class FedGEMSettings:
    """FedGEM's server-side parameters (the ``algorithm=fedgem`` config keys).

    The defaults, rules and meanings are :data:`fedica.parameters.FEDGEM_PARAMETERS`' (``seed`` is
    its ``random_state``); the entry points check the values against it before building these.
    """

    rounds: int = _default("rounds")
    local_steps: int = _default("local_steps")
    upsilon: float | str = _default("upsilon")
    upsilon_grid: Sequence[float] = _default("upsilon_grid")
    upsilon_criterion: str = _default("upsilon_criterion")
    same_client_rule: str = _default("same_client_rule")
    guard_factor: float = _default("guard_factor")
    n_init: int = _default("n_init")
    local_start: str = _default("local_start")
    silhouette_sample: int = _default("silhouette_sample")
    radius_outlier_factor: float | None = _default("radius_outlier_factor")
    count_cap_factor: float | None = _default("count_cap_factor")
    component_cap_factor: float | None = _default("component_cap_factor")
    max_hostile_fraction: float = _default("max_hostile_fraction")
    max_overlap_pairs: int | None = _default("max_overlap_pairs")
    participation: float = _default("participation")
    covariance_type: str = _default("covariance_type")
    labelling: str = _default("labelling")
    standardize: str | None = _default("standardize")
    min_clients: int = _default("min_clients")
    seed: int = _default("random_state")
    dp_epsilon: float | None = _default("dp_epsilon")
    dp_delta: float = _default("dp_delta")
    dp_clip: float | None = _default("dp_clip")
    dp_unit: str = _default("dp_unit")

    @classmethod
    def from_config(cls, algorithm: dict[str, Any], *, min_clients: int, seed: int) -> FedGEMSettings:
        """The settings of a validated ``algorithm`` config section (its declared keys; ``name`` is not one)."""
        keys = FEDGEM_PARAMETERS.config_keys
        return cls(**{k: algorithm[k] for k in keys if k in algorithm}, min_clients=min_clients, seed=seed)


@dataclass
class FedGEMServer(EvaluationStage, FamilyStage, SelectionStage, ProtocolState):
    """The server's state during one FedGEM run (its books: :class:`~fedica.protocol.ProtocolState`).

    The choice of K (:class:`~fedica.fedgem.selection_stage.SelectionStage`), the covariance family
    (:class:`~fedica.fedgem.family_stage.FamilyStage`) and the evaluation
    (:class:`~fedica.fedgem.evaluation.EvaluationStage`) are stages of their own, over this state.

    Parameters
    ----------
    settings : FedGEMSettings
    evaluate : bool, default=True
        Ask the clients, at the end, to label their test points with the consensus model and
        return contingency counts (a run on data with held-out labels).
    rejected : list, optional
        Where a reply that was left out is recorded as ``{client, round, reason}`` (pass the
        transport's list to keep one book).

    Attributes
    ----------
    models : dict of int to ClientModel
        Each initialised client's declared sizes and current centroids.
    history : list of dict
        One entry per collaborative round (``super_clusters``, ``mean_radius``, ``centroid_shift``, ...).
    aggregation : FinalAggregation
        The final super-clusters, once :meth:`run` has finished.
    """

    settings: FedGEMSettings
    evaluate: bool = True
    models: dict[int, ClientModel] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        s = self.settings
        if s.same_client_rule == "evidence" and s.upsilon == "auto" and s.upsilon_criterion != "likelihood":
            raise ValueError(f"same_client_rule='evidence' with upsilon_criterion={s.upsilon_criterion!r}: the "
                             "evidence rule's joins are judged by the clients' ICL; use 'likelihood', a fixed upsilon or "
                             "same_client_rule='strict'")
        self.geometry = geometry(self.settings.covariance_type)
        self.dim: int | None = None
        self.final: Components | None = None
        self.support: Support | None = None
        self.aggregation: FinalAggregation | None = None
        self.upsilon: float | None = None
        self.merges = 0
        self.tuning: dict[str, Any] | None = None
        # How sure K_hat is: each K's weight under the criterion and each global cluster's stability (_support_of_k).
        self.k_support: dict[str, Any] | None = None
        # Every K_hat the selection's criterion scored and its score (the candidates, then their neighbours).
        self.scored_candidates: tuple[np.ndarray, np.ndarray] | None = None
        # The finest partition the likelihood selection scored (the grid's largest K_hat): a covariance family's path
        # starts from it too (docs/ALGORITHMS.md 2.14, "Where the paths start").
        self.finest_candidate: Candidate | None = None
        self.skipped_upsilons: dict[float, str] = {}   # the grid's values over max_overlap_pairs, and why
        self.evaluation: dict[str, float] = {}
        self.client_aris: dict[str, float] = {}
        self.evaluated: dict[int, ClientEvaluation] = {}
        self.excluded_clients: set[int] = set()  # whose components took part in no merge in some round
        self.extent: FederationExtent | None = None  # where the initial centroids lie: the far rule's scale
        self.privacy = privacy.fedgem_plan(self.settings)  # None unless dp_epsilon is set
        self.final_counts: np.ndarray | None = None  # a private run's noisy counts of the final components
        self.final_variances: np.ndarray | None = None  # and their maximisers' noise variances
        self.distrusted: dict[int, str] = {}  # clients caught planting a cluster, and why: trusted no more
        # by upsilon, for the distrusted above (or the upsilon's TooManyOverlaps)
        self.aggregated: dict[float, tuple[FinalAggregation, np.ndarray, dict[int, str]] | TooManyOverlaps] = {}
        # The median site's feature_scale_spread (None when no site reported one: a private run never asks).
        self.feature_scale_spread: float | None = None
        # The median site's cluster_anisotropy under its final local model (None when no site reported one).
        self.cluster_anisotropy: float | None = None
        # The admitted sites that chose their K_g at their bound (they may hold more clusters than they fit).
        self.local_clusters_at_bound: list[int] = []
        # Under standardize: federated, every feature's location and scale the sites standardise by (None: the data's
        # own units); every centre the server holds is then in standardised units.
        self.feature_location: np.ndarray | None = None
        self.feature_scale: np.ndarray | None = None
        # What every request after the standardisation names of them (empty: the data's own units), for whoever
        # labels a site's points as the site itself does (the harness's silhouettes).
        self.units: dict[str, str] = {}
        # Under a covariance family (diag, full, auto): the families scored, and the global clusters the BIC chose
        # from the sites' moments of the chosen partition's clusters (fedica.fedgem.families; None otherwise).
        self.families = families_of(self.settings.covariance_type) if self.privacy is None else ()
        self.family: FamilyModel | None = None
        self._family_reg = 0.0  # added to every family covariance's diagonal, from the pooled points' spread
        self._family_sites: list[int] = []  # the partitions of the last family stage's kept replies, in order

    @property
    def min_clients(self) -> int:
        return int(self.settings.min_clients)

    # ------------------------------------------------------------------ the protocol

    def run(self) -> Protocol:
        """The whole protocol; see the module docstring for how to drive it."""
        s = self.settings
        # The covariance type travels with every request that runs the model, so the sites follow the server.
        model = {"covariance-type": s.covariance_type}
        if self.privacy is not None:  # the sites add the noise the plan names (fedica.fedgem.privacy.private_reply)
            model.update(self.privacy.request_values(s.seed))
        if s.standardize == "federated":
            self._standardise((yield Request(GEM_MOMENTS, "moments", None, {})))
            self.units[STANDARDISATION_KEY] = encode_standardisation(self.feature_location, self.feature_scale)
            model.update(self.units)
        start = {"n-init": s.n_init, "local-start": s.local_start, "seed": s.seed, **model}
        if self.privacy is None:  # one number of each site's data, which a private run's noise would not cover
            start[REPORT_SCALE_SPREAD_KEY] = True
        self._initialise((yield Request(GEM_INIT, "init", None, start)))
        for round_number in range(1, s.rounds + 1):
            payloads = {p: self._site_model(self.models[p]) for p in self._participants(round_number)}
            replies = yield Request(GEM_ROUND, round_number, payloads, {"local-steps": s.local_steps, **model})
            self._collaborative_round(round_number, replies)
        payloads = {p: self._site_model(m) for p, m in self.models.items()}
        final_values = model if self.privacy is not None else {**model, REPORT_CLUSTER_SHAPE_KEY: True}
        self._final_stage((yield Request(GEM_FINAL, "final", payloads, final_values)))
        if s.upsilon != "auto":
            self.upsilon = float(s.upsilon)
            self._aggregate()
            if s.same_client_rule == "evidence":  # the ICL judges the joins the strict rule refused at this upsilon
                yield from self._select(self._refused_join_candidates(), model)
        elif s.upsilon_criterion == "silhouette":
            candidates, aggregations = self._tuning_candidates()
            replies = yield Request(GEM_SILHOUETTE, "silhouette", candidates,
                                    {"sample": s.silhouette_sample, "seed": s.seed, **self.units})
            self._choose_upsilon(aggregations, replies)
            self._aggregate()
        else:
            yield from self._select(self._likelihood_candidates(), model)
        if self.skipped_upsilons:
            self.tuning["skipped"] = {str(u): why for u, why in self.skipped_upsilons.items()}
        if self.families:
            yield from self._family_stage()
        self._support_of_k()
        if self.evaluate:
            payloads = self.evaluation_payloads()
            replies = yield Request(GEM_EVALUATE, "evaluate", payloads,
                                    {"labelling": s.labelling, "covariance-type": s.covariance_type, **self.units})
            self._evaluate(replies, payloads)
        counts = [entry["excluded_components"] for entry in self.history if entry["excluded_components"]]
        if counts:
            log.warning("FedGEM: components of %d of %d clients with outlying radii took part in no merge in %d of %d "
                        "rounds (%d in all, at most %d a round; each round's count is its history's "
                        "excluded_components)", len(self.excluded_clients), len(self.models), len(counts),
                        len(self.history), sum(counts), max(counts))

    def in_data_units(self, centres: np.ndarray) -> np.ndarray:
        """Centres the server holds (standardised under ``standardize``) in the data's own units."""
        if self.feature_scale is None:
            return centres
        return centres * self.feature_scale + self.feature_location

    def consensus_payloads(self, aggregation: FinalAggregation | None = None) -> dict[int, dict[str, np.ndarray]]:
        """Each client's consensus model: the global centroid and global id of each of its components (of the chosen
        partition, or of ``aggregation``)."""
        agg = self.aggregation if aggregation is None else aggregation
        return {p: {"centroids": agg.global_centroids[agg.labels[part]], "global-ids": agg.labels[part]}
                for p, part in self.final.slices().items()}

    def evaluation_payloads(self, aggregation: FinalAggregation | None = None) -> dict[int, dict[str, np.ndarray]]:
        """What each client labels its test points with (``labelling``): its consensus model, or every global centre
        (of the chosen partition, or of ``aggregation``).

        Under ``adapted`` every client of the final stage gets the global centres of all K_hat
        clusters and their ids (K_hat x d numbers), and fits its own weights to them
        (:func:`fedica.fedgem.client.adapted_labels`).
        """
        if self.settings.labelling == "consensus":
            return self.consensus_payloads(aggregation)
        agg = self.aggregation if aggregation is None else aggregation
        every = {"centroids": agg.global_centroids, "global-ids": np.arange(agg.global_centroids.shape[0])}
        if self.family is not None:  # the site's mixture holds the family's covariances (fedica.fedgem.families)
            every["covariances"] = self.family.covariances
        return {p: every for p in self.final.slices()}

    # ------------------------------------------------------------------ stages

    def _standardise(self, replies: list[Reply]) -> None:
        """The location and scale of every feature from the sites' column means and deviations (``standardize``).

        Medians over the valid replies, each site one vote (:func:`fedica.fedgem.standardisation.federated_scale`):
        fewer than half of the sites cannot move them outside the honest sites' range.
        """
        dim = majority_width(replies, "moments")
        means, deviations = [], []
        for reply in replies:
            try:
                moments = require_array(reply.arrays, "moments", (2, dim))
                if np.any(moments[1] < 0):
                    raise InvalidReply("'moments' holds a negative standard deviation (its second row)")
            except InvalidReply as err:
                self.reject(reply.partition_id, "moments", f"invalid reply: {err}")
                continue
            means.append(moments[0])
            deviations.append(moments[1])
            self.client_seconds += reported_seconds(reply)
        self.require(len(means), "FedGEM standardisation")
        with self.server_time():
            self.feature_location, self.feature_scale = federated_scale(means, deviations)

    def _initialise(self, replies: list[Reply]) -> None:
        self.dim = majority_width(replies, "centroids")
        spreads: dict[int, float] = {}
        bounded: list[int] = []
        for reply in replies:
            try:
                centroids = validate_gem_components(reply.arrays, "centroids", dim=self.dim, n_components=None)
                weights = validate_weights(reply.arrays, "weights", centroids.shape[0])
                n_points = require_int(reply.values, "n-points", minimum=centroids.shape[0])
                spread = optional_float(reply.values, SCALE_SPREAD_KEY, minimum=1.0)
                variances = (positive_array(reply.arrays, "variances", centroids.shape[0])
                             if self.geometry.learns_variance else None)
                at_bound = reply.values.get(K_AT_BOUND_KEY, False)
                if not isinstance(at_bound, bool):
                    raise InvalidReply(f"{K_AT_BOUND_KEY!r}={client_text(at_bound, 40)} is not true or false")
            except InvalidReply as err:
                self.reject(reply.partition_id, "init", f"invalid reply: {err}")
                continue
            self.models[reply.partition_id] = ClientModel(n_points, weights, centroids, n_points, variances)
            self.client_seconds += reported_seconds(reply)
            if spread is not None:
                spreads[reply.partition_id] = spread
            if at_bound:
                bounded.append(reply.partition_id)
        refused = refuse_far_components(self.models)
        if self.models:
            # The data's extent, from the clients' own local fits: the centroids the server holds later
            # converge onto the super-clusters' centres, whose median distance to their median is no scale.
            self.extent = FederationExtent.of(np.vstack([m.centroids for m in self.models.values()]))
        refused += admit_components(self.models, self.settings.component_cap_factor, set(bounded))
        for partition, reason in refused:
            self.reject(partition, "init", reason)
        if refused:  # a site left out is a result without its points: said where the result is read, not in a log only
            shown = "; ".join(f"site {partition}: {reason}" for partition, reason in refused[:5])
            warnings.warn(f"FedGEM: {len(refused)} of {len(self.models) + len(refused)} sites' local models were refused "
                          f"at initialisation, and K_hat and the labels leave out their points ({shown}"
                          f"{'; ...' if len(refused) > 5 else ''})", UserWarning, stacklevel=2)
        self.require(len(self.models), "FedGEM initialisation")
        cap_counts(self.models, self.settings.count_cap_factor)
        self._check_feature_scales([spreads[p] for p in self.models if p in spreads])
        self.local_clusters_at_bound = sorted(p for p in bounded if p in self.models)
        if self.local_clusters_at_bound:
            shown = ", ".join(map(str, self.local_clusters_at_bound[:20]))
            remedy = ("; give their n_components, or more points per site" if self.settings.standardize else
                      ", as features in different units make them (standardize='federated' puts every feature on one "
                      "scale; else give their n_components, or more points per site)")
            warnings.warn(f"FedGEM: {len(self.local_clusters_at_bound)} of {len(self.models)} sites chose their K_g at "
                          f"their bound (sites {shown}{', ...' if len(self.local_clusters_at_bound) > 20 else ''}): each "
                          f"may hold more clusters than it fits, or clusters that spheres fit badly{remedy}",
                          UserWarning, stacklevel=2)

    @staticmethod
    def _sites_median_check(values: list[float], limit: float, warning: Callable[[float, int], str]) -> float | None:
        """The median of one number per site (None with none), with a ``UserWarning`` when it exceeds ``limit``.

        A median, so that fewer than half of the clients can neither raise the warning nor silence it. ``warning``
        gives the text from the median and the count of sites.
        """
        if not values:
            return None
        median = float(np.median(values))
        if median > limit:
            warnings.warn(warning(median, len(values)), UserWarning, stacklevel=3)
        return median

    def _check_feature_scales(self, spreads: list[float]) -> None:
        """Warn when the sites' features are in units the isotropic model cannot weigh alike (ALGORITHMS.md 2.11.1)."""
        self.feature_scale_spread = self._sites_median_check(spreads, FEATURE_SCALE_SPREAD_LIMIT, lambda spread, n: (
            f"FedGEM: the features' scales differ {spread:.3g}-fold (largest column standard deviation over the median "
            f"of the others', median of {n} sites; over {FEATURE_SCALE_SPREAD_LIMIT:g}, the model's one variance per component "
            "weighs the features by their units): K_hat and the labels are not to be trusted; standardise each feature "
            "by one scale shared by all sites (standardize='federated')"))

    def _check_cluster_shapes(self, anisotropies: list[float]) -> None:
        """Warn when the sites' clusters are far from the spheres the model fits (ALGORITHMS.md 2.11.3). Under a
        covariance family the global clusters take their shapes (2.14): the number is kept and nothing is said."""
        if self.families:
            self.cluster_anisotropy = float(np.median(anisotropies)) if anisotropies else None
            return
        self.cluster_anisotropy = self._sites_median_check(anisotropies, CLUSTER_ANISOTROPY_LIMIT, lambda shape, n: (
            f"FedGEM: the clusters are not spheres: within them the largest variance is {shape:.3g} times what "
            f"spherical clusters reach by chance (cluster_anisotropy, median of {n} sites; over "
            f"{CLUSTER_ANISOTROPY_LIMIT:g}): the model fits an elongated or correlated cluster with several spherical "
            "components, so K_hat may count more clusters than the data hold and split one between them"))

    @staticmethod
    def _site_model(model: ClientModel) -> dict[str, np.ndarray]:
        """What a round or the final stage sends a site: the centroids it adopts, and a spherical site's variances at them.

        A site keeps nothing between messages that the request does not give back: a site restarted mid-run,
        or a run resumed from its journal, computes the same step (docs/ALGORITHMS.md 3.1.1).
        """
        if model.variances is None:
            return {"centroids": model.centroids}
        return {"centroids": model.centroids, "variances": model.variances}

    def _participants(self, round_number: int) -> list[int]:
        """The clients asked in a round: all, or a seeded random share (at least ``min_clients``)."""
        partitions = sorted(self.models)
        share = self.settings.participation
        if share >= 1.0:
            return partitions
        count = min(len(partitions), max(int(self.settings.min_clients), math.ceil(share * len(partitions))))
        rng = generator(int(self.settings.seed), "server.participation", round_number)
        return sorted(rng.choice(partitions, size=count, replace=False).tolist())

    def _collaborative_round(self, round_number: int, replies: list[Reply]) -> None:
        components = self._collect(replies, round_number, self._round_radii, variances=self.geometry.learns_variance)
        self.require(len(components.partitions), f"FedGEM round {round_number}")
        with self.server_time():
            try:
                new_centers, n_super, excluded = trusted_server_step(components, self.settings.radius_outlier_factor,
                                                                     self.settings.max_overlap_pairs)
            except TooManyOverlaps as err:
                raise OverBudget(f"FedGEM round {round_number}: {err}; raise algorithm.max_overlap_pairs") from err
        log_excluded(components, excluded, round_number, logging.DEBUG)  # the run sums them up at its end
        self.excluded_clients.update(components.owners[excluded].tolist())
        shifts = []
        for partition, part in components.slices().items():
            model = self.models[partition]
            shifts.append(np.linalg.norm(new_centers[part] - model.centroids, axis=1))
            model.centroids = new_centers[part]
            if components.variances is not None:
                # The site's variances at the centres it adopts: the conditional M-step it would take itself.
                model.variances = self.geometry.adopted_variances(components.variances[part], components.centers[part],
                                                                  model.centroids)
        self.history.append({
            "round": round_number,
            "clients": components.partitions,
            "super_clusters": n_super,
            "mean_radius": float(np.mean(np.sqrt(components.eps))),
            "centroid_shift": float(np.mean(np.concatenate(shifts))),
            "excluded_components": int(excluded.sum()),
        })
        log.info("FedGEM round %d/%d: %d clients, %d super-clusters, mean radius %.4g", round_number,
                 self.settings.rounds, len(components.partitions), n_super, self.history[-1]["mean_radius"])

    def _final_stage(self, replies: list[Reply]) -> None:
        # eps of the final components holds each one's drift from the centroids the server sent; a
        # spherical site also sends its variances, the unit of length of its final radii. A site's
        # cluster-anisotropy is read with them, so that a malformed one rejects the reply in _collect.
        shapes: dict[int, float] = {}

        def drift(reply, model, maximisers):
            radii = self.geometry.uncertainty_radius(maximisers, model.centroids)
            if (shape := optional_float(reply.values, CLUSTER_SHAPE_KEY, minimum=0.0)) is not None:
                shapes[reply.partition_id] = shape
            return radii if self.privacy is None else self._private_radii(reply, radii, maximisers)

        self.final = self._collect(replies, "final", drift, variances=self.geometry.learns_variance)
        self._check_cluster_shapes([shapes[p] for p in self.final.partitions if p in shapes])
        if self.privacy is not None:
            by_client = {reply.partition_id: reply for reply in replies}  # those kept passed checked_counts
            self.final_counts = np.concatenate([np.asarray(by_client[p].arrays["dp-counts"], dtype=np.float64)
                                                for p in self.final.partitions])
            self.final_variances = np.concatenate([  # per client: a site's v depends on its own K_g
                privacy.maximiser_variance(self.privacy, self.final.centers[part], self.final_counts[part])
                for part in self.final.slices().values()])
        self.require(len(self.final.partitions), "FedGEM final stage")
        self.support = cluster_support(self.models, self.final, self.settings.max_hostile_fraction)
        with self.server_time():
            self._catch_planters()

    def _catch_planters(self) -> None:
        """Distrust, for the rest of the run, every client that the final aggregation catches planting a cluster.

        The aggregation is run at every upsilon the run may choose (the grid, or the fixed one), with
        the clients caught so far distrusted, until it catches no more: every candidate of the
        tuning then sees the same clients distrusted. A client is caught when it plants at half of
        those upsilons or more: colluders hold their plant at one point whatever the radii, while at
        the smallest upsilon honest components fragment into small clusters that may look planted
        (digits, seeds 1-9: five runs of nine had two to four honest clients caught at 1 of 6).

        When the passes catch more clients than ``max_hostile_fraction`` allows to be hostile, the catches
        contradict the trust model: not all of them are colluders, and nothing in their components tells
        which. None is then distrusted, and the run says so (:meth:`_planters_beyond_budget`); the clusters
        they were caught in still count for nothing (the support rule's embedded test).
        """
        if self.support is None:
            return
        upsilons = [float(u) for u in (self.settings.upsilon_grid if self.settings.upsilon == "auto" else [self.settings.upsilon])]
        budget = hostile_count(len(self.final.partitions), self.settings.max_hostile_fraction)
        accused: dict[int, str] = {}
        trusting_all = None  # the first pass's aggregations (no client distrusted), kept should every catch be undone
        while len(self.distrusted) <= budget:
            caught: dict[int, list[str]] = {}
            aggregated = 0
            self._aggregate_grid(upsilons)
            for upsilon in upsilons:
                try:
                    planters = self._final_aggregation(upsilon)[2]
                except TooManyOverlaps:
                    continue  # the tuning leaves this upsilon out and says why
                aggregated += 1
                for partition, reason in planters.items():
                    caught.setdefault(partition, []).append(reason)
            if trusting_all is None and not self.distrusted:
                trusting_all = dict(self.aggregated)
            caught = {p: reasons for p, reasons in caught.items() if 2 * len(reasons) >= aggregated}
            if not caught:
                break
            for partition, reasons in sorted(caught.items()):
                self.distrusted[partition] = reasons[0]
                accused[partition] = f"untrusted (caught at {len(reasons)} of {aggregated} upsilons): {reasons[0]}"
            self.aggregated.clear()
        if len(self.distrusted) > budget:
            self.distrusted.clear()  # filled by these passes only
            # Every aggregation again as the first pass computed it (at G=1,000, 2.5 s a grid).
            self.aggregated = trusting_all if trusting_all is not None else {}
            self._planters_beyond_budget(len(accused), budget)
            return
        for partition, reason in accused.items():
            self.reject(partition, "final", reason)

    def _planters_beyond_budget(self, caught: int, budget: int) -> None:
        """Say that the passes caught more clients planting than may be hostile, and that none is distrusted."""
        # At 1,000 sites (blobs K=50, 500 points a site) honest clients whose K_g joins two close clusters put their
        # components midway between them, 2 to 131 clients at one point: 353 clients were caught, every one honest
        # (K_hat 50 and global ARI .996 either way). Colluders within the budget are still caught and distrusted.
        warnings.warn(f"FedGEM: {caught} clients' components lie in clusters embedded among the supported ones, more "
                      f"than the {budget} clients max_hostile_fraction={self.settings.max_hostile_fraction:g} allows "
                      f"to be hostile: taken for honest misfits (components joining neighbouring clusters); those "
                      f"clusters count for nothing and no client is distrusted for them", UserWarning, stacklevel=3)

    def _aggregate(self) -> None:
        with self.server_time():
            try:
                self.aggregation, excluded, _ = self._final_aggregation(self.upsilon)
            except TooManyOverlaps as err:
                raise OverBudget(f"final aggregation at upsilon {self.upsilon:g}: {err}; lower upsilon or raise max_overlap_pairs") from err
        log_excluded(self.final, excluded, "final")

    def _final_aggregation(self, upsilon: float) -> tuple[FinalAggregation, np.ndarray, dict[int, str]]:
        """The trusted final aggregation at ``upsilon``, its untrusted components and the planters it catches
        beyond :attr:`distrusted` (computed once per upsilon while :attr:`distrusted` stays the same)."""
        stored = self.aggregated.get(upsilon)
        if isinstance(stored, TooManyOverlaps):
            raise TooManyOverlaps(*stored.args)
        if upsilon not in self.aggregated:
            self.aggregated[upsilon] = trusted_final_aggregation(self.final, self._final_radii(upsilon),
                                                                 self.settings.radius_outlier_factor, self.support,
                                                                 self.settings.max_overlap_pairs, self.distrusted)
        return self.aggregated[upsilon]

    def _aggregate_grid(self, upsilons: list[float]) -> None:
        """Fill :attr:`aggregated` at every one of ``upsilons`` not yet in it, in one union-find sweep where the
        radii allow (:func:`~fedica.fedgem.trust.trusted_grid_aggregations`); an upsilon over ``max_overlap_pairs``
        holds its :class:`~fedica.fedgem.overlaps.TooManyOverlaps`, raised by :meth:`_final_aggregation`."""
        missing = [u for u in upsilons if u not in self.aggregated]
        if len(missing) > 1:
            self.aggregated.update(trusted_grid_aggregations(
                self.final, {u: self._final_radii(u) for u in missing}, self.settings.radius_outlier_factor,
                self.support, self.settings.max_overlap_pairs, self.distrusted))

    def _final_radii(self, upsilon: float) -> np.ndarray:
        """The squared final radii at ``upsilon`` (:func:`~fedica.fedgem.trust.final_radii`)."""
        radii = final_radii(self.models, self.final, upsilon, self.geometry)
        if self.privacy is not None:  # each final ball also holds its maximiser's noise
            radii = privacy.widened_radii(radii, self.final_variances, debias=False)
        return radii

    def _grid_aggregations(self) -> list[tuple[float, FinalAggregation, np.ndarray]]:
        """(upsilon, aggregation, excluded) for every upsilon of the grid whose overlaps fit ``max_overlap_pairs``."""
        done = []
        grid = [float(u) for u in self.settings.upsilon_grid]
        self._aggregate_grid(grid)
        for upsilon in grid:
            try:
                done.append((upsilon, *self._final_aggregation(upsilon)[:2]))
            except TooManyOverlaps as err:
                self.skipped_upsilons[upsilon] = str(err)
                log.warning("upsilon %g left out of the tuning: %s", upsilon, err)
        if not done:
            raise OverBudget("no upsilon of upsilon_grid fits max_overlap_pairs: lower upsilon_grid or raise max_overlap_pairs")
        return done

    # ------------------------------------------------------------------ replies

    def _round_radii(self, reply: Reply, model: ClientModel, maximisers: np.ndarray) -> np.ndarray:
        """A collaborative round's squared radii; recomputed on the server where the model allows."""
        radii = require_array(reply.arrays, "radii", (model.n_components,), nonnegative=True)
        n_points = require_int(reply.values, "n-points", minimum=model.n_components)
        if n_points != model.declared_points:
            log.warning("client %d claims %d points, it declared %d at initialisation; the declared count is used",
                        reply.partition_id, n_points, model.declared_points)
        if self.settings.local_steps > 1:
            return radii
        # The server never trusts a reported radius: with one EM step the exact radius is
        # ||M_k - theta_k||^2 for the centroids theta it sent this client itself (under either type).
        recomputed = self.geometry.uncertainty_radius(maximisers, model.centroids)
        if not np.allclose(radii, recomputed, rtol=1e-6, atol=1e-9):
            log.warning("client %d: reported radii %s differ from the recomputed %s; the recomputed are used",
                        reply.partition_id, np.round(radii, 6).tolist(), np.round(recomputed, 6).tolist())
        if self.privacy is not None:
            return self._private_radii(reply, recomputed, maximisers)
        return recomputed

    def _private_radii(self, reply: Reply, radii: np.ndarray, maximisers: np.ndarray) -> np.ndarray:
        """A private reply's GEM ball, widened to hold the noiseless one (fedica.fedgem.privacy.widened_radii)."""
        try:
            counts = privacy.checked_counts(reply.arrays, maximisers.shape[0])
        except ValueError as err:
            raise InvalidReply(str(err)) from None
        return privacy.widened_radii(radii, privacy.maximiser_variance(self.privacy, maximisers, counts), debias=True)

    def _collect(self, replies: list[Reply], round_label: int | str, read_radii, *, variances: bool = False) -> Components:
        """Validate replies and stack every client's maximisers with the radii ``read_radii`` gives.

        ``read_radii(reply, model, maximisers)`` returns the client's (K_g,) squared radii or
        raises :class:`InvalidReply`; a client the server never initialised is rejected, and so is
        a reply with a maximiser far from every other component by the federation's scale (the
        extent of the centroids the clients declared at initialisation,
        :class:`~fedica.fedgem.trust.FederationExtent`): the client keeps the centroids it was sent.
        With ``variances``, each reply's ``variances`` (K_g,), positive, are stacked too.
        """
        extent = self.extent
        partitions, centers, eps, owners, weights, spreads = [], [], [], [], [], []
        for reply in replies:
            model = self.models.get(reply.partition_id)
            if model is None:
                self.reject(reply.partition_id, round_label, "this client was not initialised")
                continue
            try:
                maximisers = validate_gem_components(reply.arrays, "maximisers", dim=self.dim, n_components=model.n_components)
                if (far := extent.far_reason("maximisers", maximisers)) is not None:
                    raise InvalidReply(far)
                radii = read_radii(reply, model, maximisers)
                if variances:
                    spreads.append(positive_array(reply.arrays, "variances", model.n_components))
            except InvalidReply as err:
                self.reject(reply.partition_id, round_label, f"invalid reply: {err}")
                continue
            partitions.append(reply.partition_id)
            centers.append(maximisers)
            eps.append(radii)
            owners.append(np.full(model.n_components, reply.partition_id))
            weights.append(model.n_points * model.weights)
            self.client_seconds += reported_seconds(reply)
        if not partitions:
            return Components([], np.empty((0, self.dim or 0)), np.empty(0), np.empty(0, int), np.empty(0),
                              np.empty(0) if variances else None)
        return Components(partitions, np.vstack(centers), np.concatenate(eps), np.concatenate(owners), np.concatenate(weights),
                          np.concatenate(spreads) if variances else None)


def positive_array(arrays: dict[str, Any], key: str, n_components: int) -> np.ndarray:
    """A reply's (K_g,) array of positive finite values (a spherical site's variances), or :class:`InvalidReply`."""
    values = require_array(arrays, key, (n_components,), nonnegative=True)
    if np.any(values <= 0):
        raise InvalidReply(f"{key!r} must be positive")
    return values


