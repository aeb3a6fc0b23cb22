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

A site's data may change between an interruption and the resume (a file edited, a site's export
run again): its recorded replies and its new ones would then be mixed into one result that neither
data gives. So a journalled run's first request carries a salt, and every site's reply to it a
salted digest of the data it read (:func:`fedica.protocol.tasks.digest_reply`), recorded in
:data:`SITES_FILE`; a resumed run asks the sites for the digest again (task
:data:`~fedica.protocol.messages.DATA_DIGEST`, before anything is replayed) and refuses, naming
the sites, when one differs.

On disk, in a run's folder (next to ``result.json``), :data:`JOURNAL_DIR` holds
:data:`MANIFEST_FILE` (the format, the configuration's fingerprint, the configuration and the
digests' salt), :data:`SITES_FILE` (each site's data digest) and one ``stage_<n>.npz`` per
completed stage (the replies' arrays exactly, their values, and the transport's books of the
stage), each written to a temporary file and renamed, so that a stage is either complete on disk
or absent. Nothing is pickled.

A journal is input like any other: a stage file is read through
:func:`fedica.persistence.read_arrays` (its size and every member's checked before anything is
read), its document's every field is checked for its type, and each replayed stage's replies pass
the checks a transport makes of live ones that the journal can make (:func:`check_replayed`). Any
fault is one :class:`JournalError` line naming the file. A folder that already holds a run's
completed stages is never overwritten by a new run (:meth:`Journal.create` refuses).
What this does not stop: someone who can write the folder can record replies of their own that
pass every check, as a site could send them (docs/DEPLOYMENT.md, "A run's folder").
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedica.protocol.messages import (
    DATA_DIGEST,
    DATA_DIGEST_KEY,
    DIGEST_FOR_TASK_KEY,
    DIGEST_SALT_KEY,
    MAX_CLIENT_TEXT,
    Reply,
    Request,
)
from fedica.persistence import read_arrays, write_atomic

log = logging.getLogger("fedica.server")

