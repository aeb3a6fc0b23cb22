"""RF-ICA's local solver and contrast, measured (docs/RESULTS.md, "The sites' solver and contrast").

Two workloads, 10 data seeds each, every combination of ``local_solver`` (fastica, picard) and
``contrast`` (cube, logcosh), all other parameters the library's defaults:

- ``honest``: 8 sites x 3,000 samples of 4 Laplace sources, a Gaussian mixing with unit columns;
- ``noisy_site``: 4 sources (sine, square, sawtooth, Laplace), 4 channels, a non-orthogonal mixing
  of condition number 9 to 10, six sites of 1,000 to 5,000 samples, one of them (drawn by the
  seed) with Gaussian noise at 3 times each channel's standard deviation.

Beside them, pooled FastICA (scikit-learn's default logcosh) on all sites' samples and, for the
noisy workload, on the five clean sites only. Each row is an error of docs/ALGORITHMS.md
section 1.6 against the true mixing with unit columns. Run from the repository root::

    PYTHONPATH=. python benchmarks/rfica_local_solver.py [--seeds 10] [--out benchmarks/rfica_local_solver.json]
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import numpy as np
from sklearn.decomposition import FastICA

import fedica  # run with PYTHONPATH=. from the repository root, so that this is the checkout's fedica
from fedica.evaluation.ica import ica_error
from fedica.rfica.local import normalize_columns

CONFIGS = [(solver, contrast) for solver in ("fastica", "picard") for contrast in ("cube", "logcosh")]


def honest_sites(seed: int):
    rng = np.random.default_rng([seed, 1])
    mixing = normalize_columns(rng.standard_normal((4, 4)))
    return [rng.laplace(size=(3000, 4)) @ mixing.T for _ in range(8)], mixing, None


def noisy_site_sites(seed: int):
    rng = np.random.default_rng([seed, 2])
    while True:  # a non-orthogonal mixing of condition number about 9.5
        mixing = normalize_columns(rng.standard_normal((4, 4)))
        if 9.0 <= np.linalg.cond(mixing) <= 10.0:
            break
    sizes = np.linspace(1000, 5000, 6).astype(int)
    noisy = int(rng.integers(6))
    sites = []
    for g, n in enumerate(sizes):
        t = np.arange(n) + rng.uniform(0, 1000)
        phase = t * rng.uniform(0.01, 0.05, 3)[:, None]
        sources = np.vstack([np.sin(2 * np.pi * phase[0]), np.sign(np.sin(2 * np.pi * phase[1])),
                             2 * (phase[2] % 1) - 1, rng.laplace(size=n)])
        sources /= sources.std(axis=1, keepdims=True)
        X = sources.T @ mixing.T
        if g == noisy:
            X = X + 3 * X.std(axis=0) * rng.standard_normal(X.shape)
        sites.append(X)
    return sites, mixing, noisy


def pooled_fastica(sites, mixing, seed):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ica = FastICA(n_components=mixing.shape[1], whiten="unit-variance", random_state=seed, max_iter=1000)
        ica.fit(np.vstack(sites))
    return ica_error(normalize_columns(ica.mixing_), mixing)


def measure(n_seeds: int) -> dict:
    out = {}
    for name, workload in (("honest", honest_sites), ("noisy_site", noisy_site_sites)):
        rows = {f"{s}/{c}": [] for s, c in CONFIGS}
        unconverged = {key: 0 for key in rows}
        seconds = {key: 0.0 for key in rows}
        pooled, pooled_clean = [], []
        for seed in range(n_seeds):
            sites, mixing, noisy = workload(seed)
            pooled.append(pooled_fastica(sites, mixing, seed))
            if noisy is not None:
                pooled_clean.append(pooled_fastica([X for g, X in enumerate(sites) if g != noisy], mixing, seed))
            for solver, contrast in CONFIGS:
                key = f"{solver}/{contrast}"
                started = time.perf_counter()
                model = fedica.RFICA(local_solver=solver, contrast=contrast, random_state=seed).fit(sites)
                seconds[key] += time.perf_counter() - started
                rows[key].append(ica_error(model.mixing_, mixing))
                unconverged[key] += int(np.sum(~model.site_converged_))
        out[name] = {"rf-ica": rows, "unconverged_sites": unconverged, "fit_seconds": seconds,
                     "pooled-fastica": pooled, **({"pooled-fastica-clean": pooled_clean} if pooled_clean else {})}
    return out


def summary(result: dict) -> str:
    lines = []
    for name, entry in result.items():
        lines.append(f"{name}: median [min, max] over {len(entry['pooled-fastica'])} seeds")
        for key, errors in entry["rf-ica"].items():
            e = np.asarray(errors)
            lines.append(f"  rf-ica {key:16s} {np.median(e):.3f} [{e.min():.3f}, {e.max():.3f}]  "
                         f"errors > 0.5: {int(np.sum(e > 0.5))}  unconverged sites: {entry['unconverged_sites'][key]}  "
                         f"{entry['fit_seconds'][key]:.1f} s")
        for key in ("pooled-fastica", "pooled-fastica-clean"):
            if key in entry:
                e = np.asarray(entry[key])
                lines.append(f"  {key:23s} {np.median(e):.3f} [{e.min():.3f}, {e.max():.3f}]")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--out", default="benchmarks/rfica_local_solver.json")
    args = parser.parse_args()
    result = measure(args.seeds)
    with open(args.out, "w") as handle:
        json.dump(result, handle, indent=1)
    print(summary(result))


if __name__ == "__main__":
    main()
