"""Hostile clients for robustness runs: what each ``attack`` kind sends instead of an honest reply.

A hostile client computes its honest reply and replaces part of it (:mod:`fedica.attacks`, this
module's package, holds the replacements). :func:`hostile_reply` is that replacement as a reply transform of the client
task registry (:mod:`fedica.protocol.tasks`), the last link of :data:`fedica.tasks.CLIENT_TASKS`:
it acts on a client of fedica's own scenarios whose run's ``attack`` config makes it hostile, and
passes every other reply through, so fedica's ClientApp and the in-memory estimators answer
through the same chain. The server is never told which clients are hostile; only the result
records it.
"""

from __future__ import annotations

import functools
import json
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from fedica import attacks
from fedica.data.scenarios import client_count, ica_scenario_data, ica_scenario_truth, scenario_client_data
from fedica.fedgem.local import uncertainty_radius
from fedica.fedgem.standardisation import request_standardisation, standardised
from fedica.rfica import client as rfica_client
from fedica.protocol import (
    CLUSTER_SHAPE_KEY,
    GEM_CLUSTER_MOMENTS,
    GEM_EVALUATE,
    GEM_FAMILY_EM,
    GEM_FINAL,
    GEM_INIT,
    GEM_LIKELIHOOD,
    GEM_MOMENTS,
    GEM_ROUND,
    GEM_SILHOUETTE,
    RFICA_FIT,
    Site,
)
from fedica.protocol.messages import COLUMN_VARIANCES_KEY, RFICA_REFINE

Arrays = dict[str, np.ndarray]
Values = dict[str, Any]


def hostile_kind(cfg: Mapping[str, Any], partition_id: int) -> str | None:
    """The attack this client of fedica's own scenario runs, or None for an honest client."""
    attack = cfg["attack"]
    if attack["kind"] == "none" or attack["fraction"] == 0:
        return None
    hostile = attacks.hostile_mask(client_count(cfg["scenario"]), attack["fraction"], seed=cfg["seed"])
    return attack["kind"] if hostile[partition_id] else None


def split_components_count(cfg: Mapping[str, Any]) -> int:
    """How many components a ``split_components`` client declares."""
    return planted_centroids(json.dumps(cfg["scenario"], sort_keys=True), int(cfg["seed"])).shape[0]


@functools.lru_cache(maxsize=8)
def planted_centroids(scenario_json: str, seed: int) -> np.ndarray:
    """The centroids a ``split_components`` client plants: copies of the true class means (the worst case)."""
    means = _class_means(json.loads(scenario_json), seed, "split_components")
    return attacks.split_components_centroids(means, attacks.attack_rng(seed, 0, zlib.crc32(b"split")))


def _in_request_units(points: np.ndarray, values: Mapping[str, Any]) -> np.ndarray:
    """Points of the data's units in the units a FedGEM request names (standardised under ``standardize: federated``):
    a planting attacker places its components where the server and the honest sites look for them."""
    units = request_standardisation(values, points.shape[-1])
    return points if units is None else standardised(points, *units)


def _class_means(scenario: Mapping[str, Any], seed: int, kind: str) -> np.ndarray:
    """The true class means of fedica's own ``scenario`` over all clients' training points (what a worst-case attacker knows)."""
    clients = [scenario_client_data(scenario, g, seed) for g in range(client_count(scenario))]
    if any(c.y_train is None for c in clients):
        raise ValueError(f"attack {kind} needs a scenario with known labels")
    X = np.concatenate([c.X_train for c in clients])
    y = np.concatenate([c.y_train for c in clients])
    return np.stack([X[y == label].mean(axis=0) for label in np.unique(y)])


