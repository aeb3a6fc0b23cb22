"""The user's own data: one CSV, NPY or NPZ file per client, checked with one clear line per problem.

:func:`load_client_file` reads a FedGEM client's points (split train/test), :func:`load_ica_file` an RF-ICA
site's observations (rows = samples, columns = channels); both share the readers and their checks. RF-ICA
also reads EEG recordings (:data:`RECORDING_SUFFIXES`) through MNE, :func:`read_recording`, an optional
extra (``pip install "fedica[eeg]"``).
"""

from __future__ import annotations

import csv
import math
import zipfile
from array import array
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.model_selection import train_test_split

from fedica.data.common import ClientData
from fedica.fedgem.local import choose_n_components
from fedica.persistence import read_arrays
from fedica.rfica.mne_ica import EEG_EXTRA
from fedica.seeding import generator, sklearn_seed

# ``n_components: auto``: each client chooses its K_g (the ICL, fedica.fedgem.local.choose_n_components), from
# 1 to MAX_AUTO_COMPONENTS (fewer on a small site).
AUTO_COMPONENTS = "auto"
MAX_AUTO_COMPONENTS = 10
# The share of a labelled file held out for scoring when test_fraction is None (without labels nothing is held
# out: there is nothing to score it against).
LABELLED_TEST_FRACTION = 0.3
# The recordings RF-ICA reads through MNE (mne.io.read_raw), by suffix: FIF, EDF, BDF, EEGLAB, BrainVision.
RECORDING_SUFFIXES = (".fif", ".edf", ".bdf", ".set", ".vhdr")


class DataFileError(ValueError):
    """A client's data file is missing or malformed; the message names the file, the place and the rule.

    The message (``str(error)``, ``"<path>: <problem>"``) may travel from a site to the server, so it names the
    place, never the file's content. ``detail`` says the same for the user on the machine that holds the file:
    it may also quote the file's header names and the offending cell (the config's up-front check prints it).

    Parameters
    ----------
    path : str or os.PathLike
    problem : str
        What is wrong and where, without the path and without the file's content.
    detail : str or None
        ``problem`` with the content that explains it; None: ``problem`` says it all.
    """

    def __init__(self, path, problem: str, *, detail: str | None = None):
        super().__init__(f"{path}: {problem}")
        self.path = str(path)
        self.problem = problem
        self.detail = problem if detail is None else detail


def load_client_file(path, *, label_column: int | str | None = None, n_components: int | str | None = None,
                     test_fraction: float | None = 0.3, seed: int = 0, delimiter: str = ",") -> ClientData:
    """Load one client's data from a CSV, ``.npy`` or ``.npz`` file and split it train/test.

    Formats (chosen by suffix; anything other than ``.npy``/``.npz`` is read as CSV):

    - CSV: numbers separated by ``delimiter``; blank lines are skipped. The first non-blank line is a header
      exactly when at least one of its cells is not a number (Python ``float`` syntax, so ``nan``/``inf`` count
      as numbers and are then rejected as non-finite).
    - ``.npy``: one 2-D numeric array.
    - ``.npz``: a 2-D array ``X`` and optionally a 1-D array ``y`` of labels.

    ``label_column`` (an int index, negative allowed, or a header name) takes that column out of the features as
    labels; with ``.npz`` it indexes ``X`` and must not be combined with a ``y`` array. Labels must be integers
    (written as such or as integral floats); they are global class ids shared by all clients.

    The split is seeded by ``seed``; it is stratified by label when labels exist and every label has at least
    two points (and both parts can hold every label), otherwise a plain random split.

    Parameters
    ----------
    path : str or os.PathLike
    label_column : int, str or None
    n_components : int, "auto" or None
        K_g; None means the number of distinct labels (without labels: "auto"); "auto" lets the
        client choose by the ICL over spherical mixtures of 1 to :data:`MAX_AUTO_COMPONENTS`
        components (fewer on a small site), fitted on its training points.
    test_fraction : float or None
        In [0, 1): the share of the points held out for scoring; 0 trains on every point (nothing is
        scored). None: :data:`LABELLED_TEST_FRACTION` when the file has labels, else 0.
    seed : int
    delimiter : str
        CSV field separator.

    Returns
    -------
    ClientData

    Raises
    ------
    DataFileError
        For a missing or empty file, a non-numeric cell (line and column named), a NaN or infinite value (row or
        line, and column), a non-integer label, a wrong number of dimensions, a ragged CSV, fewer than 2
        components, or fewer points than components. The message starts with the file's path.
    """
    X, y = read_table(path, label_column=label_column, delimiter=delimiter)
    return client_data_from_table(path, X, y, n_components=n_components, test_fraction=test_fraction, seed=seed)


