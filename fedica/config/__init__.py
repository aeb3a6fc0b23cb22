"""The schema of a run configuration and its one validator, :func:`validate_config`.

Its rooms, by purpose: :mod:`~fedica.config.schema` (which keys each section has, from their owners),
:mod:`~fedica.checker` (reading a section: :class:`ConfigError`, one line naming the dotted key), the
sections' rules in :mod:`~fedica.config.algorithm` (the algorithms' parameter declarations,
:mod:`fedica.parameters`), :mod:`~fedica.config.scenario` (the scenario registry,
:mod:`fedica.data.scenarios`), :mod:`~fedica.config.engine` and :mod:`~fedica.config.top_level` (the top-level
keys, ``attack`` and ``plot``), :mod:`~fedica.config.validator`, which runs them in order, and
:mod:`~fedica.config.composition`, one line for what stops Hydra's composition before there is a config.
"""

from fedica.config.algorithm import ALGORITHMS
from fedica.checker import ConfigError
from fedica.config.composition import composition_error
from fedica.config.engine import ENGINES
from fedica.config.scenario import SCENARIOS_BY_ALGORITHM, client_count
from fedica.config.schema import (
    ATTACK_KEYS,
    ATTACKS_BY_ALGORITHM,
    LOG_LEVELS,
    OPTIONAL_TOP_LEVEL_KEYS,
    PLOT_KEYS,
    SECTION_KEYS,
    SECTIONS,
    TOP_LEVEL_KEYS,
)
from fedica.config.validator import validate_config

__all__ = ["ConfigError", "composition_error", "validate_config", "client_count", "TOP_LEVEL_KEYS", "SECTION_KEYS", "SECTIONS",
           "OPTIONAL_TOP_LEVEL_KEYS", "PLOT_KEYS", "ATTACK_KEYS", "ATTACKS_BY_ALGORITHM", "SCENARIOS_BY_ALGORITHM",
           "ALGORITHMS", "ENGINES", "LOG_LEVELS"]