def hostile_reply(task: str, site: Site, arrays: Mapping[str, Any], values: Mapping[str, Any],
                  reply: tuple[Arrays, Values]) -> tuple[Arrays, Values]:
    """The reply transform of robustness runs: a hostile site's honest ``reply`` replaced where its attack acts.

    A site without fedica's run config (a user's site, an estimator's array) or that the run's
    ``attack`` leaves honest sends ``reply`` as it is.
    """
    cfg = site.run_config
    kind = None if cfg is None else hostile_kind(cfg, site.partition_id)
    if kind is None:
        return reply
    return attack_reply(kind, task, reply, arrays, values, site.partition_id, cfg)


def attack_reply(kind: str, task: str, honest: tuple[Arrays, Values], arrays: Mapping[str, Any],
                 values: Mapping[str, Any], partition_id: int, cfg: Mapping[str, Any]) -> tuple[Arrays, Values]:
    """A hostile client's reply to ``task``: its ``honest`` reply, replaced where ``kind`` attacks it."""
    if kind == attacks.SPOOF_PARTITION:
        hostile = attacks.hostile_mask(client_count(cfg["scenario"]), cfg["attack"]["fraction"], seed=cfg["seed"])
        reply_arrays, reply_values = honest
        return reply_arrays, {**reply_values,
                              "partition-id": attacks.spoofed_partition(partition_id, hostile.size, hostile)}
    if kind == attacks.BLOATED_REPLY:
        return attacks.bloated_reply(*honest)
    if kind == "split_components" and task in (GEM_INIT, GEM_ROUND, GEM_FINAL):
        return _split_components(task, arrays, values, honest, cfg)
    reply_arrays, reply_values = honest
    if task == RFICA_FIT and kind in (*attacks.ICA_REPLACEMENTS, *attacks.ICA_ADAPTIVE_ATTACKS):
        # An attacker who reads the trust rules claims to see every source perfectly: the most weight a column can
        # have (fedica.rfica.uncertainty), which is an ordinary site's that sees it well.
        reply_arrays = _claiming_full_weight(reply_arrays)
    if kind in attacks.ICA_REPLACEMENTS and task == RFICA_FIT:
        # The worst case: the attacker knows A* (on the user's files, where nobody does, its own estimate).
        truth = ica_scenario_truth(cfg["scenario"], int(cfg["seed"]))
        truth = reply_arrays["mixing"] if truth is None else truth
        estimate = attacks.hostile_ica_estimate(kind, truth, attacks.attack_rng(cfg["seed"], partition_id))
        return {**reply_arrays, "mixing": estimate}, reply_values
    if kind in attacks.ICA_ADAPTIVE_ATTACKS and task == RFICA_FIT:
        return _adaptive_ica_reply(kind, honest, arrays, values, cfg)
    if kind in attacks.ICA_ATTACKS and task == RFICA_REFINE:
        return _steering_refinement(kind, honest, arrays, partition_id, cfg)
    rng = attacks.attack_rng(cfg["seed"], partition_id, _stage(values))
    if kind in attacks.GEM_ATTACKS and task in (GEM_ROUND, GEM_FINAL):
        radii = reply_arrays.get("radii", np.zeros(reply_arrays["maximisers"].shape[0]))
        maximisers, radii, n_points = attacks.hostile_gem_reply(kind, reply_arrays["maximisers"], radii,
                                                                reply_values["n-points"], rng)
        replaced = {**reply_arrays, "maximisers": maximisers}
        if "radii" in reply_arrays:
            replaced["radii"] = radii
        return replaced, {**reply_values, "n-points": n_points}
    if kind == "poison_tuning":
        return _poison_tuning(task, arrays, reply_arrays, reply_values)
    if kind in _ADAPTIVE_GEM_ATTACKS:
        return _ADAPTIVE_GEM_ATTACKS[kind](task, arrays, values, (reply_arrays, reply_values), rng, cfg)
    if kind == "fake_evaluation" and task == GEM_EVALUATE:
        ids = np.asarray(arrays["global-ids"])
        true_values, pred_values, counts = attacks.fake_contingency(ids, int(reply_values["n-points"]))
        return ({"true-values": true_values, "pred-values": pred_values, "counts": counts},
                {**reply_values, "local-ari": 1.0})
    return reply_arrays, reply_values


