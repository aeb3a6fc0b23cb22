"""diffprivlib's central DP k-means told K, on the data of ``+experiment=fedgem_privacy`` (issue 27;
docs/RESULTS.md, "Differential privacy (issue 27)") or of its per-client and MNIST workloads
(``--experiment fedgem_privacy_client`` / ``fedgem_privacy_mnist``).

For every epsilon of the experiment's sweep and every seed, the clients' training points of
that seed's scenario (``fedica.data.scenarios.scenario_client_data``, the same points FedGEM's run
with that seed sees) are pooled at one server and fitted by ``diffprivlib.models.KMeans``
(DP-Lloyd, pure epsilon-DP per data point: delta 0) with ``n_clusters`` the true K and the
bounds ``(-dp_clip, dp_clip)`` on every feature (the box about FedGEM's clip ball; diffprivlib
clips each feature to it). At ``epsilon: null`` the reference is scikit-learn's ``KMeans``
(k-means++, 3 starts), k-means without privacy. Every fit is scored as FedGEM's comparators are
(``fedica.evaluation.baselines.evaluate_clustering``: K_hat, the clusters receiving test points;
global and local ARI on the clients' test points). Run from the repository root::

    PYTHONPATH=. python benchmarks/dp_kmeans.py [--experiment fedgem_privacy] [--seeds 10] [--out benchmarks/dp_kmeans.json]

diffprivlib's guarantee is per data point whatever the experiment's ``dp_unit``: with
``fedgem_privacy_client`` it protects one of a client's 50 points, not the client's whole data
(group privacy gives a client 50 times its epsilon).

It is a script, not a ``baseline_methods`` comparator, because a comparator cannot read
``algorithm.dp_epsilon`` today (``run_baselines`` takes the scenario only).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import time
import types

import numpy as np
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from sklearn.cluster import KMeans

from fedica.data.scenarios import scenario_client_data, true_n_clusters
from fedica.evaluation.baselines import evaluate_clustering
from fedica.seeding import sklearn_seed
from fedica.server.app import CONF_DIR

EXPERIMENT = "fedgem_privacy"


def diffprivlib_kmeans_class():
    """``diffprivlib.models.KMeans``, imported without the rest of diffprivlib's models.

    diffprivlib 0.6.6 (its newest release) imports its random forest at package import, and that
    module imports ``DOUBLE`` and ``DTYPE`` from ``sklearn.tree._tree``, which scikit-learn 1.9 no
    longer has. The k-means module needs neither: the two package modules are registered bare (their
    ``__init__`` unrun) so that only ``diffprivlib.models.k_means`` and what it imports are loaded.
    """
    if "diffprivlib.models.k_means" not in sys.modules:
        spec = importlib.util.find_spec("diffprivlib")
        if spec is None:
            raise ImportError("diffprivlib is not installed: pip install 'fedica[dp]'")
        root = list(spec.submodule_search_locations)
        for name, path in (("diffprivlib", root), ("diffprivlib.models", [os.path.join(root[0], "models")])):
            if name not in sys.modules:
                package = types.ModuleType(name)
                package.__path__ = path
                sys.modules[name] = package
    return importlib.import_module("diffprivlib.models.k_means").KMeans


def experiment_config(overrides=(), experiment: str = EXPERIMENT) -> dict:
    """The experiment's scenario and algorithm sections (resolved) and its sweep grid, as plain containers."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=[f"+experiment={experiment}", *overrides],
                      return_hydra_config=True)
    return {"scenario": OmegaConf.to_container(cfg.scenario, resolve=True),
            "algorithm": OmegaConf.to_container(cfg.algorithm, resolve=True),
            "sweep": OmegaConf.to_container(cfg.hydra.sweeper.params, resolve=False)}


def sweep_epsilons(cfg: dict) -> list[float | None]:
    """The epsilons of the experiment's sweep, null as None."""
    values = str(cfg["sweep"]["algorithm.dp_epsilon"]).split(",")
    return [None if v.strip() == "null" else float(v) for v in values]


def fit_and_score(clients, n_clusters: int, epsilon: float | None, clip: float, seed: int) -> dict:
    """One central fit on the pooled training points, scored on every client's test points.

    ``epsilon`` None is scikit-learn's k-means without privacy; otherwise diffprivlib's DP k-means
    with bounds ``(-clip, clip)`` on every feature. The model's seed is drawn from
    ``numpy.random.default_rng(seed)``, as the other comparators draw theirs.
    """
    rng = np.random.default_rng(seed)
    X = np.concatenate([c.X_train for c in clients])
    if epsilon is None:
        model = KMeans(n_clusters=n_clusters, n_init=3, random_state=sklearn_seed(rng))
    else:
        dim = X.shape[1]
        model = diffprivlib_kmeans_class()(n_clusters=n_clusters, epsilon=float(epsilon),
                                           bounds=(np.full(dim, -clip), np.full(dim, clip)),
                                           random_state=sklearn_seed(rng))
    start = time.perf_counter()
    model.fit(X)
    seconds = time.perf_counter() - start
    scores = evaluate_clustering(clients, [model.predict(c.X_test) for c in clients])
    return {"method": "k-means" if epsilon is None else "dp-kmeans", "epsilon": epsilon, "seed": seed,
            "k_hat": int(scores["k_hat"]), "global_ari": float(scores["global_ari"]),
            "local_ari": float(scores["local_ari"]), "fit_seconds": seconds}


def summarise(runs: list[dict]) -> list[dict]:
    """Mean and sample standard deviation over the seeds of each epsilon."""
    rows = []
    for epsilon in dict.fromkeys(r["epsilon"] for r in runs):
        group = [r for r in runs if r["epsilon"] == epsilon]
        row = {"method": group[0]["method"], "epsilon": epsilon, "n": len(group)}
        for key in ("k_hat", "global_ari", "local_ari"):
            values = np.array([r[key] for r in group], dtype=float)
            row[key] = float(values.mean())
            row[f"{key}_sd"] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
        rows.append(row)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiment", default=EXPERIMENT, help="the privacy experiment whose data and epsilons to use")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--out", default="benchmarks/dp_kmeans.json")
    args = parser.parse_args(argv)
    cfg = experiment_config(experiment=args.experiment)
    scenario, algorithm = cfg["scenario"], cfg["algorithm"]
    n_clusters, clip = true_n_clusters(scenario), float(algorithm["dp_clip"])
    runs = []
    for seed in range(args.seeds):
        clients = [scenario_client_data(scenario, g, seed) for g in range(int(scenario["n_clients"]))]
        for epsilon in sweep_epsilons(cfg):
            run = fit_and_score(clients, n_clusters, epsilon, clip, seed)
            runs.append(run)
            print(json.dumps(run), flush=True)
    runs.sort(key=lambda r: (r["epsilon"] is None, r["epsilon"] or 0.0, r["seed"]))
    out = {"experiment": args.experiment, "scenario": scenario, "dp_clip": clip, "n_clusters": n_clusters,
           "bounds": "(-dp_clip, dp_clip) on every feature", "diffprivlib_delta": 0.0,
           "summary": summarise(runs), "runs": runs}
    with open(args.out, "w") as handle:
        json.dump(out, handle, indent=1)
        handle.write("\n")
    for row in out["summary"]:
        print(f"{row['method']:9s} epsilon {row['epsilon']}: k_hat {row['k_hat']:.2f} ± {row['k_hat_sd']:.2f}, "
              f"global ARI {row['global_ari']:.3f} ± {row['global_ari_sd']:.3f} (n={row['n']})")


if __name__ == "__main__":
    main()
