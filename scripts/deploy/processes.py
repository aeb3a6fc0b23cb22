"""The processes of a deployment: starting Flower commands, stopping them with all they started, signals."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import DeploymentError

log = logging.getLogger("fedica.deploy")

# Environment of every Flower process: no telemetry, no update check, no per-run `uv sync`.
FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "PYTHONUNBUFFERED": "1",
}


def flower_executable(name: str) -> str:
    """A Flower command of this Python's environment (next to ``sys.executable``), else from PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise DeploymentError(f"`{name}` was not found next to {sys.executable} nor on PATH; install flwr in this environment")
    return found


# Of the caller's FLWR_* variables, the ones a launched Flower process keeps: the others change what it
# exposes or whom it trusts (extra gRPC servers, runtime URLs, API keys), which the launcher decides.
KEPT_FLOWER_VARIABLES = frozenset({"FLWR_LOG_LEVEL"})


def flower_environment(flwr_home: Path) -> dict[str, str]:
    """The environment of one Flower process: its own FLWR_HOME, this Python's bin first on PATH, and
    no FLWR_* variable of the caller's but :data:`KEPT_FLOWER_VARIABLES`."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("FLWR_") or key in KEPT_FLOWER_VARIABLES}
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


def process_table() -> dict[int, tuple[int, int, str]]:
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


def descendants(roots: Iterable[int], table: Mapping[int, tuple[int, int, str]]) -> set[int]:
    """``roots`` and every process below them in ``table`` (:func:`process_table`)."""
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
    table = process_table()
    tracked = descendants([p.pid for p in processes], table)
    groups = {p.pid for p in processes} | {table[pid][1] for pid in tracked}
    groups.discard(own_group)
    for sig in (signal.SIGTERM, signal.SIGCONT):
        signal_groups(groups, sig)
    deadline = time.monotonic() + grace
    while True:
        for process in processes:
            process.popen.poll()  # reap
        table = process_table()
        tracked |= descendants([pid for pid in tracked if pid in table], table)
        left = {pid for pid in tracked if pid in table and table[pid][2] != "Z"}
        left |= {pid for pid, (_, pgid, state) in table.items() if pgid in groups and state != "Z"}
        if not left:
            return
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    log.warning("processes %s did not stop within %.0f s of SIGTERM; sending SIGKILL", sorted(left), grace)
    signal_groups(groups | {table[pid][1] for pid in left if pid in table} - {own_group}, signal.SIGKILL)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.popen.wait(timeout=5)


def signal_groups(groups: Iterable[int], sig: int) -> None:
    """Send ``sig`` to every process group of ``groups`` that still exists."""
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)


@contextlib.contextmanager
def sigterm_raises_interrupt() -> Iterator[None]:
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


def _swallow(signum: int, frame: Any) -> None:
    """A signal handler that does nothing."""


@contextlib.contextmanager
def uninterruptible() -> Iterator[None]:
    """A second Ctrl-C must not cut the shutdown short (main thread only).

    The signals are swallowed by a handler rather than ignored: an ignored signal stays ignored
    in every process started meanwhile (by another thread, say), which could then never be
    interrupted; a handler does not survive ``exec``.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _swallow) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
