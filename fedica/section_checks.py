"""The checks of the config sections that need only the section itself: most scenarios and every engine.

Each takes :class:`fedica.config`'s checker of its section (its ``get``, ``fail``, ``integer``,
``number``... methods) and raises through it; :func:`fedica.config.validate_config` calls them.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any


# fedica.config's checker of one section (its get, fail, integer, number, ... methods).
Checker = Any


def _check_signals(sc: Checker) -> None:
    n_clients = sc.integer("n_clients", minimum=1)
    r = sc.integer("r", minimum=2)
    sc.integer("n_samples", minimum=r + 1)
    n_noisy = sc.integer("n_noisy", minimum=0)
    n_short = sc.integer("n_short", minimum=0)
    if n_noisy + n_short > n_clients:
        sc.fail("n_short", f"n_noisy + n_short must be <= n_clients ({n_clients}): a site is noisy or short, not both")
    sc.number("noise_level", low=0)
    if n_short > 0:
        sc.integer("short_samples", minimum=r + 1)
    sc.boolean("orthogonal")


# The largest federations fedica's engines hold (every client has a context and its data in one
# process of the in-process engine), and the largest number of blobs clusters it places.
MAX_CLIENTS = 100_000
MAX_CLUSTERS = 10_000
# A generated scenario may take at most this share of the machine's memory.
MEMORY_SHARE = 0.5


def _check_affordable(sc: Checker, n_clients: int) -> None:
    """Refuse a scenario no engine here can hold before anything starts (instead of a MemoryError or a hang)."""
    if n_clients > MAX_CLIENTS:
        sc.fail("n_clients", f"{n_clients} clients are more than fedica's engines hold (at most {MAX_CLIENTS})")
    name = sc.get("name")
    values = {"ica_paper": lambda: n_clients * sc.get("n_normal") * sc.get("r"),
              "signals": lambda: n_clients * sc.get("n_samples") * sc.get("r"),
              "blobs": lambda: (sc.get("n_train") + sc.get("n_test")) * sc.get("dim")}.get(name)
    if values is None:
        return
    needed, available = 8 * values(), MEMORY_SHARE * _physical_memory()
    if needed > available:
        key = {"ica_paper": "n_normal", "signals": "n_samples", "blobs": "n_train"}[name]
        sc.fail(key, f"the scenario's data would take {needed / 2**30:.1f} GiB, more than half of this machine's "
                     f"memory ({available / 2**30:.1f} GiB)")


def _physical_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not POSIX: no limit known, none imposed
        return math.inf


def _check_ica_paper(sc: Checker) -> None:
    n_clients = sc.integer("n_clients", minimum=1)
    r = sc.integer("r", minimum=2)
    ratio = sc.number("corrupt_ratio", low=0, high=1, high_open=True)
    sc.integer("n_normal", minimum=r + 1)
    if round(ratio * n_clients) > 0:
        sc.integer("n_corrupt", minimum=r + 1)
    sc.number("sparsity", low=0, high=1, low_open=True)
    sc.boolean("orthogonal")


def _check_k_range(sc: Checker, n_classes: int) -> tuple[int, int]:
    k_min = sc.integer("k_min", minimum=2)
    if sc.get("k_max") is None:
        k_max = n_classes - 1
        if k_min > k_max:
            sc.fail("k_min", f"must be < the number of clusters ({n_classes}): a client holds 2 <= K_g < K")
    else:
        k_max = sc.integer("k_max", minimum=k_min, maximum=n_classes)
    return k_min, k_max


def _check_real(n_classes: int):
    def check(sc: Checker) -> None:
        sc.integer("n_clients", minimum=1)
        sc.number("test_fraction", low=0, high=1, low_open=True, high_open=True)
        _check_k_range(sc, n_classes)
        if "n_samples" in sc.section:  # waveform's (the missing-key check made sure it is there)
            sc.integer("n_samples", minimum=100)

    return check


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


def _check_simulation(eng: Checker, n_clients: int) -> None:
    cpus = eng.number("client_num_cpus", low=0, low_open=True)
    if _check_ray_address(eng) is not None:
        return  # the cluster's nodes, not this machine, hold the clients' CPUs
    # Ray places no client actor at all when one needs more CPUs than the machine has (Flower then hangs).
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if cpus > available:
        eng.fail("client_num_cpus", f"must be <= the {available} CPUs of this machine (CPUs per simulated client)")


def _check_inprocess(eng: Checker, n_clients: int) -> None:
    pass


def _check_deployment(eng: Checker, n_clients: int) -> None:
    eng.text("host")
    superlink = eng.port("superlink_port")
    first = eng.port("supernode_port")
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