def client_data_from_table(path, X: np.ndarray, y: np.ndarray | None, *, n_components: int | str | None = None,
                           test_fraction: float | None = 0.3, seed: int = 0, partition_id: int = 0) -> ClientData:
    """A client's :class:`ClientData` from its file's table (:func:`read_table`): :func:`load_client_file`'s split.

    Parameters
    ----------
    path : str or os.PathLike
        The file the table was read from (named in the errors).
    X : ndarray of shape (n, d)
    y : ndarray of shape (n,) or None
    n_components, test_fraction, seed
        As for :func:`load_client_file`.
    partition_id : int, default=0
        The site's number: a site that chooses its K_g draws from the stream ``fedgem.FedGEM.fit`` gives that
        site, so that a run and the library choose the same K_g on the same points.

    Returns
    -------
    ClientData

    Raises
    ------
    DataFileError
        For the rules of :func:`check_client_table`, or too few training points for the K_g a client chose.
    """
    n_components, test_fraction = check_client_table(path, X, y, n_components=n_components,
                                                     test_fraction=test_fraction)
    train, test = _split(X.shape[0], y, test_fraction, seed)
    at_bound = False
    if n_components == AUTO_COMPONENTS:
        # The client chooses on the training points it will fit, from the stream the library's sites choose from
        # (fedica.FedGEM.fit), so that a run on files and a fit on their rows choose the same K_g.
        choice = choose_n_components(X[train], MAX_AUTO_COMPONENTS,
                                     random_state=sklearn_seed(generator(seed, "client.kmeanspp", partition_id)))
        n_components, at_bound = choice.n_components, choice.at_bound
        _check_training_points(path, train.size, n_components, test_fraction)
    y_train = None if y is None else y[train]
    y_test = None if y is None else y[test]
    return ClientData(X[train], y_train, X[test], y_test, int(n_components), at_bound)


def check_client_table(path, X: np.ndarray, y: np.ndarray | None, *, n_components: int | str | None = None,
                       test_fraction: float | None = 0.3) -> tuple[int | str, float]:
    """The rules a client's table must meet for its K_g and split, without splitting or fitting anything.

    Parameters
    ----------
    path : str or os.PathLike
    X : ndarray of shape (n, d)
    y : ndarray of shape (n,) or None
    n_components, test_fraction
        As for :func:`load_client_file`.

    Returns
    -------
    n_components : int or "auto"
        The K_g (the labels' count for None); "auto" when the client will choose it (from 4 points on).
    test_fraction : float
        The share held out (None resolved by whether ``y`` exists).

    Raises
    ------
    DataFileError
        For no labels to count K_g from, no component, fewer points than components, or too few
        training points after the split.
    """
    if test_fraction is None:
        test_fraction = 0.0 if y is None else LABELLED_TEST_FRACTION
    if not 0.0 <= float(test_fraction) < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    test_fraction = float(test_fraction)
    if X.shape[0] >= 4 and (n_components == AUTO_COMPONENTS or (n_components is None and y is None)):
        if distinct_points(X, 2) < 2:
            raise DataFileError(path, f"all its {X.shape[0]} points are the same point: a site needs points that differ")
        return AUTO_COMPONENTS, test_fraction  # without labels to count, the site chooses (as the library's sites)
    if n_components in (None, AUTO_COMPONENTS):
        if y is None:
            raise DataFileError(path, "n_components is not given and the file has no labels to count it from")
        n_components = int(np.unique(y).size)
    if n_components < 1:
        raise DataFileError(path, f"needs at least 1 component (cluster), got n_components={n_components}")
    if X.shape[0] < n_components:
        raise DataFileError(path, f"has {X.shape[0]} points, fewer than n_components={n_components}")
    distinct = distinct_points(X, n_components)
    if distinct < n_components:
        raise DataFileError(path, f"has {distinct} distinct points among its {X.shape[0]}, fewer than "
                                  f"n_components={n_components}: its clusters cannot be told apart")
    # train_test_split holds out ceil(test_fraction * n) points.
    _check_training_points(path, X.shape[0] - math.ceil(test_fraction * X.shape[0]), n_components, test_fraction)
    return int(n_components), test_fraction


