"""Choosing upsilon, FedGEM's one hyperparameter (docs/ALGORITHMS.md section 2, tuning).
"""

from __future__ import annotations

import numpy as np


def select_upsilon(silhouettes, k_hats, guard):
    """Index of the winning upsilon in a tuning grid.

    Rule (docs/ALGORITHMS.md section 2.6): candidates with a NaN silhouette are never
    chosen. If some candidate has ``k_hat <= guard``, only those compete. Among the
    competitors the highest silhouette wins; silhouettes within 1e-12 of the best
    tie, and ties go to the smaller ``k_hat``, then to the smaller index.

    Parameters
    ----------
    silhouettes : array-like of shape (c,)
        Weighted mean silhouette per candidate (NaN allowed).
    k_hats : array-like of shape (c,)
        Number of global clusters per candidate.
    guard : float
        The largest k_hat that is not significantly above ``sqrt(sum_g K_g)`` (the
        caller scales that bound by its tolerance).

    Returns
    -------
    index : int
    """
    silhouettes = np.asarray(silhouettes, dtype=float)
    k_hats = np.asarray(k_hats)
    if silhouettes.ndim != 1 or silhouettes.size == 0:
        raise ValueError("silhouettes must be a non-empty 1-D array.")
    if k_hats.shape != silhouettes.shape:
        raise ValueError(
            f"k_hats must have the shape of silhouettes {silhouettes.shape}; got {k_hats.shape}."
        )
    if not np.isfinite(guard):
        raise ValueError(f"guard must be finite; got {guard!r}.")
    valid = ~np.isnan(silhouettes)
    if not valid.any():
        raise ValueError("silhouettes are all NaN: no upsilon can be selected.")
    competing = valid & (k_hats <= guard)
    if not competing.any():
        competing = valid
    best = silhouettes[competing].max()
    tied = competing & (silhouettes >= best - 1e-12)
    smallest_k = k_hats[tied].min()
    return int(np.flatnonzero(tied & (k_hats == smallest_k))[0])
