"""The SuperExec shared secret: ``python -m fedica.scripts.deploy.secret PATH`` writes a new one.

Flower's SuperLink and SuperNode, started with ``--isolation process`` and
``--superexec-auth-secret-file``, hand a task (the ServerApp's or a site's ClientApp run) only to a
SuperExec whose request is signed with that secret. Without it, any local process that polls their
Runtime API (127.0.0.1) can take a site's task, read its instruction and answer in its name.
Each machine makes its own secret, and it never leaves that machine (docs/DEPLOYMENT.md).
"""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

from .tls import write_new_file


def make_superexec_secret(path: Path) -> Path:
    """A fresh secret (32 random bytes, as hex) at ``path``: a new file, mode 600; an existing path is refused."""
    write_new_file(Path(path), secrets.token_hex(32).encode())
    return Path(path)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m fedica.scripts.deploy.secret PATH   (writes a new SuperExec secret, mode 600)", file=sys.stderr)
        return 2
    try:
        make_superexec_secret(Path(args[0]))
    except OSError as err:
        print(f"fedica secret: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