def distinct_points(X: np.ndarray, enough: int) -> int:
    """How many distinct rows ``X`` has, counted up to ``enough``."""
    if len(X) == 0:
        return 0
    if enough <= 2:  # one or more than one: no sort needed
        return 1 if (X == X[0]).all() else min(enough, 2)
    return min(enough, int(np.unique(X, axis=0).shape[0]))


def _check_training_points(path, n_train: int, n_components: int, test_fraction: float) -> None:
    if n_train < n_components:
        raise DataFileError(path, f"after the test_fraction={test_fraction} split only {n_train} training points "
                                  f"remain, fewer than n_components={n_components}")


def load_ica_file(path, *, label_column: int | str | None = None, delimiter: str = ",") -> np.ndarray:
    """Load one site's observations for RF-ICA from a CSV, ``.npy`` or ``.npz`` file.

    The formats and their checks are those of :func:`load_client_file`: rows are samples (time points),
    columns are channels. A ``label_column`` (e.g. a time stamp or a class id) is taken out of the channels
    and otherwise ignored, and so is an ``.npz`` file's ``y`` array; nothing is split off for testing.

    Parameters
    ----------
    path : str or os.PathLike
    label_column : int, str or None
    delimiter : str

    Returns
    -------
    X : ndarray of shape (n_samples, n_channels), float64

    Raises
    ------
    DataFileError
        For every problem :func:`load_client_file` names, fewer than 2 channels, or no more samples than
        channels (FastICA's whitening needs ``n_samples > n_channels``). The message starts with the path.
    """
    if is_recording(path):
        check_no_label_column(path, label_column)
        return read_recording(path).data.T
    return ica_observations(path, read_table(path, label_column=label_column, delimiter=delimiter)[0])


def is_recording(path) -> bool:
    """Whether ``path`` names a recording read through MNE (its suffix is one of :data:`RECORDING_SUFFIXES`)."""
    return Path(path).suffix.lower() in RECORDING_SUFFIXES


def check_no_label_column(path, label_column: int | str | None) -> None:
    """Refuse a ``label_column`` for a recording: its channels are picked by type, it has no columns to drop."""
    if label_column is not None:
        raise DataFileError(path, f"label_column={label_column!r} applies to tables (CSV, NPY, NPZ); a recording's "
                            "channels are picked by type (EEG)")


# eq=False: fields holding an array compare element-wise, which a generated __eq__ cannot reduce to one bool.
@dataclass(frozen=True, eq=False)
class Recording:
    """A site's EEG recording as RF-ICA observes it.

    Parameters
    ----------
    data : ndarray of shape (n_channels, n_samples)
        The EEG channels in volts, float64, C-ordered.
    channel_names : tuple of str
        The channels of ``data``'s rows, in order.
    bad_channels : tuple of str
        The channels the file marks bad (``raw.info["bads"]``), whose rows are held at zero.
    """

    data: np.ndarray
    channel_names: tuple[str, ...]
    bad_channels: tuple[str, ...] = ()


