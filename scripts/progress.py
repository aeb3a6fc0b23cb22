"""A Hydra callback that shows a sweep's progress: runs done of the total, elapsed time and time left.

Experiment configs register it under ``hydra.callbacks``. It works with any launcher: the
joblib launcher runs jobs in worker processes, the submitit launchers in subprocesses or
cluster jobs whose output goes to their own log files (``<sweep dir>/.submitit/``), so a job's
own callbacks cannot reach the terminal. Instead, a thread of the process that launched the
sweep watches the sweep folder and prints a line whenever another run's ``result.json`` is
complete; it counts the files, so a resumed sweep counts what is done.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from fedica.results import RESULT_FILE, is_complete_result


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
    """Prints ``[sweep] done/total runs, elapsed, about T left`` whenever a run of a multirun completes.

    Parameters
    ----------
    poll_seconds : float, default=2.0
        How often the watcher looks at the sweep folder.
    """

    def __init__(self, poll_seconds: float = 2.0) -> None:
        self.poll_seconds = poll_seconds
        self._watch: tuple[threading.Thread, threading.Event] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Launchers pickle the callbacks into every job; the watcher belongs to the launching process.
        return {**self.__dict__, "_watch": None}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        total = sweep_size(config)
        known: set[Path] = set()
        done = _count_complete(sweep_dir, known)
        print(f"[sweep] {total} runs into {sweep_dir} ({done} already complete: skipped)", flush=True)
        stop = threading.Event()
        thread = threading.Thread(
            target=_watch, args=(sweep_dir, known, total, stop, self.poll_seconds),
            name="fedica-sweep-progress", daemon=True,
        )
        thread.start()
        self._watch = (thread, stop)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self._watch is not None:
            thread, stop = self._watch
            stop.set()
            thread.join()
            self._watch = None


def _watch(sweep_dir: Path, known: set[Path], total: int, stop: threading.Event, poll_seconds: float) -> None:
    # One last look after the stop: the run that ended the sweep gets its line too.
    start, done_at_start = time.time(), len(known)
    reported = done_at_start
    while True:
        stopping = stop.wait(poll_seconds)
        done = _count_complete(sweep_dir, known)
        if done != reported:
            reported = done
            elapsed = time.time() - start
            new = done - done_at_start
            left = f", about {_duration((total - done) * elapsed / new)} left" if new > 0 else ""
            print(f"[sweep] {done}/{total} runs done, elapsed {_duration(elapsed)}{left}", flush=True)
        if stopping:
            return


def _count_complete(sweep_dir: Path, known: set[Path] | None = None) -> int:
    """Complete ``result.json`` files one level below ``sweep_dir``.

    The same test as the one that lets a resumed run skip its folder: a corrupt result.json is not
    a result. ``known`` (updated in place) holds the files already found complete, so that a watcher
    reads each result once however long the sweep.
    """
    known = set() if known is None else known
    present = set(sweep_dir.glob(f"*/{RESULT_FILE}"))
    known &= present
    known |= {path for path in present - known if is_complete_result(path)}
    return len(known)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
