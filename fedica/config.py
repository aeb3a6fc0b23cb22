"""The schema of a run configuration and its one validator.

The configuration is a plain nested mapping (Hydra's resolved config turned into
dicts and lists), so this module stays free of Hydra and Flower. Every rule names
the key it checks, so that a user's mistake is reported as one clear line before
anything starts, never as a traceback from deep inside numpy or Flower. A key the
schema does not know (a typo, or one added with Hydra's ``+`` prefix) is refused
in every section, with the section's known keys.

The schema: the top-level keys of ``conf/config.yaml`` (:data:`TOP_LEVEL_KEYS`,
plus the ``plot`` section that ``conf/experiment/*.yaml`` set for ``fedica-plot``),
and for each section (``algorithm``, ``scenario``, ``engine``, ``attack``) exactly
the keys its ``conf/<group>/<name>.yaml`` declares (:data:`SECTION_KEYS`;
``tests/test_config.py`` checks that the two agree). Hydra puts nothing else in
the task's config: it removes its own ``hydra`` node, and ``+experiment=...``
files are ``@package _global_``, so no ``experiment`` key appears.

The configuration is validated once, at the entry points: ``fedica-run``
(``scripts/run.py``), ``fedica-deploy`` (``scripts/deploy``) and the ServerApp's
``main`` under ``flwr run`` (``server/app.py``, a process of its own that composes
the config anew). Everything below them (``run_engine``, the engines,
``run_federation``) takes the dict :func:`validate_config` returned as given: no
library user is documented to call ``run_engine``; one who does passes
``run_engine(validate_config(cfg))``. Calling :func:`validate_config` again on its
own result is harmless: it is idempotent and takes well under a millisecond.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from numbers import Integral, Real
from pathlib import Path
from typing import Any

from fedica.attacks import (
    GEM_ATTACKS,
    GEM_PROTOCOL_ATTACKS,
    ICA_ATTACKS,
    SPOOF_PARTITION,
)
from fedica.data.blobs import SETTINGS
from fedica.data.files import AUTO_COMPONENTS, DataFileError
from fedica.data.scenarios import ICA_SCENARIOS, SCENARIO_NAMES, ica_scenario_data
from fedica.evaluation.baselines import BASELINE_METHODS
from fedica.fedgem.server import UPSILON_CRITERIA
from fedica.rfica.aggregation import BENCHMARK_RULES
from fedica.rfica.local import CONTRASTS, INITS
from fedica.section_checks import (MAX_CLUSTERS, _check_affordable, _check_deployment, _check_ica_paper, _check_inprocess,
                                   _check_k_range, _check_real, _check_signals, _check_simulation)

__all__ = ["ConfigError", "validate_config", "client_count", "TOP_LEVEL_KEYS", "SECTION_KEYS"]

# The algorithms' ServerApp runners live in fedica.server (the Flower side), which fedica may not import.
ALGORITHMS = ("rfica", "fedgem")
SCENARIOS_BY_ALGORITHM = {"rfica": ICA_SCENARIOS, "fedgem": SCENARIO_NAMES}
# The engines are implemented in scripts/ (engines.py, deploy), the Flower side, which fedica may not import.
ENGINES = ("simulation", "inprocess", "deployment")
ATTACKS_BY_ALGORITHM = {"rfica": ("none", *ICA_ATTACKS, SPOOF_PARTITION),
                        "fedgem": ("none", *GEM_ATTACKS, *GEM_PROTOCOL_ATTACKS, SPOOF_PARTITION)}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

SECTIONS = ("algorithm", "scenario", "engine", "attack")
# conf/config.yaml's keys, in its order.
TOP_LEVEL_KEYS = (
    "seed", "min_clients", "round_timeout", "node_wait_timeout", "min_nodes", "baselines", "baseline_methods",
    "log_level",
    *SECTIONS,
)
# Optional top-level keys that conf/experiment/*.yaml add: scripts/plot.py reads ``plot``; a
# conf/workload/*.yaml bundle of overrides names itself in ``workload`` (a label, for tables).
OPTIONAL_TOP_LEVEL_KEYS = ("plot", "workload")
PLOT_KEYS = ("x", "xlabel", "metrics", "metric", "panels", "series", "methods", "logy", "logx", "table_only", "title")

# The keys of conf/<group>/<name>.yaml besides ``name`` (``attack`` has one schema for all its files, no name).
SECTION_KEYS: dict[str, dict[str, tuple[str, ...]]] = {
    "algorithm": {
        "rfica": ("contrast", "init", "benchmark", "kmeans_restarts", "gm_tol"),
        "fedgem": (
            "rounds", "local_steps", "upsilon", "upsilon_grid", "upsilon_criterion", "guard_factor", "n_init", "silhouette_sample",
            "radius_outlier_factor", "count_cap_factor", "component_cap_factor",
            "max_hostile_fraction", "max_overlap_pairs", "participation",
        ),
    },
    "scenario": {
        "ica_paper": ("n_clients", "r", "corrupt_ratio", "n_normal", "n_corrupt", "sparsity", "orthogonal"),
        "signals": ("n_clients", "r", "n_samples", "n_noisy", "noise_level", "n_short", "short_samples", "orthogonal"),
        "blobs": ("n_clients", "n_clusters", "dim", "r_min", "n_train", "n_test", "setting", "k_min", "k_max"),
        "digits": ("n_clients", "test_fraction", "k_min", "k_max"),
        "mnist": ("n_clients", "test_fraction", "k_min", "k_max"),
        "files": ("paths", "label_column", "n_components", "test_fraction", "write_sources"),
        "waveform": ("n_clients", "n_samples", "test_fraction", "k_min", "k_max"),
    },
    "engine": {
        "deployment": (
            "host", "superlink_port", "supernode_port", "tls", "node_auth", "startup_timeout", "run_timeout",
            "shutdown_grace", "out_dir",
        ),
        "inprocess": (),
        "simulation": ("client_num_cpus", "ray_address"),
    },
}
ATTACK_KEYS = ("kind", "fraction")


class ConfigError(ValueError):
    """A configuration value breaks a rule; the message names the key and the rule."""


def _unknown_keys(section: Mapping[str, Any], prefix: str, known: Sequence[str], owner: str) -> None:
    """Raise ConfigError naming the first key of ``section`` not in ``known`` (``name`` is not listed)."""
    for key in section:
        if key in known:
            continue
        listed = [k for k in known if k != "name"]
        keys = f"has keys {', '.join(listed)}" if listed else "has no keys besides name"
        close = difflib.get_close_matches(str(key), listed, n=1)
        hint = f" (did you mean {prefix}{close[0]}?)" if close else ""
        raise ConfigError(f"{prefix}{key}: unknown key; {owner} {keys}{hint}")


class _Checker:
    """Reads keys of one config section and raises ConfigError naming the full key."""

    def __init__(self, section: Mapping[str, Any], prefix: str):
        self.section = section
        self.prefix = prefix

    def fail(self, key: str, rule: str) -> None:
        value = self.section.get(key, "<missing>")
        raise ConfigError(f"{self.prefix}{key}={value!r}: {rule}")

    def get(self, key: str) -> Any:
        if key not in self.section:
            raise ConfigError(f"{self.prefix}{key} is missing")
        return self.section[key]

    def integer(self, key: str, minimum: int | None = None, maximum: int | None = None) -> int:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, Integral):
            self.fail(key, "must be an integer")
        if minimum is not None and value < minimum:
            self.fail(key, f"must be >= {minimum}")
        if maximum is not None and value > maximum:
            self.fail(key, f"must be <= {maximum}")
        return int(value)

    def number(
        self,
        key: str,
        *,
        low: float | None = None,
        high: float | None = None,
        low_open: bool = False,
        high_open: bool = False,
    ) -> float:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
            self.fail(key, "must be a finite number")
        too_low = low is not None and (value < low or (low_open and value == low))
        too_high = high is not None and (value > high or (high_open and value == high))
        if (too_low or too_high) and low is not None and high is not None:
            self.fail(key, f"must be in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}")
        if too_low:
            self.fail(key, f"must be {'>' if low_open else '>='} {low}")
        if too_high:
            self.fail(key, f"must be {'<' if high_open else '<='} {high}")
        return float(value)

    def port(self, key: str) -> int:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, Integral) or not 1 <= value <= 65535:
            self.fail(key, "must be a port number in 1..65535")
        return int(value)

    def seconds(self, key: str, *, optional: bool = False) -> float | None:
        """A positive, finite number of seconds (or null when ``optional``)."""
        if optional and self.get(key) is None:
            return None
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value <= 0:
            self.fail(key, "must be a positive number of seconds" + (" or null" if optional else ""))
        return float(value)

    def choice(self, key: str, options: Sequence[str]) -> str:
        value = self.get(key)
        if not isinstance(value, str) or value not in options:
            self.fail(key, f"must be one of {', '.join(options)}")
        return str(value)

    def boolean(self, key: str) -> bool:
        value = self.get(key)
        if not isinstance(value, bool):
            self.fail(key, "must be true or false")
        return value

    def text(self, key: str, *, optional: bool = False) -> str | None:
        value = self.get(key)
        if optional and value is None:
            return None
        if not isinstance(value, str) or not value:
            self.fail(key, "must be a non-empty string" + (" or null" if optional else ""))
        return value

    def names(self, key: str, options: Sequence[str] | None = None) -> list[str]:
        """A list of strings (each one of ``options`` when given)."""
        value = self.get(key)
        if (
            not _is_list(value)
            or not all(isinstance(v, str) for v in value)
            or (options is not None and not set(value) <= set(options))
        ):
            self.fail(key, f"must be a list of: {', '.join(options)}" if options else "must be a list of names")
        return list(value)


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _plain(value: Any) -> Any:
    """A deep copy made of dicts, lists and scalars (OmegaConf containers and tuples included)."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if _is_list(value):
        return [_plain(item) for item in value]
    return value


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
    cfg = _plain(cfg)
    _unknown_keys(cfg, "", TOP_LEVEL_KEYS + OPTIONAL_TOP_LEVEL_KEYS, "the top level")
    for section in SECTIONS:
        if not isinstance(cfg.get(section), dict):
            raise ConfigError(f"{section} is missing: choose one with {section}=<name>")

    algorithm = _Checker(cfg["algorithm"], "algorithm.").choice("name", ALGORITHMS)
    scenario = _Checker(cfg["scenario"], "scenario.").choice(
        "name", tuple(dict.fromkeys(sum(SCENARIOS_BY_ALGORITHM.values(), ()))))
    engine = _Checker(cfg["engine"], "engine.").choice("name", ENGINES)
    # Every unknown key is reported before any value: a misspelt key explains a "missing" one.
    for section, name in (("algorithm", algorithm), ("scenario", scenario), ("engine", engine)):
        _unknown_keys(cfg[section], f"{section}.", ("name", *SECTION_KEYS[section][name]), f"{section} {name!r}")
    _unknown_keys(cfg["attack"], "attack.", ATTACK_KEYS, "attack")
    if isinstance(cfg.get("plot"), dict):
        _unknown_keys(cfg["plot"], "plot.", PLOT_KEYS, "plot")
    # Every key of the schema is required (a composed config always has them all).
    for key in TOP_LEVEL_KEYS:
        _Checker(cfg, "").get(key)
    for section, name in (("algorithm", algorithm), ("scenario", scenario), ("engine", engine)):
        for key in SECTION_KEYS[section][name]:
            _Checker(cfg[section], f"{section}.").get(key)
    for key in ATTACK_KEYS:
        _Checker(cfg["attack"], "attack.").get(key)

    top = _Checker(cfg, "")
    top.integer("seed", minimum=0)
    top.integer("min_clients", minimum=1)
    top.seconds("round_timeout")
    top.seconds("node_wait_timeout")
    top.boolean("baselines")
    top.names("baseline_methods", BASELINE_METHODS)
    top.choice("log_level", LOG_LEVELS)

    if scenario not in SCENARIOS_BY_ALGORITHM[algorithm]:
        raise ConfigError(
            f"scenario={scenario} does not fit algorithm={algorithm}: choose one of "
            f"{', '.join(SCENARIOS_BY_ALGORITHM[algorithm])}"
        )
    # files serves both algorithms; RF-ICA reads only its paths and label column.
    check = _check_file_list if (algorithm, scenario) == ("rfica", "files") else _SCENARIO_CHECKS[scenario]
    check(_Checker(cfg["scenario"], "scenario."))
    _ALGORITHM_CHECKS[algorithm](_Checker(cfg["algorithm"], "algorithm."))
    n_clients = client_count(cfg["scenario"])
    _check_affordable(_Checker(cfg["scenario"], "scenario."), n_clients)
    _ENGINE_CHECKS[engine](_Checker(cfg["engine"], "engine."), n_clients)

    attack = _Checker(cfg["attack"], "attack.")
    attack.choice("kind", ATTACKS_BY_ALGORITHM[algorithm])
    attack.number("fraction", low=0, high=1, high_open=True)

    if top.integer("min_clients") > n_clients:
        top.fail("min_clients", f"must be <= the number of clients ({n_clients})")
    if top.get("min_nodes") is not None and not top.integer("min_nodes", minimum=top.get("min_clients")) <= n_clients:
        top.fail("min_nodes", f"must be <= the number of clients ({n_clients}), or null (all of them)")
    if "plot" in cfg:
        _check_plot(cfg)
    if "workload" in cfg and not (isinstance(cfg["workload"], str) and cfg["workload"]):
        raise ConfigError(f"workload={cfg['workload']!r}: must be a non-empty label")
    if scenario == "files":
        _check_files_engine(cfg["scenario"], algorithm, engine, cfg["engine"].get("ray_address"))
    return cfg


