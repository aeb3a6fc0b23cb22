"""``python -m fedica``: the same as ``fedica-run``.

The command line belongs to the Flower side of the project (``fedica.scripts``), which the
library never imports: the installed ``fedica-run`` entry point is looked up and called.
"""

import sys
from importlib.metadata import entry_points


def main() -> None:
    (command,) = entry_points(group="console_scripts", name="fedica-run") or (None,)
    if command is None:
        sys.exit("python -m fedica: the fedica-run command is not installed (pip install fedica)")
    sys.exit(command.load()())


if __name__ == "__main__":
    main()
