"""fedica's FedGEM run: :class:`~fedica.server.fedgem.FedGEMStrategy` over the run's federation, then the result's sections.

Beside the strategy's own numbers the run scores what only an experiment can: the honest clients
apart from the hostile ones (:class:`~fedica.server.harness.books.RunBooks`), the silhouettes on the
scenario's regenerated test data, and the comparators (:mod:`fedica.evaluation.baselines`).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Mapping
from functools import partial
from typing import Any

from fedica.server.federation import Federation
from fedica.server.fedgem import FedGEMStrategy
from fedica.server.harness.books import RunBooks
from fedica.server.harness.comparators import flower_driver

from fedica.data.files import label_like_column, table_header
from fedica.data.scenarios import file_table, scenario_client_data, true_n_clusters
from fedica.evaluation.baselines import evaluate_clustering, run_baselines
from fedica.fedgem.client import adapted_labels, consensus_labels
from fedica.fedgem.families import mixture_bic
from fedica.results import STRONG_BIC_EVIDENCE, pooled_bics
from fedica.fedgem.geometry import FEATURE_SCALE_SPREAD_LIMIT, geometry
from fedica.fedgem.standardisation import STANDARDISATION_KEY
from fedica.fedgem.coordinator import FedGEMServer, FedGEMSettings

log = logging.getLogger("fedica.server")


def run_fedgem(federation: Federation, books: RunBooks, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """fedica's FedGEM run over a federation: the strategy, then the result's sections (and the baselines).

    Parameters
    ----------
    federation : Federation
        The run's transport and its books of who answered.
    books : RunBooks
        The experiment's records: who is hostile; FedGEM's rounds are added to ``books.history``.
    cfg : mapping
        The validated run configuration.

    Returns
    -------
    partial_result : dict
        ``metrics``, ``clients``, ``history``, ``timings`` and ``fedgem`` entries of the result.
    """
    alg = cfg["algorithm"]
    settings = FedGEMSettings.from_config(alg, min_clients=int(cfg["min_clients"]), seed=int(cfg["seed"]))
    strategy = FedGEMStrategy(**{k: v for k, v in vars(settings).items() if k not in ("min_clients", "seed")},
                              random_state=settings.seed, evaluate=True, min_clients=settings.min_clients,
                              min_available_nodes=federation.expected, client_config=federation.common_values)
    try:
        strategy.start(federation.grid, timeout=federation.round_timeout, federation=federation)
    finally:
        if strategy.server is not None:
            books.history.extend(strategy.server.history)
    server = strategy.server
    spread = server.feature_scale_spread
    if cfg["scenario"]["name"] == "files" and spread is not None and spread > FEATURE_SCALE_SPREAD_LIMIT:
        # After the library's warning, in the run's warnings and its summary: what the files' user can set here.
        pooled = ("" if cfg["engine"]["name"] == "deployment" else
                  "scenario.standardize=pool standardises every feature over every file's rows; ")
        warnings.warn(f"scenario=files: algorithm.standardize=federated standardises every feature by scales the "
                      f"sites agree on; {pooled}scenario.standardize=site, each site's file on its own rows",
                      UserWarning, stacklevel=2)
    scenario = cfg["scenario"]
    if scenario["name"] == "files" and scenario.get("label_column") is None and cfg["engine"]["name"] != "deployment":
        warn_of_label_like_columns(scenario["paths"])
    if scenario["name"] == "files" and scenario.get("label_column") is not None and scenario.get("test_fraction") == 0:
        warnings.warn("scenario.test_fraction=0: no row is held out, so the ARIs score the training rows, the points "
                      "the model was fit to (a held-out share, the default 0.3, scores unseen points)", UserWarning,
                      stacklevel=2)
    fedgem_metrics = {**server.evaluation, "super_clusters": server.aggregation.k_hat, "upsilon": server.upsilon,
                      "rounds": alg["rounds"]}
    if books.hostile_partitions:
        # The books know who was hostile (the server never did): the honest clients' view beside everyone's.
        honest = [p for p in server.evaluated if p not in set(books.hostile_partitions)]
        fedgem_metrics.update({f"honest_{k}": v for k, v in server.evaluation_over(honest).items()})
    true_k = true_n_clusters(cfg["scenario"])
    if true_k is not None:
        fedgem_metrics["k_true"] = true_k
    if cfg["scenario"]["name"] != "files":
        fedgem_metrics.update(scenario_silhouettes(cfg, server))

    result_metrics = {"fedgem": fedgem_metrics}
    timings = {"fedgem": server.client_seconds + server.server_seconds, "fedgem_clients_sum": server.client_seconds,
               "fedgem_server": server.server_seconds}
    # A deployment's files are on the sites' machines: the comparators, which read them, run only on local engines.
    if cfg["baselines"] and not (cfg["scenario"]["name"] == "files" and cfg["engine"]["name"] == "deployment"):
        start = time.perf_counter()
        baseline_metrics, baseline_timings = run_baselines(cfg["scenario"], cfg["baseline_methods"], seed=int(cfg["seed"]),
                                                           n_init=alg["n_init"], driver=flower_driver(federation),
                                                           partitions=server.final.partitions,
                                                           fedgem_k=server.aggregation.k_hat,
                                                           fedgem_bic=_pooled_bic(server))
        log.info("baselines %s in %.2f s", list(baseline_metrics), time.perf_counter() - start)
        fedgem_metrics.update(baseline_metrics.pop("fedgem", {}))
        result_metrics.update(baseline_metrics)
        timings.update(baseline_timings)
        _warn_of_a_likelier_central_mixture(result_metrics)
    mapping = {str(p): labels.tolist() for p, labels in strategy.site_mapping_.items()}
    # Only a private run records its privacy: a run without dp_epsilon writes the result it always wrote.
    privacy = {} if strategy.privacy_ is None else {"privacy": strategy.privacy_}
    # Likewise only a standardised run records its location and scale; its centres are in the data's own units.
    units = {} if server.feature_scale is None else {"feature_location": server.feature_location,
                                                     "feature_scale": server.feature_scale}
    # Only a run under a covariance family records it: its clusters' covariances (in the units the sites clustered)
    # and pooled weights, from which FedGEM.from_result rebuilds the mixture.
    family = {} if server.family is None else {"covariance_family": server.family.family,
                                               "covariances": server.family.covariances,
                                               "cluster_weights": server.family.weights}
    return {
        **privacy,
        "metrics": result_metrics,
        "clients": federation.clients_record(len(server.final.partitions)),
        "history": server.history,
        "timings": timings,
        "fedgem": {
            "global_centroids": server.in_data_units(server.aggregation.global_centroids),
            **units,
            **family,
            "client_mapping": mapping,
            "client_local_ari": server.client_aris,
            "local_clusters": {str(p): m.n_components for p, m in sorted(server.models.items())},
            # Only where a site chose its K_g at its bound: the result a run always wrote otherwise.
            **({"local_clusters_at_bound": server.local_clusters_at_bound} if server.local_clusters_at_bound else {}),
            "upsilon": server.upsilon,
            "upsilon_tuning": server.tuning,
            "k_support": server.k_support,
            "feature_scale_spread": server.feature_scale_spread,
            "cluster_anisotropy": server.cluster_anisotropy,
            "participation": federation.participation,
            "hostile_clients": books.hostile_partitions,
        },
    }


def _pooled_bic(server):
    """The BIC of the run's mixture on rows of the data's units, under a covariance family (its pooled weights, means
    and covariances); None under the spheres alone, whose variances the sites keep."""
    family = server.family
    if family is None:
        return None
    return partial(mixture_bic, weights=family.weights, means=family.means, covariances=family.covariances,
                   n_parameters=family.n_parameters, location=server.feature_location, scale=server.feature_scale)


def _warn_of_a_likelier_central_mixture(metrics: Mapping[str, Mapping[str, Any]]) -> None:
    """Warn where the central analyst's mixture (``central-gmm-bic``) fits the pooled training points better than the
    federation's by strong evidence: the federation missed a likelier mixture of the same data."""
    if (bics := pooled_bics(metrics)) is None:
        return
    ours, central = bics
    if ours - central > STRONG_BIC_EVIDENCE:
        warnings.warn(f"FedGEM's mixture fits the pooled training points worse than central-gmm-bic's by {ours - central:.1f} "
                      f"in BIC (strong evidence, above {STRONG_BIC_EVIDENCE:g}): the federation missed a likelier mixture "
                      "of the same data", UserWarning, stacklevel=2)


