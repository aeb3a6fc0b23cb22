"""Keeping a fitted estimator: one portable ``.npz`` file, and rebuilding one from a run's ``result.json``.

The file is a numpy ``.npz`` archive (a zip of ``.npy`` arrays) that ``np.load(path,
allow_pickle=False)`` reads: no pickle, so opening a file runs no code and needs no fedica class
to exist. Its member ``__fedica__`` is a JSON document:

- ``format`` (:data:`FORMAT`), ``format_version`` (:data:`FORMAT_VERSION`), ``fedica_version``
  (the writer's), ``estimator`` (the class name, ``"FedGEM"`` or ``"RFICA"``);
- ``params``: ``get_params()``;
- ``attributes``: every fitted attribute (the public names ending in ``_``).

Within ``params`` and ``attributes`` a JSON value stands for itself, except that every numpy
array or numpy scalar is a member of the archive named by where it sits (``means_``,
``site_mapping_.3``, ``tuning_.k_hats``) and the document holds ``{"__array__": name}`` or
``{"__scalar__": name}`` there; a tuple is ``{"__tuple__": [...]}``, a non-finite float
``{"__float__": "nan"}`` (the document stays strict JSON), and a mapping with a key that is not a
string, or that starts with ``__``, is ``{"__dict__": [[key, value], ...]}``. So every value comes
back with its type, every array with its dtype and bits.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.utils.validation import check_is_fitted

from fedica.parameters import Declaration
from fedica.version import __version__

__all__ = ["FORMAT", "FORMAT_VERSION", "DOCUMENT_MEMBER", "SaveLoadMixin", "read_arrays", "read_result", "write_atomic"]

FORMAT = "fedica.estimator"
# Increased with any change of the layout that an older fedica would misread; load refuses a newer one.
FORMAT_VERSION = 1
DOCUMENT_MEMBER = "__fedica__"

_TAGS = ("__array__", "__scalar__", "__tuple__", "__float__", "__dict__")
# The most an estimator file may hold, its members uncompressed together: a model is kilobytes to
# megabytes (labels_ of a one-array fit: 8 bytes a row). Nothing beyond it is read.
MAX_MODEL_BYTES = 2**30


def _fitted_attributes(estimator) -> dict[str, Any]:
    # scikit-learn's convention: the fitted attributes are the public ones ending in "_".
    return {name: value for name, value in vars(estimator).items() if name.endswith("_") and not name.startswith("_")}


class _Encoder:
    """Turns a value into JSON, putting its numpy arrays and scalars aside as named archive members."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def encode(self, value: Any, where: str) -> Any:
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"__float__": repr(value)}
        if isinstance(value, (np.ndarray, np.generic)):
            if value.dtype.hasobject:  # np.savez would pickle it
                raise TypeError(f"{where}: an array of Python objects cannot be saved without pickle")
            # Two paths can spell the same name (a key "a.0" beside item 0 of "a"): the later one is renumbered.
            name = where if where not in self.arrays else f"{where}#{len(self.arrays)}"
            self.arrays[name] = np.asarray(value)
            return {"__array__" if isinstance(value, np.ndarray) else "__scalar__": name}
        if isinstance(value, tuple):
            return {"__tuple__": [self.encode(v, f"{where}.{i}") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [self.encode(v, f"{where}.{i}") for i, v in enumerate(value)]
        if isinstance(value, Mapping):
            if all(isinstance(k, str) and not k.startswith("__") for k in value):
                return {k: self.encode(v, f"{where}.{k}") for k, v in value.items()}
            return {"__dict__": [[self.encode(k, f"{where}.key{i}"), self.encode(v, f"{where}.{k}")]
                                 for i, (k, v) in enumerate(value.items())]}
        raise TypeError(f"{where}: a {type(value).__name__} cannot be saved")


def _member(archive: Mapping[str, np.ndarray], name: Any, path: Path) -> np.ndarray:
    if not isinstance(name, str) or name not in archive:
        raise ValueError(f"{path}: member {name!r} is missing (the file is incomplete or was altered)")
    return archive[name]


def _decode(value: Any, archive, path: Path) -> Any:
    if isinstance(value, list):
        return [_decode(v, archive, path) for v in value]
    if not isinstance(value, dict):
        return value
    tag = next(iter(value), None) if len(value) == 1 else None
    if tag not in _TAGS:
        return {k: _decode(v, archive, path) for k, v in value.items()}
    content = value[tag]
    if tag in ("__array__", "__scalar__"):
        array = _member(archive, content, path)
        return array if tag == "__array__" else array[()]
    if tag == "__float__":
        if content not in ("nan", "inf", "-inf"):
            raise ValueError(f"{path}: {content!r} is not a non-finite float")
        return float(content)
    if tag == "__tuple__":
        return tuple(_decode(v, archive, path) for v in content)
    return {_decode(k, archive, path): _decode(v, archive, path) for k, v in content}


class SaveLoadMixin:
    """``save(path)`` and ``load(path)`` for fedica's estimators, in the format of this module."""

    def save(self, path: str | os.PathLike) -> Path:
        """Write the fitted estimator to ``path``, a portable ``.npz`` file (no pickle).

        The file holds the parameters, every fitted attribute, fedica's version and the format
        version (:mod:`fedica.persistence`); it is written whole or not at all (a temporary file
        in the same folder, then a rename).

        Parameters
        ----------
        path : str or os.PathLike
            Written as given (no ``.npz`` is appended).

        Returns
        -------
        path : Path

        Raises
        ------
        sklearn.exceptions.NotFittedError
            Before ``fit``.
        """
        check_is_fitted(self)
        encoder = _Encoder()
        document = {"format": FORMAT, "format_version": FORMAT_VERSION, "fedica_version": __version__,
                    "estimator": type(self).__name__,
                    "params": encoder.encode(self.get_params(), "params"),
                    "attributes": {name: encoder.encode(value, name)
                                   for name, value in _fitted_attributes(self).items()}}
        members = {DOCUMENT_MEMBER: np.array(json.dumps(document, allow_nan=False)), **encoder.arrays}
        return write_atomic(path, lambda handle: np.savez_compressed(handle, **members))

    @classmethod
    def load(cls, path: str | os.PathLike):
        """The estimator :meth:`save` wrote to ``path``, with the same parameters and fitted attributes.

        Parameters
        ----------
        path : str or os.PathLike

        Returns
        -------
        estimator : an instance of this class

        Raises
        ------
        ValueError
            One line naming the file and the problem: not a fedica estimator file, an estimator of
            another class, a format version newer than this fedica reads, a missing member.
        """
        path = Path(path)
        try:
            archive = read_arrays(path, max_bytes=MAX_MODEL_BYTES, kinds="biufU")
        except ValueError as err:
            with contextlib.suppress(OSError), open(path, "rb") as handle:
                if handle.read(6) == b"\x93NUMPY":
                    raise ValueError(f"{path}: not a fedica estimator file (a single .npy array, not a .npz archive)") from None
            raise ValueError(f"{path}: not a fedica estimator file ({str(err).removeprefix(f'{path}: ')})") from None
        try:
            return cls._from_archive(archive, path)
        except (TypeError, KeyError, IndexError, RecursionError, AttributeError) as err:
            # A document of the right shape whose values are not what save writes.
            raise ValueError(f"{path}: not a fedica estimator file ({type(err).__name__} reading its document)") from None

    # The class's parameter declaration (fedica.parameters), and every fitted attribute a file may set:
    # anything else in a file is refused.
    _PARAMETERS: Declaration
    _FITTED_ATTRIBUTES: frozenset[str] = frozenset()

    def _check_fitted(self) -> None:
        """Raise ValueError naming what is wrong with the fitted attributes (after :meth:`load` set them)."""

    @classmethod
    def _from_archive(cls, archive: Mapping[str, np.ndarray], path: Path):
        document = None
        if DOCUMENT_MEMBER in archive and archive[DOCUMENT_MEMBER].dtype.kind == "U" and archive[DOCUMENT_MEMBER].shape == ():
            try:
                document = json.loads(archive[DOCUMENT_MEMBER].item())
            except (ValueError, RecursionError):
                document = None
        if (not isinstance(document, dict) or document.get("format") != FORMAT
                or not isinstance(document.get("params"), dict) or not isinstance(document.get("attributes"), dict)):
            raise ValueError(f"{path}: not a fedica estimator file (no {DOCUMENT_MEMBER} document of format {FORMAT})")
        version = document.get("format_version")
        if not isinstance(version, int):
            raise ValueError(f"{path}: not a fedica estimator file (format_version {version!r} is not an integer)")
        if version > FORMAT_VERSION:
            raise ValueError(f"{path}: format version {version!r} is newer than the {FORMAT_VERSION} this fedica reads "
                             f"(written by fedica {document.get('fedica_version')}); load it with that version")
        if document.get("estimator") != cls.__name__:
            raise ValueError(f"{path}: holds a fedica.{document.get('estimator')}, not a fedica.{cls.__name__}")
        unknown = sorted(set(document["attributes"]) - cls._FITTED_ATTRIBUTES)
        if unknown:
            raise ValueError(f"{path}: attributes {[name[:40] for name in unknown[:5]]} are not fitted attributes of {cls.__name__}")
        params = _decode(document["params"], archive, path)
        unknown = sorted(set(params) - set(cls().get_params()))
        if unknown:
            raise ValueError(f"{path}: parameters {unknown} are not {cls.__name__}'s")
        try:
            cls._PARAMETERS.check(params)
        except (TypeError, ValueError) as err:  # name=value: rule
            raise ValueError(f"{path}: {err}") from None
        estimator = cls(**params)
        for name, value in document["attributes"].items():
            setattr(estimator, name, _decode(value, archive, path))
        try:
            estimator._check_fitted()
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None
        extra = sorted(set(archive) - {DOCUMENT_MEMBER} - _referenced(document))
        if extra:
            raise ValueError(f"{path}: members {extra[:3]} belong to no parameter or attribute")
        return estimator


def _referenced(document: Any) -> set[str]:
    """The archive members a document names (its ``__array__`` and ``__scalar__`` tags)."""
    names: set[str] = set()
    stack = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            for tag in ("__array__", "__scalar__"):
                if len(value) == 1 and isinstance(value.get(tag), str):
                    names.add(value[tag])
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return names


def check_array(value: Any, name: str, *, ndim: int, shape: tuple[int | None, ...] | None = None,
                kinds: str = "f", finite: bool = True, optional: bool = False) -> np.ndarray | None:
    """``value`` as a fitted attribute must be: an array of ``ndim`` dimensions (``shape``: None where any
    size goes), of a kind in ``kinds``, finite; ValueError naming ``name`` otherwise (None passes if ``optional``)."""
    if value is None and optional:
        return None
    if not isinstance(value, np.ndarray) or value.ndim != ndim or value.dtype.kind not in kinds:
        described = (f"an array of shape {value.shape} and dtype {value.dtype}" if isinstance(value, np.ndarray)
                     else f"a {type(value).__name__}")
        raise ValueError(f"{name} is {described}, not a {ndim}-D array of {'real numbers' if kinds == 'f' else 'integers'}")
    if shape is not None and any(want is not None and got != want for got, want in zip(value.shape, shape)):
        raise ValueError(f"{name} has shape {value.shape}, where the other attributes ask "
                         f"{tuple('any' if want is None else want for want in shape)}")
    if finite and value.dtype.kind == "f" and not np.isfinite(value).all():
        raise ValueError(f"{name} holds NaN or infinite values")
    return value


def read_result(path: str | os.PathLike, algorithm: str, declaration: Declaration,
                section_keys: tuple[str, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A complete run's ``result.json`` of ``algorithm``, and the estimator parameters the run used.

    Parameters
    ----------
    path : str or os.PathLike
        A ``result.json`` written by ``fedica-run`` (docs/INTERFACE.md section 3).
    algorithm : {"fedgem", "rfica"}
        The result's ``algorithm``, and the name of its own section.
    declaration : Declaration
        The estimator's parameters: those among the run's ``config.algorithm`` keys, and
        ``random_state`` and ``min_clients`` from the config's ``seed`` and ``min_clients``.
    section_keys : tuple of str
        Keys the algorithm's section must hold.

    Returns
    -------
    result : dict
    params : dict

    Raises
    ------
    ValueError
        One line naming the file: not a JSON result, a stopped run's ``partial_result.json``, a result
        of the other algorithm, or a missing key.
    """
    path = Path(path)
    try:
        result = json.loads(path.read_text())
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"{path}: not a fedica-run result (not JSON)") from None
    if not isinstance(result, dict) or "config" not in result:
        raise ValueError(f"{path}: not a fedica-run result (no config)")
    if "status" in result or "metrics" not in result:
        raise ValueError(f"{path}: the partial result of a stopped run ({result.get('status', 'no metrics')}); "
                         "only a complete result.json holds a fitted model")
    if result.get("algorithm") != algorithm:
        raise ValueError(f"{path}: a result of algorithm {result.get('algorithm')!r}, not {algorithm!r}")
    missing = [key for key in ("clients", "history") if key not in result]
    missing += [f"{algorithm}.{key}" for key in section_keys if key not in result.get(algorithm, {})]
    if missing:
        raise ValueError(f"{path}: the result lacks {', '.join(missing)}")
    config = result["config"]
    params = {name: value for name, value in config["algorithm"].items() if name in declaration}
    params.update({name: config[key] for name, key in (("random_state", "seed"), ("min_clients", "min_clients"))
                   if name in declaration and key in config})
    return result, params


def read_arrays(path: str | os.PathLike, *, max_bytes: int, kinds: str = "biufcU") -> dict[str, np.ndarray]:
    """Every member of the ``.npz`` archive at ``path``, checked before any of it is read into memory.

    ``np.load`` trusts a file: a member's header may declare any shape (a 2 MB file that asks for
    gigabytes), a compressed member may inflate without bound, and a damaged one surfaces as one of
    half a dozen exceptions. Here the file and each member are checked first, from the zip
    directory and each ``.npy`` header (written by hand because numpy reads a member's header and
    data in one step):

    - the file holds at most ``max_bytes``, and so do its members, uncompressed, together;
    - every member is a ``.npy`` array of a kind in ``kinds`` (numpy's kind letters; never an
      object array, which would need pickle) whose header's shape and dtype account for exactly
      the member's size: no more data is read than that.

    Raises
    ------
    ValueError
        One line naming the file and what is wrong with it.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as err:
        raise ValueError(f"{path}: cannot be read ({err.strerror or err})") from None
    if not path.is_file():
        raise ValueError(f"{path}: not a file")
    if size > max_bytes:
        raise ValueError(f"{path}: {size} bytes, more than the {max_bytes} such a file may hold")
    arrays: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            declared = sum(member.file_size for member in members)
            if declared > max_bytes:
                raise ValueError(f"{path}: its members declare {declared} bytes, more than the {max_bytes} it may hold")
            for member in members:
                if not member.filename.endswith(".npy"):
                    raise ValueError(f"{path}: member {member.filename!r} is not a .npy array")
                with archive.open(member) as stream:
                    arrays[member.filename[:-4]] = _read_member(stream, member, kinds, path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError, RuntimeError, OSError) as err:
        raise ValueError(f"{path}: not a readable .npz archive ({type(err).__name__}: {err})") from None
    return arrays


def _read_member(stream, member: zipfile.ZipInfo, kinds: str, path: Path) -> np.ndarray:
    """One ``.npy`` member, its header checked against the member's declared size before its data is read."""
    name = member.filename
    try:
        version = np.lib.format.read_magic(stream)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read_header is None:
            raise ValueError(f"format version {version} (numpy writes 1.0, or 2.0 for large headers)")
        shape, fortran_order, dtype = read_header(stream, max_header_size=10_000)
    except (ValueError, SyntaxError, TypeError) as err:
        raise ValueError(f"{path}: member {name!r} has no valid .npy header ({err})") from None
    if dtype.hasobject or dtype.kind not in kinds or dtype.fields is not None:
        raise ValueError(f"{path}: member {name!r} holds {dtype} values, not numbers")
    header = stream.tell() if stream.seekable() else None
    count = math.prod(shape)
    data = count * dtype.itemsize
    if header is not None and header + data != member.file_size:
        raise ValueError(f"{path}: member {name!r} declares shape {shape} of {dtype} ({data} bytes), "
                         f"which its {member.file_size - header} bytes do not hold")
    raw = stream.read(data)
    if len(raw) != data:
        raise ValueError(f"{path}: member {name!r} is cut short")
    array = np.frombuffer(raw, dtype=dtype, count=count)
    return array.reshape(shape, order="F" if fortran_order else "C").copy()


def write_atomic(path: str | os.PathLike, write: Any) -> Path:
    """``write(handle)`` into a binary temporary file beside ``path``, flushed to disk, then renamed over ``path``.

    So ``path`` is either absent, as it was, or complete: the rename is atomic on POSIX file systems.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