def read_recording(path) -> Recording:
    """A site's EEG channels from a recording file (:data:`RECORDING_SUFFIXES`), read through MNE.

    The file is read whole (``mne.io.read_raw(path, preload=True)``) and its EEG channels are kept, those the
    file marks bad (``raw.info["bads"]``) included but held at zero: a flat channel to the site's ICA, which
    leaves it out as MNE's own ICA leaves out a bad channel, and which the server fills from the sites that
    have it (docs/ALGORITHMS.md section 1.12). Dropping it instead would give this site other channels than
    the others', and the site would be refused (issue 45). The stretches the file annotates
    bad (an annotation whose description starts with "bad", as ``BAD_ACQ_SKIP``, the padding MNE's EDF export adds
    to fill a last data record) are left out, as MNE's own ICA leaves them out (``reject_by_annotation``): an EDF
    copy of a FIF recording then gives the same samples (issue 45: the padding read as signal took RF-ICA's error
    from .239 to .632). MNE returns EEG in volts.

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    Recording
        The observations (n_channels, n_samples) and their channel names.

    Raises
    ------
    DataFileError
        For a missing, empty or unreadable file, MNE not installed (the message says how to install it), no
        EEG channel (the message lists the file's channel types), a non-finite value (channel and sample
        named), or fewer than 2 channels or no more samples than channels.
    """
    path = Path(path)
    _check_is_file(path)
    suffix = path.suffix.lower()
    try:
        # Imported here: MNE is an optional extra, and only recordings need it.
        import mne
    except ImportError:
        raise DataFileError(path, f"reading {suffix} files needs MNE: {EEG_EXTRA}") from None
    if suffix == ".vhdr":
        _check_brainvision_files(path)
    try:
        raw = mne.io.read_raw(path, preload=True, verbose="error")
    except Exception as error:  # noqa: BLE001 - each of MNE's readers raises its own kinds for a broken file
        raise DataFileError(path, f"cannot be read as {suffix} ({type(error).__name__})",
                            detail=f"cannot be read as {suffix} ({type(error).__name__}: {error})") from None
    types = raw.get_channel_types()
    if "eeg" not in types:
        kinds = ", ".join(f"{kind} ({types.count(kind)})" for kind in sorted(set(types)))
        raise DataFileError(path, f"has no EEG channel (its channel types: {kinds}); RF-ICA reads the EEG channels")
    _pick_eeg(raw)
    # MNE would print how many samples it left out on every read; the result's shapes say it.
    data = np.ascontiguousarray(raw.get_data(reject_by_annotation="omit", verbose="error"), dtype=np.float64)
    names = tuple(raw.ch_names)
    marked = tuple(name for name in names if name in raw.info["bads"])
    data[[names.index(name) for name in marked]] = 0.0
    bad = np.argwhere(~np.isfinite(data))
    if bad.size:
        channel, sample = bad[0]
        raise DataFileError(path, f"EEG channel {channel}, sample {sample}: not finite (NaN and infinity are not "
                            "allowed)", detail=f"EEG channel {channel} ({names[channel]!r}), sample {sample}: not "
                            "finite (NaN and infinity are not allowed)")
    if data.shape[0] < 2:
        raise DataFileError(path, f"has {data.shape[0]} EEG channel; ICA needs at least 2")
    if data.shape[1] <= data.shape[0]:
        raise DataFileError(path, f"has {data.shape[1]} samples for {data.shape[0]} EEG channels; ICA needs more "
                                  "samples than channels")
    return Recording(data, names, marked)


def ica_observations(path, X: np.ndarray) -> np.ndarray:
    """``X`` (a site's table without its label column) if RF-ICA can use it as observations, else DataFileError.

    Parameters
    ----------
    path : str or os.PathLike
        The file the table was read from (named in the errors).
    X : ndarray of shape (n_samples, n_channels)

    Returns
    -------
    X : ndarray
        The same array.
    """
    if X.shape[1] < 2:
        raise DataFileError(path, f"has {X.shape[1]} channel (column); ICA needs at least 2")
    if X.shape[0] <= X.shape[1]:
        raise DataFileError(path, f"has {X.shape[0]} samples (rows) for {X.shape[1]} channels; ICA needs more "
                                  "samples than channels")
    if distinct_points(X, 2) < 2:
        raise DataFileError(path, f"all its {X.shape[0]} samples are the same: every channel is constant")
    return X


def read_rows(path, *, label_column: int | str | None = None, delimiter: str = ",") -> np.ndarray:
    """Every data row of a site's file, in the file's order, without its label column (shape (n, d))."""
    return read_table(path, label_column=label_column, delimiter=delimiter)[0]


def read_table(path, *, label_column: int | str | None = None,
               delimiter: str = ",") -> tuple[np.ndarray, np.ndarray | None]:
    """A data file's points and labels, every row in the file's order, after every check of the format.

    Parameters
    ----------
    path : str or os.PathLike
    label_column : int, str or None
        As for :func:`load_client_file`.
    delimiter : str

    Returns
    -------
    X : ndarray of shape (n, d), float64
        The rows without the label column.
    y : ndarray of shape (n,), int64, or None
        The labels (the label column, or an ``.npz`` file's ``y``); None without labels.

    Raises
    ------
    DataFileError
        For every problem of the file's format :func:`load_client_file` names.
    """
    return _read_any(Path(path), label_column, delimiter)


def _read_any(path: Path, label_column, delimiter: str):
    """Points and labels of a data file, by suffix; a missing or empty file is an error."""
    _check_is_file(path)
    suffix = path.suffix.lower()
    if suffix in RECORDING_SUFFIXES:
        # A recording is a time series of channels: RF-ICA's input (read_recording), not points to cluster.
        raise DataFileError(path, f"is a recording ({suffix}); FedGEM reads tables (CSV, NPY, NPZ), recordings are "
                            "RF-ICA's (algorithm=rfica)")
    if suffix in (".npy", ".npz"):
        return _read_numpy_file(path, suffix, label_column)
    return _read_csv_file(path, label_column, delimiter)


