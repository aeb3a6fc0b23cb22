"""Ports for the servers tests start on 127.0.0.1 (SuperLinks, SuperNodes, Ray nodes, listeners).

A port asked of the kernel (binding port 0) comes from its ephemeral range, the range from which every outgoing
connection on the machine also takes its local port. Between a test choosing such a port and its server binding
it, a connection of the other pytest worker (a SuperNode's, Ray's) may take it, and the deployment stops with
"port ... already in use" (seen in ``.ci/run``). So the ports handed out here lie below the ephemeral range, where
no outgoing connection goes, and above Ray's worker ports; each xdist worker has a block of its own, and within
a worker no port is handed out twice.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

LOWEST_PORT = 20000  # Ray's workers listen on 10002-19999 by default
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_START = 32768  # Linux's default, where the range cannot be read

_lock = threading.Lock()
_next_port: int | None = None


def _worker_block() -> tuple[int, int]:
    """This pytest process's ports: its share of LOWEST_PORT up to the ephemeral range, as ``[first, end)``."""
    try:
        top = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        top = DEFAULT_EPHEMERAL_START
    top = max(top, LOWEST_PORT + 4000)  # an ephemeral range that starts low: still a block of ports (rarely taken there)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    width = (top - LOWEST_PORT) // workers
    return LOWEST_PORT + index * width, LOWEST_PORT + (index + 1) * width


def _free(port: int) -> bool:
    # bound the way the servers bind (SO_REUSEADDR): only a listening socket makes the port busy
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int = 1) -> int:
    """The first of ``count`` consecutive ports that are free now and were not handed out before in this process."""
    global _next_port
    first, end = _worker_block()
    with _lock:
        candidate = first if _next_port is None else _next_port
        while candidate + count <= end:
            if all(_free(port) for port in range(candidate, candidate + count)):
                _next_port = candidate + count
                return candidate
            candidate += 1
    raise RuntimeError(f"no {count} consecutive free ports left in {first}..{end - 1}")
