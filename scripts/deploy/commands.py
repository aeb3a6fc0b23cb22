"""``fedica-deploy --print-commands``: the commands (and files) to run a deployment across machines."""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .bundle import APP_DIR_NAME, build_app, toml_string, write_run_config
from .options import CONNECTION, DeploymentOptions, join_host_port
from .overrides import config_overrides
from .supernodes import deployment_node_configs, node_config_arg
from .tls import certificate_names, make_node_key, make_tls_files


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
    address = join_host_port(superlink_address, options.superlink_port)
    superlink, connection, tls_note, ca_cert = _superlink_setup(options, out_dir, superlink_address, address)

    lines = [
        f"# fedica across machines: one SuperLink and {len(configs)} SuperNodes (docs/DEPLOYMENT.md).",
        "# Install fedica on every machine: the App carries fedica's code, each machine needs its dependencies.",
        f"# Files written to {out_dir}: app/{APP_DIR_NAME} (the Flower App), run_config.toml"
        + (", certs/" if options.tls else "") + (", keys/" if options.node_auth else ""),
        *tls_note,
        "",
        "# 1. On the SuperLink machine (FLWR_DISABLE_UPDATE_CHECK=1 FLWR_TELEMETRY_ENABLED=0 keep it quiet): its secret,",
        "#    the SuperLink, and the SuperExec that runs the ServerApp (the only process the secret lets take it):",
        shlex.join(MAKE_SECRET),
        shlex.join(superlink) + " &",
        shlex.join(_superexec(join_host_port("127.0.0.1", options.superlink_port), ca_cert)),
        "",
        "# 2. On the SuperLink machine, the only one whose `flwr` commands it answers (from another machine, through",
        f"#    `ssh -N -L {options.superlink_port}:127.0.0.1:{options.superlink_port} <superlink machine>`), add this connection",
        "#    to $FLWR_HOME/config.toml (default ~/.flwr/config.toml):",
        *connection,
    ]
    if options.node_auth:
        lines += _registration_lines(out_dir, len(configs))
    lines += _supernode_lines(options, configs, address)
    lines += _submit_lines(options, app_dir, run_config, results_dir)
    return "\n".join(lines) + "\n"


def _superlink_setup(
    options: DeploymentOptions, out_dir: Path, superlink_address: str, address: str
) -> tuple[list[str], list[str], list[str], Path | None]:
    """The SuperLink's command, the submitting machine's connection entry, a note on TLS and the CA
    certificate (writes ``certs/``)."""
    superlink = ["fedica-superlink", "--host", options.host, "--port", str(options.superlink_port),
                 "--database", "fedica-superlink.db", "--disable-runtime-dependency-installation",
                 "--max-reply-mib", str(options.max_reply_mib), *ISOLATION]
    # The Control API answers only the SuperLink machine's loopback address (scripts/deploy/superlink.py).
    connection = [f"[superlink.{CONNECTION}]", f"address = {toml_string(join_host_port('127.0.0.1', options.superlink_port))}"]
    tls_note, ca_cert = [], None
    if options.tls:
        tls = make_tls_files(out_dir / "certs", certificate_names(options, [superlink_address]), days=365)
        superlink += ["--ssl-ca-certfile", str(tls.ca_cert), "--ssl-certfile", str(tls.server_cert), "--ssl-keyfile", str(tls.server_key)]
        connection.append(f"root-certificates = {toml_string(str(tls.ca_cert))}")
        tls_note = [f"# TLS: the SuperLink's certificate is valid for {', '.join(certificate_names(options, [superlink_address]))}.",
                    f"# Copy {tls.ca_cert} (the CA, not secret) to every site; {tls.server_key} stays on the SuperLink."]
        ca_cert = tls.ca_cert
    else:
        superlink.append("--insecure")
        connection.append("insecure = true")
    if options.node_auth:
        superlink.append("--enable-supernode-auth")
    return superlink, connection, tls_note, ca_cert


def _registration_lines(out_dir: Path, n_supernodes: int) -> list[str]:
    """Step 3 with ``engine.node_auth``: register each SuperNode's public key (writes ``keys/``)."""
    lines = ["", "# 3. Still there: register every SuperNode's public key; a node with any other key is refused.",
             "#    Keep Flower's answers: the last line binds each partition to its registered node in run_config.toml,",
             "#    so that no other node (even one whose key someone else registers) can answer for a site."]
    keys = [make_node_key(out_dir / "keys", f"supernode-{i}") for i in range(n_supernodes)]
    lines += [shlex.join(["flwr", "supernode", "register", str(public), CONNECTION, "--format", "json"])
              + " > " + shlex.quote(str(public.with_suffix(".json"))) for _, public in keys]
    lines.append(shlex.join(["python", "-m", "fedica.scripts.deploy.bind", str(out_dir)]))
    return lines


def _supernode_lines(options: DeploymentOptions, configs: Sequence[Mapping[str, Any]], address: str) -> list[str]:
    """One SuperNode command per site."""
    lines = ["", f"# {'4' if options.node_auth else '3'}. On each site, one SuperNode (node i reads its own partition or file):"]
    for i, config in enumerate(configs):
        node = ["flower-supernode", "--superlink", address, "--node-config", node_config_arg(config), *ISOLATION]
        if options.tls:
            node += ["--root-certificates", "ca.pem"]
        else:
            node.append("--insecure")
        if options.node_auth:
            node += ["--auth-supernode-private-key", f"supernode-{i}"]
        site = f"# site {i}" + (f" (copy ca.pem{' and keys/supernode-' + str(i) if options.node_auth else ''} there)" if options.tls else "")
        lines += [site, shlex.join(MAKE_SECRET), shlex.join(node) + " &",
                  shlex.join(_superexec("127.0.0.1:9094", None))]
    return lines


# Each machine makes its own SuperExec secret (a new file, mode 600) and keeps it: the SuperLink or
# SuperNode hands a task only to the SuperExec that signs with it (scripts/deploy/secret.py).
SECRET_FILE = "superexec.secret"
MAKE_SECRET = ["python", "-m", "fedica.scripts.deploy.secret", SECRET_FILE]
ISOLATION = ["--isolation", "process", "--superexec-auth-secret-file", SECRET_FILE]


def _superexec(runtime_address: str, ca_cert: Path | None) -> list[str]:
    """Flower's SuperExec for the SuperLink or SuperNode whose Runtime API is at ``runtime_address``."""
    command = ["flower-superexec", "--runtime-api-address", runtime_address, "--superexec-auth-secret-file", SECRET_FILE]
    return command + (["--root-certificates", str(ca_cert)] if ca_cert else ["--insecure"])


def _submit_lines(options: DeploymentOptions, app_dir: Path, run_config: Path, results_dir: Path) -> list[str]:
    """The last step: submit the run, follow it, check its final status."""
    q = shlex.quote
    return [
        "",
        f"# {'5' if options.node_auth else '4'}. Submit the run (from step 2's machine), follow it, check its final status:",
        f"flwr run {q(str(app_dir))} {CONNECTION} --run-config {q(str(run_config))} --format json",
        f"flwr log <run-id> {CONNECTION} --stream",
        f"flwr ls {CONNECTION} --run-id <run-id>      # finished:completed, or finished:failed with the reason",
        f"# The ServerApp writes result.json to {results_dir} on the SuperLink machine (run_config.toml: out-dir).",
    ]
