"""The one validator of a run configuration, :func:`validate_config`.

The configuration is a plain nested mapping (Hydra's resolved config turned into dicts and lists), so this
package stays free of Hydra and Flower. Every rule names the key it checks, so that a user's mistake is
reported as one clear line before anything starts, never as a traceback from deep inside numpy or Flower. A
key the schema does not know (a typo, or one added with Hydra's ``+`` prefix) is refused in every section, with
the section's known keys. Hydra puts nothing else in the task's config: it removes its own ``hydra`` node, and
``+experiment=...`` files are ``@package _global_``, so no ``experiment`` key appears.

The configuration is validated once, at the entry points: ``fedica-run`` (``scripts/run.py``),
``fedica-deploy`` (``scripts/deploy``) and the ServerApp's ``main`` under ``flwr run`` (``server/app.py``, a
process of its own that composes the config anew). Everything below them (``run_engine``, the engines,
``run_federation``) takes the dict :func:`validate_config` returned as given: no library user is documented to
call ``run_engine``; one who does passes ``run_engine(validate_config(cfg))``. Calling :func:`validate_config`
again on its own result is harmless: it is idempotent and takes well under a millisecond.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedica.config.algorithm import ALGORITHMS, check_algorithm
from fedica.checker import Checker, ConfigError, Errors, plain, unknown_keys
from fedica.config.engine import ENGINES, check_engine
from fedica.config.scenario import (
    SCENARIOS_BY_ALGORITHM,
    check_affordable,
    check_files_engine,
    check_scenario,
    client_count,
)
from fedica.config.schema import ATTACK_KEYS, OPTIONAL_TOP_LEVEL_KEYS, PLOT_KEYS, SECTION_KEYS, SECTIONS, TOP_LEVEL_KEYS
from fedica.config.top_level import (
    check_attack,
    check_federation_size,
    check_file_comparators,
    check_plot,
    check_resume,
    check_top_level,
    check_workload,
)

__all__ = ["validate_config"]

# Every scenario's name, RF-ICA's first (the order of the config's messages).
_SCENARIO_NAMES = tuple(dict.fromkeys(sum(SCENARIOS_BY_ALGORITHM.values(), ())))


def validate_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Check a resolved run configuration before anything starts; return it as a plain dict.

    Every independent rule is checked, and every broken one reported at once: unknown keys first (a misspelt
    key explains a "missing" one), then missing keys, then each section's values and the data files. A rule
    that needs another key's value (e.g. one that needs a valid ``n_clients``) is skipped when that key is
    already wrong, so that each mistake is reported once.

    Parameters
    ----------
    cfg : mapping
        The resolved configuration with the sections ``algorithm``, ``scenario``,
        ``engine`` and ``attack`` and the top-level keys of ``conf/config.yaml``.

    Returns
    -------
    cfg : dict
        A deep copy of ``cfg`` made of plain dicts, lists and scalars, with the same
        keys and values (nothing is filled in or converted). Validating it again
        gives an equal dict.

    Raises
    ------
    ConfigError
        When any rule is broken: one line per broken rule (:attr:`ConfigError.errors`), in the order above,
        each naming the key (and its value and the rule, or for an unknown key the keys its section has).
    """
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"the configuration must be a mapping, got {type(cfg).__name__}")
    cfg = plain(cfg)
    errors = Errors()
    errors.check(unknown_keys, cfg, "", TOP_LEVEL_KEYS + OPTIONAL_TOP_LEVEL_KEYS, "the top level")
    present = [section for section in SECTIONS if isinstance(cfg.get(section), dict)]
    errors.add(*(f"{section} is missing: choose one with {section}=<name>" for section in SECTIONS
                 if section not in present))
    # Each section's choice; a section that is missing or names no known choice goes unchecked.
    names = {section: cfg[section]["name"]
             for section, options in (("algorithm", ALGORITHMS), ("scenario", _SCENARIO_NAMES), ("engine", ENGINES))
             if section in present and errors.check(Checker(cfg[section], f"{section}.").choice, "name", options)}
    known = {section: ("name", *SECTION_KEYS[section][name]) for section, name in names.items()}
    if "attack" in present:
        known["attack"] = ATTACK_KEYS
    for section, keys in known.items():
        owner = section if section == "attack" else f"{section} {names[section]!r}"
        errors.check(unknown_keys, cfg[section], f"{section}.", keys, owner)
    if isinstance(cfg.get("plot"), dict):
        errors.check(unknown_keys, cfg["plot"], "plot.", PLOT_KEYS, "plot")
    # Every key of the schema is required (a composed config always has them all).
    for key in TOP_LEVEL_KEYS:
        if key not in SECTIONS:
            errors.check(Checker(cfg, "").get, key)
    for section, keys in known.items():
        for key in keys:
            errors.check(Checker(cfg[section], f"{section}.").get, key)

    algorithm, scenario, engine = (names.get(section) for section in ("algorithm", "scenario", "engine"))
    top = Checker(cfg, "")
    errors.check(check_top_level, top)
    errors.check(check_resume, top, cfg["algorithm"] if algorithm is not None else {}, engine)
    sc = Checker(cfg["scenario"], "scenario.") if scenario is not None else None
    # n_clients stays None while the scenario's rules are broken: the rules that need it are then skipped.
    n_clients = None
    if algorithm is not None:
        errors.check(check_algorithm, Checker(cfg["algorithm"], "algorithm."), algorithm)
        if "attack" in present:
            errors.check(check_attack, Checker(cfg["attack"], "attack."), algorithm)
        if scenario is not None and scenario not in SCENARIOS_BY_ALGORITHM[algorithm]:
            errors.add(f"scenario={scenario} does not fit algorithm={algorithm}: choose one of "
                       f"{', '.join(SCENARIOS_BY_ALGORITHM[algorithm])}")
        elif scenario is not None and errors.check(check_scenario, sc, algorithm):
            n_clients = client_count(cfg["scenario"])
            if not errors.check(check_affordable, sc, n_clients):
                n_clients = None
    if engine is not None:
        errors.check(check_engine, Checker(cfg["engine"], "engine."), engine, n_clients)
    if n_clients is not None:
        errors.check(check_federation_size, top, n_clients)
    if "plot" in cfg:
        errors.check(check_plot, cfg)
    if "workload" in cfg:
        errors.check(check_workload, cfg)
    if scenario == "files" and algorithm is not None and engine is not None:
        # The files are checked even when other rules of the section are broken (a missing file is its own
        # mistake); check_files_engine skips the rules that need a key already reported (sc.broken).
        errors.check(check_files_engine, cfg["scenario"], algorithm, engine, cfg["engine"].get("ray_address"),
                     sc.broken)
        if algorithm == "fedgem":
            errors.check(check_file_comparators, top, cfg["scenario"], engine, sc.broken)
    errors.raise_any()
    return cfg
