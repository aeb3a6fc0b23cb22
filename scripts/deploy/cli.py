"""``fedica-deploy``: the command line (argparse) and its entry point :func:`main`."""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from .commands import print_commands
from .errors import DeploymentError, RunFailed
from .localhost import run_deployment
from .options import DeploymentOptions
from .overrides import compose, hydra_value, resolve_out_dir

LAUNCHER_OPTIONS = ("host", "superlink_port", "supernode_port", "tls", "node_auth", "startup_timeout", "run_timeout", "shutdown_grace", "out_dir", "max_reply_mib")


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
    parser.add_argument("--max-reply-mib", type=int,
                        help="the most MiB one site's reply may hold; a larger one is refused at the SuperLink (default 64)")
    parser.add_argument("--out-dir", help="folder for result.json and the logs (default outputs/deploy/<date>/<time>)")
    parser.add_argument("--resume", metavar="RUN_DIR",
                        help="go on with the interrupted run in RUN_DIR (its output folder, holding journal/) from its "
                        "last completed stage; the same overrides as the run's")
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
    options = [f"engine.{key}={hydra_value(value)}" for key, value in values.items() if value is not None]
    if args.resume is not None:
        options.append(f"resume={hydra_value(str(Path(args.resume).expanduser().resolve()))}")
    return ["engine=deployment", *[o for o in args.overrides if o not in chosen], *options]


def main(argv: Sequence[str] | None = None) -> int:
    """``fedica-deploy [overrides ...] [options]``; returns the exit code (0 done, 1 run failed, 2 bad config)."""
    from fedica.server.app import configure_logging
    from fedica.server.harness.resume import journal_description

    from fedica.protocol import Journal

    from fedica.config import ConfigError, validate_config
    from fedica.results import RESULT_FILE, format_summary

    args = build_parser().parse_args(argv)
    try:
        cfg = compose(launcher_overrides(args))
        cfg = validate_config(cfg)
        DeploymentOptions.from_engine(cfg["engine"])
        if cfg["resume"]:
            # Refused here, in one line, rather than by the ServerApp once every process has started.
            Journal.resume(cfg["resume"], journal_description(cfg))
    except (ConfigError, ValueError) as err:
        # compose_config and validate_config say each mistake in a line of its own.
        for line in str(err).splitlines():
            print(f"fedica-deploy: configuration error: {line}", file=sys.stderr)
        return 2
    configure_logging(cfg.get("log_level", "INFO"))
    options = DeploymentOptions.from_engine(cfg["engine"])
    if args.print_commands:
        out_dir = resolve_out_dir(options)
        try:
            text = print_commands(cfg, out_dir, args.superlink_address or socket.getfqdn())
        except OSError as err:  # a key, certificate or secret that would overwrite a file or follow a link
            print(f"fedica-deploy: {err}", file=sys.stderr)
            return 2
        print(text, end="")
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
