"""``fedica-bench --only recordings``: RF-ICA against pooled FastICA and pooled Picard on EEG-like recordings.

Each workload is ``scenario=recordings`` (fedica/data/recordings.py) with six sites of 1,000 to 5,000
samples (5,000 to 10,000 for 64 channels), ``A*`` of condition number 10, in three conditions:
``clean`` (no poor site), ``noisy`` (one site of six with noise at 3 channel standard deviations: issue
23's case), ``faulty`` (one site with a dead channel, one with a saturated channel), ``unequal`` (each source 10
times louder or softer from site to site, ``strength_spread=10``: issue 45's trial) and ``unequal+noisy`` (the
same with one noisy site). On every seed:

- ``rfica``: :class:`fedica.RFICA` with the library's defaults on all sites, and on the clean sites only;
- ``fastica``: scikit-learn's ``FastICA(n_components=n_sources)`` (its defaults) on the pooled data;
- ``picard``: ``picard.picard(n_components=n_sources, ortho=True)`` (Picard-O, the mode MNE uses for
  ``method="picard"`` with ``fit_params=dict(ortho=True)``) on the pooled data;

each on all sites and on the clean sites, scored by :func:`fedica.evaluation.ica.ica_error` (after
scaling the estimate's columns to unit norm) and :func:`fedica.evaluation.ica.amari_index`.

A workload the installed fedica cannot run is skipped with its reason, found by trying: with fewer
sources than channels RF-ICA needs ``RFICA(n_components=...)``, which older fedica lacks (TypeError),
or which may give a mixing of another shape than ``A*``'s.
"""

from __future__ import annotations

import statistics
import time
import warnings
from typing import Any

import numpy as np

# (name, n_channels, n_sources, min_samples, max_samples)
SIZES = (
    ("4ch/4src", 4, 4, 1000, 5000),
    ("16ch/4src", 16, 4, 1000, 5000),
    ("16ch/8src", 16, 8, 1000, 5000),
    # 20 sources need more samples per site for any local ICA to have a chance.
    ("64ch/20src", 64, 20, 5000, 10000),
)
CONDITIONS = {
    "clean": {"n_noisy": 0, "dead_channel": False, "saturated_channel": False},
    "noisy": {"n_noisy": 1, "dead_channel": False, "saturated_channel": False},
    "faulty": {"n_noisy": 0, "dead_channel": True, "saturated_channel": True},
    # Issue 45's trial: each source 10 times louder or softer from site to site (subjects and sessions differ).
    "unequal": {"n_noisy": 0, "dead_channel": False, "saturated_channel": False, "strength_spread": 10.0},
    "unequal+noisy": {"n_noisy": 1, "dead_channel": False, "saturated_channel": False, "strength_spread": 10.0},
}
BASE = {"name": "recordings", "n_clients": 6, "sampling_rate": 250.0, "condition_number": 10.0,
        "sensor_noise": 0.02, "noise_level": 3.0, "line_frequency": 50, "strength_spread": 1.0}
# Issue 45's trial with real speech (scenario.source_kind=speech, the speech extra): eight sites, each a stretch of
# 1 to 3 s of the same recordings at 8 kHz, every source 10 times louder or softer from site to site, A* of condition
# number 20, sensor noise at 3 % of each channel's deviation, poor sites at 2 sd of noise and a dead channel.
SPEECH_BASE = {"name": "recordings", "source_kind": "speech", "n_clients": 8, "sampling_rate": 8000.0,
               "min_samples": 8000, "max_samples": 24000, "condition_number": 20.0, "sensor_noise": 0.03,
               "noise_level": 2.0, "line_frequency": 50, "strength_spread": 10.0, "saturated_channel": False}
# (name, condition, the scenario's other keys): the rows of the table.
SPEECH_WORKLOADS = (
    ("6ch/6src", "clean", {"n_channels": 6, "n_sources": 6, "n_noisy": 0, "dead_channel": False}),
    ("6ch/6src", "noisy+dead", {"n_channels": 6, "n_sources": 6, "n_noisy": 1, "dead_channel": True}),
    ("16ch/6src", "noisy+dead", {"n_channels": 16, "n_sources": 6, "n_noisy": 1, "dead_channel": True}),
    ("16ch/8src", "2noisy+dead", {"n_channels": 16, "n_sources": 8, "n_noisy": 2, "dead_channel": True}),
)
METHODS = ("rfica", "fastica", "picard")
DEFAULT_SEEDS = 3


