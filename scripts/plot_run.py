"""``fedica-plot RUN_DIR``: one run's picture (``RUN_DIR/run.png``) from its ``result.json``.

FedGEM: the sites' test points coloured by global cluster, with the global centres; all sites
pooled, then one small panel per site. RF-ICA: the estimated mixing matrix (its columns matched to
A* when the result has it) beside A*, and one site's recovered sources; without A* (files), each
source beside its component's channel weights (its column of the mixing, by channel name for
recordings).

The server never sees the sites' points, so the points are made again here: a simulated scenario's
from the run's config and seed, exactly as the harness regenerates them for its silhouettes; a
``files`` scenario's from the files the config names, which are on this machine for a local engine.
Each site's points are labelled with its consensus model, as the site itself labels them. A
deployment's sites keep their data: its picture holds only what the result holds (the global
centres, the mixing matrix) and says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from fedica.scripts.plot_signals import matched_sources
from scipy.optimize import linear_sum_assignment

from fedica.data.scenarios import ica_scenario_data, scenario_client_data
from fedica.fedgem.client import result_labels

RUN_FIGURE = "run.png"
MAX_SITE_PANELS = 12
SITE_COLUMNS = 4  # site panels per row; the pooled panel takes the top-left 2 x 2 cells
MAX_SAMPLES = 1000  # the first samples of a site's recovered sources that are drawn
MAX_SOURCES = 8  # sources drawn at most, one row each
DEPLOYMENT_NOTE = "deployment: the sites keep their data; drawn is only what the result holds"


def plot_run(result: Mapping[str, Any], out: str | Path) -> list[str]:
    """Draw one run (a ``result.json`` as read) into ``out``; returns the notes printed on the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    draw = {"fedgem": fedgem_figure, "rfica": rfica_figure}.get(result["algorithm"])
    if draw is None:
        raise SystemExit(f"fedica-plot: cannot draw a run of algorithm {result['algorithm']!r}")
    fig, notes = draw(result, plt)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return notes


def run_title(result: Mapping[str, Any]) -> str:
    return f"{result['algorithm']} on {result['scenario']['name']} (engine {result['engine']}, seed {result['seed']})"


# ---------------------------------------------------------------- FedGEM


