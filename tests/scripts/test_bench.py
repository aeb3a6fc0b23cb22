"""The benchmark helpers compute what they claim (no timing is asserted: benchmarks never gate CI)."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from fedica.scripts import bench, bench_common

from fedica.fedgem.overlaps import candidate_pairs


def test_all_pairs_reference_agrees_with_the_kdtree_search():
    centers, eps, owners, _ = bench_common.synthetic_components(2_000, 10, seed=3, overlap=2.0)
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
    centers, eps, owners, _ = bench_common.synthetic_components(1_000, 10, n_true=10)
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


# The command line: readable help, a fresh default output, no silent overwrite, a table at the end.

SYNTHETIC = {
    "machine": {"cpus": 4},
    "fedgem_inprocess": {
        "run_wall": {"median_s": 1.25}, "fedgem_fit_median_s": 0.25, "fedgem_server_s": 0.125,
        "fedgem_clients_sum_s": 0.1, "central_gmm": {"median_s": 0.5}, "ratio_fedgem_to_gmm": 0.5,
        "upsilon_auto": {"fedgem_fit_median_s": 0.75, "ratio_fedgem_to_gmm": 1.5},
    },
    "fedgem_simulation": {"run_wall": {"median_s": 15.0}, "overhead_ratio_to_inprocess": None},
    "server_step": {
        "rows": [{"workload": "fixed_K", "components": 1000, "server_step": {"median_s": 0.005},
                  "server_step_peak_mib": 1.5, "all_pairs_candidates": {"median_s": 0.18}}],
        "growth": {"fixed_K": {"server_step_exponent": 1.2, "m_log_m_exponent": 1.11}},
    },
    "rfica": {"local_fastica_n5000_r10": {"median_s": 0.028}, "simulation_K100_r10": {"median_s": 9.146}},
}


def _bench_command():
    script = shutil.which("fedica-bench", path=os.path.dirname(sys.executable))
    return [script] if script else [sys.executable, "-m", "fedica.scripts.bench"]


@pytest.mark.slow
def test_help_is_plain_text_and_explains_every_option():
    done = subprocess.run([*_bench_command(), "--help"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert "``" not in text and ":func:" not in text  # no reStructuredText
    for option in ("--out", "--force", "--repeats", "--only", "--figure"):
        assert option in text
    for benchmark in bench.BENCHMARKS:
        assert benchmark in text
    # Every option has a help text: no option line stands alone.
    options = text.split("options:", 1)[1].split("examples:", 1)[0]
    for line in options.strip().splitlines():
        if line.lstrip().startswith("-"):
            assert len(line.split("  ")) > 1 and line.split("  ")[-1].strip(), line
    assert "outputs/bench/run-" in text


def test_default_output_is_a_new_file_that_never_overwrites(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    now = time.strptime("2026-01-02 03:04:05", "%Y-%m-%d %H:%M:%S")
    first = bench.default_out(now)
    assert first == Path("outputs", "bench", "run-20260102-030405.json") and not first.exists()
    first.parent.mkdir(parents=True)
    first.write_text("{}")
    second = bench.default_out(now)
    assert second != first and not second.exists() and second.name == "run-20260102-030405-2.json"
    assert re.fullmatch(r"run-\d{8}-\d{6}\.json", bench.output_path(None, force=False).name)


def _fake_rfica(repeats):
    return {"local_fastica_n5000_r10": {"median_s": 0.5, "repeats": repeats}}


def test_an_existing_out_is_refused_without_force(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "bench_rfica", _fake_rfica)
    existing = tmp_path / "results.json"
    existing.write_text('{"committed": true}')
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--only", "rfica", "--repeats", "1", "--out", str(existing)])
    assert exit_info.value.code == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert json.loads(existing.read_text()) == {"committed": True}

    bench.main(["--only", "rfica", "--repeats", "1", "--out", str(existing), "--force"])
    assert json.loads(existing.read_text())["rfica"]["local_fastica_n5000_r10"]["median_s"] == 0.5


def test_a_default_run_writes_a_fresh_file_and_prints_the_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "bench_rfica", _fake_rfica)
    monkeypatch.chdir(tmp_path)
    bench.main(["--only", "rfica", "--repeats", "1"])
    written = list((tmp_path / "outputs" / "bench").glob("run-*.json"))
    assert len(written) == 1
    out = capsys.readouterr().out
    assert re.search(r"rfica: one client's FastICA \(n=5000, r=10\) +0\.500  s\n", out)
    assert f"-> {written[0].relative_to(tmp_path)}" in out


def test_table_has_one_line_per_quantity_with_value_and_unit():
    table = bench.format_table(SYNTHETIC)
    lines = table.splitlines()
    assert lines[0].split() == ["quantity", "value", "unit"]
    body = {line.rsplit("  ", 2)[0].strip(): line for line in lines[2:]}
    assert len(lines) - 2 == len(bench.headline(SYNTHETIC)) == 15
    assert re.search(r"fedgem_inprocess: FedGEM / GMM +0\.500  x$", table, re.MULTILINE)
    assert re.search(r"fedgem_inprocess: central GMM fit +0\.500  s$", table, re.MULTILINE)
    assert re.search(r"server_step: fixed_K, 1000 components, peak memory +1\.500  MiB$", table, re.MULTILINE)
    assert re.search(r"rfica: whole simulation \(K=100, r=10\) +9\.146  s$", table, re.MULTILINE)
    # A quantity that was not measured (no in-process run to compare with) is left out, not printed as None.
    assert "None" not in table and "overhead" not in table
    assert len(body) == len(lines) - 2
    assert bench.format_table({"machine": {}}) == "(no numbers)"


@pytest.mark.slow
def test_a_child_run_reports_its_wall_time_peak_memory_and_result():
    from fedica.scripts.bench_scale import child_run, scale_headline

    run = child_run(["algorithm=fedgem", "scenario=blobs", "engine=inprocess", "baselines=false", "log_level=WARNING",
                     "algorithm.rounds=2"])
    assert run["exit_status"] == 0 and run["wall_s"] > 0
    assert run["metrics"]["fedgem"]["k_hat"] == 6
    assert 0.05 < run["peak_rss_gib"] < 8
    failed = child_run(["algorithm=fedgem", "scenario=blobs", "algorithm.rounds=-1"])
    assert failed["exit_status"] == 2 and "algorithm.rounds=-1" in failed["error"][0]
    rows = scale_headline({"fedgem_G1000_inprocess": run})
    assert ("scale: fedgem_G1000_inprocess, wall time", run["wall_s"], "s") in rows


@pytest.mark.slow
def test_the_central_gmm_yardstick_runs_as_a_whole_process_on_the_scenario_s_points():
    from fedica.scripts.bench_scale import central_gmm_run, scale_headline

    run = central_gmm_run(["algorithm=fedgem", "scenario=blobs", "scenario.n_clients=3", "scenario.n_train=600"])
    assert run["exit_status"] == 0 and run["wall_s"] > run["fit_s"] > 0
    assert run["k"] == 6 and run["points"] == 600 and 1 <= run["iterations"] <= 10
    failed = central_gmm_run(["scenario.n_clients=0"])
    assert failed["exit_status"] != 0 and failed["error"]
    fedgem = {"wall_s": 2.5 * run["wall_s"]}
    rows = scale_headline({"central_gmm_G1000": run, "fedgem_G1000_inprocess_fixed": fedgem})
    assert ("scale: fedgem_G1000_inprocess_fixed / central GMM, wall", fedgem["wall_s"] / run["wall_s"], "x") in rows


def test_the_scale_benchmark_runs_only_when_named():
    assert "scale" in bench.BENCHMARKS and "scale" not in bench.DEFAULT_BENCHMARKS
