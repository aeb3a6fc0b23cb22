"""``fedica-plot``: turn a sweep's result JSONs into a figure (PNG) and a markdown table.

Every run of a sweep wrote ``result.json`` with its full config; the experiment config's
``plot`` section says what to draw: ``x`` (a dotted config key), ``metrics`` (one row
of panels each), optional ``panels`` (a config key: one column of panels per value),
``series`` (a config key whose values split each method into separate lines),
``methods`` (which methods to draw; default all), ``logy``, ``logx``, ``xlabel``. The metric
``seconds`` draws each method's fitting time (``timings`` in the result).

    fedica-plot multirun/rfica_fig1_k                     # writes multirun/rfica_fig1_k/figure.png and table.md
    fedica-plot multirun/rfica_fig1_k --out docs/figures/rfica_fig1_k.png --table docs/tables/rfica_fig1_k.md
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedica.results import RESULT_FILE


def load_results(sweep_dir: str | Path) -> list[dict[str, Any]]:
    """All complete result JSONs one level below ``sweep_dir`` (one folder per run)."""
    results = []
    for path in sorted(Path(sweep_dir).glob(f"*/{RESULT_FILE}")):
        with open(path) as handle:
            results.append(json.load(handle))
    if not results:
        raise SystemExit(f"fedica-plot: no {RESULT_FILE} below {sweep_dir}")
    return results


def config_value(config: Mapping[str, Any], dotted: str) -> Any:
    """``config["a"]["b"]`` for ``"a.b"``."""
    value: Any = config
    for part in dotted.split("."):
        value = value[part]
    return value


def summarise(results: Sequence[Mapping[str, Any]], spec: Mapping[str, Any]) -> dict:
    """Mean, standard deviation and count per (panel, metric, line, x).

    Returns
    -------
    table : dict
        ``table[panel][metric][line][x] = (mean, sd, n)``.
    """
    wanted = spec.get("methods")
    samples: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(list))))
    for result in results:
        config = result["config"]
        x = config_value(config, spec["x"])
        panel = config_value(config, spec["panels"]) if spec.get("panels") else ""
        suffix = f" ({spec['series'].split('.')[-1]}={config_value(config, spec['series'])})" if spec.get("series") else ""
        for method, values in result["metrics"].items():
            if wanted and method not in wanted:
                continue
            for metric in spec["metrics"]:
                # "seconds" is the method's own fitting time, kept under timings in the result.
                value = result["timings"].get(method) if metric == "seconds" else values.get(metric)
                if value is not None:
                    samples[panel][metric][method + suffix][x].append(float(value))
    return {
        panel: {
            metric: {
                line: {x: (float(np.mean(v)), float(np.std(v, ddof=1)) if len(v) > 1 else 0.0, len(v)) for x, v in sorted(xs.items())}
                for line, xs in lines.items()
            }
            for metric, lines in metrics.items()
        }
        for panel, metrics in samples.items()
    }


def plot(table: Mapping, spec: Mapping[str, Any], out: Path, title: str) -> None:
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
                means = np.array([xs[k][0] for k in x])
                sds = np.array([xs[k][1] for k in x])
                ax.errorbar(x, means, yerr=sds, marker="o", capsize=3, label=line)
            if spec.get("logy") and metric in ("error", "seconds"):
                ax.set_yscale("log")
            if spec.get("logx"):
                ax.set_xscale("log")
            ax.set_xlabel(spec.get("xlabel", spec["x"]))
            ax.set_ylabel(metric)
            if panel != "":
                ax.set_title(f"{spec['panels'].split('.')[-1]} = {panel}")
            ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    columns = min(len(labels), 2 * len(panels))
    legend_rows = -(-len(labels) // columns)
    fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=8, frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.22 * legend_rows / (3.3 * len(metrics)), 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def markdown(table: Mapping, spec: Mapping[str, Any]) -> str:
    """Markdown tables: one per (panel, metric), rows = x values, columns = methods, cells mean ± sd."""
    blocks = []
    for panel, metrics in table.items():
        for metric, lines in metrics.items():
            names = list(lines)
            xs = sorted({x for values in lines.values() for x in values}, key=lambda v: (str(type(v)), v))
            heading = f"**{metric}**" + (f", {spec['panels']} = {panel}" if panel != "" else "")
            rows = [heading, "", f"| {spec['x']} | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
            for x in xs:
                cells = []
                for name in names:
                    if x in lines[name]:
                        mean, sd, n = lines[name][x]
                        cells.append(f"{mean:.3g} ± {sd:.2g}")
                    else:
                        cells.append("")
                rows.append(f"| {x} | " + " | ".join(cells) + " |")
            blocks.append("\n".join(rows))
    return "\n\n".join(blocks) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="fedica-plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", help="a multirun folder holding one result.json per run")
    parser.add_argument("--out", help="PNG path (default: <sweep_dir>/figure.png)")
    parser.add_argument("--table", help="markdown path (default: <sweep_dir>/table.md)")
    parser.add_argument("--x", help="config key on the x axis (default: the experiment's plot.x)")
    parser.add_argument("--metric", action="append", help="metric to draw (repeatable; default: the experiment's)")
    parser.add_argument("--no-figure", action="store_true", help="write only the markdown table")
    args = parser.parse_args(argv)

    results = load_results(args.sweep_dir)
    spec = dict(results[0]["config"].get("plot") or {})
    if args.x:
        spec["x"] = args.x
    if args.metric:
        spec["metrics"] = args.metric
    spec.setdefault("metrics", [spec.pop("metric")] if "metric" in spec else ["error"])
    if "x" not in spec:
        raise SystemExit("fedica-plot: no x axis: pass --x KEY (the sweep's config has no plot.x)")
    table = summarise(results, spec)
    sweep_dir = Path(args.sweep_dir)
    table_path = Path(args.table) if args.table else sweep_dir / "table.md"
    table_path.parent.mkdir(parents=True, exist_ok=True)
    table_path.write_text(markdown(table, spec))
    print(f"{len(results)} runs -> {table_path}")
    if not (args.no_figure or spec.get("table_only")):
        out = Path(args.out) if args.out else sweep_dir / "figure.png"
        plot(table, spec, out, spec.get("title", sweep_dir.name))
        print(f"figure -> {out}")


if __name__ == "__main__":
    main()
