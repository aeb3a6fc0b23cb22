"""README's set-up commands stay true: .ci/run runs README's test command, and the run command names the CLI."""

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
    assert 'fedica-run = "fedica.scripts.run:main"' in pyproject
