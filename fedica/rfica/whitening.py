"""RF-ICA's federated whitening: the federation's channel covariance and the subspace every site separates in.

From the sites' channel covariances (the covariance exchange, docs/ALGORITHMS.md section 1.8) the server
forms the robust global covariance (:func:`robust_covariance`), the subspace of ``n_components`` the sites
pool (:func:`pooled_subspace`; a share counted by :func:`share_count`), and the whitening within it
(:func:`whitening_of`). Plain numpy: the protocol's coordinator (:mod:`fedica.rfica.coordinator`) calls
these, and so can anyone holding covariances.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
from scipy.optimize import nnls

from fedica.rfica.geometric_median import geometric_median
from fedica.rfica.local import components_for_share

__all__ = ["federated_whitening", "robust_covariance", "whitening_of", "pooled_subspace", "share_count", "site_noise",
           "square_site_noise", "NOISE_FLOOR_LIMIT", "NOISE_SHARE_EXCESS", "NOISE_SHARE_Z", "SOLE_INFLUENCE_LIMIT", "SUBSPACE_FIT_LIMIT"]

# A global eigenvalue below this share of the largest is floored there before the whitening divides by it.
_RANK_DEFICIENT_RATIO = 1e-10


def federated_whitening(covariances, n_components, *, gm_tol=1e-10) -> tuple[np.ndarray, np.ndarray]:
    """The shared whitening from the sites' channel covariances, robust to a minority of them.

    Every covariance is divided by its trace, so that no site weighs more for its gain, its noise
    or a scale it makes up; the shape of the global covariance is the geometric median (in the
    Frobenius norm) of these unit-trace matrices, and its scale the median of the traces. The
    geometric median has breakdown point 1/2: a minority of sites, whatever they send, moves it
    by a bounded amount, where a single site would drag the mean (docs/ALGORITHMS.md section 1.8).

    Parameters
    ----------
    covariances : array-like of shape (n_sites, n_channels, n_channels)
        Validated covariances (symmetric, positive semi-definite, non-zero).
    n_components : int, float or None
        The components kept: an int; a share of the variance in (0, 1) of the global covariance
        (:func:`fedica.rfica.local.components_for_share`); None: every channel.
    gm_tol : float, default=1e-10
        Tolerance of the geometric median, at the unit-trace scale.

    Returns
    -------
    whitening : ndarray of shape (n_components, n_channels)
        ``diag(lambda)^(-1/2) U^T`` of the top eigenpairs of the global covariance: the rows
        span the shared subspace, and whiten the global covariance there.
    eigenvalues : ndarray of shape (n_channels,)
        The global covariance's eigenvalues, in decreasing order.
    """
    return whitening_of(robust_covariance(covariances, gm_tol=gm_tol), n_components, covariances, gm_tol=gm_tol)


def robust_covariance(covariances, *, gm_tol=1e-10) -> np.ndarray:
    """The federation's channel covariance from the sites' ones, robust to a minority of them.

    Every covariance is divided by its trace; the shape is the geometric median (in the Frobenius
    norm) of these unit-trace matrices and the scale the median of the traces (see
    :func:`federated_whitening`).

    Parameters
    ----------
    covariances : array-like of shape (n_sites, n_channels, n_channels)
        Validated covariances (symmetric, positive semi-definite, non-zero).
    gm_tol : float, default=1e-10

    Returns
    -------
    covariance : ndarray of shape (n_channels, n_channels), exactly symmetric
    """
    stack = np.asarray(covariances, dtype=np.float64)
    traces = np.trace(stack, axis1=1, axis2=2)
    return np.median(traces) * _matrix_median(stack / traces[:, None, None], gm_tol)


def _matrix_median(matrices: np.ndarray, gm_tol: float) -> np.ndarray:
    """The geometric median (Frobenius norm) of ``matrices`` (n, p, p), symmetrised."""
    n_matrices, size, _ = matrices.shape
    points = matrices.reshape(n_matrices, -1)
    # The median lies in the affine hull of the points: solve it there (n - 1 coordinates at most)
    # rather than among p^2, where Newton's steps would cost p^6.
    mean = points.mean(axis=0)
    basis = np.linalg.svd(points - mean, full_matrices=False)[2]
    median = (mean + geometric_median((points - mean) @ basis.T, tol=gm_tol) @ basis).reshape(size, size)
    return (median + median.T) / 2


def whitening_of(global_covariance, n_components, covariances=None, *, complete=None, decisive=None,
                 gm_tol=1e-10) -> tuple[np.ndarray, np.ndarray]:
    """The whitening of the federation's covariance onto its top ``n_components`` (:func:`federated_whitening`).

    With the sites' ``covariances`` and fewer components than channels, the subspace is the sites'
    pooled one (:func:`pooled_subspace`, over the sites ``complete`` marks: those without bad
    channels), and the global covariance is whitened within it; the indices of the sites it left out
    as deciding a direction alone are appended to the list ``decisive`` when one is given.
    """
    n_channels = global_covariance.shape[0]
    eigenvalues, eigenvectors = np.linalg.eigh(global_covariance)
    eigenvalues, eigenvectors = eigenvalues[::-1], eigenvectors[:, ::-1]
    if n_components is None:
        count = n_channels
    elif isinstance(n_components, float):
        count = components_for_share(eigenvalues, n_components)
        if covariances is not None:
            count = share_count(covariances, n_components, provisional=count, complete=complete)
    else:
        count = int(n_components)
    if covariances is not None and count < n_channels:
        basis, left_out = pooled_subspace(covariances, count, complete=complete)
        if decisive is not None:
            decisive.extend(left_out)
        within, rotation = np.linalg.eigh(basis.T @ global_covariance @ basis)
        within, rotation = within[::-1], rotation[:, ::-1]
        kept = np.maximum(within, _RANK_DEFICIENT_RATIO * eigenvalues[0])
        return ((basis @ rotation) / np.sqrt(kept)).T, eigenvalues
    kept = np.maximum(eigenvalues[:count], _RANK_DEFICIENT_RATIO * eigenvalues[0])
    return (eigenvectors[:, :count] / np.sqrt(kept)).T, eigenvalues


# A site whose noise floor (its covariance's share outside its own top-r subspace) is beyond this factor of the median
# site's is left out of the pooled subspace: honest sites lie within 0.4 to 1.2 of the median on the recordings and
# speech benches, sources 10 times louder or softer from site to site included; a site at 2 or 3 sd of noise at 375
# to 580.
NOISE_FLOOR_LIMIT = 10.0
# A site that alone turns the pooled subspace by more than this (the sine of the largest principal angle between the
# subspaces with and without it) is left out: no site decides a direction alone. Measured on issue 45's trial (16
# channels, 6 sources 10 times louder or softer from site to site, 20 seeds): honest sites turn it by at most .28,
# except a site that is the only one to see a source (1.0 and .72, two seeds), and a made-up covariance by .99.
SOLE_INFLUENCE_LIMIT = 0.5
# A site whose share outside the pooled subspace is beyond this factor of its own noise floor is left out: its signal
# lies elsewhere (a rotated or made-up covariance: 493). Honest sites' signals lie inside it: within 2.7 of their floor
# on the same 20 seeds (a site with a dead channel, left out already, at 8.5 to 276).
SUBSPACE_FIT_LIMIT = 10.0


def pooled_subspace(covariances, count: int, *, complete=None) -> tuple[np.ndarray, list[int]]:
    """The ``count``-dimensional subspace of the sites' pooled covariance, and the sites it left out.

    With sources louder at some sites and fainter at others, a source faint at most sites lies under
    most sites' own noise: each site's own top-``count`` subspace misses it, and so does any median of
    them (issue 45's trial, 16 channels and 6 sources: the median of the sites' projectors lay .6 to .9,
    the sine of the largest principal angle, from the sources' span). The mean of the sites' covariances
    holds every source that is loud somewhere, as pooled PCA does (.015 to .04). Pooled robustly:

    - every covariance is divided by its trace, so that each site is one unit of mass, whatever its gain,
      its loudness or a scale it makes up;
    - a site with bad channels (``complete`` False: a flat or clipped channel changes its covariance far
      beyond a faint source's share) is left out;
    - a site whose noise floor (the share of its covariance outside its own top-``count`` subspace) is
      beyond :data:`NOISE_FLOOR_LIMIT` times the median's is left out (a noisy site);
    - a site whose removal turns the subspace by more than :data:`SOLE_INFLUENCE_LIMIT` is left out, the
      most influential first and one at a time: a direction one site alone holds is a made-up one or a
      source no other site sees, and one site does not decide it;
    - then a site whose share outside the subspace is beyond :data:`SUBSPACE_FIT_LIMIT` times its own
      noise floor is left out (its signal lies elsewhere), and the mean taken again;
    - never half of the pooled sites. A coalition of sites that all send one made-up direction is not
      caught, as a source only they see could not be told from it (docs/ALGORITHMS.md section 1.8).

    Parameters
    ----------
    covariances : array-like of shape (n_sites, n_channels, n_channels)
    count : int
    complete : array-like of shape (n_sites,), dtype bool, optional
        The sites without bad channels (default: all). When none is, all are pooled.

    Returns
    -------
    basis : ndarray of shape (n_channels, count)
        Orthonormal columns.
    left_out : list of int
        The indices (into ``covariances``) of the sites left out as deciding a direction alone or lying
        outside the others' subspace.
    """
    shapes, floors, kept = _poolable(covariances, count, complete)
    pooled_sites, left_out = int(kept.sum()), []
    while 2 * (len(left_out) + 1) < pooled_sites:  # never half of the pooled sites
        members = np.flatnonzero(kept)
        total = shapes[members].sum(axis=0)
        basis = _top_eigenvectors(total, count)
        influence = [_subspace_sine(basis, _top_eigenvectors(total - shapes[k], count)) for k in members]
        strongest = int(np.argmax(influence))
        if influence[strongest] <= SOLE_INFLUENCE_LIMIT:
            break
        kept[members[strongest]] = False
        left_out.append(int(members[strongest]))
    basis = _top_eigenvectors(shapes[kept].sum(axis=0), count)
    # Then a site whose covariance lies outside the others' subspace: its energy outside it far beyond its own floor.
    outside = (1.0 - np.einsum("ic,kij,jc->k", basis, shapes, basis)) / np.maximum(floors, np.finfo(np.float64).tiny)
    misfits = [int(k) for k in np.argsort(-outside) if kept[k] and outside[k] > SUBSPACE_FIT_LIMIT]
    misfits = misfits[:max(0, (pooled_sites - 1) // 2 - len(left_out))]
    if misfits:
        kept[misfits] = False
        left_out.extend(misfits)
        basis = _top_eigenvectors(shapes[kept].sum(axis=0), count)
    return basis, sorted(left_out)


def share_count(covariances, share: float, *, provisional: int, complete=None) -> int:
    """How many components keep ``share`` of every site's variance, but one site's: ``n_components`` as a share.

    MNE's count on one recording keeps the fewest principal components whose cumulative share reaches
    ``share``. Counted on a median of the sites' covariances, a source loud at two sites and faint at
    the rest holds too little of it and is dropped (16 channels, 4 sources 10 times louder or softer
    from site to site: ``0.99`` kept 2 or 3). Here each site counts the pooled components (the
    eigenvectors of the mean of the trace-normalised covariances of the sites
    :func:`pooled_subspace` keeps at the ``provisional`` count) that hold ``share`` of its own
    variance, and the federation keeps the second largest of these counts: every source that two
    sites see strongly enough to matter at ``share`` is kept, and no single site (a noisy one,
    whose variance no few components hold) decides the count.

    Parameters
    ----------
    covariances : array-like of shape (n_sites, n_channels, n_channels)
    share : float
        In (0, 1).
    provisional : int
        The count of the robust global covariance's own spectrum, which sets the noise floor the
        pooled sites are chosen by (a noisy site pulls that spectrum's tail: 8 to 14 components for 4
        sources at 0.99 with one site at 3 sd of noise, so it is no count itself).
    complete : array-like of shape (n_sites,), dtype bool, optional

    Returns
    -------
    count : int
        At most ``n_channels``; ``provisional`` when fewer than two sites are pooled.
    """
    n_sites, n_channels, _ = np.shape(covariances)
    provisional = min(max(int(provisional), 1), n_channels)
    if provisional == n_channels or n_sites < 2:
        return provisional
    shapes, _, kept = _poolable(covariances, provisional, complete)
    if kept.sum() < 2:
        return provisional
    directions = np.linalg.eigh(shapes[kept].mean(axis=0))[1][:, ::-1]
    captured = np.cumsum(np.einsum("ic,kij,jc->kc", directions, shapes[kept], directions), axis=1)
    counts = np.sum(captured < share, axis=1) + 1  # the fewest leading directions that hold the share, per site
    return int(np.sort(counts)[-2])


def _poolable(covariances, count: int, complete) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sites' trace-normalised covariances, their noise floors at ``count``, and which may be pooled.

    A site may be pooled when it has no bad channel (``complete``; all when none is) and its noise floor
    (its share outside its own top-``count`` subspace) is within :data:`NOISE_FLOOR_LIMIT` of the median.
    """
    stack = np.asarray(covariances, dtype=np.float64)
    n_sites, n_channels, _ = stack.shape
    eligible = np.ones(n_sites, dtype=bool) if complete is None else np.asarray(complete, dtype=bool)
    if not eligible.any():
        eligible = np.ones(n_sites, dtype=bool)
    shapes = stack / np.trace(stack, axis1=1, axis2=2)[:, None, None]
    floors = np.clip(np.linalg.eigvalsh(shapes)[:, :n_channels - count], 0.0, None).sum(axis=1)
    return shapes, floors, eligible & (floors <= NOISE_FLOOR_LIMIT * np.median(floors[eligible]))


def _top_eigenvectors(matrix: np.ndarray, count: int) -> np.ndarray:
    return np.linalg.eigh((matrix + matrix.T) / 2)[1][:, ::-1][:, :count]


def _subspace_sine(first: np.ndarray, second: np.ndarray) -> float:
    """The sine of the largest principal angle between the spans of two orthonormal bases."""
    return float(np.linalg.norm(first @ first.T - second @ second.T, 2))


def site_noise(covariances, whitening, *, complete=None) -> tuple[np.ndarray | None, np.ndarray]:
    """Each site's channel noise seen in the whitened coordinates, and the sites whose noise floor marks them noisy.

    Outside the sources' subspace a site's covariance holds only its noise: ``P C_k P = P Psi_k P``
    for the projector ``P`` onto that subspace's complement and the site's channel noise ``Psi_k``,
    diagonal (each channel's own sensor noise, whatever its unit and however loud the site's sources,
    which the projector removes). It is read outside the shared subspace (the row space of
    ``whitening``) and outside the site's own top-``r`` subspace, and the smaller reading (in total)
    kept: a direction the shared subspace misses but the site holds loud reads as noise in the first,
    a source fainter at the site than its noise in the second. ``Psi_k`` is the non-negative least-squares fit
    of that equation where the complement holds enough entries for the ``n_channels`` unknowns
    (``q (q + 1) / 2 >= 2 n_channels``, ``q`` the complement's dimension), and ``psi_k I`` with
    ``psi_k`` the complement's mean variance otherwise; the noise inside the subspace is then
    ``W Psi_k W^T``, what it adds to the site's whitened covariance (docs/ALGORITHMS.md section 1.10).
    With as many components as channels there is no complement and nothing to fit: None.

    Parameters
    ----------
    covariances : array-like of shape (n_sites, n_channels, n_channels)
    whitening : array-like of shape (r, n_channels)
    complete : array-like of shape (n_sites,), dtype bool, optional
        The sites without bad channels (the median noise floor is theirs; default: all).

    Returns
    -------
    noise : ndarray of shape (n_sites, r, r) or None
    noisy : ndarray of shape (n_sites,), dtype bool
        The sites whose noise floor is beyond :data:`NOISE_FLOOR_LIMIT` times the median's (those
        :func:`pooled_subspace` does not pool); all False without a complement.
    """
    stack = np.asarray(covariances, dtype=np.float64)
    whitening = np.asarray(whitening, dtype=np.float64)
    n_sites, n_channels, _ = stack.shape
    count = whitening.shape[0]
    if count >= n_channels:
        return None, np.zeros(n_sites, dtype=bool)
    _, floors, _ = _poolable(stack, count, None)
    eligible = np.ones(n_sites, dtype=bool) if complete is None else np.asarray(complete, dtype=bool)
    noisy = floors > NOISE_FLOOR_LIMIT * np.median(floors[eligible if eligible.any() else slice(None)])
    # Read twice, the reading of the smaller total kept. Outside the shared subspace, a direction it misses but a
    # site holds loud (a source loud there and faint elsewhere) reads as that site's noise (50 times it: speech, 16
    # channels, 8 sources, seed 8); outside the site's own top-`count` subspace, a source fainter there than its
    # noise reads as noise (twice it: 6 sources, seed 3). Each adds to the noise, so the smaller is the nearer.
    shared = np.linalg.svd(whitening, full_matrices=False)[2].T  # orthonormal, the whitening's row space
    own = np.linalg.eigh(stack)[1][:, :, n_channels - count:]
    readings = [_noise_variances(stack, np.eye(n_channels) - basis @ np.swapaxes(basis, -1, -2), count)
                for basis in (np.broadcast_to(shared, (n_sites, n_channels, count)), own)]
    variances = np.where((readings[0].sum(axis=1) <= readings[1].sum(axis=1))[:, None], *readings)
    return np.einsum("ic,kc,jc->kij", whitening, variances, whitening), noisy


# With as many components as channels, a site whose noise share (square_site_noise) exceeds the median site's by
# more than this (a share of each channel's variance), and by more than NOISE_SHARE_Z of its own standard errors, is
# noisy. Measured on the recordings (4 channels, 4 sources, every condition, seeds 0-9) and speech (6 channels, 6
# sources) benches: honest sites within .05 of the median, sites at 2 or 3 sd of noise .75 or more above it, at 24
# standard errors or more. Where the mixing is orthogonal (the RF-ICA paper's simulation) the noise leaves no mark
# that the unmixing's error cannot make, and the shares are noise: up to .74 from the median, within 3.3 errors.
NOISE_SHARE_EXCESS = 0.25
NOISE_SHARE_Z = 8.0
# A site is also read without every group of up to this many other sites, left out of the shared error's fit: so
# many colluding sites cannot hide a noisy one by moving that error (docs/ALGORITHMS.md 1.10).
NOISE_LEAVE_OUT = 2
# ... and there held to this many times NOISE_SHARE_EXCESS and NOISE_SHARE_Z: with honest sites left out the hostile
# ones weigh more, while a noisy site read without the hostile ones is as far beyond as ever (.75 and 24 errors).
LEAVE_OUT_STRICTNESS = 2.0


def square_site_noise(covariances, whitening, unmixing, *, complete=None) -> tuple[np.ndarray | None, np.ndarray]:
    """Each site's channel noise in the whitened coordinates when there is no complement to read it in (as many
    components as channels), and the sites whose noise marks them noisy.

    At the one-shot unmixing ``B`` (in the whitened coordinates ``x = W y``) a site's estimated sources have the
    covariance ``S_k = B W C_k W^T B^T``. Independent sources make it diagonal but for the unmixing's own error ``E``,
    shared by every site (``S_ij = E_ij S_jj + E_ji S_ii`` to first order, each site with its own diagonal), and the
    site's sensor noise: with a share ``psi_k`` of each channel's variance (noise of 3 % of a channel's deviation is
    ``psi = .0009``; a unit-free model, as the channels' units are the site's), it adds
    ``psi_k P_k``, ``P_k = B W diag(C_k) W^T B^T``, whose off-diagonals are not of ``E``'s form where the mixing is
    not orthogonal. ``E`` and every ``psi_k`` are fitted together by least squares on every site's off-diagonals
    (each divided by ``sqrt(S_ii S_jj)``; docs/ALGORITHMS.md section 1.10). None where the off-diagonals are too few
    for the unknowns (two channels).

    Parameters
    ----------
    covariances : array-like of shape (n_sites, n_channels, n_channels)
    whitening : array-like of shape (n_channels, n_channels)
    unmixing : array-like of shape (n_channels, n_channels)
        The one-shot unmixing in the whitened coordinates, ``pinv(W A)``.
    complete : array-like of shape (n_sites,), dtype bool, optional
        The sites without bad channels: only they take part in the fit and the median (default: all).

    Returns
    -------
    noise : ndarray of shape (n_sites, r, r) or None
        ``psi_k W diag(C_k) W^T`` (0 for a site with bad channels or without variance along a source).
    noisy : ndarray of shape (n_sites,), dtype bool
        The sites whose share exceeds the median's by more than :data:`NOISE_SHARE_EXCESS` and by more than
        :data:`NOISE_SHARE_Z` of its standard errors, in this fit or, held to :data:`LEAVE_OUT_STRICTNESS` times
        those bounds, in one without up to :data:`NOISE_LEAVE_OUT` other sites (:func:`_beyond_without_others`).
    """
    stack = np.asarray(covariances, dtype=np.float64)
    whitening = np.asarray(whitening, dtype=np.float64)
    unmixing = np.asarray(unmixing, dtype=np.float64)
    n_sites, n_channels, _ = stack.shape
    eligible = np.ones(n_sites, dtype=bool) if complete is None else np.asarray(complete, dtype=bool)
    r = unmixing.shape[0]
    channel_noise = stack * np.eye(n_channels)  # diag(C_k): a share of each channel's own variance
    projection = unmixing @ whitening
    sources = projection @ stack @ projection.T
    shapes = projection @ channel_noise @ projection.T
    # A covariance need only be semi-definite: one without variance along an estimated source has no equations to
    # divide (and a hostile one would put NaN in every site's fit); it takes no part, and no share is read for it.
    variances = np.diagonal(sources, axis1=1, axis2=2)
    finite = np.all(np.isfinite(sources), axis=(1, 2))
    held = np.all(variances > _RANK_DEFICIENT_RATIO * np.abs(variances).max(axis=1, keepdims=True), axis=1)
    fitted = np.flatnonzero(eligible & finite & held)
    if not _enough_sites(fitted.size, r):
        return None, np.zeros(n_sites, dtype=bool)
    shares = np.zeros(n_sites)
    # One joint fit: E fitted again without the sites it marks noisy reads their off-diagonals against an E that is not
    # theirs, and their standard errors grow past the test (4 channels at 3 sd of noise: 1e-4 -> 6.6).
    design = _square_design(sources[fitted], shapes[fitted], r)
    shares[fitted], errors = _noise_shares(design, _shared_error(design))
    noisy = np.zeros(n_sites, dtype=bool)
    noisy[fitted] = _beyond(shares[fitted], errors) | _beyond_without_others(design)
    noise = np.clip(shares, 0.0, None)[:, None, None] * (whitening @ channel_noise @ whitening.T)
    return noise, noisy


def _enough_sites(count: int, r: int) -> bool:
    """Whether ``count`` sites' off-diagonals, ``r (r - 1) / 2`` a site less one for its own share, determine E's
    ``r (r - 1)`` entries (and at least three sites take part)."""
    return count >= 3 and (r * (r - 1) // 2 - 1) * count >= r * (r - 1)


def _beyond_without_others(design: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """The sites that pass :func:`_beyond`, held to :data:`LEAVE_OUT_STRICTNESS` times its bounds, among the others
    once any group of up to :data:`NOISE_LEAVE_OUT` other sites is left out of E's fit and of the median (while enough
    sites remain for the unknowns).

    A hostile site sets its own equations, and through E it moves every site's residual: claiming every source
    faint and perfectly correlated (a rank-one covariance), one site took E's norm from .04 to .69 and a noisy
    site's standard error from .004 to .11, under the test (4 channels, its share .82). Read without it, the noisy
    site is marked again. Read without honest sites, the hostile ones weigh more: held to the fit's own bounds,
    two of them came within .026 of getting an honest site marked; held to twice the bounds, .215, as in the fit
    with every site, where a noisy site still passes with room (docs/ALGORITHMS.md 1.10).
    """
    errors, noise, target = design
    n_fitted, _, entries = errors.shape
    r = math.isqrt(entries)
    marked = np.zeros(n_fitted, dtype=bool)
    # Each site's normal equations for E's off-diagonal entries with its own share profiled out (its rows projected
    # off its noise column): a group left out is subtracted from the sums, one small solve a group, where refitting
    # from the rows took 35 s for 60 sites of 5 channels.
    off = np.flatnonzero(~np.eye(r, dtype=bool).ravel())
    footprint = np.maximum(np.einsum("kp,kp->k", noise, noise), np.finfo(float).tiny)
    along = errors[:, :, off]
    rows = along - noise[:, :, None] * (np.einsum("kp,kpe->ke", noise, along) / footprint[:, None])[:, None]
    left = target - noise * (np.einsum("kp,kp->k", noise, target) / footprint)[:, None]
    information = np.einsum("kpi,kpj->kij", rows, rows)
    gradient = np.einsum("kpi,kp->ki", rows, left)
    shared_error = np.zeros(entries)
    for size in range(1, NOISE_LEAVE_OUT + 1):
        if not _enough_sites(n_fitted - size, r):
            break
        for left_out in itertools.combinations(range(n_fitted), size):
            others = np.ones(n_fitted, dtype=bool)
            others[list(left_out)] = False
            shared_error[off] = np.linalg.lstsq(information[others].sum(axis=0), gradient[others].sum(axis=0),
                                                rcond=None)[0]
            shares, spread = _noise_shares(design, shared_error)
            marked[others] |= _beyond(shares[others], spread[others], strictness=LEAVE_OUT_STRICTNESS)
    return marked


def _beyond(shares: np.ndarray, errors: np.ndarray, strictness: float = 1.0) -> np.ndarray:
    """The noise shares more than NOISE_SHARE_EXCESS and NOISE_SHARE_Z standard ``errors`` above their median (both
    times ``strictness``).

    Against the median, not zero: where the sites' sources are alike in strength, a share common to every site cannot
    be told from the unmixing's error (the sites' equations are then alike), and the fit puts an arbitrary common
    share on every site (.11 on 4 channels with equal sources); a noisy site still stands out from it.
    """
    excess = shares - float(np.median(shares))
    return (excess > strictness * NOISE_SHARE_EXCESS) & (excess > strictness * NOISE_SHARE_Z * errors)


def _square_design(sources: np.ndarray, shapes: np.ndarray, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The normalised off-diagonal equations of square_site_noise: each site's rows for E's off-diagonal entries,
    its noise shape's column, and the right-hand side."""
    upper = np.triu_indices(r, 1)
    diagonals = np.diagonal(sources, axis1=1, axis2=2)
    scale = np.sqrt(diagonals[:, upper[0]] * diagonals[:, upper[1]])  # (sites, pairs)
    n_sites, pairs = scale.shape
    errors = np.zeros((n_sites, pairs, r * r))
    rows = np.arange(pairs)
    errors[:, rows, upper[0] * r + upper[1]] = diagonals[:, upper[1]] / scale
    errors[:, rows, upper[1] * r + upper[0]] = diagonals[:, upper[0]] / scale
    return errors, shapes[:, upper[0], upper[1]] / scale, sources[:, upper[0], upper[1]] / scale


def _shared_error(design: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
    """E (as r * r entries, the diagonal unused) fitted with every site's own share, by least squares, from
    :func:`_square_design`'s equations."""
    errors, noise, target = design
    n_sites, pairs, entries = errors.shape
    matrix = np.zeros((n_sites * pairs, entries + n_sites))
    matrix[:, :entries] = errors.reshape(n_sites * pairs, entries)
    matrix[np.arange(n_sites * pairs), entries + np.repeat(np.arange(n_sites), pairs)] = noise.ravel()
    solution = np.linalg.lstsq(matrix, target.ravel(), rcond=None)[0]
    return solution[:entries]


def _noise_shares(design: tuple[np.ndarray, np.ndarray, np.ndarray],
                  shared_error: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each site's noise share given E (the least-squares fit of its off-diagonals left over by E) and its standard
    error (the residual's spread over the noise's footprint: large where the noise leaves little mark)."""
    errors, noise, target = design
    left = target - errors @ shared_error
    footprint = np.maximum(np.einsum("kp,kp->k", noise, noise), np.finfo(float).tiny)
    shares = np.einsum("kp,kp->k", noise, left) / footprint
    residual = left - shares[:, None] * noise
    spread = np.sqrt(np.einsum("kp,kp->k", residual, residual) / (noise.shape[1] - 1))
    return shares, spread / np.sqrt(footprint)


def _noise_variances(covariances: np.ndarray, complements: np.ndarray, count: int) -> np.ndarray:
    """Each channel's noise variance at each site (n_sites, n_channels), from its covariance outside a subspace.

    ``complements`` (n_sites, n_channels, n_channels) are the projectors onto each site's complement. A diagonal fit
    (non-negative least squares) where the complement has entries enough for the channels' unknowns, the
    complement's mean variance on every channel otherwise.
    """
    n_channels = covariances.shape[1]
    outside = complements @ covariances @ complements
    dimension = n_channels - count
    if dimension * (dimension + 1) // 2 < 2 * n_channels:
        mean = np.clip(np.trace(outside, axis1=1, axis2=2) / dimension, 0.0, None)
        return np.repeat(mean[:, None], n_channels, axis=1)
    # Column c: vec(q_c q_c^T), q_c = P e_c: what a unit of noise on channel c leaves outside the subspace.
    upper = np.triu_indices(n_channels)
    return np.stack([nnls(np.einsum("ic,jc->ijc", complement, complement)[upper], site[upper])[0]
                     for complement, site in zip(complements, outside)])
