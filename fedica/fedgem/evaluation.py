"""FedGEM's evaluation stage: the run scored on the clients' held-out labels, from their contingency counts.

Not part of the estimate: after the final aggregation, each client labels its test points and sends
the counts of (true label, global id) pairs and its local ARI, never a point or a label. The server
checks every reply against what it knows of the client, sets aside tables that are forged or that
disagree with the federation's beyond an honest client's (:mod:`fedica.fedgem.trust`), and pools the
rest into the local ARI, the global ARI and K_hat (docs/ALGORITHMS.md section 2.5).
:class:`EvaluationStage` holds these steps for :class:`fedica.fedgem.coordinator.FedGEMServer`.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

from fedica.metrics import ari_from_contingency, k_hat_from_predictions, weighted_local_ari
from fedica.fedgem.tables import capped_table, outlying_tables, table_caps
from fedica.protocol import InvalidReply, Reply, require_array

# A client's test points may outnumber its training points (a large test split), but not by this
# factor: more is a forged contingency table, which would outweigh every other client's.
MAX_TEST_PER_TRAINING_POINT = 100
# How far a client's local ARI may be from the ARI of its own contingency table (the same number, up to rounding).
LOCAL_ARI_TOLERANCE = 1e-9


class ClientEvaluation(NamedTuple):
    """One client's checked evaluation reply: its contingency counts, its local ARI, whether it holds labels."""

    true_values: np.ndarray
    pred_values: np.ndarray
    counts: np.ndarray
    local_ari: float
    has_labels: bool


