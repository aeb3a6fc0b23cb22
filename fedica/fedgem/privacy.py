"""Differential privacy for what FedGEM's sites send: the Gaussian mechanism and its server side.

With ``dp_epsilon`` set, every FedGEM exchange that depends on a site's training points releases
only noisy sums and counts (docs/ALGORITHMS.md section 2.13):

- the **initialisation**: the counts and sums of the clipped points in public cells; its seeds are
  a k-means of the cells' noisy means (post-processing), so no raw point leaves it (k-means++
  seeds are data points);
- every **collaborative round** and the **final stage**: each component's responsibility-weighted
  sum of the clipped points and its weighted count; the maximiser the server sees is noisy sum /
  noisy count, and the noisy counts travel beside it (``dp-counts``);
- the **tuning** (``upsilon: auto``) asks the sites nothing more: the server scores the candidate
  partitions with a penalised likelihood computed from the final stage's noisy sums and counts
  (:func:`private_criterion`), free by post-processing;
- the **evaluation** labels held-out test points, which no training release touches: its
  contingency counts are outside the guarantee (evaluation only, as documented).

Each point is clipped to the norm ``dp_clip`` (in the data's units, about the origin); its
responsibilities sum to one, so adding or removing one point moves the stacked sums by at most
``dp_clip`` and the stacked counts by at most 1 (``dp_unit: record``). Per client (``dp_unit:
client``: a site's points replaced by any others of the same number) raw sums and counts have no
useful bound, so a site releases normalised statistics instead (:func:`private_client_step`):
each component's mean of the clipped points, projected onto the clip ball, so that the ``K_g``
means move by at most ``2 dp_clip sqrt(K_g)`` together, and its shares of the site's
responsibility mass, which lie in the simplex and move by at most ``sqrt(2)``; the
initialisation sends the site's own seeds projected onto the ball (:func:`private_client_init`,
one mechanism). Every released statistic is one Gaussian mechanism of its sensitivity and noise
multiplier ``sigma``; the sequence of all of them over a run is composed by ``dp-accounting``'s
RDP accountant, and ``sigma`` is calibrated by its bisection
(:func:`dp_accounting.calibrate_dp_mechanism`) so that the whole run spends exactly
``(dp_epsilon, dp_delta)``.

The noise is added by a reply transform of the client task registry (:func:`private_reply`, in
:data:`fedica.tasks.CLIENT_TASKS` and the estimator's sites), so the estimator, the in-process engine, the simulation and a
deployment add the same mechanism; the server's request names the noise (``dp-noise``,
``dp-clip``) and the run's seed (``dp-seed``); whose seed the noise is drawn from, :mod:`fedica.privacy` says.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy.special import logsumexp
from sklearn.cluster import KMeans

from fedica.fedgem.local import responsibilities
from fedica.parameters import DP_UNITS
from fedica.privacy import CLIP_KEY, NOISE_KEY, SEED_KEY, UNIT_KEY, PrivacyPlan
from fedica.protocol.messages import (
    CLUSTER_SHAPE_KEY, GEM_EVALUATE, GEM_FINAL, GEM_INIT, GEM_LIKELIHOOD, GEM_ROUND, GEM_SILHOUETTE, SCALE_SPREAD_KEY,
)
from fedica.protocol.tasks import Site
from fedica.seeding import generator, sklearn_seed


__all__ = ["checked_counts", "clip_rows", "client_noise_variance", "fedgem_plan", "maximiser_variance",
           "noise_variance", "private_client_init", "private_client_step", "private_criterion", "private_init",
           "private_reply", "private_step", "uncovered", "widened_radii"]

# Statistics released per exchange, each one Gaussian mechanism: the initialisation's per-cell sums and
# counts; a round's and the final stage's per-component sums and counts.
INIT_STATISTICS = 2
STEP_STATISTICS = 2
# Per client: the initialisation releases the site's seeds alone (its size and K_g are public); a round
# and the final stage release the components' means and their shares.
CLIENT_INIT_STATISTICS = 1

# The private initialisation's public cells per component, and the noisy count (in noise standard
# deviations) a cell needs for its mean to be used: measured on blobs at epsilon 1 (RESULTS.md), 5
# keeps fewer, less noisy cells and loses fewer of a site's clusters than 3, 1 or 0.
CELLS_PER_COMPONENT = 5
CELL_COUNT_FLOOR = 5.0

# A noisy count is used no smaller than this (the true one of a component a site holds is positive;
# the noise may take it to or below 0, and a maximiser is a quotient by it).
COUNT_FLOOR = 1.0


def uncovered(parameters: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first FedGEM parameter a private run (``dp_epsilon`` set) cannot take, and why; None when covered.

    ``parameters`` holds the declared names (``dp_clip``, ``covariance_type``, ``local_steps``,
    ``upsilon``, ``upsilon_criterion``), as the config's ``algorithm`` section and the settings do.
    """
    if parameters.get("dp_epsilon") is None:
        return None
    if parameters["dp_clip"] is None:
        return "dp_clip", "a private run needs the norm bound of a point, in the data's units"
    if parameters["covariance_type"] != "identity":
        return "covariance_type", "a private run needs 'identity' (a spherical site's variances are not privatised)"
    if parameters.get("local_start", "seeds") != "seeds":
        return "local_start", "a private run starts from its private initialisation"
    if parameters["local_steps"] != 1:
        return "local_steps", "a private run needs 1 (every step's sums are a release)"
    if parameters.get("standardize") is not None:
        return "standardize", ("a private run keeps the data's units (the sites' column means and deviations would "
                               "leave them without noise; dp_clip is a bound in those units)")
    if parameters["upsilon"] == "auto" and parameters["upsilon_criterion"] != "likelihood":
        return "upsilon_criterion", ("a private run tunes by 'likelihood' (the private criterion of the final "
                                     "stage's sums) or takes a fixed upsilon")
    return None