def table_header(path, *, delimiter: str = ",") -> tuple[str, ...] | None:
    """A CSV file's header, its first non-blank line's cells when one of them is not a number (as
    :func:`load_client_file` reads it); None for a file without one, or a ``.npy``/``.npz`` file.

    Only that line is read: the config compares the sites' headers before any table is parsed.
    """
    path = Path(path)
    if path.suffix.lower() in (".npy", ".npz", *RECORDING_SUFFIXES):
        return None
    with open(path, newline="", encoding="utf-8-sig") as handle:
        for row in csv.reader(handle, delimiter=delimiter):
            cells = [cell.strip() for cell in row]
            if any(cells):
                return None if all(_is_number(cell) for cell in cells) else tuple(cells)
    return None


def site_columns(path, *, delimiter: str = ",") -> tuple[str, ...] | None:
    """The names of a site file's columns, in the order they are read; None for a file that names none.

    A CSV file's header (:func:`table_header`, its label column included), a recording's EEG channels (those
    :func:`read_recording` keeps, read from the file's header alone); NPY and NPZ files, and CSV files without
    a header, name nothing. What a deployed site reports with its replies, so that the server can hold every
    site to the same columns (:func:`fedica.protocol.column_majority`): on fedica's local engines the config
    compares the files themselves (:mod:`fedica.config`).
    """
    if not is_recording(path):
        return table_header(path, delimiter=delimiter)
    import mne  # an optional extra; a recording site has read its file through it already

    return tuple(_pick_eeg(mne.io.read_raw(Path(path), preload=False, verbose="error")).ch_names)


def _pick_eeg(raw):
    """The channels RF-ICA reads of a recording: its EEG channels, those the file marks bad included (in place)."""
    return raw.pick("eeg", exclude=())


def table_extent(path, *, delimiter: str = ",") -> tuple[int, int]:
    """At most how many numbers a table file holds, and its columns, known without parsing it.

    What the config holds a run's files to before any is read (``fedica.config``): a CSV's columns are its
    first line's cells, and it holds at most one number per two bytes (a digit and a delimiter or a line
    end); a ``.npy`` file's, or an ``.npz`` file's ``X``, shape is in its array header.

    Returns
    -------
    numbers, columns : int

    Raises
    ------
    DataFileError
        For a file :func:`read_table` would refuse on these grounds (no such file, an unreadable header).
    """
    path = Path(path)
    _check_is_file(path)
    suffix = path.suffix.lower()
    if suffix == ".npy":
        rows, columns = _array_shape(path, lambda: open(path, "rb"))
    elif suffix == ".npz":
        rows, columns = _npz_shape(path)
    else:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            first = next((row for row in csv.reader(handle, delimiter=delimiter) if any(c.strip() for c in row)), [])
        columns = max(len(first), 1)
        return math.ceil(path.stat().st_size / 2), columns
    return rows * columns, columns


# The .npy header formats whose shape is read without loading the array.
_NPY_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _array_shape(path: Path, opened) -> tuple[int, int]:
    """The (rows, columns) of a .npy array from its header alone (a 1-D array is one column)."""
    try:
        with opened() as handle:
            version = np.lib.format.read_magic(handle)
            read_header = _NPY_HEADER_READERS.get(version)
            if read_header is None:
                raise DataFileError(path, f"is a .npy array of format version {version[0]}.{version[1]}; "
                                    "save it with numpy's default format (1.0 or 2.0)")
            shape = read_header(handle)[0]
    except DataFileError:
        raise
    except (ValueError, OSError, EOFError, SyntaxError) as error:
        raise DataFileError(path, f"cannot be read: an array's header is malformed ({type(error).__name__})") from None
    rows = shape[0] if shape else 1
    return int(rows), int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1


