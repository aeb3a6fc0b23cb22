"""Before authentication nothing costs the SuperLink memory (issue 43, rows 2 and 3), for real.

One deployment with TLS and SuperNode authentication (a SuperLink, three SuperNodes): while an
honest RF-ICA run goes on, ten TLS connections from another address (127.0.0.2) without a node key
each declare a 64 MiB - 1 byte push and send all of it but the last byte, then hold the connection;
and a stream of junk pushes follows. Before, the SuperLink grew from 270 to 929 MB and stayed there
while the sockets were open. Now each is answered 401 from its headers, nothing of its body is read,
and the SuperLink's resident memory stays within :data:`GROWTH_BOUND` of what it was.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from pathlib import Path

import pytest
from local_ports import free_ports

from fedica.scripts.deploy import DeploymentOptions, LocalDeployment, compose, config_overrides

pytestmark = pytest.mark.deployment

ATTACKERS = 10
BODY = 64 * 2**20 - 1
JUNK_PUSHES = 2000
# What the SuperLink may grow by while the attack goes on: an honest RF-ICA run's own growth
# (Flower's state, the run's objects) is tens of MB; the attack's bodies alone would be 640 MiB.
GROWTH_BOUND = 150 * 2**20


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _holding_push(port: int, ca: Path, answers: list, stop: threading.Event) -> None:
    """One unauthenticated peer: a push-object of BODY bytes, all but the last sent, then held."""
    context = ssl.create_default_context(cafile=str(ca))
    try:
        with socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0), timeout=30) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(f"POST /v1/fleet/push-object HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/protobuf\r\n"
                        f"Content-Length: {BODY}\r\n\r\n".encode())
            chunk = b"\0" * 2**20
            sent = 0
            tls.settimeout(0.5)
            while sent < BODY - 1 and not stop.is_set():
                piece = chunk[: min(len(chunk), BODY - 1 - sent)]
                try:
                    tls.sendall(piece)
                except OSError:
                    break  # the SuperLink answered and closed: nothing more is read
                sent += len(piece)
            with contextlib.suppress(OSError):
                answers.append(tls.recv(200))
            stop.wait(60)
    except OSError as err:
        answers.append(repr(err).encode())


def _junk(port: int, ca: Path, count: int) -> list[int]:
    """``count`` unauthenticated push-object requests with small junk bodies; their status codes."""
    context = ssl.create_default_context(cafile=str(ca))
    statuses = []
    body = b"\x08\x07\x12\x04junk" * 8
    for _ in range(count):
        with socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0), timeout=30) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            tls.sendall(f"POST /v1/fleet/push-object HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/protobuf\r\n"
                        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            statuses.append(int(tls.recv(100).split()[1]))
    return statuses


def test_unauthenticated_bodies_cost_the_superlink_nothing_while_an_honest_run_completes(tmp_path):
    base = free_ports(4)
    options = DeploymentOptions(superlink_port=base, supernode_port=base + 1, tls=True, node_auth=True,
                                startup_timeout=180.0, run_timeout=600.0)
    overrides = config_overrides(compose(["engine=deployment", "scenario.n_clients=3", "scenario.n_normal=2000",
                                          "scenario.r=3", "baselines=false", f"engine.superlink_port={base}",
                                          f"engine.supernode_port={base + 1}"]))
    with LocalDeployment(options, [{"partition-id": i, "num-partitions": 3} for i in range(3)], tmp_path / "deployment") as d:
        d.app_dir()
        before = _rss(d.superlink.pid)
        stop, answers = threading.Event(), []
        holders = [threading.Thread(target=_holding_push, args=(base, d.tls.ca_cert, answers, stop), daemon=True)
                   for _ in range(ATTACKERS)]
        for holder in holders:
            holder.start()
        peak = [before]

        def watch():
            while not stop.is_set():
                peak[0] = max(peak[0], _rss(d.superlink.pid))
                stop.wait(0.2)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        junk = _junk(base, d.tls.ca_cert, JUNK_PUSHES)
        result = d.run(overrides, tmp_path / "run")
        stop.set()
        for thread in holders + [watcher]:
            thread.join(timeout=90)
        log = (tmp_path / "deployment" / "superlink.log").read_text(errors="replace")
    assert result["deployment"]["status"] == "finished:completed" and result["clients"]["answered"] == 3
    assert peak[0] - before < GROWTH_BOUND, f"the SuperLink grew by {(peak[0] - before) / 2**20:.0f} MiB"
    assert len(answers) == ATTACKERS and all(b" 401 " in answer for answer in answers), answers
    assert set(junk) == {401}
    assert log.count("nothing of the request was read") >= ATTACKERS + JUNK_PUSHES
    print(f"SuperLink resident memory: {before / 2**20:.0f} MiB before, at most {peak[0] / 2**20:.0f} MiB during the attack")