class EvaluationStage:
    """The evaluation stage's steps, on the server's state (a :class:`~fedica.fedgem.coordinator.FedGEMServer`:
    its ``models``, ``settings``, ``distrusted`` and books); they fill ``evaluated``, ``client_aris`` and
    ``evaluation``."""

    def _evaluate(self, replies: list[Reply], payloads: dict[int, dict[str, np.ndarray]]) -> None:
        """Local ARI (N_g-weighted), pooled global ARI and K_hat from the clients' contingency counts."""
        self.evaluated = {}
        for reply in replies:
            try:
                self.evaluated[reply.partition_id] = self._evaluation_reply(reply, payloads[reply.partition_id]["global-ids"])
            except InvalidReply as err:
                self.reject(reply.partition_id, "evaluate", f"invalid reply: {err}")
        for partition in sorted(set(self.evaluated) & set(self.distrusted)):
            self.reject(partition, "evaluate", "not counted: this client was caught planting a cluster at the final stage")
            del self.evaluated[partition]
        self._refuse_outsized_tests()
        self._refuse_outlying_tables()
        self.client_aris = {str(p): e.local_ari for p, e in self.evaluated.items()}
        self.evaluation = self.evaluation_over(self.evaluated)

    def _refuse_outsized_tests(self) -> None:
        """Leave out clients whose test counts exceed ``count_cap_factor`` times the median client's (forged tables)."""
        factor = self.settings.count_cap_factor
        if factor is None or len(self.evaluated) < 3:
            return
        totals = {p: float(e.counts.sum()) for p, e in self.evaluated.items()}
        cap = factor * float(np.median(list(totals.values())))
        for partition, total in totals.items():
            if total > cap:
                self.reject(partition, "evaluate", f"invalid reply: reports {int(total)} test points, more than "
                                                   f"{factor:g} x the median client's {cap / factor:.0f}")
                del self.evaluated[partition]

    def _refuse_outlying_tables(self) -> None:
        """Leave out clients whose contingency tables disagree with the federation's beyond an honest client's
        (:func:`~fedica.fedgem.tables.outlying_tables`; with ``max_hostile_fraction`` > 0)."""
        labelled = [p for p, e in self.evaluated.items() if e.has_labels]
        tables = [(self.evaluated[p].true_values, self.evaluated[p].pred_values, self.evaluated[p].counts) for p in labelled]
        caps = self._table_caps(labelled)
        outliers = outlying_tables(tables, caps, self.settings.max_hostile_fraction)
        if not outliers:
            return
        with_them = self.evaluation_over(labelled).get("global_ari", float("nan"))
        for index, reason in sorted(outliers.items()):
            self.reject(labelled[index], "evaluate", f"not counted: {reason}")
            del self.evaluated[labelled[index]]
        # An honest site that alone labels its points apart from every other looks like a forger: said, never silent.
        sites = ", ".join(str(labelled[index]) for index in sorted(outliers))
        warnings.warn(f"the evaluation tables of site{'s' if len(outliers) > 1 else ''} {sites} disagree with the "
                      f"federation's beyond the limit an honest site's may (clients.rejected says by how much): the "
                      f"reported metrics leave {'them' if len(outliers) > 1 else 'it'} out; with "
                      f"{'them' if len(outliers) > 1 else 'it'}, the global ARI is {with_them:.4f}", UserWarning,
                      stacklevel=2)

    def evaluation_over(self, partitions) -> dict[str, float]:
        """The evaluation metrics over the evaluated clients among ``partitions`` (say, the honest ones).

        A local ARI weighs its client's counted points (its declared count, capped at
        ``count_cap_factor`` times the median); in the pooled ARI a contingency table counts with at
        most its client's test share (:func:`~fedica.fedgem.tables.table_caps`, with
        ``max_hostile_fraction`` > 0); K_hat counts the clusters the tables as sent name.
        """
        chosen = [p for p in partitions if p in self.evaluated]
        if not chosen:
            return {"local_ari": float("nan"), "global_ari": float("nan"), "k_hat": 0}
        true_all, pred_all, count_all = (np.concatenate([getattr(self.evaluated[p], name) for p in chosen])
                                         for name in ("true_values", "pred_values", "counts"))
        metrics = {"k_hat": k_hat_from_predictions(pred_all, count_all)}
        if all(self.evaluated[p].has_labels for p in chosen):
            metrics["local_ari"] = weighted_local_ari(np.array([self.evaluated[p].local_ari for p in chosen]),
                                                      np.array([self.models[p].n_points for p in chosen]))
            evaluated = list(self.evaluated)
            caps = dict(zip(evaluated, self._table_caps(evaluated)))
            capped = np.concatenate([capped_table(self.evaluated[p].counts, caps[p]) for p in chosen])
            metrics["global_ari"] = ari_from_contingency(true_all, pred_all, capped)
        return metrics

    def _table_caps(self, partitions: list[int]) -> np.ndarray:
        """The most test points each of ``partitions``' tables counts with (:func:`~fedica.fedgem.tables.table_caps`)."""
        return table_caps(np.array([self.evaluated[p].counts.sum() for p in partitions]),
                          np.array([self.models[p].declared_points for p in partitions]),
                          np.array([self.models[p].n_points for p in partitions]), self.settings.max_hostile_fraction)

    def _evaluation_reply(self, reply: Reply, sent_ids: np.ndarray) -> ClientEvaluation:
        """A client's contingency counts and local ARI, checked against what the server knows of it.

        The counts must be whole numbers, at most :data:`MAX_TEST_PER_TRAINING_POINT` times the
        client's declared training size in total, the predicted ids
        must be the global clusters the server sent this client, and the ARI must lie in [-1, 1] and,
        for a client with labels, be the ARI of its own table (within :data:`LOCAL_ARI_TOLERANCE`).
        """
        counts = require_array(reply.arrays, "counts", (None,), nonnegative=True)
        true_values = require_array(reply.arrays, "true-values", counts.shape)
        pred_values = require_array(reply.arrays, "pred-values", counts.shape)
        for name, array in (("counts", counts), ("true-values", true_values), ("pred-values", pred_values)):
            if np.any(array != np.round(array)) or np.any(np.abs(array) > np.iinfo(np.int64).max / 2):
                raise InvalidReply(f"{name!r} must hold integers")
        model = self.models[reply.partition_id]
        if counts.sum() > MAX_TEST_PER_TRAINING_POINT * model.declared_points:
            raise InvalidReply(f"'counts' add up to {int(counts.sum())} test points, more than "
                               f"{MAX_TEST_PER_TRAINING_POINT} x the {model.declared_points} training points this client declared")
        if not set(pred_values.astype(np.int64).tolist()) <= set(sent_ids.tolist()):
            raise InvalidReply("'pred-values' name global clusters this client was not sent")
        local = reply.values.get("local-ari")
        if isinstance(local, bool) or not isinstance(local, (int, float)) or not -1.0 <= local <= 1.0:
            raise InvalidReply(f"'local-ari'={local!r} is not a number in [-1, 1]")
        has_labels = bool(reply.values.get("has-labels", True))
        if has_labels and counts.size:
            # The local ARI is the ARI of the client's own table: the server recomputes it and believes no other.
            own = ari_from_contingency(true_values.astype(np.int64), pred_values.astype(np.int64), counts.astype(np.int64))
            if abs(own - local) > LOCAL_ARI_TOLERANCE:
                raise InvalidReply(f"'local-ari'={local:.6g} is not the ARI of the client's own contingency table ({own:.6g})")
        return ClientEvaluation(true_values.astype(np.int64), pred_values.astype(np.int64), counts.astype(np.int64),
                                float(local), has_labels)
