"""Minutes of unauthenticated load on a real deployment while honest runs go on (issue 43, item 8;
docs/RESULTS.md, "Unauthenticated load on the SuperLink").

One SuperLink and three SuperNodes on loopback, with TLS and SuperNode authentication, as
``fedica-deploy --tls --node-auth`` starts them. First one honest RF-ICA run and one FedGEM run
without any load (the reference). Then, for ``--minutes``, peers from another address (127.0.0.2,
which fedica-superlink treats as a remote machine) without a node key keep up, each bounded in
count:

- ``holders``: connections that declare a 64 MiB - 1 byte push, send all but its last byte and hold;
- ``oversized``: requests that declare 1 GiB;
- ``slow``: connections that send a request's headers one byte a second;
- ``junk``: small garbage pushes, one TLS connection each, as fast as one thread sends them.

Meanwhile honest RF-ICA and FedGEM runs follow each other. Every second the SuperLink's resident
memory is read. The script writes ``--out`` (JSON): the memory (before, peak, at the end), every
run's status, whether its numbers equal the reference's, and the attacks' counts and answers. Run
from the repository root::

    python benchmarks/hostile_load.py [--minutes 10] [--out benchmarks/hostile_load.json]

It is a script, not a test: it takes minutes by design.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import socket
import ssl
import tempfile
import threading
import time
from pathlib import Path

from fedica.scripts.deploy import DeploymentOptions, LocalDeployment, compose, config_overrides

RUNS = {
    "rfica": ["scenario.n_clients=3", "scenario.n_normal=2000", "scenario.r=3", "baselines=false"],
    "fedgem": ["algorithm=fedgem", "scenario.n_clients=3", "scenario.n_clusters=4", "scenario.r_min=8",
               "scenario.n_train=600", "scenario.n_test=600", "algorithm.rounds=2", "baselines=false"],
}
HOLDERS, SLOW = 10, 20
HELD_BODY = 64 * 2**20 - 1


def _free_block(count: int) -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1] if probe.getsockname()[1] + count < 65535 else _free_block(count)


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Attack:
    """The unauthenticated peers, each kind on its own threads, until :meth:`stop`."""

    def __init__(self, port: int, ca: Path):
        self.port, self.context = port, ssl.create_default_context(cafile=str(ca))
        self.stopped = threading.Event()
        self.answers: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.threads = ([threading.Thread(target=self._forever, args=("holders", self._hold), daemon=True) for _ in range(HOLDERS)]
                        + [threading.Thread(target=self._forever, args=("slow", self._slow), daemon=True) for _ in range(SLOW)]
                        + [threading.Thread(target=self._forever, args=("oversized", self._oversized), daemon=True),
                           threading.Thread(target=self._forever, args=("junk", self._junk), daemon=True)])

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> dict[str, dict[str, int]]:
        self.stopped.set()
        for thread in self.threads:
            thread.join(timeout=90)
        return {kind: dict(counter) for kind, counter in self.answers.items()}

    def _forever(self, kind: str, attempt) -> None:
        while not self.stopped.is_set():
            try:
                answer = attempt()
            except OSError as err:
                answer = type(err).__name__
            self.answers[kind][answer] += 1

    @contextlib.contextmanager
    def _connection(self):
        raw = socket.create_connection(("127.0.0.1", self.port), source_address=("127.0.0.2", 0), timeout=30)
        try:
            with self.context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                yield tls
        finally:
            raw.close()

    def _status(self, tls) -> str:
        tls.settimeout(75)
        head = tls.recv(64)
        return head.split()[1].decode() if len(head.split()) > 1 else "closed"

    def _request(self, path: str, length: int) -> bytes:
        return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/protobuf\r\n"
                f"Content-Length: {length}\r\n\r\n").encode()

    def _hold(self) -> str:
        with self._connection() as tls:
            tls.sendall(self._request("/v1/fleet/push-object", HELD_BODY))
            chunk, sent = b"\0" * 2**20, 0
            tls.settimeout(1)
            while sent < HELD_BODY - 1 and not self.stopped.is_set():
                try:
                    tls.sendall(chunk[: min(len(chunk), HELD_BODY - 1 - sent)])
                except OSError:
                    break  # answered and closed
                sent += min(len(chunk), HELD_BODY - 1 - sent)
            return self._status(tls)

    def _oversized(self) -> str:
        with self._connection() as tls:
            tls.sendall(self._request("/v1/fleet/push-messages", 2**30) + b"\0" * 4096)
            return self._status(tls)

    def _slow(self) -> str:
        with self._connection() as tls:
            for byte in self._request("/v1/fleet/pull-messages", 100):
                if self.stopped.wait(1.0):
                    break
                tls.sendall(bytes([byte]))
            return self._status(tls)

    def _junk(self) -> str:
        body = b"\x08\x07\x12\x04junk" * 8
        with self._connection() as tls:
            tls.sendall(self._request("/v1/fleet/push-object", len(body)) + body)
            return self._status(tls)


def _numbers(result: dict) -> dict:
    """What a run computed (its metrics and clients), without its timings."""
    return json.loads(json.dumps({"metrics": result.get("metrics"), "clients": result.get("clients")}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/hostile_load.json"))
    args = parser.parse_args()
    base = _free_block(4)
    options = DeploymentOptions(superlink_port=base, supernode_port=base + 1, tls=True, node_auth=True,
                                startup_timeout=180.0, run_timeout=900.0)
    overrides = {name: config_overrides(compose(["engine=deployment", *extra, f"engine.superlink_port={base}",
                                                 f"engine.supernode_port={base + 1}"])) for name, extra in RUNS.items()}
    with tempfile.TemporaryDirectory() as temp, \
            LocalDeployment(options, [{"partition-id": i, "num-partitions": 3} for i in range(3)], Path(temp) / "deployment") as d:
        d.app_dir()
        reference = {name: _numbers(d.run(run, Path(temp) / f"reference-{name}")) for name, run in overrides.items()}
        memory = {"before": _rss(d.superlink.pid)}
        samples = [memory["before"]]
        attack = Attack(base, d.tls.ca_cert)
        attack.start()
        started = time.monotonic()
        runs = []
        sampler_stop = threading.Event()

        def sample() -> None:
            while not sampler_stop.wait(1.0):
                samples.append(_rss(d.superlink.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        while time.monotonic() - started < args.minutes * 60:
            name = ("rfica", "fedgem")[len(runs) % 2]
            began = time.monotonic()
            try:
                result = d.run(overrides[name], Path(temp) / f"run-{len(runs)}")
                runs.append({"run": name, "status": result["deployment"]["status"], "seconds": round(time.monotonic() - began, 1),
                             "same_as_reference": _numbers(result) == reference[name]})
            except Exception as err:  # noqa: BLE001 - a run the load broke is what this measures
                runs.append({"run": name, "status": f"failed: {type(err).__name__}: {err}"[:300],
                             "seconds": round(time.monotonic() - began, 1), "same_as_reference": False})
            print(f"[{(time.monotonic() - started) / 60:.1f} min] {runs[-1]}", flush=True)
        answers = attack.stop()
        sampler_stop.set()
        sampler.join()
        memory.update(peak=max(samples), end=_rss(d.superlink.pid))
    report = {"minutes": args.minutes, "superlink_rss_mib": {k: round(v / 2**20, 1) for k, v in memory.items()},
              "runs": runs, "attacks": answers,
              "peers": {"holders": HOLDERS, "slow": SLOW, "oversized": 1, "junk": 1}}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("superlink_rss_mib", "attacks")}, indent=1))


if __name__ == "__main__":
    main()
