"""``fedica-plot``: turn a sweep's result JSONs into a figure (PNG) and a markdown table, or draw one run.

A folder holding ``result.json`` is one run (``fedica-run``'s output folder): fedica-plot draws it
into ``run.png`` there (:mod:`fedica.scripts.plot_run`). Any other folder is a sweep.

Every run of a sweep wrote ``result.json`` with its full config; the experiment config's
``plot`` section says what to draw: ``x`` (a dotted config key), ``metrics`` (one row
of panels each), optional ``panels`` (a config key: one column of panels per value),
``series`` (a config key whose values split each method into separate lines),
``methods`` (which methods to draw; default all), ``logy``, ``logx``, ``xlabel``. The metric
``seconds`` draws each method's fitting time (``timings`` in the result).

Each point is the mean over runs whose configs differ only in the seed, never over different
settings: the keys the runs differ in are found from their configs. When ``plot.x`` was not swept,
the x axis is the one key that was (or fedica-plot asks for ``--x``); any other swept key splits
the methods into lines. Tables give mean ± standard deviation and n (seeds) per cell; error bars
are one standard deviation. Unreadable or missing result files are skipped with a warning.

    fedica-plot multirun/rfica_fig1_k                     # writes multirun/rfica_fig1_k/figure.png and table.md
    fedica-plot multirun/rfica_fig1_k --out docs/figures/rfica_fig1_k.png --table docs/tables/rfica_fig1_k.md
    fedica-plot outputs/2026-01-01/12-00-00                  # one run: writes outputs/2026-01-01/12-00-00/run.png
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from fedica.scripts.plot_run import RUN_FIGURE, plot_run
from fedica.scripts.plot_runs import Layout, Run, choose_layout, load_runs, read_result

from fedica.results import RESULT_FILE

# What a table cell is, said in the heading of every table.
SPREAD = "mean ± sd over n seeds"


class Point(NamedTuple):
    mean: float
    sd: float | None  # sample standard deviation; None for a single seed
    n: int


def summarise(runs: Sequence[Run], spec: Mapping[str, Any], layout: Layout) -> dict:
    """Mean, standard deviation and count per (panel, metric, line, x).

    Returns
    -------
    table : dict
        ``table[panel][metric][line][x] = Point(mean, sd, n)``.
    """
    wanted = spec.get("methods")
    samples: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(list))))
    # Runs in order of their lines' values, so that the lines come in that order (n_train=2500 before 12500).
    for run in sorted(runs, key=lambda r: [sort_key(r.flat.get(k)) for k in layout.series]):
        x = run.flat[layout.x]
        panel = run.flat.get(layout.panels) if layout.panels else ""
        suffix = series_label(run, layout.series)
        for method, values in run.result["metrics"].items():
            if wanted and method not in wanted:
                continue
            for metric in spec["metrics"]:
                # "seconds" is the method's own fitting time, kept under timings in the result.
                value = run.result["timings"].get(method) if metric == "seconds" else values.get(metric)
                if value is not None:
                    samples[panel][metric][method + suffix][x].append(float(value))
    return {
        panel: {
            metric: {line: {x: point(v) for x, v in sorted(xs.items(), key=lambda item: sort_key(item[0]))} for line, xs in lines.items()}
            for metric, lines in metrics.items()
        }
        for panel, metrics in samples.items()
    }


def series_label(run: Run, keys: Sequence[str]) -> str:
    """`` (init=random, n_train=400)``: the values that tell this run's line apart."""
    if not keys:
        return ""
    return " (" + ", ".join(f"{key.split('.')[-1]}={run.flat.get(key)}" for key in keys) + ")"


def point(values: Sequence[float]) -> Point:
    sd = float(np.std(values, ddof=1)) if len(values) > 1 else None
    return Point(float(np.mean(values)), sd, len(values))


def sort_key(value: Any) -> tuple[str, Any]:
    """Sort x values of mixed types (a missing key is None) without comparing across types."""
    return str(type(value)), value


def spread_note(table: Mapping) -> str:
    """The caption's account of the points and error bars, with the range of n."""
    ns = sorted({p.n for metrics in table.values() for lines in metrics.values() for xs in lines.values() for p in xs.values()})
    if ns == [1]:
        return "n = 1 seed per point: no error bars"
    if len(ns) == 1:
        return f"mean ± 1 sd, n = {ns[0]} seeds per point"
    return f"mean ± 1 sd, n = {ns[0]} to {ns[-1]} seeds per point" + (" (no bar at n = 1)" if ns[0] == 1 else "")


def plot(table: Mapping, spec: Mapping[str, Any], layout: Layout, out: Path, title: str) -> None:
    """One panel per (metric, panel value); error bars are one standard deviation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(table)
    metrics = list(spec["metrics"])
    fig, axes = plt.subplots(len(metrics), len(panels), figsize=(4.2 * len(panels), 3.3 * len(metrics) + 0.22 * 2), squeeze=False)
    for col, panel in enumerate(panels):
        for row, metric in enumerate(metrics):
            ax = axes[row][col]
            for line, xs in table[panel].get(metric, {}).items():
                x = list(xs)
                means = np.array([xs[k].mean for k in x])
                # NaN draws no bar where a single seed has no spread.
                sds = np.array([np.nan if xs[k].sd is None else xs[k].sd for k in x])
                ax.errorbar(axis_values(x), means, yerr=sds, marker="o", capsize=3, label=line)
            if spec.get("logy") and metric in ("error", "seconds"):
                ax.set_yscale("log")
            if spec.get("logx"):
                ax.set_xscale("log")
            ax.set_xlabel(x_label(spec, layout))
            ax.set_ylabel(f"{metric} (mean ± sd)")
            if panel != "":
                ax.set_title(f"{layout.panels.split('.')[-1]} = {panel}")
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    columns = min(len(labels), 2 * len(panels))
    legend_rows = -(-len(labels) // columns)
    fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=8, frameon=False)
    fig.suptitle(f"{title}\n{spread_note(table)}", fontsize=10)
    fig.tight_layout(rect=(0, 0.22 * legend_rows / (3.3 * len(metrics)), 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110, bbox_inches="tight")  # the legend below the axes stays in the picture
    plt.close(fig)


def axis_values(values: list) -> list:
    """The x values as matplotlib takes them: numbers (and None, a gap on a numeric axis, as a sweep of
    ``dp_epsilon=null,1,4`` draws) as they are; with any other value, every value a label (None as the
    config's ``null``), since a categorical axis takes strings only (a sweep of ``standardize=null,federated``)."""
    if all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values):
        return values
    return ["null" if v is None else str(v) for v in values]