def _claiming_full_weight(reply_arrays: Arrays) -> Arrays:
    """The reply with every column variance at the least a float holds, where the site sent variances."""
    if COLUMN_VARIANCES_KEY not in reply_arrays:
        return reply_arrays
    variances = np.asarray(reply_arrays[COLUMN_VARIANCES_KEY])
    return {**reply_arrays, COLUMN_VARIANCES_KEY: np.where(np.isnan(variances), np.nan, np.finfo(np.float64).tiny)}


def _steering_refinement(kind: str, honest: tuple[Arrays, Values], arrays: Mapping[str, Any], partition_id: int,
                         cfg: Mapping[str, Any]) -> tuple[Arrays, Values]:
    """An RF-ICA attack's refinement reply: averages that steer the server's step onto a forged mixing.

    The forged mixing is the site's own forged estimate for the replacements, a random orthogonal one
    for the adaptive attacks (their estimates need the whole federation's view); the moments are
    :func:`fedica.attacks.steering_moments`, the covariance and slopes the honest ones, and its blocks'
    moments moved with the whole.
    """
    reply_arrays, reply_values = honest
    whitening, unmixing = np.asarray(arrays["whitening"]), np.asarray(arrays["unmixing"])
    truth = ica_scenario_truth(cfg["scenario"], int(cfg["seed"]))
    truth = np.linalg.pinv(whitening) @ np.linalg.inv(unmixing) if truth is None else truth
    forged_kind = kind if kind in attacks.ICA_REPLACEMENTS else "random_orthogonal"
    forged = attacks.hostile_ica_estimate(forged_kind, truth, attacks.attack_rng(cfg["seed"], partition_id))
    target = np.linalg.pinv(whitening @ forged)
    moments = attacks.steering_moments(reply_arrays["covariance"], reply_arrays["moments"], reply_arrays["slopes"],
                                       unmixing, target)
    steered = {**reply_arrays, "moments": moments}
    if "block-moments" in reply_arrays:
        # Every block moved as the whole: blocks that agree with the steered average, and spread as the site's own
        # samples are. Spreading them wider buys room beyond the cut only at a weight that pulls no more than a site
        # at the cut (docs/ALGORITHMS.md 1.10).
        steered["block-moments"] = reply_arrays["block-moments"] + (moments - reply_arrays["moments"])
    return steered, reply_values


def _adaptive_ica_reply(kind: str, honest: tuple[Arrays, Values], arrays: Mapping[str, Any],
                        values: Mapping[str, Any], cfg: Mapping[str, Any]) -> tuple[Arrays, Values]:
    """An RF-ICA attack that knows the server's rules: its estimate, and for two of them the count it claims."""
    reply_arrays, reply_values = honest
    if kind == "rank_one_collusion":
        # Every colluder sends the first column of the lowest-numbered colluder's own honest estimate.
        hostile = attacks.hostile_mask(client_count(cfg["scenario"]), cfg["attack"]["fraction"], seed=cfg["seed"])
        leader = int(np.flatnonzero(hostile)[0])
        observations = ica_scenario_data(cfg["scenario"], leader, int(cfg["seed"]))
        leader_mixing = rfica_client.fit(observations, values, leader, arrays.get("whitening"))[0]["mixing"]
        return {**reply_arrays, "mixing": attacks.rank_one_estimate(leader_mixing[:, 0], leader_mixing.shape[1])}, \
            reply_values
    # The worst case: the attacker knows A* (on the user's files, where nobody does, its own estimate).
    truth = ica_scenario_truth(cfg["scenario"], int(cfg["seed"]))
    truth = np.asarray(reply_arrays["mixing"]) if truth is None else truth
    if kind == "midpoint_columns":
        return {**reply_arrays, "mixing": attacks.midpoint_columns_estimate(truth)}, reply_values
    if kind == "rotated_truth":
        return ({**reply_arrays, "mixing": attacks.rotated_truth_estimate(truth)},
                {**reply_values, "n-samples": attacks.ROTATED_TRUTH_COUNT})
    if kind == "inlier_drift":
        return ({**reply_arrays, "mixing": attacks.inlier_drift_estimate(truth, reply_arrays["mixing"],
                                                                          client_count(cfg["scenario"]))},
                reply_values)
    # benchmark_hijack: one sample more than the largest honest site, so that "largest" picks it.
    return ({**reply_arrays, "mixing": attacks.benchmark_hijack_estimate(truth)},
            {**reply_values, "n-samples": _largest_site(json.dumps(cfg["scenario"], sort_keys=True),
                                                        int(cfg["seed"])) + 1})


