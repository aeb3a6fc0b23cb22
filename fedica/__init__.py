"""fedica: robust federated ICA (RF-ICA) and federated generalized EM (FedGEM).

The library is plain numpy, scipy and scikit-learn; importing it imports no Flower, Hydra or Ray.
The Flower side ships with it as :mod:`fedica.server` (ServerApp, strategies), :mod:`fedica.clients`
(ClientApp), :mod:`fedica.scripts` (command-line tools) and :mod:`fedica.conf` (Hydra configs).
"""

from pathlib import Path as _Path

__all__ = ["FedGEM", "RFICA", "__version__"]

# In a source checkout (and in the Flower App bundle built from it) the Flower side lives in the
# repository's top-level folders server/, clients/, scripts/ and conf/; an installed fedica has them
# as real subpackages (pyproject.toml maps the folders). Searching the checkout's root for
# subpackages makes ``fedica.server`` and the others the same names in both cases, so nothing
# generic (``server``, ``clients``) is ever imported or installed at top level.
_checkout = _Path(__file__).resolve().parent.parent
if not (_Path(__file__).parent / "server").is_dir() and (_checkout / "server" / "app.py").is_file():
    __path__.append(str(_checkout))

from fedica.fedgem.estimator import FedGEM  # noqa: E402
from fedica.rfica.estimator import RFICA  # noqa: E402
from fedica.version import __version__  # noqa: E402
