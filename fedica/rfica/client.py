"""RF-ICA's client side of the protocol: a site's channel covariance (the federated whitening), its local ICA and its
averages for the federated refinement.

:data:`TASKS` is its entry in fedica's one task registry (:data:`fedica.tasks.CLIENT_TASKS`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedica.protocol.messages import (BAD_CHANNELS_KEY, BLOCK_KEYS, COLUMN_VARIANCES_KEY, RFICA_COVARIANCE, RFICA_FIT,
                                     RFICA_REFINE)
from fedica.protocol.tasks import Handler, Site
from fedica.rfica.local import bad_channels, local_ica, observation_matrix, site_covariance
from fedica.rfica.refinement import site_statistics
from fedica.seeding import generator

Reply = tuple[dict[str, np.ndarray], dict[str, Any]]


def fit(Y: np.ndarray, values: Mapping[str, Any], partition_id: int,
        whitening: np.ndarray | None = None) -> Reply:
    """The client's mixing estimate in channel space (unit-norm columns), its sample count and its solver's fate.

    Parameters
    ----------
    Y : ndarray of shape (n_channels, n_samples)
        The client's observations, one column per sample, in any memory order.
    values : mapping
        ``contrast``, ``init`` and ``seed`` from the server; ``column-variances`` (true: send them);
        ``solver`` (absent: fastica) and
        ``n-components`` (absent: every channel; an int, or a float share of the variance: the
        site's own principal subspace).
    partition_id : int
    whitening : ndarray of shape (r, n_channels) or None, default=None
        The server's federated whitening; the site separates its signals in that subspace.

    Returns
    -------
    arrays : dict
        ``mixing`` of shape (n_channels, r); when asked, ``column-variances`` of shape (r,), how well the
        site sees each source (:func:`fedica.rfica.uncertainty.column_variances`).
    values : dict
        ``n-samples``; ``n-iter`` and ``converged`` of the estimate sent (after one retry from the
        stream ``client.ica_retry`` when the first start did not converge), ``fit-seconds``.
    """
    seed = int(values["seed"])
    start = time.perf_counter()
    result = local_ica(Y, solver=str(values.get("solver", "fastica")), contrast=str(values["contrast"]),
                       init=str(values["init"]), n_components=values.get("n-components"), whitening=whitening,
                       random_state=generator(seed, "client.fastica", partition_id), shared_init_seed=seed,
                       retry_random_state=generator(seed, "client.ica_retry", partition_id))
    arrays = {"mixing": result.mixing}
    if values.get(COLUMN_VARIANCES_KEY):  # asked for by a server whose centre weighs the columns by them
        arrays[COLUMN_VARIANCES_KEY] = result.column_variances
    return arrays, {"n-samples": Y.shape[1], "n-iter": result.n_iter, "converged": result.converged,
                    "fit-seconds": time.perf_counter() - start}


def covariance(Y: np.ndarray) -> Reply:
    """The client's channel covariance, means and sample count, for the server's federated whitening.

    The means let the server centre new observations as the sites centred theirs (``mean_`` of an
    estimator rebuilt from the run's result). A private run sends no covariance, so no mean either.

    Parameters
    ----------
    Y : ndarray of shape (n_channels, n_samples)

    Returns
    -------
    arrays : dict
        ``covariance`` of shape (n_channels, n_channels), ``mean`` of shape (n_channels,), and
        ``bad-channels``, the indices of its flat or saturated channels (:func:`fedica.rfica.local.bad_channels`;
        the server leaves such a site out of the pooled subspace).
    values : dict
        ``n-samples``, ``fit-seconds``.
    """
    start = time.perf_counter()
    data = observation_matrix(Y)
    arrays = {"covariance": site_covariance(data), "mean": data.mean(axis=1),
              BAD_CHANNELS_KEY: np.flatnonzero(bad_channels(data)).astype(np.int64)}
    return arrays, {"n-samples": data.shape[1], "fit-seconds": time.perf_counter() - start}


def refine(Y: np.ndarray, values: Mapping[str, Any], whitening: np.ndarray, unmixing: np.ndarray) -> Reply:
    """The client's averages at the server's unmixing, for one step of the federated refinement.

    Parameters
    ----------
    Y : ndarray of shape (n_channels, n_samples)
    values : mapping
        ``contrast`` from the server.
    whitening : ndarray of shape (r, n_channels)
        The federation's whitening.
    unmixing : ndarray of shape (r, r)
        The server's current unmixing in the whitened coordinates.

    Returns
    -------
    arrays : dict
        ``covariance`` (r, r), ``moments`` (r, r) and ``slopes`` (r,) of
        :func:`fedica.rfica.refinement.site_statistics`, and the same over each block of its samples
        (``block-covariances``, ``block-moments``, ``block-slopes``) where it has enough of them.
    values : dict
        ``n-samples``, ``fit-seconds``.
    """
    start = time.perf_counter()
    stats = site_statistics(Y, whitening, unmixing, contrast=str(values["contrast"]))
    arrays = {"covariance": stats.covariance, "moments": stats.moments, "slopes": stats.slopes}
    if stats.block_covariances is not None:
        arrays.update(zip(BLOCK_KEYS, (stats.block_covariances, stats.block_moments, stats.block_slopes)))
    return arrays, {"n-samples": stats.n_samples, "fit-seconds": time.perf_counter() - start}


def _fit_task(site: Site, arrays: Mapping[str, Any], values: Mapping[str, Any]) -> Reply:
    return fit(site.observations(values), values, site.partition_id, arrays.get("whitening"))


def _covariance_task(site: Site, arrays: Mapping[str, Any], values: Mapping[str, Any]) -> Reply:
    return covariance(site.observations(values))


def _refine_task(site: Site, arrays: Mapping[str, Any], values: Mapping[str, Any]) -> Reply:
    if not isinstance(arrays.get("whitening"), np.ndarray) or not isinstance(arrays.get("unmixing"), np.ndarray):
        raise ValueError("a refinement request carries the arrays 'whitening' and 'unmixing'")
    return refine(site.observations(values), values, arrays["whitening"], arrays["unmixing"])


TASKS: dict[str, Handler] = {RFICA_FIT: _fit_task, RFICA_COVARIANCE: _covariance_task, RFICA_REFINE: _refine_task}
# Every RF-ICA task may be answered by several sites at once (fedica.concurrency): a site's ICA and averages are
# numpy's and BLAS's work, each site with its own random stream, its BLAS limit and quiet solvers shared.
CONCURRENT_TASKS = frozenset(TASKS)
