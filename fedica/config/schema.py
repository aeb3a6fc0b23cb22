"""The schema of a run configuration: its top-level keys and, for each section, the keys of each choice.

The top-level keys are those of ``conf/config.yaml`` (:data:`TOP_LEVEL_KEYS`), plus the ``plot`` section that
``conf/experiment/*.yaml`` set for ``fedica-plot``. Each section (``algorithm``, ``scenario``, ``engine``,
``attack``) has exactly the keys its ``conf/<group>/<name>.yaml`` declares (:data:`SECTION_KEYS`;
``tests/test_config.py`` checks that they agree), taken from their owners: the algorithms' parameter
declarations (:mod:`fedica.parameters`), the scenario registry (:mod:`fedica.data.scenarios`) and the engines'
section (:mod:`fedica.config.engine`).
"""

from __future__ import annotations

from fedica.attacks import GEM_ATTACKS, GEM_PROTOCOL_ATTACKS, ICA_ATTACKS, SPOOF_PARTITION
from fedica.config.algorithm import ALGORITHM_KEYS
from fedica.config.engine import ENGINE_KEYS
from fedica.config.scenario import SCENARIO_KEYS

__all__ = ["SECTIONS", "TOP_LEVEL_KEYS", "OPTIONAL_TOP_LEVEL_KEYS", "PLOT_KEYS", "SECTION_KEYS", "ATTACK_KEYS",
           "ATTACKS_BY_ALGORITHM", "LOG_LEVELS"]

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
    "algorithm": ALGORITHM_KEYS,
    "scenario": SCENARIO_KEYS,
    "engine": ENGINE_KEYS,
}
ATTACK_KEYS = ("kind", "fraction")
ATTACKS_BY_ALGORITHM = {"rfica": ("none", *ICA_ATTACKS, SPOOF_PARTITION),
                        "fedgem": ("none", *GEM_ATTACKS, *GEM_PROTOCOL_ATTACKS, SPOOF_PARTITION)}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
