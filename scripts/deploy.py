"""``fedica-deploy``: run fedica on a real Flower deployment on this machine, or print the commands for many.

One ``flower-superlink`` and one ``flower-supernode`` per client are started, each in its
own process group with its own log file in the run's output folder; the Flower App (fedica's
installed packages, copied) is submitted with ``flwr run``; the launcher waits for the run's
final status (``flwr ls``), reads the ``result.json`` the ServerApp wrote, and stops every
process, also on Ctrl-C, on SIGTERM and when the run fails. Flower's own configuration lives in
a temporary ``FLWR_HOME`` (``~/.flwr`` is never touched).

Examples
--------
    fedica-deploy scenario.n_clients=3                                  # RF-ICA, 3 SuperNodes
    fedica-deploy algorithm=fedgem scenario.n_clients=4 --tls --node-auth
    fedica-deploy --print-commands --superlink-address link.example.org --tls --node-auth ...
    fedica-run engine=deployment ...                                    # the same, through fedica-run

The same run from Python is :func:`run_deployment`; :class:`LocalDeployment` gives the running
processes to code that needs them (tests that stop a node mid-run).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import ipaddress
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from importlib import metadata, util
from pathlib import Path
from typing import Any

log = logging.getLogger("fedica.deploy")

# Name of the SuperLink connection in the launcher's FLWR_HOME.
CONNECTION = "fedica"
# The packages that make up the Flower App; they are copied from where Python imports them.
# fedica's Flower side: subpackages of the installed fedica, top-level folders in a source checkout.
APP_SUBPACKAGES = ("server", "clients", "scripts", "conf")
APP_PUBLISHER = "fedica"
APP_COMPONENTS = {"serverapp": "fedica.server.app:app", "clientapp": "fedica.clients.app:app"}
APP_CONFIG = {"overrides": "", "out-dir": ""}
APP_DIR_NAME = "fedica-app"  # `flwr build` wants [A-Za-z][A-Za-z0-9-]*
# Environment of every Flower process: no telemetry, no update check, no per-run `uv sync`.
FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "PYTHONUNBUFFERED": "1",
}
NODE_ID_PATTERN = re.compile(r"SuperNode ID: (\d+)")
COMPLETED = "finished:completed"
# Seconds between two `flwr ls` status checks when no log line says the run ended (each check starts a Python process).
STATUS_FALLBACK_INTERVAL = 15.0
CLI_TIMEOUT = 120.0


class DeploymentError(RuntimeError):
    """The deployment could not be started, or a process of it failed."""


class PortInUse(DeploymentError):
    """A port the deployment needs is taken; raised before any process starts."""


class RunFailed(DeploymentError):
    """The submitted run did not finish as ``finished:completed``.

    Attributes
    ----------
    run_id : int
    status : str
        Flower's final status (``finished:failed``, ``finished:stopped``, or the last one seen).
    details : str
        Flower's status details (for a failed ServerApp, its exception).
    log_path : pathlib.Path or None
        The run's log as ``flwr log`` returned it.
    """

    def __init__(self, run_id: int, status: str, details: str, log_path: Path | None):
        self.run_id, self.status, self.details, self.log_path = run_id, status, details, log_path
        message = f"run {run_id} ended as {status}"
        if details:
            message += f": {details}"
        if log_path is not None:
            message += f" (ServerApp log: {log_path})"
        super().__init__(message)


# ---------------------------------------------------------------- options


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
        if not isinstance(options.host, str) or not options.host:
            raise ValueError(f"engine.host={options.host!r}: must be an address to listen on (127.0.0.1, 0.0.0.0, ...)")
        return options

    @property
    def connect_host(self) -> str:
        """The address local clients use to reach the SuperLink."""
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host

    @property
    def superlink_address(self) -> str:
        return _join_host_port(self.connect_host, self.superlink_port)


def _join_host_port(host: str, port: int) -> str:
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


# ---------------------------------------------------------------- the run's configuration


def config_overrides(cfg: Mapping[str, Any]) -> list[str]:
    """Hydra overrides that compose exactly ``cfg`` from ``conf/`` (what the ServerApp composes).

    The group choices come from the names in ``cfg``; every value that differs from what those
    choices compose is set (``key=value``), added (``+key=value``) or deleted (``~key``).

    Raises
    ------
    DeploymentError
        When the overrides do not compose back to ``cfg`` (checked, never assumed).
    """
    groups = [f"{group}={cfg[group]['name']}" for group in ("algorithm", "scenario", "engine")]
    base = compose(groups)
    overrides = groups + _diff_overrides(base, cfg, "")
    try:
        composed = compose(overrides)
    except Exception as err:  # noqa: BLE001 - Hydra and OmegaConf raise many types; all mean the same here
        raise DeploymentError(f"the run's configuration cannot be passed to the ServerApp as Hydra overrides: {err}") from err
    if composed != dict(cfg):
        raise DeploymentError(
            "the run's configuration cannot be reproduced with Hydra overrides for the ServerApp "
            f"(overrides: {' '.join(overrides)})"
        )
    return overrides


def _diff_overrides(base: Mapping[str, Any], cfg: Mapping[str, Any], prefix: str) -> list[str]:
    overrides = []
    for key, value in cfg.items():
        path = f"{prefix}{key}"
        if key not in base:
            overrides.append(f"+{path}={_hydra_value(value)}")
        elif isinstance(value, Mapping) and isinstance(base[key], Mapping):
            overrides += _diff_overrides(base[key], value, f"{path}.")
        elif value != base[key] or type(value) is not type(base[key]):
            overrides.append(f"{path}={_hydra_value(value)}")
    overrides += [f"~{prefix}{key}" for key in base if key not in cfg]
    return overrides


# Strings Hydra reads back unchanged without quotes (names, paths); anything else is quoted.
_PLAIN_HYDRA_STRING = re.compile(r"[A-Za-z_/][\w./-]*")


def _hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, str):
        if _PLAIN_HYDRA_STRING.fullmatch(value) and value.lower() not in ("null", "true", "false", "inf", "nan"):
            return value
        if '"' not in value and "\\" not in value:
            return f'"{value}"'
        # Hydra keeps backslashes as they are, except a run of them before a quote or at the end.
        escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
        return "'" + re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped) + "'"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{key}:{_hydra_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(item) for item in value) + "]"
    raise DeploymentError(f"cannot pass a value of type {type(value).__name__} to the ServerApp: {value!r}")


_COMPOSE_LOCK = threading.Lock()


def compose(overrides: Sequence[str]) -> dict[str, Any]:
    """:func:`fedica.server.app.compose_config`, usable inside a running ``@hydra.main`` (fedica-run) and from several threads."""
    from fedica.server.app import compose_config
    from hydra.core.global_hydra import GlobalHydra

    with _COMPOSE_LOCK:
        global_hydra = GlobalHydra.instance()
        running = global_hydra.hydra
        global_hydra.hydra = None  # compose_config initialises (and afterwards restores) its own Hydra
        try:
            return compose_config(list(overrides))
        finally:
            GlobalHydra.instance().hydra = running


def deployment_node_configs(cfg: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each SuperNode's node config: partition id and count, and for ``scenario=files`` its own data file."""
    from fedica.scripts.engines import node_configs

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