def fedgem_plan(settings: Any) -> PrivacyPlan | None:
    """The plan of a FedGEM run's settings (``dp_*`` of :class:`fedica.fedgem.coordinator.FedGEMSettings`); None when off.

    Raises
    ------
    ValueError
        One line ``name=value: rule``, for a setting the mechanism does not cover (:func:`uncovered`).
    """
    if settings.dp_epsilon is None:
        return None
    refusal = uncovered(vars(settings))
    if refusal is not None:
        key, rule = refusal
        raise ValueError(f"{key}={getattr(settings, key)!r}: {rule}")
    init_statistics = CLIENT_INIT_STATISTICS if settings.dp_unit == "client" else INIT_STATISTICS
    exchanges = [("init", init_statistics)] + [(f"round {r}", STEP_STATISTICS) for r in range(1, settings.rounds + 1)]
    exchanges.append(("final", STEP_STATISTICS))
    return PrivacyPlan.calibrated(settings.dp_epsilon, settings.dp_delta, settings.dp_clip, settings.dp_unit, exchanges)


# ---------------------------------------------------------------- the site's side


def clip_rows(X: np.ndarray, clip: float) -> np.ndarray:
    """Each row of ``X`` scaled down to norm at most ``clip`` (rows inside the ball unchanged)."""
    norms = np.linalg.norm(X, axis=1)
    return X * np.minimum(1.0, clip / np.maximum(norms, np.finfo(float).tiny))[:, None]


def _noise_rng(values: Mapping[str, Any], site: Site) -> np.random.Generator:
    """The noise of this request's stage at ``site``: from the site's ``noise_secret``, else from the run's seed."""
    label = str(values.get("server-round", "0"))
    stage = int(label) if label.isdigit() else zlib.crc32(label.encode())
    secret = site.noise_secret
    return generator(int(values[SEED_KEY]) if secret is None else secret, "privacy.noise", site.partition_id, stage)


