"""The clustering metrics under their documented name: :mod:`fedica.metrics`, which the algorithms use too.

They live at the library's bottom layer (FedGEM's sites and server score with them); the comparators' room
keeps this name for the users and documents that import it from here.
"""

from fedica.metrics import *  # noqa: F403 - every documented name, as fedica.metrics lists them
from fedica.metrics import __all__  # noqa: F401
