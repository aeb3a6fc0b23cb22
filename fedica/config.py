"""Validation of a resolved run configuration.

The configuration is a plain nested mapping (Hydra's resolved config turned into
dicts and lists), so this module stays free of Hydra and Flower. Every rule names
the key it checks, so that a user's mistake is reported as one clear line before
anything starts, never as a traceback from deep inside numpy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from numbers import Integral, Real
from typing import Any

ALGORITHMS = ("rfica", "fedgem")
SCENARIOS_BY_ALGORITHM = {
    "rfica": ("ica_paper",),
    "fedgem": ("blobs", "waveform", "digits", "files"),
}
ENGINES = ("simulation", "inprocess", "deployment")
BASELINE_METHODS = ("central-gmm", "dp-gmm", "k-fed", "fed-kmeans")
ATTACKS_BY_ALGORITHM = {
    "rfica": ("none", "random_orthogonal", "scaled_junk", "permuted_truth"),
    "fedgem": ("none", "inflated_radius", "inflated_count", "random_centroids"),
}


class ConfigError(ValueError):
    """A configuration value breaks a rule; the message names the key and the rule."""


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
        if low is not None and (value < low or (low_open and value == low)):
            self.fail(key, f"must be {'>' if low_open else '>='} {low}")
        if high is not None and (value > high or (high_open and value == high)):
            self.fail(key, f"must be {'<' if high_open else '<='} {high}")
        return float(value)

    def choice(self, key: str, options: Sequence[str]) -> str:
        value = self.get(key)
        if value not in options:
            self.fail(key, f"must be one of {', '.join(options)}")
        return str(value)

    def boolean(self, key: str) -> bool:
        value = self.get(key)
        if not isinstance(value, bool):
            self.fail(key, "must be true or false")
        return value


def validate_config(cfg: Mapping[str, Any]) -> None:
    """Check a resolved run configuration before anything starts.

    Parameters
    ----------
    cfg : mapping
        The resolved configuration with the sections ``algorithm``, ``scenario``,
        ``engine`` and ``attack`` and the top-level keys of ``conf/config.yaml``.

    Raises
    ------
    ConfigError
        On the first broken rule, naming the key, its value and the rule.
    """
    top = _Checker(cfg, "")
    top.integer("seed", minimum=0)
    top.integer("min_clients", minimum=1)
    top.number("round_timeout", low=0, low_open=True)
    top.number("node_wait_timeout", low=0, low_open=True)
    top.boolean("baselines")
    methods = top.get("baseline_methods")
    if not isinstance(methods, Sequence) or isinstance(methods, str) or not set(methods) <= set(BASELINE_METHODS):
        top.fail("baseline_methods", f"must be a list of: {', '.join(BASELINE_METHODS)}")
    for section in ("algorithm", "scenario", "engine", "attack"):
        if not isinstance(cfg.get(section), Mapping):
            raise ConfigError(f"{section} is missing: choose one with {section}=<name>")

    algorithm = _Checker(cfg["algorithm"], "algorithm.").choice("name", ALGORITHMS)
    _Checker(cfg["engine"], "engine.").choice("name", ENGINES)
    scenario = _Checker(cfg["scenario"], "scenario.").choice(
        "name", sum(SCENARIOS_BY_ALGORITHM.values(), ())
    )
    if scenario not in SCENARIOS_BY_ALGORITHM[algorithm]:
        raise ConfigError(
            f"scenario={scenario} does not fit algorithm={algorithm}: choose one of "
            f"{', '.join(SCENARIOS_BY_ALGORITHM[algorithm])}"
        )
    _SCENARIO_CHECKS[scenario](_Checker(cfg["scenario"], "scenario."))
    _ALGORITHM_CHECKS[algorithm](_Checker(cfg["algorithm"], "algorithm."))

    attack = _Checker(cfg["attack"], "attack.")
    attack.choice("kind", ATTACKS_BY_ALGORITHM[algorithm])
    attack.number("fraction", low=0.0, high=1.0, high_open=True)

    n_clients = client_count(cfg["scenario"])
    if top.integer("min_clients") > n_clients:
        top.fail("min_clients", f"must be <= the number of clients ({n_clients})")


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
    alg.choice("contrast", ("cube", "logcosh"))
    alg.choice("init", ("random", "shared"))
    alg.choice("benchmark", ("largest", "best_objective"))
    alg.integer("kmeans_restarts", minimum=1)
    alg.number("gm_tol", low=0, low_open=True)


def _check_fedgem(alg: _Checker) -> None:
    alg.integer("rounds", minimum=0)
    alg.integer("local_steps", minimum=1)
    alg.integer("n_init", minimum=1)
    alg.integer("silhouette_sample", minimum=10)
    grid = alg.get("upsilon_grid")
    if (
        not isinstance(grid, Sequence)
        or isinstance(grid, str)
        or len(grid) == 0
        or not all(isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in grid)
    ):
        alg.fail("upsilon_grid", "must be a non-empty list of positive numbers")
    if alg.get("upsilon") != "auto":
        alg.number("upsilon", low=0, low_open=True)
    if alg.get("radius_outlier_factor") is not None:
        alg.number("radius_outlier_factor", low=1.0, low_open=True)
    if alg.get("count_cap_factor") is not None:
        alg.number("count_cap_factor", low=1.0)
    alg.number("participation", low=0.0, high=1.0, low_open=True)
    alg.number("guard_factor", low=0.0, low_open=True)


def _check_ica_paper(sc: _Checker) -> None:
    n_clients = sc.integer("n_clients", minimum=1)
    r = sc.integer("r", minimum=2)
    ratio = sc.number("corrupt_ratio", low=0.0, high=1.0, high_open=True)
    sc.integer("n_normal", minimum=r + 1)
    if round(ratio * n_clients) > 0:
        sc.integer("n_corrupt", minimum=r + 1)
    sc.number("sparsity", low=0.0, high=1.0, low_open=True)
    sc.boolean("orthogonal")


def _check_k_range(sc: _Checker, n_classes: int) -> tuple[int, int]:
    k_min = sc.integer("k_min", minimum=2)
    if sc.get("k_max") is None:
        k_max = n_classes - 1
        if k_min > k_max:
            sc.fail("k_min", f"must be < the number of clusters ({n_classes}): a client holds 2 <= K_g < K")
    else:
        k_max = sc.integer("k_max", minimum=k_min, maximum=n_classes)
    return k_min, k_max


def _check_blobs(sc: _Checker) -> None:
    n_clients = sc.integer("n_clients", minimum=1)
    n_clusters = sc.integer("n_clusters", minimum=3)
    sc.integer("dim", minimum=1)
    sc.number("r_min", low=0, low_open=True)
    sc.choice("setting", ("nominal", "client_imbalance", "cluster_imbalance"))
    k_min, k_max = _check_k_range(sc, n_clusters)
    # Every client holds at least k_min clusters with at least one point each,
    # and the smallest client share can be a few percent of the total.
    n_train = sc.integer("n_train", minimum=1)
    sc.integer("n_test", minimum=1)
    if n_train < 25 * n_clients * k_min:
        sc.fail("n_train", f"must be >= 25 * n_clients * k_min = {25 * n_clients * k_min} so that every client has more points than clusters")
    if n_clients * k_max < n_clusters:
        sc.fail("n_clients", f"too few clients to hold all {n_clusters} clusters with K_g <= k_max")


def _check_real(n_classes: int):
    def check(sc: _Checker) -> None:
        sc.integer("n_clients", minimum=1)
        sc.number("test_fraction", low=0.0, high=1.0, low_open=True, high_open=True)
        _check_k_range(sc, n_classes)
        if "n_samples" in sc.section:
            sc.integer("n_samples", minimum=100)

    return check


def _check_files(sc: _Checker) -> None:
    paths = sc.get("paths")
    if not isinstance(paths, Sequence) or isinstance(paths, str) or len(paths) == 0:
        sc.fail("paths", "must be a non-empty list of data files, one per client (scenario.paths=[a.csv,b.csv])")
    if not all(isinstance(p, str) and p for p in paths):
        sc.fail("paths", "every entry must be a file path")
    sc.number("test_fraction", low=0.0, high=1.0, high_open=True)
    label = sc.get("label_column")
    if label is not None and not isinstance(label, (str, Integral)):
        sc.fail("label_column", "must be a column index, a header name or null")
    n_components = sc.get("n_components")
    if n_components is None:
        if label is None:
            sc.fail("n_components", "must be given when there is no label_column")
        return
    values = n_components if isinstance(n_components, Sequence) and not isinstance(n_components, str) else [n_components]
    if isinstance(n_components, Sequence) and len(values) != len(paths):
        sc.fail("n_components", f"must have one entry per path ({len(paths)})")
    if not all(isinstance(v, Integral) and not isinstance(v, bool) and v >= 2 for v in values):
        sc.fail("n_components", "every K_g must be an integer >= 2")


_SCENARIO_CHECKS = {
    "ica_paper": _check_ica_paper,
    "blobs": _check_blobs,
    "waveform": _check_real(3),
    "digits": _check_real(10),
    "files": _check_files,
}
_ALGORITHM_CHECKS = {"rfica": _check_rfica, "fedgem": _check_fedgem}
