"""A run's journal under ``fedica-run``: a new one in a new run's folder, or an interrupted run's (``resume=RUN_DIR``).

The journal (:mod:`fedica.protocol.journal`) is written for the run's configuration, less the
keys that change nothing a run computes (:data:`RESUME_FREE_KEYS`, and of the ``engine`` section
all but its name): a resumed run may say more in its log, wait longer for its nodes or its
replies, start its processes on other ports or with TLS, and of course names the folder it resumes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedica.protocol import Journal

log = logging.getLogger("fedica.server")

RESUME_FREE_KEYS = ("resume", "log_level", "round_timeout", "node_wait_timeout")


def journal_description(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What a journal is written for: the validated configuration without :data:`RESUME_FREE_KEYS`, its engine by name."""
    description = {key: value for key, value in cfg.items() if key not in RESUME_FREE_KEYS}
    description["engine"] = {"name": cfg["engine"]["name"]}
    return description


def run_folder(cfg: Mapping[str, Any], out_dir: str | os.PathLike) -> Path:
    """Where a run writes its journal and its result: the folder it resumes, else its own ``out_dir``."""
    return Path(cfg["resume"]) if cfg.get("resume") else Path(out_dir)


def run_journal(cfg: Mapping[str, Any], folder: str | os.PathLike) -> Journal:
    """The journal of ``cfg``'s run in ``folder`` (:func:`run_folder`; a deployment's ServerApp: its ``out-dir``):
    the interrupted run's when ``cfg`` resumes one, else a new one.

    The same configuration run again in a folder where it was interrupted (a sweep's command
    repeated, say) resumes it too: its completed stages are never thrown away.

    Raises
    ------
    fedica.protocol.JournalError
        ``resume`` names a folder whose journal is missing or of another configuration, or a new
        run's folder holds another configuration's completed stages (one line).
    """
    description = journal_description(cfg)
    if cfg.get("resume") or (Journal.holds_stages(folder) and Journal.written_for(folder, description)):
        if not cfg.get("resume"):
            log.warning("%s holds this configuration's interrupted run: resuming it", folder)
        return Journal.resume(folder, description)
    return Journal.create(folder, description)
