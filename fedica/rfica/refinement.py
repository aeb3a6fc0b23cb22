"""RF-ICA's federated refinement: symmetric FastICA on the federation's data, started from the one-shot aggregate.

The one-shot aggregate is only as good as the sites' own estimates: a site of 1,000 samples that
separates 8 sources alone errs on a column or two, and a robust centre of six such estimates cannot
do better than the better half of them, where FastICA on the pooled samples uses them all
(docs/ALGORITHMS.md section 1.10). FastICA's fixed point needs only averages over the samples, so
it can run on the federation's data without any sample leaving its site: the server sends the
current unmixing ``B`` (``r x r``, in the shared whitened coordinates ``x = W (y - mean)``); every
site replies three averages over its own samples,

    C_k = E_k[x x^T]   (r x r),   M_k = E_k[x g(B x)^T]   (r x r),   e_k = E_k[g'(B x)]   (r),

and the server combines them robustly and takes one FastICA step (:func:`refinement_step`). With every site kept and weighted by its sample count, the combination is the
pooled average and the steps are pooled FastICA's, to rounding: the refinement converges to the
pooled fit (tested). The one-shot start is already near that fit, so a few steps suffice where
FastICA's random start needs tens to hundreds.

Robustness: a site with noisy, dead or saturated channels, or a hostile site, would pull a plain
average anywhere (pooled FastICA on six sites, one of them noisy, errs by 1.5). Before averaging,
the server sets aside every site whose averages lie far beyond the others' spread
(:func:`refinement_step`), and caps every site's weight at the median sample count, so that no
claimed count buys influence. A minority that keeps its averages within that spread can still
steer every step a little, and the steps compound; so a refined column is kept only while it lies
within the spread the one-shot aggregate's own cut allows its cluster (:func:`within_one_shot_spread`),
and the one-shot column stands otherwise: the refinement never leaves the one-shot's guarantee.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from fedica.concurrency import one_blas_thread
from fedica.rfica.aggregation import trim_cut
from fedica.rfica.geometric_median import geometric_median
from fedica.rfica.local import observation_matrix
from fedica.validation import as_float_array

__all__ = ["RefinementStatistics", "site_statistics", "refinement_step", "within_one_shot_spread", "fastica_step",
           "decorrelate", "direction_change", "REFINEMENT_TOLERANCE", "WIDE_CUT_FACTOR"]

# The refinement stops once no unmixing row turns by more than this (1 - |cos|) in a step: the sites' own FastICA
# tolerance on the same quantity (fedica.rfica.local.local_ica's tol).
REFINEMENT_TOLERANCE = 1e-6

# How many times the trimmed centre's cut (docs/ALGORITHMS.md 1.4.2) a site's statistics may lie from the
# federation's median before they are set aside. Honest sites differ by more than sampling noise (each records
# its own stretch of the sources: six honest sites of the issue-23 workloads spread 0.04 to 0.13 from the
# identity in their whitened covariance), so the plain cut set aside one honest site of six in 3 of 10 seeds
# and lost the efficiency the refinement is for (1.62x the pooled FastICA where the wide cut gives 1.13x),
# while a poor site stands thousands of times further (170 for a site at 3 sd of noise). Wider is not safer for
# the honest: a sound site that holds a stretch the others lack lay 3.67 cuts out (16 channels, 8 sources, seed 4),
# but five cuts for every site let 40 % of steering sites take a 16-channel, 8-source result from .061 to .445, and
# five only for sites whose one-shot estimate the aggregation kept whole let rotated_truth's forgers, whose
# columns outvote the honest ones in the one-shot, steer it to .54-1.09 (docs/ALGORITHMS.md 1.10).
WIDE_CUT_FACTOR = 2.0


# How many contiguous blocks of its samples a site also averages over, so that the server sees how far its averages
# move within its own data (its own sampling spread, docs/ALGORITHMS.md 1.10): eight blocks give the spread's
# variance 7 degrees of freedom per coordinate, and blocks of 125 samples at a site's smallest 1,000.
REFINEMENT_BLOCKS = 8


@dataclass(frozen=True)
class RefinementStatistics:
    """One site's averages at the current unmixing (the module docstring's ``C_k``, ``M_k``, ``e_k``), and the same
    averages over each of :data:`REFINEMENT_BLOCKS` contiguous blocks of its samples (None where it sent none)."""

    covariance: np.ndarray
    moments: np.ndarray
    slopes: np.ndarray
    n_samples: int
    block_covariances: np.ndarray | None = None
    block_moments: np.ndarray | None = None
    block_slopes: np.ndarray | None = None


def _nonlinearity(contrast: str, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FastICA's ``g(y)`` and ``g'(y)``, sample by sample, for ``contrast`` (scikit-learn's definitions)."""
    if contrast == "logcosh":
        g = np.tanh(y)
        return g, 1.0 - g**2
    if contrast == "cube":
        return y**3, 3.0 * y**2
    raise ValueError(f"contrast must be 'logcosh' or 'cube', got {contrast!r}")


