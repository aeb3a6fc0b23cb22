"""A SuperLink and SuperNodes on this machine (:class:`LocalDeployment`), and :func:`run_deployment`."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedica.results import PARTIAL_RESULT_FILE, write_json_atomic

from .bundle import build_app, toml_string, write_run_config
from .errors import DeploymentError, RunFailed
from .options import CONNECTION, DeploymentOptions, check_ports_free, join_host_port
from .overrides import config_overrides, resolve_out_dir
from .processes import (
    KEPT_FLOWER_VARIABLES,
    ManagedProcess,
    flower_environment,
    flower_executable,
    signal_groups,
    sigterm_raises_interrupt,
    start_process,
    terminate,
    uninterruptible,
)
from .secret import make_superexec_secret
from .supernodes import deployment_node_configs, node_config_arg
from .tls import TlsFiles, certificate_names, make_node_key, make_tls_files

log = logging.getLogger("fedica.deploy")

NODE_ID_PATTERN = re.compile(r"SuperNode ID: (\d+)")
COMPLETED = "finished:completed"
# Seconds between two `flwr ls` status checks when no log line says the run ended (each check starts a Python process).
STATUS_FALLBACK_INTERVAL = 15.0
CLI_TIMEOUT = 120.0


class LocalDeployment:
    """A SuperLink and one SuperNode per node config, on this machine, for as long as the ``with`` block runs.

    Parameters
    ----------
    options : DeploymentOptions
    node_configs : sequence of mapping
        One node config per SuperNode (``partition-id``, ``num-partitions``, optional ``data-path``).
    log_dir : pathlib.Path
        Receives ``superlink.log``, ``supernode-<i>.log`` and the run's files.

    Examples
    --------
    >>> with LocalDeployment(options, configs, out / "deployment") as deployment:   # doctest: +SKIP
    ...     result = deployment.run(overrides, out)
    """

    def __init__(self, options: DeploymentOptions, node_configs: Sequence[Mapping[str, Any]], log_dir: Path):
        self.options = options
        self.node_configs = [dict(config) for config in node_configs]
        self.log_dir = Path(log_dir).resolve()
        self.superlink: ManagedProcess | None = None
        self.supernodes: list[ManagedProcess] = []
        # The SuperExec of the SuperLink and of each SuperNode: the only processes that hold the secret
        # (``superexec.secret``) their Runtime API asks of whoever takes a task.
        self.superexecs: dict[str, ManagedProcess] = {}
        self.superexec_secret: Path | None = None
        self.node_ids: list[int] = []
        self.tls: TlsFiles | None = None
        self._temp: Path | None = None
        self._extra: list[ManagedProcess] = []
        self._app: Path | None = None
        self._fab: Path | None = None
        self._node_homes: list[Path] = []  # the FLWR_HOME of the SuperLink and of each SuperNode: where a run's FAB is installed
        self._app_lock = threading.Lock()

    # -- lifecycle

    def __enter__(self) -> LocalDeployment:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def temp(self) -> Path:
        if self._temp is None:
            self._temp = Path(tempfile.mkdtemp(prefix="fedica-deploy-"))
        return self._temp

    @property
    def cli_home(self) -> Path:
        """The FLWR_HOME of the ``flwr`` commands (holds the connection to this SuperLink)."""
        return self.temp / "flwr-home" / "cli"

    def start(self) -> None:
        """Check the ports, start the SuperLink, register node keys (node_auth), start and await the SuperNodes."""
        options = self.options
        check_ports_free(options, len(self.node_configs))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        if options.tls:
            self.tls = make_tls_files(self.temp / "certs", certificate_names(options))
        self.superexec_secret = make_superexec_secret(self.temp / "superexec.secret")
        ignored = sorted(key for key in os.environ if key.startswith("FLWR_") and key not in KEPT_FLOWER_VARIABLES)
        if ignored:
            log.warning("the deployment's Flower processes do not inherit %s from this environment", ", ".join(ignored))
        self._write_cli_config()
        self.superlink = self._start_superlink()
        self._await_superlink(started + options.startup_timeout)
        self._start_superexec("superlink", self.superlink, self.options.superlink_address, tls=self.tls is not None)
        keys: list[Path | None] = [None] * len(self.node_configs)
        if options.node_auth:
            pairs = [make_node_key(self.temp / "keys", f"supernode-{i}") for i in range(len(self.node_configs))]
            self.register_node_keys([public for _, public in pairs])
            keys = [private for private, _ in pairs]
        for i, (config, key) in enumerate(zip(self.node_configs, keys)):
            self.supernodes.append(self.start_supernode(i, config, private_key=key))  # tracked at once, for close()
        self.node_ids = [self.await_supernode(node, started + options.startup_timeout) for node in self.supernodes]
        log.info("deployment ready in %.1f s: SuperLink %s (%s), %d SuperNodes; logs in %s",
                 time.monotonic() - started, options.superlink_address, "TLS" if options.tls else "insecure",
                 len(self.supernodes), self.log_dir)

    def close(self) -> None:
        """Stop every process (SuperNodes first, so that they leave the federation cleanly) and delete the temporary files."""
        with uninterruptible():
            terminate(self.supernodes + self._extra + list(self.superexecs.values()), self.options.shutdown_grace)
            if self.superlink is not None:
                terminate([self.superlink], self.options.shutdown_grace)
            self.superexecs.clear()
            if self._temp is not None:
                shutil.rmtree(self._temp, ignore_errors=True)
                self._temp = self._app = self._fab = None
                self._node_homes.clear()

    def processes(self) -> list[ManagedProcess]:
        return ([self.superlink] if self.superlink else []) + self.supernodes + self._extra + list(self.superexecs.values())

    def _isolation_arguments(self) -> list[str]:
        """Process isolation: the SuperLink or SuperNode runs no SuperExec of its own (whose Runtime API
        requests Flower leaves unsigned in subprocess mode) and hands tasks only to a signed request."""
        return ["--isolation", "process", "--superexec-auth-secret-file", str(self.superexec_secret)]

    def _start_superexec(self, name: str, owner: ManagedProcess, runtime_address: str, *, tls: bool) -> ManagedProcess:
        """Flower's SuperExec for ``owner`` (the SuperLink or a SuperNode), signing with the deployment's secret.

        It exits with ``owner`` (``--parent-pid``); :meth:`close` stops it too.
        """
        command = [flower_executable("flower-superexec"), "--runtime-api-address", runtime_address,
                   "--superexec-auth-secret-file", str(self.superexec_secret), "--parent-pid", str(owner.pid)]
        command += ["--root-certificates", str(self.tls.ca_cert)] if tls else ["--insecure"]
        env = flower_environment(self.temp / "flwr-home" / name)
        process = start_process(f"SuperExec of {owner.name}", command, self.log_dir / f"{name}-superexec.log", env, self.log_dir)
        self.superexecs[name] = process
        return process

    # -- processes

    def _write_cli_config(self) -> None:
        self.cli_home.mkdir(parents=True, exist_ok=True)
        lines = ["[superlink]", f"default = {toml_string(CONNECTION)}", "", f"[superlink.{CONNECTION}]",
                 f"address = {toml_string(self.options.superlink_address)}"]
        if self.tls is None:
            lines.append("insecure = true")
        else:
            lines.append(f"root-certificates = {toml_string(str(self.tls.ca_cert))}")
        (self.cli_home / "config.toml").write_text("\n".join(lines) + "\n")

    def _start_superlink(self) -> ManagedProcess:
        options = self.options
        command = [
            # Flower's SuperLink behind fedica's operator guard (scripts/deploy/superlink.py)
            sys.executable, "-m", "fedica.scripts.deploy.superlink",
            "--host", options.host, "--port", str(options.superlink_port),
            "--database", str(self.temp / "superlink-state.db"),
            "--disable-runtime-dependency-installation",
            "--max-reply-mib", str(options.max_reply_mib),
            *self._isolation_arguments(),
        ]
        if self.tls is None:
            command.append("--insecure")
        else:
            command += ["--ssl-ca-certfile", str(self.tls.ca_cert), "--ssl-certfile", str(self.tls.server_cert),
                        "--ssl-keyfile", str(self.tls.server_key)]
            if options.node_auth:
                command.append("--enable-supernode-auth")
        home = self.temp / "flwr-home" / "superlink"
        with self._app_lock:
            self._node_homes.append(home)
        env = flower_environment(home)
        # The ServerApp runs with the SuperLink's working directory.
        return start_process("SuperLink", command, self.log_dir / "superlink.log", env, self.log_dir)

    def _await_superlink(self, deadline: float) -> None:
        """Poll the SuperLink's /health endpoint (over TLS when enabled) until it answers 200."""
        import ssl
        import urllib.error
        import urllib.request

        scheme = "https" if self.tls else "http"
        url = f"{scheme}://{self.options.superlink_address}/health"
        context = ssl.create_default_context(cafile=str(self.tls.ca_cert)) if self.tls else None
        # Straight to the SuperLink, never through a proxy from the environment.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
        while True:
            if not self.superlink.alive():
                raise DeploymentError(
                    f"the SuperLink exited (code {self.superlink.popen.returncode}) before it was ready; "
                    f"{self.superlink.log_path}:\n{self.superlink.log_tail()}"
                )
            try:
                with opener.open(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise DeploymentError(f"the SuperLink did not answer {url} within {self.options.startup_timeout:.0f} s; see {self.superlink.log_path}")
            time.sleep(0.2)

    def start_supernode(
        self, index: int, node_config: Mapping[str, Any], *, private_key: Path | None = None, port: int | None = None,
        name: str | None = None, superlink: str | None = None,
    ) -> ManagedProcess:
        """Start one SuperNode (its Runtime API on ``supernode_port + index`` unless ``port`` is given).

        ``superlink`` is the address it dials (default: the SuperLink's), e.g. a relay in a test.
        """
        options = self.options
        port = options.supernode_port + index if port is None else port
        command = [
            flower_executable("flower-supernode"),
            "--superlink", options.superlink_address if superlink is None else superlink,
            "--port", str(port),
            "--node-config", node_config_arg(node_config),
            *self._isolation_arguments(),
        ]
        if self.tls is None:
            command.append("--insecure")
        else:
            command += ["--root-certificates", str(self.tls.ca_cert)]
        if private_key is not None:
            command += ["--auth-supernode-private-key", str(private_key)]
        name = name or f"supernode-{index}"
        home = self.temp / "flwr-home" / name
        with self._app_lock:
            self._node_homes.append(home)
            if self._fab is not None:
                self._install_fab([home])
        env = flower_environment(home)
        process = start_process(f"SuperNode {name}", command, self.log_dir / f"{name}.log", env, self.log_dir)
        # Its Runtime API serves loopback without TLS (Flower's default for --host).
        self._start_superexec(name, process, join_host_port("127.0.0.1", port), tls=False)
        if len(self.supernodes) >= len(self.node_configs):
            self._extra.append(process)  # a node beyond the scenario's (say, an intruder in a test); stopped on close too
        return process

    def await_supernode(self, process: ManagedProcess, deadline: float) -> int:
        """Wait until the SuperNode's log reports its node id (it registered and was activated); return the id."""
        while True:
            match = NODE_ID_PATTERN.search(process.log_text())
            if match:
                return int(match.group(1))
            if not process.alive():
                raise DeploymentError(
                    f"{process.name} exited (code {process.popen.returncode}) before joining the federation; "
                    f"{process.log_path}:\n{process.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise DeploymentError(f"{process.name} did not join within {self.options.startup_timeout:.0f} s; see {process.log_path}")
            time.sleep(0.2)

    def stop_supernode(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to SuperNode ``index``'s whole process group (SIGKILL: a crashed site)."""
        process = self.supernodes[index]
        signal_groups([process.pid], sig)
        if sig == signal.SIGKILL:
            process.popen.wait(timeout=10)

    # -- the flwr CLI

    def flwr(self, *args: str, timeout: float = CLI_TIMEOUT) -> subprocess.CompletedProcess:
        """Run one ``flwr`` command against this deployment (its own FLWR_HOME)."""
        return subprocess.run(
            [flower_executable("flwr"), *args], env=flower_environment(self.cli_home), cwd=str(self.temp),
            capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
        )

    def flwr_json(self, *args: str, timeout: float = CLI_TIMEOUT) -> dict[str, Any]:
        """``flwr <args> --format json``, parsed; raise DeploymentError if it failed."""
        done = self.flwr(*args, "--format", "json", timeout=timeout)
        data = _first_json_object(done.stdout)
        if done.returncode != 0 or not isinstance(data, dict) or data.get("success") is False:
            raise DeploymentError(
                f"`flwr {' '.join(args)}` failed (exit {done.returncode}): "
                f"{(data or {}).get('error-message') if isinstance(data, dict) else ''}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
        return data

    def register_node_keys(self, public_keys: Sequence[Path]) -> list[int]:
        """Register SuperNode public keys with the SuperLink (``flwr supernode register``), in parallel."""
        home = flower_environment(self.cli_home)
        calls = [
            subprocess.Popen([flower_executable("flwr"), "supernode", "register", str(key), CONNECTION, "--format", "json"],
                             env=home, cwd=str(self.temp), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for key in public_keys
        ]
        node_ids = []
        for key, call in zip(public_keys, calls):
            stdout, stderr = call.communicate(timeout=CLI_TIMEOUT)
            data = _first_json_object(stdout)
            if call.returncode != 0 or not isinstance(data, dict) or not data.get("success"):
                raise DeploymentError(f"registering SuperNode key {key} failed (exit {call.returncode}): {stdout[-2000:]}{stderr[-2000:]}")
            node_ids.append(int(data["node-id"]))
        return node_ids

    def list_supernodes(self) -> list[dict[str, Any]]:
        """The SuperLink's view of its SuperNodes (``flwr supernode list``)."""
        return list(self.flwr_json("supernode", "list", CONNECTION).get("nodes", []))

    # -- runs

    def submit(self, app_dir: Path, run_config: Path) -> int:
        """Submit the App with ``flwr run`` and return the run id (the run continues in the background)."""
        data = self.flwr_json("run", str(app_dir), CONNECTION, "--run-config", str(run_config))
        run_id = int(data["run-id"])
        log.info("run %d submitted", run_id)
        return run_id

    def run_status(self, run_id: int) -> dict[str, Any]:
        """``flwr ls --run-id``: the run's entry (``status``, ``status-details``, ...)."""
        runs = self.flwr_json("ls", CONNECTION, "--run-id", str(run_id)).get("runs", [])
        if not runs:
            raise DeploymentError(f"the SuperLink does not know run {run_id}")
        return runs[0]

    def wait(self, run_id: int, *, timeout: float | None = None, done_file: Path | None = None) -> dict[str, Any]:
        """Wait for the run's final status and return its ``flwr ls`` entry.

        ``flwr ls`` starts a Python process, so it is asked when the SuperLink's log reports that
        the run's ServerApp task finished, when ``done_file`` (the result the ServerApp writes
        last) appears, and otherwise only every ``STATUS_FALLBACK_INTERVAL`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        finished_line = re.compile(rf"Finished task \d+ of run {run_id}\b")
        log_cursor, log_carry, finished = 0, "", False
        next_check = time.monotonic() + STATUS_FALLBACK_INTERVAL
        while True:
            if self.superlink is None or not self.superlink.alive():
                raise DeploymentError(f"the SuperLink stopped during run {run_id}; see {self.log_dir / 'superlink.log'}")
            new_text, log_cursor = _read_from(self.superlink.log_path, log_cursor)
            finished = finished or bool(finished_line.search(log_carry + new_text))
            log_carry = (log_carry + new_text)[-300:]
            finished = finished or (done_file is not None and done_file.exists())
            now = time.monotonic()
            if finished or now >= next_check:
                entry = self.run_status(run_id)
                if str(entry.get("status", "")).startswith("finished"):
                    return entry
                # The status can trail the log line by a moment.
                next_check = time.monotonic() + (1.0 if finished else STATUS_FALLBACK_INTERVAL)
                finished = False
            if deadline is not None and now > deadline:
                self.flwr("stop", str(run_id), CONNECTION)
                entry = self.run_status(run_id)
                raise RunFailed(run_id, str(entry.get("status")), f"did not finish within {timeout:.0f} s (engine.run_timeout); stopped",
                                self.save_run_log(run_id))
            time.sleep(0.25)

    @contextlib.contextmanager
    def follow(self, run_id: int):
        """While the block runs, echo the ServerApp's own progress lines (``flwr log --stream``) to fedica's log.

        Without it a deployment's rounds show only in the run's log on the SuperLink machine. The
        follower is stopped by its process id when the block ends.
        """
        follower = subprocess.Popen(
            [flower_executable("flwr"), "log", str(run_id), CONNECTION, "--stream"], env=flower_environment(self.cli_home),
            cwd=str(self.temp), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)

        def echo() -> None:
            for line in follower.stdout:
                if "fedica.server]" in line or "fedica.baselines]" in line:
                    log.info("run %d: %s", run_id, line.rstrip())

        reader = threading.Thread(target=echo, daemon=True)
        reader.start()
        try:
            yield
        finally:
            follower.terminate()
            try:
                follower.wait(timeout=10)
            except subprocess.TimeoutExpired:
                follower.kill()
                follower.wait()
            reader.join(timeout=5)

    def save_run_log(self, run_id: int) -> Path:
        """Write the run's log (the ServerApp's output, ``flwr log --show``) to ``run-<id>.serverapp.log``."""
        done = self.flwr("log", str(run_id), CONNECTION, "--show")
        path = self.log_dir / f"run-{run_id}.serverapp.log"
        path.write_text(done.stdout + done.stderr)
        return path

    def app_dir(self) -> Path:
        """The Flower App submitted by :meth:`run` (built once per deployment, and installed where it will run)."""
        with self._app_lock:
            if self._app is None:
                app = build_app(self.temp / "app")
                self._fab = self._build_fab(app)
                self._install_fab(self._node_homes)
                self._app = app
            return self._app

    def _build_fab(self, app: Path) -> Path:
        """``flwr build``: the FAB that ``flwr run`` will submit (Flower builds it deterministically: same files, same hash)."""
        out = self.temp / "fab"
        out.mkdir(exist_ok=True)
        done = subprocess.run([flower_executable("flwr"), "build", "--app", str(app)], env=flower_environment(self.cli_home),
                              cwd=str(out), capture_output=True, text=True, timeout=CLI_TIMEOUT, stdin=subprocess.DEVNULL)
        fabs = sorted(out.glob("*.fab"))
        if done.returncode != 0 or len(fabs) != 1:
            raise DeploymentError(f"`flwr build --app {app}` failed (exit {done.returncode}): {done.stdout[-2000:]}{done.stderr[-2000:]}")
        return fabs[0]

    def _install_fab(self, homes: Sequence[Path]) -> None:
        """Install the FAB in each FLWR_HOME before any run needs it.

        Flower 1.42's ServerApp and ClientApp processes install a run's FAB on arrival, and the second of two runs
        started at once finds the first one's half-copied folder, takes it as installed and fails with "Cannot find
        pyproject.toml". Installed beforehand, every run finds the folder complete.
        """
        assert self._fab is not None
        installs = [(home, subprocess.Popen([flower_executable("flwr"), "install", str(self._fab)], env=flower_environment(home),
                                            cwd=str(self.temp), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                            stdin=subprocess.DEVNULL)) for home in homes]
        for home, install in installs:
            output, _ = install.communicate(timeout=CLI_TIMEOUT)
            if install.returncode != 0:
                raise DeploymentError(f"`flwr install {self._fab.name}` in {home} failed (exit {install.returncode}): {output[-2000:]}")

    def run(self, overrides: Sequence[str], out_dir: Path, *, timeout: float | None = None) -> dict[str, Any]:
        """Submit fedica with ``overrides``, wait for it, and return the result the ServerApp wrote to ``out_dir``.

        Several runs may go on at once (from several threads), each with its own ``out_dir``.
        ``run-<id>.config.toml`` and ``run-<id>.serverapp.log`` are kept in the log folder.

        Raises
        ------
        RunFailed
            When the run ends other than ``finished:completed`` (Flower's status details included).
        """
        from fedica.results import RESULT_FILE

        out_dir = Path(out_dir).resolve()
        out_dir.mkdir(parents=True, exist_ok=True)
        result_path = out_dir / RESULT_FILE
        result_path.unlink(missing_ok=True)
        bound = {node: int(config["partition-id"]) for node, config in zip(self.node_ids, self.node_configs)}
        run_config = write_run_config(Path(tempfile.mkdtemp(prefix="run-", dir=self.temp)) / "run_config.toml", overrides,
                                      out_dir, bound)
        started = time.monotonic()
        run_id = self.submit(self.app_dir(), run_config)
        shutil.copyfile(run_config, self.log_dir / f"run-{run_id}.config.toml")
        with self.follow(run_id):
            entry = self.wait(run_id, timeout=timeout if timeout is not None else self.options.run_timeout, done_file=result_path)
        status = str(entry.get("status"))
        log_path = self.save_run_log(run_id)
        log.info("run %d ended as %s after %.1f s", run_id, status, time.monotonic() - started)
        if status != COMPLETED:
            raise RunFailed(run_id, status, str(entry.get("status-details", "")), log_path)
        if not result_path.exists():
            raise DeploymentError(f"run {run_id} completed but wrote no {result_path}; see {log_path}")
        result = json.loads(result_path.read_text())
        result["deployment"] = {"run_id": run_id, "status": status, "log_dir": str(self.log_dir)}
        write_json_atomic(result_path, result)  # the file says what the returned result says
        return result


def _read_from(path: Path, offset: int) -> tuple[str, int]:
    """The text appended to ``path`` since byte ``offset``, and the new offset."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except OSError:
        return "", offset
    return data.decode(errors="replace"), offset + len(data)


def _first_json_object(text: str) -> Any:
    start = text.find("{")
    if start < 0:
        return None
    try:
        return json.JSONDecoder().raw_decode(text[start:])[0]
    except ValueError:
        return None


def run_deployment(
    cfg: Mapping[str, Any], *, on_ready: Callable[[LocalDeployment], None] | None = None
) -> dict[str, Any]:
    """Run ``cfg`` on a real SuperLink and SuperNodes on this machine (``engine=deployment``).

    Parameters
    ----------
    cfg : mapping
        The resolved run configuration; ``cfg["engine"]`` holds conf/engine/deployment.yaml's keys.
    on_ready : callable, optional
        Called with the running :class:`LocalDeployment` before the run is submitted (to add
        SuperNodes, or to stop one in a fault test).

    Returns
    -------
    result : dict
        The ``result.json`` the ServerApp wrote (docs/INTERFACE.md section 3), plus ``deployment``: the run id,
        its final status and the folder of the processes' logs.

    Raises
    ------
    PortInUse, DeploymentError, RunFailed
    """
    options = DeploymentOptions.from_engine(cfg["engine"])
    overrides = config_overrides(cfg)
    # A resumed run goes on in the folder it resumes, where the ServerApp finds its journal.
    out_dir = Path(cfg["resume"]).resolve() if cfg.get("resume") else resolve_out_dir(options)
    try:
        # A resumed run's processes log beside the interrupted attempt's, which are kept.
        logs = out_dir / ("deployment" if not cfg.get("resume") else f"deployment-resumed-{time.strftime('%Y%m%d-%H%M%S')}")
        with sigterm_raises_interrupt(), LocalDeployment(options, deployment_node_configs(cfg), logs) as deployment:
            if on_ready is not None:
                on_ready(deployment)
            return deployment.run(overrides, out_dir)
    except KeyboardInterrupt:
        mark_interrupted(out_dir)
        raise


def mark_interrupted(out_dir: Path) -> Path:
    """Say in ``partial_result.json`` that the run was interrupted (what the ServerApp saw last, e.g. its
    SuperNodes going away as they were stopped, is kept as ``last_status``); written if the ServerApp wrote none."""
    path = Path(out_dir) / PARTIAL_RESULT_FILE
    try:
        partial = json.loads(path.read_text())
    except (OSError, ValueError):
        partial = {}
    if "status" in partial:
        partial["last_status"] = partial["status"]
    partial["status"] = "interrupted (Ctrl-C or SIGTERM): every process of the deployment was stopped"
    return write_json_atomic(path, partial)
