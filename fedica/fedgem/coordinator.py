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
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedica.fedgem import privacy
from fedica.fedgem.components import ClientModel, Components, Support
from fedica.fedgem.evaluation import ClientEvaluation, EvaluationStage
from fedica.fedgem.families import FamilyModel
from fedica.fedgem.family_stage import FamilyStage
from fedica.fedgem.geometry import CLUSTER_ANISOTROPY_LIMIT, FEATURE_SCALE_SPREAD_LIMIT, families_of, geometry
from fedica.fedgem.support import candidate_support, cluster_stability, merged_labels, split_labels, support_warnings
from fedica.fedgem.merging import FinalAggregation
from fedica.fedgem.overlaps import TooManyOverlaps
from fedica.fedgem.selection import EVIDENCE_MINORITY, Candidate, bic, evidence_path_sizes, icl, merge_path, path_sizes, relabel
from fedica.fedgem.standardisation import STANDARDISATION_KEY, encode_standardisation, federated_scale
from fedica.fedgem.trust import (
    FederationExtent,
    admit_components,
    cap_counts,
    cluster_support,
    final_radii,
    hostile_count,
    icl_winners,
    log_excluded,
    refuse_far_components,
    robust_silhouettes,
    robust_totals,
    trusted_final_aggregation,
    trusted_grid_aggregations,
    trusted_server_step,
)
from fedica.fedgem.tuning import select_upsilon
from fedica.protocol import (
    CLUSTER_SHAPE_KEY,
    GEM_EVALUATE,
    GEM_FINAL,
    GEM_INIT,
    GEM_LIKELIHOOD,
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

Protocol = Generator[Request, list[Reply], None]


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
class FedGEMServer(EvaluationStage, FamilyStage, ProtocolState):
    """The server's state during one FedGEM run (its books: :class:`~fedica.protocol.ProtocolState`).

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

    def _support_of_k(self) -> None:
        """How sure K_hat is (``k_support``, :mod:`fedica.fedgem.support`); a warning when another K nearly ties or
        a neighbour scores clearly better."""
        agg = self.aggregation
        with self.server_time():
            tuning = self.tuning or {}
            support: dict[str, Any] = {"criterion": {"likelihood": "icl", "private-bic": "private-bic"}.get(
                tuning.get("criterion"), tuning.get("criterion"))}
            scored = self.scored_candidates
            if self.family is not None:  # K was chosen by the BIC among the families' candidates after their EM
                # Under auto each K's best over every family (the choice is over family and K together).
                every_family = self.settings.covariance_type == "auto"
                fitted = [c for c in tuning["family_candidates"] if c["bic"] is not None
                          and (every_family or c["family"] == self.family.family)]
                support["criterion"] = "bic" if every_family else f"{self.family.family}-bic"
                scored = (np.array([c["k"] for c in fitted]), np.array([c["bic"] for c in fitted]))
            if scored is not None:
                support.update(candidate_support(*scored, agg.k_hat))
            support["clusters"] = cluster_stability(agg.labels, self.final.owners, self.final.centers,
                                                    agg.global_centroids, self._final_radii(self.upsilon),
                                                    len(self.final.partitions))
            self.k_support = support
        for message in support_warnings(support):
            warnings.warn(message, UserWarning, stacklevel=3)

    def _select(self, candidates: list[Candidate], model: dict[str, Any]) -> Protocol:
        """The final partition among ``candidates``: by the clients' federated ICL, or by a private run's criterion.

        The candidates' neighbours (one merge and one split further, :func:`fedica.fedgem.support.neighbour_labels`)
        are scored with them, for ``k_support`` only: the choice is among ``candidates``, each scored as before.
        """
        with self.server_time():
            neighbours = self._neighbours(candidates)
        if self.privacy is None:
            replies = yield Request(GEM_LIKELIHOOD, "likelihood", self._candidate_payloads(candidates + neighbours), model)
            self._choose_by_likelihood(candidates, replies, neighbours)
        else:  # no further release: the criterion of the final stage's private sums
            self._choose_privately(candidates, neighbours)

    def _neighbours(self, candidates: list[Candidate]) -> list[Candidate]:
        """The candidates' neighbours beyond their range of K: the fewest clusters' one merge further, and where the
        candidates hold one K only, one split further (each distinct partition once, none that is a candidate's).

        A split only then: the largest K of a wider range is the finest upsilon's, far from any choice, and its
        split costs every site a model of that many centres (at G=1,000, 573 centres and 3 s of the sites' 22).
        """
        seen = {c.aggregation.labels.tobytes() for c in candidates}
        k_hats = [c.aggregation.k_hat for c in candidates]
        neighbours = []
        for candidate in candidates:
            steps = ([merged_labels] if candidate.aggregation.k_hat == min(k_hats) else []) + (
                [split_labels] if min(k_hats) == max(k_hats) else [])
            for step in steps:
                labels = step(candidate.aggregation.labels, self.final.centers, self.final.weights)
                if labels is None:
                    continue
                aggregation = relabel(labels, self.final.centers, self.final.weights)
                if aggregation.labels.tobytes() not in seen:
                    seen.add(aggregation.labels.tobytes())
                    neighbours.append(Candidate(aggregation, candidate.upsilon, candidate.merges))
        return neighbours

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
            caught = {p: reasons for p, reasons in caught.items() if 2 * len(reasons) >= aggregated}
            if not caught:
                break
            for partition, reasons in sorted(caught.items()):
                self.distrusted[partition] = reasons[0]
                accused[partition] = f"untrusted (caught at {len(reasons)} of {aggregated} upsilons): {reasons[0]}"
            self.aggregated.clear()
        if len(self.distrusted) > budget:
            self.distrusted.clear()  # filled by these passes only
            self.aggregated.clear()
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

    def _tuning_candidates(self) -> tuple[dict[int, dict[str, np.ndarray]], list[FinalAggregation]]:
        """Each client's consensus model under every upsilon of the grid (paper appendix D.3)."""
        with self.server_time():
            aggregations = [aggregation for _, aggregation, _ in self._grid_aggregations()]
            payloads = {
                p: {"candidates": np.stack([agg.global_centroids[agg.labels[part]] for agg in aggregations])}
                for p, part in self.final.slices().items()
            }
        return payloads, aggregations

    def _choose_upsilon(self, aggregations: list[FinalAggregation], replies: list[Reply]) -> None:
        """The upsilon whose N_g-weighted mean client silhouette is best, under the K_hat guard."""
        with self.server_time():
            grid = [u for u in map(float, self.settings.upsilon_grid) if u not in self.skipped_upsilons]
            rows, counts = [], []
            for reply in replies:
                try:
                    scores = require_array(reply.arrays, "silhouettes", (len(grid),), allow_nan=True)
                    if np.any(np.abs(scores[np.isfinite(scores)]) > 1.0):
                        raise InvalidReply("'silhouettes' must lie in [-1, 1]")
                except InvalidReply as err:
                    self.reject(reply.partition_id, "silhouette", f"invalid reply: {err}")
                    continue
                self.client_seconds += reported_seconds(reply)
                rows.append(scores)
                counts.append(self.models[reply.partition_id].n_points)
            silhouettes = robust_silhouettes(np.array(rows).reshape(-1, len(grid)), np.array(counts, dtype=float),
                                             self.settings.max_hostile_fraction)
            k_hats = np.array([agg.k_hat for agg in aggregations])
            # The paper keeps k_hat "not significantly" above sqrt(sum_g K_g); guard_factor says how far is significant.
            guard = self.settings.guard_factor * math.sqrt(sum(m.n_components for m in self.models.values()))
            if np.all(np.isnan(silhouettes)):
                log.warning("no client could score a silhouette; upsilon falls back to the grid's median value")
                chosen = len(grid) // 2
            else:
                chosen = select_upsilon(silhouettes, k_hats, guard)
            log.info("upsilon tuning: grid %s, silhouettes %s, K_hat %s -> upsilon %g",
                     grid, np.round(silhouettes, 4).tolist(), k_hats.tolist(), grid[chosen])
            self.tuning = {"criterion": "silhouette", "grid": grid, "silhouettes": silhouettes, "k_hats": k_hats, "guard": guard}
            self.upsilon = grid[chosen]

    def _likelihood_candidates(self) -> list[Candidate]:
        """The grid's aggregations and the merge path from the finest of them (module fedica.fedgem.selection)."""
        with self.server_time():
            candidates, finest = [], None
            for upsilon, aggregation, excluded in self._grid_aggregations():
                candidates.append(Candidate(aggregation, upsilon))
                if finest is None or aggregation.k_hat > finest[0].aggregation.k_hat:
                    finest = (candidates[-1], excluded)
            candidates += self._path_candidates(finest[0], finest[1], only_shared=False)
            self.finest_candidate = finest[0]
        return candidates

    def _refused_join_candidates(self) -> list[Candidate]:
        """A fixed upsilon's aggregation and the merge path from it through the joins the strict rule refused."""
        with self.server_time():
            aggregation, excluded, _ = self._final_aggregation(self.upsilon)
            start = Candidate(aggregation, self.upsilon)
            return [start] + self._path_candidates(start, excluded, only_shared=True)

    def _path_candidates(self, start: Candidate, excluded: np.ndarray, *, only_shared: bool) -> list[Candidate]:
        """The merge path's candidates from ``start`` (docs/ALGORITHMS.md sections 2.6.1 and 2.6.3).

        Under the strict rule the path stops at the lower bound on K the clients' K_g give; under
        the evidence rule a client's K_g bounds nothing (two of its components may join), so the
        path may run down to one cluster, and its candidates are every count up to the densest
        window the centre budget allows (:func:`~fedica.fedgem.selection.evidence_path_sizes`).
        """
        trusted_weights = np.where(excluded, 0.0, self.final.weights)
        start_k = start.aggregation.k_hat
        if self.settings.same_client_rule == "evidence":
            path = merge_path(start.aggregation, self.final.centers, self.final.owners, trusted_weights, min_clusters=1,
                              sizes=lambda end: evidence_path_sizes(start_k, end), minority=EVIDENCE_MINORITY,
                              only_shared=only_shared)
        else:
            path = merge_path(start.aggregation, self.final.centers, self.final.owners, trusted_weights,
                              min_clusters=self._fewest_clusters(), sizes=lambda end: path_sizes(start_k, end))
        return [Candidate(agg, start.upsilon, start_k - agg.k_hat) for agg in path]

    def _fewest_clusters(self) -> int:
        """A lower bound on K: the largest K_g once as many of the largest as hostile clients may be are set aside."""
        local = sorted(m.n_components for m in self.models.values())
        set_aside = hostile_count(len(local), self.settings.max_hostile_fraction)
        return local[max(len(local) - 1 - set_aside, 0)]

    def _candidate_payloads(self, candidates: list[Candidate]) -> dict[int, dict[str, np.ndarray]]:
        """Every client receives every candidate's global model (the global centroids stacked, and each candidate's K_hat)."""
        centroids = np.vstack([c.aggregation.global_centroids for c in candidates])
        sizes = np.array([c.aggregation.k_hat for c in candidates], dtype=np.int64)
        return {p: {"centroids": centroids, "sizes": sizes} for p in self.final.slices()}

    def _choose_by_likelihood(self, candidates: list[Candidate], replies: list[Reply],
                              neighbours: list[Candidate] = ()) -> None:
        """The candidate with the smallest federated ICL (ties: fewer clusters, then the earlier candidate).

        The replies score ``candidates`` then ``neighbours``; each candidate's totals are its own column's
        (:func:`~fedica.fedgem.trust.robust_totals` clips column by column), so the neighbours change no choice.
        """
        scored = len(candidates) + len(neighbours)
        with self.server_time():
            likelihoods, entropies, sizes, n_points = [], [], [], 0
            for reply in replies:
                try:
                    scores = require_array(reply.arrays, "log-likelihoods", (scored,))
                    entropy = require_array(reply.arrays, "entropies", (scored,), nonnegative=True)
                except InvalidReply as err:
                    self.reject(reply.partition_id, "likelihood", f"invalid reply: {err}")
                    continue
                self.client_seconds += reported_seconds(reply)
                likelihoods.append(scores)
                entropies.append(entropy)
                sizes.append(self.models[reply.partition_id].declared_points)
                n_points += self.models[reply.partition_id].n_points
            self.require(len(sizes), "FedGEM model selection")
            totals, entropies = (robust_totals(np.array(scores), np.array(sizes, dtype=float), self.settings.max_hostile_fraction)
                                 for scores in (likelihoods, entropies))
            every_k = np.array([c.aggregation.k_hat for c in [*candidates, *neighbours]])
            n_parameters = self.geometry.n_parameters(every_k, self.dim)
            every_score = icl(totals, entropies, n_parameters, n_points)
            self.scored_candidates = (every_k, every_score)
            n = len(candidates)
            k_hats, scores, totals, entropies = every_k[:n], every_score[:n], totals[:n], entropies[:n]
            bics = bic(totals, n_parameters[:n], n_points)
            best = icl_winners(scores)
            chosen = int(best[np.argmin(k_hats[best])])
            log.info("model selection: K_hat %s, ICL %s -> K_hat %d", k_hats.tolist(), np.round(scores, 1).tolist(),
                     k_hats[chosen])
            self.tuning = {"criterion": "likelihood", "grid": [c.upsilon for c in candidates],
                           "merges": [c.merges for c in candidates], "k_hats": k_hats, "icl": scores, "bic": bics,
                           "log_likelihood": totals, "entropy": entropies}
            self.upsilon = candidates[chosen].upsilon
            self.merges = candidates[chosen].merges
            self.aggregation = candidates[chosen].aggregation

    def _choose_privately(self, candidates: list[Candidate], neighbours: list[Candidate] = ()) -> None:
        """The candidate with the smallest private BIC of the final stage's noisy sums (fedica.fedgem.privacy.private_criterion).

        The ``neighbours`` are scored too, for ``k_support`` only (no further release: the same noisy sums).
        """
        with self.server_time():
            n_points = float(sum(self.models[p].n_points for p in self.final.partitions))
            every_score = privacy.private_criterion([c.aggregation.labels for c in [*candidates, *neighbours]],
                                                    self.final.centers, self.final_counts, n_points)
            every_k = np.array([c.aggregation.k_hat for c in [*candidates, *neighbours]])
            self.scored_candidates = (every_k, every_score)
            scores, k_hats = every_score[:len(candidates)], every_k[:len(candidates)]
            best = np.flatnonzero(scores <= scores.min() + 1e-9 * abs(scores.min()))
            chosen = int(best[np.argmin(k_hats[best])])
            log.info("private model selection: K_hat %s, BIC %s -> K_hat %d", k_hats.tolist(),
                     np.round(scores, 1).tolist(), k_hats[chosen])
            self.tuning = {"criterion": "private-bic", "grid": [c.upsilon for c in candidates],
                           "merges": [c.merges for c in candidates], "k_hats": k_hats, "bic": scores}
            self.upsilon = candidates[chosen].upsilon
            self.merges = candidates[chosen].merges
            self.aggregation = candidates[chosen].aggregation

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


