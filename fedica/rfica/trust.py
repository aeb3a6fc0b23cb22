"""RF-ICA's trust rules: the sites' estimates a server refuses before the aggregation, each with its reason.

An honest site's estimate is a signed permutation of ``A*``'s columns, up to its noise: its columns
are far from parallel and its condition number close to that of ``A*``, as every other honest
site's. A degenerate estimate (rank one, two columns alike, or conditioned far worse than the
federation's own sites) can only weigh one direction in several clusters, so it is refused
(docs/ALGORITHMS.md section 1.4, "Trust rules"). Every test is on the unit columns
(:func:`fedica.rfica.aggregation.normalise_estimates`), so no scale a site chooses changes it.
"""

from __future__ import annotations

import numpy as np

from fedica.rfica.aggregation import normalise_estimates

# |cos| between two unit columns of one estimate above which they are one direction (2.6 degrees apart).
_PARALLEL_COSINE = 0.999
# Smallest over largest singular value of an estimate's unit columns below which it is rank-deficient.
_RANK_TOLERANCE = 1e-8
# An estimate is conditioned far beyond the federation's when its log condition number exceeds the
# sites' median by more than this many robust standard deviations (1.4826 MAD) and by more than a
# factor of _CONDITION_FACTOR: the factor keeps honest sites of a tight federation (all near
# orthogonal, MAD about 0.01) even with 50 samples (conditioned up to 2.5 at Fig. 1's hardest point).
_CONDITION_SPREAD = 5.0
_CONDITION_FACTOR = 10.0
# MAD -> standard deviation of a normal distribution.
_MAD_TO_SD = 1.4826


def estimate_defects(estimates) -> dict[int, str]:
    """The estimates to refuse, by index, with the reason of each.

    In order, an estimate is refused for:

    - ``duplicated or near-parallel columns``: two unit columns with ``|cos| > 0.999``;
    - ``rank-deficient``: its unit columns' smallest singular value below ``1e-8`` of the largest;
    - ``condition number far beyond the federation's``: ``log cond`` above the median of the
      other tests' survivors by more than ``max(5 * 1.4826 * MAD, log 10)``.

    The median and the MAD have breakdown point one half: fewer than half of the sites cannot
    move the bar far enough to pass a degenerate estimate, or to refuse an honest one.

    Parameters
    ----------
    estimates : array-like of shape (K, p, r)
        Finite estimates with no zero column, ``p >= r``; columns of any scale.

    Returns
    -------
    defects : dict of int to str
        Index of each refused estimate -> its reason (one line).
    """
    unit = normalise_estimates(np.asarray(estimates, dtype=np.float64))
    r = unit.shape[2]
    defects = {}
    conditions = {}
    for k, columns in enumerate(unit):
        cosines = np.abs(columns.T @ columns)
        cosines[np.diag_indices(r)] = 0.0
        first, second = np.unravel_index(np.argmax(cosines), cosines.shape)
        if cosines[first, second] > _PARALLEL_COSINE:
            defects[k] = (f"duplicated or near-parallel columns {min(first, second)} and {max(first, second)} "
                          f"(|cos| {cosines[first, second]:.6f} > {_PARALLEL_COSINE})")
            continue
        singular = np.linalg.svd(columns, compute_uv=False)
        if singular[-1] <= _RANK_TOLERANCE * singular[0]:
            defects[k] = (f"rank-deficient (its unit columns' smallest singular value is "
                          f"{singular[-1] / singular[0]:.1e} of the largest)")
            continue
        conditions[k] = np.log(singular[0] / singular[-1])
    if conditions:
        logs = np.array(list(conditions.values()))
        median = np.median(logs)
        spread = _MAD_TO_SD * np.median(np.abs(logs - median))
        bar = median + max(_CONDITION_SPREAD * spread, np.log(_CONDITION_FACTOR))
        for k, log_condition in conditions.items():
            if log_condition > bar:
                defects[k] = (f"condition number {np.exp(log_condition):.3g} far beyond the federation's "
                              f"(median {np.exp(median):.3g}, refused above {np.exp(bar):.3g})")
    return dict(sorted(defects.items()))
