"""A run's journal: every completed stage's replies on disk, so that a crashed run resumes where it stopped.

A protocol's server is a generator that is deterministic given the replies it is sent (its random
streams are seeded, :mod:`fedica.seeding`). So the replies of every completed stage are all a
resumed run needs: :func:`journaled` sends the recorded replies to a fresh generator, stage by
stage, without asking any client, and from the first stage the journal does not hold on it asks
the clients and records their replies. Each replayed request is checked against the one recorded
(a digest of its task, round, payloads and values): a generator that asks something else (another
configuration, another version of fedica) is refused rather than fed replies to other questions.

Resuming needs clients that answer each request from the request alone: the replayed stages are
not sent to them, so a client that keeps state between messages (FedGEM's ``spherical`` sites keep
their variances) would answer the next stage from nothing.

On disk, in a run's folder (next to ``result.json``), :data:`JOURNAL_DIR` holds
:data:`MANIFEST_FILE` (the format, the configuration's fingerprint and the configuration) and one
``stage_<n>.npz`` per completed stage (the replies' arrays exactly, their values, and the
transport's books of the stage), each written to a temporary file and renamed, so that a stage is
either complete on disk or absent. Nothing is pickled: the files load with ``allow_pickle=False``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedica.protocol.messages import Reply, Request
from fedica.persistence import write_atomic

JOURNAL_DIR = "journal"
MANIFEST_FILE = "journal.json"
JOURNAL_FORMAT = 1
_STAGE_FILE = re.compile(r"stage_(\d+)\.npz")


class JournalError(ValueError):
    """A journal that cannot be resumed (missing, of another configuration, or not what the protocol asks); one line."""


def fingerprint(description: Mapping[str, Any]) -> str:
    """The SHA-256 of ``description`` as canonical JSON: what a journal was written for."""
    return hashlib.sha256(json.dumps(description, sort_keys=True, default=str).encode()).hexdigest()


def request_digest(request: Request) -> str:
    """The SHA-256 of what a request asks: its task, round, values and every payload array (dtype, shape, bytes)."""
    digest = hashlib.sha256(json.dumps([request.task, request.round_label, request.values], sort_keys=True,
                                       default=repr).encode())
    for partition, arrays in sorted((request.payloads or {}).items()):
        digest.update(f"|{partition}".encode())
        for key, array in sorted(arrays.items()):
            array = np.ascontiguousarray(array)
            digest.update(f"|{key}|{array.dtype.str}|{array.shape}|".encode())
            digest.update(array.tobytes())
    digest.update(b"|all" if request.payloads is None else b"|some")
    return digest.hexdigest()


@dataclass
class RecordedStage:
    """One completed stage as the journal holds it: what was asked (its digest) and what the clients replied."""

    number: int
    task: str
    round_label: int | str
    digest: str
    replies: list[Reply]
    books: dict[str, list[Any]]

    def check(self, request: Request) -> None:
        """Raise :class:`JournalError` unless ``request`` asks what this stage's request asked."""
        if request_digest(request) != self.digest:
            raise JournalError(
                f"journal stage {self.number} ({self.task} {self.round_label}) was asked something else than this run "
                f"asks now ({request.task} {request.round_label}): the journal is of another run or another version")


