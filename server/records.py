"""fedica's protocol (:mod:`fedica.protocol`) in Flower's records; imported by the strategies and the ClientApp.

Every message carries two records: ``"arrays"`` (an ArrayRecord of numpy arrays) and
``"values"`` (a ConfigRecord of scalars and strings). The task is the message type. For
fedica's own ClientApp, which makes or reads its data from the run's scenario, the scenario
travels as JSON in ``values["cfg"]`` (:func:`config_to_json`), so that every engine
(simulation, in-process, deployment) runs the clients from the server's one resolved config.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedica.protocol.messages import value_bytes

ARRAYS = "arrays"
VALUES = "values"

# Error code of a reply whose client failed before it knew its partition id.
CLIENT_ERROR_CODE = 900


class MalformedMessage(ValueError):
    """A message lacks a record or holds one of the wrong type."""


def pack(arrays: Mapping[str, np.ndarray] | None = None, values: Mapping[str, Any] | None = None, *,
         encoded: dict[int, tuple[Any, Array]] | None = None) -> RecordDict:
    """Build a message content from numpy arrays and scalar values.

    Parameters
    ----------
    arrays : mapping of str to ndarray, optional
    values : mapping of str to int, float, bool or str, optional
        numpy scalars are converted to Python scalars (Flower's records reject them).
    encoded : dict, optional
        The encodings made so far for the messages of one request, by array object: an array that
        another message of the request already carries is not encoded again, and the messages
        share its (immutable) bytes. A request that sends every client the same array (FedGEM's
        candidate models: 6,000 centres, 0.5 MB, to each of 10,000 clients) then holds it once
        instead of once per client. Arrays must not change while the dict is in use.
    """
    # Filled item by item: ArrayRecord's constructor copies every Array it is given (about 25 us each, three
    # quarters of a reply's encoding), where an item is only type-checked; the record holds the same Arrays.
    record_arrays = ArrayRecord()
    for key, value in (arrays or {}).items():
        record_arrays[key] = _encoded_once(value, encoded)
    record_values = ConfigRecord({k: _python_scalar(v) for k, v in (values or {}).items()})
    return RecordDict({ARRAYS: record_arrays, VALUES: record_values})


def _encoded_once(values: Any, encoded: dict[int, tuple[Any, Array]] | None) -> Array:
    """:func:`encode_array` of ``values``, or the Array ``encoded`` already holds for this very object."""
    if encoded is None:
        return encode_array(values)
    # The entry keeps the array itself, so that its id cannot pass to another object while the dict lives.
    known = encoded.get(id(values))
    if known is None:
        known = encoded[id(values)] = (values, encode_array(values))
    return known[1]


def unpack(content: RecordDict) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Split a message content into its arrays and its values.

    Raises
    ------
    MalformedMessage
        When a record is missing or of the wrong type, or an array cannot be decoded.
    """
    try:
        record_arrays = content[ARRAYS]
        record_values = content[VALUES]
    except KeyError as err:
        raise MalformedMessage(f"the message has no {err.args[0]!r} record") from None
    if not isinstance(record_arrays, ArrayRecord):
        raise MalformedMessage(f"record {ARRAYS!r} is a {type(record_arrays).__name__}, not an ArrayRecord")
    if not isinstance(record_values, ConfigRecord):
        raise MalformedMessage(f"record {VALUES!r} is a {type(record_values).__name__}, not a ConfigRecord")
    arrays = {}
    for key, array in record_arrays.items():
        try:
            arrays[key] = decode_array(array)
        except Exception as err:  # noqa: BLE001 - any decoding failure is a malformed message
            # The sender chose the bytes numpy's message may quote: cut, so a reply cannot fill the books.
            raise MalformedMessage(f"array {key!r} cannot be decoded: {str(err)[:ERROR_QUOTE_CHARS]}") from None
    return arrays, dict(record_values.items())


# Flower's Array.from_numpy_ndarray and Array.numpy go through np.save and np.load, which build
# and parse the .npy header (np.load with ast.literal_eval) for every array: about 100 us each, and
# a run of 1,000 clients moves some 90,000 arrays. A header depends only on the array's dtype and
# shape, so encode_array takes np.save's own header once per (dtype, shape) and decode_array parses
# each distinct header once with numpy's own reader; the bytes are np.save's, bit for bit, and the
# result is np.load's.
_HEADER_CACHE_LIMIT = 4096
_ENCODE_HEADERS: dict[tuple[str, tuple[int, ...]], bytes] = {}
_DECODE_HEADERS: dict[bytes, tuple[np.dtype, tuple[int, ...], bool]] = {}
_NPY_MAGIC = b"\x93NUMPY"
ERROR_QUOTE_CHARS = 200


def encode_array(values: Any) -> Array:
    """A numpy array (made C-contiguous) as Flower's ``Array``, with the bytes ``np.save`` writes."""
    values = np.ascontiguousarray(values)
    if values.dtype.hasobject:
        raise TypeError(f"an array of dtype {values.dtype} cannot travel (numpy's format would need pickle)")
    key = (values.dtype.str, values.shape)
    header = _ENCODE_HEADERS.get(key)
    if header is None:
        buffer = io.BytesIO()
        np.save(buffer, values, allow_pickle=False)
        data = buffer.getvalue()
        _remember(_ENCODE_HEADERS, key, data[: len(data) - values.nbytes])
    else:
        data = header + values.tobytes()
    return Array(dtype=str(values.dtype), shape=tuple(values.shape), stype="numpy.ndarray", data=data)


def decode_array(array: Array) -> np.ndarray:
    """Flower's ``Array`` as the numpy array ``np.load`` gives (writable, its own memory), with no trailing bytes allowed.

    Raises
    ------
    ValueError
        When the data is not a .npy array of a plain dtype, or holds more or fewer bytes than its header says.
    """
    if array.stype != "numpy.ndarray":
        raise ValueError(f"serialisation type {str(array.stype)[:40]!r} is not numpy's")
    data = array.data
    header_length = _npy_header_length(data)
    header = bytes(data[:header_length])
    parsed = _DECODE_HEADERS.get(header)
    if parsed is None:
        parsed = _parse_npy_header(header)
        _remember(_DECODE_HEADERS, header, parsed)
    dtype, shape, fortran_order = parsed
    count = math.prod(shape)
    if len(data) - header_length != count * dtype.itemsize:
        raise ValueError(f"the array's data holds {len(data) - header_length} bytes, its header says "
                         f"{count * dtype.itemsize} ({dtype} of shape {shape})")
    flat = np.frombuffer(data, dtype=dtype, count=count, offset=header_length).copy()
    return flat.reshape(shape[::-1]).transpose() if fortran_order else flat.reshape(shape)


def _npy_header_length(data: bytes) -> int:
    """Bytes up to the end of a .npy header: magic, version, the header's own length, the header."""
    if len(data) < 10 or data[:6] != _NPY_MAGIC:
        raise ValueError("the data is not in numpy's .npy format")
    major = data[6]
    if major == 1:
        return 10 + int.from_bytes(data[8:10], "little")
    if major in (2, 3):
        if len(data) < 12:
            raise ValueError("the .npy header is cut short")
        return 12 + int.from_bytes(data[8:12], "little")
    raise ValueError(f"unknown .npy format version {major}")


def _parse_npy_header(header: bytes) -> tuple[np.dtype, tuple[int, ...], bool]:
    """numpy's own reading of a .npy header (with its size limit and checks); refuses object dtypes."""
    buffer = io.BytesIO(header)
    version = np.lib.format.read_magic(buffer)
    if version == (1, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(buffer)
    elif version == (2, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(buffer)
    else:
        raise ValueError(f".npy format version {version} is not supported")
    if dtype.hasobject:
        raise ValueError("object arrays cannot be loaded without pickle")
    return dtype, tuple(int(n) for n in shape), bool(fortran_order)


def _remember(cache: dict, key: Any, value: Any) -> None:
    """Store in a header cache, emptied when full (the keys are few in a run: the messages' kinds of array)."""
    if len(cache) >= _HEADER_CACHE_LIMIT:
        cache.clear()
    cache[key] = value


def content_bytes(content: RecordDict) -> int:
    """The bytes of a message's arrays (their encoded data) and values, counted without decoding an array.

    What the transport holds a reply's size to before :func:`unpack` decodes it
    (:func:`fedica.protocol.messages.reply_size_limits`); a missing record, or one of the wrong type,
    counts nothing here (:func:`unpack` refuses it).
    """
    total = 0
    try:
        record_arrays, record_values = content[ARRAYS], content[VALUES]
    except KeyError:
        return 0
    if isinstance(record_arrays, ArrayRecord):
        total += sum(len(array.data) for array in record_arrays.values())
    if isinstance(record_values, ConfigRecord):
        total += sum(value_bytes(value) for value in record_values.values())
    return total


def config_to_json(cfg: Mapping[str, Any]) -> str:
    """The part of the run config the clients need, as JSON."""
    return json.dumps({k: cfg[k] for k in ("algorithm", "scenario", "attack", "seed")})


def _python_scalar(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return value
