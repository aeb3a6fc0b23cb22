"""benchmarks/dp_kmeans.py: diffprivlib's central DP k-means on the privacy experiment's data."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

# Not importorskip: importing diffprivlib's package fails under scikit-learn 1.9 (the script says why).
pytestmark = pytest.mark.skipif(importlib.util.find_spec("diffprivlib") is None, reason="diffprivlib not installed")

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "dp_kmeans.py"
_spec = importlib.util.spec_from_file_location("dp_kmeans_benchmark", SCRIPT)
dp_kmeans = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dp_kmeans)

from fedica.data.scenarios import scenario_client_data  # noqa: E402

SMALL = {"name": "blobs", "n_clients": 4, "n_clusters": 3, "dim": 2, "r_min": 6.0, "n_train": 1200, "n_test": 400}


def _clients(seed=0):
    return [scenario_client_data(SMALL, g, seed) for g in range(SMALL["n_clients"])]


def test_the_experiment_sweeps_every_epsilon_of_the_issue_and_the_script_reads_them():
    cfg = dp_kmeans.experiment_config()
    assert dp_kmeans.sweep_epsilons(cfg) == [0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, None]
    assert cfg["scenario"]["n_clients"] == 100 and cfg["scenario"]["n_train"] == 100_000
    assert cfg["algorithm"]["dp_delta"] == 1e-5


def test_the_diffprivlib_model_gets_the_bounds_from_the_clip_and_adds_noise():
    KMeans = dp_kmeans.diffprivlib_kmeans_class()
    X = np.concatenate([c.X_train for c in _clients()])
    bounds = (np.full(2, -4.0), np.full(2, 4.0))
    first = KMeans(n_clusters=3, epsilon=0.1, bounds=bounds, random_state=1).fit(X).cluster_centers_
    second = KMeans(n_clusters=3, epsilon=0.1, bounds=bounds, random_state=2).fit(X).cluster_centers_
    # The same points, two noise draws: different centres, all inside the bounds.
    assert not np.allclose(first, second)
    assert np.all(np.abs(np.concatenate([first, second])) <= 4.0)


def test_a_large_epsilon_recovers_well_separated_blobs_and_a_small_one_does_not():
    clients = _clients()
    clip = float(np.quantile(np.abs(np.concatenate([c.X_train for c in clients])), 0.99))
    loose = dp_kmeans.fit_and_score(clients, 3, 1000.0, clip, seed=0)
    tight = dp_kmeans.fit_and_score(clients, 3, 1e-4, clip, seed=0)
    plain = dp_kmeans.fit_and_score(clients, 3, None, clip, seed=0)
    assert loose["method"] == tight["method"] == "dp-kmeans" and plain["method"] == "k-means"
    assert loose["global_ari"] > 0.9 and plain["global_ari"] > 0.9
    assert tight["global_ari"] < loose["global_ari"] - 0.2


def test_summary_is_mean_and_sample_sd_per_epsilon():
    runs = [{"method": "dp-kmeans", "epsilon": 1.0, "seed": s, "k_hat": k, "global_ari": a, "local_ari": a}
            for s, (k, a) in enumerate([(9, 0.8), (11, 0.9)])]
    (row,) = dp_kmeans.summarise(runs)
    assert row["n"] == 2 and row["k_hat"] == 10.0 and row["k_hat_sd"] == pytest.approx(np.sqrt(2))
    assert row["global_ari"] == pytest.approx(0.85) and row["global_ari_sd"] == pytest.approx(np.std([0.8, 0.9], ddof=1))


@pytest.mark.parametrize("experiment, n_clients, unit", [("fedgem_privacy_client", 2000, "client"),
                                                         ("fedgem_privacy_mnist", 100, "record")])
def test_the_script_reads_the_other_privacy_workloads_and_their_epsilons(experiment, n_clients, unit):
    cfg = dp_kmeans.experiment_config(experiment=experiment)
    assert dp_kmeans.sweep_epsilons(cfg) == [0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, None]
    assert cfg["scenario"]["n_clients"] == n_clients and cfg["algorithm"]["dp_unit"] == unit
    assert cfg["algorithm"]["dp_delta"] == 1e-5
