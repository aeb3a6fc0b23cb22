"""FedGEM's choice of K: the upsilon tuning, the likelihood selection over the grid and its merge path, and how sure
K is (docs/ALGORITHMS.md sections 2.6 and 2.6.4).

:class:`SelectionStage` holds these steps for :class:`fedica.fedgem.coordinator.FedGEMServer`, as
:class:`fedica.fedgem.family_stage.FamilyStage` holds the covariance family's.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Generator
from typing import Any

import numpy as np

from fedica.fedgem import privacy
from fedica.fedgem.merging import FinalAggregation
from fedica.fedgem.selection import (EVIDENCE_MINORITY, Candidate, bic, evidence_path_sizes, icl, merge_path, path_sizes,
                                     relabel)
from fedica.fedgem.support import candidate_support, cluster_stability, merged_labels, split_labels, support_warnings
from fedica.fedgem.trust import hostile_count, icl_winners, robust_silhouettes, robust_totals
from fedica.fedgem.tuning import select_upsilon
from fedica.protocol import GEM_LIKELIHOOD, InvalidReply, Reply, Request, reported_seconds, require_array

log = logging.getLogger("fedica.server")

Protocol = Generator[Request, list[Reply], None]


class SelectionStage:
    """The steps that choose the final partition and say how sure K is, on the server's state (a
    :class:`~fedica.fedgem.coordinator.FedGEMServer`: its ``settings``, ``models``, ``final``, ``geometry``, grid
    aggregations and books); they fill ``aggregation``, ``upsilon``, ``merges``, ``tuning``, ``scored_candidates``,
    ``finest_candidate`` and ``k_support``."""

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
