"""Real deployments (issue 5): flower-superlink and flower-supernode processes on loopback, driven by scripts/deploy/.

A deployment round takes ~10 s (Flower's hard-coded 3 s polls and one new process per
message), so the four deployments below start together in background threads when the first
test needs them, and each test waits for its own: the file takes 2.5-3 minutes on two busy
cores instead of about six. Ports are chosen free at runtime. The launcher's configuration,
checked without starting a process, is tested in test_deploy_config.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from local_ports import free_ports
from fedica.clients.app import app as client_app
from fedica.scripts import deploy
from fedica.scripts.deploy import (
    DeploymentOptions,
    LocalDeployment,
    PortInUse,
    RunFailed,
    compose,
    config_overrides,
    make_node_key,
    processes,
    run_deployment,
)
from fedica.scripts.engines import run_inprocess
from fedica.server.records import unpack
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedica.protocol import CATEGORY, TRAIN
from fedica.results import to_jsonable

RFICA = ["scenario.n_clients=3", "scenario.n_normal=2000", "scenario.n_corrupt=200", "scenario.r=3"]
FEDGEM = [
    "algorithm=fedgem", "scenario.n_clients=3", "scenario.n_clusters=4", "scenario.r_min=8",
    "scenario.n_train=600", "scenario.n_test=600", "algorithm.rounds=2", "algorithm.upsilon=1.0", "baselines=false",
]
# Seconds a round waits for a silent node. A healthy exchange takes ~10 s alone, 30+ s when the four
# deployments share two busy cores, and more than 60 s on a loaded CI machine (every node, the two
# healthy ones too, was cut off at 60 s once), so the margin is wide; a killed node is found sooner
# by Flower's heartbeat (at most 60 s), so its round_timeout only has to stay out of the way.
SILENT_TIMEOUT = 150
KILLED_TIMEOUT = 180
SILENT, KILLED = 2, 2  # the partition that never answers (RF-ICA) / whose SuperNode is killed (FedGEM)
# A poller that is refused and exits starts again, until it is stopped: ``python -c POLL_AGAIN command...``.
POLL_AGAIN = "import subprocess, sys, time\nwhile True:\n    subprocess.run(sys.argv[1:])\n    time.sleep(0.2)"
UNCOMPARED = ("timings", "versions", "engine", "config", "deployment")


# ---------------------------------------------------------------- helpers


def _same_numbers(a, b, path="result", *, atol=1e-9):
    """Every number of two JSON-like results agrees to ``atol`` (timings, versions, engine and config excluded)."""
    if isinstance(a, dict):
        keys = {k for k in a if k not in UNCOMPARED and not k.startswith("fit")}
        assert keys == {k for k in b if k not in UNCOMPARED and not k.startswith("fit")}, f"{path}: keys differ"
        for key in keys:
            _same_numbers(a[key], b[key], f"{path}.{key}", atol=atol)
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            _same_numbers(x, y, f"{path}[{i}]", atol=atol)
    elif isinstance(a, float) or isinstance(b, float):
        assert a is not None and b is not None and abs(a - b) <= atol, f"{path}: {a!r} != {b!r}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _as_json(result):
    """A result as it reads back from result.json (NaN becomes null)."""
    return json.loads(json.dumps(to_jsonable(result)))


def _inprocess(overrides, lost=None):
    """The in-process engine's result; ``lost``: (partition, rounds) whose ClientApp fails in those rounds."""
    cfg = compose(overrides + ["engine=inprocess"])
    if lost is None:
        return _as_json(run_inprocess(cfg))
    partition, rounds = lost

    def handler(msg: Message, context: Context) -> Message:
        if int(context.node_config["partition-id"]) == partition and unpack(msg.content)[1]["server-round"] in rounds:
            raise ConnectionError("this client is gone")
        return client_app(msg, context)

    failing = ClientApp()
    for task, category in CATEGORY.items():
        (failing.train if category == TRAIN else failing.evaluate)(task)(handler)
    return _as_json(run_inprocess(cfg, client_app=failing))


