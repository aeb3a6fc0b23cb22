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
from fedica.config.checker import Checker, ConfigError, plain, unknown_keys
from fedica.config.engine import ENGINES, check_engine
from fedica.config.scenario import (
    SCENARIOS_BY_ALGORITHM,
    check_affordable,
    check_files_engine,
    check_scenario,
    client_count,
)
from fedica.config.schema import ATTACK_KEYS, OPTIONAL_TOP_LEVEL_KEYS, PLOT_KEYS, SECTION_KEYS, SECTIONS, TOP_LEVEL_KEYS
from fedica.config.top_level import check_attack, check_federation_size, check_plot, check_top_level, check_workload

__all__ = ["validate_config"]


def validate_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Check a resolved run configuration before anything starts; return it as a plain dict.

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
        On the first broken rule, naming the key (and its value and the rule, or for
        an unknown key the keys its section has).
    """
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"the configuration must be a mapping, got {type(cfg).__name__}")
    cfg = plain(cfg)
    unknown_keys(cfg, "", TOP_LEVEL_KEYS + OPTIONAL_TOP_LEVEL_KEYS, "the top level")
    for section in SECTIONS:
        if not isinstance(cfg.get(section), dict):
            raise ConfigError(f"{section} is missing: choose one with {section}=<name>")

    algorithm = Checker(cfg["algorithm"], "algorithm.").choice("name", ALGORITHMS)
    scenario = Checker(cfg["scenario"], "scenario.").choice(
        "name", tuple(dict.fromkeys(sum(SCENARIOS_BY_ALGORITHM.values(), ()))))
    engine = Checker(cfg["engine"], "engine.").choice("name", ENGINES)
    # Every unknown key is reported before any value: a misspelt key explains a "missing" one.
    for section, name in (("algorithm", algorithm), ("scenario", scenario), ("engine", engine)):
        unknown_keys(cfg[section], f"{section}.", ("name", *SECTION_KEYS[section][name]), f"{section} {name!r}")
    unknown_keys(cfg["attack"], "attack.", ATTACK_KEYS, "attack")
    if isinstance(cfg.get("plot"), dict):
        unknown_keys(cfg["plot"], "plot.", PLOT_KEYS, "plot")
    # Every key of the schema is required (a composed config always has them all).
    for key in TOP_LEVEL_KEYS:
        Checker(cfg, "").get(key)
    for section, name in (("algorithm", algorithm), ("scenario", scenario), ("engine", engine)):
        for key in SECTION_KEYS[section][name]:
            Checker(cfg[section], f"{section}.").get(key)
    for key in ATTACK_KEYS:
        Checker(cfg["attack"], "attack.").get(key)

    top = Checker(cfg, "")
    check_top_level(top)
    if scenario not in SCENARIOS_BY_ALGORITHM[algorithm]:
        raise ConfigError(
            f"scenario={scenario} does not fit algorithm={algorithm}: choose one of "
            f"{', '.join(SCENARIOS_BY_ALGORITHM[algorithm])}"
        )
    check_scenario(Checker(cfg["scenario"], "scenario."), algorithm)
    check_algorithm(Checker(cfg["algorithm"], "algorithm."), algorithm)
    n_clients = client_count(cfg["scenario"])
    check_affordable(Checker(cfg["scenario"], "scenario."), n_clients)
    check_engine(Checker(cfg["engine"], "engine."), engine, n_clients)
    check_attack(Checker(cfg["attack"], "attack."), algorithm)
    check_federation_size(top, n_clients)
    if "plot" in cfg:
        check_plot(cfg)
    if "workload" in cfg:
        check_workload(cfg)
    if scenario == "files":
        check_files_engine(cfg["scenario"], algorithm, engine, cfg["engine"].get("ray_address"))
    return cfg
