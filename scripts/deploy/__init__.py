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

The package by concern: :mod:`.options` (the engine section, ports), :mod:`.errors`,
:mod:`.overrides` (the config as Hydra overrides), :mod:`.supernodes` (node configs),
:mod:`.bundle` (the Flower App and its run config), :mod:`.tls` (certificates and keys, written
as new files), :mod:`.secret` (the SuperExec secret that guards each machine's Runtime API),
:mod:`.processes` (starting and stopping processes, signals), :mod:`.localhost`
(:class:`LocalDeployment`, :func:`run_deployment`), :mod:`.commands` (``--print-commands``) and
:mod:`.cli` (``fedica-deploy``).
"""

from __future__ import annotations

from .bundle import (
    APP_COMPONENTS,
    APP_CONFIG,
    APP_DIR_NAME,
    APP_PUBLISHER,
    APP_SUBPACKAGES,
    app_pyproject,
    build_app,
    write_run_config,
)
from .cli import LAUNCHER_OPTIONS, build_parser, launcher_overrides, main
from .commands import print_commands
from .errors import DeploymentError, PortInUse, RunFailed
from .localhost import (
    CLI_TIMEOUT,
    COMPLETED,
    NODE_ID_PATTERN,
    STATUS_FALLBACK_INTERVAL,
    LocalDeployment,
    run_deployment,
)
from .options import CONNECTION, DeploymentOptions, check_ports_free, port_is_free
from .overrides import compose, config_overrides, resolve_out_dir
from .processes import (
    FLOWER_ENV,
    ManagedProcess,
    flower_environment,
    flower_executable,
    start_process,
    terminate,
)
from .secret import make_superexec_secret
from .supernodes import deployment_node_configs, node_config_arg
from .tls import TlsFiles, certificate_names, make_node_key, make_tls_files, write_new_file

__all__ = [
    "APP_COMPONENTS", "APP_CONFIG", "APP_DIR_NAME", "APP_PUBLISHER", "APP_SUBPACKAGES",
    "CLI_TIMEOUT", "COMPLETED", "CONNECTION", "FLOWER_ENV", "LAUNCHER_OPTIONS", "NODE_ID_PATTERN",
    "STATUS_FALLBACK_INTERVAL",
    "DeploymentError", "DeploymentOptions", "LocalDeployment", "ManagedProcess", "PortInUse", "RunFailed", "TlsFiles",
    "app_pyproject", "build_app", "build_parser", "certificate_names", "check_ports_free", "compose",
    "config_overrides", "deployment_node_configs", "flower_environment", "flower_executable",
    "launcher_overrides", "main", "make_node_key", "make_superexec_secret", "make_tls_files", "node_config_arg", "port_is_free",
    "print_commands", "resolve_out_dir", "run_deployment", "start_process", "terminate", "write_new_file", "write_run_config",
]