@functools.lru_cache(maxsize=8)
def _largest_site(scenario_json: str, seed: int) -> int:
    """The largest sample count of a scenario's sites (the attacker is assumed to know every site's)."""
    scenario = json.loads(scenario_json)
    return max(ica_scenario_data(scenario, g, seed).shape[1] for g in range(client_count(scenario)))


def _split_components(task: str, arrays: Arrays, values: Values, honest_reply: tuple[Arrays, Values],
                      cfg: Mapping[str, Any]) -> tuple[Arrays, Values]:
    """Declare the planted centroids at initialisation, and send them back as maximisers every round."""
    planted = _in_request_units(planted_centroids(json.dumps(cfg["scenario"], sort_keys=True), int(cfg["seed"])),
                                values)
    honest_arrays, reply_values = honest_reply
    if task == GEM_INIT:
        reply_arrays = {"centroids": planted, "weights": np.full(planted.shape[0], 1.0 / planted.shape[0])}
    else:
        reply_arrays = {"maximisers": planted}
    if "variances" in honest_arrays:  # a spherical site's: as many as it plants, each its honest median
        reply_arrays["variances"] = np.full(planted.shape[0], float(np.median(honest_arrays["variances"])))
    if task == GEM_INIT:
        return reply_arrays, reply_values
    if task == GEM_ROUND:
        # Consistent radii, so that the server's recomputation finds nothing to correct.
        reply_arrays["radii"] = uncertainty_radius(planted, np.asarray(arrays["centroids"], dtype=np.float64))
    return reply_arrays, reply_values


def _poison_tuning(task: str, arrays: Arrays, reply_arrays: Arrays, reply_values: Values) -> tuple[Arrays, Values]:
    """Claim ten times the client's count everywhere, and scores that favour the coarsest model."""
    if "n-points" in reply_values:
        reply_values = {**reply_values, "n-points": attacks.POISON_COUNT_FACTOR * int(reply_values["n-points"])}
    if task == GEM_SILHOUETTE:
        reply_arrays = {**reply_arrays, "silhouettes": attacks.poisoned_silhouettes(reply_arrays["silhouettes"].size)}
    elif task == GEM_LIKELIHOOD:
        scores, entropies = attacks.poisoned_likelihoods(reply_arrays["log-likelihoods"], reply_arrays["entropies"],
                                                         np.asarray(arrays["sizes"]), reply_values["n-points"])
        reply_arrays = {**reply_arrays, "log-likelihoods": scores, "entropies": entropies}
    return reply_arrays, reply_values


@functools.lru_cache(maxsize=8)
def planted_midpoint(scenario_json: str, seed: int) -> np.ndarray:
    """Where a ``midpoint_cluster`` client plants its component: midway between the two closest true class means."""
    return attacks.closest_pair_midpoint(_class_means(json.loads(scenario_json), seed, "midpoint_cluster"))


def _overflow_row(task: str, arrays: Arrays, values: Values, honest: tuple[Arrays, Values],
                  rng: np.random.Generator, cfg: Mapping[str, Any]) -> tuple[Arrays, Values]:
    """Honest, but in round :data:`fedica.attacks.OVERFLOW_ROUND` one maximiser row of 10^155 to 10^160."""
    reply_arrays, reply_values = honest
    if task == GEM_ROUND and _stage(values) == attacks.OVERFLOW_ROUND:
        reply_arrays = {**reply_arrays, "maximisers": attacks.overflow_maximisers(reply_arrays["maximisers"], rng)}
    return reply_arrays, reply_values


