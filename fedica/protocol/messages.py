"""fedica's message protocol, shared by both sides: the tasks, what a reply is, and its validation.

A task is a Flower message type ``<category>.<action>`` (the ClientApp routes it with Flower's
own decorators, ``@app.train("fedgem_round")``). A message's content is a mapping of numpy
arrays and a mapping of scalar values; so is a reply. Every check here raises
:class:`InvalidReply` with a reason that names the field and the rule; the server excludes such
a reply, records the reason and goes on with the other clients.

This module is plain numpy: the library's estimators speak the same protocol in memory, and the
Flower side (``fedica.server.records``) only converts it to and from Flower's records.
"""

from __future__ import annotations

import bisect
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any

import numpy as np

TRAIN, EVALUATE = "train", "evaluate"

# action names: the message type is f"{category}.{action}".
RFICA_FIT = "rfica_fit"
# RF-ICA's federated whitening: every site's channel covariance, before the ICA exchange.
RFICA_COVARIANCE = "rfica_covariance"
# RF-ICA's federated refinement: every site's averages at the server's current unmixing (FastICA's fixed point).
RFICA_REFINE = "rfica_refine"
# FedGEM's federated standardisation (standardize: federated): every site's column means and deviations, first.
GEM_MOMENTS = "fedgem_moments"
GEM_INIT = "fedgem_init"
GEM_ROUND = "fedgem_round"
GEM_FINAL = "fedgem_final"
GEM_SILHOUETTE = "fedgem_silhouette"
GEM_LIKELIHOOD = "fedgem_likelihood"
GEM_EVALUATE = "fedgem_evaluate"
# Under a covariance family (diag, full, auto): each site's mass, mean and scatter matrix of the points it labels with
# each global cluster of the chosen partition (fedica.fedgem.families).
GEM_CLUSTER_MOMENTS = "fedgem_cluster_moments"
# Then one federated EM step of the family's candidate mixtures: each site's moments of its points' responsibilities.
GEM_FAMILY_EM = "fedgem_family_em"
# FedGEM's init request asks for (a true value), and its reply then carries, one number of the site's data: how
# far its columns' standard deviations are apart (fedica.fedgem.geometry.feature_scale_spread).
REPORT_SCALE_SPREAD_KEY = "report-scale-spread"
SCALE_SPREAD_KEY = "feature-scale-spread"
# FedGEM's init reply of a site that chose its K_g and chose its bound (true; absent otherwise): it may hold more
# clusters than it fits, and the run's result says so.
K_AT_BOUND_KEY = "k-at-bound"
# FedGEM's final request asks for (a true value), and its reply then carries, one number of the site's data under its
# final local model: how far its clusters are from spheres (fedica.fedgem.geometry.cluster_anisotropy).
REPORT_CLUSTER_SHAPE_KEY = "report-cluster-shape"
CLUSTER_SHAPE_KEY = "cluster-anisotropy"
# A journalled run's check of every site's data (fedica.protocol.journal): a salted SHA-256 of the rows the run's
# first task reads, asked when the run starts and again when it resumes, so that a site whose data changed between
# an interruption and its resume is named rather than mixed into one result with its old replies.
DATA_DIGEST = "data_digest"
DATA_DIGEST_KEY = "data-digest"
# The request's values: the task whose data the digest covers, and the run's salt (hex).
DIGEST_FOR_TASK_KEY = "digest-for-task"
DIGEST_SALT_KEY = "digest-salt"
# The tasks that read a site's observations (channels x samples) rather than its points.
OBSERVATION_TASKS = frozenset({RFICA_FIT, RFICA_COVARIANCE, RFICA_REFINE})
# The FFCM and AFCL comparators (fedica.evaluation.ffcm, fedica.evaluation.afcl).
FFCM_INIT = "ffcm_init"
FFCM_ROUND = "ffcm_round"
AFCL_INIT = "afcl_init"
AFCL_ROUND = "afcl_round"