def _toml_string(value: str) -> str:
    # A JSON string is a valid TOML basic string (same escapes) as long as no astral character is escaped.
    return json.dumps(value, ensure_ascii=False)


def write_run_config(path: Path, overrides: Sequence[str], out_dir: Path) -> Path:
    """The run config for ``flwr run -c <file>``: a file, so that no quoting of the overrides can break."""
    text = (
        f"overrides = {_toml_string(' '.join(shlex.quote(o) for o in overrides))}\n"
        f"out-dir = {_toml_string(str(out_dir))}\n"
    )
    path.write_text(text)
    return path


def resolve_out_dir(options: DeploymentOptions) -> Path:
    """``engine.out_dir``, else the Hydra output folder of a running fedica-run, else ``outputs/deploy/<date>/<time>``."""
    if options.out_dir:
        return Path(options.out_dir).expanduser().resolve()
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir).resolve()
    now = datetime.datetime.now()
    return (Path("outputs") / "deploy" / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S")).resolve()


# ---------------------------------------------------------------- the Flower App


def app_pyproject() -> str:
    """``pyproject.toml`` of the submitted App: fedica's ``[tool.flwr.app]`` and nothing to install."""
    try:
        version = metadata.version("fedica")
    except metadata.PackageNotFoundError:
        version = "0.0.0"
    lines = [
        "[project]",
        'name = "fedica"',
        f"version = {_toml_string(version)}",
        'description = "fedica (RF-ICA and FedGEM) as a Flower App, built by fedica-deploy"',
        'license = "Apache-2.0"',
        "dependencies = []",
        "",
        "[tool.flwr.app]",
        f"publisher = {_toml_string(APP_PUBLISHER)}",
        "",
        "[tool.flwr.app.components]",
        *(f"{key} = {_toml_string(value)}" for key, value in APP_COMPONENTS.items()),
        "",
        "[tool.flwr.app.config]",
        *(f"{key} = {_toml_string(value)}" for key, value in APP_CONFIG.items()),
    ]
    return "\n".join(lines) + "\n"


def build_app(parent: Path) -> Path:
    """Write the Flower App to submit: fedica's packages copied from where they are imported, and a pyproject.

    Works for editable and regular installs alike, since the packages are found by import.
    """
    app_dir = Path(parent) / APP_DIR_NAME
    app_dir.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "test_*.py", "*_test.py")
    shutil.copytree(_package_folder("fedica"), app_dir / "fedica", ignore=ignore)
    for name in APP_SUBPACKAGES:
        # The bundle always has the installed layout (fedica/server, ...), whichever layout fedica runs from.
        if not (app_dir / "fedica" / name).is_dir():
            shutil.copytree(_package_folder(f"fedica.{name}"), app_dir / "fedica" / name, ignore=ignore)
    (app_dir / "pyproject.toml").write_text(app_pyproject())
    return app_dir


