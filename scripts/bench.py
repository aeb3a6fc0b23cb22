"""``fedica-bench``: the performance benchmarks (never a timed assertion in the tests).

Each benchmark reports the median of several repetitions and the machine it ran on,
and everything lands in one JSON file (default a fresh ``outputs/bench/run-<YYYYmmdd-HHMMSS>.json``
under the current folder; an existing ``--out`` is refused unless ``--force``); a table of the
headline numbers is printed at the end:

1. ``fedgem_inprocess``: FedGEM on the in-process engine, MNIST-sized synthetic workload
   (blobs, G=100 clients, 49,000 training points, d=10, K=10, T=10, R_min=4, upsilon=50,
   the value the silhouette tuning selects on this workload), against scikit-learn's
   spherical ``GaussianMixture`` on the pooled data with the same number of EM
   iterations, measured in the same run; and the same run with ``upsilon: auto``, once per
   ``upsilon_criterion`` (likelihood, the default: the candidates and the clients'
   log-likelihoods included; silhouette: the grid's aggregations and the clients' silhouettes).
2. ``fedgem_simulation``: the same run through Flower's simulation engine (Ray).
3. ``server_step``: FedGEM's server step alone at 1k, 3k, 10k, 30k, 100k components (d=10),
   KD-tree candidate search against all pairs, time, peak memory and the fitted growth exponent.
4. ``rfica``: one client's FastICA (n=5000, r=10), the server aggregation at K=100 and
   K=1000 (r=10), and the whole one-shot simulation at K=100.
5. ``recordings`` (only when named): RF-ICA against the pooled FastICA and the pooled Picard on
   EEG-like recordings (``scenario=recordings``), error and Amari index, on all sites and on the clean
   ones, ``--seeds`` seeds per workload (:mod:`fedica.scripts.bench_recordings`).

    fedica-bench                       # all of them
    fedica-bench --only server_step --repeats 5
    fedica-bench --out benchmarks/results.json --force   # replace the committed results
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
import tracemalloc
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedica.results import versions, write_json_atomic
from fedica.scripts.bench_common import synthetic_components

MNIST_SIZED = [
    "algorithm=fedgem",
    # The spheres, as the scikit-learn GaussianMixture it is compared with (table 1 of docs/PERFORMANCE.md); the
    # default covariance family (auto) is measured beside them in docs/PERFORMANCE.md, "auto as the default".
    "algorithm.covariance_type=spherical",
    "scenario=blobs",
    "scenario.n_clients=100",
    "scenario.n_clusters=10",
    "scenario.dim=10",
    "scenario.r_min=4",
    "scenario.n_train=49000",
    "scenario.n_test=21000",
    "algorithm.rounds=10",
    # The value `upsilon: auto` selects here (k_hat = K = 10): the comparison with the GMM, which
    # is told K, then runs the same EM work; the tuned run is measured as well.
    "algorithm.upsilon=50.0",
    "baselines=false",
    "log_level=WARNING",
]


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    return {
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
        "versions": versions(),
    }


def timed(function: Callable[[], Any], repeats: int) -> tuple[dict[str, float], Any]:
    """Median, min and max wall seconds of ``repeats`` calls, and the last call's return value."""
    seconds, value = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        value = function()
        seconds.append(time.perf_counter() - start)
    return {"median_s": statistics.median(seconds), "min_s": min(seconds), "max_s": max(seconds), "repeats": repeats}, value


