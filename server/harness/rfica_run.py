"""fedica's RF-ICA run: :class:`~fedica.server.rfica.RFICAStrategy` over the run's federation, every method scored.

The scores need the scenario's true mixing matrix A*, which only an experiment has; the
strategy itself never sees it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from fedica.server.federation import Federation
from fedica.server.harness.books import RunBooks
from fedica.server.harness.outputs import run_output_dir, write_site_sources
from fedica.server.rfica import RFICAStrategy

from fedica.data.scenarios import ica_channel_names, ica_poor_sites, ica_scenario_truth
from fedica.evaluation.ica import ica_error
from fedica.rfica.coordinator import explained_variance_record, site_column_weights

METHODS = ("rf-ica", "f-ica", "simple-mean", "simple-median")


def run_rfica(federation: Federation, books: RunBooks, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """fedica's RF-ICA run: the strategy, then every method scored against the scenario's A* (if it has one).

    Parameters
    ----------
    federation : Federation
        The run's transport and its books of who answered.
    books : RunBooks
        The experiment's records (who is hostile).
    cfg : mapping
        The validated run configuration.

    Returns
    -------
    partial_result : dict
        The ``metrics``, ``clients``, ``timings`` and ``rfica`` entries of the result (``rfica.site_iterations``,
        ``rfica.site_converged`` and ``rfica.unconverged_clients``: each site's local ICA). Without a ground truth
        (scenario ``files``) every ``error`` and ``rfica.true_mixing`` are None. ``rfica.estimate`` is the
        aggregated mixing matrix, ``rfica.unmixing`` its inverse; with ``scenario.write_sources`` the sites'
        recovered sources are written (:func:`fedica.server.harness.outputs.write_site_sources`) and ``rfica.sources_files`` lists them.
        ``rfica.channel_names`` names the estimate's rows for recordings read on this machine (else absent).
        With ``algorithm.refine_rounds``, ``rfica.refinement`` holds every step (its sites, those set aside,
        its change) and the one-shot estimate with its error; ``rf-ica`` is then the refined estimate.
    """
    sc, alg, seed = cfg["scenario"], cfg["algorithm"], int(cfg["seed"])
    strategy = RFICAStrategy(contrast=alg["contrast"], init=alg["init"], local_solver=alg["local_solver"],
                             n_components=alg["n_components"], whitening=alg["whitening"], benchmark=alg["benchmark"],
                             kmeans_restarts=alg["kmeans_restarts"], gm_tol=alg["gm_tol"],
                             clustering=alg["clustering"], center=alg["center"], dp_epsilon=alg["dp_epsilon"],
                             dp_delta=alg["dp_delta"], refine_rounds=alg["refine_rounds"], random_state=seed,
                             r=sc.get("r"), min_available_nodes=federation.expected, min_clients=federation.min_clients,
                             client_config=federation.common_values)
    strategy.start(federation.grid, timeout=federation.round_timeout, federation=federation)
    state = strategy.state
    aggregate = state.aggregate
    truth = ica_scenario_truth(sc, seed)
    estimates_by_method = {"rf-ica": aggregate.rf_ica, "f-ica": aggregate.f_ica,
                           "simple-mean": aggregate.simple_mean, "simple-median": aggregate.simple_median}
    metrics = {name: {"error": None if truth is None else ica_error(estimate, truth)}
               for name, estimate in estimates_by_method.items()}
    clients_sum = float(np.sum(state.client_seconds))
    # Every method starts from the same local estimates (the clients' work), then takes its own server step.
    fit_seconds = {name: clients_sum + aggregate.method_seconds[name] for name in METHODS}
    poor = ica_poor_sites(sc, seed)
    rfica = {
        "benchmark_client": state.partitions[aggregate.benchmark],
        "estimate": aggregate.rf_ica,
        "unmixing": strategy.components_,
        "estimates": estimates_by_method,
        "true_mixing": truth,
        "client_partitions": state.partitions,
        "n_samples": state.n_samples,
        # Each accepted site's local ICA (in client_partitions order): its iterations and whether it converged
        # (after one retry from another start when the first did not); the sites that did not, by partition.
        "site_iterations": state.n_iter,
        "site_converged": state.converged,
        "unconverged_clients": state.unconverged,
        # The sites with a column the trimmed centre dropped from its cluster (algorithm.center), by partition.
        "trimmed_clients": [state.partitions[k] for k in np.flatnonzero(aggregate.trimmed.any(axis=1))],
        "n_components": state.components,
        "whitening": state.whitening_matrix,
        # How far the channels' scales are apart in the estimates; over 10 the columns were compared scaled.
        "channel_scale_spread": state.channel_scale_spread,
        "smallest_channel_scale": state.smallest_channel_scale,
        # The sites that marked bad channels (flat or saturated), by partition, and those channels: filled from the others.
        "bad_channels": {str(g): channels for g, channels in state.bad_channels.items()},
        # The sites the scenario makes poor on purpose (all kinds together), None when unknown.
        "corrupted_clients": None if poor is None else sorted(g for sites in poor.values() for g in sites),
        "poor_sites": poor,
        "hostile_clients": books.hostile_partitions,
        "participation": federation.participation,
    }
    # The rows of the estimate, for recordings (scenario=files through MNE): the config checked that every site
    # has these channels in this order. A deployment's files are on the sites' machines; other runs name none
    # (and their result keeps its keys).
    channel_names = None if cfg["engine"]["name"] == "deployment" else ica_channel_names(sc)
    if channel_names is not None:
        rfica["channel_names"] = channel_names
    explained, ratio = explained_variance_record(state)
    if explained is not None:  # only a run whose sites sent covariances knows it (and orders its columns by it)
        rfica["explained_variance"], rfica["explained_variance_ratio"] = explained, ratio
        # The sites' robust centre and covariance: an estimator rebuilt from this file centres, and gives MNE's ICA.
        rfica["mean"], rfica["covariance"] = state.global_mean, state.global_covariance
    if state.subspace_left_out:  # the sites the pooled subspace left out (docs/ALGORITHMS.md section 1.8)
        rfica["subspace_left_out"] = state.subspace_left_out
    weights = site_column_weights(state)
    if weights is not None:  # only a run whose sites reported their column variances (a trimmed centre) has them
        # Each accepted site's weight of each of its columns (client_partitions order, the site's own column order):
        # how well it sees that source (docs/ALGORITHMS.md section 1.13).
        rfica["column_weights"] = weights
    if sc.get("write_sources"):
        rfica["sources_files"] = write_site_sources(sc, strategy.components_, seed, run_output_dir())
    if alg["refine_rounds"]:  # only a refined run records it: a one-shot run writes the result it always wrote
        one_shot = aggregate.rf_ica if state.one_shot_mixing is None else state.one_shot_mixing
        rfica["refinement"] = {"steps": state.refinement, "reverted_columns": state.refinement_reverted,
                               "noisy_sites": state.noisy_sites,
                               "one_shot_estimate": one_shot,
                               "one_shot_error": None if truth is None else ica_error(one_shot, truth)}
    # Only a private run records its privacy: a run without dp_epsilon writes the result it always wrote.
    privacy = {} if strategy.privacy_ is None else {"privacy": strategy.privacy_}
    return {
        "metrics": metrics,
        "clients": federation.clients_record(len(state.estimates)),
        "timings": {**fit_seconds, "clients_sum": clients_sum, "server": state.server_seconds},
        "rfica": rfica,
        **privacy,
    }
