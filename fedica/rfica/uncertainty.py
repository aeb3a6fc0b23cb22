"""How well a site sees each of its sources: the variance of each estimated column's direction, and the weight it buys.

Between sites (subjects, sessions) the sources' strengths differ: a source loud at two sites may lie
under the sensor noise at four. A site that does not see a source still returns a column for it (its
ICA always returns as many as asked), and that column is noise; a robust centre over mostly such
columns is itself noise (issue 45: one-shot error .68 where pooled FastICA gives .005). So each site
reports, from its own data, how uncertain each of its columns is, and the server weights the columns
by it (docs/ALGORITHMS.md section 1.13).

The site's variance. Symmetric FastICA and Picard's orthogonal mode share their fixed points, and
their estimate's gain ``G = B A`` has off-diagonal entries asymptotically normal with variances
(Tichavsky, Koldovsky and Oja 2006, symmetric FastICA)

    V_lk = (gamma_l + gamma_k + tau_k^2) / (n (tau_l + tau_k)^2),

``mu_k = E[s_k g(s_k)]``, ``rho_k = E[g'(s_k)]``, ``gamma_k = E[g(s_k)^2] - mu_k^2``, ``tau_k = |mu_k - rho_k|``
for the unit-variance sources and the contrast's nonlinearity ``g``. The mixing ``A G^-1`` moves column
``k`` by ``-sum_l c_l G_lk``, with ``c_l`` column ``l`` at its source's unit variance in channel space, so
the direction of column ``k`` has the variance

    u_k = sum_(l != k) V_lk |c_l - (c_l . c_k / |c_k|^2) c_k|^2 / |c_k|^2,

in radians squared. It is large where the site cannot see source ``k``: ``|c_k|`` is then the noise's
amplitude, and every loud source's leak into the column turns it. The site computes it from its own
estimated sources, with no one else's data.

The server's weight. A column whose direction is known within :data:`FULL_WEIGHT_VARIANCE` counts
fully (weight 1); beyond it, in inverse proportion to its variance, down to :data:`MIN_COLUMN_WEIGHT`.
The weight never exceeds 1, whatever a site claims, so a site that claims to see everything counts as
an ordinary site, and the robust centre's guarantee holds in weight: a coalition breaks a column only
with half the weight of its cluster (docs/ALGORITHMS.md section 1.13).
"""

from __future__ import annotations

import numpy as np

from fedica.protocol.messages import MAX_COLUMN_VARIANCE

__all__ = ["column_variances", "column_weights", "FULL_WEIGHT_VARIANCE", "MIN_COLUMN_WEIGHT", "MAX_COLUMN_VARIANCE"]

# A column whose direction's variance is at most this (radians squared: a standard deviation of .1 rad) counts fully.
# Measured on the recordings with unequal strengths (16 channels, 4 sources): the columns of sources a site sees lie
# at 6e-6 to 6e-2, those it does not at .16 to 4.6; 1e-2 and 1e-3 gave the same one-shot errors to within 10 %.
FULL_WEIGHT_VARIANCE = 1e-2
# The least weight of a column: a site blind to a source still counts a tenth, so that the honest sites that see a
# source need not hold half of its cluster's members, and yet no minority that claims full weight decides a column
# that the others see (docs/ALGORITHMS.md section 1.13).
MIN_COLUMN_WEIGHT = 0.1


def _contrast_terms(contrast: str, sources: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mu, rho, beta)`` per source: ``E[s g(s)]``, ``E[g'(s)]`` and ``E[g(s)^2]`` for the contrast's ``g``."""
    if contrast == "logcosh":
        g = np.tanh(sources)
        return (sources * g).mean(axis=1), (1.0 - g**2).mean(axis=1), (g**2).mean(axis=1)
    if contrast == "cube":
        g = sources**3
        return (sources * g).mean(axis=1), (3.0 * sources**2).mean(axis=1), (g**2).mean(axis=1)
    raise ValueError(f"contrast must be 'logcosh' or 'cube', got {contrast!r}")


def column_variances(columns, sources, contrast: str = "logcosh") -> np.ndarray:
    """The variance of each estimated column's direction (the module docstring's ``u_k``), what a site sends.

    Parameters
    ----------
    columns : ndarray of shape (n_channels, r)
        The site's mixing in channel space, each column at its source's scale in ``sources``.
    sources : ndarray of shape (r, n_samples)
        The site's estimated sources (centred), any scale.
    contrast : {"logcosh", "cube"}, default="logcosh"
        The nonlinearity the site's ICA used.

    Returns
    -------
    variances : ndarray of shape (r,)
        In ``(0, MAX_COLUMN_VARIANCE]``; a source of zero variance gives the largest.
    """
    columns = np.asarray(columns, dtype=np.float64)
    sources = np.asarray(sources, dtype=np.float64)
    r, n_samples = sources.shape
    deviations = sources.std(axis=1)
    seen = deviations > 0
    unit = sources / np.where(seen, deviations, 1.0)[:, None]
    scaled = columns * deviations  # each column at its source's unit variance
    mu, rho, beta = _contrast_terms(contrast, unit)
    gamma, tau = beta - mu**2, np.abs(mu - rho)
    norms = np.sum(scaled**2, axis=0)
    variances = np.full(r, MAX_COLUMN_VARIANCE)
    for k in np.flatnonzero(seen & (norms > 0)):
        others = np.delete(np.arange(r), k)
        across = scaled[:, others] - np.outer(scaled[:, k], scaled[:, k] @ scaled[:, others] / norms[k])
        with np.errstate(divide="ignore", invalid="ignore"):
            gain = (gamma[others] + gamma[k] + tau[k] ** 2) / (n_samples * (tau[others] + tau[k]) ** 2)
        total = float(np.sum(gain * np.sum(across**2, axis=0)) / norms[k])
        variances[k] = total if np.isfinite(total) else MAX_COLUMN_VARIANCE
    # A floor of float64's resolution: a reply of exact zeros would be a variance no sample gives.
    return np.clip(variances, np.finfo(np.float64).tiny, MAX_COLUMN_VARIANCE)


def column_weights(variances) -> np.ndarray:
    """The server's weight of each column from its site's variance: ``clip(FULL_WEIGHT_VARIANCE / u, MIN_COLUMN_WEIGHT, 1)``.

    NaN (a column a site with bad channels could not estimate, filled by the server) weighs the least.
    """
    variances = np.asarray(variances, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        weights = np.clip(FULL_WEIGHT_VARIANCE / variances, MIN_COLUMN_WEIGHT, 1.0)
    return np.where(np.isnan(variances), MIN_COLUMN_WEIGHT, weights)