def _npz_shape(path: Path) -> tuple[int, int]:
    """The (rows, columns) of an .npz file's ``X`` from its member's header (the archive is not extracted)."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as error:
        raise DataFileError(path, f"cannot be read as .npz ({type(error).__name__})") from None
    with archive:
        if "X.npy" not in archive.namelist():
            return 0, 1  # read_table names what is missing
        return _array_shape(path, lambda: archive.open("X.npy"))


def _check_brainvision_files(path: Path) -> None:
    """A BrainVision header names its data and marker files (``DataFile=``, ``MarkerFile=``): each must be a
    file of the header's own folder, named plainly, so that a header cannot lead a site to any file of its
    machine (``DataFile=/etc/passwd``) around :func:`_check_is_file`'s rule on links."""
    try:
        text = path.read_bytes()[:1_000_000].decode("latin-1")
    except OSError as error:
        raise DataFileError(path, f"cannot be read ({error.strerror})") from None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() not in ("DataFile", "MarkerFile"):
            continue
        name = value.strip()
        if not name or Path(name).name != name or name in (".", ".."):
            raise DataFileError(path, f"{key.strip()}={name!r} is not a file name in the header's own folder")
        if key.strip() == "DataFile" or (path.parent / name).is_symlink():
            _check_is_file(path.parent / name)


def _check_is_file(path: Path) -> None:
    """A data file a site may read: a regular, non-empty file named itself (not through a link)."""
    if path.is_symlink():
        # A site's data is a file it names itself; a link could lead a client to any file of its machine.
        raise DataFileError(path, "is a symbolic link; name the data file itself")
    if path.is_dir():
        raise DataFileError(path, "is a directory, not a data file")
    if not path.is_file():
        raise DataFileError(path, "no such file")
    if path.stat().st_size == 0:
        raise DataFileError(path, "file is empty")


def _split(n_points: int, y: np.ndarray | None, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train and test row indices: stratified by label where every label can go to both parts."""
    if test_fraction == 0:
        return np.arange(n_points), np.arange(0)
    stratify = None
    if y is not None:
        _, label_counts = np.unique(y, return_counts=True)
        n_test = math.ceil(test_fraction * n_points)
        if label_counts.min() >= 2 and min(n_test, n_points - n_test) >= label_counts.size:
            stratify = y
    return train_test_split(np.arange(n_points), test_size=test_fraction, stratify=stratify,
                            random_state=sklearn_seed(generator(seed, "files.split")))


def _cell_name(column: int, header: list[str] | None) -> str:
    # Errors travel to the server: they name the place, never a file's content (not even its header).
    return f"column {column}"


def _named_cell(column: int, header: list[str] | None) -> str:
    """The column with its header name, for DataFileError's ``detail`` (read on the file's own machine)."""
    return f"column {column}" if header is None else f"column {column} ({header[column]!r})"


def _columns(width: int, header: list[str] | None) -> str:
    """The file's columns, for DataFileError's ``detail``: their names, or their index range."""
    if header is None:
        return f"its {width} columns are 0..{width - 1} (no header)"
    return f"its {width} columns are " + ", ".join(f"{index}: {name!r}" for index, name in enumerate(header))


def _read_csv_file(path: Path, label_column, delimiter: str):
    # Each row is converted as it is read, into one growing buffer of doubles (8 bytes a cell, beside the
    # rows' line numbers): a file's table takes memory in proportion to its size, never a list of strings.
    values, lines = array("d"), array("q")
    header, width = None, None
    with open(path, newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle, delimiter=delimiter)
        for row in _csv_rows(path, reader):
            cells = [cell.strip() for cell in row]
            if not any(cells):
                continue
            if width is None:
                width = len(cells)
                if not all(_is_number(cell) for cell in cells):
                    header = cells
                    continue
            if len(cells) != width:
                raise DataFileError(path, f"line {reader.line_num} has {len(cells)} cells, expected {width} (every "
                                    "row must have as many cells as the first)")
            values.extend(_numbers(path, cells, reader.line_num, header))
            lines.append(reader.line_num)
    if width is None:
        raise DataFileError(path, "file has no data (only blank lines)")
    if not lines:
        raise DataFileError(path, "file has a header but no data rows")
    table = np.frombuffer(values, dtype=np.float64).reshape(len(lines), width)
    _check_finite(path, table, lambda row: f"line {lines[row]}", header)
    _check_row_numbers(path, table, header)

    label_index = _resolve_label_column(path, label_column, width, header)
    return _split_label_column(path, table, label_index, lambda row: f"line {lines[row]}", header)


def _check_row_numbers(path: Path, table: np.ndarray, header: list[str] | None) -> None:
    """Refuse a first column without a name that holds the row numbers: a pandas index or R's row names.

    Clustered as a feature, it splits every cluster along the file's order (issue 44: K_hat 4 for 2 groups).
    """
    if header is None or header[0] not in UNNAMED_COLUMNS or table.shape[1] < 2:
        return
    first = table[:, 0]
    if np.array_equal(first, first[0] + np.arange(first.shape[0])):
        raise DataFileError(path, f"its first column has no name and holds the row numbers {first[0]:.0f} to "
                            f"{first[-1]:.0f}: a pandas index or R's row names, not a feature; write the file without "
                            "it (pandas: to_csv(path, index=False); R: write.csv(x, row.names=FALSE))")


def label_like_column(table: np.ndarray) -> tuple[int, int] | None:
    """The first column of a few whole numbers among columns of measurements, and its distinct values: a class
    label read as a feature? None when there is none, or when every column holds whole numbers (counts, pixels)."""
    whole = np.all(table == np.round(table), axis=0)
    if whole.all():
        return None
    for column in np.flatnonzero(whole).tolist():
        distinct = int(np.unique(table[:, column]).size)
        if 2 <= distinct <= LABEL_LIKE_VALUES and 10 * distinct <= table.shape[0]:
            return column, distinct
    return None


def _csv_rows(path: Path, reader):
    """``reader``'s rows; a file that is not UTF-8 text, or not CSV at all, is one DataFileError line."""
    try:
        yield from reader
    except UnicodeDecodeError as error:
        raise DataFileError(path, f"is not UTF-8 text (line {reader.line_num + 1} holds byte {error.object[error.start]:#04x}): "
                                  "save it as UTF-8 CSV") from None
    except csv.Error as error:
        raise DataFileError(path, f"line {reader.line_num}: not a CSV table ({error})") from None