def workload(size: tuple, condition: str) -> dict[str, Any]:
    """The ``scenario`` section of one workload."""
    _, n_channels, n_sources, min_samples, max_samples = size
    return {**BASE, "n_channels": n_channels, "n_sources": n_sources, "min_samples": min_samples,
            "max_samples": max_samples, **CONDITIONS[condition]}


def _rfica(sites: list[np.ndarray], n_channels: int, n_sources: int, seed: int) -> np.ndarray:
    """RF-ICA's mixing, shape (n_channels, n_components); raises TypeError when the installed fedica cannot
    take fewer sources than channels."""
    from fedica import RFICA

    options = {} if n_channels == n_sources else {"n_components": n_sources}
    return RFICA(random_state=seed, **options).fit([Y.T for Y in sites]).mixing_


def _fastica(sites: list[np.ndarray], n_sources: int, seed: int) -> np.ndarray:
    from sklearn.decomposition import FastICA

    return FastICA(n_components=n_sources, whiten="unit-variance", max_iter=1000,
                   random_state=seed).fit(np.hstack(sites).T).mixing_


def _picard(sites: list[np.ndarray], n_sources: int, seed: int) -> np.ndarray:
    # python-picard is the benchmark's own requirement, imported only here so the module imports without it.
    from picard import picard

    whitening, rotation, _ = picard(np.hstack(sites), n_components=n_sources, ortho=True, max_iter=1000,
                                    random_state=seed)
    return np.linalg.pinv(rotation @ whitening)