def _package_folder(package: str) -> Path:
    spec = util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DeploymentError(f"package {package!r} is not importable; is fedica installed in this Python ({sys.executable})?")
    return Path(next(iter(spec.submodule_search_locations)))


# ---------------------------------------------------------------- certificates and keys


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a run's certificate authority and the SuperLink's certificate."""

    ca_cert: Path
    server_cert: Path
    server_key: Path


def make_tls_files(folder: Path, names: Iterable[str], days: int = 30) -> TlsFiles:
    """A fresh CA and a SuperLink certificate signed by it, valid for ``names`` (host names or IP addresses).

    Parameters
    ----------
    folder : pathlib.Path
        Where ``ca.pem``, ``server.pem`` and ``server.key`` (mode 600) are written.
    names : iterable of str
        Subject alternative names; SuperNodes must reach the SuperLink under one of them.
    days : int
        Validity.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedica deployment CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    alt_names: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt_names.append(x509.DNSName(name))
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedica SuperLink")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    files = TlsFiles(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    files.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_secret(
        files.server_key,
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    return files


def make_node_key(folder: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode authentication key pair (EC P-384, OpenSSH format, as Flower 1.42 expects).

    Returns
    -------
    private_key, public_key : pathlib.Path
        ``<folder>/<name>`` (mode 600) and ``<folder>/<name>.pub``.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP384R1())
    private_path, public_path = folder / name, folder / f"{name}.pub"
    _write_secret(
        private_path,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()),
    )
    public_path.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n"
    )
    return private_path, public_path


def _write_secret(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def certificate_names(options: DeploymentOptions, extra: Iterable[str] = ()) -> list[str]:
    """Names the SuperLink certificate must carry: loopback, the listen address, and ``extra``."""
    names = ["localhost", "127.0.0.1", "::1"]
    if options.host not in ("0.0.0.0", "::", ""):
        names.append(options.host)
    return names + [name for name in extra if name]


# ---------------------------------------------------------------- processes


def flower_executable(name: str) -> str:
    """A Flower command of this Python's environment (next to ``sys.executable``), else from PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise DeploymentError(f"`{name}` was not found next to {sys.executable} nor on PATH; install flwr in this environment")
    return found


def flower_environment(flwr_home: Path) -> dict[str, str]:
    """The environment of one Flower process: its own FLWR_HOME, this Python's bin first on PATH."""
    env = dict(os.environ)
    env.update(FLOWER_ENV)
    env["FLWR_HOME"] = str(flwr_home)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # Flower's HTTP clients honour proxy variables; loopback traffic must not go through a proxy.
    loopback = ["127.0.0.1", "localhost", "::1"]
    for key in ("NO_PROXY", "no_proxy"):
        env[key] = ",".join([item for item in env.get(key, "").split(",") if item] + loopback)
    return env


@dataclass
class ManagedProcess:
    """A process the launcher started (in its own session and process group), with its log file."""

    name: str
    popen: subprocess.Popen
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 15) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