def _numbers(path: Path, cells: list[str], line: int, header: list[str] | None) -> list[float]:
    """A data row's cells as floats; the first that is not a number is a DataFileError naming its place."""
    try:
        return [float(cell) for cell in cells]
    except ValueError:
        column = next(index for index, cell in enumerate(cells) if not _is_number(cell))
        raise DataFileError(path, f"line {line}, {_cell_name(column, header)}: not a number (every cell must be "
                            "numeric)", detail=f"line {line}, {_named_cell(column, header)}: {cells[column]!r} is "
                            "not a number") from None


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _read_numpy_file(path: Path, suffix: str, label_column):
    # numpy's own message can quote the file's bytes (a malformed array header, an archive's member names):
    # the line that travels names only the kind of failure, as for every other file error.
    y = None
    if suffix == ".npz":
        # np.load trusts an archive: a member may inflate without bound (a megabyte of zeros declaring
        # gigabytes). read_arrays checks every member's declared size and .npy header before reading it.
        limit = max(MIN_ARCHIVE_BYTES, MAX_ARCHIVE_INFLATION * path.stat().st_size)
        try:
            loaded = read_arrays(path, max_bytes=limit, kinds="biufc")
        except ValueError as error:
            if f"more than the {limit}" in str(error):
                raise DataFileError(path, f"cannot be read as .npz: its arrays declare more than {limit} bytes, "
                                    f"{MAX_ARCHIVE_INFLATION} times the file's size (an archive built to inflate)") from None
            raise DataFileError(path, "cannot be read as .npz: an array's header or data is malformed "
                                f"({type(error).__name__})") from None
        if "X" not in loaded:
            problem = ".npz file has no array 'X'"
            raise DataFileError(path, problem, detail=f".npz file has no array 'X' (arrays found: {sorted(loaded)})")
        X, y = loaded["X"], loaded.get("y")
        if y is not None and label_column is not None:
            raise DataFileError(path, f"has a 'y' array and label_column={label_column!r} was given; "
                                "use one source of labels")
    else:
        try:
            X = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as error:
            raise DataFileError(path, f"cannot be read as {suffix} ({type(error).__name__})") from None
    if X.ndim != 2:
        raise DataFileError(path, f"the data array must be 2-D (points x features), got {X.ndim}-D "
                            f"shape {X.shape}")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise DataFileError(path, f"the data array is empty (shape {X.shape})")
    if not (np.issubdtype(X.dtype, np.number) or X.dtype == bool):
        raise DataFileError(path, f"the data array must be numeric, got dtype {X.dtype}")
    if np.issubdtype(X.dtype, np.complexfloating):
        raise DataFileError(path, f"the data array holds complex numbers ({X.dtype}); fedica reads real numbers")
    X = X.astype(np.float64)
    _check_finite(path, X, lambda row: f"row {row}", None)
    where = lambda row: f"row {row}"  # noqa: E731
    if y is not None:
        if y.ndim != 1 or y.shape[0] != X.shape[0]:
            raise DataFileError(path, f"'y' must be 1-D with one label per row of 'X' ({X.shape[0]}), got "
                                f"shape {y.shape}")
        if not np.issubdtype(y.dtype, np.number):
            raise DataFileError(path, f"'y' must be numeric, got dtype {y.dtype}")
        return X, _integer_labels(path, y.astype(np.float64), where, "array 'y'")
    label_index = _resolve_label_column(path, label_column, X.shape[1], None)
    return _split_label_column(path, X, label_index, where, None)