CATEGORY = {
    RFICA_FIT: TRAIN,
    RFICA_COVARIANCE: TRAIN,
    RFICA_REFINE: TRAIN,
    GEM_MOMENTS: TRAIN,
    GEM_INIT: TRAIN,
    GEM_ROUND: TRAIN,
    GEM_FINAL: TRAIN,
    GEM_SILHOUETTE: EVALUATE,
    GEM_LIKELIHOOD: EVALUATE,
    GEM_EVALUATE: EVALUATE,
    GEM_CLUSTER_MOMENTS: EVALUATE,
    GEM_FAMILY_EM: EVALUATE,
    FFCM_INIT: TRAIN,
    FFCM_ROUND: TRAIN,
    AFCL_INIT: TRAIN,
    AFCL_ROUND: TRAIN,
    DATA_DIGEST: EVALUATE,
}

# Value of a reply whose client failed with a reason it could name (bad data, bad config).
ERROR_KEY = "error"
# Value of a reply computed in a Ray worker: the id of the Ray node it ran on (hex; for the books only).
RAY_NODE_KEY = "ray-node-id"
# Ray's node ids are 28 bytes in hex; anything else a client claims is not recorded.
_RAY_NODE_ID = re.compile(r"[0-9a-f]{8,64}")
# Value of a reply from a site whose data names its columns (a CSV file's header, a recording's EEG channels, a
# DataFrame's columns): a JSON list of the names, in the order the site reads them. Every site reads its columns
# by position, so the transport holds the sites to the names most of them send (column_majority).
COLUMNS_KEY = "columns"
# At most this many names, each at most MAX_COLUMN_NAME characters (64 EEG channels, a table of thousands of features).
MAX_COLUMNS = 100_000
MAX_COLUMN_NAME = 256


def message_type(task: str) -> str:
    """The Flower message type of a task, e.g. ``"train.fedgem_round"``."""
    return f"{CATEGORY[task]}.{task}"


@dataclass
class Reply:
    """A decoded reply of one client: who sent it, its arrays and its scalar values."""

    partition_id: int
    arrays: dict[str, np.ndarray]
    values: dict[str, Any]


@dataclass
class Request:
    """What the server asks in one exchange.

    ``payloads`` maps a partition id to the arrays it receives; ``None`` (the initial exchange)
    asks every connected client the same, with no arrays.
    """

    task: str
    round_label: int | str
    payloads: dict[int, dict[str, np.ndarray]] | None
    values: dict[str, Any] = field(default_factory=dict)


class RunStopped(RuntimeError):
    """The run cannot go on; ``partial`` holds what it had computed (set by the caller that has it)."""

    partial: dict[str, Any] | None = None


class NotEnoughClients(RunStopped):
    """Fewer valid replies than ``min_clients``: the run cannot go on."""


class OverBudget(RunStopped):
    """A server step needs more memory than its configured budget allows."""


class MisalignedSites(RunStopped):
    """The sites name their columns differently, and no majority of them names one order to hold the others to."""


def reported_seconds(reply: Reply) -> float:
    """The client's own timing of its work (``fit-seconds``), or 0 when it sent none or nonsense; for the books only."""
    seconds = reply.values.get("fit-seconds", 0.0)
    return float(seconds) if isinstance(seconds, (int, float)) and np.isfinite(seconds) and seconds >= 0 else 0.0


def reported_ray_node(reply: Reply) -> str | None:
    """The Ray node id the client says served it, or None when it sent none or anything but a hex id; for the books only."""
    node = reply.values.get(RAY_NODE_KEY)
    return node if isinstance(node, str) and _RAY_NODE_ID.fullmatch(node) else None


