"""How sure K_hat is: the federation's support for each candidate K, and how stable each global cluster is.

Two numbers beside K_hat (docs/ALGORITHMS.md section 2.6.4), both from what the server already holds:

- **Support over K.** The criterion that chose K_hat (the federated ICL, or a private run's BIC) is on the
  deviance scale, ``-2 log L`` plus a penalty. ``exp(-criterion / 2)`` then approximates each candidate's
  marginal likelihood (Schwarz 1978; Kass & Raftery 1995), so normalised over the candidates it is a weight
  of each K, as mclust reports its BIC differences. Several candidates of one K (other upsilons, other
  merge paths) count once, by the best of them: a weight per K, not per candidate. A K within
  :data:`NEAR_TIE_GAP` of the chosen one is a near tie: Kass and Raftery's scale calls a difference under 2
  "not worth more than a bare mention", a weight ratio above ``exp(-1)``.
- **Stability of each global cluster.** How many sites hold it (a site's component joined it in the final
  aggregation), and how far those components' centres lie from the cluster's centre, in units of each
  component's own final radius at the chosen upsilon: a spread up to 1 puts the global centre inside every
  component's ball, the test two components passed to be merged.

The candidates the merge rules produce may hold one K only (well-separated clusters: every upsilon gives
the same partition, and no join has evidence), which would make any weight 1. So the sites also score,
in the same likelihood request, the candidates' neighbours beyond their range of K: each partition of the
fewest clusters one merge further (:func:`merged_labels`: the pair of global clusters whose join costs
least in Ward's sense) and, where the candidates hold one K only, one split further (:func:`split_labels`:
the cluster whose components spread most, cut in two across their principal direction; Boley 1998). Only
beyond the range, so that the likelihood stage, the costliest of a large federation, gains a few models,
not one per candidate. The neighbours only weigh the support; the selection chooses among the merge rules'
candidates as before.

Plain numpy; the server computes both once its selection is made.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["NEAR_TIE_GAP", "candidate_support", "cluster_stability", "merged_labels", "near_tie", "split_labels",
           "support_warnings"]

NEAR_TIE_GAP = 2.0


def candidate_support(k_hats: np.ndarray, scores: np.ndarray, chosen: int) -> dict[str, Any]:
    """The weight of each candidate K from its best criterion value (smaller is better), and the gap to the chosen.

    Parameters
    ----------
    k_hats : ndarray of shape (L,)
        Each candidate's K_hat.
    scores : ndarray of shape (L,)
        Each candidate's criterion (deviance scale).
    chosen : int
        The K_hat the selection chose (one of ``k_hats``).

    Returns
    -------
    support : dict
        ``k`` (distinct K, increasing), ``weight`` (summing to 1), ``gap`` (each K's best criterion less
        the chosen K's; 0 for the chosen), ``chosen``.
    """
    k_hats = np.asarray(k_hats, dtype=np.int64)
    scores = np.asarray(scores, dtype=np.float64)
    ks = np.unique(k_hats)
    best = np.array([scores[k_hats == k].min() for k in ks])
    # Shifted by the smallest before the exponential: the criterion is in the thousands on real data.
    weights = np.exp(-(best - best.min()) / 2.0)
    gap = best - best[np.flatnonzero(ks == chosen)[0]]
    return {"k": ks.tolist(), "weight": (weights / weights.sum()).tolist(), "gap": gap.tolist(), "chosen": int(chosen)}


def near_tie(support: Mapping[str, Any]) -> list[int]:
    """The Ks other than the chosen whose best criterion lies within :data:`NEAR_TIE_GAP` of the chosen K's."""
    return [k for k, gap in zip(support["k"], support["gap"]) if k != support["chosen"] and abs(gap) < NEAR_TIE_GAP]


def support_warnings(support: Mapping[str, Any]) -> list[str]:
    """What a run says about its choice of K (``k_support`` with its weights): a near tie, and a neighbour beyond the
    candidates that the sites' criterion clearly prefers (none without weights)."""
    if "weight" not in support:
        return []
    chosen, criterion = support["chosen"], support["criterion"].upper()
    messages = []
    tied = near_tie(support)
    if tied:
        weights = dict(zip(support["k"], support["weight"]))
        messages.append(f"FedGEM: K_hat={chosen} is a near tie with K={', '.join(map(str, tied))}: their {criterion} "
                        f"lies within {NEAR_TIE_GAP:g} of the chosen (weights "
                        + ", ".join(f"K={k} {weights[k]:.2f}" for k in sorted([chosen, *tied]))
                        + "): the data support them nearly as well (k_support)")
    # Only a neighbour beyond the candidates can score clearly better than the chosen (the choice is the best
    # candidate): the sites' likelihood asks for a merge or a split the merge rules did not offer.
    better = [(k, gap) for k, gap in zip(support["k"], support["gap"]) if gap <= -NEAR_TIE_GAP]
    if better:
        k, gap = min(better, key=lambda item: item[1])
        how = "joins clusters the merge rules kept apart" if k < chosen else "splits a cluster"
        messages.append(f"FedGEM: the sites' {criterion} prefers K={k} to K_hat={chosen} (by {-gap:.3g}), a partition "
                        f"that {how}: K_hat may {'over' if k < chosen else 'under'}-count the clusters, as spheres do "
                        "for elongated clusters or features in different units (k_support)")
    return messages


def cluster_stability(labels: np.ndarray, owners: np.ndarray, centres: np.ndarray, global_centroids: np.ndarray,
                      squared_radii: np.ndarray, n_sites: int) -> list[dict[str, Any]]:
    """For each global cluster: the sites that hold it and how far their components lie from it.

    Parameters
    ----------
    labels : ndarray of shape (m,)
        The global cluster of each final component.
    owners : ndarray of shape (m,)
        The site of each final component.
    centres : ndarray of shape (m, d)
        The final components' centres.
    global_centroids : ndarray of shape (K_hat, d)
    squared_radii : ndarray of shape (m,)
        Each component's squared final radius at the chosen upsilon.
    n_sites : int
        The sites of the final stage.

    Returns
    -------
    clusters : list of dict
        Per global cluster, in id order: ``sites`` (how many hold it), ``site_share`` (of ``n_sites``),
        ``spread_median`` and ``spread_max`` (its components' distances to its centre over their radii).
    """
    distances = np.linalg.norm(centres - global_centroids[labels], axis=1)
    radii = np.sqrt(np.maximum(squared_radii, np.finfo(float).tiny))
    spreads = distances / radii
    clusters = []
    for k in range(global_centroids.shape[0]):
        members = labels == k
        held = int(np.unique(owners[members]).size)
        clusters.append({"sites": held, "site_share": held / max(n_sites, 1),
                         "spread_median": float(np.median(spreads[members])) if held else None,
                         "spread_max": float(spreads[members].max()) if held else None})
    return clusters


def _cluster_means(labels: np.ndarray, centres: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    k = int(labels.max()) + 1
    mass = np.bincount(labels, weights=weights, minlength=k)
    sums = np.zeros((k, centres.shape[1]))
    np.add.at(sums, labels, centres * weights[:, None])
    return sums / np.maximum(mass, np.finfo(float).tiny)[:, None], mass


def merged_labels(labels: np.ndarray, centres: np.ndarray, weights: np.ndarray) -> np.ndarray | None:
    """The components' labels one merge further: the two global clusters whose join costs least (Ward), joined.

    Parameters
    ----------
    labels : ndarray of shape (m,)
        The global cluster (0..K-1) of each final component.
    centres : ndarray of shape (m, d)
        The components' centres.
    weights : ndarray of shape (m,)
        The components' weights (their points).

    Returns
    -------
    labels : ndarray of shape (m,) or None
        None for one cluster.
    """
    means, mass = _cluster_means(labels, centres, weights)
    k = means.shape[0]
    if k < 2:
        return None
    # Ward's cost of joining a and b: the within-cluster sum of squares the join adds.
    gaps = np.square(means[:, None, :] - means[None, :, :]).sum(axis=2)
    cost = mass[:, None] * mass[None, :] / np.maximum(mass[:, None] + mass[None, :], np.finfo(float).tiny) * gaps
    cost[np.diag_indices(k)] = np.inf
    a, b = np.unravel_index(np.argmin(cost), cost.shape)
    return np.where(labels == max(a, b), min(a, b), labels)


def split_labels(labels: np.ndarray, centres: np.ndarray, weights: np.ndarray) -> np.ndarray | None:
    """The components' labels one split further: the cluster whose components spread most, cut in two.

    The cut is across the principal direction of the cluster's weighted component centres, at their
    weighted mean (principal direction divisive partitioning, Boley 1998). Parameters as
    :func:`merged_labels`; None where no cluster has two distinct centres.
    """
    means, _ = _cluster_means(labels, centres, weights)
    residuals = centres - means[labels]
    within = np.bincount(labels, weights=weights * np.square(residuals).sum(axis=1), minlength=means.shape[0])
    widest = int(np.argmax(within))
    if within[widest] <= 0:
        return None
    members = np.flatnonzero(labels == widest)
    direction = np.linalg.svd(residuals[members] * np.sqrt(weights[members])[:, None], full_matrices=False)[2][0]
    side = residuals[members] @ direction > 0
    if side.all() or not side.any():
        return None
    split = labels.copy()
    split[members[side]] = means.shape[0]
    return split