def _check_files_engine(sc: Mapping[str, Any], algorithm: str, engine: str, ray_address: str | None) -> None:
    """The data files are there (and for RF-ICA readable, with one channel count) on local engines."""
    if ray_address is not None:  # a cluster's workers are not this user's local clients (clients/app.py)
        raise ConfigError(f"engine.ray_address={ray_address!r}: scenario=files runs on this machine's own Ray only; "
                          "on several machines use engine=deployment, each SuperNode with its own data-path")
    if sc["write_sources"] and engine == "deployment":
        raise ConfigError("scenario.write_sources=true: sources are written only by engines that run every site "
                          "on this machine (inprocess, simulation); in a deployment each site holds its own data")
    if engine == "deployment":
        return
    _check_local_files(sc["paths"])
    if algorithm == "rfica":
        _check_ica_channels(sc)


def _check_ica_channels(sc: Mapping[str, Any]) -> None:
    """Every RF-ICA site's file reads as observations, and all have the first one's number of channels.

    This reads the files (cached: the sites of an in-process run reuse what was read), so a malformed file or
    a site with other channels stops the run before it starts, with one line.
    """
    width = None
    for index, path in enumerate(sc["paths"]):
        try:
            n_channels = ica_scenario_data(sc, index, 0).shape[0]
        except DataFileError as err:
            raise ConfigError(f"scenario.paths[{index}]: {err}") from None
        width = n_channels if width is None else width
        if n_channels != width:
            raise ConfigError(f"scenario.paths[{index}]={path}: has {n_channels} channels (columns) but "
                              f"scenario.paths[0] has {width}; every site must observe the same channels")


