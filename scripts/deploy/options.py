"""The ``engine`` section of ``engine=deployment``, and the check that its ports are free."""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .errors import PortInUse

# Name of the SuperLink connection in the launcher's FLWR_HOME.
CONNECTION = "fedica"


@dataclass(frozen=True)
class DeploymentOptions:
    """The ``engine`` section of ``engine=deployment`` (conf/engine/deployment.yaml documents each key)."""

    host: str = "127.0.0.1"
    superlink_port: int = 8000
    supernode_port: int = 9094
    tls: bool = False
    node_auth: bool = False
    startup_timeout: float = 120.0
    run_timeout: float | None = None
    shutdown_grace: float = 10.0
    out_dir: str | None = None
    max_reply_mib: int = 64

    @classmethod
    def from_engine(cls, engine: Mapping[str, Any]) -> DeploymentOptions:
        """Read and check the engine section; unknown keys (``name``) are ignored.

        Raises
        ------
        ValueError
            Naming the key (``engine.<key>``) and the rule it breaks.
        """
        values = {f.name: engine[f.name] for f in fields(cls) if engine.get(f.name) is not None}
        options = cls(**values)
        for key in ("superlink_port", "supernode_port"):
            port = getattr(options, key)
            if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
                raise ValueError(f"engine.{key}={port!r}: must be a port number in 1..65535")
        for key in ("tls", "node_auth"):
            if not isinstance(getattr(options, key), bool):
                raise ValueError(f"engine.{key}={getattr(options, key)!r}: must be true or false")
        if options.node_auth and not options.tls:
            raise ValueError("engine.node_auth=true: needs engine.tls=true (Flower authenticates SuperNodes only over TLS)")
        for key in ("startup_timeout", "run_timeout", "shutdown_grace"):
            value = getattr(options, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise ValueError(f"engine.{key}={value!r}: must be a positive number of seconds")
        mib = options.max_reply_mib
        if isinstance(mib, bool) or not isinstance(mib, int) or not 1 <= mib <= 2**20:
            raise ValueError(f"engine.max_reply_mib={mib!r}: must be a whole number of MiB in 1..1048576")
        if not isinstance(options.host, str) or not options.host:
            raise ValueError(f"engine.host={options.host!r}: must be an address to listen on (127.0.0.1, 0.0.0.0, ...)")
        return options

    @property
    def connect_host(self) -> str:
        """The address local clients use to reach the SuperLink."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host

    @property
    def superlink_address(self) -> str:
        return join_host_port(self.connect_host, self.superlink_port)


def join_host_port(host: str, port: int) -> str:
    """``host:port``, the host in brackets when it is an IPv6 address."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def check_ports_free(options: DeploymentOptions, n_supernodes: int) -> None:
    """Raise :class:`PortInUse` when the SuperLink's port or a SuperNode's port is taken.

    The check binds each port the way the servers will (``SO_REUSEADDR``, so only a listening
    socket counts as busy).
    """
    wanted = [("SuperLink", options.host, options.superlink_port, "superlink_port")]
    wanted += [
        (f"SuperNode {i}", "127.0.0.1", options.supernode_port + i, "supernode_port")
        for i in range(n_supernodes)
    ]
    last = options.supernode_port + n_supernodes - 1
    if last > 65535:
        raise PortInUse(f"engine.supernode_port={options.supernode_port}: {n_supernodes} SuperNodes need ports up to {last} > 65535")
    if options.supernode_port <= options.superlink_port <= last:
        raise PortInUse(
            f"engine.superlink_port={options.superlink_port} falls in the SuperNodes' ports "
            f"{options.supernode_port}..{last}; choose ports that do not overlap"
        )
    for owner, host, port, key in wanted:
        if not port_is_free(host, port):
            raise PortInUse(
                f"port {port} on {host} ({owner}) is already in use; choose another with "
                f"engine.{key}=<port> (fedica-deploy --{key.replace('_', '-')} <port>)"
            )


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
