"""The records codec: arrays travel as np.save's bytes and come back as np.load's arrays, through cached headers."""

import io

import numpy as np
import pytest
from fedica.server.records import MalformedMessage, decode_array, encode_array, pack, unpack
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

RNG = np.random.default_rng(0)
ARRAYS = [
    RNG.random((10, 10)), np.arange(5), np.zeros((0, 3)), np.array(3.5), RNG.random((3, 4)).astype(np.float32),
    np.array([True, False]), np.asfortranarray(RNG.random((4, 5))), RNG.integers(0, 9, (2, 3, 4)).astype(np.int8),
    np.array(["ab", "c"]), RNG.random((6, 2))[::2], np.array([1 + 2j]), RNG.random(3).astype(">f8"),
]


@pytest.mark.parametrize("values", ARRAYS, ids=lambda a: f"{a.dtype}{a.shape}")
def test_the_bytes_are_np_saves_and_the_array_np_loads(values):
    flower = Array(np.ascontiguousarray(values))  # Flower's own encoding
    for _ in range(2):  # the first makes the cached header, the second uses it
        ours = encode_array(values)
        assert ours.data == flower.data and ours.dtype == flower.dtype and ours.shape == flower.shape
        decoded, reference = decode_array(ours), flower.numpy()
        assert decoded.dtype == reference.dtype and decoded.shape == reference.shape
        assert np.array_equal(decoded, reference) and decoded.flags.writeable  # np.load's arrays may be written to


def _array(data: bytes, shape=(4, 5)) -> Array:
    return Array(dtype="float64", shape=shape, stype="numpy.ndarray", data=data)


def test_a_fortran_ordered_or_version_2_array_from_another_sender_decodes_as_np_load_does():
    fortran = np.asfortranarray(RNG.random((4, 5)))
    for version in ((1, 0), (2, 0)):
        buffer = io.BytesIO()
        np.lib.format.write_array(buffer, fortran, version=version)
        decoded = decode_array(_array(buffer.getvalue()))
        assert np.array_equal(decoded, fortran) and decoded.flags.f_contiguous


def _saved(values) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, values, allow_pickle=False)
    return buffer.getvalue()


@pytest.mark.parametrize("data, reason", [
    (b"not numpy at all", "not in numpy's .npy format"),
    (_saved(np.zeros((4, 5)))[:-8], "holds 152 bytes, its header says 160"),
    (_saved(np.zeros((4, 5))) + b"\0" * 8, "holds 168 bytes, its header says 160"),
    (b"\x93NUMPY\x09\x00" + b"\0" * 8, "unknown .npy format version 9"),
])
def test_malformed_data_is_refused_with_a_reason(data, reason):
    with pytest.raises(ValueError, match=reason):
        decode_array(_array(data))


def test_an_object_array_is_refused_both_ways():
    with pytest.raises(TypeError, match="pickle"):
        encode_array(np.array([{"a": 1}], dtype=object))
    object_header = b"{'descr': '|O', 'fortran_order': False, 'shape': (2,), }"
    object_header += b" " * (117 - len(object_header)) + b"\n"
    data = b"\x93NUMPY\x01\x00" + len(object_header).to_bytes(2, "little") + object_header + b"\0" * 16
    with pytest.raises(ValueError, match="object arrays"):
        decode_array(_array(data, shape=(2,)))


def test_unpack_names_the_array_and_quotes_the_sender_briefly():
    long_header = b"{'descr': '<f8', 'fortran_order': False, 'shape': (" + b"9" * 5000 + b",), }\n"
    data = b"\x93NUMPY\x01\x00" + len(long_header).to_bytes(2, "little") + long_header
    content = RecordDict({"arrays": ArrayRecord({"maximisers": _array(data)}), "values": ConfigRecord({})})
    with pytest.raises(MalformedMessage, match="array 'maximisers' cannot be decoded") as caught:
        unpack(content)
    assert len(str(caught.value)) < 300


def test_pack_and_unpack_round_trip():
    arrays, values = unpack(pack({"a": ARRAYS[0], "b": ARRAYS[6]}, {"n-points": np.int64(3), "task": "x"}))
    assert np.array_equal(arrays["a"], ARRAYS[0]) and np.array_equal(arrays["b"], ARRAYS[6])
    assert values == {"n-points": 3, "task": "x"} and type(values["n-points"]) is int


def test_a_request_encodes_an_array_it_sends_to_many_clients_once():
    shared, own = np.arange(12.0).reshape(4, 3), [np.full(2, float(i)) for i in range(3)]
    encoded: dict = {}
    contents = [pack({"candidates": shared, "own": own[i]}, {"k": i}, encoded=encoded) for i in range(3)]
    data = [content["arrays"]["candidates"].data for content in contents]
    assert data[0] is data[1] is data[2]  # one copy of the bytes for every client
    assert len({id(content["arrays"]["own"].data) for content in contents}) == 3
    for i, content in enumerate(contents):  # and each message decodes as if packed alone
        arrays, values = unpack(content)
        alone, _ = unpack(pack({"candidates": shared, "own": own[i]}, {"k": i}))
        assert values == {"k": i} and arrays.keys() == alone.keys()
        assert all(np.array_equal(arrays[key], alone[key]) for key in alone)
    # An equal array that is another object is encoded on its own (only the very object is shared).
    copy = pack({"candidates": shared.copy()}, encoded=encoded)["arrays"]["candidates"]
    assert copy.data is not data[0] and copy.data == data[0]
