"""The ``scenario`` section: each scenario's keys and rules come from its registry entry.

:data:`fedica.data.scenarios.SCENARIOS` holds, per scenario, its keys, its rules (by algorithm), and how much
memory its generated data takes; this module applies them, refuses a federation no engine here can hold, and,
for ``files``, checks the data files on the engines that read them on this machine.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from fedica.checker import Checker, ConfigError, Errors, is_list
from fedica.data.files import (
    RECORDING_SUFFIXES,
    DataFileError,
    check_client_table,
    check_no_label_column,
    ica_observations,
    is_recording,
    table_extent,
    table_header,
)
from fedica.data.scenarios import ICA_SCENARIOS, SCENARIO_NAMES, SCENARIOS, client_count, file_recording, file_table
from fedica.validation import name_difference

__all__ = ["SCENARIO_KEYS", "SCENARIOS_BY_ALGORITHM", "MAX_CLIENTS", "MEMORY_SHARE", "check_scenario",
           "check_affordable", "check_files_engine", "client_count"]

SCENARIOS_BY_ALGORITHM = {"rfica": ICA_SCENARIOS, "fedgem": SCENARIO_NAMES}
# The keys of conf/scenario/<name>.yaml besides ``name``.
SCENARIO_KEYS: dict[str, tuple[str, ...]] = {name: scenario.keys for name, scenario in SCENARIOS.items()}

# The largest federations fedica's engines hold (every client has a context and its data in one
# process of the in-process engine).
MAX_CLIENTS = 100_000
# A generated scenario may take at most this share of the machine's memory.
MEMORY_SHARE = 0.5
# A run on files holds about this many copies of their tables at its peak (measured in-process, FedGEM: two
# CSVs of 81 MB, 64 MB of numbers, peaked 240 MB above the interpreter's own: the parse buffer, the split,
# the sites' points). A table's numbers are bounded before any file is parsed (fedica.data.files.table_extent).
FILE_TABLE_COPIES = 4
# RF-ICA's server holds about this many r x r matrices per site (its covariance, its mixing estimate, their
# normalised and aligned copies): a file of r columns costs the server this many r^2 numbers per site.
ICA_MATRICES_PER_SITE = 4


def check_scenario(sc: Checker, algorithm: str) -> None:
    """The rules of the section's scenario as ``algorithm`` reads it (the scenario serves that algorithm)."""
    SCENARIOS[sc.get("name")].checks[algorithm](sc)


def check_affordable(sc: Checker, n_clients: int) -> None:
    """Refuse a scenario no engine here can hold before anything starts (instead of a MemoryError or a hang)."""
    if n_clients > MAX_CLIENTS:
        sc.fail("n_clients", f"{n_clients} clients are more than fedica's engines hold (at most {MAX_CLIENTS})")
    scenario = SCENARIOS[sc.get("name")]
    if scenario.data_values is None:
        return
    needed, available = 8 * scenario.data_values(sc.section, n_clients), MEMORY_SHARE * _physical_memory()
    if needed > available:
        sc.fail(scenario.memory_key, f"the scenario's data would take {needed / 2**30:.1f} GiB, more than half of "
                                     f"this machine's memory ({available / 2**30:.1f} GiB)")


def _physical_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not POSIX: no limit known, none imposed
        return math.inf


def check_files_engine(sc: Mapping[str, Any], algorithm: str, engine: str, ray_address: str | None,
                       broken: Collection[str] = ()) -> None:
    """Every site's data file, read and checked before anything starts, on the engines that read them here.

    On the local engines (inprocess, simulation) every file is parsed (through the scenarios' cache, so the run
    does not parse it again) and held to the rules its site would apply: the format, the ``label_column``
    against the file's header or width, and FedGEM's K_g and split (or RF-ICA's channels, the same at every
    site: by count for tables, by EEG channel name and order for recordings read through MNE). A file that
    breaks one is a line naming the file and the place (the line, the column, the cell), and every file is
    checked, so that no site that cannot take part is left out of the run unnoticed. In a deployment the files
    are on the sites' machines: only the keys are checked.

    Parameters
    ----------
    sc : mapping
        The ``scenario`` section.
    algorithm, engine : str
    ray_address : str or None
        ``engine.ray_address`` (simulation).
    broken : collection of str
        The section's keys already reported broken: the rules that need them are skipped.

    Raises
    ------
    ConfigError
        One line per broken rule.
    """
    errors = Errors()
    if ray_address is not None:  # a cluster's workers are not this user's local clients (clients/app.py)
        raise ConfigError(f"engine.ray_address={ray_address!r}: scenario=files runs on this machine's own Ray only; "
                          "on several machines use engine=deployment, each SuperNode with its own data-path")
    if "write_sources" not in broken and sc["write_sources"] and engine == "deployment":
        errors.add("scenario.write_sources=true: sources are written only by engines that run every site on this "
                   "machine (inprocess, simulation); in a deployment each site holds its own data")
    if "standardize" not in broken and sc.get("standardize") == "pool" and engine == "deployment":
        errors.add("scenario.standardize=pool: the pooled scale needs every site's file on this machine (inprocess, "
                   "simulation); in a deployment give algorithm.standardize=federated (scales the sites agree on), "
                   "scenario.standardize=site, or files standardised by one shared scale")
    if engine != "deployment" and "paths" not in broken and _files_fit(sc, algorithm, errors):
        tables = _read_local_files(sc, errors, read="label_column" not in broken, recordings=algorithm == "rfica")
        if algorithm == "rfica":
            _check_ica_channels(sc, tables, errors)
        elif not {"n_components", "test_fraction"} & set(broken):
            _check_table_widths(sc, tables, errors)
            _check_client_tables(sc, tables, errors)
        _check_table_headers(sc, tables, errors)
    errors.raise_any()


