"""The benchmark helpers compute what they claim (no timing is asserted: benchmarks never gate CI)."""

import numpy as np
from fedica.scripts import bench

from fedica.fedgem.overlaps import candidate_pairs


def test_all_pairs_reference_agrees_with_the_kdtree_search():
    centers, eps, owners, _ = bench._components(2_000, 10, seed=3, overlap=2.0)
    radii = np.sqrt(eps)
    pairs, _ = candidate_pairs(centers, radii, owners)
    assert bench._all_pairs_candidates(centers, radii, owners) == len(pairs) > 1000


def test_timed_reports_median_of_repetitions():
    calls = []
    stats, value = bench.timed(lambda: calls.append(1) or len(calls), 3)
    assert value == 3 and stats["repeats"] == 3
    assert stats["min_s"] <= stats["median_s"] <= stats["max_s"]


def test_server_step_benchmark_runs_at_small_scale():
    report = bench.bench_server_step(1, sizes=(1_000,))
    row = report["rows"][0]
    assert row["components"] == 1_000 and 10 <= row["super_clusters"] <= 1_000
    assert row["server_step_peak_mib"] > 0
    centers, eps, owners, _ = bench._components(1_000, 10, n_true=10)
    assert row["overlapping_pairs"] == bench._all_pairs_candidates(centers, np.sqrt(eps), owners)


def test_scaling_figure_is_drawn(tmp_path):
    report = {"server_step": bench.bench_server_step(1, sizes=(1_000, 2_000))}
    bench.plot_server_scaling(report, tmp_path / "scaling.png")
    assert (tmp_path / "scaling.png").stat().st_size > 1000


def test_growth_exponent_of_a_power_law():
    rows = [
        {"workload": "w", "components": m, "server_step": {"median_s": 1e-6 * m**1.5}, "overlapping_pairs": m}
        for m in (1_000, 10_000, 100_000)
    ]
    growth = bench._growth(rows)["w"]
    assert abs(growth["server_step_exponent"] - 1.5) < 1e-9
    assert 1.0 < growth["m_log_m_exponent"] < 1.15