def _options(n_nodes=3, **changes):
    base = free_ports(n_nodes + 1)
    return DeploymentOptions(superlink_port=base, supernode_port=base + 1, startup_timeout=180.0, run_timeout=600.0, **changes)


def _engine_overrides(options):
    return [f"engine.superlink_port={options.superlink_port}", f"engine.supernode_port={options.supernode_port}",
            f"engine.startup_timeout={options.startup_timeout}", f"engine.run_timeout={options.run_timeout}"]


def _process_tree(roots):
    table = processes.process_table()
    return processes.descendants(roots, table)


def _still_running(pids):
    table = processes.process_table()
    return sorted(pid for pid in pids if pid in table and table[pid][2] != "Z")


def _ports_free(options, n_nodes=3):
    """Nothing listens any more on the deployment's ports.

    Asked by connecting, not by binding: the ports come from the ephemeral range, where the other
    deployments running beside this one take their outgoing connections' local ports, so a port whose
    server is gone can still be held by another process's connection (a CI run found a killed-node
    deployment's port not bindable after every one of its processes had exited).
    """
    return not any(_listening(p) for p in [options.superlink_port] + [options.supernode_port + i for i in range(n_nodes)])


def _listening(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2.0):
            return True
    except OSError:  # refused (nothing listens) or no answer
        return False


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.1)


# ---------------------------------------------------------------- a busy port: nothing starts


def test_a_busy_port_is_reported_before_anything_starts(tmp_path, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        deployment = LocalDeployment(DeploymentOptions(superlink_port=port, supernode_port=free_ports(3)),
                                     [{"partition-id": i, "num-partitions": 3} for i in range(3)], tmp_path / "logs")
        with pytest.raises(PortInUse, match=rf"port {port} .*SuperLink.*superlink_port"):
            deployment.start()
        assert deployment.superlink is None and deployment.supernodes == []
        code = deploy.main(RFICA + ["--superlink-port", str(port), "--out-dir", str(tmp_path / "out")])
    assert code == 1
    assert f"port {port}" in capsys.readouterr().err


# ---------------------------------------------------------------- the deployments (background threads)


class _ProcessRecorder:
    """Records, twice a second, every process of a deployment (and what they start) until stopped."""

    def __init__(self, deployment):
        self.pids: set[int] = set()
        self.commands: dict[int, str] = {}  # each process's command line, as first seen
        self._deployment = deployment
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._record, daemon=True)
        self._thread.start()

    def _record(self):
        while not self._stop.is_set():
            found = _process_tree(p.pid for p in self._deployment.processes())
            for pid in found - self.pids:
                with contextlib.suppress(OSError):
                    self.commands[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            self.pids |= found
            self._stop.wait(0.5)

    def stop(self):
        self._stop.set()
        self._thread.join()
        return self.pids


def _timed(job):
    def run():
        start = time.monotonic()
        outcome = job()
        outcome["seconds"] = time.monotonic() - start
        return outcome
    return run


class _RemotePeer:
    """A TCP relay on 127.0.0.1 whose connections reach the SuperLink from 127.0.0.2.

    It stands for a machine other than the operator's (fedica-superlink answers the Control and Runtime
    APIs only from 127.0.0.1 and ::1) while every server the tests start listens on loopback only.
    TLS passes through it untouched.
    """

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.listener.close()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), source_address=("127.0.0.2", 0))
            except OSError:
                client.close()
                continue
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(source, target), daemon=True).start()


