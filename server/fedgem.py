"""``FedGEMStrategy``: FedGEM as a Flower strategy (fedica's own run of it: :mod:`fedica.server.harness.fedgem_run`)."""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
from fedica.server.strategy import ProtocolStrategy
from flwr.app import Array, ArrayRecord, MetricRecord

from fedica.fedgem.coordinator import FedGEMServer, FedGEMSettings
from fedica.parameters import FEDGEM_PARAMETERS as _P
from fedica.privacy import SECRET_NOISE, SEEDED_NOISE
from fedica.protocol import GEM_EVALUATE, GEM_FINAL, GEM_ROUND, GEM_SILHOUETTE, Request
from fedica.protocol.tasks import LOCAL_ENGINE_VARIABLE

log = logging.getLogger("fedica.server")


class FedGEMStrategy(ProtocolStrategy):
    """FedGEM (federated generalized EM, unknown global K) as a Flower ``Strategy``.

    The clients must run a ClientApp that answers fedica's FedGEM tasks, e.g.
    ``fedica.clients.make_client_app(load_data)``. ``start(grid)`` runs the initial exchange,
    ``rounds`` collaborative rounds, the final stage, the upsilon tuning (``upsilon="auto"``)
    and the final aggregation: the same numerical path as :class:`fedica.FedGEM`.

    Parameters
    ----------
    rounds, local_steps, upsilon, upsilon_grid, upsilon_criterion, same_client_rule, guard_factor, n_init, local_start,
    silhouette_sample,
    radius_outlier_factor, count_cap_factor, component_cap_factor, max_hostile_fraction, max_overlap_pairs, participation,
    covariance_type, labelling, standardize, random_state, dp_epsilon, dp_delta, dp_clip, dp_unit
        As for :class:`fedica.FedGEM`: declared in :data:`fedica.parameters.FEDGEM_PARAMETERS`, and checked
        against it here (``ValueError`` or ``TypeError`` naming the parameter).
    evaluate : bool, default=False
        End with an evaluation stage: clients label their held-out points and report
        contingency counts (fedica's own scenarios hold labels).
    min_available_nodes, min_clients, node_wait_timeout, client_config
        As for :class:`fedica.server.strategy.ProtocolStrategy`.

    Attributes
    ----------
    n_clusters_ : int
    means_ : ndarray of shape (n_clusters_, n_features)
        The global centres, in the data's own units (also under ``standardize``).
    feature_location_, feature_scale_ : ndarray of shape (n_features,) or None
        Under ``standardize="federated"``: what every site standardised its features by; None otherwise.
    site_mapping_ : dict of int to ndarray of shape (K_g,)
        Global id of each local component, by partition id.
    upsilon_ : float
    k_support_ : dict
        How sure K_hat is: each candidate K's weight and each global cluster's stability (as
        ``fedica.FedGEM.k_support_``).
    history_ : list of dict
    privacy_ : dict or None
        A private run's ``epsilon`` and ``delta`` spent, in total and per exchange, and whose seed
        the sites' noise came from (``noise``: secret at each site, or the run's under fedica's
        local engines); None without ``dp_epsilon``.
    feature_scale_spread_ : float or None
        How far the sites' feature scales are apart (as ``fedica.FedGEM.feature_scale_spread_``; over 10
        the run warned); None for a private run.
    cluster_anisotropy_ : float or None
        How far the sites' clusters are from spheres (as ``fedica.FedGEM.cluster_anisotropy_``; over 2 the run
        warned that K_hat may count more clusters than the data hold); None for a private run.
    covariance_family_ : str or None
        Under ``covariance_type`` ``diag``, ``full`` or ``auto``: the chosen family (as ``fedica.FedGEM.covariance_family_``).
    covariances_ : ndarray of shape (K_hat, d, d) or None
        Its clusters' covariances, in the units the sites clustered; None otherwise.
    server : FedGEMServer
        The protocol's state (everything the run computed).
    """

    # The defaults and rules are fedica.parameters.FEDGEM_PARAMETERS', as for fedica.FedGEM.
    def __init__(self, *, rounds: int = _P["rounds"].default, local_steps: int = _P["local_steps"].default,
                 upsilon: float | str = _P["upsilon"].default, upsilon_grid=_P["upsilon_grid"].default,
                 upsilon_criterion: str = _P["upsilon_criterion"].default,
                 same_client_rule: str = _P["same_client_rule"].default,
                 guard_factor: float = _P["guard_factor"].default, n_init: int = _P["n_init"].default,
                 local_start: str = _P["local_start"].default,
                 silhouette_sample: int = _P["silhouette_sample"].default,
                 radius_outlier_factor: float | None = _P["radius_outlier_factor"].default,
                 count_cap_factor: float | None = _P["count_cap_factor"].default,
                 component_cap_factor: float | None = _P["component_cap_factor"].default,
                 max_hostile_fraction: float = _P["max_hostile_fraction"].default,
                 max_overlap_pairs: int | None = _P["max_overlap_pairs"].default,
                 participation: float = _P["participation"].default,
                 covariance_type: str = _P["covariance_type"].default, labelling: str = _P["labelling"].default,
                 standardize: str | None = _P["standardize"].default,
                 random_state: int = _P["random_state"].default,
                 dp_epsilon: float | None = _P["dp_epsilon"].default, dp_delta: float = _P["dp_delta"].default,
                 dp_clip: float | None = _P["dp_clip"].default, dp_unit: str = _P["dp_unit"].default,
                 evaluate: bool = False, **kwargs: Any):
        parameters = dict(rounds=rounds, local_steps=local_steps, upsilon=upsilon, upsilon_grid=upsilon_grid,
                          upsilon_criterion=upsilon_criterion, same_client_rule=same_client_rule,
                          guard_factor=guard_factor, n_init=n_init, local_start=local_start,
                          silhouette_sample=silhouette_sample, radius_outlier_factor=radius_outlier_factor,
                          count_cap_factor=count_cap_factor, component_cap_factor=component_cap_factor,
                          max_hostile_fraction=max_hostile_fraction, max_overlap_pairs=max_overlap_pairs,
                          participation=participation, covariance_type=covariance_type, labelling=labelling,
                          standardize=standardize, random_state=random_state,
                          dp_epsilon=dp_epsilon, dp_delta=dp_delta, dp_clip=dp_clip, dp_unit=dp_unit)
        _P.check(parameters)  # at construction: a bad value is one line now, not a failure after the rounds
        super().__init__(**kwargs)
        del parameters["random_state"]
        self.settings = FedGEMSettings(**{**parameters, "upsilon_grid": tuple(upsilon_grid)},
                                       min_clients=self.min_clients, seed=int(random_state))
        self.evaluate = bool(evaluate)
        self.server: FedGEMServer | None = None

    def protocol(self):
        self.server = FedGEMServer(self.settings, evaluate=self.evaluate, rejected=self.federation.rejected)
        return self.server.run()

    def model_arrays(self) -> ArrayRecord:
        if self.server is None or self.server.aggregation is None:
            return ArrayRecord()
        means = self.server.in_data_units(self.server.aggregation.global_centroids)
        return ArrayRecord({"means": Array(np.ascontiguousarray(means))})

    def stage_metrics(self, request: Request) -> MetricRecord | None:
        server = self.server
        if request.task == GEM_ROUND and server.history:
            last = server.history[-1]
            return MetricRecord({"super-clusters": int(last["super_clusters"]), "mean-radius": last["mean_radius"],
                                 "centroid-shift": last["centroid_shift"]})
        if request.task in (GEM_FINAL, GEM_SILHOUETTE) and server.aggregation is not None:
            return MetricRecord({"k-hat": int(server.aggregation.k_hat), "upsilon": float(server.upsilon)})
        if request.task == GEM_EVALUATE and server.evaluation:
            return MetricRecord({k.replace("_", "-"): float(v) for k, v in server.evaluation.items()})
        return None

    def summary(self) -> None:
        log.info("FedGEMStrategy: %s, evaluate=%s", self.settings, self.evaluate)

    @property
    def n_clusters_(self) -> int:
        return int(self.server.aggregation.k_hat)

    @property
    def means_(self) -> np.ndarray:
        return self.server.in_data_units(self.server.aggregation.global_centroids)

    @property
    def feature_location_(self) -> np.ndarray | None:
        return self.server.feature_location

    @property
    def feature_scale_(self) -> np.ndarray | None:
        return self.server.feature_scale

    @property
    def site_mapping_(self) -> dict[int, np.ndarray]:
        labels = self.server.aggregation.labels
        return {p: labels[part] for p, part in self.server.final.slices().items()}

    @property
    def upsilon_(self) -> float:
        return self.server.upsilon

    @property
    def k_support_(self) -> dict[str, Any] | None:
        return self.server.k_support

    @property
    def history_(self) -> list[dict[str, Any]]:
        return self.server.history

    @property
    def feature_scale_spread_(self) -> float | None:
        return self.server.feature_scale_spread

    @property
    def cluster_anisotropy_(self) -> float | None:
        return self.server.cluster_anisotropy

    @property
    def covariance_family_(self) -> str | None:
        return None if self.server.family is None else self.server.family.family

    @property
    def covariances_(self):
        return None if self.server.family is None else self.server.family.covariances

    @property
    def privacy_(self) -> dict[str, Any] | None:
        if self.server.privacy is None:
            return None
        # The sites' rule (fedica.clients.app.FlowerSite.noise_secret): the run's seed under fedica's local engines.
        local = os.environ.get(LOCAL_ENGINE_VARIABLE) == "1"
        return self.server.privacy.record(SEEDED_NOISE if local else SECRET_NOISE)