def private_init(X: np.ndarray, n_components: int, sigma: float, clip: float, rng: np.random.Generator,
                 seed_rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """A site's private start: k-means of the noisy means of public cells, and its noisy size.

    ``CELLS_PER_COMPONENT * K_g`` public candidates are drawn from ``seed_rng`` in the clip ball's
    scale (``N(0, clip^2 / d I)``); each point falls in its nearest candidate's cell. Two Gaussian
    mechanisms release each cell's count (sensitivity 1: a point is in one cell) and sum of the
    clipped points (``clip``). The rest is post-processing: the cells whose noisy count exceeds
    :data:`CELL_COUNT_FLOOR` noise standard deviations (at least ``K_g`` of them) give their noisy
    means, projected onto the clip ball where every true mean lies, and a k-means of those means
    weighted by the counts gives the ``K_g`` seeds; the site's size is the sum of the noisy counts.
    """
    n_cells = CELLS_PER_COMPONENT * n_components
    candidates = clip / np.sqrt(X.shape[1]) * seed_rng.standard_normal((n_cells, X.shape[1]))
    cell = np.argmin(((X[:, None, :] - candidates[None]) ** 2).sum(axis=2), axis=1)
    counts = np.bincount(cell, minlength=n_cells) + sigma * rng.standard_normal(n_cells)
    sums = np.zeros((n_cells, X.shape[1]))
    np.add.at(sums, cell, clip_rows(X, clip))
    sums += sigma * clip * rng.standard_normal(sums.shape)
    kept = counts > CELL_COUNT_FLOOR * sigma
    if kept.sum() < n_components:
        kept = np.isin(np.arange(n_cells), np.argsort(counts)[-n_components:])
    means = clip_rows(sums[kept] / np.maximum(counts[kept], COUNT_FLOOR)[:, None], clip)
    weights = np.maximum(counts[kept], COUNT_FLOOR)
    seeds = KMeans(n_components, n_init=3, random_state=sklearn_seed(seed_rng)).fit(means, sample_weight=weights)
    return seeds.cluster_centers_, max(float(np.maximum(counts, 0).sum()), float(n_components))


def private_step(X: np.ndarray, centroids: np.ndarray, sigma: float, clip: float,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One private EM step at ``centroids``: the noisy maximisers (K_g, d) and the noisy counts (K_g,).

    Responsibilities are taken at the raw points (each row sums to one whatever the point), the
    sums of the clipped ones: two Gaussian mechanisms, of sensitivity ``clip`` and 1.
    """
    gamma = responsibilities(X, centroids, np.full(centroids.shape[0], 1.0 / centroids.shape[0]))
    sums = gamma.T @ clip_rows(X, clip) + sigma * clip * rng.standard_normal(centroids.shape)
    counts = np.maximum(gamma.sum(axis=0) + sigma * rng.standard_normal(centroids.shape[0]), COUNT_FLOOR)
    return sums / counts[:, None], counts


def private_client_init(centroids: np.ndarray, sigma: float, clip: float, rng: np.random.Generator) -> np.ndarray:
    """A site's private start per client: its own seeds (K_g, d) projected onto the clip ball, one Gaussian mechanism.

    Any ``K_g`` points of the ball differ from any others by at most ``2 clip sqrt(K_g)`` stacked,
    whatever data chose them, so the site's k-means++ seeds need no other bound; the noisy seeds
    are projected onto the ball again (post-processing: the true ones lie in it).
    """
    sensitivity = 2.0 * clip * np.sqrt(centroids.shape[0])
    return clip_rows(clip_rows(centroids, clip) + sigma * sensitivity * rng.standard_normal(centroids.shape), clip)


def private_client_step(X: np.ndarray, centroids: np.ndarray, sigma: float, clip: float,
                        rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One private EM step per client at ``centroids``: the noisy maximisers (K_g, d) and noisy counts (K_g,).

    Two Gaussian mechanisms of normalised statistics, whose range bounds them whatever the site's
    points: the components' means of the clipped points (each in the clip ball, so ``2 clip
    sqrt(K_g)`` stacked) and their shares ``n_k / n_g`` of the site's points (in the simplex, so
    ``sqrt(2)``). The maximisers sent are the noisy means projected onto the ball, the counts the
    noisy shares times the site's public size, floored at :data:`COUNT_FLOOR`.
    """
    n_components = centroids.shape[0]
    gamma = responsibilities(X, centroids, np.full(n_components, 1.0 / n_components))
    mass = gamma.sum(axis=0)
    means = clip_rows((gamma.T @ clip_rows(X, clip)) / np.maximum(mass, np.finfo(float).tiny)[:, None], clip)
    noisy_means = means + sigma * 2.0 * clip * np.sqrt(n_components) * rng.standard_normal(centroids.shape)
    shares = mass / X.shape[0] + sigma * np.sqrt(2.0) * rng.standard_normal(n_components)
    return clip_rows(noisy_means, clip), np.maximum(shares * X.shape[0], COUNT_FLOOR)


def private_reply(task: str, site: Site, arrays: Mapping[str, Any], values: Mapping[str, Any],
                  reply: tuple[dict[str, np.ndarray], dict[str, Any]]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The reply transform of private runs: a FedGEM reply's data-dependent fields replaced by private ones.

    A request without ``dp-noise`` (every non-private run) passes ``reply`` through untouched.
    After a private initialisation every FedGEM reply declares the site's noisy size, never its own.
    """
    if NOISE_KEY not in values and "dp-n-points" not in site.state:
        return reply
    reply_arrays, reply_values = reply
    if NOISE_KEY in values and task in (GEM_SILHOUETTE, GEM_LIKELIHOOD):
        raise ValueError(f"task {task!r} has no private reply: a private server tunes from the final stage")
    if NOISE_KEY in values and task in (GEM_INIT, GEM_ROUND, GEM_FINAL):
        sigma, clip = float(values[NOISE_KEY]), float(values[CLIP_KEY])
        if not (sigma > 0 and clip > 0):
            raise ValueError(f"a private request needs dp-noise > 0 and dp-clip > 0, got {sigma!r} and {clip!r}")
        unit = values.get(UNIT_KEY, "record")
        if unit not in DP_UNITS:
            raise ValueError(f"a private request's dp-unit must be one of {', '.join(DP_UNITS)}, got {unit!r}")
        data = site.points(values)
        rng = _noise_rng(values, site)
        per_client = unit == "client"
        if task == GEM_INIT and per_client:  # the site's size is public: its declared n-points stays
            seeds = private_client_init(reply_arrays["centroids"], sigma, clip, rng)
            site.state["centroids"] = seeds
            reply_arrays = {"centroids": seeds, "weights": reply_arrays["weights"]}
        elif task == GEM_INIT:
            seeds, size = private_init(data.X_train, data.n_components, sigma, clip, rng,
                                       generator(int(values[SEED_KEY]), "privacy.seeds", site.partition_id))
            site.state["centroids"] = seeds
            site.state["dp-n-points"] = np.array([round(size)])  # a Flower site's state keeps 1-d arrays
            reply_arrays = {"centroids": seeds, "weights": reply_arrays["weights"]}
        else:
            centroids = site.state["centroids"]  # the handler adopted the server's
            step = private_client_step if per_client else private_step
            maximisers, counts = step(data.X_train, centroids, sigma, clip, rng)
            reply_arrays = {"maximisers": maximisers, "dp-counts": counts}
            if task == GEM_ROUND:
                reply_arrays["radii"] = ((maximisers - centroids) ** 2).sum(axis=1)
    if NOISE_KEY in values:  # data-dependent numbers no noise covers
        reply_values = {k: v for k, v in reply_values.items() if k not in (SCALE_SPREAD_KEY, CLUSTER_SHAPE_KEY)}
    if task in (GEM_INIT, GEM_ROUND, GEM_FINAL, GEM_EVALUATE) and "dp-n-points" in site.state:
        reply_values = {**reply_values, "n-points": int(site.state["dp-n-points"][0])}
    return reply_arrays, reply_values


# ---------------------------------------------------------------- the server's side


def noise_variance(maximisers: np.ndarray, counts: np.ndarray, sigma: float, clip: float) -> np.ndarray:
    """``v_k``, the noise's expected squared norm in each noisy maximiser (K,): ``sigma^2 (d C^2 + ||M_k||^2) / n_k^2``.

    To first order in the noise, ``(S + z) / (n + w) - S / n = (z - M w) / n`` with ``z ~ N(0,
    sigma^2 C^2 I_d)`` and ``w ~ N(0, sigma^2)``; its trace is the formula, taken at the noisy
    maximiser and count (docs/ALGORITHMS.md section 2.13).
    """
    dim = maximisers.shape[1]
    return sigma ** 2 * (dim * clip ** 2 + (maximisers ** 2).sum(axis=1)) / counts ** 2


def client_noise_variance(n_components: int, dim: int, sigma: float, clip: float) -> float:
    """``v`` of a per-client noisy maximiser: ``min(d (2 C sigma)^2 K_g, (2 C)^2)``.

    The mean's noise is ``N(0, (2 C sigma)^2 K_g I_d)`` (:func:`private_client_step`); the projected
    maximiser and the true mean both lie in the clip ball, so its error is never above the ball's
    diameter ``2 C`` either (docs/ALGORITHMS.md section 2.13).
    """
    return min(dim * (2.0 * clip * sigma) ** 2 * n_components, (2.0 * clip) ** 2)


def widened_radii(squared_radii: np.ndarray, variances: np.ndarray, *, debias: bool) -> np.ndarray:
    """The squared radius of a ball about a noisy maximiser that holds the noiseless ball: ``(sqrt(r) + sqrt(v))^2``.

    With ``debias``, ``r`` is first the noiseless radius's unbiased estimate ``max(r - v, 0)``
    (a GEM ball's radius ``||M~ - theta||^2`` carries the noise's ``v`` on average; a final radius
    computed from the sizes does not).
    """
    radii = np.maximum(squared_radii - variances, 0.0) if debias else squared_radii
    return (np.sqrt(radii) + np.sqrt(variances)) ** 2


def checked_counts(arrays: Mapping[str, Any], n_components: int) -> np.ndarray:
    """A private reply's noisy counts (K_g,), finite and at least :data:`COUNT_FLOOR`; ValueError naming the field."""
    counts = np.asarray(arrays.get("dp-counts", np.empty(0)), dtype=np.float64)
    if counts.shape != (n_components,) or not np.all(np.isfinite(counts)) or np.any(counts < COUNT_FLOOR):
        raise ValueError(f"'dp-counts' must hold {n_components} finite counts of at least {COUNT_FLOOR:g}")
    return counts


def private_criterion(labels_by_candidate: Sequence[np.ndarray], maximisers: np.ndarray, counts: np.ndarray,
                      n_points: float) -> np.ndarray:
    """Each candidate partition's BIC (smaller is better) from the final stage's noisy maximisers and counts alone.

    The candidate's mixture (the global clusters' count-weighted means, unit covariance, weights
    their shares of the counts) scores every final component as ``n_k`` points at its maximiser:
    ``-2 sum_k n_k log sum_j pi_j N(M_k; mu_j, I) + K_hat d log N``. The components' own spread is
    the same in every candidate and drops out. Unlike the hard within-cluster sum of squares, this
    soft likelihood gains little from two nearby centres of one cluster, so it does not prefer a
    partition for splitting a cluster whose components the noise has scattered.

    Parameters
    ----------
    labels_by_candidate : sequence of ndarray of shape (m,)
        Each candidate's global cluster of every final component.
    maximisers, counts : ndarray of shape (m, d) and (m,)
        The final stage's noisy maximisers and counts.
    n_points : float
        The federation's (noisy) size.
    """
    dim = maximisers.shape[1]
    total = counts.sum()
    scores = []
    for labels in labels_by_candidate:
        clusters, index = np.unique(labels, return_inverse=True)
        mass = np.bincount(index, weights=counts)
        means = np.stack([counts[index == j] @ maximisers[index == j] for j in range(clusters.size)]) / mass[:, None]
        log_joint = np.log(mass / total)[None, :] - 0.5 * ((maximisers[:, None, :] - means[None]) ** 2).sum(axis=2)
        log_density = logsumexp(log_joint, axis=1) - 0.5 * dim * np.log(2 * np.pi)
        scores.append(-2.0 * float(counts @ log_density) + clusters.size * dim * np.log(n_points))
    return np.array(scores)


def maximiser_variance(plan: PrivacyPlan, maximisers: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``v_k`` of one site's noisy maximisers (K_g, d) under ``plan``'s unit.

    Per record :func:`noise_variance` (from the noisy counts), per client :func:`client_noise_variance`.
    """
    if plan.unit == "client":
        return np.full(maximisers.shape[0], client_noise_variance(maximisers.shape[0], maximisers.shape[1],
                                                                  plan.noise_multiplier, plan.clip))
    return noise_variance(maximisers, counts, plan.noise_multiplier, plan.clip)
