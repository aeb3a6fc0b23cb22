"""``python -m fedica.scripts.deploy.bind OUT_DIR``: bind every partition to the node its registered key got.

``fedica-deploy --print-commands --node-auth`` has the operator register each site's public key
and keep Flower's answer (``keys/supernode-<i>.json``, holding the node id). This step writes
those ids into ``run_config.toml`` (``node-partitions``), so that the ServerApp asks only these
nodes and believes no other node's claim to be partition i (docs/DEPLOYMENT.md, security).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from .bundle import toml_string
from .errors import DeploymentError

REGISTRATION = re.compile(r"supernode-(\d+)\.json")


def registered_nodes(keys_dir: Path) -> dict[int, int]:
    """Node id -> partition id, from Flower's answers to ``flwr supernode register ... --format json``."""
    bound = {}
    for path in sorted(Path(keys_dir).glob("supernode-*.json")):
        match = REGISTRATION.fullmatch(path.name)
        if match is None:
            continue
        try:
            answer = json.loads(path.read_text())
            node = int(answer["node-id"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise DeploymentError(f"{path}: not Flower's answer to 'flwr supernode register --format json' ({type(err).__name__})") from err
        bound[node] = int(match.group(1))
    if not bound:
        raise DeploymentError(f"no registrations (supernode-<i>.json) in {keys_dir}: run step 3's register commands first")
    return bound


def bind(out_dir: Path) -> dict[int, int]:
    """Write the registered nodes into ``OUT_DIR/run_config.toml`` as ``node-partitions``; return the binding."""
    out_dir = Path(out_dir)
    run_config = out_dir / "run_config.toml"
    if not run_config.is_file():
        raise DeploymentError(f"{run_config} does not exist: give the --out-dir of fedica-deploy --print-commands")
    bound = registered_nodes(out_dir / "keys")
    lines = [line for line in run_config.read_text().splitlines() if not line.startswith("node-partitions")]
    lines.append(f"node-partitions = {toml_string(','.join(f'{n}:{p}' for n, p in sorted(bound.items(), key=lambda i: i[1])))}")
    run_config.write_text("\n".join(lines) + "\n")
    return bound


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m fedica.scripts.deploy.bind OUT_DIR", file=sys.stderr)
        return 2
    try:
        bound = bind(Path(argv[0]))
    except DeploymentError as err:
        print(f"fedica-deploy bind: {err}", file=sys.stderr)
        return 1
    print(f"run_config.toml: {len(bound)} partitions bound to their registered nodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
