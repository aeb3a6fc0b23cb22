"""fedica's Flower server side: the ServerApp (``fedica.server.app``) and the strategies.

    from fedica.server import FedGEMStrategy, RFICAStrategy

The strategies are imported when first asked for (PEP 562), not when the package is. Under
``flwr run``'s simulation the ServerApp (``fedica.server.app``) and the ClientApp
(``fedica.clients.app``, which imports ``fedica.server.records``) are loaded by two threads of one
process at once: a package ``__init__`` that imported the strategies, and through them the
records codec, held this package's import lock while waiting for the codec's, which the
ClientApp's thread held while waiting for this package (Python's ``_DeadlockError``). An
``__init__`` that imports nothing cannot take part in such a cycle.
"""

from importlib import import_module

__all__ = ["FedGEMStrategy", "RFICAStrategy"]

_STRATEGY_MODULES = {"FedGEMStrategy": "fedica.server.fedgem", "RFICAStrategy": "fedica.server.rfica"}


def __getattr__(name: str):
    if name in _STRATEGY_MODULES:
        return getattr(import_module(_STRATEGY_MODULES[name]), name)
    raise AttributeError(f"module 'fedica.server' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
