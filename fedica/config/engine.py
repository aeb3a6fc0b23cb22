"""The ``engine`` section: each engine's keys and rules.

The engines are implemented in ``scripts/`` (``engines.py``, ``deploy``), the Flower side, which fedica may not
import; their names and keys are declared here, and ``conf/engine/<name>.yaml`` hold exactly these keys
(``tests/test_config.py``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from fedica.checker import Checker

__all__ = ["ENGINE_KEYS", "ENGINES", "RAY_ADDRESS", "check_engine"]

# The keys of conf/engine/<name>.yaml besides ``name``, in their order.
ENGINE_KEYS: dict[str, tuple[str, ...]] = {
    "deployment": (
        "host", "superlink_port", "supernode_port", "tls", "node_auth", "startup_timeout", "run_timeout",
        "shutdown_grace", "out_dir", "max_reply_mib",
    ),
    "inprocess": ("n_jobs",),
    "simulation": ("client_num_cpus", "ray_address"),
}
# In the order of the config's messages.
ENGINES = ("simulation", "inprocess", "deployment")

# HOST:PORT of a Ray cluster's head: a host name, an IPv4 address or a bracketed IPv6 address.
RAY_ADDRESS = re.compile(r"(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})")


def _check_ray_address(eng: Checker) -> str | None:
    address = eng.get("ray_address")
    if address is None or address == "auto":
        return address
    match = RAY_ADDRESS.fullmatch(address) if isinstance(address, str) else None
    if match is None or not 1 <= int(match["port"]) <= 65535:
        eng.fail("ray_address", "must be null (Ray starts locally), auto, or HOST:PORT of the Ray head (port 1..65535)")
    return address


def _check_simulation(eng: Checker, n_clients: int | None) -> None:
    cpus = eng.number("client_num_cpus", low=0, low_open=True)
    if _check_ray_address(eng) is not None:
        return  # the cluster's nodes, not this machine, hold the clients' CPUs
    # Ray places no client actor at all when one needs more CPUs than the machine has (Flower then hangs).
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cpus > available:
        eng.fail("client_num_cpus", f"must be <= the {available} CPUs of this machine (CPUs per simulated client)")


def _check_inprocess(eng: Checker, n_clients: int | None) -> None:
    if eng.integer("n_jobs") == 0:
        eng.fail("n_jobs", "must be a thread count >= 1, or -1 for every core (-2 all but one, ...)")


def _check_deployment(eng: Checker, n_clients: int | None) -> None:
    eng.text("host")
    superlink = eng.port("superlink_port")
    first = eng.port("supernode_port")
    if n_clients is not None:  # the SuperNodes' ports, one per client, need the scenario's valid n_clients
        last = first + n_clients - 1
        if last > 65535:
            eng.fail("supernode_port", f"the {n_clients} SuperNodes need ports {first}..{last}, beyond 65535")
        if first <= superlink <= last:
            eng.fail("superlink_port", f"falls in the SuperNodes' ports {first}..{last} (engine.supernode_port + client)")
    tls = eng.boolean("tls")
    if eng.boolean("node_auth") and not tls:
        eng.fail("node_auth", "needs engine.tls=true (Flower authenticates SuperNodes only over TLS)")
    eng.seconds("startup_timeout")
    eng.seconds("run_timeout", optional=True)
    eng.seconds("shutdown_grace")
    eng.text("out_dir", optional=True)
    eng.integer("max_reply_mib", minimum=1, maximum=2**20)


_CHECKS: dict[str, Callable[[Checker, int | None], None]] = {
    "simulation": _check_simulation, "inprocess": _check_inprocess, "deployment": _check_deployment}


def check_engine(eng: Checker, name: str, n_clients: int | None) -> None:
    """The rules of engine ``name``'s section, for a federation of ``n_clients`` (None: unknown, as the scenario's
    rules are broken; the rules that need it are skipped)."""
    _CHECKS[name](eng, n_clients)
