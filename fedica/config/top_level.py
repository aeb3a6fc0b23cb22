"""The top-level keys, the ``attack`` section and the experiments' ``plot`` section."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from fedica.checker import Checker, ConfigError
from fedica.config.schema import ATTACKS_BY_ALGORITHM, LOG_LEVELS
from fedica.data.files import LABELLED_TEST_FRACTION
from fedica.evaluation.baselines import BASELINE_METHODS, FILE_METHODS
from fedica.protocol.journal import JOURNAL_DIR, MANIFEST_FILE

__all__ = ["check_top_level", "check_resume", "check_federation_size", "check_file_comparators", "check_attack", "check_plot",
           "check_workload"]


def check_top_level(top: Checker) -> None:
    """The keys of ``conf/config.yaml`` that need nothing but themselves, each on its own."""
    top.each(lambda: top.integer("seed", minimum=0), lambda: top.integer("min_clients", minimum=1),
             lambda: top.seconds("round_timeout"), lambda: top.seconds("node_wait_timeout"),
             lambda: top.boolean("baselines"), lambda: top.names("baseline_methods", BASELINE_METHODS),
             lambda: top.choice("log_level", LOG_LEVELS))


def check_resume(top: Checker, algorithm: Mapping[str, Any], engine: str | None) -> None:
    """``resume``: null, or the folder of an interrupted run, holding its journal, that this run can resume.

    Whether the journal is this configuration's is checked when the run opens it
    (:meth:`fedica.protocol.Journal.resume`, one line too).
    """
    if top.get("resume") is None:
        return
    folder = Path(top.text("resume", optional=True))
    if not (folder / JOURNAL_DIR / MANIFEST_FILE).is_file():
        top.fail("resume", f"must be the folder of an interrupted run (its {JOURNAL_DIR}/{MANIFEST_FILE} is "
                           f"{'missing' if folder.is_dir() else 'missing: no such folder'}), or null")
    if engine == "simulation":
        top.fail("resume", "engine=simulation: its nodes say which site they are only in their replies, which the "
                           "replayed stages do not ask; resume with engine=inprocess (the same numbers to 1e-12) "
                           "or a deployment")


def check_federation_size(top: Checker, n_clients: int) -> None:
    """``min_clients`` and ``min_nodes`` fit the scenario's ``n_clients`` (skipped if ``min_clients`` is wrong)."""
    if "min_clients" in top.broken:
        return
    if top.integer("min_clients") > n_clients:
        top.fail("min_clients", f"must be <= the number of clients ({n_clients})")
    if top.get("min_nodes") is not None and not top.integer("min_nodes", minimum=top.get("min_clients")) <= n_clients:
        top.fail("min_nodes", f"must be <= the number of clients ({n_clients}), or null (all of them)")


def check_file_comparators(top: Checker, sc: Mapping[str, Any], engine: str, broken: Collection[str] = ()) -> None:
    """A request for the comparators of ``scenario=files`` (``baseline_methods`` naming nothing but those that run
    on files, :data:`~fedica.evaluation.baselines.FILE_METHODS`) that the run can honour.

    They read the files (so not in a deployment) and are scored on the rows held out (so not with
    ``test_fraction`` 0, which null is without labels). The default list names other comparators too and
    runs none on files: it asks for nothing here. ``broken``: the scenario's keys already reported.
    """
    if {"baselines", "baseline_methods"} & top.broken or {"test_fraction", "label_column"} & set(broken):
        return
    methods = top.get("baseline_methods")
    if not top.get("baselines") or not methods or not set(methods) <= set(FILE_METHODS):
        return
    if engine == "deployment":
        top.fail("baseline_methods", "on scenario=files the comparators read the sites' files, which a deployment "
                                     "keeps on the sites' machines; use engine=inprocess or simulation")
    held_out = sc["test_fraction"]
    if held_out is None:
        held_out = 0.0 if sc["label_column"] is None else LABELLED_TEST_FRACTION
    if held_out == 0:
        top.fail("baseline_methods", f"scenario.test_fraction={sc['test_fraction']!r} holds no rows out to score a "
                                     "comparator on (null: 0 without a label_column); set scenario.test_fraction, "
                                     "e.g. 0.3")


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