def _check_local_files(paths: Sequence[str]) -> None:
    """Every client's file exists here, so that a misspelt path stops the run before it starts (local engines
    only: in a deployment each SuperNode reads its own ``data-path``, maybe on another machine)."""
    for index, path in enumerate(paths):
        location = Path(path)
        if location.is_dir():
            raise ConfigError(f"scenario.paths[{index}]={path}: is a directory, not a data file")
        if not location.is_file():
            raise ConfigError(f"scenario.paths[{index}]={path}: no such file")


def client_count(scenario: Mapping[str, Any]) -> int:
    """Number of clients a scenario defines.

    Parameters
    ----------
    scenario : mapping
        The ``scenario`` section of a run configuration.

    Returns
    -------
    n_clients : int
    """
    if scenario["name"] == "files":
        return len(scenario["paths"])
    return int(scenario["n_clients"])


def _check_rfica(alg: _Checker) -> None:
    alg.choice("contrast", CONTRASTS)
    alg.choice("init", INITS)
    alg.choice("benchmark", BENCHMARK_RULES)
    alg.integer("kmeans_restarts", minimum=1)
    alg.number("gm_tol", low=0, low_open=True)


def _check_fedgem(alg: _Checker) -> None:
    alg.integer("rounds", minimum=0)
    alg.integer("local_steps", minimum=1)
    alg.integer("n_init", minimum=1)
    alg.integer("silhouette_sample", minimum=10)
    grid = alg.get("upsilon_grid")
    if not _is_list(grid) or len(grid) == 0 or not all(_positive(v) for v in grid):
        alg.fail("upsilon_grid", "must be a non-empty list of positive numbers")
    if alg.get("upsilon") != "auto" and not _positive(alg.get("upsilon")):
        alg.fail("upsilon", "must be a positive number or auto")
    alg.choice("upsilon_criterion", UPSILON_CRITERIA)
    if alg.get("radius_outlier_factor") is not None:
        alg.number("radius_outlier_factor", low=1, low_open=True)
    for factor in ("component_cap_factor", "count_cap_factor"):
        if alg.get(factor) is not None:
            alg.number(factor, low=1)
    if alg.get("max_overlap_pairs") is not None:
        alg.integer("max_overlap_pairs", minimum=1)
    alg.number("max_hostile_fraction", low=0, high=0.5, high_open=True)
    alg.number("participation", low=0, high=1, low_open=True)
    alg.number("guard_factor", low=0, low_open=True)


