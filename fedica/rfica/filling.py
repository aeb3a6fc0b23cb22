"""A site's bad channels, filled by the server from the sites that have them (docs/ALGORITHMS.md section 1.12).

A site with a flat (dead, disconnected, constant) or saturated channel estimates its columns on its other channels
(:func:`fedica.rfica.local.local_ica`) and sends NaN on those channels' rows, and NaN columns for
the components its other channels cannot hold. The server completes such an estimate before the
aggregation, from a reference that only complete sites make: every column the site estimated is
matched to a reference column on the channels it has (one-to-one, by ``|cos|``), and takes that
reference column's values on its bad rows, scaled to it by least squares on the rows it has; every
column it lacks is a reference column no estimated column matched. The filled entries are the
complete sites' consensus, so they pull each cluster towards what the sites with those channels
already agree on, and a site that marks channels bad only gives up its say on them.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

__all__ = ["fill_from_reference", "fill_alone", "bad_rows"]


def bad_rows(estimate: np.ndarray) -> np.ndarray:
    """The channels (row indices) an estimate marks bad: its whole-NaN rows."""
    return np.flatnonzero(np.isnan(estimate).all(axis=1))


def fill_from_reference(estimate, reference) -> np.ndarray:
    """``estimate`` with its NaN rows and columns filled from ``reference``, every column of unit norm.

    Parameters
    ----------
    estimate : ndarray of shape (p, r)
        A site's estimate: NaN on whole rows (bad channels) and whole columns (components not
        estimated, at most as many as the bad rows), finite elsewhere.
    reference : ndarray of shape (p, r)
        The complete sites' aggregate, finite.

    Returns
    -------
    filled : ndarray of shape (p, r), finite
    """
    missing = np.isnan(estimate)
    rows, columns = ~missing.all(axis=1), np.flatnonzero(~missing.all(axis=0))
    known = estimate[np.ix_(rows, columns)]
    reference_known = reference[rows]
    cosines = np.abs(_unit(known).T @ _unit(reference_known))
    estimated, matched = linear_sum_assignment(-cosines)
    filled = np.empty_like(reference)
    for column, partner in zip(columns[estimated], matched):
        on_known = reference_known[:, partner]
        scale = (estimate[rows, column] @ on_known) / (on_known @ on_known)
        filled[:, column] = scale * reference[:, partner]
        filled[rows, column] = estimate[rows, column]
    unmatched = np.setdiff1d(np.arange(reference.shape[1]), matched)
    absent = np.flatnonzero(missing.all(axis=0))
    filled[:, absent] = reference[:, unmatched[:absent.size]]
    return _unit(filled)


def fill_alone(estimate) -> np.ndarray:
    """``estimate`` filled without a reference (no two complete sites): zeros on its bad rows, its bad channels' own
    directions for the columns it lacks.

    Within the site's own data that is exact for a flat channel, whose row of the mixing is zero
    (it holds nothing of any source), and whose own direction is a component of nothing; for a
    saturated channel it is the site's own best statement, its channel left out.
    """
    missing = np.isnan(estimate)
    filled = np.where(missing, 0.0, estimate)
    absent, bad = np.flatnonzero(missing.all(axis=0)), bad_rows(estimate)
    filled[bad[:absent.size], absent] = 1.0
    return _unit(filled)


def _unit(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=0)
    return matrix / np.where(norms > 0, norms, 1.0)
