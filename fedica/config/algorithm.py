"""The ``algorithm`` section: its keys and rules are the algorithm's parameter declaration.

:mod:`fedica.parameters` declares each parameter once; here its rule is applied to the config's value, so that
the config, :class:`fedica.FedGEM`, :class:`fedica.RFICA` and the Flower strategies refuse the same values with
the same rule (the config's line names the dotted key: ``algorithm.<key>=<value>: <rule>``).
"""

from __future__ import annotations

from fedica.checker import Checker
from fedica.parameters import DECLARATIONS
from fedica.fedgem.privacy import uncovered
from fedica.rfica.privacy import uncovered as rfica_uncovered

__all__ = ["ALGORITHMS", "ALGORITHM_KEYS", "check_algorithm"]

# The algorithms' ServerApp runners live in fedica.server (the Flower side), which fedica may not import.
ALGORITHMS = ("rfica", "fedgem")
# The keys of conf/algorithm/<name>.yaml besides ``name``: the declared parameters the config holds.
ALGORITHM_KEYS: dict[str, tuple[str, ...]] = {name: DECLARATIONS[name].config_keys for name in ALGORITHMS}


def check_algorithm(alg: Checker, name: str) -> None:
    """Every key of algorithm ``name``'s section against its declared rule, in declaration order, each on its own."""
    declaration = DECLARATIONS[name]

    def rule(key: str):
        def check() -> None:
            broken = declaration[key].violation(alg.get(key))
            if broken is not None:
                alg.fail(key, broken[1])
        return check

    alg.each(*(rule(key) for key in declaration.config_keys))
    if name == "fedgem":
        refusal = uncovered(alg.section)  # the keys a private run needs, once each is valid on its own
        if refusal is not None:
            alg.fail(*refusal)
    if name == "rfica":
        refusal = rfica_uncovered(alg.section)  # what a private release cannot cover, once each key is valid
        if refusal is not None:
            alg.fail(*refusal)