def site_statistics(Y, whitening, unmixing, contrast="logcosh") -> RefinementStatistics:
    """A site's averages for one refinement step (what it sends; no sample leaves it).

    Parameters
    ----------
    Y : array-like of shape (n_channels, n_samples)
        The site's observations, one column per sample, any memory order.
    whitening : array-like of shape (r, n_channels)
        The federation's whitening ``W`` (docs/ALGORITHMS.md section 1.8).
    unmixing : array-like of shape (r, r)
        The server's current ``B``.
    contrast : {"logcosh", "cube"}, default="logcosh"

    Returns
    -------
    RefinementStatistics
    """
    data = observation_matrix(Y)
    whitening = as_float_array(whitening, "whitening")
    unmixing = as_float_array(unmixing, "unmixing")
    r = unmixing.shape[0]
    if whitening.shape != (r, data.shape[0]) or unmixing.shape != (r, r):
        raise ValueError(f"whitening {whitening.shape} and unmixing {unmixing.shape} do not fit {data.shape[0]} "
                         f"channels and {r} components")
    n = data.shape[1]
    # One BLAS thread, as the local ICA (fedica.rfica.local): the products are r x n by n x r.
    with one_blas_thread():
        x = whitening @ (data - data.mean(axis=1, keepdims=True))
        g, derivatives = _nonlinearity(contrast, unmixing @ x)
        statistics = RefinementStatistics(x @ x.T / n, x @ g.T / n, derivatives.mean(axis=1), n)
        if n < 2 * REFINEMENT_BLOCKS:  # too few samples for blocks that say anything: the plain cut judges it
            return statistics
        blocks = [slice(block[0], block[-1] + 1) for block in np.array_split(np.arange(n), REFINEMENT_BLOCKS)]
        return replace(statistics,
                       block_covariances=np.stack([x[:, b] @ x[:, b].T / (b.stop - b.start) for b in blocks]),
                       block_moments=np.stack([x[:, b] @ g[:, b].T / (b.stop - b.start) for b in blocks]),
                       block_slopes=np.stack([derivatives[:, b].mean(axis=1) for b in blocks]))


