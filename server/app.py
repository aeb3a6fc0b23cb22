"""fedica's ServerApp ``app``: it composes the run's config, drives the harness and writes the result.

The run itself is the harness's (:func:`fedica.server.harness.runner.run_federation`, which every
engine drives, and :func:`fedica.server.harness.outputs.write_result`); they are importable from
here too, beside this module's :func:`compose_config` and :func:`configure_logging`, which the
command-line tools share.

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
from datetime import datetime
from pathlib import Path
from typing import Any

from fedica.server.harness.outputs import write_result
from fedica.server.harness.resume import run_journal
from fedica.server.harness.runner import run_federation
from fedica.server.strategy import FlowerHandOver
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedica.config import ConfigError, composition_error, validate_config
from fedica.protocol import RunStopped
from fedica.results import PARTIAL_RESULT_FILE, format_summary

log = logging.getLogger("fedica.server")

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


def compose_config(overrides: list[str]) -> dict[str, Any]:
    """Compose the Hydra config from ``conf/`` with command-line style overrides, resolved to plain dicts.

    Raises
    ------
    ConfigError
        When Hydra cannot compose the overrides (an unknown key or group option, a malformed override, an
        interpolation that does not resolve): one line, as ``fedica-run`` says it
        (:func:`fedica.config.composition_error`).
    """
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = compose(config_name="config", overrides=overrides)
        cfg_dict = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(composition_error(err)) from err
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
    # Every stage is journalled in out_dir (fedica-deploy --resume sets out-dir to the run it resumes).
    journal = run_journal(cfg, out_dir)
    try:
        result = run_federation(grid, cfg, bound_partitions=parse_node_partitions(str(context.run_config.get("node-partitions", ""))),
                                journal=journal)
    except RunStopped as err:
        write_result(out_dir, err.partial, name=PARTIAL_RESULT_FILE)
        raise
    (Path(out_dir) / PARTIAL_RESULT_FILE).unlink(missing_ok=True)  # the journal's, rewritten after every stage
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
    # A strategy started earlier in this process may have handed fedica's lines to Flower's handlers
    # (reach_flower_console); from here fedica's own handler or Hydra's prints them, once.
    for handler in [h for h in fedica_log.handlers if isinstance(h, FlowerHandOver)]:
        fedica_log.removeHandler(handler)
    # Under Hydra the root logger already prints (and writes the run's log file); elsewhere fedica brings its own handler.
    if not logging.getLogger().handlers and not fedica_log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s %(levelname)s %(name)s] %(message)s", "%H:%M:%S"))
        fedica_log.addHandler(handler)
    # Flower has its own handler; propagating would print its lines twice under Hydra.
    flwr_log = logging.getLogger("flwr")
    flwr_log.setLevel(logging.WARNING)
    flwr_log.propagate = False
    quiet_dependency_logs()


def quiet_dependency_logs() -> None:
    """The database's and Ray's log lines kept to warnings: Flower's state imports alembic, which logs a line for
    each of its plugins at INFO the moment it is imported."""
    for noisy in ("alembic", "sqlalchemy", "ray"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