def start_process(name: str, command: Sequence[str], log_path: Path, env: Mapping[str, str], cwd: Path) -> ManagedProcess:
    """Start ``command`` in a new session (its own process group); stdout and stderr go to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as handle:
        handle.write(f"$ {shlex.join(command)}\n".encode())
        handle.flush()
        popen = subprocess.Popen(
            list(command), stdin=subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
            env=dict(env), cwd=str(cwd), start_new_session=True,
        )
    log.debug("started %s (pid %d): %s", name, popen.pid, shlex.join(command))
    return ManagedProcess(name, popen, log_path)


def _process_table() -> dict[int, tuple[int, int, str]]:
    """``pid -> (parent pid, process group, state)`` of every process on the machine."""
    table: dict[int, tuple[int, int, str]] = {}
    proc = Path("/proc")
    if proc.is_dir():
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            state, ppid, pgid = stat[stat.rindex(")") + 2:].split()[:3]
            table[int(entry.name)] = (int(ppid), int(pgid), state)
        return table
    # No /proc (macOS): ask ps.
    listing = subprocess.run(["ps", "-A", "-o", "pid=,ppid=,pgid=,stat="], capture_output=True, text=True, check=True)
    for line in listing.stdout.splitlines():
        pid, ppid, pgid, state = line.split()[:4]
        table[int(pid)] = (int(ppid), int(pgid), state[:1])
    return table


def _descendants(roots: Iterable[int], table: Mapping[int, tuple[int, int, str]]) -> set[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for pid, (ppid, _, _) in table.items():
        children[ppid].append(pid)
    found: set[int] = set()
    stack = [pid for pid in roots if pid in table]
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children[pid])
    return found


def terminate(processes: Sequence[ManagedProcess], grace: float) -> None:
    """Stop ``processes`` and everything they started: SIGTERM (and SIGCONT, for stopped ones) to
    every process group involved, then SIGKILL to whatever is left after ``grace`` seconds.

    Flower starts helpers in sessions of their own (the SuperLink's ``flower-superexec``), so the
    process tree is followed, not only the groups the launcher created.
    """
    if not processes:
        return
    own_group = os.getpgrp()
    table = _process_table()
    tracked = _descendants([p.pid for p in processes], table)
    groups = {p.pid for p in processes} | {table[pid][1] for pid in tracked}
    groups.discard(own_group)
    for sig in (signal.SIGTERM, signal.SIGCONT):
        _signal_groups(groups, sig)
    deadline = time.monotonic() + grace
    while True:
        for process in processes:
            process.popen.poll()  # reap
        table = _process_table()
        tracked |= _descendants([pid for pid in tracked if pid in table], table)
        left = {pid for pid in tracked if pid in table and table[pid][2] != "Z"}
        left |= {pid for pid, (_, pgid, state) in table.items() if pgid in groups and state != "Z"}
        if not left:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    log.warning("processes %s did not stop within %.0f s of SIGTERM; sending SIGKILL", sorted(left), grace)
    _signal_groups(groups | {table[pid][1] for pid in left if pid in table} - {own_group}, signal.SIGKILL)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.popen.wait(timeout=5)


def _signal_groups(groups: Iterable[int], sig: int) -> None:
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)


@contextlib.contextmanager
def _sigterm_raises_interrupt() -> Iterator[None]:
    """In the main thread, turn SIGTERM into KeyboardInterrupt so that the processes are shut down as on Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _uninterruptible() -> Iterator[None]:
    """A second Ctrl-C must not cut the shutdown short (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# ---------------------------------------------------------------- the deployment


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
        self.node_ids: list[int] = []
        self.tls: TlsFiles | None = None
        self._temp: Path | None = None
        self._extra: list[ManagedProcess] = []
        self._app: Path | None = None
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
        self._write_cli_config()
        self.superlink = self._start_superlink()
        self._await_superlink(started + options.startup_timeout)
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
        with _uninterruptible():
            terminate(self.supernodes + self._extra, self.options.shutdown_grace)
            if self.superlink is not None:
                terminate([self.superlink], self.options.shutdown_grace)
            if self._temp is not None:
                shutil.rmtree(self._temp, ignore_errors=True)
                self._temp = self._app = None

    def processes(self) -> list[ManagedProcess]:
        return ([self.superlink] if self.superlink else []) + self.supernodes + self._extra

    # -- processes

    def _write_cli_config(self) -> None:
        self.cli_home.mkdir(parents=True, exist_ok=True)
        lines = ["[superlink]", f"default = {_toml_string(CONNECTION)}", "", f"[superlink.{CONNECTION}]",
                 f"address = {_toml_string(self.options.superlink_address)}"]
        if self.tls is None:
            lines.append("insecure = true")
        else:
            lines.append(f"root-certificates = {_toml_string(str(self.tls.ca_cert))}")
        (self.cli_home / "config.toml").write_text("\n".join(lines) + "\n")

    def _start_superlink(self) -> ManagedProcess:
        options = self.options
        command = [
            flower_executable("flower-superlink"),
            "--host", options.host, "--port", str(options.superlink_port),
            "--database", str(self.temp / "superlink-state.db"),
            "--disable-runtime-dependency-installation",
        ]
        if self.tls is None:
            command.append("--insecure")
        else:
            command += ["--ssl-ca-certfile", str(self.tls.ca_cert), "--ssl-certfile", str(self.tls.server_cert),
                        "--ssl-keyfile", str(self.tls.server_key)]
            if options.node_auth:
                command.append("--enable-supernode-auth")
        env = flower_environment(self.temp / "flwr-home" / "superlink")
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
        self, index: int, node_config: Mapping[str, Any], *, private_key: Path | None = None, port: int | None = None, name: str | None = None
    ) -> ManagedProcess:
        """Start one SuperNode (its Runtime API on ``supernode_port + index`` unless ``port`` is given)."""
        options = self.options
        port = options.supernode_port + index if port is None else port
        command = [
            flower_executable("flower-supernode"),
            "--superlink", options.superlink_address,
            "--port", str(port),
            "--node-config", node_config_arg(node_config),
        ]
        if self.tls is None:
            command.append("--insecure")
        else:
            command += ["--root-certificates", str(self.tls.ca_cert)]
        if private_key is not None:
            command += ["--auth-supernode-private-key", str(private_key)]
        name = name or f"supernode-{index}"
        env = flower_environment(self.temp / "flwr-home" / name)
        process = start_process(f"SuperNode {name}", command, self.log_dir / f"{name}.log", env, self.log_dir)
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
        _signal_groups([process.pid], sig)
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

    def save_run_log(self, run_id: int) -> Path:
        """Write the run's log (the ServerApp's output, ``flwr log --show``) to ``run-<id>.serverapp.log``."""
        done = self.flwr("log", str(run_id), CONNECTION, "--show")
        path = self.log_dir / f"run-{run_id}.serverapp.log"
        path.write_text(done.stdout + done.stderr)
        return path

    def app_dir(self) -> Path:
        """The Flower App submitted by :meth:`run` (built once per deployment)."""
        with self._app_lock:
            if self._app is None:
                self._app = build_app(self.temp / "app")
            return self._app

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
        run_config = write_run_config(Path(tempfile.mkdtemp(prefix="run-", dir=self.temp)) / "run_config.toml", overrides, out_dir)
        started = time.monotonic()
        run_id = self.submit(self.app_dir(), run_config)
        shutil.copyfile(run_config, self.log_dir / f"run-{run_id}.config.toml")
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


# ---------------------------------------------------------------- entry points


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
        The ``result.json`` the ServerApp wrote (INTERFACE.md), plus ``deployment``: the run id,
        its final status and the folder of the processes' logs.

    Raises
    ------
    PortInUse, DeploymentError, RunFailed
    """
    options = DeploymentOptions.from_engine(cfg["engine"])
    overrides = config_overrides(cfg)
    out_dir = resolve_out_dir(options)
    with _sigterm_raises_interrupt(), LocalDeployment(options, deployment_node_configs(cfg), out_dir / "deployment") as deployment:
        if on_ready is not None:
            on_ready(deployment)
        return deployment.run(overrides, out_dir)


