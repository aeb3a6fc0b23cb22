"""fedica's version, in a module of its own so that any module can name it without importing the package's estimators.

pyproject.toml repeats it statically (Flower reads the App's version from there); tests/test_packaging.py
holds the two equal.
"""

__version__ = "0.1.0"
