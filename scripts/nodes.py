"""The SuperNodes of a run, as node configs: shared by every engine (in-process grid, deployment)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedica.config import client_count


def node_configs(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The node config of each SuperNode: its partition id and the number of partitions."""
    n_clients = client_count(cfg["scenario"])
    return [{"partition-id": i, "num-partitions": n_clients} for i in range(n_clients)]
