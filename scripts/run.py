"""``fedica-run``: one configured run (or a Hydra multirun sweep) on the engine it names.

Examples
--------
    fedica-run                                            # RF-ICA, the paper's default scenario, Flower simulation
    fedica-run algorithm=fedgem scenario=blobs scenario.r_min=4 seed=3
    fedica-run engine=inprocess ...
    fedica-run -m +experiment=rfica_fig1_k                # a sweep

``fedica-run --help`` prints the help set in conf/config.yaml (``hydra.help``); ``--hydra-help`` Hydra's own.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from fedica.config import ConfigError, composition_error, validate_config
from fedica.protocol import Journal, JournalError, RunStopped
from fedica.results import (
    PARTIAL_RESULT_FILE,
    RESULT_FILE,
    format_summary,
    is_complete_result,
)

log = logging.getLogger("fedica")

# Hydra prints a composition error (several lines, exit 1) itself unless this is set, when it raises it
# instead; cli() sets it for the composition only (main() takes it back), so that it can say it in one line.
FULL_ERROR = "HYDRA_FULL_ERROR"
_full_error_by_cli = False


@hydra.main(config_path="../conf", config_name="config", version_base=None)
def main(cfg: DictConfig) -> None:
    """Validate the config, run it, write ``result.json`` and ``summary.txt`` in the Hydra output folder.

    The configuration is validated here, once, before anything starts (the engines take the
    validated dict as given); each mistake is one line on stderr, and the exit status is 2.
    """
    global _full_error_by_cli
    if _full_error_by_cli:
        # Composed: from here on Hydra reports a failure of the run as it always does.
        os.environ.pop(FULL_ERROR, None)
        _full_error_by_cli = False
    try:
        cfg_dict = validate_config(OmegaConf.to_container(cfg, resolve=True))
    except ConfigError as err:
        _refuse(err.errors)
    except OmegaConfBaseException as err:
        # OmegaConf's message (an interpolation that does not resolve) goes on with full_key etc.: its first line says it.
        _refuse([(str(err).splitlines() or [repr(err)])[0]])
    from fedica.server.app import quiet_dependency_logs

    quiet_dependency_logs()  # before the engines' imports, which bring Flower's state and its database
    from fedica.scripts.engines import run_engine
    from fedica.server.harness.outputs import write_result
    from fedica.server.harness.resume import run_folder

    # A resumed run finishes in the folder it resumes; a new one writes in Hydra's.
    out_dir = run_folder(cfg_dict, HydraConfig.get().runtime.output_dir)
    # The journal a run resumes is checked first (a foreign one is refused even where the result is complete);
    # a new run's journal is made only for a run that is not complete already (making one clears the folder's).
    journal = _journal(cfg_dict, out_dir) if cfg_dict["resume"] else None
    if is_complete_result(out_dir / RESULT_FILE):
        log.info("%s is complete; skipping this run", out_dir / RESULT_FILE)
        return
    # A deployment's ServerApp keeps its own journal; a simulation's nodes cannot be resumed (fedica.config: resume).
    if journal is None and cfg_dict["engine"]["name"] == "inprocess":
        journal = _journal(cfg_dict, out_dir)
    if journal is not None and journal.recorded:
        log.info("resuming %s: replaying its %d completed stages", out_dir, len(journal.recorded))
    try:
        result = run_engine(cfg_dict, journal)
    except JournalError as err:
        # A journal that fails a check as its stages are replayed: damaged, edited, or of other replies.
        print(f"fedica-run: the journal cannot be resumed: {err}", file=sys.stderr)
        sys.exit(2)
    except (RunStopped, KeyboardInterrupt) as err:
        if getattr(err, "partial", None) is not None:
            path = write_result(out_dir, err.partial, name=PARTIAL_RESULT_FILE)
        if isinstance(err, KeyboardInterrupt):
            raise
        print(f"fedica-run: the run stopped: {err}", file=sys.stderr)
        if err.partial is not None:
            print(f"what it had computed: {path}", file=sys.stderr)
        sys.exit(1)
    try:
        path = write_result(out_dir, result)
    except OSError as err:  # a full disk, a folder made read-only: the journal keeps every completed stage
        then = (f"its journal keeps every completed stage: free the space and run the same command with resume={out_dir}"
                if journal is not None else "free the space and run it again")
        print(f"fedica-run: cannot write the result to {out_dir}: {err.strerror or err}; {then}", file=sys.stderr)
        sys.exit(1)
    (out_dir / PARTIAL_RESULT_FILE).unlink(missing_ok=True)  # an interrupted attempt's, now superseded
    if HydraConfig.get().mode != RunMode.MULTIRUN:
        print(format_summary(result))
        print(f"result: {path}")


def _journal(cfg: dict, out_dir: Path) -> Journal:
    """The run's journal (:func:`fedica.server.harness.resume.run_journal`); one it cannot resume ends the command in one line."""
    from fedica.server.harness.resume import run_journal

    try:
        return run_journal(cfg, out_dir)
    except JournalError as err:
        _refuse([f"resume: {err}"])


def _refuse(lines: list[str]) -> NoReturn:
    """Print each configuration error on its own line and exit with status 2 (nothing has started)."""
    for line in lines:
        print(f"fedica-run: configuration error: {line}", file=sys.stderr)
    sys.exit(2)


def cli() -> None:
    """The ``fedica-run`` command: :func:`main`; a command line Hydra cannot compose (an unknown key or group
    option, a malformed override) and Ctrl-C (or SIGINT) end in one line, not a traceback."""
    global _full_error_by_cli
    # The user's own HYDRA_FULL_ERROR=1 asks for Hydra's traceback: it is left alone.
    _full_error_by_cli = os.environ.get(FULL_ERROR) != "1"
    if _full_error_by_cli:
        os.environ[FULL_ERROR] = "1"
    try:
        main()
    except (HydraException, OmegaConfBaseException) as err:
        if not _full_error_by_cli:
            raise
        _refuse([composition_error(err)])
    except KeyboardInterrupt:
        _let_children_end()
        print("fedica-run: interrupted; completed runs keep their result.json and the same command resumes a sweep; "
              "an interrupted run keeps its partial_result.json and journal, and resume=RUN_DIR goes on from its "
              "last completed stage", file=sys.stderr)
        sys.exit(130)


def _let_children_end(seconds: float = 2.0) -> None:
    """Reap the child processes Ctrl-C also reached, waiting at most ``seconds``.

    submitit_local's job controllers are children in the terminal's process group: they print
    their own interruption as they stop, and this wait lets them finish first, so that the
    interrupted line is the last thing the user reads.
    """
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)


if __name__ == "__main__":
    cli()
