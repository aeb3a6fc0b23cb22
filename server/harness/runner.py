"""The one function every engine drives: :func:`run_federation`, and the warnings a run counts.

``fedica-run`` (every engine), fedica's ServerApp (:mod:`fedica.server.app`) and the benchmarks
call :func:`run_federation` with a Grid and a validated config; it returns the result that
:func:`fedica.server.harness.outputs.write_result` writes (docs/INTERFACE.md section 3).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Mapping
from typing import Any

from fedica.server.federation import Federation
from fedica.server.harness.books import RunBooks
from fedica.server.harness.fedgem_run import run_fedgem
from fedica.server.harness.rfica_run import run_rfica
from fedica.server.records import config_to_json
from flwr.serverapp import Grid
from sklearn.exceptions import ConvergenceWarning

from fedica.attacks import hostile_clients
from fedica.config import client_count
from fedica.protocol import Journal, Request, RunStopped
from fedica.results import PARTIAL_RESULT_FILE, versions, write_json_atomic

log = logging.getLogger("fedica.server")

_RUNNERS = {"rfica": run_rfica, "fedgem": run_fedgem}


def run_federation(grid: Grid, cfg: Mapping[str, Any], bound_partitions: Mapping[int, int] | None = None,
                   journal: Journal | None = None) -> dict[str, Any]:
    """Run the configured algorithm over ``grid`` and assemble the result (docs/INTERFACE.md section 3).

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        Any Grid: Flower's simulation or deployment runtime, or the in-process one.
    cfg : mapping
        The validated run configuration (what :func:`fedica.config.validate_config` returned).
    bound_partitions : mapping of node id to partition id, optional
        Who is who, from a source the nodes cannot forge (see :class:`fedica.server.federation.Federation`).
    journal : fedica.protocol.Journal, optional
        The run's journal (:func:`fedica.server.harness.resume.run_journal`): every stage of every protocol
        of the run (the algorithm's, then the comparators') is recorded there, and the stages it
        already holds are replayed rather than asked.

    Returns
    -------
    result : dict
    """
    start = time.perf_counter()
    expected = client_count(cfg["scenario"])
    federation = Federation(
        grid, expected=expected, min_clients=int(cfg["min_clients"]), round_timeout=float(cfg["round_timeout"]),
        node_wait_timeout=float(cfg["node_wait_timeout"]), min_nodes=cfg.get("min_nodes"),
        common_values={"cfg": config_to_json(cfg)},
        bound_partitions=None if bound_partitions is None else dict(bound_partitions),
        scenario_name=str(cfg["scenario"].get("name", "")), journal=journal)
    books = RunBooks(hostile_partitions=hostile_clients(expected, cfg["attack"], seed=int(cfg["seed"])))
    header = {
        "algorithm": cfg["algorithm"]["name"],
        "scenario": dict(cfg["scenario"]),
        "engine": cfg["engine"]["name"],
        "seed": cfg["seed"],
        # A resumed run is the run it resumes: its result is that run's, bit for bit, config included.
        "config": {**cfg, "resume": None} if "resume" in cfg else dict(cfg),
        "versions": versions(),
        "history": books.history,
    }
    if journal is not None:
        def save_partial(journal: Journal, request: Request) -> None:
            # Rewritten after every stage: a run killed at any point leaves what it had done, and how to go on.
            write_json_atomic(journal.directory.parent / PARTIAL_RESULT_FILE, {
                **header, "clients": federation.clients_record(0), "participation": federation.participation,
                "status": f"saved after stage {journal.stages} ({request.task} {request.round_label}); unless the run "
                          f"is still going, {how_to_resume(journal)}"})

        journal.after_stage = save_partial
    # Recorded under the filters in force (ResourceWarnings, say, stay ignored), so that none reaches the terminal.
    with warnings.catch_warnings(record=True) as caught:
        try:
            partial = _RUNNERS[cfg["algorithm"]["name"]](federation, books, cfg)
        except (RunStopped, KeyboardInterrupt) as err:
            # Nothing already computed is lost: the caller writes this as partial_result.json.
            err.partial = {
                **header,
                "status": stop_status(err, journal),
                "clients": federation.clients_record(0),
                "participation": federation.participation,
                "timings": {"total": time.perf_counter() - start},
                "warnings": count_warnings(caught),
            }
            raise
    partial["timings"]["total"] = time.perf_counter() - start
    result = {**header, **partial, "warnings": count_warnings(caught)}
    left_out = left_out_warning(result.get("clients", {}))
    if left_out:
        # Said where a reader looks: the log, result.json's warnings and (as a UserWarning) the summary.
        log.warning("%s", left_out)
        result["warnings"][f"UserWarning: {left_out}"] = 1
    if journal is not None and journal.recorded:
        # The numbers are the uninterrupted run's; that this one went on from a journal is said beside them.
        result["resumed"] = {"replayed_stages": len(journal.recorded), "journal": str(journal.directory)}
    return result


def left_out_warning(clients: Mapping[str, Any]) -> str | None:
    """The warning for a result some sites are missing from (None when every site answered)."""
    expected, answered = clients.get("expected"), clients.get("answered")
    if not isinstance(expected, int) or not isinstance(answered, int) or answered >= expected:
        return None
    return (f"{expected - answered} of {expected} sites are not in the result (clients.rejected says which and why): "
            "it is the federation of the other sites")


def stop_status(err: BaseException, journal: Journal | None) -> str:
    """The ``status`` of a stopped run's partial result: why, and how to resume it if its journal holds stages."""
    why = "interrupted (Ctrl-C)" if isinstance(err, KeyboardInterrupt) else f"stopped: {err}"
    if journal is None or not journal.stages:
        return why
    return f"{why}; its journal holds {journal.stages} completed stages: {how_to_resume(journal)}"


def how_to_resume(journal: Journal) -> str:
    folder = journal.directory.parent
    return (f"the same configuration with resume={folder} (fedica-deploy: --resume {folder}) goes on from the last "
            "completed stage")


# Warnings that ordinary runs raise and that say nothing about the result: counted in result.json,
# not shown (an EM or k-means start that stops at its iteration limit is still scored like any other).
EXPECTED_WARNINGS = (ConvergenceWarning,)


def count_warnings(caught: list[warnings.WarningMessage]) -> dict[str, int]:
    """How often each warning was raised during the run (``Category: first line``); unexpected ones are logged once."""
    counts: dict[str, int] = {}
    for warning in caught:
        key = f"{warning.category.__name__}: {str(warning.message).splitlines()[0] if str(warning.message) else ''}"
        if key not in counts and not issubclass(warning.category, EXPECTED_WARNINGS):
            log.warning("%s (%s:%d)", key, warning.filename, warning.lineno)
        counts[key] = counts.get(key, 0) + 1
    expected = sum(n for w, n in counts.items() if w.split(":")[0] in {c.__name__ for c in EXPECTED_WARNINGS})
    if expected:
        log.info("%d expected warnings (%s) counted in result.json's warnings", expected,
                 ", ".join(c.__name__ for c in EXPECTED_WARNINGS))
    return counts
