"""The Flower App that is submitted (fedica's packages copied, and a pyproject) and its run config."""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata, util
from pathlib import Path

from .errors import DeploymentError

# The packages that make up the Flower App; they are copied from where Python imports them.
# fedica's Flower side: subpackages of the installed fedica, top-level folders in a source checkout.
APP_SUBPACKAGES = ("server", "clients", "scripts", "conf")
APP_PUBLISHER = "fedica"
APP_COMPONENTS = {"serverapp": "fedica.server.app:app", "clientapp": "fedica.clients.app:app"}
APP_CONFIG = {"overrides": "", "out-dir": "", "node-partitions": ""}
APP_DIR_NAME = "fedica-app"  # `flwr build` wants [A-Za-z][A-Za-z0-9-]*


def toml_string(value: str) -> str:
    """``value`` as a TOML basic string."""
    # A JSON string is a valid TOML basic string (same escapes) as long as no astral character is escaped.
    return json.dumps(value, ensure_ascii=False)


def write_run_config(path: Path, overrides: Sequence[str], out_dir: Path,
                     node_partitions: Mapping[int, int] | None = None) -> Path:
    """The run config for ``flwr run -c <file>``: a file, so that no quoting of the overrides can break.

    ``node_partitions`` (node id to partition id, known to the launcher that started the
    SuperNodes) binds every partition to its node, so that no other node can answer for it.
    """
    text = (
        f"overrides = {toml_string(' '.join(shlex.quote(o) for o in overrides))}\n"
        f"out-dir = {toml_string(str(out_dir))}\n"
    )
    if node_partitions:
        text += f"node-partitions = {toml_string(','.join(f'{n}:{p}' for n, p in node_partitions.items()))}\n"
    path.write_text(text)
    return path


def app_pyproject() -> str:
    """``pyproject.toml`` of the submitted App: fedica's ``[tool.flwr.app]`` and nothing to install."""
    try:
        version = metadata.version("fedica")
    except metadata.PackageNotFoundError:
        version = "0.0.0"
    lines = [
        "[project]",
        'name = "fedica"',
        f"version = {toml_string(version)}",
        'description = "fedica (RF-ICA and FedGEM) as a Flower App, built by fedica-deploy"',
        'license = "Apache-2.0"',
        "dependencies = []",
        "",
        "[tool.flwr.app]",
        f"publisher = {toml_string(APP_PUBLISHER)}",
        "",
        "[tool.flwr.app.components]",
        *(f"{key} = {toml_string(value)}" for key, value in APP_COMPONENTS.items()),
        "",
        "[tool.flwr.app.config]",
        *(f"{key} = {toml_string(value)}" for key, value in APP_CONFIG.items()),
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
