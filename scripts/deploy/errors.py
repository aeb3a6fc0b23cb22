"""The deployment's exceptions."""

from __future__ import annotations

from pathlib import Path


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
            # One line for the user: Flower's details hold the ServerApp's exception, whose text may span lines.
            message += f": {' '.join(details.split())}"
        if log_path is not None:
            message += f" (ServerApp log: {log_path})"
        super().__init__(message)
