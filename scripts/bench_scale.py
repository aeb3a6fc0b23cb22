"""``fedica-bench --only scale``: federations of thousands of clients (issue 15's targets).

Each whole run goes through ``fedica-run`` in a child process, so that its wall time includes
everything a user waits for and its peak memory is the child's own (``ru_maxrss``):

- FedGEM, G = 1,000 sites of 500 points, d = 10, K = 50, T = 10, ``upsilon: auto``, in-process
  and through Flower's simulation engine, and with ``upsilon`` fixed (1.0) in-process;
- the yardstick of issue 28, a fit a user would run if the data could be pooled, as a whole
  process too: the same scenario's training points, generated as the sites generate them, and
  scikit-learn's ``GaussianMixture(K, covariance_type="spherical", max_iter=10)`` told K
  (:func:`central_gmm_fit`); every FedGEM wall time is also given as a ratio to it;
- FedGEM's server step alone at 1,000,000 components (100 per true cluster);
- RF-ICA with K = 10,000 sites (r = 10): the server aggregation alone, and the whole in-process run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from fedica.scripts.bench_common import synthetic_components

FEDGEM_THOUSAND = [
    # The spheres, as the central GaussianMixture it is compared with; the default family (auto) is measured beside
    # them in docs/PERFORMANCE.md, "auto as the default".
    "algorithm=fedgem", "algorithm.covariance_type=spherical", "scenario=blobs", "scenario.n_clients=1000", "scenario.n_clusters=50", "scenario.dim=10",
    "scenario.r_min=4", "scenario.n_train=500000", "scenario.n_test=50000", "algorithm.rounds=10",
    "baselines=false", "log_level=WARNING",
]
RFICA_TEN_THOUSAND = ["scenario.n_clients=10000", "scenario.r=10", "scenario.n_normal=1000", "scenario.n_corrupt=100",
                      "baselines=true", "log_level=WARNING"]


def _whole_process(command: list[str], overrides: list[str]) -> tuple[dict[str, Any], str, str]:
    """Run ``command`` to its end: (wall seconds, exit status and the child's own peak memory; stdout; stderr)."""
    with tempfile.TemporaryFile(mode="w+") as stdout:
        start = time.perf_counter()
        child = subprocess.Popen(command, stdout=stdout, stderr=subprocess.PIPE, text=True)
        stderr = child.stderr.read()
        # wait4 gives this child's own resource usage (RUSAGE_CHILDREN would be the largest child so far); Popen's
        # own wait would reap the child first, so it is not called.
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        outcome = {"overrides": overrides, "wall_s": time.perf_counter() - start,
                   "exit_status": child.returncode, "peak_rss_gib": usage.ru_maxrss / 2**20}
        child.stderr.close()
        stdout.seek(0)
        return outcome, stdout.read(), stderr


def child_run(overrides: list[str]) -> dict[str, Any]:
    """One ``fedica-run`` in a child process: wall seconds, the child's peak memory, its result's headline."""
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "fedica.scripts.run", *overrides, f"hydra.run.dir={folder}"]
        outcome, _, stderr = _whole_process(command, overrides)
        result_file = Path(folder) / "result.json"
        if not result_file.exists():
            outcome["error"] = stderr.strip().splitlines()[-1:] or ["no result"]
            return outcome
        result = json.loads(result_file.read_text())
    outcome["metrics"] = result["metrics"]
    outcome["timings"] = result["timings"]
    tuning = (result.get("fedgem") or {}).get("upsilon_tuning") or {}
    if tuning.get("skipped"):
        outcome["upsilon_skipped"] = sorted(map(float, tuning["skipped"]))
    return outcome


def central_gmm_fit(overrides: list[str]) -> dict[str, Any]:
    """Issue 28's yardstick: the scenario's pooled training points and scikit-learn's spherical GMM told K.

    The points are every site's, generated as ``fedica-run``'s sites generate them
    (:func:`fedica.data.scenarios.scenario_client_data`); the fit is
    ``GaussianMixture(K, covariance_type="spherical", max_iter=10)``, K the scenario's
    ``n_clusters``, seeded by the config's ``seed``. Returns what was fitted and its seconds.
    """
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import GaussianMixture

    from fedica.config import client_count
    from fedica.data.scenarios import scenario_client_data
    from fedica.server.app import compose_config

    cfg = compose_config(overrides)
    scenario = cfg["scenario"]
    pooled = np.vstack([scenario_client_data(scenario, site, cfg["seed"]).X_train for site in range(client_count(scenario))])
    start = time.perf_counter()
    with warnings.catch_warnings():  # ten EM steps are the yardstick, converged or not
        warnings.simplefilter("ignore", ConvergenceWarning)
        gmm = GaussianMixture(scenario["n_clusters"], covariance_type="spherical", max_iter=10,
                              random_state=cfg["seed"]).fit(pooled)
    return {"k": int(scenario["n_clusters"]), "points": int(pooled.shape[0]), "iterations": int(gmm.n_iter_),
            "fit_s": time.perf_counter() - start}


