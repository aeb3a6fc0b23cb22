"""fedica-plot on small fake sweeps: it finds the swept keys, never averages different settings,
gives n per point and says what ± is, and skips unreadable results with a warning."""

import json

import numpy as np
import pytest
import yaml
from fedica.scripts import plot
from fedica.server.app import CONF_DIR
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from fedica.config import validate_config
from fedica.results import write_json_atomic


def real_config(experiment, overrides):
    """The config a real run of ``+experiment=<experiment> <overrides>`` writes into its result."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=[f"+experiment={experiment}", *overrides])
    return validate_config(OmegaConf.to_container(cfg, resolve=True))


def write_run(sweep, overrides, metrics, timings, experiment="fedgem_scalability"):
    """One run folder as a sweep writes it: ``<overrides>/.hydra/config.yaml`` and ``result.json``."""
    config = real_config(experiment, overrides)
    folder = sweep / ",".join(sorted(overrides))
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    write_json_atomic(folder / "result.json", {"config": config, "seed": config["seed"], "metrics": metrics, "timings": timings})
    return folder


def scalability_run(sweep, seed, **scenario):
    """A fedgem_scalability run whose fitting time is n_train / 1000 + the seed / 10 seconds."""
    overrides = [f"scenario.{key}={value}" for key, value in scenario.items()] + [f"seed={seed}"]
    n_train = scenario.get("n_train", 2500)
    return write_run(sweep, overrides, {"fedgem": {"global_ari": 0.9}}, {"fedgem": n_train / 1000 + seed / 10})


def run_plot(capsys, sweep, *args):
    plot.main([str(sweep), *args])
    out = capsys.readouterr()
    return out.out, out.err, (sweep / "table.md").read_text()


def test_the_swept_key_is_the_x_axis_when_plot_x_was_not_swept(tmp_path, capsys):
    # The sweep: n_train swept at d=15, while the experiment's plot.x is scenario.dim.
    for n_train in (2500, 12500):
        for seed in range(3):
            scalability_run(tmp_path, seed, dim=15, n_train=n_train)
    out, _, table = run_plot(capsys, tmp_path, "--no-figure")
    assert "fedica-plot: x axis: scenario.n_train, the one key swept besides the seed; the experiment's plot.x, scenario.dim, is 15 in every run" in out
    assert "| scenario.n_train | fedgem |" in table
    sd = np.std([0.0, 0.1, 0.2], ddof=1)
    assert f"| 2500 | 2.6 ± {sd:.2g} (n=3) |" in table
    assert f"| 12500 | 12.6 ± {sd:.2g} (n=3) |" in table
    assert table in out  # the table is printed, too


def test_keys_swept_besides_plot_x_split_the_methods_into_lines(tmp_path, capsys):
    for dim in (5, 25):
        for n_train in (2500, 12500):
            for seed in range(2):
                scalability_run(tmp_path, seed, dim=dim, n_train=n_train)
    out, _, table = run_plot(capsys, tmp_path, "--out", str(tmp_path / "fig.png"))
    assert "fedica-plot: also swept: scenario.n_train: one line per value (--x KEY chooses the x axis)" in out
    assert "| scenario.dim | fedgem (n_train=2500) | fedgem (n_train=12500) |" in table
    assert "| 5 | 2.55 ± 0.071 (n=2) | 12.6 ± 0.071 (n=2) |" in table
    assert (tmp_path / "fig.png").stat().st_size > 1000


def test_several_swept_keys_and_no_swept_plot_x_is_refused_in_one_line(tmp_path, capsys):
    for n_train in (2500, 12500):
        for n_clusters in (5, 25):
            scalability_run(tmp_path, 0, dim=15, n_train=n_train, n_clusters=n_clusters)
    with pytest.raises(SystemExit) as refused:
        plot.main([str(tmp_path), "--no-figure"])
    message = str(refused.value)
    assert message == (
        "fedica-plot: the runs differ in scenario.n_clusters, scenario.n_train besides the seed; "
        "choose the x axis with --x KEY (each other key then splits the methods into lines)"
    )
    assert not (tmp_path / "table.md").exists()

    out, _, table = run_plot(capsys, tmp_path, "--no-figure", "--x", "scenario.n_train")
    assert "also swept: scenario.n_clusters" in out
    assert "| scenario.n_train | fedgem (n_clusters=5) | fedgem (n_clusters=25) |" in table


def test_keys_swept_in_step_are_one_setting(tmp_path, capsys):
    # fedgem_scal_g: n_clients and n_train = 1000 * n_clients change together.
    for g in (5, 25):
        for seed in range(2):
            scalability_run(tmp_path, seed, dim=15, n_clients=g, n_train=1000 * g)
    out, _, table = run_plot(capsys, tmp_path, "--no-figure")
    assert "x axis: scenario.n_clients, the one key swept besides the seed (swept in step with scenario.n_train)" in out
    assert "| scenario.n_clients | fedgem |" in table
    assert table.count("(n=2)") == 2


def test_a_swept_config_group_is_told_apart_by_plot_x(tmp_path, capsys):
    # fedgem_tables sweeps scenario=waveform,digits: many scenario keys differ, all with scenario.name.
    for scenario in ("waveform", "digits"):
        for seed in range(2):
            metrics = {method: {"local_ari": 0.5 + seed / 10, "global_ari": 0.6, "k_hat": 3} for method in ("fedgem", "central-gmm")}
            write_run(tmp_path, [f"scenario={scenario}", f"seed={seed}"], metrics, {}, experiment="fedgem_tables")
    out, _, table = run_plot(capsys, tmp_path)
    assert "also swept" not in out and "x axis:" not in out
    assert "| scenario.name | fedgem | central-gmm |" in table
    assert "| digits | 0.55 ± 0.071 (n=2) | 0.55 ± 0.071 (n=2) |" in table
    assert not (tmp_path / "figure.png").exists()  # the experiment is table_only


def test_the_experiments_panels_account_for_their_swept_key(tmp_path, capsys):
    # fedgem_sensitivity: x = scenario.r_min, one column of panels per scenario.setting.
    for setting in ("nominal", "client_imbalance"):
        for r_min in (1, 2):
            for seed in range(2):
                metrics = {"fedgem": {"local_ari": r_min + seed}, "central-gmm": {"local_ari": 2 * r_min}}
                overrides = [f"scenario.setting={setting}", f"scenario.r_min={r_min}", f"seed={seed}"]
                write_run(tmp_path, overrides, metrics, {}, experiment="fedgem_sensitivity")
    out, _, table = run_plot(capsys, tmp_path, "--out", str(tmp_path / "fig.png"), "--metric", "local_ari")
    assert "also swept" not in out and "x axis:" not in out
    assert "**local_ari**, scenario.setting = nominal (mean ± sd over n seeds)" in table
    assert "| scenario.r_min | fedgem | central-gmm |" in table
    assert table.count("| 2 | 2.5 ± 0.71 (n=2) | 4 ± 0 (n=2) |") == 2
    with pytest.raises(SystemExit, match=r"^fedica-plot: no values of error for fedgem, central-gmm in these runs$"):
        plot.main([str(tmp_path), "--metric", "error"])


def test_one_seed_per_point_says_n_1_and_no_plus_minus_0(tmp_path, capsys):
    for n_train in (2500, 12500):
        scalability_run(tmp_path, 0, dim=15, n_train=n_train)
    _, _, table = run_plot(capsys, tmp_path, "--out", str(tmp_path / "fig.png"))
    assert "| 2500 | 2.5 (n=1) |" in table
    assert "±" not in table.replace("mean ± sd", "")


def test_tables_and_figures_say_what_plus_minus_and_the_error_bars_are(tmp_path, capsys):
    for seed in range(3):
        scalability_run(tmp_path, seed, dim=15, n_train=2500)
    scalability_run(tmp_path, 0, dim=15, n_train=12500)
    _, _, table = run_plot(capsys, tmp_path, "--no-figure")
    assert table.startswith("**seconds** (mean ± sd over n seeds)\n")
    runs = plot.load_runs(tmp_path)
    spec = {"metrics": ["seconds"]}
    layout = plot.choose_layout(runs, spec, "scenario.n_train")
    caption = plot.spread_note(plot.summarise(runs, spec, layout))
    assert caption == "mean ± 1 sd, n = 1 to 3 seeds per point (no bar at n = 1)"


def test_corrupt_and_missing_results_are_skipped_with_one_line_each(tmp_path, capsys):
    for seed in range(4):
        scalability_run(tmp_path, seed, dim=15, n_train=2500)
    truncated = tmp_path / "scenario.dim=15,scenario.n_train=2500,seed=1" / "result.json"
    truncated.write_text(truncated.read_text()[:50])
    no_config = tmp_path / "scenario.dim=15,scenario.n_train=2500,seed=2" / "result.json"
    no_config.write_text(json.dumps({"metrics": {}, "timings": {}}))
    unfinished = tmp_path / "scenario.dim=15,scenario.n_train=2500,seed=3"
    (unfinished / "result.json").unlink()
    _, err, table = run_plot(capsys, tmp_path, "--no-figure")
    lines = err.splitlines()
    assert len(lines) == 3, err
    assert f"fedica-plot: warning: skipped {truncated}: not readable JSON" in lines[0]
    assert lines[1] == f"fedica-plot: warning: skipped {no_config}: incomplete result (no config)"
    assert lines[2] == f"fedica-plot: warning: skipped {unfinished}: no result.json (the run failed or has not finished)"
    assert "| 15 | 2.5 (n=1) |" in table  # only seed 0 is left


def test_a_key_swept_over_null_and_a_name_is_drawn_as_labels(tmp_path, capsys):
    # A sweep of algorithm.standardize=null,federated: matplotlib's categorical axis takes no None (it raised).
    for standardize in ("null", "federated"):
        for seed in range(2):
            write_run(tmp_path, [f"algorithm.standardize={standardize}", f"seed={seed}"],
                      {"fedgem": {"global_ari": 0.2 if standardize == "null" else 0.9}}, {"fedgem": 1.0})
    out, _, table = run_plot(capsys, tmp_path, "--metric", "global_ari")
    assert "x axis: algorithm.standardize" in out
    assert "| None | 0.2 ± 0 (n=2) |" in table and "| federated | 0.9 ± 0 (n=2) |" in table
    assert (tmp_path / "figure.png").stat().st_size > 0
    assert plot.axis_values([None, "federated"]) == ["null", "federated"]
    assert plot.axis_values([0.5, 2]) == [0.5, 2] and plot.axis_values([None, 0.5]) == [None, 0.5]


def test_a_cell_keeps_large_means_in_their_units_so_that_close_criteria_differ():
    # Two mixtures' BICs on the same points (the yardstick's pooled_bic) differ by a few units in thousands.
    assert plot.cell(plot.Point(7439.24, 1.1, 2)) == "7439.2 ± 1.1 (n=2)"
    assert plot.cell(plot.Point(7439.31, 1.2, 2)) == "7439.3 ± 1.2 (n=2)"
    assert plot.cell(plot.Point(-26342.94, None, 1)) == "-26342.9 (n=1)"
    assert plot.cell(plot.Point(0.031, 0.0042, 20)) == "0.031 ± 0.0042 (n=20)"