class Journal:
    """The completed stages of one run, in a folder; new stages are appended as they complete.

    Build one with :meth:`create` (a new run) or :meth:`resume` (an interrupted one); hand it to
    :func:`journaled`, or to a driver that takes one (:func:`fedica.protocol.drive`).

    Parameters
    ----------
    directory : path
        The journal's folder (:data:`JOURNAL_DIR` inside a run's folder).
    recorded : list of RecordedStage
        The stages already on disk, in order; a run replays them before it asks any client.

    Attributes
    ----------
    stages : int
        The completed stages on disk (replayed or new).
    after_stage : callable or None
        ``after_stage(journal, request)``, called once a new stage is on disk (a harness saves
        its partial result there, so that even a killed run leaves one).
    """

    def __init__(self, directory: str | os.PathLike, recorded: list[RecordedStage]):
        self.directory = Path(directory)
        self.recorded = recorded
        self.replayed = 0
        self.stages = len(recorded)
        self.after_stage: Callable[[Journal, Request], None] | None = None

    @classmethod
    def create(cls, run_dir: str | os.PathLike, description: Mapping[str, Any]) -> Journal:
        """A new, empty journal in ``run_dir/journal`` for a run described by ``description`` (its configuration).

        A journal already there (of an earlier run into the same folder) is replaced.
        """
        directory = Path(run_dir) / JOURNAL_DIR
        directory.mkdir(parents=True, exist_ok=True)
        for old in directory.iterdir():
            if _STAGE_FILE.fullmatch(old.name):
                old.unlink()
        manifest = {"format": JOURNAL_FORMAT, "fingerprint": fingerprint(description), "description": description}
        write_atomic(directory / MANIFEST_FILE, lambda handle: handle.write(json.dumps(manifest, default=str).encode()))
        return cls(directory, [])

    @classmethod
    def resume(cls, run_dir: str | os.PathLike, description: Mapping[str, Any]) -> Journal:
        """The journal of an interrupted run in ``run_dir``, refused unless written for ``description``.

        Raises
        ------
        JournalError
            No journal there, one of another format, or one of another configuration (naming the
            keys that differ).
        """
        directory = Path(run_dir) / JOURNAL_DIR
        try:
            manifest = json.loads((directory / MANIFEST_FILE).read_text())
        except FileNotFoundError:
            raise JournalError(f"{run_dir}: no journal to resume ({directory / MANIFEST_FILE} does not exist)") from None
        except (OSError, ValueError) as err:
            raise JournalError(f"{directory / MANIFEST_FILE} cannot be read: {err}") from None
        if not isinstance(manifest, dict) or manifest.get("format") != JOURNAL_FORMAT:
            raise JournalError(f"{directory / MANIFEST_FILE} is not a fedica journal of format {JOURNAL_FORMAT}")
        if manifest.get("fingerprint") != fingerprint(description):
            differing = differing_keys(manifest.get("description"), json.loads(json.dumps(description, default=str)))
            raise JournalError(f"{run_dir}: its journal was written by another configuration "
                               f"(differs in {', '.join(differing[:8]) or 'its fingerprint'}); resume it with the same one")
        numbers = sorted(int(m.group(1)) for m in map(_STAGE_FILE.fullmatch, os.listdir(directory)) if m)
        if numbers != list(range(1, len(numbers) + 1)):
            raise JournalError(f"{directory}: stage files {numbers} are not numbered 1 to {len(numbers)}")
        return cls(directory, [load_stage(directory / stage_file(n)) for n in numbers])

    def next_recorded(self) -> RecordedStage | None:
        """The next stage to replay, or None once every recorded stage has been replayed."""
        if self.replayed >= len(self.recorded):
            return None
        self.replayed += 1
        return self.recorded[self.replayed - 1]

    def append(self, request: Request, replies: list[Reply], books: Mapping[str, list[Any]]) -> Path:
        """Record a completed stage (atomically): its request's digest, its replies and the transport's books of it."""
        self.stages += 1
        path = save_stage(self.directory / stage_file(self.stages), self.stages, request, replies, books)
        if self.after_stage is not None:
            self.after_stage(self, request)
        return path


def journaled(protocol: Generator[Request, list[Reply], None], journal: Journal,
              books: Mapping[str, list[Any]] | None = None) -> Generator[Request, list[Reply], None]:
    """``protocol`` with its completed stages replayed from ``journal`` and its new stages recorded there.

    Parameters
    ----------
    protocol : generator
        A protocol's server, freshly started.
    journal : Journal
        Its recorded stages are sent to ``protocol`` first (each request checked against the one
        recorded); every stage after them is yielded to the caller's transport and its replies
        appended to the journal before ``protocol`` sees them.
    books : mapping of str to list, optional
        The transport's books that a stage appends to (e.g. its ``rejected`` and ``participation``
        lists): what a live stage appended is recorded with it, and a replayed stage's entries are
        appended again, so that a resumed run's books are an uninterrupted run's.

    Returns
    -------
    generator
        A protocol generator like ``protocol``, for any driver.
    """
    books = dict(books or {})
    try:
        request = next(protocol)
        while True:
            recorded = journal.next_recorded()
            if recorded is not None:
                recorded.check(request)
                for name, entries in recorded.books.items():
                    books[name].extend(entries)
                replies = recorded.replies
            else:
                marks = {name: len(book) for name, book in books.items()}
                replies = yield request
                journal.append(request, replies, {name: book[marks[name]:] for name, book in books.items()})
            request = protocol.send(replies)
    except StopIteration:
        return


