"""``python -m fedica``: the same as ``fedica-run``.

The command line lives in ``scripts.run`` (it drives the Flower engines); it is
imported here at call time only, so that the ``fedica`` library itself never
depends on the Flower side of the project.
"""

import importlib

if __name__ == "__main__":
    importlib.import_module("scripts.run").main()
