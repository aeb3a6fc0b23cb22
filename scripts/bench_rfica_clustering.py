"""RF-ICA's server clusterings, ``kmeans`` (the paper's) against ``matched``, on three workloads (issue 23, item 2).

    python -m fedica.scripts.bench_rfica_clustering                      # 10 data seeds, 5 runs of (c), (d)
    python -m fedica.scripts.bench_rfica_clustering --seeds 3 --runs 0   # quick look
    python -m fedica.scripts.bench_rfica_clustering --out benchmarks/rfica_clustering.json --force

(a) ``noisy_site``: four sources (sine, square, sawtooth, Laplace), four channels, a non-orthogonal
    mixing with unit columns and condition number 8.5 to 10.5, six sites of 1,000 to 5,000
    samples, site 0 with Gaussian noise at 3x each channel's standard deviation.
(b) ``honest``: 8 sites x 3,000 samples of four Laplace sources, the paper's orthogonal A* (r = 4).
(c) ``fig1_default``: ``fedica-run engine=inprocess`` on the paper's Fig. 1 default scenario
    (``scenario=ica_paper``: K = 30, 10 % of the sites with 300 samples, r = 5), one child run per
    seed and clustering.
(d) ``fig1_extreme``: the same at the hardest point of Fig. 1's middle and right panels at once: 40 % of
    the sites corrupted, with 50 samples each.

(a) and (b) call ``fedica.RFICA(...).fit`` with the library's other defaults (cube contrast) and data
seed = ``random_state``; the comparator is scikit-learn's FastICA (same contrast) on all sites' data
stacked (in (a) also on the clean sites only), scored like RF-ICA on its unit-column mixing. Errors
are ``fedica.evaluation.ica.ica_error`` against the true mixing.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.signal import sawtooth, square
from sklearn.decomposition import FastICA

import fedica
from fedica.data.ica_paper import make_mixing_matrix
from fedica.evaluation.ica import ica_error
from fedica.results import write_json_atomic
from fedica.rfica.aggregation import CLUSTERINGS
from fedica.scripts.bench import machine

NOISE_SD = 3.0


def noisy_site_workload(seed: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """(a): the true 4 x 4 mixing and six sites' observations, site 0 the noisy one."""
    rng = np.random.default_rng(seed)
    while True:  # a random mixing with prescribed singular values, columns then normalised
        u, _, vt = np.linalg.svd(rng.standard_normal((4, 4)))
        mixing = u @ np.diag(np.geomspace(9.5, 1.0, 4)) @ vt
        mixing /= np.linalg.norm(mixing, axis=0)
        if 8.5 < np.linalg.cond(mixing) < 10.5:
            break
    sites = []
    for g in range(6):
        n = int(rng.integers(1000, 5001))
        t = np.arange(n) / 250 + rng.uniform(0, 10)  # 250 Hz, each site its own stretch of time
        sources = np.column_stack([np.sin(2 * np.pi * 1.3 * t), square(2 * np.pi * 0.7 * t),
                                   sawtooth(2 * np.pi * 0.45 * t), rng.laplace(size=n)])
        observed = (sources - sources.mean(axis=0)) / sources.std(axis=0) @ mixing.T
        if g == 0:
            observed = observed + NOISE_SD * observed.std(axis=0) * rng.standard_normal(observed.shape)
        sites.append(observed)
    return mixing, sites


