"""The run's configuration as Hydra overrides for the ServerApp, and composing configs from ``conf/``."""

from __future__ import annotations

import datetime
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .errors import DeploymentError
from .options import DeploymentOptions


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
            overrides.append(f"+{path}={hydra_value(value)}")
        elif isinstance(value, Mapping) and isinstance(base[key], Mapping):
            overrides += _diff_overrides(base[key], value, f"{path}.")
        elif value != base[key] or type(value) is not type(base[key]):
            overrides.append(f"{path}={hydra_value(value)}")
    overrides += [f"~{prefix}{key}" for key in base if key not in cfg]
    return overrides


# Strings Hydra reads back unchanged without quotes (names, paths); anything else is quoted.
_PLAIN_HYDRA_STRING = re.compile(r"[A-Za-z_/][\w./-]*")


def hydra_value(value: Any) -> str:
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
        return "{" + ",".join(f"{key}:{hydra_value(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(item) for item in value) + "]"
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


def resolve_out_dir(options: DeploymentOptions) -> Path:
    """``engine.out_dir``, else the Hydra output folder of a running fedica-run, else ``outputs/deploy/<date>/<time>``."""
    if options.out_dir:
        return Path(options.out_dir).expanduser().resolve()
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir).resolve()
    now = datetime.datetime.now()
    return (Path("outputs") / "deploy" / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S")).resolve()
