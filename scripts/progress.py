"""A Hydra callback that shows a sweep's progress: runs done of the total, elapsed time and time left.

Experiment configs register it under ``hydra.callbacks``. It works with any launcher
(the joblib launcher runs jobs in worker processes): the total and the start time are
written once to ``<sweep dir>/.progress.json``; every job that ends counts the
``result.json`` files under the sweep folder, so a resumed sweep counts what is done.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from fedica.results import RESULT_FILE, is_complete_result

PROGRESS_FILE = ".progress.json"


def sweep_size(config: DictConfig) -> int:
    """Number of runs the basic sweeper expands the sweep into (sweeper params and command-line sweeps)."""
    params = config.hydra.sweeper.get("params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
    counts = {}
    for override in OverridesParser.create().parse_overrides(arguments):
        key = override.get_key_element()
        counts[key] = len(list(override.sweep_string_iterator())) if override.is_sweep_override() else 1
    return max(1, math.prod(counts.values()))


class SweepProgress(Callback):
    """Prints ``[sweep] done/total runs, elapsed, about T left`` after every run of a multirun."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        total = sweep_size(config)
        done = _count_complete(sweep_dir)
        (sweep_dir / PROGRESS_FILE).write_text(json.dumps({"total": total, "start": time.time(), "done_at_start": done}))
        print(f"[sweep] {total} runs into {sweep_dir} ({done} already complete: skipped)", flush=True)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        try:
            state = json.loads((sweep_dir / PROGRESS_FILE).read_text())
        except (OSError, ValueError):
            return
        done = _count_complete(sweep_dir)
        elapsed = time.time() - state["start"]
        new = done - state["done_at_start"]
        left = (state["total"] - done) * elapsed / new if new > 0 else float("nan")
        print(
            f"[sweep] {done}/{state['total']} runs done, elapsed {_duration(elapsed)}"
            + (f", about {_duration(left)} left" if left == left else ""),
            flush=True,
        )


def _count_complete(sweep_dir: Path) -> int:
    # The same test as the one that lets a resumed run skip its folder: a corrupt result.json is not a result.
    return sum(1 for path in sweep_dir.glob(f"*/{RESULT_FILE}") if is_complete_result(path))


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"

