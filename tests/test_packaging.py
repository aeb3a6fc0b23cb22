"""Installing fedica adds one top-level package, ``fedica``, with the Flower side inside it."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    mapping = {"server": "fedica.server", "clients": "fedica.clients", "scripts": "fedica.scripts", "conf": "fedica.conf"}
    found = set()
    for init in ROOT.glob("*/**/__init__.py"):
        parts = init.parent.relative_to(ROOT).parts
        if parts[0] in mapping:
            found.add(".".join((mapping[parts[0]], *parts[1:])))
        elif parts[0] == "fedica":
            found.add(".".join(parts))
    assert found <= listed, f"not listed in pyproject.toml: {sorted(found - listed)}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--target", str(target), str(ROOT)], check=True, capture_output=True)
    return target


@pytest.mark.slow
def test_installing_adds_no_generic_top_level_package(installed):
    top_level = {p.name for p in installed.iterdir() if p.is_dir() and not p.name.endswith((".dist-info", "__pycache__")) and p.name != "bin"}
    assert top_level == {"fedica"}
    for module in ("server/app.py", "server/strategy.py", "server/inprocess.py", "server/harness/runner.py",
                   "clients/app.py", "scripts/run.py", "conf/config.yaml", "conf/algorithm/fedgem.yaml"):
        assert (installed / "fedica" / module).is_file(), module


@pytest.mark.slow
def test_installed_package_imports_its_flower_side_and_not_the_generic_names(installed, tmp_path):
    code = (
        "import importlib\n"
        "from fedica.server import FedGEMStrategy, RFICAStrategy\n"
        "from flwr.serverapp.strategy import Strategy\n"
        "assert issubclass(FedGEMStrategy, Strategy) and issubclass(RFICAStrategy, Strategy)\n"
        "import fedica.clients.app, fedica.scripts.run, fedica.server.app, fedica.server.harness.runner\n"
        "for name in ('server', 'clients', 'scripts', 'conf'):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError:\n"
        "        continue\n"
        "    raise SystemExit(f'{name} is importable')\n"
        "print('ok')\n"
    )
    env = {"PYTHONPATH": str(installed), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_code_and_pyproject_state_one_version():
    import tomllib

    from fedica.version import __version__

    with open(ROOT / "pyproject.toml", "rb") as handle:
        assert tomllib.load(handle)["project"]["version"] == __version__
