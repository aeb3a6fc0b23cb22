"""fedica's ServerApp, and the one function every engine drives: :func:`run_federation`.

Under ``flwr run .`` the scenario is chosen with the same Hydra configs as
``fedica-run``: the run-config key ``overrides`` holds Hydra overrides (for example
``flwr run . -c "overrides='algorithm=fedgem scenario=blobs seed=3'"``) that the
ServerApp composes with Hydra's compose API; ``out-dir`` names the folder for
``result.json`` (default: ``$FEDICA_OUT`` or ``./outputs/flwr/<time>``, relative
to the SuperLink's working directory).
"""

from __future__ import annotations

import logging
import os
import shlex
import time
import warnings
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from fedica.server.federation import Federation
from fedica.server.fedgem import run_fedgem, write_site_labels
from fedica.server.records import config_to_json
from fedica.server.rfica import run_rfica
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from sklearn.exceptions import ConvergenceWarning

from fedica.attacks import hostile_clients
from fedica.config import client_count, validate_config
from fedica.protocol import RunStopped
from fedica.results import (
    PARTIAL_RESULT_FILE,
    RESULT_FILE,
    SUMMARY_FILE,
    format_summary,
    versions,
    write_json_atomic,
)

log = logging.getLogger("fedica.server")

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"

_RUNNERS = {"rfica": run_rfica, "fedgem": run_fedgem}


def run_federation(grid: Grid, cfg: Mapping[str, Any], bound_partitions: Mapping[int, int] | None = None) -> dict[str, Any]:
    """Run the configured algorithm over ``grid`` and assemble the result (docs/INTERFACE.md section 3).

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        Any Grid: Flower's simulation or deployment runtime, or the in-process one.
    cfg : mapping
        The validated run configuration (what :func:`fedica.config.validate_config` returned).
    bound_partitions : mapping of node id to partition id, optional
        Who is who, from a source the nodes cannot forge (see :class:`Federation`).

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
        hostile_partitions=hostile_clients(expected, cfg["attack"], seed=int(cfg["seed"])),
        bound_partitions=None if bound_partitions is None else dict(bound_partitions),
        scenario_name=str(cfg["scenario"].get("name", "")))
    header = {
        "algorithm": cfg["algorithm"]["name"],
        "scenario": dict(cfg["scenario"]),
        "engine": cfg["engine"]["name"],
        "seed": cfg["seed"],
        "config": dict(cfg),
        "versions": versions(),
        "history": federation.history,
    }
    # Recorded under the filters in force (ResourceWarnings, say, stay ignored), so that none reaches the terminal.
    with warnings.catch_warnings(record=True) as caught:
        try:
            partial = _RUNNERS[cfg["algorithm"]["name"]](federation, cfg)
        except RunStopped as err:
            # Nothing already computed is lost: the caller writes this as partial_result.json.
            err.partial = {
                **header,
                "status": f"stopped: {err}",
                "clients": federation.clients_record(0),
                "participation": federation.participation,
                "timings": {"total": time.perf_counter() - start},
                "warnings": count_warnings(caught),
            }
            raise
    partial["timings"]["total"] = time.perf_counter() - start
    return {**header, **partial, "warnings": count_warnings(caught)}


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


def write_result(out_dir: str | os.PathLike, result: Mapping[str, Any], *, name: str = RESULT_FILE) -> Path:
    """Write ``result.json`` (atomically; or ``name``) and ``summary.txt`` into ``out_dir``."""
    out_dir = Path(out_dir)
    labels = write_site_labels(result, out_dir) if name == RESULT_FILE else []
    if labels:
        result = {**result, "fedgem": {**result["fedgem"], "labels_files": labels}}
    path = write_json_atomic(out_dir / name, result)
    (out_dir / SUMMARY_FILE).write_text(format_summary(result) + "\n")
    return path


def compose_config(overrides: list[str]) -> dict[str, Any]:
    """Compose the Hydra config from ``conf/`` with command-line style overrides, resolved to plain dicts."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
    cfg_dict = OmegaConf.to_container(cfg, resolve=True)
    cfg_dict.pop("hydra", None)
    return cfg_dict


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point under ``flwr run``: compose the config from the run config, run, write the result."""
    configure_logging()
    overrides = shlex.split(str(context.run_config.get("overrides", "")))
    cfg = validate_config(compose_config(overrides))
    out_dir = str(context.run_config.get("out-dir", "")) or os.environ.get("FEDICA_OUT") or str(
        Path("outputs") / "flwr" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    )
    try:
        result = run_federation(grid, cfg, bound_partitions=parse_node_partitions(str(context.run_config.get("node-partitions", ""))))
    except RunStopped as err:
        write_result(out_dir, err.partial, name=PARTIAL_RESULT_FILE)
        raise
    path = write_result(out_dir, result)
    log.info("%s\nresult: %s", format_summary(result), path.resolve())


def parse_node_partitions(text: str) -> dict[int, int] | None:
    """The run config's ``node-partitions`` ("node-id:partition-id,..." from fedica-deploy's launcher); None if empty."""
    if not text.strip():
        return None
    try:
        pairs = [item.split(":") for item in text.split(",")]
        return {int(node): int(partition) for node, partition in pairs}
    except ValueError as err:
        raise ValueError(f"run config node-partitions={text!r} is not 'node-id:partition-id,...'") from err


def configure_logging(level: str = "INFO") -> None:
    """fedica's own log lines at ``level``, each once; Flower's, Ray's and the database's kept to warnings."""
    fedica_log = logging.getLogger("fedica")
    fedica_log.setLevel(level)
    # Under Hydra the root logger already prints (and writes the run's log file); elsewhere fedica brings its own handler.
    if not logging.getLogger().handlers and not fedica_log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s %(levelname)s %(name)s] %(message)s", "%H:%M:%S"))
        fedica_log.addHandler(handler)
    # Flower has its own handler; propagating would print its lines twice under Hydra.
    flwr_log = logging.getLogger("flwr")
    flwr_log.setLevel(logging.WARNING)
    flwr_log.propagate = False
    for noisy in ("alembic", "sqlalchemy", "ray"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