def _pipe(source: socket.socket, target: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            target.sendall(data)
    with contextlib.suppress(OSError):
        target.shutdown(socket.SHUT_WR)


def _outsider_cli_home(home: Path, port: int, ca_cert: Path) -> Path:
    """The outsider's FLWR_HOME: a connection to the SuperLink (through the relay) that trusts ``ca.pem``."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(f'[superlink]\ndefault = "fedica"\n\n[superlink.fedica]\naddress = "127.0.0.1:{port}"\n'
                                      f'root-certificates = "{ca_cert}"\n')
    return home


def _outsider_actions(d, home: Path, root: Path) -> dict:
    """What the outsider tries while the operator's runs go on: each ``flwr`` command's exit code and output."""
    deadline = time.monotonic() + 600
    running = []
    while not running and time.monotonic() < deadline:
        running = [int(r["run-id"]) for r in d.flwr_json("ls", "fedica").get("runs", []) if str(r.get("status")).startswith("running")]
        time.sleep(1)
    assert running, "no run of the operator's was seen running"
    key, public = make_node_key(root / "keys", "outsider")

    def flwr(*args):
        # To a file, not a pipe, and in a session of its own, stopped after: the refused `flwr run` printed its 403 and
        # exited at once, while a process it had started held the pipe open until the 120 s timeout (three CI runs).
        with tempfile.TemporaryFile(mode="w+") as output:
            process = subprocess.Popen([processes.flower_executable("flwr"), *args], env=processes.flower_environment(home),
                                       cwd=str(root), stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       text=True, start_new_session=True)
            try:
                code = process.wait(timeout=120)
            finally:
                processes.signal_groups([process.pid], signal.SIGKILL)
            output.seek(0)
            return {"exit": code, "output": output.read()}

    return {
        "ls": flwr("ls", "fedica", "--format", "json"),
        "register": flwr("supernode", "register", str(public), "fedica", "--format", "json"),
        "run": flwr("run", str(d.app_dir()), "fedica", "--format", "json"),
        "log": flwr("log", str(running[0]), "fedica", "--show"),
        "stop": flwr("stop", str(running[0]), "fedica", "--format", "json"),
        "target_run": running[0],
    }


def _tls_job(root):
    """TLS with SuperNode authentication: FedGEM, RF-ICA and a run that fails, at once; an intruder with an unregistered key."""
    options = _options(tls=True, node_auth=True)
    runs = {
        "fedgem": config_overrides(compose(["engine=deployment"] + FEDGEM + _engine_overrides(options))),
        "rfica": config_overrides(compose(["engine=deployment"] + RFICA + _engine_overrides(options))),
        "failing": ["algorithm=rfica", "engine=deployment", "scenario.n_clients=0"],
    }
    intruder_port = free_ports(2)
    spoofer_port = intruder_port + 1

    def job():
        out = {}
        with contextlib.ExitStack() as stack:
            d = stack.enter_context(LocalDeployment(options, [{"partition-id": i, "num-partitions": 3} for i in range(3)],
                                                    root / "tls" / "deployment"))
            recorder = _ProcessRecorder(d)
            # Local processes without the deployment's SuperExec secret: Flower's own SuperExec, polling
            # SuperNode 0's and the SuperLink's Runtime APIs for tasks it would run (and answer) itself. A
            # refused SuperExec exits, so each poller starts one again and again while the runs go on.
            pollers = {name: processes.start_process(
                f"secretless SuperExec on {name}",
                [sys.executable, "-c", POLL_AGAIN, processes.flower_executable("flower-superexec"),
                 "--runtime-api-address", address, *transport],
                root / "tls" / f"poller-{name}.log", processes.flower_environment(root / "poller-home" / name), root)
                for name, address, transport in [
                    ("supernode-0", f"127.0.0.1:{options.supernode_port}", ["--insecure"]),
                    ("superlink", f"127.0.0.1:{options.superlink_port}", ["--root-certificates", str(d.tls.ca_cert)])]}
            # Stopped however the job ends: a CI run whose outsider timed out left both looping after the suite.
            stack.callback(processes.terminate, list(pollers.values()), 10)
            poller_recorder = _ProcessRecorder(SimpleNamespace(processes=lambda: list(pollers.values())))
            key, _ = make_node_key(root / "intruder-key", "intruder")
            # It claims to be site 0: admitted, it would change both results.
            intruder = d.start_supernode(3, {"partition-id": 0, "num-partitions": 3}, private_key=key, port=intruder_port, name="intruder")
            # A key the operator registered by mistake (or a site's stolen key): admitted, and it claims site 0
            # too; the run's binding of partitions to nodes must leave it out.
            spoofer_key, spoofer_public = make_node_key(root / "spoofer-key", "spoofer")
            d.register_node_keys([spoofer_public])
            outsider = stack.enter_context(_RemotePeer(d.options.superlink_port))
            # The spoofer dials from the outsider's address: a site's SuperNode needs only the Fleet API, which
            # fedica-superlink serves to any peer.
            spoofer = d.start_supernode(4, {"partition-id": 0, "num-partitions": 3}, private_key=spoofer_key,
                                        port=spoofer_port, name="spoofer", superlink=f"127.0.0.1:{outsider.port}")
            out["spoofer_id"] = d.await_supernode(spoofer, time.monotonic() + 120)
            outsider_home = _outsider_cli_home(root / "outsider", outsider.port, d.tls.ca_cert)
            d.app_dir()  # built and installed before the runs, so that the outsider's wait for one starts with them
            with ThreadPoolExecutor(max_workers=len(runs) + 1) as pool:
                futures = {name: pool.submit(d.run, overrides, root / "tls" / name) for name, overrides in runs.items()}
                out["outsider"] = pool.submit(_outsider_actions, d, outsider_home, root / "outsider").result()
            for name, future in futures.items():
                out[name] = future.exception() if name == "failing" else future.result()
            out["pollers_alive"] = {name: poller.alive() for name, poller in pollers.items()}
            poller_recorder.stop()
            out["poller_commands"] = list(poller_recorder.commands.values())
            processes.terminate(list(pollers.values()), 10)
            out["poller_logs"] = {name: poller.log_text() for name, poller in pollers.items()}
            out["superexec_logs"] = {name: process.log_text() for name, process in d.superexecs.items()}
            out["intruder_exit"] = intruder.popen.wait(timeout=60)
            out["intruder_log"] = intruder.log_text()
            out["nodes"] = d.list_supernodes()
            out["node_ids"] = list(d.node_ids)
            out["runs_listed"] = [int(r["run-id"]) for r in d.flwr_json("ls", "fedica").get("runs", [])]
            out["installed_apps"] = {home.name: sorted(p.name for p in (home / "apps").iterdir())
                                     for home in (d.temp / "flwr-home").iterdir() if (home / "apps").is_dir()}
        out["left"] = _still_running(recorder.stop())
        return out

    return job


def _killed_job(root):
    """FedGEM through run_deployment; SuperNode KILLED is SIGKILLed as soon as round 2's message reaches it."""
    options = _options()
    cfg = compose(["engine=deployment"] + FEDGEM + _engine_overrides(options)
                  + [f"round_timeout={KILLED_TIMEOUT}", f"engine.out_dir={root / 'killed'}"])

    def job():
        out = {}

        def kill_in_round_two(d):
            node = d.supernodes[KILLED]
            # Messages: init, round 1, round 2 (all "train").
            _wait_for(lambda: node.log_text().count("Receiving: train.") >= 3, 600, "round 2 never reached the node")
            d.stop_supernode(KILLED, signal.SIGKILL)
            out["killed"] = True

        def on_ready(d):
            out["recorder"] = _ProcessRecorder(d)
            threading.Thread(target=kill_in_round_two, args=(d,), daemon=True).start()

        out["result"] = run_deployment(cfg, on_ready=on_ready)
        out["left"] = _still_running(out.pop("recorder").stop())
        out["ports_free"] = _ports_free(options)
        return out

    return job


def _silent_job(root):
    """RF-ICA through run_deployment; SuperNode SILENT stays connected but never answers (its ClientApp launcher is frozen)."""
    options = _options()
    cfg = compose(["engine=deployment"] + RFICA + _engine_overrides(options)
                  + [f"round_timeout={SILENT_TIMEOUT}", f"engine.out_dir={root / 'silent'}"])

    def job():
        out = {}

        def freeze_launcher(d):
            # The node's SuperExec (the only process with the secret to take its tasks) stops: the node stays
            # connected, and nothing answers for it.
            os.kill(d.superexecs[f"supernode-{SILENT}"].pid, signal.SIGSTOP)
            out["recorder"] = _ProcessRecorder(d)

        out["result"] = run_deployment(cfg, on_ready=freeze_launcher)
        out["left"] = _still_running(out.pop("recorder").stop())
        out["ports_free"] = _ports_free(options)
        return out

    return job


def _interrupt_job(root):
    """fedica-deploy as a command, interrupted (SIGINT, as Ctrl-C) while its run is going."""
    options = _options(n_nodes=2)
    out_dir = root / "interrupt"
    # As from a terminal: a SIGINT that this test's own parent ignores (a background job's) must not be inherited.
    with_default_sigint = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                           "os.execv(sys.argv[1], sys.argv[1:])"]
    command = [*with_default_sigint, sys.executable, "-m", "fedica.scripts.deploy", "scenario.n_clients=2", "scenario.n_normal=200000", "scenario.r=3",
               "--superlink-port", str(options.superlink_port), "--supernode-port", str(options.supernode_port),
               "--out-dir", str(out_dir)]

    def job():
        root.mkdir(parents=True, exist_ok=True)
        stderr_path = root / "interrupt.stderr"
        with open(stderr_path, "w") as stderr:
            launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, cwd=root, text=True)
        logs = out_dir / "deployment"

        def log_has(name, text):
            path = logs / name
            return path.exists() and text in path.read_text(errors="replace")

        try:
            # Interrupt once the ServerApp runs and both SuperNodes have received their message.
            _wait_for(lambda: log_has("superlink.log", "Started task"), 300, "the run never started")
            _wait_for(lambda: all(log_has(f"supernode-{i}.log", "Receiving: train") for i in range(2)), 120, "no message reached the SuperNodes")
            pids = _process_tree([launcher.pid]) - {launcher.pid}
            launcher.send_signal(signal.SIGINT)
            code = launcher.wait(timeout=120)
        finally:
            # Should the test fail on the way, no process of it may outlive it.
            deploy.terminate([deploy.ManagedProcess("fedica-deploy", launcher, stderr_path)], 5.0)
        partial = out_dir / "partial_result.json"
        return {"code": code, "stderr": stderr_path.read_text(), "pids": pids, "left": _still_running(pids),
                "ports_free": _ports_free(options, 2),
                "partial": json.loads(partial.read_text()) if partial.exists() else None}

    return job