def refinement_step(statistics, unmixing, *, gm_tol=1e-10, averaged=None, noise=None):
    """The server's step from the sites' averages, robust to a minority of sites: ``(unmixing, kept)``.

    Each site's independence evidence (:func:`independence_evidence`) is measured from the
    evidence's geometric median, the distance scaled by ``sqrt(n_k / median n)`` (a site's sampling
    error shrinks as ``1 / sqrt(n_k)``, so a large site is held to a tighter bound, and a site that
    claims a large count to weigh more is judged by it). A site within :data:`EVIDENCE_CUT_FACTOR`
    times the trimmed centre's cut (docs/ALGORITHMS.md 1.4.2) of the median distance is kept; a site
    beyond it is kept too when its own sampling spread (from its blocks) reaches its distance within
    :data:`OWN_SPREAD_FACTOR`, its weight then shrunk by ``(cut / distance)^2``, so that its pull on
    the step is no more than a site's at the cut; the others are set aside. The kept sites' averages,
    weighted by ``min(n_k, median n)`` so that no claimed count buys more than the median site's
    weight, give :func:`fastica_step`. With every site kept and equal sizes, that is the pooled
    FastICA step. Never more than half is set aside.

    Parameters
    ----------
    statistics : sequence of RefinementStatistics
        One per site, all of one ``r``.
    unmixing : ndarray of shape (r, r)
        The unmixing the averages were taken at.
    gm_tol : float, default=1e-10
    averaged : array-like of shape (n_sites,), dtype bool, optional
        The sites whose averages may enter the step (default: all). The others still count in the
        median and the spread the cut is measured against, but are never averaged: the sites with
        bad channels (docs/ALGORITHMS.md section 1.12), whose averages hold zeros or clipped values
        on them. Leaving them out of the cut's statistics too would judge the others by fewer
        sites, and set honest ones aside (measured: an honest site of the four left, 2.4x the clean pooled error).
    noise : array-like of shape (n_sites, r, r), optional
        Each site's sensor noise in the whitened coordinates (:func:`fedica.rfica.whitening.site_noise`),
        removed from its evidence; with it, loudness bounds a site's weight instead of setting it aside.

    Returns
    -------
    unmixing : ndarray of shape (r, r)
        The next ``B``, with ``B C B^T = I``.
    kept : ndarray of shape (n_sites,), dtype bool
        The sites kept (``averaged`` or not).
    """
    vectors = np.stack([np.concatenate([s.covariance.ravel(), s.moments.ravel(), s.slopes]) for s in statistics])
    counts = np.array([s.n_samples for s in statistics], dtype=np.float64)
    scale = np.sqrt(counts / np.median(counts))
    within = None
    for _ in range(2):  # E fitted on every site, then on those within the first cut
        evidence, traces, own_spreads = _evidence(statistics, unmixing, within, noise)
        distances = np.linalg.norm(evidence - geometric_median(evidence, tol=gm_tol), axis=1) * scale
        cut = EVIDENCE_CUT_FACTOR * trim_cut(evidence.shape[1], len(statistics)) * np.median(distances)
        within = (distances <= cut) | (cut == 0)  # no spread at all: every site alike
    # Beyond the cut, but within what the site's own samples spread: an honest site whose stretch of the sources is
    # unlike the others'. It is averaged, not fitted (E is the sites' within the cut). A site without blocks has no
    # spread to show (NaN compares False).
    explained = ~within & (distances <= OWN_SPREAD_FACTOR * own_spreads * scale)
    kept = within | explained
    shrink = np.ones_like(distances)
    shrink[explained] = (cut / distances[explained]) ** 2  # beyond the cut: never 0 (np.where would divide everywhere)
    loudness = traces / np.median(traces)
    if noise is None:
        kept &= loudness <= TRACE_RATIO_LIMIT
    r = unmixing.shape[0]
    eligible = kept if averaged is None else kept & np.asarray(averaged, dtype=bool)
    if not eligible.any():  # every site within the cut has bad channels: nothing to average, no step
        return unmixing, kept
    weights = np.minimum(counts, np.median(counts)) * eligible * shrink
    if noise is not None:
        weights *= np.minimum(1.0, TRACE_RATIO_LIMIT / loudness)
    mean = weights @ vectors / weights.sum()
    covariance = mean[:r * r].reshape(r, r)
    covariance = (covariance + covariance.T) / 2
    return fastica_step(unmixing, covariance, mean[r * r:2 * r * r].reshape(r, r), mean[2 * r * r:]), kept


# How many times the trimmed centre's cut a site's independence evidence may lie from the federation's median before
# it is set aside. Measured (eight sites whose sources are up to 10 times louder or softer from site to site, 6
# channels): honest sites lie within 1.7 cuts, a site with noise at 2 sd at 7.5; at 2 cuts an honest site at the
# boundary was set aside at one step and kept at the next, and the refinement never converged.
EVIDENCE_CUT_FACTOR = 4.0

# How many times its own sampling spread (from its blocks) a site beyond the cut may lie from the federation's median
# and still be kept, at a weight that pulls no more than a site at the cut: an honest site whose stretch of the
# sources is unlike the others' lies within it, a site whose dependence is systematic (noise, a forged average)
# far beyond, as its blocks all show the same.
OWN_SPREAD_FACTOR = 4.0

# A site whose whitened covariance's trace (its loudness in the federation's whitened units) is beyond this factor of
# the median site's, either way, is set aside: honest sites whose sources differ in strength differ in their
# traces by far less (sources 10 times louder or softer at some sites: within 4x), and no site's scale may buy weight.
TRACE_RATIO_LIMIT = 10.0