def warn_of_label_like_columns(paths) -> None:
    """Warn of a site file's column of a few whole numbers among columns of measurements: a class label clustered as a
    feature splits the clusters by it (issue 44). The files are read here (the local engines), from the run's cache."""
    for path in paths:
        found = label_like_column(file_table(path)[0])
        if found is None:
            continue
        column, distinct = found
        header = table_header(path)
        name = repr(header[column]) if header else str(column)
        warnings.warn(f"scenario=files: {path}'s column {name} holds only {distinct} distinct whole numbers among "
                      f"columns of measurements; if it names each row's class, give scenario.label_column={name} "
                      "(clustered as a feature, a label splits the clusters by it)", UserWarning, stacklevel=2)
        return


def scenario_silhouettes(cfg: Mapping[str, Any], server: FedGEMServer) -> dict[str, float]:
    """FedGEM's silhouettes (pooled and per client), scored exactly as the comparators'.

    A silhouette needs the points, which never leave a client: for a simulated scenario the
    server regenerates the clients' test data (as for the comparators) and labels it as the client
    itself does in the evaluation stage (``labelling``: its consensus model, or its own mixture over
    every global centre).
    """
    payloads = server.evaluation_payloads()
    partitions = sorted(payloads)
    standardisation = server.units.get(STANDARDISATION_KEY)  # the sites label their points in these units
    clients = [scenario_client_data(cfg["scenario"], p, int(cfg["seed"]), standardisation) for p in partitions]
    if server.settings.labelling == "adapted":
        model = geometry(server.settings.covariance_type)
        labels = [adapted_labels(c.X_train, c.X_test, payloads[p]["centroids"], payloads[p]["global-ids"], model)
                  for p, c in zip(partitions, clients)]
    else:
        labels = [consensus_labels(c.X_test, payloads[p]["centroids"], payloads[p]["global-ids"])
                  for p, c in zip(partitions, clients)]
    scores = evaluate_clustering(clients, labels)
    return {key: scores[key] for key in ("silhouette", "local_silhouette")}
