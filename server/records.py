"""fedica's protocol (:mod:`fedica.protocol`) in Flower's records; imported by the strategies and the ClientApp.

Every message carries two records: ``"arrays"`` (an ArrayRecord of numpy arrays) and
``"values"`` (a ConfigRecord of scalars and strings). The task is the message type. For
fedica's own ClientApp, which makes or reads its data from the run's scenario, the scenario
travels as JSON in ``values["cfg"]`` (:func:`config_to_json`), so that every engine
(simulation, in-process, deployment) runs the clients from the server's one resolved config.
"""

from __future__ import annotations

import json
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


def pack(arrays: Mapping[str, np.ndarray] | None = None, values: Mapping[str, Any] | None = None) -> RecordDict:
    """Build a message content from numpy arrays and scalar values.

    Parameters
    ----------
    arrays : mapping of str to ndarray, optional
    values : mapping of str to int, float, bool or str, optional
        numpy scalars are converted to Python scalars (Flower's records reject them).
    """
    record_arrays = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in (arrays or {}).items()})
    record_values = ConfigRecord({k: _python_scalar(v) for k, v in (values or {}).items()})
    return RecordDict({ARRAYS: record_arrays, VALUES: record_values})


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
            arrays[key] = array.numpy()
        except Exception as err:  # noqa: BLE001 - any decoding failure is a malformed message
            raise MalformedMessage(f"array {key!r} cannot be decoded: {err}") from None
    return arrays, dict(record_values.items())


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
