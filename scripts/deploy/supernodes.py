"""Each SuperNode's node config, and its ``--node-config`` command-line form."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedica.scripts.nodes import node_configs


def deployment_node_configs(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each SuperNode's node config: partition id and count, and for ``scenario=files`` its own data file."""
    configs = node_configs(cfg)
    if cfg["scenario"]["name"] == "files":
        for config, path in zip(configs, cfg["scenario"]["paths"]):
            config["data-path"] = str(Path(path).expanduser().resolve())
    return configs


def node_config_arg(config: Mapping[str, Any]) -> str:
    """The ``--node-config`` value (space-separated TOML ``key=value`` pairs)."""
    pairs = []
    for key, value in config.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (int, float)):
            text = repr(value)
        elif '"' not in str(value) and "\\" not in str(value):
            text = f'"{value}"'
        elif "'" not in str(value):
            text = f"'{value}'"  # a TOML literal string: backslashes stay as they are
        else:
            raise ValueError(f"node config {key}={value!r}: a value with a ' cannot also hold a \" or a backslash (Flower's --node-config syntax)")
        pairs.append(f"{key}={text}")
    return " ".join(pairs)