# The names a first column of row numbers has: pandas writes its index without one, R's write.csv as "", and pandas
# reads such a column back as "Unnamed: 0".
UNNAMED_COLUMNS = ("", "Unnamed: 0")
# A column of at most this many distinct whole numbers (and at most a tenth of its rows) among columns of
# measurements looks like a class label.
LABEL_LIKE_VALUES = 20

# An .npz site file's arrays may take at most this many times the file's own size, or MIN_ARCHIVE_BYTES if more:
# numpy's compressed float data shrinks at most a few fold; a hundredfold is an archive built to inflate.
MAX_ARCHIVE_INFLATION = 100
MIN_ARCHIVE_BYTES = 2**30

# The largest magnitude a cell may have: the algorithms square and sum the values of thousands of
# points, which must stay finite in double precision (1e308); a column this large needs rescaling anyway.
MAX_CELL_MAGNITUDE = 1e100


def _check_finite(path: Path, table: np.ndarray, where, header) -> None:
    bad = np.argwhere(~np.isfinite(table))
    if bad.size:
        row, column = bad[0]
        raise DataFileError(path, f"{where(row)}, {_cell_name(column, header)}: not finite "
                            "(NaN and infinity are not allowed)")
    # max and min allocate nothing: the table may be most of the memory a site has.
    if table.size and (table.max() > MAX_CELL_MAGNITUDE or table.min() < -MAX_CELL_MAGNITUDE):
        row, column = np.argwhere(np.abs(table) > MAX_CELL_MAGNITUDE)[0]
        raise DataFileError(path, f"{where(row)}, {_cell_name(column, header)}: beyond {MAX_CELL_MAGNITUDE:g} in "
                            "magnitude (its squares would overflow); rescale the column")


def _resolve_label_column(path: Path, label_column, width: int, header) -> int | None:
    if label_column is None:
        return None
    if isinstance(label_column, str):
        if header is None:
            problem = f"label_column={label_column!r} is a name but the file has no header"
            raise DataFileError(path, problem, detail=f"{problem}; {_columns(width, header)}")
        if label_column not in header:
            problem = f"label_column={label_column!r} is none of the header's {len(header)} names"
            raise DataFileError(path, problem, detail=f"{problem}; {_columns(width, header)}")
        return header.index(label_column)
    if not -width <= int(label_column) < width:
        problem = f"label_column={label_column} is out of range for {width} columns"
        raise DataFileError(path, problem, detail=f"{problem}; {_columns(width, header)}")
    return int(label_column) % width


def _split_label_column(path: Path, table: np.ndarray, label_index: int | None, where, header):
    if label_index is None:
        return table, None
    if table.shape[1] < 2:
        raise DataFileError(path, "only the label column, no feature columns")
    labels = _integer_labels(path, table[:, label_index], where, _cell_name(label_index, header))
    return np.delete(table, label_index, axis=1), labels


def _integer_labels(path: Path, values: np.ndarray, where, column_name: str) -> np.ndarray:
    bad = np.flatnonzero(~np.isfinite(values) | (values != np.round(values)))
    if bad.size:
        raise DataFileError(path, f"{where(bad[0])}, {column_name}: not an integer "
                            "(labels must be integer class ids)")
    # Labels are read as doubles: beyond 2**53 two different ids could read as one.
    huge = np.flatnonzero(np.abs(values) > 2.0**53)
    if huge.size:
        raise DataFileError(path, f"{where(huge[0])}, {column_name}: a label beyond 2**53 "
                            "(class ids this large cannot be told apart; renumber them)")
    return values.astype(np.int64)