def _files_fit(sc: Mapping[str, Any], algorithm: str, errors: Errors) -> bool:
    """Whether the files' tables, bounded before any is parsed, fit half this machine's memory; else one line in ``errors``.

    A CSV holds at most a number per two bytes; a ``.npy`` or ``.npz`` file says its shape in its header.
    Under RF-ICA a file's columns are channels, and the server's r x r matrices per site must fit too.
    """
    extents = {}
    for index, path in enumerate(sc["paths"]):
        if not is_recording(path):
            try:
                extents[index] = table_extent(path)
            except DataFileError:
                continue  # the reading names the problem
    if not extents:
        return True
    available = MEMORY_SHARE * _physical_memory()
    needed = 8 * FILE_TABLE_COPIES * sum(numbers for numbers, _ in extents.values())
    if needed > available:
        errors.add(f"scenario.paths: the {len(extents)} files' tables may hold {needed / FILE_TABLE_COPIES / 2**30:.1f} "
                   f"GiB of numbers, and a run about {FILE_TABLE_COPIES} copies of them ({needed / 2**30:.1f} GiB): "
                   f"more than half of this machine's memory ({available / 2**30:.1f} GiB)")
        return False
    widest = max(extents, key=lambda index: extents[index][1])
    channels = extents[widest][1]
    needed = 8 * ICA_MATRICES_PER_SITE * len(sc["paths"]) * channels**2
    if algorithm == "rfica" and needed > available:
        errors.add(f"scenario.paths[{widest}]={sc['paths'][widest]}: its {channels} columns are RF-ICA's channels, "
                   f"and the server holds {ICA_MATRICES_PER_SITE} {channels} x {channels} matrices per site "
                   f"({needed / 2**30:.1f} GiB for {len(sc['paths'])} sites): more than half of this machine's "
                   f"memory ({available / 2**30:.1f} GiB)")
        return False
    return True


def _paths_line(index: int, path: str, error: DataFileError) -> str:
    """A file's problem as the config reports it: the key, the file, and the place with the cell's content."""
    return f"scenario.paths[{index}]={path}: {error.detail}"


def _read_local_files(sc: Mapping[str, Any], errors: Errors, *, read: bool, recordings: bool) -> dict[int, Any]:
    """Every site's table, by site, for the files that read; each other one is a line in ``errors``.

    ``recordings`` (RF-ICA): a recording file (:func:`fedica.data.files.is_recording`) is read through MNE and
    stands as its :class:`~fedica.data.files.Recording`; without it (FedGEM) a recording is refused, one line.
    ``read=False`` (a broken ``label_column``) only checks that the files are there.
    """
    tables = {}
    for index, path in enumerate(sc["paths"]):
        location = Path(path)
        if location.is_dir():
            errors.add(f"scenario.paths[{index}]={path}: is a directory, not a data file")
        elif not location.is_file():
            errors.add(f"scenario.paths[{index}]={path}: no such file")
        elif read:
            try:
                if recordings and is_recording(path):
                    check_no_label_column(path, sc["label_column"])
                    tables[index] = file_recording(path)
                else:
                    tables[index] = file_table(path, sc["label_column"])
            except DataFileError as err:
                errors.add(_paths_line(index, path, err))
    return tables