def reported_columns(values: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The column names a reply reports (:data:`COLUMNS_KEY`), or None when it reports none.

    Raises
    ------
    InvalidReply
        When the value is not a JSON list of at most MAX_COLUMNS strings of at most MAX_COLUMN_NAME characters.
    """
    if COLUMNS_KEY not in values:
        return None
    text = values[COLUMNS_KEY]
    if not isinstance(text, str) or len(text) > MAX_COLUMNS * (MAX_COLUMN_NAME + 4):
        raise InvalidReply(f"{COLUMNS_KEY!r} is not a JSON list of names of a bounded length")
    try:
        names = json.loads(text)
    except ValueError:
        raise InvalidReply(f"{COLUMNS_KEY!r} is not JSON") from None
    if (not isinstance(names, list) or len(names) > MAX_COLUMNS
            or not all(isinstance(name, str) and len(name) <= MAX_COLUMN_NAME for name in names)):
        raise InvalidReply(f"{COLUMNS_KEY!r} must be a list of at most {MAX_COLUMNS} names of at most "
                           f"{MAX_COLUMN_NAME} characters")
    return tuple(names)


def column_majority(columns_of: Mapping[int, tuple[str, ...]]) -> tuple[tuple[str, ...] | None, list[int]]:
    """The column names a strict majority of the sites report, and the sites (sorted) that report others.

    A site reads its columns by position, so a site whose file orders or names them otherwise would put
    one feature, or channel, where the others hold a different one, and every result would be wrong
    without a word. No single site sets the order: the names of more than half of the sites that report
    any are the reference (a site that reports none, an unnamed array, is not held to them).

    Parameters
    ----------
    columns_of : mapping of int to tuple of str
        Each reporting site's names (:func:`reported_columns`), by partition id.

    Returns
    -------
    reference : tuple of str or None
        None when no site reports names.
    differing : list of int

    Raises
    ------
    MisalignedSites
        When the sites report different names and none are a strict majority's: no rule could tell which
        sites read their columns as the others do.
    """
    groups: dict[tuple[str, ...], list[int]] = {}
    for partition, names in sorted(columns_of.items()):
        groups.setdefault(names, []).append(partition)
    if not groups:
        return None, []
    reference, holders = max(groups.items(), key=lambda item: len(item[1]))
    if len(groups) > 1 and 2 * len(holders) <= len(columns_of):
        described = "; ".join(f"{_sites(partitions)}: {_names(names)}"
                              for names, partitions in sorted(groups.items(), key=lambda item: -len(item[1])))
        raise MisalignedSites(f"the sites name their columns differently and no majority of them agrees ({described}); "
                              "every site's data must have the same columns in the same order (they are read by position)")
    return reference, sorted(p for names, partitions in groups.items() if names != reference for p in partitions)


def _sites(partitions: list[int]) -> str:
    shown = ", ".join(map(str, partitions[:8])) + (f" and {len(partitions) - 8} more" if len(partitions) > 8 else "")
    return f"site{'s' if len(partitions) > 1 else ''} {shown}"


def _names(names: tuple[str, ...], shown: int = 6) -> str:
    return "(" + ", ".join(repr(n[:40]) for n in names[:shown]) + (f", ... {len(names)} in all" if len(names) > shown else "") + ")"


def majority_width(replies: list[Reply], key: str) -> int | None:
    """The last dimension of the 2-D array ``key`` that most replies report (d, or r), so that one client cannot set it."""
    widths = [r.arrays[key].shape[-1] for r in replies if isinstance(r.arrays.get(key), np.ndarray) and r.arrays[key].ndim == 2]
    if not widths:
        return None
    values, counts = np.unique(widths, return_counts=True)
    return int(values[np.argmax(counts)])


class InvalidReply(ValueError):
    """A client's reply breaks the protocol; the message says which field and why."""


def require_array(
    arrays: Mapping[str, Any],
    key: str,
    shape: tuple[int | None, ...],
    *,
    nonnegative: bool = False,
    allow_nan: bool = False,
) -> np.ndarray:
    """Fetch a real, finite array of a given shape from a reply.

    Parameters
    ----------
    arrays : mapping of str to ndarray
    key : str
    shape : tuple of int or None
        Expected shape; ``None`` accepts any length on that axis.
    nonnegative : bool, default=False
    allow_nan : bool, default=False
        Accept NaN (a value the client could not compute); infinities are still refused.

    Returns
    -------
    array : ndarray of float64, of the expected shape
    """
    if key not in arrays:
        raise InvalidReply(f"missing array {key!r}")
    array = arrays[key]
    if not isinstance(array, np.ndarray):
        raise InvalidReply(f"{key!r} is a {type(array).__name__}, not an array")
    if array.dtype.kind not in "iuf":
        raise InvalidReply(f"{key!r} has dtype {array.dtype}, expected a real number type")
    if array.ndim != len(shape) or any(e is not None and e != s for e, s in zip(shape, array.shape)):
        wanted = "x".join("?" if e is None else str(e) for e in shape) or "scalar"
        raise InvalidReply(f"{key!r} has shape {array.shape}, expected {wanted}")
    array = array.astype(np.float64)
    if not np.all(np.isfinite(array) | (allow_nan & np.isnan(array))):
        raise InvalidReply(f"{key!r} holds non-finite values")
    if nonnegative and np.any(array < 0):
        raise InvalidReply(f"{key!r} holds negative values")
    return array


def require_int(values: Mapping[str, Any], key: str, *, minimum: int, maximum: int | None = None) -> int:
    """Fetch an integer value in ``[minimum, maximum]`` from a reply."""
    if key not in values:
        raise InvalidReply(f"missing value {key!r}")
    value = values[key]
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise InvalidReply(f"{key!r}={value!r} is not an integer")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise InvalidReply(f"{key!r}={value} must be {bound}")
    return int(value)


def optional_float(values: Mapping[str, Any], key: str, *, minimum: float) -> float | None:
    """Fetch an optional real value ``>= minimum`` from a reply: None when the client sent none."""
    if key not in values:
        return None
    value = values[key]
    if isinstance(value, bool) or not isinstance(value, (Integral, float)):
        raise InvalidReply(f"{key!r}={value!r} is not a number")
    if not (np.isfinite(value) and value >= minimum):
        raise InvalidReply(f"{key!r}={value!r} must be a finite number >= {minimum:g}")
    return float(value)


def validate_ica_reply(arrays: Mapping[str, Any], values: Mapping[str, Any], *, r: int,
                       n_components: int | None = None) -> tuple[np.ndarray, int]:
    """Check an RF-ICA client's reply.

    Parameters
    ----------
    arrays : mapping
        Must hold ``"mixing"``, a (r, n_components) matrix with no zero column: the site's mixing
        estimate in channel space. Finite, except whole NaN rows, the site's bad channels (fewer
        than half of the channels), and at most as many whole NaN columns, the components its
        other channels could not hold (docs/ALGORITHMS.md section 1.12).
    values : mapping
        Must hold ``"n-samples"``, an integer >= 1.
    r : int
        The federation's number of channels.
    n_components : int or None, default=None
        The number of components every site estimates; None: ``r`` (every channel).

    Returns
    -------
    mixing : ndarray of shape (r, n_components), NaN where the site marked its bad channels
    n_samples : int
    """
    mixing = require_array(arrays, "mixing", (r, r if n_components is None else n_components), allow_nan=True)
    missing = np.isnan(mixing)
    bad_rows, absent_columns = missing.all(axis=1), missing.all(axis=0)
    if missing.any():
        if np.any(missing & ~bad_rows[:, None] & ~absent_columns[None, :]):
            raise InvalidReply("'mixing' holds NaN outside whole rows (bad channels) and whole columns")
        if 2 * bad_rows.sum() >= r:
            raise InvalidReply(f"'mixing' marks {int(bad_rows.sum())} of {r} channels bad; fewer than half may be")
        if absent_columns.all():
            raise InvalidReply("'mixing' has no column that is not NaN")
        if absent_columns.sum() > bad_rows.sum():
            raise InvalidReply(f"'mixing' lacks {int(absent_columns.sum())} columns for {int(bad_rows.sum())} bad "
                               "channel(s); a site lacks a column only for a channel it lacks")
    # The largest entry, not the norm: a column of 1e-170s has a norm that underflows to 0.
    if np.any(np.nanmax(np.abs(mixing[:, ~absent_columns]), axis=0) == 0):
        raise InvalidReply("'mixing' has a zero column")
    return mixing, require_int(values, "n-samples", minimum=1)


# The largest variance of a column's direction an RF-ICA site may report (radians squared): a unit direction cannot err
# by more than 2 radians, and a larger value only says "not seen", which the least weight already says
# (fedica.rfica.uncertainty).
MAX_COLUMN_VARIANCE = 4.0
# The RF-ICA request value asking the sites for their column variances, and the reply array that holds them.
COLUMN_VARIANCES_KEY = "column-variances"


def validate_column_variances(arrays: Mapping[str, Any], mixing: np.ndarray) -> np.ndarray | None:
    """Check what an RF-ICA site says of how well it sees each source (optional: None when it says nothing).

    Parameters
    ----------
    arrays : mapping
        May hold ``"column-variances"``, one value per column of ``mixing``: the variance of the
        column's direction (:func:`fedica.rfica.uncertainty.column_variances`), in
        ``(0, MAX_COLUMN_VARIANCE]``, and NaN exactly where the column is NaN (a column the site's
        good channels could not hold). A site that claims a tiny variance gains nothing beyond an
        ordinary site's weight (:func:`fedica.rfica.uncertainty.column_weights`).
    mixing : ndarray of shape (r, n_components)
        The reply's validated mixing.

    Returns
    -------
    variances : ndarray of shape (n_components,) or None
    """
    if COLUMN_VARIANCES_KEY not in arrays:
        return None
    variances = require_array(arrays, COLUMN_VARIANCES_KEY, (mixing.shape[1],), allow_nan=True)
    absent = np.isnan(mixing).all(axis=0)
    if np.any(np.isnan(variances) != absent):
        raise InvalidReply("'column-variances' is NaN where the mixing has a column, or a number where it has none")
    present = variances[~absent]
    if np.any(present <= 0) or np.any(present > MAX_COLUMN_VARIANCE):
        raise InvalidReply(f"'column-variances' must lie in (0, {MAX_COLUMN_VARIANCE:g}] (radians squared), got "
                           f"{present.min():.3g} to {present.max():.3g}")
    return variances


def validate_ica_convergence(values: Mapping[str, Any]) -> tuple[int | None, bool | None]:
    """Check what an RF-ICA client says of its local ICA's convergence (both values optional).

    A site of the library's own clients always sends both; estimates handed to the server
    step directly (``fedica.RFICA.aggregate``) have neither.

    Parameters
    ----------
    values : mapping
        May hold ``"n-iter"`` (an integer >= 0: the solver's iterations) and ``"converged"`` (a bool).

    Returns
    -------
    n_iter : int or None
    converged : bool or None
        None where the reply does not say.
    """
    n_iter = require_int(values, "n-iter", minimum=0) if "n-iter" in values else None
    converged = values.get("converged")
    if converged is not None and not isinstance(converged, (bool, np.bool_)):
        raise InvalidReply(f"'converged'={converged!r} is not a bool")
    return n_iter, None if converged is None else bool(converged)


# A covariance's asymmetry, and its most negative eigenvalue, relative to its largest
# eigenvalue, above which it is no covariance matrix (float64 rounding of Yc Yc^T / n is ~1e-15).
COVARIANCE_TOLERANCE = 1e-8


def validate_covariance_reply(arrays: Mapping[str, Any], values: Mapping[str, Any], *,
                              r: int) -> tuple[np.ndarray, int]:
    """Check an RF-ICA client's channel covariance (the federated whitening's exchange).

    Parameters
    ----------
    arrays : mapping
        Must hold ``"covariance"``, a finite (r, r) matrix that is symmetric and positive
        semi-definite to :data:`COVARIANCE_TOLERANCE` (relative to its largest eigenvalue), and
        not zero.
    values : mapping
        Must hold ``"n-samples"``, an integer > r (the local ICA needs more samples than channels).
    r : int
        The federation's number of channels.

    Returns
    -------
    covariance : ndarray of shape (r, r), exactly symmetric
    n_samples : int
    """
    covariance = require_array(arrays, "covariance", (r, r))
    scale = np.max(np.abs(covariance))
    if not scale > 0:
        raise InvalidReply("'covariance' is zero (constant observations)")
    if np.max(np.abs(covariance - covariance.T)) > COVARIANCE_TOLERANCE * scale:
        raise InvalidReply("'covariance' is not symmetric")
    covariance = (covariance + covariance.T) / 2
    eigenvalues = np.linalg.eigvalsh(covariance)
    if eigenvalues[0] < -COVARIANCE_TOLERANCE * max(eigenvalues[-1], 0.0) or not eigenvalues[-1] > 0:
        raise InvalidReply(f"'covariance' is not positive semi-definite (smallest eigenvalue {eigenvalues[0]:.3g}, "
                           f"largest {eigenvalues[-1]:.3g})")
    return covariance, require_int(values, "n-samples", minimum=r + 1)


# The RF-ICA covariance reply's array of the site's bad (flat or saturated) channels.
BAD_CHANNELS_KEY = "bad-channels"


def validate_bad_channel_list(arrays: Mapping[str, Any], *, r: int) -> np.ndarray:
    """Check the bad channels an RF-ICA site names beside its covariance (optional: none when it names none).

    Parameters
    ----------
    arrays : mapping
        May hold ``"bad-channels"``: distinct integer channel indices in ``[0, r)``, fewer than half of
        the channels. A site that names channels only leaves itself out of the pooled subspace.

    Returns
    -------
    channels : ndarray of int64
    """
    if BAD_CHANNELS_KEY not in arrays:
        return np.zeros(0, dtype=np.int64)
    channels = require_array(arrays, BAD_CHANNELS_KEY, (None,))
    if np.any(channels != np.round(channels)) or np.any((channels < 0) | (channels >= r)):
        raise InvalidReply(f"'{BAD_CHANNELS_KEY}' must hold channel indices in [0, {r})")
    channels = channels.astype(np.int64)
    if np.unique(channels).size != channels.size or 2 * channels.size >= r:
        raise InvalidReply(f"'{BAD_CHANNELS_KEY}' must name distinct channels, fewer than half of the {r}")
    return channels


def validate_channel_means(arrays: Mapping[str, Any], *, r: int) -> np.ndarray:
    """Check an RF-ICA site's channel means (sent beside its channel covariance): ``"mean"``, finite, shape (r,)."""
    return require_array(arrays, "mean", (r,))


def validate_refinement_reply(arrays: Mapping[str, Any], values: Mapping[str, Any], *,
                              r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Check an RF-ICA site's averages for one refinement step (docs/ALGORITHMS.md section 1.10).

    Parameters
    ----------
    arrays : mapping
        ``"covariance"`` (r, r), as :func:`validate_covariance_reply` checks it; ``"moments"`` (r, r)
        and ``"slopes"`` (r,), finite.
    values : mapping
        ``"n-samples"``, an integer > r.
    r : int
        The number of components.

    Returns
    -------
    covariance, moments, slopes, n_samples
    """
    covariance, n_samples = validate_covariance_reply(arrays, values, r=r)
    return covariance, require_array(arrays, "moments", (r, r)), require_array(arrays, "slopes", (r,)), n_samples


# The keys of a refinement reply's block averages (docs/ALGORITHMS.md 1.10: the site's own sampling spread), and the
# most blocks a reply may hold.
BLOCK_KEYS = ("block-covariances", "block-moments", "block-slopes")
MAX_REFINEMENT_BLOCKS = 64


def validate_refinement_blocks(arrays: Mapping[str, Any], *, r: int) -> tuple[np.ndarray, ...] | None:
    """Check an RF-ICA site's block averages for one refinement step (optional: None when it sends none).

    Parameters
    ----------
    arrays : mapping
        All of :data:`BLOCK_KEYS` or none: ``"block-covariances"`` and ``"block-moments"`` (m, r, r),
        ``"block-slopes"`` (m, r), finite, for one ``m`` in ``2..MAX_REFINEMENT_BLOCKS``; each block's
        covariance symmetric and positive semi-definite, as a covariance is. A site that sends blocks
        spread wider than its samples are gains room beyond the cut only at a weight that pulls no
        more than a site at the cut (:func:`fedica.rfica.refinement.refinement_step`).
    r : int

    Returns
    -------
    covariances, moments, slopes : ndarrays, or None
    """
    present = [key in arrays for key in BLOCK_KEYS]
    if not any(present):
        return None
    if not all(present):
        raise InvalidReply(f"block averages come as all of {', '.join(BLOCK_KEYS)} or none")
    covariances = require_array(arrays, "block-covariances", (None, r, r))
    count = covariances.shape[0]
    if not 2 <= count <= MAX_REFINEMENT_BLOCKS:
        raise InvalidReply(f"'block-covariances' holds {count} blocks; 2 to {MAX_REFINEMENT_BLOCKS} are accepted")
    if not np.allclose(covariances, np.transpose(covariances, (0, 2, 1)), rtol=1e-10, atol=0.0):
        raise InvalidReply("'block-covariances' are not symmetric")
    if np.any(np.linalg.eigvalsh((covariances + np.transpose(covariances, (0, 2, 1))) / 2)[:, 0]
              < -1e-10 * np.abs(np.einsum("kii->k", covariances))):
        raise InvalidReply("'block-covariances' are not positive semi-definite")
    return (covariances, require_array(arrays, "block-moments", (count, r, r)),
            require_array(arrays, "block-slopes", (count, r)))


def validate_gem_components(
    arrays: Mapping[str, Any], key: str, *, dim: int | None, n_components: int | None
) -> np.ndarray:
    """Check a (K_g, d) array of component centres from a FedGEM reply.

    Parameters
    ----------
    arrays : mapping
    key : str
    dim : int or None
        The federation's dimension d, once known.
    n_components : int or None
        The K_g this client declared at initialisation, once known.

    Returns
    -------
    centres : ndarray of shape (K_g, d)
    """
    if dim is not None and isinstance(arrays.get(key), np.ndarray) and arrays[key].ndim == 2 and arrays[key].shape[1] != dim:
        raise InvalidReply(f"{key!r} has dimension {arrays[key].shape[1]}; the federation's data has d={dim}")
    centres = require_array(arrays, key, (n_components, dim))
    # A site may hold a single cluster (K_g = 1): its final radius borrows the federation's separation.
    if centres.shape[0] < 1:
        raise InvalidReply(f"{key!r} has no component; a client fits at least 1")
    return centres


def validate_weights(arrays: Mapping[str, Any], key: str, n_components: int) -> np.ndarray:
    """Check mixture weights pi (K_g,): positive and summing to 1 (to 1e-6)."""
    weights = require_array(arrays, key, (n_components,))
    if np.any(weights <= 0) or abs(weights.sum() - 1.0) > 1e-6:
        raise InvalidReply(f"{key!r} must be positive weights summing to 1")
    return weights


# ---------------------------------------------------------------- the size of a reply

# A client's own text (an error reply's reason) is cut to this many characters before the books keep it:
# the books go into result.json, and one client's 20 MB reason every round would make it hundreds of MB.
MAX_CLIENT_TEXT = 500
# A whole rejection's reason in the books (the server's words around a client's): a value a check quotes
# (``'n-points'='...' is not an integer``) is the client's text too.
MAX_REASON_TEXT = 2 * MAX_CLIENT_TEXT
# A reply is refused, before its arrays are decoded, when it holds more than REPLY_SIZE_FACTOR times the
# bytes of the larger of what the server sent that client and the (lower) median reply of the other clients
# of the exchange, plus REPLY_SIZE_FLOOR. Honest replies are a fixed function of the task, the dimension
# and the components (FedGEM's rounds 3 d K_g numbers, RF-ICA's r^2, the evaluation's contingency counts),
# within a few times of each other across sites and of the request (a comparator's per-point residuals grow
# with a site's size, hence the wide factor); the floor covers a small exchange's fixed costs (values, an
# honest error's reason) whatever the dimension.
REPLY_SIZE_FACTOR = 64
REPLY_SIZE_FLOOR = 2**20
# The bytes a value that is neither a string nor a list counts for (a number, a bool).
_SCALAR_BYTES = 8


def client_text(text: Any, limit: int = MAX_CLIENT_TEXT) -> str:
    """A client's text as the server's books keep it: at most ``limit`` characters, and the cut said."""
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... (cut: {len(text)} characters)"


def value_bytes(value: Any) -> int:
    """The bytes one reply value holds: a string's characters, a list's entries (8 bytes each), 8 for a scalar."""
    if isinstance(value, (str, bytes)):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(value_bytes(item) for item in value)
    return _SCALAR_BYTES


def payload_bytes(arrays: Mapping[str, Any] | None, values: Mapping[str, Any] | None = None) -> int:
    """The bytes of a message's arrays (their data, as sent) and values, known without decoding anything."""
    arrays_bytes = sum(int(np.asarray(a).nbytes) for a in (arrays or {}).values())
    return arrays_bytes + sum(value_bytes(v) for v in (values or {}).values())


def reply_size_limits(sent: Mapping[Any, int], received: Mapping[Any, int]) -> dict[Any, int]:
    """The most bytes each client's reply of one exchange may hold (see :data:`REPLY_SIZE_FACTOR`).

    Parameters
    ----------
    sent : mapping of client to int
        The bytes of the arrays the server sent each client (none: 0).
    received : mapping of client to int
        The bytes of each client's reply.

    Returns
    -------
    limits : dict of client to int
        By the clients of ``received``. A client's own reply never raises its own limit: the median is
        of the others' (the lower median, so that with two clients a bloated one does not set the other's).
    """
    ordered = sorted(received.values())
    # The others' lower median is the whole list's element at that index, or the next one when the
    # client's own size (its first occurrence: removing any equal size leaves the same others) lies at or
    # below it: one sort for all clients instead of one each.
    middle = (len(ordered) - 2) // 2
    limits = {}
    for client, size in received.items():
        if len(ordered) < 2:
            typical = 0
        else:
            typical = ordered[middle + 1] if bisect.bisect_left(ordered, size) <= middle else ordered[middle]
        limits[client] = REPLY_SIZE_FACTOR * max(sent.get(client, 0), typical) + REPLY_SIZE_FLOOR
    return limits


def check_reply_size(size: int, limit: int) -> None:
    """Raise :class:`InvalidReply` when a reply of ``size`` bytes is over its ``limit`` (:func:`reply_size_limits`)."""
    if size > limit:
        raise InvalidReply(f"the reply holds {size / 2**20:.1f} MiB, more than the {limit / 2**20:.1f} MiB this "
                           f"exchange admits ({REPLY_SIZE_FACTOR} x the larger of the request and the other "
                           f"clients' median reply, + {REPLY_SIZE_FLOOR / 2**20:.0f} MiB); it is not decoded")