class _Echoed(logging.Handler):
    """What fedica's log shows of the runs: the launcher's echo of each ServerApp's own lines (``flwr log --stream``)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())

    def of_run(self, run_id):
        prefix = f"run {run_id}: "
        return [line[len(prefix):] for line in self.lines if line.startswith(prefix)]


ECHOED = _Echoed()


@pytest.fixture(scope="module")
def deployments(tmp_path_factory):
    root = tmp_path_factory.mktemp("deployments")
    jobs = {"killed": _killed_job(root), "tls": _tls_job(root), "silent": _silent_job(root), "interrupt": _interrupt_job(root)}
    # fedica-run and fedica-deploy log at INFO (configure_logging); these jobs call the launcher directly.
    launcher_log = logging.getLogger("fedica.deploy")
    level = launcher_log.level
    launcher_log.addHandler(ECHOED)
    launcher_log.setLevel(logging.INFO)
    try:
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            yield {name: pool.submit(_timed(job)) for name, job in jobs.items()}
    finally:
        launcher_log.removeHandler(ECHOED)
        launcher_log.setLevel(level)


def _spoofer_left_out(result, outcome):
    """The result without the book entry of the TLS job's spoofing node (the in-process run has none)."""
    spoofer = f"node-{outcome['spoofer_id']}"
    clients = {**result["clients"], "rejected": [r for r in result["clients"]["rejected"] if r["client"] != spoofer]}
    return {**result, "clients": clients}