def bench_fedgem_inprocess(repeats: int) -> dict[str, Any]:
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.mixture import GaussianMixture

    from fedica.data.scenarios import scenario_client_data

    cfg = compose_config(MNIST_SIZED + ["engine=inprocess"])
    results = []
    wall, _ = timed(lambda: results.append(run_inprocess(cfg)), repeats)
    result = results[-1]
    fits = [r["timings"]["fedgem"] for r in results]
    clients = [scenario_client_data(cfg["scenario"], p, cfg["seed"]) for p in range(cfg["scenario"]["n_clients"])]
    pooled = np.vstack([c.X_train for c in clients])
    iterations = cfg["algorithm"]["rounds"] + 1
    gmm = GaussianMixture(10, covariance_type="spherical", max_iter=iterations, tol=0.0, n_init=1, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gmm_time, _ = timed(lambda: gmm.fit(pooled), repeats)
    fedgem_fit = statistics.median(fits)
    tuned = {criterion: _tuned_run(criterion, repeats, gmm_time["median_s"]) for criterion in ("likelihood", "silhouette")}
    return {
        "workload": MNIST_SIZED,
        "run_wall": wall,
        "fedgem_fit_median_s": fedgem_fit,
        "fedgem_server_s": result["timings"]["fedgem_server"],
        "fedgem_clients_sum_s": result["timings"]["fedgem_clients_sum"],
        "central_gmm": {**gmm_time, "em_iterations": iterations, "n_points": int(pooled.shape[0])},
        "ratio_fedgem_to_gmm": fedgem_fit / gmm_time["median_s"],
        "metrics": result["metrics"]["fedgem"],
        "upsilon_auto": tuned["likelihood"],
        "upsilon_auto_silhouette": tuned["silhouette"],
    }


def _tuned_run(criterion: str, repeats: int, gmm_seconds: float) -> dict[str, Any]:
    """The MNIST-sized run with ``upsilon: auto`` chosen by ``criterion``."""
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    cfg = compose_config(MNIST_SIZED + ["engine=inprocess", "algorithm.upsilon=auto",
                                        f"algorithm.upsilon_criterion={criterion}"])
    results = []
    wall, _ = timed(lambda: results.append(run_inprocess(cfg)), repeats)
    fit = statistics.median(r["timings"]["fedgem"] for r in results)
    return {
        "run_wall": wall,
        "fedgem_fit_median_s": fit,
        "fedgem_server_s": results[-1]["timings"]["fedgem_server"],
        "fedgem_clients_sum_s": results[-1]["timings"]["fedgem_clients_sum"],
        "ratio_fedgem_to_gmm": fit / gmm_seconds,
        "metrics": results[-1]["metrics"]["fedgem"],
    }


def bench_fedgem_simulation(repeats: int, inprocess_wall: float | None) -> dict[str, Any]:
    from fedica.scripts.engines import run_engine
    from fedica.server.app import compose_config

    cfg = compose_config(MNIST_SIZED + ["engine=simulation"])
    wall, result = timed(lambda: run_engine(cfg), repeats)
    return {
        "run_wall": wall,
        "overhead_ratio_to_inprocess": wall["median_s"] / inprocess_wall if inprocess_wall else None,
        "metrics": result["metrics"]["fedgem"],
    }


def _all_pairs_candidates(centers: np.ndarray, radii: np.ndarray, owners: np.ndarray) -> int:
    """All-pairs overlap test (the authors' approach, vectorised), in row blocks to bound memory."""
    count = 0
    for start in range(0, centers.shape[0], 256):
        block = slice(start, start + 256)
        distances = np.linalg.norm(centers[block, None, :] - centers[None, :, :], axis=2)
        overlap = (distances <= radii[block, None] + radii[None, :]) & (owners[block, None] != owners[None, :])
        count += int(np.count_nonzero(overlap))
    return count // 2


def bench_server_step(
    repeats: int, sizes: Sequence[int] = (1_000, 3_000, 10_000, 30_000, 100_000)
) -> dict[str, Any]:
    from fedica.fedgem.merging import server_step
    from fedica.fedgem.overlaps import candidate_pairs

    rows = []
    for m, workload in [(m, w) for w in ("fixed_K", "fixed_density") for m in sizes]:
        if workload == "fixed_K":
            centers, eps, owners, weights = synthetic_components(m, 10, n_true=10)
        else:
            centers, eps, owners, weights = synthetic_components(m, 10, n_true=max(10, m // 100), overlap=1.0)
        radii = np.sqrt(eps)
        kd, (pairs, _) = timed(lambda: candidate_pairs(centers, radii, owners, algorithm="kd_tree"), repeats)
        step, result = timed(lambda: server_step(centers, eps, owners, weights), repeats)
        tracemalloc.start()
        server_step(centers, eps, owners, weights)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        row = {
            "workload": workload,
            "components": m,
            "kdtree_candidates": kd,
            "server_step": step,
            "server_step_peak_mib": peak / 2**20,
            "overlapping_pairs": int(pairs.shape[0]),
            "super_clusters": result.n_super_clusters,
        }
        if m <= 20_000 and workload == "fixed_K":
            row["all_pairs_candidates"], _ = timed(lambda: _all_pairs_candidates(centers, radii, owners), 1)
        else:
            row["all_pairs_candidates"] = "not run (quadratic; timed on the fixed_K workload up to 20k components)"
        rows.append(row)
        print(f"  server step, {workload}, {m} components: {step['median_s']:.3f} s, peak {peak / 2**20:.1f} MiB", flush=True)
    return {"d": 10, "growth": _growth(rows), "workloads": {
        "fixed_K": "10 true clusters, radii 0.02-0.06 (overlap 0.4): members per cluster grow with m (G grows, K "
        "fixed), and overlapping pairs grow quadratically",
        "fixed_density": "m/100 true clusters of 100 members each, radii 0.05-0.15 (overlap 1.0): about 0.45 m "
        "overlapping pairs, a third of the components merge",
    }, "rows": rows}


def _growth(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per workload, the exponent ``a`` of a least-squares fit ``seconds ~ m^a`` of the server step,
    next to the same fit of ``m log m`` over the same sizes (what "close to n log n" means here)."""
    growth = {}
    for workload in sorted({row["workload"] for row in rows}):
        chosen = [row for row in rows if row["workload"] == workload]
        if len(chosen) < 2:
            continue
        m = np.array([row["components"] for row in chosen], dtype=float)
        seconds = np.array([row["server_step"]["median_s"] for row in chosen])
        growth[workload] = {
            "server_step_exponent": float(np.polyfit(np.log(m), np.log(seconds), 1)[0]),
            "m_log_m_exponent": float(np.polyfit(np.log(m), np.log(m * np.log(m)), 1)[0]),
            "overlapping_pairs": [row["overlapping_pairs"] for row in chosen],
        }
    return growth


def bench_rfica(repeats: int) -> dict[str, Any]:
    from fedica.scripts.engines import run_engine
    from fedica.server.app import compose_config

    from fedica.data.ica_paper import ica_client_data, ica_true_mixing
    from fedica.rfica.aggregation import rf_ica_aggregate
    from fedica.rfica.local import local_fastica

    data = ica_client_data(0, n_clients=1, r=10, corrupt_ratio=0.0, n_normal=5000, n_corrupt=5000,
                               sparsity=0.1, orthogonal=True, seed=0)
    local, _ = timed(lambda: local_fastica(data, random_state=0), repeats)
    truth = ica_true_mixing(r=10, orthogonal=True, seed=0)
    rng = np.random.default_rng(1)
    out = {"local_fastica_n5000_r10": local}
    for k in (100, 1000):
        estimates = np.stack([truth[:, rng.permutation(10)] * rng.choice([-1, 1], 10) + rng.normal(scale=0.02, size=(10, 10))
                              for _ in range(k)])
        agg, _ = timed(lambda: rf_ica_aggregate(estimates, np.full(k, 5000), random_state=0), repeats)
        out[f"server_aggregation_K{k}_r10"] = agg
    cfg = compose_config(["scenario.n_clients=100", "scenario.r=10", "engine=simulation", "log_level=WARNING"])
    out["simulation_K100_r10"], result = timed(lambda: run_engine(cfg), 1)
    out["simulation_K100_r10"]["errors"] = {k: v["error"] for k, v in result["metrics"].items()}
    return out


def plot_server_scaling(report: dict[str, Any], out: Path) -> None:
    """Log-log plot of the server step time against the number of components, with n log n for reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["server_step"]["rows"]
    fig, ax = plt.subplots(figsize=(5.6, 3.8))
    for workload, marker in (("fixed_K", "o"), ("fixed_density", "s")):
        chosen = [row for row in rows if row["workload"] == workload]
        if chosen:
            ax.loglog([row["components"] for row in chosen], [row["server_step"]["median_s"] for row in chosen],
                      marker + "-", label=f"server step, {workload.replace('_', ' ')}")
    brute = [(row["components"], row["all_pairs_candidates"]["median_s"]) for row in rows if isinstance(row["all_pairs_candidates"], dict)]
    if brute:
        ax.loglog(*zip(*brute), "^--", label="all-pairs candidate search alone")
    density = [row for row in rows if row["workload"] == "fixed_density"] or rows
    m = np.array([row["components"] for row in density], dtype=float)
    step = np.array([row["server_step"]["median_s"] for row in density])
    reference = m * np.log(m)
    ax.loglog(m, reference * step[0] / reference[0], ":", color="grey", label="n log n (scaled)")
    ax.set_xlabel("components (d = 10)")
    ax.set_ylabel("seconds (median)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


BENCHMARKS = ("fedgem_inprocess", "fedgem_simulation", "server_step", "rfica", "scale", "recordings", "speech")
# ``scale`` takes about a quarter of an hour, ``recordings`` and ``speech`` compare accuracy rather than speed: they
# run only when named.
DEFAULT_BENCHMARKS = BENCHMARKS[:4]

DESCRIPTION = """\
fedica's performance benchmarks. Each number is the median of --repeats runs; the numbers,
the machine and the package versions go to one JSON file, and a table of the headline
numbers is printed at the end.

benchmarks (--only):
  fedgem_inprocess   FedGEM, in-process engine, MNIST-sized blobs (G=100, 49,000 points,
                     d=10, K=10, T=10), against scikit-learn's GaussianMixture on the
                     pooled data; also with upsilon: auto (likelihood and silhouette)
  fedgem_simulation  the same FedGEM run through Flower's simulation engine (Ray)
  server_step        FedGEM's server step alone at 1k to 100k components (d=10)
  rfica              one client's FastICA, the RF-ICA server aggregation at K=100 and
                     K=1000, and the whole RF-ICA simulation at K=100
  scale              thousands of clients (only when named): FedGEM with G=1,000 in-process
                     (upsilon fixed and auto) and through Flower's simulation, each beside
                     scikit-learn's spherical GaussianMixture told K on the pooled points (a
                     whole process too: the ratio is the headline), its server step at
                     1,000,000 components, RF-ICA with K=10,000 sites (aggregation and whole run)
  recordings         accuracy (only when named): RF-ICA, pooled FastICA and pooled Picard on
                     EEG-like recordings (4 to 64 channels; clean, one noisy site, a dead and a
                     saturated channel), error and Amari index, all sites and clean sites;
                     --seeds seeds each (needs python-picard)
  speech             accuracy (only when named): the same on issue 45's trial, real speech
                     (eSpeak NG's voices, the speech extra) over eight sites, sources 10 times
                     louder or softer from site to site, noisy sites and a dead channel

The default set (all but scale) takes several minutes."""

EPILOG = """\
examples:
  fedica-bench                                      # all but scale, into outputs/bench/run-<time>.json
  fedica-bench --only scale                         # thousands of clients (about 15 minutes)
  fedica-bench --only server_step --repeats 5
  fedica-bench --only rfica --repeats 1 --out rfica.json
  fedica-bench --only recordings --seeds 10 --out benchmarks/recordings.json --force
  fedica-bench --only speech --seeds 10 --out benchmarks/speech.json --force
  fedica-bench --repeats 5 --out benchmarks/results.json --force   # replace the committed results"""


def default_out(now: time.struct_time | None = None, folder: Path = Path("outputs") / "bench") -> Path:
    """A file name that does not exist yet: ``outputs/bench/run-<YYYYmmdd-HHMMSS>.json`` (then ``-2``, ``-3``...)."""
    stem = "run-" + time.strftime("%Y%m%d-%H%M%S", now or time.localtime())
    path, n = folder / f"{stem}.json", 1
    while path.exists():
        n += 1
        path = folder / f"{stem}-{n}.json"
    return path


def output_path(out: str | None, force: bool) -> Path:
    """Where the results go; ``FileExistsError`` if ``out`` exists and ``force`` is not set."""
    if out is None:
        return default_out()
    path = Path(out)
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists; pass --force to overwrite it, or choose another --out")
    return path


def headline(report: dict[str, Any]) -> list[tuple[str, float, str]]:
    """The headline numbers of a report: (quantity, value, unit), in the order they were measured."""
    rows: list[tuple[str, float, str]] = []

    def add(name: str, value: Any, unit: str) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            rows.append((name, float(value), unit))

    if "fedgem_inprocess" in report:
        r = report["fedgem_inprocess"]
        add("fedgem_inprocess: run wall time", r.get("run_wall", {}).get("median_s"), "s")
        add("fedgem_inprocess: FedGEM fit", r.get("fedgem_fit_median_s"), "s")
        add("fedgem_inprocess: FedGEM server", r.get("fedgem_server_s"), "s")
        add("fedgem_inprocess: FedGEM clients (sum)", r.get("fedgem_clients_sum_s"), "s")
        add("fedgem_inprocess: central GMM fit", r.get("central_gmm", {}).get("median_s"), "s")
        add("fedgem_inprocess: FedGEM / GMM", r.get("ratio_fedgem_to_gmm"), "x")
        for key, label in (("upsilon_auto", "upsilon auto (likelihood)"), ("upsilon_auto_silhouette", "upsilon auto (silhouette)")):
            if key in r:
                add(f"fedgem_inprocess: {label} fit", r[key].get("fedgem_fit_median_s"), "s")
                add(f"fedgem_inprocess: {label} / GMM", r[key].get("ratio_fedgem_to_gmm"), "x")
    if "fedgem_simulation" in report:
        r = report["fedgem_simulation"]
        add("fedgem_simulation: run wall time", r.get("run_wall", {}).get("median_s"), "s")
        add("fedgem_simulation: overhead over in-process", r.get("overhead_ratio_to_inprocess"), "x")
    if "server_step" in report:
        r = report["server_step"]
        for row in r.get("rows", []):
            where = f"server_step: {row['workload']}, {row['components']} components"
            add(f"{where}, time", row["server_step"]["median_s"], "s")
            add(f"{where}, peak memory", row.get("server_step_peak_mib"), "MiB")
            if isinstance(row.get("all_pairs_candidates"), dict):
                add(f"{where}, all-pairs search", row["all_pairs_candidates"]["median_s"], "s")
        for workload, growth in r.get("growth", {}).items():
            add(f"server_step: {workload}, growth exponent (m log m: {growth['m_log_m_exponent']:.2f})",
                growth["server_step_exponent"], "")
    if "rfica" in report:
        labels = {
            "local_fastica_n5000_r10": "rfica: one client's FastICA (n=5000, r=10)",
            "server_aggregation_K100_r10": "rfica: server aggregation (K=100, r=10)",
            "server_aggregation_K1000_r10": "rfica: server aggregation (K=1000, r=10)",
            "simulation_K100_r10": "rfica: whole simulation (K=100, r=10)",
        }
        for key, label in labels.items():
            if key in report["rfica"]:
                add(label, report["rfica"][key].get("median_s"), "s")
    for benchmark in ("recordings", "speech"):
        if benchmark in report:
            from fedica.scripts.bench_recordings import recordings_headline

            for name, value, unit in recordings_headline(report[benchmark]):
                add(name.replace("recordings:", f"{benchmark}:", 1), value, unit)
    if "scale" in report:
        from fedica.scripts.bench_scale import scale_headline

        for name, value, unit in scale_headline(report["scale"]):
            add(name, value, unit)
    return rows


def format_table(report: dict[str, Any]) -> str:
    """The headline numbers, one line per quantity: name, value, unit (medians of the repetitions)."""
    rows = headline(report)
    if not rows:
        return "(no numbers)"
    width = max(len(name) for name, _, _ in rows)
    lines = [f"{'quantity':<{width}}  {'value':>10}  unit", "-" * (width + 18)]
    for name, value, unit in rows:
        shown = f"{value:.3f}" if abs(value) < 1e5 else f"{value:.3g}"
        lines.append(f"{name:<{width}}  {shown:>10}  {unit}".rstrip())
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedica-bench", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", metavar="FILE",
                        help="JSON file for the results (default: a new outputs/bench/run-<YYYYmmdd-HHMMSS>.json "
                        "under the current folder); an existing file is refused unless --force")
    parser.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    parser.add_argument("--repeats", type=int, default=3, metavar="N",
                        help="repetitions per measurement, the median is reported (default: 3)")
    parser.add_argument("--only", action="append", choices=BENCHMARKS, metavar="NAME",
                        help="run only this benchmark (repeatable): " + ", ".join(BENCHMARKS) + " (default: all but scale)")
    parser.add_argument("--seeds", type=int, default=3, metavar="N",
                        help="data seeds per workload of the recordings benchmark (default: 3; 10 for the issue's targets)")
    parser.add_argument("--figure", metavar="PNG",
                        help="also draw the server step's scaling to this PNG (needs the server_step benchmark)")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    try:
        path = output_path(args.out, args.force)
    except FileExistsError as err:
        parser.error(str(err))
    chosen = args.only or list(DEFAULT_BENCHMARKS)
    report: dict[str, Any] = {"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    inprocess_wall = None
    for name in chosen:
        print(f"benchmark {name} ...", flush=True)
        if name == "fedgem_inprocess":
            report[name] = bench_fedgem_inprocess(args.repeats)
            inprocess_wall = report[name]["run_wall"]["median_s"]
        elif name == "fedgem_simulation":
            report[name] = bench_fedgem_simulation(1, inprocess_wall)
        elif name == "server_step":
            report[name] = bench_server_step(args.repeats)
        elif name == "scale":
            from fedica.scripts.bench_scale import bench_scale

            report[name] = bench_scale(args.repeats)
        elif name == "recordings":
            from fedica.scripts.bench_recordings import bench_recordings

            report[name] = bench_recordings(args.seeds)
        elif name == "speech":
            from fedica.scripts.bench_recordings import bench_speech

            report[name] = bench_speech(args.seeds)
        else:
            report[name] = bench_rfica(args.repeats)
        write_json_atomic(path, report)
    report["machine"]["load_average_end"] = os.getloadavg()
    write_json_atomic(path, report)
    print()
    print(format_table(report))
    print(f"-> {path}")
    if args.figure and "server_step" in report:
        plot_server_scaling(report, Path(args.figure))
        print(f"-> {args.figure}")


if __name__ == "__main__":
    main()