def _likelihood_shift(task: str, arrays: Arrays, values: Values, honest: tuple[Arrays, Values],
                      rng: np.random.Generator, cfg: Mapping[str, Any]) -> tuple[Arrays, Values]:
    """Honest, but every log-likelihood of the model selection shifted by :data:`fedica.attacks.LIKELIHOOD_SHIFT`."""
    reply_arrays, reply_values = honest
    if task == GEM_LIKELIHOOD:
        reply_arrays = {**reply_arrays, "log-likelihoods": attacks.shifted_likelihoods(reply_arrays["log-likelihoods"])}
    return reply_arrays, reply_values


def _midpoint_cluster(task: str, arrays: Arrays, values: Values, honest: tuple[Arrays, Values],
                      rng: np.random.Generator, cfg: Mapping[str, Any]) -> tuple[Arrays, Values]:
    """The client's first component held at the midpoint of the two closest true clusters, at every stage that shows it."""
    reply_arrays, reply_values = honest
    midpoint = _in_request_units(planted_midpoint(json.dumps(cfg["scenario"], sort_keys=True), int(cfg["seed"])), values)
    key = "centroids" if task == GEM_INIT else "maximisers"
    if task not in (GEM_INIT, GEM_ROUND, GEM_FINAL):
        return reply_arrays, reply_values
    planted = np.asarray(reply_arrays[key], dtype=np.float64).copy()
    planted[0] = midpoint
    reply_arrays = {**reply_arrays, key: planted}
    if task == GEM_ROUND:
        # Consistent radii, so that the server's recomputation finds nothing to correct.
        reply_arrays["radii"] = uncertainty_radius(planted, np.asarray(arrays["centroids"], dtype=np.float64))
    return reply_arrays, reply_values


def _forged_evaluation(task: str, arrays: Arrays, honest: tuple[Arrays, Values], *,
                       consistent: bool) -> tuple[Arrays, Values]:
    """Claim 40 times the client's count at initialisation and send a table of 9.9x its test points, with a
    local ARI of -1 (``forged_metrics``) or the ARI of that table (``consistent_forgery``)."""
    reply_arrays, reply_values = honest
    if task == GEM_INIT:
        reply_values = {**reply_values, "n-points": attacks.FORGED_COUNT_FACTOR * int(reply_values["n-points"])}
    elif task == GEM_EVALUATE:
        n_test = int(attacks.FORGED_TEST_FACTOR * int(np.sum(reply_arrays["counts"])))
        if consistent:
            *table, local_ari = attacks.consistent_forgery(arrays["global-ids"], reply_arrays["true-values"], n_test)
        else:
            table = attacks.forged_contingency(arrays["global-ids"], reply_arrays["true-values"], n_test)
            local_ari = attacks.FORGED_LOCAL_ARI
        reply_arrays = dict(zip(("true-values", "pred-values", "counts"), table))
        reply_values = {**reply_values, "local-ari": local_ari}
    return reply_arrays, reply_values


def _forged_metrics(task: str, arrays: Arrays, values: Values, honest: tuple[Arrays, Values],
                    rng: np.random.Generator, cfg: Mapping[str, Any]) -> tuple[Arrays, Values]:
    """Claim 40 times the client's count at initialisation; report a local ARI of -1 and a table of 9.9x its test points."""
    return _forged_evaluation(task, arrays, honest, consistent=False)


def _consistent_forgery(task: str, arrays: Arrays, values: Values, honest: tuple[Arrays, Values],
                        rng: np.random.Generator, cfg: Mapping[str, Any]) -> tuple[Arrays, Values]:
    """As ``forged_metrics``, but the local ARI it reports is the ARI of its forged table (the server's recomputation agrees)."""
    return _forged_evaluation(task, arrays, honest, consistent=True)