def central_gmm_run(overrides: list[str]) -> dict[str, Any]:
    """:func:`central_gmm_fit` as a whole process, as a user would run it: wall seconds, peak memory, its outcome."""
    code = "import json, sys; from fedica.scripts.bench_scale import central_gmm_fit; print(json.dumps(central_gmm_fit(sys.argv[1:])))"
    outcome, stdout, stderr = _whole_process([sys.executable, "-c", code, *overrides], overrides)
    if outcome["exit_status"] != 0:
        outcome["error"] = stderr.strip().splitlines()[-1:] or ["no output"]
        return outcome
    return {**outcome, **json.loads(stdout.strip().splitlines()[-1])}


def bench_server_step_million() -> dict[str, Any]:
    """The server step at 1,000,000 components, 100 per true cluster (the fixed-density workload)."""
    from fedica.fedgem.merging import server_step

    m = 1_000_000
    centers, eps, owners, weights = synthetic_components(m, 10, n_true=m // 100, overlap=1.0)
    start = time.perf_counter()
    step = server_step(centers, eps, owners, weights)
    seconds = time.perf_counter() - start
    tracemalloc.start()  # a second run for the peak: tracemalloc slows numpy's allocations
    server_step(centers, eps, owners, weights)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"components": m, "seconds": seconds, "peak_mib": peak / 2**20, "super_clusters": step.n_super_clusters}


def bench_rfica_aggregation(k: int = 10_000, r: int = 10) -> dict[str, Any]:
    """RF-ICA's server aggregation over ``k`` noisy, permuted, sign-flipped copies of one mixing matrix."""
    from fedica.data.ica_paper import ica_true_mixing
    from fedica.rfica.aggregation import rf_ica_aggregate

    truth = ica_true_mixing(r=r, orthogonal=True, seed=0)
    rng = np.random.default_rng(1)
    estimates = np.stack([truth[:, rng.permutation(r)] * rng.choice([-1, 1], r) + rng.normal(scale=0.02, size=(r, r))
                          for _ in range(k)])
    start = time.perf_counter()
    rf_ica_aggregate(estimates, np.full(k, 5000), random_state=0)
    return {"sites": k, "r": r, "seconds": time.perf_counter() - start}


def bench_scale(repeats: int) -> dict[str, Any]:
    """All of the module docstring's measurements, once each (``repeats`` is not used: every run takes minutes)."""
    del repeats
    return {
        "central_gmm_G1000": central_gmm_run(FEDGEM_THOUSAND),
        "fedgem_G1000_inprocess_fixed": child_run(FEDGEM_THOUSAND + ["engine=inprocess", "algorithm.upsilon=1.0"]),
        "fedgem_G1000_inprocess": child_run(FEDGEM_THOUSAND + ["engine=inprocess"]),
        "fedgem_G1000_simulation": child_run(FEDGEM_THOUSAND + ["engine=simulation"]),
        "server_step_1M_components": bench_server_step_million(),
        "rfica_K10000_aggregation": bench_rfica_aggregation(),
        "rfica_K10000_inprocess": child_run(RFICA_TEN_THOUSAND + ["engine=inprocess"]),
    }


def scale_headline(scale: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """The scale benchmark's headline numbers: (quantity, value, unit)."""
    rows = []
    for key in ("central_gmm_G1000", "fedgem_G1000_inprocess_fixed", "fedgem_G1000_inprocess", "fedgem_G1000_simulation",
                "rfica_K10000_inprocess"):
        run = scale.get(key, {})
        rows += [(f"scale: {key}, wall time", run.get("wall_s"), "s"), (f"scale: {key}, peak memory", run.get("peak_rss_gib"), "GiB")]
    yardstick = scale.get("central_gmm_G1000", {}).get("wall_s")
    for key in ("fedgem_G1000_inprocess_fixed", "fedgem_G1000_inprocess", "fedgem_G1000_simulation"):
        wall = scale.get(key, {}).get("wall_s")
        if yardstick and wall is not None:
            rows.append((f"scale: {key} / central GMM, wall", wall / yardstick, "x"))
    rows.append(("scale: server step, 1,000,000 components", scale.get("server_step_1M_components", {}).get("seconds"), "s"))
    rows.append(("scale: RF-ICA aggregation, K=10,000", scale.get("rfica_K10000_aggregation", {}).get("seconds"), "s"))
    return rows
