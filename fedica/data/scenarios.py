"""The scenario registry: each ``scenario.name`` with its config keys, rules, truth, loaders and memory estimate.

:data:`SCENARIOS` holds one :class:`Scenario` per name; everything else here reads it: the config validator
(:mod:`fedica.config`) takes a scenario's keys, rules and memory estimate from it, and ``conf/scenario/*.yaml``
hold exactly its keys (``tests/test_config.py``). FedGEM's scenarios (:data:`SCENARIO_NAMES`) go through
:func:`scenario_client_data`, RF-ICA's (:data:`ICA_SCENARIOS`) through :func:`ica_scenario_data`, with the truth
of each in :func:`true_n_clusters` and :func:`ica_scenario_truth`; ``files`` serves both algorithms.

Every client builds only its own share, deterministically from ``(seed, partition_id)``. The global structure of
a scenario (cluster centres, which clusters each client holds, client shares, the generated or loaded data set
and its train/test split, the true mixing and which sites are poor) depends on ``seed`` only, so a client
generated alone gets exactly the data it would get if all clients were generated together.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral
from typing import TYPE_CHECKING, Any

import cachetools
import numpy as np

from fedica.data.blobs import SETTINGS, blobs_client_data
from fedica.data.classes import digits_client_data, waveform_client_data
from fedica.data.common import ClientData, column_scale, mark_readonly
from fedica.data.files import (
    AUTO_COMPONENTS,
    Recording,
    check_no_label_column,
    client_data_from_table,
    ica_observations,
    is_recording,
    read_recording,
    read_table,
)
from fedica.data.ica_paper import (
    ica_client_data,
    ica_corrupted_clients,
    ica_true_mixing,
)
from fedica.data.mnist import mnist_client_data
from fedica.data.real import (
    DATASETS,
    K_G_MODES,
    SPLITS,
    STANDARDIZE,
    real_client_data,
    real_dataset,
    with_chosen_components,
)
from fedica.data.recordings import (
    LINE_FREQUENCIES,
    SOURCE_KINDS,
    recordings_client_data,
    recordings_roles,
    recordings_true_mixing,
)
from fedica.data.signals import signals_client_data, signals_roles, signals_true_mixing
from fedica.data.speech import SPEECH_VOICES, speech_available
from fedica.fedgem.standardisation import STANDARDISATION_KEY, decode_standardisation, in_request_units, standardised
from fedica.validation import check_partition, check_seed

if TYPE_CHECKING:  # the checker of one config section (fedica.checker, below fedica.config, which imports this module)
    from fedica.checker import Checker

ICA_SCENARIO = "ica_paper"  # RF-ICA's default scenario (fedica.data.ica_paper)
# The most blobs clusters the generator places (the config refuses more before anything starts).
MAX_CLUSTERS = 10_000


def _freeze(value):
    """Hashable copy of a config value (lists, e.g. OmegaConf ListConfig, become tuples)."""
    if isinstance(value, Mapping):
        return tuple(sorted((str(key), _freeze(item)) for key, item in value.items()))
    if isinstance(value, Sequence) and not isinstance(value, str):
        return tuple(_freeze(item) for item in value)
    return value


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


# ---------------------------------------------------------------- each scenario's rules (its config section)
#
# Each takes fedica.config's checker of the ``scenario`` section and raises ConfigError through it (its
# ``fail``), so that every message names the dotted key.


def _check_ica_paper(sc: Checker) -> None:
    n_clients = sc.integer("n_clients", minimum=1)
    r = sc.integer("r", minimum=2)
    ratio = sc.number("corrupt_ratio", low=0, high=1, high_open=True)
    sc.integer("n_normal", minimum=r + 1)
    if round(ratio * n_clients) > 0:
        sc.integer("n_corrupt", minimum=r + 1)
    sc.number("sparsity", low=0, high=1, low_open=True)
    sc.boolean("orthogonal")


def _check_signals(sc: Checker) -> None:
    n_clients = sc.integer("n_clients", minimum=1)
    r = sc.integer("r", minimum=2)
    sc.integer("n_samples", minimum=r + 1)
    n_noisy = sc.integer("n_noisy", minimum=0)
    n_short = sc.integer("n_short", minimum=0)
    if n_noisy + n_short > n_clients:
        sc.fail("n_short", f"n_noisy + n_short must be <= n_clients ({n_clients}): a site is noisy or short, not both")
    sc.number("noise_level", low=0)
    if n_short > 0:
        sc.integer("short_samples", minimum=r + 1)
    sc.boolean("orthogonal")


def _check_recordings(sc: Checker) -> None:
    n_clients = sc.integer("n_clients", minimum=1)
    n_channels = sc.integer("n_channels", minimum=2)
    n_sources = sc.integer("n_sources", minimum=2, maximum=n_channels)
    line_frequency = sc.integer("line_frequency")
    if line_frequency not in LINE_FREQUENCIES:
        sc.fail("line_frequency", f"must be one of {', '.join(map(str, LINE_FREQUENCIES))} (Hz)")
    sc.number("sampling_rate", low=2 * line_frequency, low_open=True)
    min_samples = sc.integer("min_samples", minimum=n_channels + 1)
    sc.integer("max_samples", minimum=min_samples)
    sc.number("condition_number", low=1)
    sc.number("sensor_noise", low=0)
    sc.number("strength_spread", low=1)
    if sc.choice("source_kind", SOURCE_KINDS) == "speech":
        if n_sources > len(SPEECH_VOICES):
            sc.fail("n_sources", f"speech has {len(SPEECH_VOICES)} voices, one per source: at most "
                                 f"{len(SPEECH_VOICES)} sources")
        if not speech_available():
            sc.fail("source_kind", 'speech needs the speech extra: pip install "fedica[speech]"')
    n_noisy = sc.integer("n_noisy", minimum=0)
    sc.number("noise_level", low=0)
    n_faulty = int(sc.boolean("dead_channel")) + int(sc.boolean("saturated_channel"))
    if n_noisy + n_faulty > n_clients:
        sc.fail("n_noisy", f"n_noisy + dead_channel + saturated_channel must be <= n_clients ({n_clients}): "
                           "a site is poor in one way only")


def _check_k_range(sc: Checker, n_classes: int) -> tuple[int, int]:
    k_min = sc.integer("k_min", minimum=2)
    if sc.get("k_max") is None:
        k_max = n_classes - 1
        if k_min > k_max:
            sc.fail("k_min", f"must be < the number of clusters ({n_classes}): a client holds 2 <= K_g < K")
    else:
        k_max = sc.integer("k_max", minimum=k_min, maximum=n_classes)
    return k_min, k_max


def _check_blobs(sc: Checker) -> None:
    n_clients = sc.integer("n_clients", minimum=1)
    n_clusters = sc.integer("n_clusters", minimum=3, maximum=MAX_CLUSTERS)
    sc.integer("dim", minimum=1)
    sc.number("r_min", low=0, low_open=True)
    sc.choice("setting", SETTINGS)
    k_min, k_max = _check_k_range(sc, n_clusters)
    # Every client holds at least k_min clusters with at least one point each,
    # and the smallest client share can be a few percent of the total.
    n_train = sc.integer("n_train", minimum=1)
    sc.integer("n_test", minimum=1)
    if n_train < 25 * n_clients * k_min:
        sc.fail("n_train", f"must be >= 25 * n_clients * k_min = {25 * n_clients * k_min} so that every client has more points than clusters")
    if n_clients * k_max < n_clusters:
        sc.fail("n_clients", f"too few clients to hold all {n_clusters} clusters with K_g <= k_max")
    if n_train < n_clusters:
        sc.fail("n_train", f"must be >= n_clusters ({n_clusters}): every cluster needs training points")


def _check_classes(n_classes: int) -> Callable[[Checker], None]:
    """The rules of a labelled data set of ``n_classes`` classes dealt over clients by class."""
    def check(sc: Checker) -> None:
        sc.integer("n_clients", minimum=1)
        sc.number("test_fraction", low=0, high=1, low_open=True, high_open=True)
        _check_k_range(sc, n_classes)
        if "n_samples" in sc.section:  # waveform's (the missing-key check made sure it is there)
            sc.integer("n_samples", minimum=100)

    return check


def _check_paths(sc: Checker) -> None:
    paths = sc.get("paths")
    if not _is_list(paths) or len(paths) == 0:
        sc.fail("paths", "must be a non-empty list of data files, one per client (scenario.paths=[a.csv,b.csv])")
    if not all(isinstance(p, str) and p for p in paths):
        sc.fail("paths", "every entry must be a file path")


def _check_label_column(sc: Checker) -> None:
    label = sc.get("label_column")
    if label is not None and (isinstance(label, bool) or not isinstance(label, (str, Integral))):
        sc.fail("label_column", "must be a column index, a header name or null")


def _check_file_list(sc: Checker) -> None:
    """The keys of files that both algorithms read (RF-ICA reads no others: n_components and test_fraction are
    FedGEM's); each rule on its own (the files themselves are read by fedica.config, on the local engines)."""
    sc.each(lambda: _check_paths(sc), lambda: _check_label_column(sc), lambda: sc.boolean("write_sources"))


def _check_n_components(sc: Checker) -> None:
    n_components = sc.get("n_components")
    if n_components is None:  # the labels' count, or without labels each site's own choice (as the library's)
        return
    values = n_components if _is_list(n_components) else [n_components]
    paths = sc.get("paths")
    if _is_list(n_components) and _is_list(paths) and len(values) != len(paths):
        sc.fail("n_components", f"must have one entry per path ({len(paths)})")
    # A site of one cluster takes part (docs/ALGORITHMS.md section 2.11: its final radius borrows the federation's scale).
    if not all(v == AUTO_COMPONENTS or (isinstance(v, Integral) and not isinstance(v, bool) and v >= 1) for v in values):
        sc.fail("n_components", f"every K_g must be an integer >= 1 or {AUTO_COMPONENTS}")


def _check_write_sources_off(sc: Checker) -> None:
    if sc.get("write_sources") is True:
        sc.fail("write_sources", "only RF-ICA recovers sources; FedGEM needs write_sources=false")


def _check_files(sc: Checker) -> None:
    # null: held out only when there are labels to score it against (load_client_file's test_fraction).
    sc.each(lambda: _check_file_list(sc), lambda: _check_write_sources_off(sc),
            lambda: sc.get("test_fraction") is None or sc.number("test_fraction", low=0, high=1, high_open=True),
            lambda: _check_n_components(sc), lambda: sc.get("standardize") is None or sc.choice("standardize", FILE_STANDARDIZE))


def _check_sklearn_real(sc: Checker) -> None:
    dataset = sc.choice("dataset", tuple(DATASETS))
    split = sc.choice("split", SPLITS)
    sc.choice("standardize", STANDARDIZE)
    sc.choice("n_components", K_G_MODES)
    n_clients = sc.integer("n_clients", minimum=2)
    sc.number("test_fraction", low=0, high=1, low_open=True, high_open=True)
    n_classes, most = int(real_dataset(dataset)[1].max()) + 1, DATASETS[dataset][1][1]
    if split == "classes" and n_clients * most < n_classes:
        sc.fail("n_clients", f"split=classes: {n_clients} sites of at most {most} classes cannot hold the "
                             f"{n_classes} classes of {dataset}")


# ---------------------------------------------------------------- each scenario's loaders and truth
#
# A loader takes the scenario's items as a dict, the partition id and the seed; the callers cache it.


def _load_blobs(params: dict, partition_id: int, seed: int) -> ClientData:
    missing = [key for key in SCENARIOS["blobs"].keys[:6] if key not in params]
    if missing:
        raise ValueError(f"scenario 'blobs' needs keys {missing}")
    return blobs_client_data(partition_id, seed=seed, **params)


def _load_labelled(make: Callable[..., ClientData]) -> Callable[[dict, int, int], ClientData]:
    return lambda params, partition_id, seed: make(partition_id, seed=seed, **params)


def _load_client_file(params: dict, partition_id: int, seed: int, standardisation: str | None = None) -> ClientData:
    X, y = file_site_points(params, partition_id)
    n_components = params.get("n_components")
    if isinstance(n_components, tuple):
        if len(n_components) != len(params["paths"]):
            raise ValueError(f"scenario 'files': n_components has {len(n_components)} entries for "
                             f"{len(params['paths'])} paths; give one per client, one int, or null")
        n_components = n_components[partition_id]
    if standardisation is not None:  # the federation's (standardize: federated), after the scenario's own
        X = standardised(X, *decode_standardisation(standardisation, X.shape[1]))
    return client_data_from_table(params["paths"][partition_id], X, y, n_components=n_components,
                                  test_fraction=params.get("test_fraction"), seed=seed, partition_id=partition_id)


def file_site_points(params: Mapping[str, Any], partition_id: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Every row of site ``partition_id``'s file in file order, and its labels: as ``scenario=files`` gives them to
    the site before its split (in the scenario's ``standardize`` units, if it names one)."""
    paths = params.get("paths") or ()
    if not paths:
        raise ValueError("scenario 'files' needs a non-empty 'paths' list (one file per client)")
    check_partition(partition_id, len(paths))
    X, y = file_table(paths[partition_id], params.get("label_column"))
    standardize = params.get("standardize")
    if standardize is not None:  # before the split and the site's K_g choice, which see the standardised points
        mean, std = column_scale(X) if standardize == "site" else pooled_file_scale(paths, params.get("label_column"))
        X = (X - mean) / std
    return X, y


def pooled_file_scale(paths: Sequence[str], label_column: int | str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every feature's mean and standard deviation over every row of every file (``standardize: pool``).

    Held out rows included: no label is used, and the held-out share of each file is drawn after. Files of
    different widths are refused with one line. Computed once per process for the files as they are (every
    site's loader asks for it: G sites would otherwise stack every file G times).
    """
    paths = tuple(str(path) for path in paths)
    return _cached_pooled_scale(paths, label_column, tuple(_file_stamp(path) for path in paths))


@functools.lru_cache(maxsize=8)
def _cached_pooled_scale(paths: tuple[str, ...], label_column, _stamps) -> tuple[np.ndarray, np.ndarray]:
    tables = [file_table(path, label_column)[0] for path in paths]
    widths = sorted({X.shape[1] for X in tables})
    if len(widths) > 1:
        raise ValueError(f"scenario 'files': standardize=pool needs every file to have the same columns; they "
                         f"have {', '.join(map(str, widths))}")
    mean, std = column_scale(np.vstack(tables))
    mark_readonly(mean, std)  # the cache's own: the loaders only read them
    return mean, std


def _load_ica_file(params: dict, partition_id: int, seed: int) -> np.ndarray:
    # ica_scenario_data has already picked this site's file (``path``) from ``paths``, and the federation's channels.
    path = params["path"]
    if is_recording(path):
        check_no_label_column(path, params["label_column"])
        return in_montage(file_recording(path), params["channels"])
    return ica_observations(path, file_table(path, params["label_column"])[0]).T


def _ica_paper_poor_sites(params: dict, seed: int) -> dict[str, list[int]]:
    mask = ica_corrupted_clients(n_clients=params["n_clients"], corrupt_ratio=params["corrupt_ratio"], seed=seed)
    return {"corrupted": np.flatnonzero(mask).tolist()}


def _signals_poor_sites(params: dict, seed: int) -> dict[str, list[int]]:
    noisy, short = signals_roles(n_clients=params["n_clients"], n_noisy=params["n_noisy"],
                                 n_short=params["n_short"], seed=seed)
    return {"noisy": np.flatnonzero(noisy).tolist(), "short": np.flatnonzero(short).tolist()}


def _recordings_poor_sites(params: dict, seed: int) -> dict[str, list[int]]:
    roles = recordings_roles(n_clients=params["n_clients"], n_noisy=params["n_noisy"],
                             dead_channel=params["dead_channel"], saturated_channel=params["saturated_channel"],
                             seed=seed)
    return {kind: np.flatnonzero(mask).tolist() for kind, mask in roles.items()}


def _recordings_mixing(params: dict, seed: int) -> np.ndarray:
    return recordings_true_mixing(n_channels=params["n_channels"], n_sources=params["n_sources"],
                                  condition_number=params["condition_number"], seed=seed)


def _none(*args: Any) -> None:
    return None


def _mixing(truth: Callable[..., np.ndarray]) -> Callable[[dict, int], np.ndarray]:
    return lambda params, seed: truth(r=params["r"], orthogonal=params["orthogonal"], seed=seed)


# ---------------------------------------------------------------- the registry


@dataclass(frozen=True)
class Scenario:
    """One scenario of the ``scenario`` config section.

    Parameters
    ----------
    name : str
    keys : tuple of str
        The keys of ``conf/scenario/<name>.yaml`` besides ``name``, in its order.
    checks : mapping of str to callable
        By algorithm served (``"fedgem"``, ``"rfica"``): the rules of the section, ``check(checker)``.
    client_data : callable or None
        FedGEM's loader, ``client_data(params, partition_id, seed) -> ClientData``.
    site_data : callable or None
        RF-ICA's loader, ``site_data(params, partition_id, seed) -> ndarray of shape (r, n_k)``.
    true_n_clusters : callable
        ``true_n_clusters(params) -> int or None``: FedGEM's true K (None: unknown).
    true_mixing, poor_sites : callable
        ``(params, seed) ->``: RF-ICA's true A* and its poor sites by kind (None: unknown).
    data_values : callable or None
        ``data_values(section, n_clients) -> int``: how many float64 values a run holds of its data at its peak (the
        config refuses a scenario over half the machine's memory); None: data read or shipped, not made.
    memory_key : str or None
        The key a too-large scenario is reported under.
    defaults : mapping
        Keys a section written before them may leave out, and the value that draws its data as it was drawn.
    """

    name: str
    keys: tuple[str, ...]
    checks: Mapping[str, Callable[[Checker], None]]
    client_data: Callable[[dict, int, int], ClientData] | None = None
    site_data: Callable[[dict, int, int], np.ndarray] | None = None
    true_n_clusters: Callable[[dict], int | None] = _none
    true_mixing: Callable[[dict, int], np.ndarray | None] = _none
    poor_sites: Callable[[dict, int], dict[str, list[int]] | None] = _none
    data_values: Callable[[Mapping, int], int] | None = None
    memory_key: str | None = None
    defaults: Mapping[str, Any] = field(default_factory=dict)
    algorithms: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "algorithms", tuple(self.checks))


def _labelled(name: str, keys: tuple[str, ...], make: Callable[..., ClientData], n_classes: int) -> Scenario:
    """A labelled data set dealt over clients by class: its class count is the true K and bounds K_g."""
    return Scenario(name, keys, {"fedgem": _check_classes(n_classes)}, client_data=_load_labelled(make),
                    true_n_clusters=lambda params: n_classes)


# How many copies of its points a blobs run holds at its peak (see its entry's data_values).
BLOBS_COPIES = 3
_CLASS_KEYS = ("n_clients", "test_fraction", "k_min", "k_max")
_FILE_KEYS = ("paths", "label_column", "n_components", "test_fraction", "write_sources", "standardize")
# scenario=files' standardize (FedGEM only; null: the files' own units): every column by the mean and standard
# deviation of every row of every file (pool; the local engines only, which read every file on this machine),
# or each file by its own (site).
FILE_STANDARDIZE = ("pool", "site")

# In the order of the scenario names in the config's messages (RF-ICA's first, then FedGEM's).
SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario(ICA_SCENARIO, ("n_clients", "r", "corrupt_ratio", "n_normal", "n_corrupt", "sparsity", "orthogonal"),
             {"rfica": _check_ica_paper},
             site_data=_load_labelled(ica_client_data), true_mixing=_mixing(ica_true_mixing),
             poor_sites=_ica_paper_poor_sites,
             data_values=lambda sc, n_clients: n_clients * sc["n_normal"] * sc["r"], memory_key="n_normal"),
    Scenario("signals", ("n_clients", "r", "n_samples", "n_noisy", "noise_level", "n_short", "short_samples",
                         "orthogonal"),
             {"rfica": _check_signals},
             site_data=_load_labelled(signals_client_data), true_mixing=_mixing(signals_true_mixing),
             poor_sites=_signals_poor_sites,
             data_values=lambda sc, n_clients: n_clients * sc["n_samples"] * sc["r"], memory_key="n_samples"),
    Scenario("recordings", ("n_clients", "n_channels", "n_sources", "sampling_rate", "min_samples", "max_samples",
                            "condition_number", "sensor_noise", "n_noisy", "noise_level", "dead_channel",
                            "saturated_channel", "line_frequency", "strength_spread", "source_kind"),
             {"rfica": _check_recordings},
             site_data=_load_labelled(recordings_client_data), true_mixing=_recordings_mixing,
             poor_sites=_recordings_poor_sites,
             # Every site at its largest length: an upper bound, known before any site is drawn.
             data_values=lambda sc, n_clients: n_clients * sc["max_samples"] * sc["n_channels"],
             memory_key="max_samples", defaults={"strength_spread": 1.0, "source_kind": "eeg"}),
    Scenario("blobs", ("n_clients", "n_clusters", "dim", "r_min", "n_train", "n_test", "setting", "k_min", "k_max"),
             {"fedgem": _check_blobs},
             client_data=_load_blobs, true_n_clusters=lambda params: int(params["n_clusters"]),
             # A run holds about three copies of the points (measured in-process: 1.97 GB peak for 0.6 GB of
             # points at d=10^4; the generator's pool, the sites' splits, the harness's truth).
             data_values=lambda sc, n_clients: BLOBS_COPIES * (sc["n_train"] + sc["n_test"]) * sc["dim"],
             memory_key="n_train"),
    _labelled("waveform", ("n_clients", "n_samples", "test_fraction", "k_min", "k_max"), waveform_client_data, 3),
    _labelled("digits", _CLASS_KEYS, digits_client_data, 10),
    _labelled("mnist", _CLASS_KEYS, mnist_client_data, 10),
    Scenario("sklearn_real", ("dataset", "split", "standardize", "n_clients", "test_fraction", "n_components"),
             {"fedgem": _check_sklearn_real}, client_data=_load_labelled(real_client_data),
             true_n_clusters=lambda params: int(real_dataset(params.get("dataset", "iris"))[1].max()) + 1),
    # FedGEM reads every key; RF-ICA only the paths and the label column (the others are FedGEM's).
    Scenario("files", _FILE_KEYS, {"fedgem": _check_files, "rfica": _check_file_list},
             client_data=_load_client_file, site_data=_load_ica_file),
)}

SCENARIO_NAMES = tuple(name for name, s in SCENARIOS.items() if "fedgem" in s.algorithms)  # FedGEM's
ICA_SCENARIOS = tuple(name for name, s in SCENARIOS.items() if "rfica" in s.algorithms)  # RF-ICA's
_KEYS = {algorithm: {name: SCENARIOS[name].keys for name in names}
         for algorithm, names in (("fedgem", SCENARIO_NAMES), ("rfica", ICA_SCENARIOS))}


def _scenario_key(scenario: Mapping, algorithm: str = "fedgem") -> tuple[str, tuple]:
    """The scenario's name and its known items (hashable), among ``algorithm``'s scenarios."""
    table = _KEYS[algorithm]
    names = tuple(table)
    if not isinstance(scenario, Mapping) or "name" not in scenario:
        raise ValueError(f"scenario must be a mapping with a 'name' key, one of {names}")
    name = scenario["name"]
    if name not in table:
        raise ValueError(f"unknown scenario name {name!r}; known names: {names}")
    unknown = sorted(set(scenario) - {"name", *table[name]})
    if unknown:
        raise ValueError(f"scenario {name!r} has unknown keys {unknown}; its keys are {table[name]}")
    return name, tuple((key, _freeze(scenario[key])) for key in table[name] if key in scenario)


def _file_stamp(path) -> tuple | None:
    """Part of the cache key of a file scenario, so an edited file is re-read."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size


def scenario_client_data(scenario: Mapping, partition_id: int, seed: int, standardisation: str | None = None) -> ClientData:
    """One client's data for a scenario config (docs/INTERFACE.md section 2, ``scenario=...``).

    Parameters
    ----------
    scenario : Mapping
        ``name`` in {"blobs", "waveform", "digits", "mnist", "files"} plus that scenario's keys; missing keys
        take the defaults of the matching ``*_client_data`` function. ``files`` needs ``paths`` (one per client);
        its ``n_components`` may be an int, a list (one per client) or None, and a missing
        ``test_fraction`` is None (as in ``conf/scenario/files.yaml``). Unknown keys are an error.
    partition_id : int
        Client index.
    seed : int
    standardisation : str or None, default=None
        The location and scale a FedGEM request names (``standardize: federated``,
        :func:`fedica.fedgem.standardisation.encode_standardisation`): the points are standardised by them, a
        file site's before its held-out share is drawn and before it chooses its K_g (``n_components: auto``), a
        ``sklearn_real`` site's before it chooses its K_g; another scenario's K_g is the scenario's own. None: the
        data's own units.

    Returns
    -------
    ClientData
        A fresh copy: results are cached per process (keyed by the scenario, the client and the seed; for files
        also the file's modification time and size), so repeated calls cost one copy.
    """
    name, items = _scenario_key(scenario)
    stamp = None
    if name == "files":
        params = dict(items)
        paths = params.get("paths", ())
        if params.get("standardize") == "pool":  # every file's rows set the scale
            stamp = tuple(_file_stamp(path) for path in paths)
        elif 0 <= partition_id < len(paths):
            stamp = _file_stamp(paths[partition_id])
    data = _cached_client_data(name, items, int(partition_id), check_seed(seed), stamp, standardisation)
    return dataclasses.replace(
        data,
        X_train=data.X_train.copy(), X_test=data.X_test.copy(),
        y_train=None if data.y_train is None else data.y_train.copy(),
        y_test=None if data.y_test is None else data.y_test.copy(),
    )


# Every message to a client needs its data, and one process serves all the clients (the in-process engine) or
# any of them (a Ray actor). The cache must hold a whole federation: at 512 entries a 1,000-client run visited
# in turn never hit it and regenerated each client's data for every message (about 1 ms each at 500 points),
# and at 4,096 a 10,000-client run spent 52 s of its 11 minutes so. It is bounded by the bytes it holds,
# not by a count: a sweep's runs follow each other in one process, and 4,096 MNIST-sized sites would hold
# 12 GiB. The sites' files are few, and their caches below count them.
CLIENT_CACHE_BYTES = 2 * 2**30
CLIENT_CACHE_SIZE = 4096


def _client_data_bytes(data: ClientData) -> int:
    return sum(array.nbytes for array in (data.X_train, data.X_test, data.y_train, data.y_test) if array is not None)


# cachetools, as functools.lru_cache cannot weigh its entries; a client larger than the bound is not cached.
@cachetools.cached(cachetools.LRUCache(maxsize=CLIENT_CACHE_BYTES, getsizeof=_client_data_bytes),
                   lock=threading.Lock(), info=True)
def _cached_client_data(name: str, items: tuple, partition_id: int, seed: int, _stamp,
                        standardisation: str | None = None) -> ClientData:
    params = dict(items)
    if standardisation is None:
        return SCENARIOS[name].client_data(params, partition_id, seed)
    if name == "files":  # the site's own K_g choice and held-out share see the standardised rows
        return _load_client_file(params, partition_id, seed, standardisation)
    data = in_request_units(SCENARIOS[name].client_data(params, partition_id, seed),
                            {STANDARDISATION_KEY: standardisation})
    if name == "sklearn_real" and params.get("n_components") == "auto":  # the site chooses on the points it clusters
        data = with_chosen_components(data, partition_id, seed)
    return data


def file_table(path, label_column: int | str | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """A data file's points and labels (:func:`fedica.data.files.read_table`), parsed once per process.

    The config's up-front check of the files and the run's loaders both read through this cache, keyed by the
    path, the label column and the file's modification time and size (an edited file is parsed anew), so a
    file checked before the run is not parsed again for it. The arrays are the cache's own, read-only: the
    loaders copy what they keep (the train/test split), so a process holds a file's table once.

    Parameters
    ----------
    path : str or os.PathLike
    label_column : int, str or None

    Returns
    -------
    X : ndarray of shape (n, d), read-only
    y : ndarray of shape (n,), read-only, or None

    Raises
    ------
    fedica.data.files.DataFileError
        For a missing or malformed file (never cached: a fixed file is read anew).
    """
    return _cached_table(str(path), label_column, _file_stamp(path))


@functools.lru_cache(maxsize=CLIENT_CACHE_SIZE)
def _cached_table(path: str, label_column, _stamp) -> tuple[np.ndarray, np.ndarray | None]:
    X, y = read_table(path, label_column=label_column)
    for array in (X, y):
        if array is not None:
            array.setflags(write=False)
    return X, y


def file_recording(path) -> Recording:
    """A site's EEG recording (:func:`fedica.data.files.read_recording`), read once per process.

    As :func:`file_table`: the config's up-front check and the run's loader share the read, keyed by the path
    and the file's modification time and size; the observations are the cache's own, read-only.

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    Recording
        ``data`` of shape (n_channels, n_samples), read-only, and ``channel_names``.

    Raises
    ------
    fedica.data.files.DataFileError
        For a missing or unreadable file, no EEG channel, or MNE not installed (never cached).
    """
    return _cached_recording(str(path), _file_stamp(path))


@functools.lru_cache(maxsize=CLIENT_CACHE_SIZE)
def _cached_recording(path: str, _stamp) -> Recording:
    recording = read_recording(path)
    recording.data.setflags(write=False)
    return recording


def ica_channel_names(scenario: Mapping) -> list[str] | None:
    """The EEG channel names of a files scenario of recordings (:func:`montage_channels`), else None.

    Read from the sites' files through :func:`file_recording`'s cache, so only where they are on this
    machine; tables (CSV, NPY, NPZ) name no channels.
    """
    if scenario.get("name") != "files" or not scenario.get("paths") or not is_recording(scenario["paths"][0]):
        return None
    return list(montage_channels(tuple(scenario["paths"])))


def montage_channels(paths: Sequence) -> tuple[str, ...]:
    """The federation's EEG channels: every channel any site's recording has, in the order they first appear.

    Sites whose montages differ but overlap take part together: a site's channels it does not record
    are held at zero (:func:`in_montage`), so its ICA leaves them out as it leaves out a flat channel
    and the server fills them from the sites that record them (docs/ALGORITHMS.md section 1.12).
    """
    channels: dict[str, None] = {}
    for path in paths:
        channels.update(dict.fromkeys(file_recording(path).channel_names))
    return tuple(channels)


def in_montage(recording: Recording, channels: Sequence[str]) -> np.ndarray:
    """``recording``'s rows in the order of ``channels``, a zero row for each channel it does not record."""
    if tuple(channels) == recording.channel_names:
        return recording.data
    rows = np.zeros((len(channels), recording.data.shape[1]))
    for index, name in enumerate(channels):
        if name in recording.channel_names:
            rows[index] = recording.data[recording.channel_names.index(name)]
    return rows


def true_n_clusters(scenario: Mapping) -> int | None:
    """The true number of clusters K of a scenario: ``n_clusters`` for blobs, 3 waveform, 10 digits and mnist,
    None files."""
    name, items = _scenario_key(scenario)
    return SCENARIOS[name].true_n_clusters(dict(items))


# ---------------------------------------------------------------- RF-ICA's scenarios


def _ica_params(scenario: Mapping) -> tuple[str, dict]:
    name, items = _scenario_key(scenario, "rfica")
    params = {**SCENARIOS[name].defaults, **dict(items)}
    if name != "files":
        missing = [key for key in SCENARIOS[name].keys if key not in params]
        if missing:
            raise ValueError(f"scenario {name!r} needs keys {missing}")
    return name, params


def ica_scenario_data(scenario: Mapping, partition_id: int, seed: int) -> np.ndarray:
    """One RF-ICA site's observations for a scenario config.

    Parameters
    ----------
    scenario : Mapping
        ``name`` in :data:`ICA_SCENARIOS` plus all of that scenario's keys (``files``: ``paths``, and
        ``label_column``, a column dropped from the channels; its other keys are FedGEM's or the server's).
    partition_id : int
        Site index.
    seed : int

    Returns
    -------
    Y : ndarray of shape (r, n_k)
        One column per sample. A fresh copy: results are cached per process (for files keyed also by the
        file's modification time and size).

    Raises
    ------
    ValueError
        For an unknown name or key, a missing key, a bad partition id; for files a
        :class:`fedica.data.files.DataFileError` naming the file and the problem.
    """
    name, params = _ica_params(scenario)
    stamp = None
    if name == "files":
        paths = params.get("paths") or ()
        if not paths:
            raise ValueError("scenario 'files' needs a non-empty 'paths' list (one file per site)")
        check_partition(partition_id, len(paths))
        channels = montage_channels(tuple(paths)) if is_recording(paths[partition_id]) else None
        params = {"path": paths[partition_id], "label_column": params.get("label_column"), "channels": channels}
        stamp, seed = _file_stamp(params["path"]), 0  # a file does not depend on the seed
    items = tuple(sorted(params.items()))
    return _cached_ica_data(name, items, int(partition_id), check_seed(seed), stamp).copy()


@functools.lru_cache(maxsize=8)
def _cached_ica_data(name: str, items: tuple, partition_id: int, seed: int, _stamp) -> np.ndarray:
    return SCENARIOS[name].site_data(dict(items), partition_id, seed)


def ica_scenario_truth(scenario: Mapping, seed: int) -> np.ndarray | None:
    """The true mixing ``A*`` of an RF-ICA scenario, shape (n_channels, n_sources) with unit-norm columns
    (square but for recordings with fewer sources than channels); None for files (no ground truth)."""
    name, params = _ica_params(scenario)
    return SCENARIOS[name].true_mixing(params, seed)


def ica_poor_sites(scenario: Mapping, seed: int) -> dict[str, list[int]] | None:
    """The sites an RF-ICA scenario makes poor on purpose, by kind; None for files (unknown).

    Returns
    -------
    dict or None
        ica_paper: ``{"corrupted": [...]}`` (few samples); signals: ``{"noisy": [...], "short": [...]}``;
        recordings: ``{"noisy": [...], "dead_channel": [...], "saturated_channel": [...]}``.
    """
    name, params = _ica_params(scenario)
    return SCENARIOS[name].poor_sites(params, seed)


def client_count(scenario: Mapping[str, Any]) -> int:
    """Number of clients a scenario defines.

    Parameters
    ----------
    scenario : mapping
        The ``scenario`` section of a run configuration.

    Returns
    -------
    n_clients : int
    """
    if scenario["name"] == "files":
        return len(scenario["paths"])
    return int(scenario["n_clients"])