def x_label(spec: Mapping[str, Any], layout: Layout) -> str:
    """The experiment's ``xlabel`` names its ``plot.x`` only: another x axis is named by its key."""
    return spec.get("xlabel", layout.x) if layout.x == spec.get("x") else layout.x


def markdown(table: Mapping, layout: Layout) -> str:
    """Markdown tables: one per (panel, metric), rows = x values, columns = lines, cells mean ± sd (n)."""
    blocks = []
    for panel, metrics in table.items():
        for metric, lines in metrics.items():
            names = list(lines)
            xs = sorted({x for values in lines.values() for x in values}, key=sort_key)
            heading = f"**{metric}**" + (f", {layout.panels} = {panel}" if panel != "" else "") + f" ({SPREAD})"
            rows = [heading, "", f"| {layout.x} | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
            for x in xs:
                rows.append(f"| {x} | " + " | ".join(cell(lines[name].get(x)) for name in names) + " |")
            blocks.append("\n".join(rows))
    return "\n\n".join(blocks) + "\n"


def cell(p: Point | None) -> str:
    """``0.031 ± 0.0042 (n=20)``; a single seed has no spread to give: ``0.031 (n=1)``. A mean of 1,000 or more keeps
    its units and a decimal (``7436.2``, not ``7.44e+03``): two methods' BICs on the same points differ by a few units."""
    if p is None:
        return ""
    mean = f"{p.mean:.1f}" if abs(p.mean) >= 1000 else f"{p.mean:.3g}"
    if p.sd is None:
        return f"{mean} (n=1)"
    return f"{mean} ± {p.sd:.2g} (n={p.n})"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fedica-plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", metavar="DIR",
                        help="a run's folder (holding result.json: draws the run) or a multirun folder holding one result.json per run")
    parser.add_argument("--out", help=f"PNG path (default: <DIR>/figure.png for a sweep, <DIR>/{RUN_FIGURE} for a run)")
    parser.add_argument("--table", help="markdown path, for a sweep (default: <DIR>/table.md)")
    parser.add_argument("--x", help="config key on the x axis (default: the experiment's plot.x if swept, else the one swept key)")
    parser.add_argument("--metric", action="append", help="metric to draw (repeatable; default: the experiment's)")
    parser.add_argument("--no-figure", action="store_true", help="write only the markdown table")
    return parser.parse_args(argv)


def plot_spec(runs: Sequence[Run], metrics: list[str] | None) -> dict[str, Any]:
    """The experiment's ``plot`` section, with ``--metric`` (or the old single ``metric``) as ``metrics``."""
    spec = dict(runs[0].result["config"].get("plot") or {})
    if metrics:
        spec["metrics"] = metrics
    spec.setdefault("metrics", [spec.pop("metric")] if "metric" in spec else ["error"])
    return spec


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if (Path(args.sweep_dir) / RESULT_FILE).is_file():
        main_run(args)
        return
    runs = load_runs(args.sweep_dir)
    spec = plot_spec(runs, args.metric)
    layout = choose_layout(runs, spec, args.x)
    for note in layout.notes:
        print(f"fedica-plot: {note}")
    table = summarise(runs, spec, layout)
    if not table:
        methods = ", ".join(spec.get("methods") or ["any method"])
        raise SystemExit(f"fedica-plot: no values of {', '.join(spec['metrics'])} for {methods} in these runs")
    sweep_dir = Path(args.sweep_dir)
    table_path = Path(args.table) if args.table else sweep_dir / "table.md"
    table_path.parent.mkdir(parents=True, exist_ok=True)
    text = markdown(table, layout)
    table_path.write_text(text)
    print(text)
    print(f"{len(runs)} runs -> {table_path}")
    if not (args.no_figure or spec.get("table_only")):
        out = Path(args.out) if args.out else sweep_dir / "figure.png"
        plot(table, spec, layout, out, spec.get("title", sweep_dir.name))
        print(f"figure -> {out}")


def main_run(args: argparse.Namespace) -> None:
    """One run's folder: its figure, into ``--out`` or ``run.png`` beside its result."""
    sweep_only = [flag for flag, given in (("--table", args.table), ("--x", args.x), ("--metric", args.metric),
                                           ("--no-figure", args.no_figure)) if given]
    if sweep_only:
        raise SystemExit(f"fedica-plot: {args.sweep_dir} is one run (it holds {RESULT_FILE}); "
                         f"{', '.join(sweep_only)} is for a sweep's folder")
    path = Path(args.sweep_dir) / RESULT_FILE
    result = read_result(path)
    if result is None:
        raise SystemExit(f"fedica-plot: cannot draw {path}")
    out = Path(args.out) if args.out else path.parent / RUN_FIGURE
    for note in plot_run(result, out):
        print(f"fedica-plot: {note}")
    print(f"figure -> {out}")


if __name__ == "__main__":
    main()
