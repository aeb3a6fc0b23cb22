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


# ---------------------------------------------------------------- row 13 of issue 43: what a site's file may not be


def _refused(path, read=lambda p: read_table(p)) -> str:
    with pytest.raises(DataFileError) as info:
        read(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_a_file_that_is_not_utf8_text_or_not_csv_is_one_line(tmp_path):
    garbage = tmp_path / "garbage.csv"
    garbage.write_bytes(bytes(range(256)) * 4)
    assert "is not UTF-8 text" in _refused(garbage) or "not a CSV table" in _refused(garbage)
    latin = tmp_path / "latin.csv"
    latin.write_bytes("taille,poids,\xe2ge\n1,2,3\n4,5,6\n".encode("latin-1"))
    assert "is not UTF-8 text (line 1 holds byte 0xe2): save it as UTF-8 CSV" in _refused(latin)
    nul = tmp_path / "nul.csv"
    nul.write_bytes(b"a,b\n1,\x002\n")
    assert "line 2, column 1: not a number" in _refused(nul)


def test_cells_too_large_to_square_and_complex_arrays_are_refused(tmp_path):
    huge = tmp_path / "huge.csv"
    huge.write_text("a,b\n1,2\n3,1e308\n")
    assert "line 3, column 1: beyond 1e+100 in magnitude" in _refused(huge)
    complex_npy = tmp_path / "complex.npy"
    np.save(complex_npy, np.ones((5, 2), dtype=complex))
    assert "holds complex numbers (complex128)" in _refused(complex_npy)


def test_a_site_of_one_repeated_point_is_refused_up_front(tmp_path):
    from fedica.data.files import check_client_table, ica_observations

    same = np.tile([[1.0, 2.0]], (30, 1))
    with pytest.raises(DataFileError, match="all its 30 points are the same point"):
        check_client_table(tmp_path / "same.csv", same, None, n_components=None)
    two = np.vstack([same, [[5.0, 5.0]]])
    with pytest.raises(DataFileError, match="has 2 distinct points among its 31, fewer than n_components=3"):
        check_client_table(tmp_path / "two.csv", two, None, n_components=3)
    assert check_client_table(tmp_path / "two.csv", two, None, n_components=2)[0] == 2
    with pytest.raises(DataFileError, match="every channel is constant"):
        ica_observations(tmp_path / "flat.csv", same)


def test_a_brainvision_header_cannot_point_outside_its_folder(tmp_path):
    from fedica.data.files import _check_brainvision_files

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.eeg").write_bytes(b"\0" * 64)
    site = tmp_path / "site"
    site.mkdir()
    header = site / "rec.vhdr"
    for data_file, reason in [("/etc/passwd", "is not a file name in the header's own folder"),
                              ("../outside/secret.eeg", "is not a file name in the header's own folder"),
                              ("missing.eeg", "no such file")]:
        header.write_text(f"Brain Vision Data Exchange Header File Version 1.0\n[Common Infos]\nDataFile={data_file}\n")
        with pytest.raises(DataFileError, match=reason):
            _check_brainvision_files(header)
    (site / "linked.eeg").symlink_to(outside / "secret.eeg")
    header.write_text("[Common Infos]\nDataFile=linked.eeg\nMarkerFile=rec.vmrk\n")
    with pytest.raises(DataFileError, match="is a symbolic link"):
        _check_brainvision_files(header)
    (site / "rec.eeg").write_bytes(b"\0" * 64)
    header.write_text("[Common Infos]\nDataFile=rec.eeg\nMarkerFile=rec.vmrk\n")
    _check_brainvision_files(header)  # a marker file may be missing; the data file is there


@pytest.mark.slow  # writing the archive deflates a GiB (5-30 s)
def test_an_npz_built_to_inflate_is_refused_before_it_is_read(tmp_path):
    # Review of issue 43: np.load inflated any member a site's archive held; a GiB of zeros fits in a MB.
    path = tmp_path / "bomb.npz"
    header = np.lib.format.header_data_from_array_1_0(np.zeros((2**27 + 2**24, 1)))
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        with archive.open("X.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_1_0(member, header)
            chunk = bytes(2**24)
            for _ in range((2**27 + 2**24) * 8 // len(chunk)):
                member.write(chunk)
    assert path.stat().st_size < 2**24
    tracemalloc.start()
    with pytest.raises(DataFileError, match=r"its arrays declare more than 1073741824 bytes, 100 times the file's size"):
        read_table(path)
    assert tracemalloc.get_traced_memory()[1] < 2**26
    tracemalloc.stop()
