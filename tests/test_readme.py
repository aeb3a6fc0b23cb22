"""README stays true: its set-up commands and its library example run as written, its Flower app's files parse."""

import pytest
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands():
    lines = ROOT.joinpath("README.md").read_text().splitlines()
    return [line.strip() for line in lines[:12] if line.startswith("    ")]


def test_ci_runs_the_readme_test_command():
    run_command, test_command = _readme_commands()[:2]
    ci_lines = ROOT.joinpath(".ci", "run").read_text().splitlines()
    ci_command = ci_lines[ci_lines.index("# README test command:") + 1]
    assert test_command.endswith(ci_command)
    assert run_command.endswith("python -m pip install . && fedica-run")


def test_readme_run_command_is_an_installed_console_script():
    pyproject = ROOT.joinpath("pyproject.toml").read_text()
    assert 'fedica-run = "fedica.scripts.run:cli"' in pyproject


def _python_blocks(document="README.md"):
    """A document's python code blocks, in order."""
    text = ROOT.joinpath(document).read_text()
    return [block.split("```", 1)[0] for block in text.split("```python\n")[1:]]


@pytest.mark.slow
def test_readme_library_example_runs_and_finds_the_global_k():
    library_example = _python_blocks()[0]
    out = subprocess.run([sys.executable, "-c", library_example], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout
    assert out.splitlines()[0] == "4"


def test_the_flower_app_files_parse_and_name_their_components():
    # docs/FLOWER_APP.md, which README links; they run under `flwr run` on a local SuperLink in
    # tests/server/test_own_app.py (slow).
    text = ROOT.joinpath("docs", "FLOWER_APP.md").read_text()
    [pyproject] = [b.split("```", 1)[0] for b in text.split("```toml\n")[1:] if b.startswith("# pyproject.toml")]
    files = {name: block for block in _python_blocks("docs/FLOWER_APP.md") for name in ("server_app", "client_app")
             if block.startswith(f"# {name}.py")}
    components = tomllib.loads(pyproject)["tool"]["flwr"]["app"]["components"]
    assert components == {"serverapp": "server_app:app", "clientapp": "client_app:app"}
    for name, code in files.items():
        compile(code, f"{name}.py", "exec")
    assert sorted(files) == ["client_app", "server_app"]
