"""The top-level keys, the ``attack`` section and the experiments' ``plot`` section."""

from __future__ import annotations

from typing import Any

from fedica.config.checker import Checker, ConfigError
from fedica.config.schema import ATTACKS_BY_ALGORITHM, LOG_LEVELS
from fedica.evaluation.baselines import BASELINE_METHODS

__all__ = ["check_top_level", "check_federation_size", "check_attack", "check_plot", "check_workload"]


def check_top_level(top: Checker) -> None:
    """The keys of ``conf/config.yaml`` that need nothing but themselves, each on its own."""
    top.each(lambda: top.integer("seed", minimum=0), lambda: top.integer("min_clients", minimum=1),
             lambda: top.seconds("round_timeout"), lambda: top.seconds("node_wait_timeout"),
             lambda: top.boolean("baselines"), lambda: top.names("baseline_methods", BASELINE_METHODS),
             lambda: top.choice("log_level", LOG_LEVELS))


def check_federation_size(top: Checker, n_clients: int) -> None:
    """``min_clients`` and ``min_nodes`` fit the scenario's ``n_clients`` (skipped if ``min_clients`` is wrong)."""
    if "min_clients" in top.broken:
        return
    if top.integer("min_clients") > n_clients:
        top.fail("min_clients", f"must be <= the number of clients ({n_clients})")
    if top.get("min_nodes") is not None and not top.integer("min_nodes", minimum=top.get("min_clients")) <= n_clients:
        top.fail("min_nodes", f"must be <= the number of clients ({n_clients}), or null (all of them)")


def check_attack(attack: Checker, algorithm: str) -> None:
    attack.each(lambda: attack.choice("kind", ATTACKS_BY_ALGORITHM[algorithm]),
                lambda: attack.number("fraction", low=0, high=1, high_open=True))


def check_plot(cfg: dict[str, Any]) -> None:
    """The ``plot`` section: its keys name keys of the configuration, and its flags are flags."""
    plot = Checker(cfg["plot"], "plot.") if isinstance(cfg["plot"], dict) else None
    if plot is None:
        raise ConfigError(f"plot={cfg['plot']!r}: must be a section (the experiment's plot settings)")
    for key in ("x", "panels", "series"):
        if key in plot.section:
            dotted = plot.text(key)
            value: Any = cfg
            for part in dotted.split("."):
                if not isinstance(value, dict) or part not in value:
                    plot.fail(key, "must name a key of the configuration (section.key)")
                value = value[part]
    for key in ("xlabel", "title", "metric"):
        if key in plot.section:
            plot.text(key)
    for key in ("metrics", "methods"):
        if key in plot.section:
            plot.names(key)
    for key in ("logy", "logx", "table_only"):
        if key in plot.section:
            plot.boolean(key)


def check_workload(cfg: dict[str, Any]) -> None:
    if not (isinstance(cfg["workload"], str) and cfg["workload"]):
        raise ConfigError(f"workload={cfg['workload']!r}: must be a non-empty label")