def _outcome(deployments, name):
    outcome = deployments[name].result(timeout=900)
    print(f"deployment job {name!r} took {outcome['seconds']:.1f} s")
    return outcome


@pytest.mark.deployment
def test_rfica_deployment_equals_inprocess(deployments):
    outcome = _outcome(deployments, "tls")
    result = outcome["rfica"]
    assert result["engine"] == "deployment" and result["deployment"]["status"] == "finished:completed"
    _same_numbers(_inprocess(RFICA), _spoofer_left_out(result, outcome))
    run_id = result["deployment"]["run_id"]
    logs = {p.name for p in Path(result["deployment"]["log_dir"]).iterdir()}
    assert {"superlink.log", "supernode-0.log", "supernode-2.log", f"run-{run_id}.config.toml", f"run-{run_id}.serverapp.log"} <= logs


@pytest.mark.deployment
def test_fedgem_deployment_with_tls_and_node_auth_equals_inprocess(deployments):
    outcome = _outcome(deployments, "tls")
    result = outcome["fedgem"]
    spoofer = {"client": f"node-{outcome['spoofer_id']}", "round": "connect", "reason": "not one of the run's nodes; it is never asked"}
    assert result["clients"] == {"expected": 3, "answered": 3, "rejected": [spoofer]}
    assert outcome["rfica"]["clients"]["rejected"] == [spoofer]
    _same_numbers(_inprocess(FEDGEM), _spoofer_left_out(result, outcome))
    written = json.loads((Path(result["deployment"]["log_dir"]).parent / "fedgem" / "result.json").read_text())
    assert written["metrics"] == result["metrics"] and written["deployment"] == result["deployment"]
    assert outcome["left"] == []


