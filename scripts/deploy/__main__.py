"""``python -m fedica.scripts.deploy``: the same as ``fedica-deploy``."""

import sys

from .cli import main

sys.exit(main())
