"""FedGEM's covariance-family stage: the chosen partition's clusters joined into a family's (docs/ALGORITHMS.md 2.14).

After the spheres' protocol has chosen its partition, the server asks every site for its clusters' moments
(one exchange), agglomerates them under each family, fits each family's best partitions by a federated EM
(one exchange a step), does the same from the finest partition the selection scored where a family that lost
was cut short by a chosen partition of few clusters, and keeps the mixture of smallest BIC
(:mod:`fedica.fedgem.families` holds the arithmetic). :class:`FamilyStage` holds these steps for
:class:`fedica.fedgem.coordinator.FedGEMServer`.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np

from fedica.fedgem.families import (REG_COVAR, SMALL_MODELS, FamilyModel, agglomeration_candidates,
                                    checked_cluster_moments, checked_mixture_moments, cluster_moments,
                                    robust_cluster_moments, shape_parameters)
from fedica.fedgem.merging import FinalAggregation
from fedica.fedgem.trust import robust_totals, tuning_weights
from fedica.protocol import GEM_CLUSTER_MOMENTS, GEM_FAMILY_EM, InvalidReply, Reply, Request, reported_seconds

log = logging.getLogger(__name__)

# The federated EM of a covariance family's candidate mixtures stops a candidate whose log-likelihood per point
# changes by less than this (scikit-learn's GaussianMixture tol), and every one after this many steps.
FAMILY_EM_TOL = 1e-3
FAMILY_EM_MAX_STEPS = 100


class FamilyStage:
    """The covariance-family stage's steps, on the server's state (a :class:`~fedica.fedgem.coordinator.FedGEMServer`:
    its ``settings``, ``models``, ``final``, ``aggregation``, ``extent``, ``distrusted``, ``units`` and books);
    they fill ``family`` and replace ``aggregation`` and ``tuning``'s family entries."""

    def _family_stage(self):
        """The stage's exchanges: the clusters' moments, then the federated EM's steps (a protocol generator); again
        from the finest partition the selection scored where the chosen one cut a family short (:meth:`_cut_short`)."""
        candidates = yield from self._fitted_candidates(self.aggregation, "")
        origins = [self.aggregation] * len(candidates)
        finest = self.finest_candidate
        start_k = self.aggregation.k_hat
        # Only from a chosen partition of at most SMALL_MODELS clusters, the range where the spheres' choice cut a
        # family short (waveform's 3-4): at G=10,000 (K=50) the rule asked too, and the second path's moments alone
        # (each site labelling its points with the finest partition's clusters) took minutes.
        if (finest is not None and start_k <= SMALL_MODELS and finest.aggregation.k_hat > start_k
                and self._cut_short(candidates, start_k)):
            more = yield from self._fitted_candidates(finest.aggregation, "-finest")
            candidates, origins = candidates + more, origins + [finest.aggregation] * len(more)
        self._choose_family_model(candidates, origins)

    def _fitted_candidates(self, start: FinalAggregation, suffix: str):
        """The candidates of every family's path from ``start``'s clusters, fitted by the federated EM (a protocol
        generator; ``suffix`` names its exchanges)."""
        s = self.settings
        replies = yield Request(GEM_CLUSTER_MOMENTS, f"cluster-moments{suffix}", self.evaluation_payloads(start),
                                {"labelling": s.labelling, "covariance-type": s.covariance_type,
                                 "n-clusters": start.k_hat, **self.units})
        candidates = self._family_candidates(replies, start, f"cluster-moments{suffix}")
        for step in range(1, FAMILY_EM_MAX_STEPS + 1):
            active = [c for c in candidates if c.active]
            if not active:
                break
            payload = self._family_payload(active)
            replies = yield Request(GEM_FAMILY_EM, f"family-em{suffix}-{step}", {p: payload for p in self.final.slices()},
                                    dict(self.units))
            self._retire_candidates(active, self._family_em_step(active, replies, f"family-em{suffix}-{step}"))
        return candidates

    def _cut_short(self, candidates: list[FamilyModel], start_k: int) -> bool:
        """Whether a diagonal or full family that lost to another was cut short: its best candidate holds all
        ``start_k`` clusters of its path's start, so its BIC may fall further with more clusters than the chosen
        partition has (docs/ALGORITHMS.md 2.14, "Where the paths start"). Where that family wins at ``start_k``, the
        spheres' partition is the family's choice too. The spherical family's best is the spheres' own choice as a
        rule, so it is not asked."""
        n_total = self._family_points()
        winner = min(candidates, key=lambda c: (c.bic(n_total), c.n_clusters))
        best: dict[str, FamilyModel] = {}
        for c in candidates:
            if c.family != "spherical" and c.bic(n_total) < (best[c.family].bic(n_total) if c.family in best else np.inf):
                best[c.family] = c
        return any(c.n_clusters == start_k and c is not winner for c in best.values())

    def _family_candidates(self, replies: list[Reply], start: FinalAggregation, stage: str) -> list[FamilyModel]:
        """The family's candidate mixtures from the clusters of ``start`` (the chosen partition, or the finest the
        selection scored; docs/ALGORITHMS.md 2.14).

        Each site labels its points with the partition's global clusters (the evaluation's ``labelling``) and sends
        each cluster's count, mean and scatter matrix; their pooled moments are the pooled points' exactly. Every
        family's agglomeration path from them gives its best partition by the classification BIC and the partitions
        one cluster either side (:func:`fedica.fedgem.families.agglomeration_candidates`), which the federated EM
        then fits. A distrusted site's reply counts in no cluster; a site whose count the server caps
        (``count_cap_factor``) weighs its capped count, as in every merge.
        """
        moments = self._checked_family_replies(
            replies, stage,
            lambda arrays, model: checked_cluster_moments(arrays, start.k_hat, self.dim, model.declared_points))
        self.require(len(moments), "FedGEM covariance family")
        with self.server_time():
            masses, means, scatters = (np.stack([m[i] for m in moments]) for i in range(3))
            _, _, (total,) = cluster_moments(np.zeros(masses.size, dtype=np.int64), 1, masses.ravel(),
                                             means.reshape(-1, self.dim), scatters.reshape(-1, self.dim, self.dim))
            self._family_reg = REG_COVAR * max(float(np.trace(total)) / self.dim, np.finfo(float).tiny)
            counts, centres, covariances, left_out = robust_cluster_moments(
                masses, means, scatters, self.settings.max_hostile_fraction, self._family_reg)
            self._warn_left_out(left_out, stage)
            candidates = agglomeration_candidates(counts, centres, covariances, self.families, self._family_reg)
            standardised = self.feature_scale is not None
            for candidate in candidates:
                candidate.unit_parameters = shape_parameters(candidate.family, self.dim, standardised)
        if not candidates:
            raise ValueError("FedGEM covariance family: every partition holds a cluster too small for its covariance")
        return candidates

    def _checked_family_replies(self, replies: list[Reply], stage: str, check) -> list[tuple]:
        """The replies' moments that ``check(arrays, model)`` passes and whose means lie within the federation's
        extent, each site's masses weighed by its capped count; the others rejected with their reason."""
        kept = []
        self._family_sites = []
        for reply in replies:
            model = self.models.get(reply.partition_id)
            if model is None or reply.partition_id in self.distrusted:
                continue
            try:
                masses, means, *rest = check(reply.arrays, model)
                if (far := self.extent.far_reason("means", means[masses > 0])) is not None:
                    raise InvalidReply(far)
            except InvalidReply as err:
                self.reject(reply.partition_id, stage, f"invalid reply: {err}")
                continue
            self.client_seconds += reported_seconds(reply)
            kept.append((masses * (model.n_points / model.declared_points), means, *rest, model))
            self._family_sites.append(reply.partition_id)
        return kept

    def _warn_left_out(self, left_out: list[int], stage: str) -> None:
        """Name the sites (indices into the stage's kept replies) whose moments some cluster left out."""
        if left_out:
            sites = ", ".join(str(self._family_sites[g]) for g in left_out)
            warnings.warn(f"FedGEM covariance family ({stage}): sites {sites} sent moments of a cluster that its other "
                          f"holders' points cannot give; those moments were left out", UserWarning, stacklevel=4)

    @staticmethod
    def _family_payload(candidates: list[FamilyModel]) -> dict[str, np.ndarray]:
        """Every candidate mixture, its clusters stacked: weights, means, covariances, each one's cluster count, and
        whether its M-step reads only its scatters' diagonals (``diagonal``: the sites send only those)."""
        return {"weights": np.concatenate([c.weights for c in candidates]),
                "means": np.vstack([c.means for c in candidates]),
                "covariances": np.concatenate([c.covariances for c in candidates]),
                "sizes": np.array([c.n_clusters for c in candidates], dtype=np.int64),
                "diagonal": np.array([c.diagonal for c in candidates], dtype=np.int64)}

    def _family_em_step(self, candidates: list[FamilyModel], replies: list[Reply], stage: str) -> np.ndarray:
        """One federated EM step of every candidate: its log-likelihood at the parameters sent, then its M-step from
        the sites' moments (the pooled points' exactly). Returns each candidate's log-likelihood gain per point over
        its previous step (NaN at its first)."""
        sizes = np.array([c.n_clusters for c in candidates], dtype=np.int64)
        diagonal = np.array([c.diagonal for c in candidates])
        kept = self._checked_family_replies(
            replies, stage,
            lambda arrays, model: checked_mixture_moments(arrays, sizes, self.dim, model.declared_points, diagonal))
        self.require(len(kept), "FedGEM covariance family")
        with self.server_time():
            declared = np.array([model.declared_points for *_, model in kept], dtype=float)
            # The robust sum weighs each site at most the median site's count; scaled back to every point (the
            # counts as the server caps them, as the BIC's N), so that the penalty for N points meets the
            # log-likelihood of N points, as the central BIC's does. Unscaled, sites of 5, 16 and 54 points weighed
            # 37 and the penalty chose 2 clusters for 4.
            h = self.settings.max_hostile_fraction
            capped = np.array([model.n_points for *_, model in kept], dtype=float)
            totals = robust_totals(np.array([k[3] for k in kept]), declared, h) * (
                capped.sum() / tuning_weights(declared, h).sum())
            bounds = np.cumsum(sizes) - sizes
            gains = np.full(len(candidates), np.nan)
            for index, (candidate, start, size) in enumerate(zip(candidates, bounds, sizes)):
                part = slice(start, start + size)
                if candidate.log_likelihood is not None:
                    gains[index] = (totals[index] - candidate.log_likelihood) / declared.sum()
                candidate.log_likelihood = float(totals[index])
                candidate.m_step(np.stack([k[0][part] for k in kept]), np.stack([k[1][part] for k in kept]),
                                 np.stack([k[2][part] for k in kept]), self._family_reg,
                                 self.settings.max_hostile_fraction)
                candidate.left_out = [self._family_sites[g] for g in candidate.left_out_rows]
        return gains

    @staticmethod
    def _retire_candidates(stepped: list[FamilyModel], gains: np.ndarray) -> None:
        """Stop the EM of the candidates that converged, so that each step sends the sites fewer.

        ``gains`` are the stepped candidates' log-likelihood gains per point over their previous step (NaN at the
        first); a candidate converges when its gain is under :data:`FAMILY_EM_TOL` (scikit-learn's test, per
        candidate). Stopping a candidate that has not converged because its BIC seemed out of reach (its BIC less
        20 times its last step's fall above the best) was tried: it changed the choice on penguins (one seed
        gave 6 clusters for 3) and crabs, so it was not kept.
        """
        for candidate, gain in zip(stepped, gains):
            if np.isfinite(gain) and abs(gain) < FAMILY_EM_TOL:
                candidate.active = False

    def _family_points(self) -> float:
        return float(sum(self.models[p].n_points for p in self.final.partitions))

    def _choose_family_model(self, candidates: list[FamilyModel], origins: list[FinalAggregation]) -> None:
        """The candidate of smallest BIC after the federated EM (ties: fewer clusters, then the chosen partition's
        path); the global clusters of the partition its path started from (``origins``, one per candidate) follow the
        cluster their centre is most probable in."""
        with self.server_time():
            n_total = self._family_points()
            chosen = min(range(len(candidates)), key=lambda i: (candidates[i].bic(n_total), candidates[i].n_clusters, i))
            family, agg = candidates[chosen], origins[chosen]
            if not np.isfinite(family.bic(n_total)):
                raise ValueError("FedGEM covariance family: every candidate lost a cluster in its EM")
            family.merged = family.posterior_labels(agg.global_centroids)
            if family.left_out:
                warnings.warn(f"FedGEM covariance family: sites {', '.join(map(str, family.left_out))} sent moments of "
                              "a cluster that its other holders' points cannot give at the last EM step; those moments "
                              "were left out", UserWarning, stacklevel=3)
            self.family = family
            self.aggregation = FinalAggregation(family.merged[agg.labels], family.means, family.n_clusters)
            self.tuning = {**(self.tuning or {}), "family": family.family, "family_start_k": int(agg.k_hat),
                           "family_paths": family.table, "family_em_steps": family.em_steps,
                           "family_left_out": family.left_out,
                           # A candidate that lost a cluster to fewer points than its family needs has no BIC (None).
                           "family_candidates": [{"family": c.family, "k": c.n_clusters, "start_k": int(start.k_hat),
                                                  "bic": float(c.bic(n_total)) if np.isfinite(c.bic(n_total)) else None}
                                                 for c, start in zip(candidates, origins)]}
            log.info("covariance family: %s with %d clusters (BIC after %d federated EM steps from the agglomeration of "
                     "%d clusters)", family.family, family.n_clusters, family.em_steps, agg.k_hat)
