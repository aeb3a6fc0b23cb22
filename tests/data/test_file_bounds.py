"""A data file's size and columns bound up front, its memory in proportion to its size, its content never echoed."""

import tracemalloc
import zipfile

import numpy as np
import pytest

from fedica.data.files import DataFileError, read_table, table_extent


def _malformed_npz(path, member="X.npy"):
    header = b"{'descr': '<f8', 'fortran_order': False, 'shape': (SECRET_CONTENT, 3), }"
    header += b" " * (117 - len(header)) + b"\n"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header)


def test_a_malformed_npz_member_header_is_refused_without_echoing_it(tmp_path):
    path = tmp_path / "bad.npz"
    _malformed_npz(path)
    for read in (read_table, table_extent):
        with pytest.raises(DataFileError, match=r"header .*malformed \(ValueError\)") as info:
            read(path)
        assert "SECRET" not in str(info.value) and "SECRET" not in info.value.detail


def test_an_npz_without_x_names_its_members_only_on_the_files_machine(tmp_path):
    path = tmp_path / "other.npz"
    np.savez(path, SECRET_NAME=np.zeros((3, 2)))
    with pytest.raises(DataFileError) as info:
        read_table(path)
    assert info.value.problem == ".npz file has no array 'X'"
    assert "SECRET_NAME" in info.value.detail


def test_a_tables_extent_is_known_from_its_header_or_its_size(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((7, 3)))
    np.savez(tmp_path / "b.npz", X=np.zeros((5, 4)), y=np.zeros(5))
    (tmp_path / "c.csv").write_text("a,b,c\n1,2,3\n4,5,6\n")
    assert table_extent(tmp_path / "a.npy") == (21, 3)
    assert table_extent(tmp_path / "b.npz") == (20, 4)
    numbers, columns = table_extent(tmp_path / "c.csv")
    assert columns == 3 and numbers >= 6


def test_reading_a_csv_takes_memory_in_proportion_to_its_size(tmp_path):
    # One-digit cells are the densest CSV: 2 bytes a number, 8 as a double. The parse peaks at about two
    # tables (the buffer, then the table without its label column): at most 8 x the file's bytes plus a row.
    path = tmp_path / "dense.csv"
    np.savetxt(path, np.random.default_rng(0).integers(0, 10, size=(100_000, 10)), delimiter=",", fmt="%d")
    size = path.stat().st_size
    tracemalloc.start()
    try:
        X, y = read_table(path, label_column=9)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert X.shape == (100_000, 9) and y.shape == (100_000,)
    assert peak < 9 * size