def independence_evidence(statistics, unmixing, kept=None, noise=None) -> tuple[np.ndarray, np.ndarray]:
    """What an honest site cannot produce, per site, whatever the strength of each source there: ``(evidence, traces)``.

    At the current unmixing ``B`` the site's estimated sources are ``s' = B x``; its averages give
    their covariance ``S_k = B C_k B^T``, ``T_k = B M_k = E_k[s' g(s')^T]`` and the slopes ``e_k``.
    If ``B`` were exact, independent sources, whatever each one's strength at the site, would make
    both off-diagonals zero. ``B`` is not exact: ``s' = (I + E) s`` for one error ``E`` shared by all
    sites, and to first order

        S_ij = E_ij S_jj + E_ji S_ii,      T_ij = E_ij T_jj + E_ji S_ii e_j,

    each site with its own diagonals (its sources' strengths). ``E`` is fitted by least squares over
    the ``kept`` sites, pair by pair; a site's residuals, divided by ``sqrt(S_ii S_jj)`` (and
    ``sqrt(S_ii)`` for ``T``, ``g`` being bounded), are the evidence: sampling noise for an honest
    site, loud or faint, and far from zero for noise added across the channels, a dead or clipped
    channel, or averages made up to steer (docs/ALGORITHMS.md section 1.10). With ``noise`` (each
    site's sensor noise in the whitened coordinates), what that noise adds is removed first.

    Returns
    -------
    evidence : ndarray of shape (n_sites, 2 r (r - 1))
    traces : ndarray of shape (n_sites,)
        ``tr C_k``.
    """
    evidence, traces, _ = _evidence(statistics, unmixing, kept, noise)
    return evidence, traces


def _observed(unmixing, covariances, moments, slopes, sensor):
    """``S = B C B^T`` and ``T = B M`` of averages (leading axes any), less what the sensor noise adds to each."""
    sources = unmixing @ covariances @ unmixing.T
    moments = unmixing @ moments
    if sensor is not None:
        # A site's sensor noise n' = B W n, Gaussian, adds N = B W Psi W^T B^T to S and, by Stein's lemma
        # (E[n'_i g(s'_j)] = N_ij E[g'(s'_j)]), N_ij e_j to T_ij: dependence between the estimated sources that
        # independent sources and an honest site's own noise make together. Removed, it is no evidence.
        sources = sources - sensor
        moments = moments - sensor * slopes[..., None, :]
    return sources, moments


def _evidence(statistics, unmixing, kept=None, noise=None):
    """:func:`independence_evidence`, and each site's own sampling spread of its evidence (NaN without blocks).

    A site's blocks (contiguous parts of its samples) give its evidence's residuals block by block, with
    the site's own scale and the federation's fitted ``E``; their spread about their mean, over the
    blocks' count, estimates the variance of the site's evidence from its own samples alone, and the
    spread returned is the root of its sum over the coordinates: the distance an honest site's sampling
    alone puts it from zero.
    """
    r = unmixing.shape[0]
    n_sites = len(statistics)
    slopes = np.stack([site.slopes for site in statistics])
    sensor = None if noise is None else np.einsum("ab,kbc,dc->kad", unmixing, np.asarray(noise, dtype=np.float64),
                                                   unmixing)
    raw_sources = np.stack([unmixing @ site.covariance @ unmixing.T for site in statistics])
    # Floored: a covariance with no variance along a source (a hostile site may send one) stands far out, not NaN.
    # The scale is the site's whole variance, its noise included: a faint source's is never divided down to nothing.
    totals = np.einsum("kii->ki", raw_sources)
    deviations = np.sqrt(np.maximum(totals, 1e-24 * np.median(totals)))
    sources, moments = _observed(unmixing, np.stack([site.covariance for site in statistics]),
                                 np.stack([site.moments for site in statistics]), slopes, sensor)
    with_blocks = [k for k, site in enumerate(statistics) if site.block_covariances is not None]
    block_sources = {k: _observed(unmixing, statistics[k].block_covariances, statistics[k].block_moments,
                                  statistics[k].block_slopes, None if sensor is None else sensor[k])
                     for k in with_blocks}
    kept = np.ones(n_sites, dtype=bool) if kept is None else np.asarray(kept, dtype=bool)
    variances = np.einsum("kii->ki", sources)
    residuals, block_residuals = [], {k: [] for k in with_blocks}
    for i, j in zip(*np.triu_indices(r, 1)):
        # Four observations per site (S_ij, S_ji's twin is the same: S is symmetric, so T_ij and T_ji), two unknowns.
        design = np.stack([
            np.column_stack([variances[:, j], variances[:, i]]),          # S_ij = E_ij S_jj + E_ji S_ii
            np.column_stack([moments[:, j, j], variances[:, i] * slopes[:, j]]),  # T_ij
            np.column_stack([variances[:, j] * slopes[:, i], moments[:, i, i]]),  # T_ji = E_ij S_jj e_i + E_ji T_ii
        ], axis=1)
        observed = np.column_stack([sources[:, i, j], moments[:, i, j], moments[:, j, i]])
        scale = np.column_stack([deviations[:, i] * deviations[:, j], deviations[:, i], deviations[:, j]])
        design, observed = design / scale[:, :, None], observed / scale
        error = np.linalg.lstsq(design[kept].reshape(-1, 2), observed[kept].ravel(), rcond=None)[0]
        fitted = design @ error
        residuals.append(observed - fitted)
        for k in with_blocks:  # the same residuals, block by block: the site's design and scale, its blocks' pairs
            block_s, block_t = block_sources[k]
            block_observed = np.column_stack([block_s[:, i, j], block_t[:, i, j], block_t[:, j, i]]) / scale[k]
            block_residuals[k].append(block_observed - fitted[k])
    traces = np.array([np.trace(site.covariance) for site in statistics])
    own_spreads = np.full(n_sites, np.nan)
    if not residuals:  # one component: no pair to be independent, every site alike
        return np.zeros((n_sites, 1)), traces, own_spreads
    for k in with_blocks:
        blocks = np.concatenate(block_residuals[k], axis=1)
        count = blocks.shape[0]
        own_spreads[k] = np.sqrt(((blocks - blocks.mean(axis=0)) ** 2).sum() / (count * (count - 1)))
    return np.concatenate(residuals, axis=1), traces, own_spreads