def site_points(result: Mapping[str, Any]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Every mapped site's test points and the global cluster the site gives each.

    As the harness's silhouettes: ``scenario_client_data`` regenerates (or, for files, reads and
    splits) the site's data, and each point is labelled as the site labels it (the run's
    ``labelling``: the nearest of its consensus centroids, or its own mixture over every global centre).
    """
    points = {}
    for partition, global_ids in sorted(result["fedgem"]["client_mapping"].items(), key=lambda item: int(item[0])):
        data = scenario_client_data(result["scenario"], int(partition), int(result["seed"]))
        points[int(partition)] = data.X_test, result_labels(data.X_train, data.X_test, result["fedgem"],
                                                            result["config"]["algorithm"], global_ids)
    return points


def projection(fitted_on: np.ndarray, what: str) -> tuple[Any, tuple[str, str]]:
    """A map to 2-D and its axis labels: the coordinates themselves up to 2 dimensions, else PCA fitted on ``fitted_on`` (``what``)."""
    dim = fitted_on.shape[1]
    if dim == 2:
        return (lambda X: X), ("x0", "x1")
    if dim == 1:
        return (lambda X: np.c_[X, np.zeros(len(X))]), ("x0", "(1-D data)")
    if len(fitted_on) < 2:  # one global centre: no direction to fit
        return (lambda X: X[:, :2]), ("x0", f"x1 (of d={dim})")
    from sklearn.decomposition import PCA

    pca = PCA(n_components=2).fit(fitted_on)
    share = pca.explained_variance_ratio_
    return pca.transform, tuple(f"PC{i + 1} ({100 * share[i]:.0f}% of variance; PCA of the {what}, d={dim})"
                                for i in range(2))


def cluster_colours(n_clusters: int, plt: Any) -> np.ndarray:
    """One colour per global cluster id: tab10/tab20 while they last, else evenly along a rainbow."""
    if n_clusters <= 10:
        return plt.get_cmap("tab10")(np.arange(n_clusters))
    if n_clusters <= 20:
        return plt.get_cmap("tab20")(np.arange(n_clusters))
    return plt.get_cmap("gist_rainbow")(np.linspace(0, 1, n_clusters, endpoint=False))


def fedgem_figure(result: Mapping[str, Any], plt: Any) -> tuple[Any, list[str]]:
    centroids = np.asarray(result["fedgem"]["global_centroids"], dtype=np.float64)
    colours = cluster_colours(len(centroids), plt)
    notes = []
    if result["engine"] == "deployment":
        points: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        notes.append(DEPLOYMENT_NOTE + " (the global centres)")
        to_2d, labels = projection(centroids, "global centres")
    else:
        points = site_points(result)
        to_2d, labels = projection(np.vstack([X for X, _ in points.values()]), "pooled test points")
    shown = list(points)[:MAX_SITE_PANELS]
    if len(points) > len(shown):
        notes.append(f"{len(points) - len(shown)} of {len(points)} sites not drawn in their own panel (all are pooled)")

    rows = 2 + max(0, -(-(len(shown) - 4) // SITE_COLUMNS))
    columns = SITE_COLUMNS if shown else 2  # a deployment's picture is the pooled panel alone
    fig = plt.figure(figsize=(3.2 * columns, 3.0 * rows + 0.6))
    grid = fig.add_gridspec(rows, columns)
    pooled = fig.add_subplot(grid[:2, :2])
    cells = [grid[r, c] for r in range(2) for c in range(2, columns)] + [grid[r, c] for r in range(2, rows) for c in range(columns)]
    centres = to_2d(centroids)

    def scatter(ax, X, clusters, size):
        ax.scatter(*to_2d(X).T, c=colours[clusters], s=size, alpha=0.6, linewidths=0, rasterized=True)

    for X, clusters in points.values():
        scatter(pooled, X, clusters, 5)
    pooled.scatter(*centres.T, c=colours, s=140, marker="X", edgecolors="black", linewidths=1.2, zorder=3)
    for k, (cx, cy) in enumerate(centres):
        pooled.annotate(str(k), (cx, cy), xytext=(6, 6), textcoords="offset points", fontsize=9, weight="bold")
    what = f"{len(points)} sites pooled" if points else "global centres"
    pooled.set_title(f"{what}: {len(centroids)} global clusters (X: global centre, number: its id)", fontsize=10)
    pooled.set_xlabel(labels[0], fontsize=8)
    pooled.set_ylabel(labels[1], fontsize=8)
    limits = pooled.get_xlim(), pooled.get_ylim()

    client_ari = result["fedgem"].get("client_local_ari") or {}
    for cell, partition in zip(cells, shown):
        ax = fig.add_subplot(cell)
        X, clusters = points[partition]
        scatter(ax, X, clusters, 3)
        used = np.asarray(result["fedgem"]["client_mapping"][str(partition)], dtype=np.int64)
        ax.scatter(*centres[used].T, c=colours[used], s=60, marker="X", edgecolors="black", linewidths=0.8, zorder=3)
        ari = client_ari.get(str(partition))
        ari_text = "" if ari is None else f", local ARI {ari:.3f}"
        ax.set_title(f"site {partition}: {len(X)} test points\n{len(used)} components{ari_text}", fontsize=8)
        ax.set_xlim(limits[0])
        ax.set_ylim(limits[1])
        ax.tick_params(labelsize=7)
    drawn = ": test points coloured by the global cluster of their site's consensus model" if points else ""
    fig.suptitle("\n".join([run_title(result) + drawn, *notes]), fontsize=10)
    fig.tight_layout()
    return fig, notes


# ---------------------------------------------------------------- RF-ICA


def aligned_columns(estimate: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """``estimate``'s columns reordered and sign-flipped to best match ``truth``'s, the match ``ica_error`` scores."""
    minus = np.sum((estimate[:, :, None] - truth[:, None, :]) ** 2, axis=0)
    plus = np.sum((estimate[:, :, None] + truth[:, None, :]) ** 2, axis=0)
    rows, cols = linear_sum_assignment(np.minimum(minus, plus))
    aligned = np.empty_like(estimate)
    for i, j in zip(rows, cols):
        aligned[:, j] = estimate[:, i] if minus[i, j] <= plus[i, j] else -estimate[:, i]
    return aligned


def drawn_site(rfica: Mapping[str, Any]) -> int:
    """The first answering site that the scenario made neither poor nor hostile (else the first one)."""
    avoid = set(rfica.get("corrupted_clients") or ()) | set(rfica.get("hostile_clients") or ())
    sites = list(rfica["client_partitions"])
    return next((s for s in sites if s not in avoid), sites[0])


MIXING_AXES = ("column (source)", "row (observed channel)")
UNMIXING_AXES = ("column (observed channel)", "row (source)")


def heat_map(fig: Any, ax: Any, matrix: np.ndarray, title: str, scale: float, axes: tuple[str, str],
             channel_names: list[str] | None = None) -> None:
    """``matrix`` on a diverging scale of +-``scale``; the channel axis (``axes`` says which) by name if given."""
    image = ax.imshow(matrix, cmap="RdBu_r", vmin=-scale, vmax=scale)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(axes[0], fontsize=8)
    ax.set_ylabel(axes[1], fontsize=8)
    ax.set_xticks(range(matrix.shape[1]))
    ax.set_yticks(range(matrix.shape[0]))
    if channel_names is not None:
        if axes == MIXING_AXES:
            ax.set_yticklabels(channel_names)
        else:
            ax.set_xticklabels(channel_names, rotation=90)
    ax.tick_params(labelsize=7 if channel_names is None or len(channel_names) <= 32 else 5)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)


def rfica_figure(result: Mapping[str, Any], plt: Any) -> tuple[Any, list[str]]:
    rfica = result["rfica"]
    estimate = np.asarray(rfica["estimate"], dtype=np.float64)
    truth = None if rfica.get("true_mixing") is None else np.asarray(rfica["true_mixing"], dtype=np.float64)
    error = result["metrics"].get("rf-ica", {}).get("error")
    notes = []
    site = None
    if result["engine"] == "deployment":
        notes.append(DEPLOYMENT_NOTE + " (the mixing matrix)")
    else:
        site = drawn_site(rfica)
        Y = ica_scenario_data(result["scenario"], site, int(result["seed"])).T
    r = estimate.shape[1]
    n_drawn = 0 if site is None else min(r, MAX_SOURCES)
    if n_drawn < r and site is not None:
        notes.append(f"the first {n_drawn} of {r} sources drawn")

    maps = [(estimate if truth is None else aligned_columns(estimate, truth),
             "RF-ICA estimate" + ("" if truth is None else " (columns matched to A*)"), MIXING_AXES)]
    if truth is not None:
        maps.append((truth, "true mixing A*", MIXING_AXES))
    else:  # no truth to set beside it: the unmixing that made the sources below
        maps.append((np.asarray(rfica["unmixing"], dtype=np.float64), "unmixing (its inverse; no true mixing known)",
                     UNMIXING_AXES))
    # Subfigures keep the sources' rows tight under the taller heat maps.
    fig = plt.figure(figsize=(11, 0.45 * r + 3.2 + 0.9 * n_drawn), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[0.45 * r + 2.4, 0.9 * n_drawn + 0.6]) if n_drawn else (fig, None)
    names = rfica.get("channel_names")
    shared = max(float(np.abs(m).max()) for m, _, _ in maps)
    for ax, (matrix, title, axes) in zip(top.subplots(1, 2), maps):
        # The estimate and A* on one colour scale, to compare; the unmixing on its own.
        heat_map(top, ax, matrix, title, shared if truth is not None else float(np.abs(matrix).max()), axes, names)
    if bottom is not None:
        draw_sources(bottom, Y, rfica, truth, site, n_drawn)
    error_text = "" if error is None else f", error vs A* {error:.4f}"
    fig.suptitle("\n".join([run_title(result) + error_text, *notes]), fontsize=10)
    return fig, notes


def draw_sources(fig: Any, Y: np.ndarray, rfica: Mapping[str, Any], truth: np.ndarray | None,
                 site: int, n_drawn: int) -> None:
    """One row per source: the site's recovered sources (centred as its local FastICA was), over the true ones in grey.

    ICA recovers sources up to order, sign and scale: with A*, every recovered source is matched to
    a true one (A*^-1 applied to the same observations) and drawn at unit variance over it.
    """
    centred = (Y - Y.mean(axis=0))[:MAX_SAMPLES]  # by the whole site's mean, as sources_site<g>.csv
    recovered = (centred @ np.asarray(rfica["unmixing"], dtype=np.float64).T).T
    true_sources, correlations = None, None
    if truth is not None:
        true_sources = np.linalg.solve(truth, centred.T)
        recovered, correlations = matched_sources(recovered, true_sources)
    else:
        recovered = (recovered - recovered.mean(axis=1, keepdims=True)) / recovered.std(axis=1, keepdims=True)
    samples = np.arange(centred.shape[0])
    if truth is None:
        # No A* to match to: source i is the estimate's component i, drawn beside its channel weights.
        axes = fig.subplots(n_drawn, 2, squeeze=False, width_ratios=[1, 3])
        mixing, names = np.asarray(rfica["estimate"], dtype=np.float64), rfica.get("channel_names")
        positions = scalp_positions(names)
        if positions is None:
            draw_weights(axes[:, 0], mixing, names)
        else:
            draw_topomaps(axes[:, 0], mixing, positions, rfica.get("explained_variance_ratio"))
        axes = axes[:, 1]
        for ax in axes[:-1]:
            ax.sharex(axes[-1])
            ax.tick_params(labelbottom=False)
    else:
        axes = fig.subplots(n_drawn, 1, sharex=True, squeeze=False)[:, 0]
    for i, ax in enumerate(axes):
        if true_sources is not None:
            true = true_sources[i] - true_sources[i].mean()
            ax.plot(samples, true / true.std(), color="0.75", lw=2.0, label="true source")
        ax.plot(samples, recovered[i], color=f"C{i % 10}", lw=0.8, label="recovered")
        text = f"source {i}" + ("" if correlations is None else f": |corr| with the true source {correlations[i]:.4f}")
        ax.text(0.005, 0.95, text, transform=ax.transAxes, va="top", fontsize=8,
                bbox={"facecolor": "white", "alpha": 0.8, "lw": 0})
        ax.set_yticks([])
        ax.tick_params(labelsize=7)
    ax.set_xlabel("sample", fontsize=8)
    grey = "; grey: the true source (A*^-1 x)" if true_sources is not None else ""
    fig.suptitle(f"site {site}: recovered sources unmixing @ (x - mean), the first {len(samples)} samples, "
                 f"unit variance{grey}", fontsize=9)


def scalp_positions(channel_names: list[str] | None) -> Any:
    """An ``mne.Info`` placing ``channel_names`` on the scalp by the 10-05 system's names, or None.

    None without names, without MNE (the ``eeg`` extra), or when a channel is not a 10-05 name: the
    run's result holds the channels' names only, and no position but the standard one is known.
    """
    if not channel_names:
        return None
    try:
        import mne
    except ImportError:
        return None
    montage = mne.channels.make_standard_montage("standard_1005")
    if not set(channel_names) <= set(montage.ch_names):
        return None
    info = mne.create_info(list(channel_names), sfreq=100.0, ch_types="eeg")
    info.set_montage(montage, verbose="error")
    return info


def draw_topomaps(axes: Any, mixing: np.ndarray, info: Any, shares: list[float] | None) -> None:
    """Component i's channel weights (column i of the mixing) as MNE's topomap in ``axes[i]``: an EEG user's view."""
    import mne

    for i, ax in enumerate(axes):
        mne.viz.plot_topomap(mixing[:, i], info, axes=ax, show=False, contours=0, sensors=True)
        share = "" if shares is None else f" ({100 * shares[i]:.1f} % of the variance)"
        ax.set_title(f"component {i}{share}", fontsize=7, pad=2)


def draw_weights(axes: Any, mixing: np.ndarray, channel_names: list[str] | None) -> None:
    """Component i's channel weights (column i of the mixing) as bars in ``axes[i]``, on one scale for all.

    A weight is how much of the component each channel observes, in the observations' units per unit of
    the (unit-variance) source; the channels are named when the run recorded them (recordings).
    """
    scale = 1.05 * float(np.abs(mixing).max())
    n_channels = mixing.shape[0]
    for i, ax in enumerate(axes):
        column = mixing[:, i]
        ax.bar(np.arange(n_channels), column, color=np.where(column >= 0, "C3", "C0"), width=0.8)
        ax.axhline(0.0, color="0.3", lw=0.6)
        ax.set_ylim(-scale, scale)
        ax.set_xlim(-0.6, n_channels - 0.4)
        ax.set_title(f"component {i}: channel weights", fontsize=7, pad=2)
        ax.tick_params(labelsize=6)
        last = i == len(axes) - 1
        if channel_names is not None and last:
            ax.set_xticks(np.arange(n_channels), channel_names, rotation=90, fontsize=6 if n_channels <= 32 else 4)
        elif last:
            ax.set_xlabel("channel", fontsize=8)
        else:
            ax.set_xticklabels([])
