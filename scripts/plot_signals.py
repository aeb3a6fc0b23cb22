"""True versus recovered sources of the ``signals`` scenario, for RF-ICA and F-ICA (a PNG).

Fits :class:`fedica.RFICA` on every site of the scenario (its defaults: conf/scenario/signals.yaml), then
unmixes one site's observations with the RF-ICA and the F-ICA aggregates. ICA recovers sources only up to
order, sign and scale, so every recovered source is matched to a true one (the signed permutation that
maximises the total |correlation|) and scaled to unit variance before it is drawn over the true one.

    python -m fedica.scripts.plot_signals                        # writes docs/figures/signals_sources.png
    python -m fedica.scripts.plot_signals --seed 3 --site 5 --out signals.png
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import linear_sum_assignment

from fedica import RFICA, conf
from fedica.data.signals import SHAPES, signals_roles, signals_site, signals_true_mixing
from fedica.evaluation.ica import ica_error

# The scenario's defaults, read from its config so that the figure shows what fedica-run runs.
SCENARIO = {key: value for key, value in
            yaml.safe_load((Path(conf.__file__).parent / "scenario" / "signals.yaml").read_text()).items()
            if key != "name"}
# The time span drawn: scikit-learn's example's [0, 8] (the sites observe [0, 40]).
WINDOW = (0.0, 8.0)


def fit_signals(seed: int = 0, **scenario) -> tuple[RFICA, np.ndarray, dict[str, float]]:
    """RF-ICA on every site of the signals scenario.

    Returns
    -------
    model : RFICA
    truth : ndarray of shape (r, r)
        A*.
    errors : dict
        ``{"rf-ica": ..., "f-ica": ..., "simple-mean": ..., "simple-median": ...}`` against A*.
    """
    params = {**SCENARIO, **scenario}
    sites = [signals_site(g, seed=seed, **params).observations.T for g in range(params["n_clients"])]
    model = RFICA(random_state=seed).fit(sites)
    truth = signals_true_mixing(r=params["r"], orthogonal=params["orthogonal"], seed=seed)
    estimates = {"rf-ica": model.mixing_, "f-ica": model.f_ica_, "simple-mean": model.simple_mean_,
                 "simple-median": model.simple_median_}
    return model, truth, {name: ica_error(A, truth) for name, A in estimates.items()}


def matched_sources(recovered: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Recovered sources reordered, sign-flipped and standardised to best match the true ones.

    Parameters
    ----------
    recovered, truth : ndarray of shape (r, n)

    Returns
    -------
    matched : ndarray of shape (r, n)
        ``matched[i]`` is the recovered source matched to ``truth[i]``, unit variance.
    correlations : ndarray of shape (r,)
        Its correlation with ``truth[i]`` (non-negative after the sign flip).
    """
    r = truth.shape[0]
    corr = np.corrcoef(recovered, truth)[:r, r:]  # corr[j, i]: recovered j against true i
    rows, cols = linear_sum_assignment(-np.abs(corr))
    matched = np.empty_like(truth)
    correlations = np.empty(r)
    for j, i in zip(rows, cols):
        sign = np.sign(corr[j, i]) or 1.0
        source = recovered[j] - recovered[j].mean()
        matched[i] = sign * source / source.std()
        correlations[i] = abs(corr[j, i])
    return matched, correlations


def plot_signals(out: str | Path, *, seed: int = 0, site: int | None = None) -> dict[str, float]:
    """Draw the true and recovered sources of one site and save the figure.

    Parameters
    ----------
    out : str or Path
        The PNG to write.
    seed : int
    site : int or None
        The site drawn; None: the first one that is neither noisy nor short.

    Returns
    -------
    errors : dict
        The methods' errors against A* (see :func:`fit_signals`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model, _, errors = fit_signals(seed)
    noisy, short = signals_roles(n_clients=SCENARIO["n_clients"], n_noisy=SCENARIO["n_noisy"],
                                 n_short=SCENARIO["n_short"], seed=seed)
    site = int(np.flatnonzero(~noisy & ~short)[0]) if site is None else site
    data = signals_site(site, seed=seed, **SCENARIO)
    shown = (data.times >= WINDOW[0]) & (data.times <= WINDOW[1])
    Y = data.observations.T
    columns = {"true sources": (data.sources, None)}
    for label, mixing in (("RF-ICA", model.mixing_), ("F-ICA", model.f_ica_)):
        recovered = ((Y - Y.mean(axis=0)) @ np.linalg.pinv(mixing).T).T
        columns[label] = matched_sources(recovered, data.sources)

    r = SCENARIO["r"]
    fig, axes = plt.subplots(r, len(columns), figsize=(11, 1.6 * r + 0.8), sharex=True, squeeze=False)
    for col, (label, (sources, correlations)) in enumerate(columns.items()):
        key = label.lower()
        title = label if correlations is None else f"{label} (error vs A* {errors[key]:.3f})"
        axes[0, col].set_title(title, fontsize=10)
        for i in range(r):
            ax = axes[i, col]
            if correlations is not None:
                ax.plot(data.times[shown], data.sources[i, shown], color="0.8", lw=2.2)
            ax.plot(data.times[shown], sources[i, shown], color=f"C{i}", lw=0.9)
            name = SHAPES[i % len(SHAPES)]
            ax.text(0.01, 0.97, name if correlations is None else f"{name}: |corr| {correlations[i]:.4f}",
                    transform=ax.transAxes, va="top", fontsize=8, bbox={"facecolor": "white", "alpha": 0.8, "lw": 0})
            ax.set_yticks([])
    for ax in axes[-1]:
        ax.set_xlabel("time")
    fig.suptitle(f"signals scenario (seed {seed}): site {site}, {SCENARIO['n_clients']} sites of which "
                 f"{SCENARIO['n_noisy']} noisy and {SCENARIO['n_short']} short; grey: true source", fontsize=10)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return errors


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/figures/signals_sources.png")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--site", type=int, default=None)
    args = parser.parse_args(argv)
    errors = plot_signals(args.out, seed=args.seed, site=args.site)
    print(", ".join(f"{name} {value:.4f}" for name, value in errors.items()))
    print(f"figure: {args.out}")


if __name__ == "__main__":
    main()
