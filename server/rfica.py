"""``RFICAStrategy``: RF-ICA as a Flower strategy (fedica's own run of it: :mod:`fedica.server.harness.rfica_run`)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from fedica.server.strategy import ProtocolStrategy
from flwr.app import Array, ArrayRecord

from fedica.parameters import RFICA_PARAMETERS as _P
from fedica.privacy import SECRET_NOISE, SEEDED_NOISE
from fedica.protocol.tasks import LOCAL_ENGINE_VARIABLE
from fedica.rfica.coordinator import RFICAState, explained_variance_record, rfica_protocol
from fedica.rfica.privacy import check_covered


class RFICAStrategy(ProtocolStrategy):
    """RF-ICA (one-shot robust federated ICA) as a Flower ``Strategy``.

    The clients must run a ClientApp that answers fedica's RF-ICA task, e.g.
    ``fedica.clients.make_client_app(load_data)``. ``start(grid)`` asks every client for its
    local ICA estimate once, then aggregates them robustly: the same numerical path as
    :class:`fedica.RFICA`. The Result's ``arrays`` hold ``mixing`` and ``unmixing``.

    Parameters
    ----------
    contrast, init, local_solver, n_components, whitening, benchmark, kmeans_restarts, gm_tol, clustering, center,
    random_state, dp_epsilon, dp_delta, refine_rounds
        As for :class:`fedica.RFICA`: declared in :data:`fedica.parameters.RFICA_PARAMETERS`, and checked
        against it here (``ValueError`` or ``TypeError`` naming the parameter). ``clustering`` defaults to
        ``"matched"`` here and in :class:`fedica.RFICA`; fedica's own runs pass the config's (``kmeans``).
        ``center`` defaults to ``"trimmed_mean"``, ``contrast`` to ``"logcosh"`` and ``local_solver`` to
        ``"picard"`` here and in :class:`fedica.RFICA`, and ``refine_rounds`` to 20; the config's are the
        paper's ``geometric_median``, ``cube``, ``fastica`` and 0 (the one-shot protocol).
    r : int or None, default=None
        The number of channels; None: the one most clients report.
    min_available_nodes, min_clients, node_wait_timeout, client_config
        As for :class:`fedica.server.strategy.ProtocolStrategy`.

    Attributes
    ----------
    mixing_ : ndarray of shape (r, n_components)
    components_ : ndarray of shape (n_components, r)
    explained_variance_, explained_variance_ratio_ : ndarray of shape (n_components,) or None
        As :class:`fedica.RFICA`'s: the components are ordered by the first, when the sites sent covariances.
    privacy_ : dict or None
        A private run's ``epsilon`` and ``delta`` spent, its one exchange, and whose seed the sites'
        noise came from (``noise``: secret at each site, or the run's under fedica's local engines);
        None without ``dp_epsilon``.
    state : RFICAState
        Everything the run computed (estimates, partitions, the aggregate and its comparators).
    """

    # The defaults and rules are fedica.parameters.RFICA_PARAMETERS', as for fedica.RFICA.
    def __init__(self, *, contrast: str = _P["contrast"].default, init: str = _P["init"].default,
                 local_solver: str = _P["local_solver"].default,
                 n_components: int | float | None = _P["n_components"].default,
                 whitening: str | None = _P["whitening"].default, benchmark: str = _P["benchmark"].default,
                 kmeans_restarts: int = _P["kmeans_restarts"].default,
                 gm_tol: float = _P["gm_tol"].default, clustering: str = _P["clustering"].default,
                 center: str = _P["center"].default, random_state: int = _P["random_state"].default,
                 dp_epsilon: float | None = _P["dp_epsilon"].default, dp_delta: float = _P["dp_delta"].default,
                 refine_rounds: int = _P["refine_rounds"].default, r: int | None = None, **kwargs: Any):
        # At construction: a bad value is one line now, not a failure once the clients have answered.
        parameters = dict(contrast=contrast, init=init, local_solver=local_solver, n_components=n_components,
                          whitening=whitening, benchmark=benchmark, kmeans_restarts=kmeans_restarts,
                          gm_tol=gm_tol, clustering=clustering, center=center, random_state=random_state,
                          dp_epsilon=dp_epsilon, dp_delta=dp_delta, refine_rounds=refine_rounds)
        _P.check(parameters)
        check_covered(parameters)
        super().__init__(**kwargs)
        self.contrast, self.init, self.benchmark = contrast, init, benchmark
        self.local_solver, self.n_components, self.whitening = local_solver, n_components, whitening
        self.kmeans_restarts, self.gm_tol, self.random_state, self.r = kmeans_restarts, gm_tol, int(random_state), r
        self.clustering, self.center = clustering, center
        self.dp_epsilon, self.dp_delta, self.refine_rounds = dp_epsilon, dp_delta, refine_rounds
        self.state: RFICAState | None = None

    def protocol(self):
        self.state = RFICAState(contrast=self.contrast, init=self.init, local_solver=self.local_solver,
                                n_components=self.n_components, whitening=self.whitening, benchmark=self.benchmark,
                                kmeans_restarts=self.kmeans_restarts, gm_tol=self.gm_tol,
                                clustering=self.clustering, center=self.center, dp_epsilon=self.dp_epsilon,
                                dp_delta=self.dp_delta, refine_rounds=self.refine_rounds, seed=self.random_state,
                                min_clients=self.min_clients, r=self.r, rejected=self.federation.rejected)
        return rfica_protocol(self.state)

    def model_arrays(self) -> ArrayRecord:
        if self.state is None or self.state.aggregate is None:
            return ArrayRecord()
        return ArrayRecord({"mixing": Array(np.ascontiguousarray(self.mixing_)),
                            "unmixing": Array(np.ascontiguousarray(self.components_))})

    @property
    def mixing_(self) -> np.ndarray:
        return self.state.aggregate.rf_ica

    @property
    def components_(self) -> np.ndarray:
        return np.linalg.pinv(self.state.aggregate.rf_ica)

    @property
    def explained_variance_(self) -> np.ndarray | None:
        return explained_variance_record(self.state)[0]

    @property
    def explained_variance_ratio_(self) -> np.ndarray | None:
        return explained_variance_record(self.state)[1]

    @property
    def privacy_(self) -> dict[str, Any] | None:
        if self.state is None or self.state.privacy is None:
            return None
        # The sites' rule (fedica.clients.app.FlowerSite.noise_secret): the run's seed under fedica's local engines.
        local = os.environ.get(LOCAL_ENGINE_VARIABLE) == "1"
        return self.state.privacy.record(SEEDED_NOISE if local else SECRET_NOISE)