@pytest.mark.deployment
def test_a_supernode_with_an_unregistered_key_is_refused(deployments):
    outcome = _outcome(deployments, "tls")
    assert outcome["intruder_exit"] != 0
    assert "Failed to activate SuperNode" in outcome["intruder_log"]
    assert "SuperNode ID" not in outcome["intruder_log"]
    assert sorted(int(n["node-id"]) for n in outcome["nodes"]) == sorted(outcome["node_ids"] + [outcome["spoofer_id"]])


@pytest.mark.deployment
def test_a_local_process_without_the_secret_takes_no_task(deployments):
    # Row 1 of issue 43: a secretless process polling SuperNode 0's Runtime API took the site's task and
    # answered for it. With process isolation and the SuperExec secret, it polled through three runs
    # (it stayed up) and started nothing; the deployment's own SuperExecs ran every task.
    outcome = _outcome(deployments, "tls")
    assert outcome["pollers_alive"] == {"supernode-0": True, "superlink": True}
    for name, log in outcome["poller_logs"].items():
        # Each attempt was refused at its first poll and ended; none started an app process.
        assert log.count("Starting Flower SuperExec") >= 3 and "Start `flwr-" not in log, (name, log)
    commands = outcome["poller_commands"]
    assert sum("flower-superexec" in command for command in commands) >= 6
    assert not [command for command in commands if "flwr-clientapp" in command or "flwr-serverapp" in command]
    assert outcome["superexec_logs"]["supernode-0"].count("Start `flwr-clientapp` process") >= 3
    assert outcome["rfica"]["clients"]["answered"] == outcome["fedgem"]["clients"]["answered"] == 3


@pytest.mark.deployment
def test_an_outsider_with_the_ca_file_can_neither_submit_list_read_stop_nor_register(deployments):
    outcome = _outcome(deployments, "tls")
    actions = outcome["outsider"]
    for name in ("ls", "register", "run", "log", "stop"):
        assert "403 Forbidden" in actions[name]["output"], (name, actions[name])
    # The run it tried to stop completed, and no run of the outsider's was created.
    ids = {outcome[name]["deployment"]["run_id"] for name in ("fedgem", "rfica")}
    assert actions["target_run"] in ids | {outcome["failing"].run_id}
    assert all(outcome[name]["deployment"]["status"] == "finished:completed" for name in ("fedgem", "rfica"))
    assert len(outcome["runs_listed"]) == 3, outcome["runs_listed"]
    # Its SuperNode-side counterpart, a node dialling from the outsider's address, was served by the Fleet API.
    assert outcome["spoofer_id"] in [int(n["node-id"]) for n in outcome["nodes"]]


@pytest.mark.deployment
def test_the_app_is_installed_once_before_the_runs_that_share_it(deployments):
    # Flower installs a run's FAB when it arrives; three runs at once raced for one folder ("Cannot find
    # pyproject.toml"). The deployment installs it first, and the runs' FAB is that one: one folder per home.
    installed = _outcome(deployments, "tls")["installed_apps"]
    assert {"superlink", "supernode-0", "supernode-1", "supernode-2"} <= set(installed)
    assert all(len(apps) == 1 for apps in installed.values()), installed
    assert len({apps[0] for apps in installed.values()}) == 1