def _positive(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _check_blobs(sc: _Checker) -> None:
    n_clients = sc.integer("n_clients", minimum=1)
    n_clusters = sc.integer("n_clusters", minimum=3, maximum=MAX_CLUSTERS)
    sc.integer("dim", minimum=1)
    sc.number("r_min", low=0, low_open=True)
    sc.choice("setting", SETTINGS)
    k_min, k_max = _check_k_range(sc, n_clusters)
    # Every client holds at least k_min clusters with at least one point each,
    # and the smallest client share can be a few percent of the total.
    n_train = sc.integer("n_train", minimum=1)
    sc.integer("n_test", minimum=1)
    if n_train < 25 * n_clients * k_min:
        sc.fail("n_train", f"must be >= 25 * n_clients * k_min = {25 * n_clients * k_min} so that every client has more points than clusters")
    if n_clients * k_max < n_clusters:
        sc.fail("n_clients", f"too few clients to hold all {n_clusters} clusters with K_g <= k_max")
    if n_train < n_clusters:
        sc.fail("n_train", f"must be >= n_clusters ({n_clusters}): every cluster needs training points")


def _check_file_list(sc: _Checker) -> None:
    """The keys of files that both algorithms read (RF-ICA reads no others: n_components and test_fraction are
    FedGEM's)."""
    paths = sc.get("paths")
    if not _is_list(paths) or len(paths) == 0:
        sc.fail("paths", "must be a non-empty list of data files, one per client (scenario.paths=[a.csv,b.csv])")
    if not all(isinstance(p, str) and p for p in paths):
        sc.fail("paths", "every entry must be a file path")
    label = sc.get("label_column")
    if label is not None and (isinstance(label, bool) or not isinstance(label, (str, Integral))):
        sc.fail("label_column", "must be a column index, a header name or null")
    sc.boolean("write_sources")


def _check_files(sc: _Checker) -> None:
    _check_file_list(sc)
    if sc.get("write_sources"):
        sc.fail("write_sources", "only RF-ICA recovers sources; FedGEM needs write_sources=false")
    paths = sc.get("paths")
    sc.number("test_fraction", low=0, high=1, low_open=True, high_open=True)
    label = sc.get("label_column")
    n_components = sc.get("n_components")
    if n_components is None:
        if label is None:
            sc.fail("n_components", "must be given when there is no label_column (or auto: each client chooses)")
        return
    values = n_components if _is_list(n_components) else [n_components]
    if _is_list(n_components) and len(values) != len(paths):
        sc.fail("n_components", f"must have one entry per path ({len(paths)})")
    if not all(v == AUTO_COMPONENTS or (isinstance(v, Integral) and not isinstance(v, bool) and v >= 2) for v in values):
        sc.fail("n_components", f"every K_g must be an integer >= 2 or {AUTO_COMPONENTS}")


def _check_plot(cfg: dict[str, Any]) -> None:
    plot = _Checker(cfg["plot"], "plot.") if isinstance(cfg["plot"], dict) else None
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


_SCENARIO_CHECKS = {
    "ica_paper": _check_ica_paper,
    "signals": _check_signals,
    "blobs": _check_blobs,
    "waveform": _check_real(3),
    "digits": _check_real(10),
    "mnist": _check_real(10),
    "files": _check_files,
}
_ALGORITHM_CHECKS = {"rfica": _check_rfica, "fedgem": _check_fedgem}
_ENGINE_CHECKS = {"simulation": _check_simulation, "inprocess": _check_inprocess, "deployment": _check_deployment}