# ---------------------------------------------------------------- the stage files


def stage_file(number: int) -> str:
    return f"stage_{number:05d}.npz"


def save_stage(path: Path, number: int, request: Request, replies: list[Reply], books: Mapping[str, list[Any]]) -> Path:
    """Write one stage's file: every reply's arrays as members, everything else as one JSON member."""
    members: dict[str, np.ndarray] = {}
    entries = []
    for index, reply in enumerate(replies):
        keys = []
        for position, (key, array) in enumerate(reply.arrays.items()):
            if not isinstance(array, np.ndarray) or array.dtype.hasobject:
                raise JournalError(f"client {reply.partition_id}, {request.task} {request.round_label}: reply member "
                                   f"{key!r} is a {type(array).__name__}; a journal records numeric arrays only")
            members[f"r{index}_{position}"] = array
            keys.append(key)
        entries.append({"partition": reply.partition_id, "arrays": keys,
                        "values": {k: encode_value(v) for k, v in reply.values.items()}})
    meta = {"number": number, "task": request.task, "round": request.round_label, "digest": request_digest(request),
            "replies": entries, "books": dict(books)}
    members["meta"] = np.array(json.dumps(meta, default=_unjournalable))
    write_atomic(path, lambda handle: np.savez(handle, **members))
    return path


def load_stage(path: Path) -> RecordedStage:
    try:
        with np.load(path, allow_pickle=False) as members:
            meta = json.loads(str(members["meta"][()]))
            replies = [Reply(int(entry["partition"]),
                             {key: members[f"r{index}_{position}"] for position, key in enumerate(entry["arrays"])},
                             {key: decode_value(value) for key, value in entry["values"].items()})
                       for index, entry in enumerate(meta["replies"])]
    except (OSError, ValueError, KeyError) as err:
        raise JournalError(f"{path} cannot be read: {type(err).__name__}: {err}") from None
    return RecordedStage(int(meta["number"]), meta["task"], meta["round"], meta["digest"], replies, meta["books"])


# A reply's values are JSON scalars or lists (Flower's ConfigRecord); numpy scalars (an in-memory site's
# values) and bytes are tagged, so that each comes back of its own type and bit for bit.
_NUMPY_TAG, _BYTES_TAG, _TUPLE_TAG = "numpy-scalar", "bytes-hex", "tuple"


def encode_value(value: Any) -> Any:
    if isinstance(value, np.generic):
        return {_NUMPY_TAG: value.dtype.str, "hex": value.tobytes().hex()}
    if isinstance(value, bytes):
        return {_BYTES_TAG: value.hex()}
    if isinstance(value, list):
        return [encode_value(v) for v in value]
    if isinstance(value, tuple):
        return {_TUPLE_TAG: [encode_value(v) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return _unjournalable(value)


def decode_value(value: Any) -> Any:
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if isinstance(value, dict):
        if _NUMPY_TAG in value:
            return np.frombuffer(bytes.fromhex(value["hex"]), dtype=np.dtype(value[_NUMPY_TAG]))[0]
        if _BYTES_TAG in value:
            return bytes.fromhex(value[_BYTES_TAG])
        return tuple(decode_value(v) for v in value[_TUPLE_TAG])
    return value


def _unjournalable(value: Any) -> Any:
    raise JournalError(f"a reply value of type {type(value).__name__} cannot be journalled (scalars, bytes and lists can)")


def differing_keys(recorded: Any, given: Any, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two nested mappings (a key of only one of them included)."""
    if not (isinstance(recorded, dict) and isinstance(given, dict)):
        return [] if recorded == given else [prefix.rstrip(".") or "(the whole configuration)"]
    return [found for key in sorted(set(recorded) | set(given))
            for found in differing_keys(recorded.get(key), given.get(key), f"{prefix}{key}.")]