def print_commands(cfg: Mapping[str, Any], out_dir: Path, superlink_address: str) -> str:
    """Commands (and files) to run the SuperLink and each SuperNode on separate machines (docs/DEPLOYMENT.md).

    Writes into ``out_dir``: the Flower App (``app/fedica-app``), its run config, and with
    ``engine.tls`` the certificates (``certs/``), with ``engine.node_auth`` one key pair per SuperNode
    (``keys/``). Returns the text to print.
    """
    options = DeploymentOptions.from_engine(cfg["engine"])
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    configs = deployment_node_configs(cfg)
    if cfg["scenario"]["name"] == "files":  # each site names its file as it is on that site
        for config, path in zip(configs, cfg["scenario"]["paths"]):
            config["data-path"] = str(path)
    app_root = out_dir / "app"
    shutil.rmtree(app_root, ignore_errors=True)
    app_dir = build_app(app_root)
    results_dir = out_dir / "result"
    run_config = write_run_config(out_dir / "run_config.toml", config_overrides(cfg), results_dir)
    address = _join_host_port(superlink_address, options.superlink_port)
    q = shlex.quote

    superlink = ["flower-superlink", "--host", options.host, "--port", str(options.superlink_port),
                 "--database", "fedica-superlink.db", "--disable-runtime-dependency-installation"]
    connection = [f"[superlink.{CONNECTION}]", f"address = {_toml_string(address)}"]
    tls_note = []
    if options.tls:
        tls = make_tls_files(out_dir / "certs", certificate_names(options, [superlink_address]), days=365)
        superlink += ["--ssl-ca-certfile", str(tls.ca_cert), "--ssl-certfile", str(tls.server_cert), "--ssl-keyfile", str(tls.server_key)]
        connection.append(f"root-certificates = {_toml_string(str(tls.ca_cert))}")
        tls_note = [f"# TLS: the SuperLink's certificate is valid for {', '.join(certificate_names(options, [superlink_address]))}.",
                    f"# Copy {tls.ca_cert} (the CA, not secret) to every site; {tls.server_key} stays on the SuperLink."]
    else:
        superlink.append("--insecure")
        connection.append("insecure = true")
    if options.node_auth:
        superlink.append("--enable-supernode-auth")

    lines = [
        f"# fedica across machines: one SuperLink and {len(configs)} SuperNodes (docs/DEPLOYMENT.md).",
        "# Install fedica on every machine: the App carries fedica's code, each machine needs its dependencies.",
        f"# Files written to {out_dir}: app/{APP_DIR_NAME} (the Flower App), run_config.toml"
        + (", certs/" if options.tls else "") + (", keys/" if options.node_auth else ""),
        *tls_note,
        "",
        "# 1. On the SuperLink machine (FLWR_DISABLE_UPDATE_CHECK=1 FLWR_TELEMETRY_ENABLED=0 keep it quiet):",
        shlex.join(superlink),
        "",
        "# 2. On the machine that submits the run: add this connection to $FLWR_HOME/config.toml (default ~/.flwr/config.toml):",
        *connection,
    ]
    if options.node_auth:
        lines += ["", "# 3. Still there: register every SuperNode's public key; a node with any other key is refused."]
        keys = [make_node_key(out_dir / "keys", f"supernode-{i}") for i in range(len(configs))]
        lines += [shlex.join(["flwr", "supernode", "register", str(public), CONNECTION]) for _, public in keys]
    lines += ["", f"# {'4' if options.node_auth else '3'}. On each site, one SuperNode (node i reads its own partition or file):"]
    for i, config in enumerate(configs):
        node = ["flower-supernode", "--superlink", address, "--node-config", node_config_arg(config)]
        if options.tls:
            node += ["--root-certificates", "ca.pem"]
        else:
            node.append("--insecure")
        if options.node_auth:
            node += ["--auth-supernode-private-key", f"supernode-{i}"]
        site = f"# site {i}" + (f" (copy ca.pem{' and keys/supernode-' + str(i) if options.node_auth else ''} there)" if options.tls else "")
        lines += [site, shlex.join(node)]
    lines += [
        "",
        f"# {'5' if options.node_auth else '4'}. Submit the run (from step 2's machine), follow it, check its final status:",
        f"flwr run {q(str(app_dir))} {CONNECTION} --run-config {q(str(run_config))} --format json",
        f"flwr log <run-id> {CONNECTION} --stream",
        f"flwr ls {CONNECTION} --run-id <run-id>      # finished:completed, or finished:failed with the reason",
        f"# The ServerApp writes result.json to {results_dir} on the SuperLink machine (run_config.toml: out-dir).",
    ]
    return "\n".join(lines) + "\n"