@pytest.mark.deployment
def test_a_failed_run_is_reported_as_failed_with_flowers_reason(deployments):
    failed = _outcome(deployments, "tls")["failing"]
    assert isinstance(failed, RunFailed)
    assert failed.status == "finished:failed"
    assert "n_clients" in failed.details  # the ServerApp's exception, as Flower reports it
    assert failed.log_path.exists() and "n_clients" in failed.log_path.read_text()


@pytest.mark.deployment
def test_fedgem_finishes_without_a_supernode_killed_mid_rounds(deployments):
    outcome = _outcome(deployments, "killed")
    result = outcome["result"]
    assert outcome.get("killed")
    lost = [r for r in result["clients"]["rejected"] if r["client"] == KILLED]
    dropped_in = lost[0]["round"]
    assert dropped_in in (1, 2), "the node was killed during the collaborative rounds"
    assert {r["round"] for r in lost} >= {dropped_in, "final"}
    # No healthy client is rejected; FedGEM goes on with the two others.
    assert not [r for r in result["clients"]["rejected"] if r["client"] in (0, 1)]
    assert result["clients"]["answered"] == 2
    assert [h["clients"] for h in result["history"]] == [[0, 1, 2] if h["round"] < dropped_in else [0, 1] for h in result["history"]]
    assert sorted(result["fedgem"]["client_mapping"]) == ["0", "1"]
    # The launcher showed the ServerApp's rounds as they went (issue 13, item 1).
    echoed = ECHOED.of_run(result["deployment"]["run_id"])
    assert any(re.search(r"INFO fedica\.server\] FedGEM round [12]/2: [23] clients", line) for line in echoed), echoed
    # The remaining clients' result is exactly FedGEM's when that client fails from the same round on.
    reference = _inprocess(FEDGEM, lost=(KILLED, [str(r) for r in range(dropped_in, 3)] + ["final"]))
    for key in ("metrics", "history", "fedgem"):
        _same_numbers(reference[key], result[key], key)
    assert outcome["left"] == [] and outcome["ports_free"]


@pytest.mark.deployment
def test_rfica_completes_after_the_timeout_without_a_silent_node(deployments):
    outcome = _outcome(deployments, "silent")
    result = outcome["result"]
    assert result["clients"]["answered"] == 2
    [rejected] = result["clients"]["rejected"]
    # The launcher bound every partition to its node, so the books name the silent client, not only its node.
    assert rejected["client"] == SILENT and rejected["round"] == 1
    assert re.fullmatch(rf"no reply within {SILENT_TIMEOUT}(\.0)? s", rejected["reason"])
    assert result["timings"]["total"] >= SILENT_TIMEOUT
    assert result["rfica"]["client_partitions"] == [0, 1]
    # While the stage waited for the silent node, the launcher showed the ServerApp's progress lines (issue 13, item 1).
    echoed = ECHOED.of_run(result["deployment"]["run_id"])
    assert any(re.search(r"INFO fedica\.server\] \S+ 1: 2 of 3 replies after \d+ s$", line) for line in echoed), echoed
    reference = _inprocess(RFICA, lost=(SILENT, ["1"]))
    _same_numbers(reference["metrics"], result["metrics"], "metrics")
    assert outcome["left"] == [] and outcome["ports_free"]  # the frozen process was stopped too


@pytest.mark.deployment
def test_ctrl_c_stops_every_process(deployments):
    outcome = _outcome(deployments, "interrupt")
    assert outcome["code"] == 130, outcome["stderr"][-3000:]
    assert "interrupted" in outcome["stderr"]
    # The partial result says so too (not what the ServerApp saw as its SuperNodes were stopped).
    assert outcome["partial"]["status"].startswith("interrupted"), outcome["partial"]
    assert len(outcome["pids"]) >= 5  # SuperLink, 2 SuperNodes and their helpers were running
    assert outcome["left"] == []
    assert outcome["ports_free"]