JOURNAL_DIR = "journal"
MANIFEST_FILE = "journal.json"
SITES_FILE = "sites.json"
# The data check's exchange: its round label, and the digests' form (SHA-256 in hex).
DATA_CHECK_ROUND = "data-check"
_DIGEST = re.compile(r"[0-9a-f]{64}")
JOURNAL_FORMAT = 1
# A manifest holds the run's configuration: kilobytes.
MAX_MANIFEST_BYTES = 2**24
_STAGE_FILE = re.compile(r"stage_(\d+)\.npz")
# The most a stage file may hold: all of one stage's replies, each bounded by its transport (64 MiB a
# reply through fedica-superlink by default). A file beyond it is not read.
MAX_STAGE_BYTES = 2**34
# The most characters a string of a stage's books may hold: the transport cuts a client's text to
# MAX_CLIENT_TEXT, and its own reasons are a line.
MAX_BOOK_TEXT = 4 * MAX_CLIENT_TEXT + 400


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
    salt : str
        The run's salt of the sites' data digests (hex).
    site_digests : dict of int to str, or None
        Each site's data digest as recorded when the run began; None until the data check.
    data_checked : bool
        Whether this run has checked its sites' data (once, before its first protocol's first stage).
    """

    def __init__(self, directory: str | os.PathLike, recorded: list[RecordedStage], salt: str | None = None,
                 site_digests: dict[int, str] | None = None):
        self.directory = Path(directory)
        self.recorded = recorded
        self.replayed = 0
        self.stages = len(recorded)
        self.after_stage: Callable[[Journal, Request], None] | None = None
        self.salt = salt or secrets.token_hex(32)
        self.site_digests = site_digests
        self.data_checked = False

    @classmethod
    def create(cls, run_dir: str | os.PathLike, description: Mapping[str, Any]) -> Journal:
        """A new, empty journal in ``run_dir/journal`` for a run described by ``description`` (its configuration).

        Raises
        ------
        JournalError
            The folder already holds completed stages (an earlier run's, interrupted): they are
            never deleted; the line says how to resume them, or to choose another folder.
        """
        directory = Path(run_dir) / JOURNAL_DIR
        directory.mkdir(parents=True, exist_ok=True)
        stages = [name for name in os.listdir(directory) if _STAGE_FILE.fullmatch(name)]
        if stages:
            raise JournalError(f"{run_dir} holds the journal of an earlier run ({len(stages)} completed stages); "
                               f"resume it (resume={run_dir}, fedica-deploy: --resume {run_dir}) or run in another folder")
        salt = secrets.token_hex(32)
        manifest = {"format": JOURNAL_FORMAT, "fingerprint": fingerprint(description), "description": description,
                    "salt": salt}
        write_atomic(directory / MANIFEST_FILE, lambda handle: handle.write(json.dumps(manifest, default=str).encode()))
        # A folder's earlier digests (of a run that completed no stage) belong to no stage of this run.
        (directory / SITES_FILE).unlink(missing_ok=True)
        return cls(directory, [], salt)

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
            if (directory / MANIFEST_FILE).stat().st_size > MAX_MANIFEST_BYTES:
                raise ValueError(f"more than the {MAX_MANIFEST_BYTES} bytes a journal's manifest holds")
            manifest = json.loads((directory / MANIFEST_FILE).read_text())
        except FileNotFoundError:
            raise JournalError(f"{run_dir}: no journal to resume ({directory / MANIFEST_FILE} does not exist)") from None
        except (OSError, ValueError, RecursionError) as err:
            raise JournalError(f"{directory / MANIFEST_FILE} cannot be read: {_one_line(err)}") from None
        if not isinstance(manifest, dict) or manifest.get("format") != JOURNAL_FORMAT:
            raise JournalError(f"{directory / MANIFEST_FILE} is not a fedica journal of format {JOURNAL_FORMAT}")
        if manifest.get("fingerprint") != fingerprint(description):
            differing = differing_keys(manifest.get("description"), json.loads(json.dumps(description, default=str)))
            raise JournalError(f"{run_dir}: its journal was written by another configuration "
                               f"(differs in {', '.join(differing[:8]) or 'its fingerprint'}); resume it with the same one")
        numbers = sorted(int(m.group(1)) for m in map(_STAGE_FILE.fullmatch, os.listdir(directory)) if m)
        if numbers != list(range(1, len(numbers) + 1)):
            raise JournalError(f"{directory}: stage files {numbers} are not numbered 1 to {len(numbers)}")
        recorded = [load_stage(directory / stage_file(n)) for n in numbers]
        for position, stage in enumerate(recorded, start=1):
            if stage.number != position:
                raise JournalError(f"{directory / stage_file(position)} says it is stage {stage.number}")
        salt = manifest.get("salt")
        if not (isinstance(salt, str) and re.fullmatch(r"[0-9a-f]{64}", salt)):
            raise JournalError(f"{directory / MANIFEST_FILE} holds no salt of its sites' data digests")
        digests = load_site_digests(directory / SITES_FILE)
        if recorded and digests is None:
            raise JournalError(f"{directory} holds {len(recorded)} completed stages but no record of its sites' data "
                               f"({SITES_FILE}): whether that data is still the same cannot be checked")
        return cls(directory, recorded, salt, digests)

    @classmethod
    def holds_stages(cls, run_dir: str | os.PathLike) -> bool:
        """Whether ``run_dir`` holds a journal with completed stages (an interrupted run's)."""
        directory = Path(run_dir) / JOURNAL_DIR
        return directory.is_dir() and any(_STAGE_FILE.fullmatch(name) for name in os.listdir(directory))

    @classmethod
    def written_for(cls, run_dir: str | os.PathLike, description: Mapping[str, Any]) -> bool:
        """Whether ``run_dir``'s journal manifest was written for ``description`` (False when it has none or another)."""
        try:
            manifest = json.loads((Path(run_dir) / JOURNAL_DIR / MANIFEST_FILE).read_text())
        except (OSError, ValueError, RecursionError):
            return False
        return isinstance(manifest, dict) and manifest.get("fingerprint") == fingerprint(description)

    def next_recorded(self) -> RecordedStage | None:
        """The next stage to replay, or None once every recorded stage has been replayed."""
        if self.replayed >= len(self.recorded):
            return None
        self.replayed += 1
        return self.recorded[self.replayed - 1]

    def salted(self, request: Request) -> Request:
        """``request`` with the run's salt among its values: each site's reply then holds its data digest."""
        return Request(request.task, request.round_label, request.payloads, {**request.values, DIGEST_SALT_KEY: self.salt})

    def data_check(self, first: Request) -> Request:
        """A resumed run's request of every site's data digest, of the data the run's ``first`` request reads."""
        return Request(DATA_DIGEST, DATA_CHECK_ROUND, None, {DIGEST_FOR_TASK_KEY: first.task, DIGEST_SALT_KEY: self.salt})

    def record_sites(self, replies: list[Reply]) -> None:
        """Record the data digests the sites sent with the run's first replies (:data:`SITES_FILE`)."""
        self.site_digests = _digests(replies)
        write_atomic(self.directory / SITES_FILE, lambda handle: handle.write(
            json.dumps({str(p): d for p, d in sorted(self.site_digests.items())}).encode()))

    def check_sites(self, replies: list[Reply]) -> None:
        """Compare a resumed run's sites' data digests with those recorded when the run began.

        Raises
        ------
        JournalError
            A site answers with another digest than it gave when the run began: its data changed,
            and its recorded replies are not of the data it holds now (the sites named).
        """
        digests = _digests(replies)
        recorded = self.site_digests or {}
        changed = sorted(p for p, d in digests.items() if p in recorded and recorded[p] != d)
        if changed:
            raise JournalError(f"the data of site{'s' if len(changed) > 1 else ''} {', '.join(map(str, changed[:20]))} "
                               f"changed since the run began (its digest differs from the one in {SITES_FILE}): its "
                               f"recorded replies are not of the data it holds now; resume it with that data, or start "
                               f"the run again in another folder")
        unchecked = sorted(set(recorded) ^ set(digests))
        if unchecked:
            log.warning("sites %s gave a data digest only when the run began or only now: whether their data changed "
                        "cannot be checked", ", ".join(map(str, unchecked[:20])))

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
        digest_first = False
        if not journal.data_checked:
            journal.data_checked = True
            if journal.site_digests is not None:
                # A resume: the sites' data now, against the digests they sent with the run's first reply. The check
                # is no stage of the run: what the transport's books say of it is not kept.
                marks = {name: len(book) for name, book in books.items()}
                replies = yield journal.data_check(request)
                for name, book in books.items():
                    del book[marks[name]:]
                journal.check_sites(replies)
            else:
                digest_first = True  # the run's first asked request carries the salt; its replies, the digests
        while True:
            recorded = journal.next_recorded()
            if recorded is not None:
                recorded.check(request)
                check_replayed(recorded, request)
                for name, entries in recorded.books.items():
                    if name not in books:
                        raise JournalError(f"journal stage {recorded.number}: a book {_shortened(name)!r} this run does not keep")
                    books[name].extend(entries)
                replies = recorded.replies
            else:
                marks = {name: len(book) for name, book in books.items()}
                replies = yield (journal.salted(request) if digest_first else request)
                if digest_first:
                    journal.record_sites(replies)  # before the stage: a stage on disk always has its sites' record
                    digest_first = False
                journal.append(request, replies, {name: book[marks[name]:] for name, book in books.items()})
            request = protocol.send(replies)
    except StopIteration:
        return


def _digests(replies: list[Reply]) -> dict[int, str]:
    """The data digests of ``replies``, by partition; a reply without one is said, and left out."""
    digests: dict[int, str] = {}
    for reply in replies:
        digest = reply.values.get(DATA_DIGEST_KEY)
        if isinstance(digest, str) and _DIGEST.fullmatch(digest):
            digests[reply.partition_id] = digest
        else:
            log.warning("site %d's reply holds no data digest; whether its data changes cannot be checked",
                        reply.partition_id)
    return digests


def load_site_digests(path: Path) -> dict[int, str] | None:
    """The sites' data digests a journal recorded (None: none recorded), each checked; one line if damaged."""
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise ValueError(f"more than the {MAX_MANIFEST_BYTES} bytes it may hold")
        recorded = json.loads(path.read_text())
        _require(isinstance(recorded, dict), "it is not a JSON object")
        _require(all(isinstance(p, str) and p.isdigit() and len(p) <= 12 and isinstance(d, str)
                     and _DIGEST.fullmatch(d) for p, d in recorded.items()),
                 "it is not a mapping of site numbers to SHA-256 digests")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as err:
        raise JournalError(f"{path} cannot be read: {_one_line(err)}") from None
    return {int(p): d for p, d in recorded.items()}


def check_replayed(stage: RecordedStage, request: Request) -> None:
    """The checks a transport makes of live replies that a journal's stage can be held to.

    Each reply comes from a different client, one the request addressed (when it addressed some),
    and the stage's ``participation`` book, where the transport listed the clients whose replies it
    kept, names exactly these: a reply added, removed or given another partition is refused.
    """
    where = f"journal stage {stage.number} ({stage.task} {stage.round_label})"
    partitions = [reply.partition_id for reply in stage.replies]
    if len(set(partitions)) != len(partitions):
        raise JournalError(f"{where}: two replies of one client")
    if request.payloads is not None:
        strangers = sorted(set(partitions) - set(request.payloads))
        if strangers:
            raise JournalError(f"{where}: replies of clients {strangers[:5]} that the stage did not ask")
    kept = [entry.get("clients") for entry in stage.books.get("participation", []) if isinstance(entry, dict)]
    if not kept:
        return
    listed = kept[-1]
    if not (isinstance(listed, list) and all(isinstance(c, int) and not isinstance(c, bool) for c in listed)
            and sorted(listed) == sorted(partitions)):
        raise JournalError(f"{where}: its replies are of clients {partitions[:8]}, its books say {str(listed)[:60]}")


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
    """One stage file, every part checked (:mod:`this module's <fedica.protocol.journal>` notes); one line if not."""
    try:
        members = read_arrays(path, max_bytes=MAX_STAGE_BYTES, kinds="biufcUS")
        if "meta" not in members or members["meta"].dtype.kind != "U" or members["meta"].shape != ():
            raise ValueError("no 'meta' document")
        meta = json.loads(str(members["meta"][()]))
        return _stage_from(meta, members)
    except (ValueError, KeyError, TypeError, IndexError, RecursionError) as err:
        raise JournalError(f"{path} cannot be read: {_one_line(err)}") from None


def _stage_from(meta: Any, members: Mapping[str, np.ndarray]) -> RecordedStage:
    """A stage from its checked document and arrays (TypeError or ValueError naming the first fault)."""
    _require(isinstance(meta, dict), "its document is not a JSON object")
    _require(isinstance(meta.get("number"), int) and not isinstance(meta["number"], bool) and meta["number"] >= 1,
             "'number' is not a stage number")
    _require(isinstance(meta.get("task"), str) and len(meta["task"]) <= 200, "'task' is not a task name")
    _require(isinstance(meta.get("round"), (int, str)) and len(str(meta["round"])) <= 200, "'round' is not a round")
    _require(isinstance(meta.get("digest"), str) and re.fullmatch(r"[0-9a-f]{64}", meta["digest"]) is not None,
             "'digest' is not a SHA-256 digest")
    _require(isinstance(meta.get("replies"), list), "'replies' is not a list")
    _require(isinstance(meta.get("books"), dict) and all(isinstance(v, list) and all(isinstance(e, dict) for e in v)
                                                         for v in meta["books"].values()),
             "'books' is not a mapping of lists of entries")
    _require(all({"client", "round", "reason"} <= set(entry) for entry in meta["books"].get("rejected", [])),
             "a 'rejected' entry lacks its client, round or reason")
    _check_book_text(meta["books"])
    used: set[str] = set()
    replies = []
    for index, entry in enumerate(meta["replies"]):
        _require(isinstance(entry, dict) and isinstance(entry.get("partition"), int) and not isinstance(entry["partition"], bool)
                 and entry["partition"] >= 0, f"reply {index} has no partition id")
        _require(isinstance(entry.get("arrays"), list) and all(isinstance(k, str) for k in entry["arrays"])
                 and len(set(entry["arrays"])) == len(entry["arrays"]), f"reply {index} has no list of array names")
        _require(isinstance(entry.get("values"), dict), f"reply {index} has no values")
        names = [f"r{index}_{position}" for position in range(len(entry["arrays"]))]
        missing = [name for name in names if name not in members]
        _require(not missing, f"reply {index}'s arrays {missing[:3]} are missing")
        used.update(names)
        replies.append(Reply(entry["partition"], {key: members[name] for key, name in zip(entry["arrays"], names)},
                             {key: decode_value(value) for key, value in entry["values"].items()}))
    extra = sorted(set(members) - used - {"meta"})
    _require(not extra, f"members {extra[:3]} belong to no reply")
    return RecordedStage(meta["number"], meta["task"], meta["round"], meta["digest"], replies, meta["books"])


def _require(condition: bool, fault: str) -> None:
    if not condition:
        raise ValueError(fault)


def _check_book_text(value: Any) -> None:
    """Every string in a stage's books is at most :data:`MAX_BOOK_TEXT` characters (the transport's own are)."""
    if isinstance(value, str):
        _require(len(value) <= MAX_BOOK_TEXT, f"its books hold a text of {len(value)} characters")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_book_text(key)
            _check_book_text(item)
    elif isinstance(value, list):
        for item in value:
            _check_book_text(item)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 300 else f"{text[:300]}..."


def _shortened(name: str) -> str:
    return name if len(name) <= 60 else f"{name[:60]}..."


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
    """A value as :func:`encode_value` wrote it (ValueError or TypeError for anything else)."""
    if isinstance(value, list):
        return [decode_value(v) for v in value]
    if isinstance(value, dict):
        if _NUMPY_TAG in value:
            dtype = np.dtype(value[_NUMPY_TAG])
            _require(dtype.kind in "biufc" and len(value["hex"]) == 2 * dtype.itemsize, "a numpy scalar of another size")
            return np.frombuffer(bytes.fromhex(value["hex"]), dtype=dtype)[0]
        if _BYTES_TAG in value:
            return bytes.fromhex(value[_BYTES_TAG])
        if _TUPLE_TAG in value:
            return tuple(decode_value(v) for v in value[_TUPLE_TAG])
        raise ValueError(f"a value tagged {sorted(value)[:3]}, which a journal never writes")
    return value


def _unjournalable(value: Any) -> Any:
    raise JournalError(f"a reply value of type {type(value).__name__} cannot be journalled (scalars, bytes and lists can)")


def differing_keys(recorded: Any, given: Any, prefix: str = "") -> list[str]:
    """The dotted keys whose values differ between two nested mappings (a key of only one of them included)."""
    if not (isinstance(recorded, dict) and isinstance(given, dict)):
        return [] if recorded == given else [prefix.rstrip(".") or "(the whole configuration)"]
    return [found for key in sorted(set(recorded) | set(given))
            for found in differing_keys(recorded.get(key), given.get(key), f"{prefix}{key}.")]