LAUNCHER_OPTIONS = ("host", "superlink_port", "supernode_port", "tls", "node_auth", "startup_timeout", "run_timeout", "shutdown_grace", "out_dir")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedica-deploy",
        description="Run fedica on a real Flower SuperLink and SuperNodes on this machine, "
        "or print the commands to run them on separate machines.",
        epilog="Example: fedica-deploy algorithm=fedgem scenario.n_clients=3 --tls --node-auth",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for fedica-run (algorithm=fedgem scenario.n_clients=3 seed=1)")
    parser.add_argument("--host", help="address the SuperLink listens on (default 127.0.0.1; with --print-commands 0.0.0.0)")
    parser.add_argument("--superlink-port", type=int, help="the SuperLink's one port (default 8000)")
    parser.add_argument("--supernode-port", type=int, help="first SuperNode Runtime API port; node i uses this + i (default 9094)")
    parser.add_argument("--tls", action="store_true", default=None, help="encrypt with certificates generated for the run")
    parser.add_argument("--node-auth", action="store_true", default=None, help="admit only SuperNodes whose key was registered (implies --tls)")
    parser.add_argument("--startup-timeout", type=float, help="seconds to wait for the processes to be ready (default 120)")
    parser.add_argument("--run-timeout", type=float, help="seconds the run may take before it is stopped (default: no limit)")
    parser.add_argument("--shutdown-grace", type=float, help="seconds between SIGTERM and SIGKILL (default 10)")
    parser.add_argument("--out-dir", help="folder for result.json and the logs (default outputs/deploy/<date>/<time>)")
    parser.add_argument("--print-commands", action="store_true", help="print the commands for separate machines instead of running")
    parser.add_argument("--superlink-address", default=None,
                        help="with --print-commands: the host name or IP the SuperNodes use to reach the SuperLink (default: this host's name)")
    return parser