# The fewest columns in a cluster for which the refinement's spread guard applies: a minority needs a majority
# beside it, and the spread of one or two columns (zero for one site: a federation of one) bounds nothing.
MIN_GUARDED_MEMBERS = 3


def within_one_shot_spread(refined, clusters, *, gm_tol=1e-10) -> np.ndarray:
    """Which refined columns lie within the spread the one-shot aggregate's cut allows their cluster.

    ``clusters[j]`` holds cluster ``j``'s signed unit columns (one per site, as the server
    aggregated them); the bound is :data:`WIDE_CUT_FACTOR` times the trimmed centre's cut around
    the cluster's geometric median (docs/ALGORITHMS.md 1.4.2). A refinement that a minority
    steers (every step within its own cut, so the steps compound) ends outside; an honest one
    moves towards the pooled fit, inside the honest columns' own spread. A cluster of fewer than
    :data:`MIN_GUARDED_MEMBERS` columns is inside: no minority can steer it.

    Parameters
    ----------
    refined : ndarray of shape (p, r)
        Unit columns, each signed as its one-shot column.
    clusters : sequence of ndarray of shape (n_members, p)

    Returns
    -------
    inside : ndarray of shape (r,), dtype bool
    """
    inside = np.ones(refined.shape[1], dtype=bool)
    for j, members in enumerate(clusters):
        if members.shape[0] < MIN_GUARDED_MEMBERS:
            continue  # one or two sites hold no minority to guard against, and their spread is no measure of one
        median = geometric_median(members, tol=gm_tol)
        spread = np.median(np.linalg.norm(members - median, axis=1))
        bound = WIDE_CUT_FACTOR * trim_cut(max(members.shape[1] - 1, 1), members.shape[0]) * spread
        inside[j] = np.linalg.norm(refined[:, j] - median) <= bound
    return inside


def fastica_step(unmixing, covariance, moments, slopes) -> np.ndarray:
    """One symmetric FastICA step on data of covariance ``covariance`` (not necessarily white).

    In the coordinates ``z = C^(-1/2) x`` where the data are white, FastICA's fixed point is
    ``v_i <- E[z g(v_i^T z)] - E[g'(v_i^T z)] v_i``, then the rows' symmetric decorrelation. With
    ``w_i = C^(-1/2) v_i`` acting on ``x``, that is ``w_i <- C^(-1) E[x g(w_i^T x)] - E[g'] w_i``
    and ``B <- (B C B^T)^(-1/2) B``, which needs only the averages of :func:`site_statistics`.

    Returns
    -------
    unmixing : ndarray of shape (r, r)
        The new ``B``, with ``B C B^T = I``.
    """
    return decorrelate(np.linalg.solve(covariance, moments).T - slopes[:, None] * unmixing, covariance)


def decorrelate(unmixing, covariance) -> np.ndarray:
    """``(B C B^T)^(-1/2) B``: FastICA's symmetric decorrelation for data of covariance ``C``."""
    eigenvalues, eigenvectors = np.linalg.eigh(unmixing @ covariance @ unmixing.T)
    return (eigenvectors / np.sqrt(eigenvalues)) @ eigenvectors.T @ unmixing


def direction_change(before, after) -> float:
    """The largest ``1 - |cos|`` between a row of ``before`` and the same row of ``after`` (FastICA's criterion)."""
    cosines = np.sum(before * after, axis=1) / (np.linalg.norm(before, axis=1) * np.linalg.norm(after, axis=1))
    return float(np.max(1.0 - np.abs(cosines)))