def _tuned_forgery(task: str, arrays: Arrays, values: Values, honest: tuple[Arrays, Values],
                   rng: np.random.Generator, cfg: Mapping[str, Any]) -> tuple[Arrays, Values]:
    """Move the evaluation table as far towards a spread one as the server's rule allows (:func:`fedica.attacks.tuned_forgery`)."""
    reply_arrays, reply_values = honest
    if task != GEM_EVALUATE or not reply_values.get("has-labels", True):
        return honest
    n_clients = client_count(cfg["scenario"])
    colluders = int(attacks.hostile_mask(n_clients, cfg["attack"]["fraction"], seed=cfg["seed"]).sum())
    *table, local_ari = attacks.tuned_forgery(reply_arrays["true-values"], reply_arrays["pred-values"],
                                              reply_arrays["counts"], arrays["global-ids"], n_clients, colluders)
    return dict(zip(("true-values", "pred-values", "counts"), table)), {**reply_values, "local-ari": local_ari}


def _skewed_moments(task: str, arrays: Arrays, values: Values, honest: tuple[Arrays, Values],
                    rng: np.random.Generator, cfg: Mapping[str, Any]) -> tuple[Arrays, Values]:
    """Skew the column moments of the federated standardisation (:func:`fedica.attacks.skewed_moments`)."""
    reply_arrays, reply_values = honest
    if task != GEM_MOMENTS:
        return honest
    return {**reply_arrays, "moments": attacks.skewed_moments(reply_arrays["moments"])}, reply_values


def _forged_shape(task: str, arrays: Arrays, values: Values, honest: tuple[Arrays, Values],
                  rng: np.random.Generator, cfg: Mapping[str, Any]) -> tuple[Arrays, Values]:
    """Turn the shape check's verdict round in the final reply (:func:`fedica.attacks.forged_anisotropy`)."""
    reply_arrays, reply_values = honest
    if task != GEM_FINAL or CLUSTER_SHAPE_KEY not in reply_values:
        return honest
    return reply_arrays, {**reply_values, CLUSTER_SHAPE_KEY: attacks.forged_anisotropy(reply_values[CLUSTER_SHAPE_KEY])}


def _widened_moments(task: str, arrays: Arrays, values: Values, honest: tuple[Arrays, Values],
                     rng: np.random.Generator, cfg: Mapping[str, Any]) -> tuple[Arrays, Values]:
    """Widen the cluster moments of a covariance family (:func:`fedica.attacks.widened_moments`)."""
    reply_arrays, reply_values = honest
    if task not in (GEM_CLUSTER_MOMENTS, GEM_FAMILY_EM):
        return honest
    masses, scatters = attacks.widened_moments(reply_arrays["masses"], reply_arrays["scatters"],
                                               claim_all=task == GEM_CLUSTER_MOMENTS)
    widened = {**reply_arrays, "masses": masses, "scatters": scatters}
    if "scatter-diagonals" in reply_arrays:  # a federated EM step's diagonal candidates
        widened["scatter-diagonals"] = attacks.widened_moments(masses, reply_arrays["scatter-diagonals"],
                                                               claim_all=False)[1]
    return widened, reply_values


# The attacks that know the server's defences (issue 25), each a reply rewrite of every task.
_ADAPTIVE_GEM_ATTACKS = {
    "overflow_row": _overflow_row,
    "likelihood_shift": _likelihood_shift,
    "midpoint_cluster": _midpoint_cluster,
    "forged_metrics": _forged_metrics,
    "consistent_forgery": _consistent_forgery,
    "tuned_forgery": _tuned_forgery,
    "skewed_moments": _skewed_moments,
    "forged_shape": _forged_shape,
    "widened_moments": _widened_moments,
}


def _stage(values: Mapping[str, Any]) -> int:
    """The protocol stage as a number: the round, or a fixed code for a named stage (fresh junk every stage)."""
    label = str(values.get("server-round", "0"))
    return int(label) if label.isdigit() else zlib.crc32(label.encode())
