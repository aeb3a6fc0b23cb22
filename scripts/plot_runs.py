"""The runs of a sweep for ``fedica-plot``: reading them, finding the swept keys, choosing the layout.

Two runs may be averaged only when their configs differ in nothing but the seed. A sweep's
swept keys are found by comparing the runs' configs; the x axis, the panels and the lines must
account for every one of them, so that each point is one setting over several seeds.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedica.results import RESULT_FILE

# Top-level config keys that do not make two runs different settings: the seed is what a point
# averages over, and ``plot`` only says how to draw (hydra's own keys are bookkeeping).
NOT_SETTINGS = ("seed", "plot", "hydra")
RESULT_KEYS = ("config", "metrics", "timings")


@dataclass
class Run:
    path: Path
    result: dict[str, Any]
    flat: dict[str, Any]  # dotted config key -> hashable value


@dataclass
class Layout:
    x: str
    series: list[str]  # config keys whose values split each method into lines
    panels: str | None  # config key: one column of panels per value
    notes: list[str] = field(default_factory=list)  # what fedica-plot chose, to print


def load_runs(sweep_dir: str | Path) -> list[Run]:
    """Every run folder one level below ``sweep_dir`` with a readable result; the others are named on stderr."""
    runs = []
    for folder in sorted(p for p in Path(sweep_dir).iterdir() if p.is_dir()):
        path = folder / RESULT_FILE
        if not path.exists():
            if (folder / ".hydra").is_dir():
                warn(f"skipped {folder}: no {RESULT_FILE} (the run failed or has not finished)")
            continue
        result = read_result(path)
        if result is not None:
            runs.append(Run(path, result, flatten(result["config"])))
    if not runs:
        raise SystemExit(f"fedica-plot: no readable {RESULT_FILE} below {sweep_dir}")
    return runs


def read_result(path: Path) -> dict[str, Any] | None:
    """The result JSON at ``path``, or None (with a warning) when it is corrupt or incomplete."""
    try:
        result = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        warn(f"skipped {path}: not readable JSON ({error})")
        return None
    missing = [key for key in RESULT_KEYS if not isinstance(result, dict) or key not in result]
    if missing:
        warn(f"skipped {path}: incomplete result (no {', '.join(missing)})")
        return None
    return result


def warn(message: str) -> None:
    print(f"fedica-plot: warning: {message}", file=sys.stderr)


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``, with lists as tuples so that values can be grouped on."""
    flat = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = hashable(value)
    return flat


def hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(hashable(v) for v in value)
    if isinstance(value, Mapping):
        return tuple(sorted((k, hashable(v)) for k, v in value.items()))
    return value


def varying(runs: Sequence[Run], keys: Iterable[str], within: Sequence[str] = ()) -> list[str]:
    """The keys whose value differs between two runs that agree on every key of ``within``."""
    keys = list(keys)
    values: dict = defaultdict(set)
    for run in runs:
        group = tuple(run.flat.get(k) for k in within)
        for key in keys:
            values[key, group].add(run.flat.get(key))
    differing = {key for (key, _), seen in values.items() if len(seen) > 1}
    return [key for key in keys if key in differing]


def swept_keys(runs: Sequence[Run]) -> list[str]:
    """The config keys, besides the seed, whose value is not the same in every run (in config order)."""
    keys = dict.fromkeys(key for run in runs for key in run.flat if key.split(".")[0] not in NOT_SETTINGS)
    return varying(runs, keys)


def choose_layout(runs: Sequence[Run], spec: Mapping[str, Any], x_arg: str | None = None) -> Layout:
    """The x axis, lines and panels that keep runs of different settings apart.

    The x axis is ``x_arg``, else the experiment's ``plot.x`` if it was swept, else the one key
    swept besides the panels and series. Keys swept besides those split the methods into lines.
    """
    swept = swept_keys(runs)
    given = [key for key in (spec.get("panels"), spec.get("series")) if key]
    notes = []
    x = x_arg or spec.get("x")
    free = varying(runs, swept, given)
    if not x_arg and free and x not in swept:
        x, note = only_swept_key(runs, free, given, spec.get("x"))
        notes.append(note)
    check_x(runs, x, swept)
    extra = split_keys(runs, swept, [x, *given])
    if extra:
        notes.append(f"also swept: {', '.join(extra)}: one line per value (--x KEY chooses the x axis)")
    series = [spec["series"]] if spec.get("series") else []
    return Layout(x, series + extra, spec.get("panels"), notes)


def only_swept_key(runs: Sequence[Run], free: list[str], given: list[str], planned: str | None) -> tuple[str, str]:
    """The key that alone tells the settings apart (with those swept in step with it), or refuse."""
    candidates = [key for key in free if not varying(runs, free, [key, *given])]
    if not candidates:
        raise SystemExit(
            f"fedica-plot: the runs differ in {', '.join(free)} besides the seed; choose the x axis with "
            "--x KEY (each other key then splits the methods into lines)"
        )
    x, *partners = candidates
    note = f"x axis: {x}, the one key swept besides the seed"
    if partners:
        note += f" (swept in step with {', '.join(partners)})"
    if planned:
        note += f"; the experiment's plot.x, {planned}, is {runs[0].flat.get(planned)} in every run"
    return x, note


def check_x(runs: Sequence[Run], x: str | None, swept: list[str]) -> None:
    if not x:
        raise SystemExit("fedica-plot: no x axis: pass --x KEY (the runs' config has no plot.x)")
    if not all(x in run.flat for run in runs):
        keys = ", ".join(swept) or "none besides the seed"
        raise SystemExit(f"fedica-plot: {x} is not a config value of every run (swept keys: {keys})")


def split_keys(runs: Sequence[Run], swept: list[str], by: list[str]) -> list[str]:
    """Swept keys to add to ``by`` until runs that agree on ``by`` differ only in the seed.

    One key at a time: keys swept in step with an added one (a whole scenario group) need no line of their own.
    """
    extra: list[str] = []
    while left := varying(runs, swept, [*by, *extra]):
        extra.append(left[0])
    return extra