def _check_table_widths(sc: Mapping[str, Any], tables: Mapping[int, tuple], errors: Errors) -> None:
    """Every FedGEM site's file has as many feature columns as most of them (the first file's on a tie).

    The files are on this machine, so a file missing a column is refused before the run rather than its site
    left out mid-run (issue 44: dropped at initialisation, exit 0).
    """
    widths = {index: table[0].shape[1] for index, table in tables.items()}
    if len(set(widths.values())) < 2:
        return
    counts = Counter(widths.values())
    common = max(counts, key=lambda width: (counts[width], -min(i for i, w in widths.items() if w == width)))
    for index, width in widths.items():
        if width != common:
            errors.add(f"scenario.paths[{index}]={sc['paths'][index]}: {width} feature columns, where "
                       f"{counts[common]} of the {len(widths)} files have {common} (a column missing or added?); "
                       "every site's file must have the same columns in the same order")


def _check_table_headers(sc: Mapping[str, Any], tables: Mapping[int, Any], errors: Errors) -> None:
    """Every CSV site file with a header names the first such file's columns, in its order.

    A file's columns are read by position: the same columns in another order (files exported from two
    systems) would put one site's feature, or channel, where another site has a different one, and every
    result would be wrong without a word. Files without a header (and ``.npy``/``.npz`` files) name nothing
    to compare and are read as they are. A header of another length is left to the width checks (RF-ICA's
    channel count; FedGEM's :func:`_check_table_widths`).
    """
    reference = None
    for index, site in tables.items():
        path = sc["paths"][index]
        if not isinstance(site, tuple):  # a recording: its EEG channels are compared by name elsewhere
            continue
        try:
            header = table_header(path)
        except (OSError, UnicodeDecodeError):  # the table read; its header line alone cannot be worse
            continue
        if header is None:
            continue
        if reference is None:
            reference = index, header
        elif len(header) == len(reference[1]) and header != reference[1]:
            errors.add(f"scenario.paths[{index}]={path}: its header differs from scenario.paths[{reference[0]}]'s "
                       f"({name_difference(header, reference[1])}); every site's file must have the same "
                       "columns in the same order (they are read by position)")


def _check_client_tables(sc: Mapping[str, Any], tables: Mapping[int, tuple], errors: Errors) -> None:
    """Every FedGEM client's table holds its K_g, before and after its train/test split."""
    n_components = sc["n_components"]
    for index, (X, y) in tables.items():
        path = sc["paths"][index]
        k = n_components[index] if is_list(n_components) else n_components
        try:
            check_client_table(path, X, y, n_components=k, test_fraction=sc["test_fraction"])
        except DataFileError as err:
            errors.add(_paths_line(index, path, err))


def _check_ica_channels(sc: Mapping[str, Any], tables: Mapping[int, Any], errors: Errors) -> None:
    """Every RF-ICA site's data reads as observations, and all observe the first one's channels.

    Tables are held to the first one's number of channels. Recordings may differ in their montages, in
    any order (a column of the mixing is a weight per named channel): the federation's channels are all
    of theirs, and a site must record more than half of them, since a site's channels it does not
    record are filled from the others' (docs/ALGORITHMS.md section 1.12). Tables and recordings are not
    mixed, as a table's columns name no channels to match.
    """
    recorded = {index: site.channel_names for index, site in tables.items() if not isinstance(site, tuple)}
    union = tuple(dict.fromkeys(name for names in recorded.values() for name in names))
    for index, names in recorded.items():
        missing = [name for name in union if name not in names]
        if 2 * len(missing) >= len(union):
            errors.add(f"scenario.paths[{index}]={sc['paths'][index]}: records {len(names)} of the federation's "
                       f"{len(union)} EEG channels (missing here: {', '.join(missing)}); a site must record more "
                       "than half of them, as the others fill the rest")
    first = None
    for index, site in tables.items():
        path = sc["paths"][index]
        if isinstance(site, tuple):
            try:
                n_channels, names = ica_observations(path, site[0]).shape[1], None
            except DataFileError as err:
                errors.add(_paths_line(index, path, err))
                continue
        else:
            n_channels, names = len(site.channel_names), site.channel_names
        if first is None:
            first = index, n_channels, names
            continue
        reference, width, reference_names = first
        if (names is None) != (reference_names is None):
            kinds = ("a table", "a recording") if names is None else ("a recording", "a table")
            errors.add(f"scenario.paths[{index}]={path}: is {kinds[0]} but scenario.paths[{reference}] is {kinds[1]}; "
                       "every site's file must be of one kind (tables: CSV, NPY, NPZ; recordings: "
                       f"{', '.join(RECORDING_SUFFIXES)})")
        elif names is None and n_channels != width:
            errors.add(f"scenario.paths[{index}]={path}: has {n_channels} channels (columns) but "
                       f"scenario.paths[{reference}] has {width}; every site must observe the same channels")