def score(mixing: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """``error`` (on unit-norm columns) and ``amari`` of one mixing estimate against ``A*``."""
    from fedica.evaluation.ica import amari_index, ica_error

    return {"error": ica_error(mixing / np.linalg.norm(mixing, axis=0), truth), "amari": amari_index(mixing, truth)}


def run_one(scenario: dict[str, Any], seed: int) -> dict[str, Any]:
    """Every method on all sites and on the clean ones, for one seed: scores, seconds, skip reasons."""
    from fedica.data.scenarios import ica_poor_sites, ica_scenario_data, ica_scenario_truth

    truth = ica_scenario_truth(scenario, seed)
    sites = [ica_scenario_data(scenario, g, seed) for g in range(scenario["n_clients"])]
    poor = sorted(g for members in ica_poor_sites(scenario, seed).values() for g in members)
    clean = [Y for g, Y in enumerate(sites) if g not in poor]
    n_channels, n_sources = truth.shape
    fits = {
        "rfica": lambda data: _rfica(data, n_channels, n_sources, seed),
        "fastica": lambda data: _fastica(data, n_sources, seed),
        "picard": lambda data: _picard(data, n_sources, seed),
    }
    outcome: dict[str, Any] = {"seed": seed, "poor_sites": poor, "n_samples": [int(Y.shape[1]) for Y in sites]}
    for method, fit in fits.items():
        for subset, data in (("all", sites), ("clean", clean)):
            key = f"{method}/{subset}"
            if subset == "clean" and not poor:  # no poor site: the clean sites are all sites
                outcome[key] = outcome[f"{method}/all"]
                continue
            start = time.perf_counter()
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    mixing = fit(data)
            except TypeError as err:
                if method != "rfica":
                    raise
                # The installed fedica lacks the parameter this workload needs (n_components).
                outcome[key] = {"skipped": f"{type(err).__name__}: {err}"}
                continue
            if mixing.shape != truth.shape:
                outcome[key] = {"skipped": f"returned a {mixing.shape[0]}x{mixing.shape[1]} mixing for a "
                                           f"{truth.shape[0]}x{truth.shape[1]} A*"}
                continue
            outcome[key] = {**score(mixing, truth), "seconds": time.perf_counter() - start,
                            "warnings": sorted({type(w.message).__name__ for w in caught})}
    return outcome


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median error and Amari index of every method and subset over the seeds, and RF-ICA's ratio to the
    pooled FastICA on the clean sites in every seed (issue 23's target: at most 1.5)."""
    summary: dict[str, Any] = {}
    for method in METHODS:
        for subset in ("all", "clean"):
            key = f"{method}/{subset}"
            scored = [run[key] for run in runs if "error" in run[key]]
            if not scored:
                summary[key] = {"skipped": runs[0][key].get("skipped")}
                continue
            summary[key] = {"median_error": statistics.median(s["error"] for s in scored),
                            "median_amari": statistics.median(s["amari"] for s in scored),
                            "max_error": max(s["error"] for s in scored), "seeds": len(scored)}
    ratios = [run["rfica/all"]["error"] / run["fastica/clean"]["error"] for run in runs
              if "error" in run["rfica/all"] and "error" in run["fastica/clean"]]
    summary["rfica_all_over_fastica_clean"] = ratios
    return summary


def bench_recordings(seeds: int = DEFAULT_SEEDS) -> dict[str, Any]:
    """The whole grid: every size and condition, ``seeds`` seeds (0, 1, ...) each."""
    print(table_header(), flush=True)
    rows = []
    for size in SIZES:
        for condition in CONDITIONS:
            scenario = workload(size, condition)
            runs = [run_one(scenario, seed) for seed in range(seeds)]
            rows.append({"workload": size[0], "condition": condition, "scenario": scenario, "runs": runs,
                         "summary": summarise(runs)})
            print(format_row(rows[-1]), flush=True)
    return {"seeds": seeds, "rows": rows}


def bench_speech(seeds: int = DEFAULT_SEEDS) -> dict[str, Any]:
    """Issue 45's trial on real speech (:data:`SPEECH_WORKLOADS`), ``seeds`` seeds (0, 1, ...) each."""
    print(table_header(), flush=True)
    rows = []
    for name, condition, keys in SPEECH_WORKLOADS:
        scenario = {**SPEECH_BASE, **keys}
        runs = [run_one(scenario, seed) for seed in range(seeds)]
        rows.append({"workload": name, "condition": condition, "scenario": scenario, "runs": runs,
                     "summary": summarise(runs)})
        print(format_row(rows[-1]), flush=True)
    return {"seeds": seeds, "rows": rows}


def format_row(row: dict[str, Any]) -> str:
    """One workload's medians: error / Amari index of every method on all and on clean sites."""
    cells = []
    for method in METHODS:
        for subset in ("all", "clean"):
            entry = row["summary"][f"{method}/{subset}"]
            cells.append(f"{'skipped':>13}" if "skipped" in entry
                         else f"{entry['median_error']:6.3f}/{entry['median_amari']:.3f}")
    line = f"{row['workload']:<11} {row['condition']:<11} " + " ".join(f"{cell:>13}" for cell in cells)
    skipped = {row["summary"][f"{method}/all"].get("skipped") for method in METHODS} - {None}
    return "\n".join([line, *(f"{'':<20}skipped: {reason}" for reason in sorted(skipped))])


def table_header() -> str:
    columns = [f"{method}/{subset}" for method in METHODS for subset in ("all", "clean")]
    return (f"{'workload':<11} {'cond':<11} " + " ".join(f"{c:>13}" for c in columns)
            + "\n(each cell: median error / median Amari index over the seeds)")


def recordings_headline(report: dict[str, Any]) -> list[tuple[str, float, str]]:
    """The headline numbers (quantity, value, unit): every workload's median errors and Amari indices."""
    rows = []
    for row in report.get("rows", []):
        where = f"recordings: {row['workload']} {row['condition']}"
        for key, entry in row["summary"].items():
            if isinstance(entry, dict) and "median_error" in entry:
                rows.append((f"{where}, {key} error", entry["median_error"], ""))
                rows.append((f"{where}, {key} Amari", entry["median_amari"], ""))
        ratios = row["summary"]["rfica_all_over_fastica_clean"]
        if ratios:
            rows.append((f"{where}, RF-ICA / clean pooled FastICA, worst seed", max(ratios), "x"))
    return rows
