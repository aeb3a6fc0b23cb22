"""fedica's Flower server side: the ServerApp (``fedica.server.app``) and the strategies.

    from fedica.server import FedGEMStrategy, RFICAStrategy
"""

from fedica.server.fedgem import FedGEMStrategy
from fedica.server.rfica import RFICAStrategy

__all__ = ["FedGEMStrategy", "RFICAStrategy"]