def honest_workload(seed: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """(b): the paper's orthogonal 4 x 4 A* and eight honest sites of 3,000 Laplace samples."""
    rng = np.random.default_rng(seed)
    mixing = make_mixing_matrix(4, orthogonal=True, random_state=rng)
    return mixing, [rng.laplace(size=(3000, 4)) @ mixing.T for _ in range(8)]


def pooled_fastica_error(sites: Sequence[np.ndarray], mixing: np.ndarray, seed: int) -> float:
    """scikit-learn's FastICA (cube) on the stacked sites, its mixing's columns normalised."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an unconverged pooled fit is scored as it is, like a site's
        estimate = FastICA(mixing.shape[1], fun="cube", whiten="unit-variance", max_iter=1000,
                           random_state=seed).fit(np.vstack(sites)).mixing_
    return ica_error(estimate / np.linalg.norm(estimate, axis=0), mixing)


def rfica_error(sites: Sequence[np.ndarray], mixing: np.ndarray, seed: int, clustering: str) -> float:
    return ica_error(fedica.RFICA(clustering=clustering, random_state=seed).fit(list(sites)).mixing_, mixing)


def bench_workload(workload: Callable[[int], tuple[np.ndarray, list[np.ndarray]]], seeds: int,
                   clean: slice | None) -> dict[str, Any]:
    """Per seed: RF-ICA under each clustering and the pooled FastICA (and both on the ``clean`` sites)."""
    rows = []
    for seed in range(seeds):
        mixing, sites = workload(seed)
        row: dict[str, Any] = {"seed": seed, "condition_number": float(np.linalg.cond(mixing)),
                               "pooled_fastica": pooled_fastica_error(sites, mixing, seed)}
        for clustering in CLUSTERINGS:
            row[f"rfica_{clustering}"] = rfica_error(sites, mixing, seed, clustering)
        if clean is not None:
            row["pooled_fastica_clean"] = pooled_fastica_error(sites[clean], mixing, seed)
            for clustering in CLUSTERINGS:
                row[f"rfica_{clustering}_clean"] = rfica_error(sites[clean], mixing, seed, clustering)
        rows.append(row)
        print("  " + "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
              flush=True)
    return {"per_seed": rows, "summary": summarise(rows)}


FIG1_EXTREME = ("scenario.corrupt_ratio=0.4", "scenario.n_corrupt=50")


def bench_fig1(runs: int, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """(c), (d): one ``fedica-run engine=inprocess`` per seed and clustering on ``scenario=ica_paper``."""
    from fedica.scripts.bench_scale import child_run

    rows = []
    for seed in range(runs):
        row: dict[str, Any] = {"seed": seed}
        for clustering in CLUSTERINGS:
            outcome = child_run(["engine=inprocess", "scenario=ica_paper", *overrides,
                                 f"algorithm.clustering={clustering}", f"seed={seed}", "log_level=WARNING"])
            if "metrics" not in outcome:
                raise RuntimeError(f"fedica-run failed: {outcome.get('error')}")
            row[f"rfica_{clustering}"] = outcome["metrics"]["rf-ica"]["error"]
            row[f"wall_s_{clustering}"] = outcome["wall_s"]
        rows.append(row)
        print("  " + "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()),
              flush=True)
    return {"per_seed": rows, "summary": summarise(rows)}


def summarise(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Median, min and max of every error column over the seeds."""
    columns = [k for k in rows[0] if k.startswith(("rfica", "pooled"))]
    return {k: {"median": statistics.median(r[k] for r in rows), "min": min(r[k] for r in rows),
                "max": max(r[k] for r in rows)} for k in columns}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="data seeds of (a) and (b), from 0")
    parser.add_argument("--runs", type=int, default=5, help="seeds of (c) and (d), from 0 (0: skip them)")
    parser.add_argument("--out", type=Path, default=None, help="write the report as JSON here")
    parser.add_argument("--force", action="store_true", help="replace an existing --out")
    args = parser.parse_args(argv)
    if args.out is not None and args.out.exists() and not args.force:
        parser.error(f"{args.out} exists (use --force to replace it)")
    report: dict[str, Any] = {"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    print("(a) noisy_site", flush=True)
    report["noisy_site"] = bench_workload(noisy_site_workload, args.seeds, clean=slice(1, None))
    print("(b) honest", flush=True)
    report["honest"] = bench_workload(honest_workload, args.seeds, clean=None)
    if args.runs:
        print("(c) fig1_default", flush=True)
        report["fig1_default"] = bench_fig1(args.runs)
        print("(d) fig1_extreme", flush=True)
        report["fig1_extreme"] = bench_fig1(args.runs, FIG1_EXTREME)
    for name in ("noisy_site", "honest", "fig1_default", "fig1_extreme"):
        for column, stats in report.get(name, {}).get("summary", {}).items():
            print(f"{name:13s} {column:28s} median {stats['median']:.4f}  [{stats['min']:.4f}, {stats['max']:.4f}]")
    if args.out is not None:
        write_json_atomic(args.out, report)
        print(f"-> {args.out}")


if __name__ == "__main__":
    main()