def launcher_overrides(args: argparse.Namespace) -> list[str]:
    """The Hydra overrides of a ``fedica-deploy`` command line: engine=deployment, the user's, then the options."""
    chosen = [o for o in args.overrides if o.split("=", 1)[0].lstrip("+") == "engine"]
    if any(o.split("=", 1)[1] != "deployment" for o in chosen if "=" in o):
        raise ValueError(f"{chosen[0]}: fedica-deploy always runs engine=deployment (use fedica-run for other engines)")
    values = {key: getattr(args, key) for key in LAUNCHER_OPTIONS}
    if values["node_auth"]:
        values["tls"] = True
    if args.print_commands and values["host"] is None:
        values["host"] = "0.0.0.0"  # the SuperNodes connect from other machines
    if values["out_dir"] is not None:
        values["out_dir"] = str(Path(values["out_dir"]).expanduser().resolve())
    options = [f"engine.{key}={_hydra_value(value)}" for key, value in values.items() if value is not None]
    return ["engine=deployment", *[o for o in args.overrides if o not in chosen], *options]


def main(argv: Sequence[str] | None = None) -> int:
    """``fedica-deploy [overrides ...] [options]``; returns the exit code (0 done, 1 run failed, 2 bad config)."""
    from fedica.server.app import configure_logging

    from fedica.config import ConfigError, validate_config
    from fedica.results import RESULT_FILE, format_summary

    args = build_parser().parse_args(argv)
    try:
        cfg = compose(launcher_overrides(args))
        validate_config(cfg)
        DeploymentOptions.from_engine(cfg["engine"])
    except (ConfigError, ValueError) as err:
        print(f"fedica-deploy: configuration error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - Hydra's override errors have many types; one line for the user
        print(f"fedica-deploy: cannot compose the configuration: {err}", file=sys.stderr)
        return 2
    configure_logging(cfg.get("log_level", "INFO"))
    options = DeploymentOptions.from_engine(cfg["engine"])
    if args.print_commands:
        out_dir = resolve_out_dir(options)
        print(print_commands(cfg, out_dir, args.superlink_address or socket.getfqdn()), end="")
        return 0
    try:
        result = run_deployment(cfg)
    except KeyboardInterrupt:
        print("fedica-deploy: interrupted; every process was stopped", file=sys.stderr)
        return 130
    except RunFailed as err:
        print(f"fedica-deploy: the run failed: {err}", file=sys.stderr)
        return 1
    except DeploymentError as err:
        print(f"fedica-deploy: {err}", file=sys.stderr)
        return 1
    print(format_summary(result))
    print(f"result: {Path(result['deployment']['log_dir']).parent / RESULT_FILE}")
    print(f"logs: {result['deployment']['log_dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
