"""Input checks shared by the library: one place for the rules and the messages that name them.

Each check returns the value in its canonical type, or raises ``ValueError`` naming the argument
and the rule it broke.
"""

from __future__ import annotations

import numbers

from collections.abc import Mapping

import numpy as np
import scipy.sparse as sp
from sklearn.utils.validation import validate_data


def as_float_array(value, name):
    try:
        return np.asarray(value, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a numeric array: {exc}") from exc


def check_int(value, name, *, minimum):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_index(value, name, size):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value < size:
        raise ValueError(f"{name} must be an integer in [0, {size}), got {value!r}")
    return int(value)


def check_ratio(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value <= 1:
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


def as_centers(centers):
    centers = np.asarray(centers, dtype=float)
    if centers.ndim != 2:
        raise ValueError(f"centers must be a 2-D array (m, d); got shape {centers.shape}.")
    if not np.all(np.isfinite(centers)):
        raise ValueError("centers must contain only finite values.")
    return centers


def as_vector(values, m, name, *, positive=False):
    values = np.asarray(values, dtype=float)
    if values.shape != (m,):
        raise ValueError(f"{name} must have shape ({m},); got {values.shape}.")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{name} must contain only finite values.")
    if positive and np.any(values <= 0):
        raise ValueError(f"{name} must be positive.")
    if not positive and np.any(values < 0):
        raise ValueError(f"{name} must be non-negative.")
    return values


def as_int_vector(values, m, name):
    values = np.asarray(values)
    if values.shape != (m,):
        raise ValueError(f"{name} must have shape ({m},); got {values.shape}.")
    if m and not np.issubdtype(values.dtype, np.integer):
        raise ValueError(f"{name} must hold integers; got dtype {values.dtype}.")
    return values.astype(np.int64, copy=False)


def check_partition(partition_id, n_clients: int) -> int:
    if isinstance(partition_id, bool) or not isinstance(partition_id, (int, np.integer)):
        raise ValueError(f"partition_id must be an int, got {partition_id!r}")
    if not 0 <= partition_id < n_clients:
        raise ValueError(f"partition_id must be in [0, n_clients={n_clients}), got {partition_id}")
    return int(partition_id)


def check_test_fraction(test_fraction) -> float:
    if not 0.0 < float(test_fraction) < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    return float(test_fraction)


def is_site_list(X) -> bool:
    """Whether ``X`` is the federation's list form (one array per site) rather than scikit-learn's one array."""
    return isinstance(X, (list, tuple)) and len(X) > 0 and all(
        len(getattr(site, "shape", ())) == 2
        or (isinstance(site, (list, tuple)) and len(site) > 0 and isinstance(site[0], (list, tuple)))
        for site in X)


def fit_sites(estimator, X, groups, *, min_rows) -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """The sites of a fit, in either form, checked; sets ``n_features_in_`` and ``feature_names_in_`` on ``estimator``.

    scikit-learn's form: one array or DataFrame ``X`` (checked by scikit-learn's ``validate_data``) whose rows
    ``groups`` assigns to sites (one label per row, any values, as ``GroupKFold`` takes them; the sites in their
    sorted order); None: one site, a federation of one. The federation's form: a list of per-site arrays, without
    ``groups``. ``min_rows(n_features)`` is the fewest rows a site needs.

    Returns
    -------
    data : list of ndarray of shape (n_samples_g, n_features)
    rows : list of ndarray, or None
        In scikit-learn's form each site's row indices in ``X`` (per-row results go back in ``X``'s order);
        None in the federation's form.
    """
    if isinstance(X, Mapping) and not sp.issparse(X):  # scipy's dok_matrix is a dict
        raise ValueError(f"the sites are given as a mapping of {len(X)} entries: give a list with one array per site "
                         "(list(sites.values())), or one array X with groups=")
    if isinstance(X, (list, tuple)) and X and all(hasattr(site, "shape") for site in X) and not is_site_list(X):
        bad = next(g for g, site in enumerate(X) if len(site.shape) != 2)
        raise ValueError(f"site {bad} must be a 2-D array (n_samples, n_features), got shape {X[bad].shape}")
    if is_site_list(X):
        if groups is not None:
            raise ValueError("groups: give either one array X with groups, or a list of sites without")
        names, sites, rows = column_names(X), X, None
    else:
        names = column_names([X])
        X = validate_data(estimator, X, dtype=np.float64, ensure_min_samples=2)
        if groups is None:
            rows = [np.arange(X.shape[0])]
        else:
            labels = np.asarray(groups)
            if labels.ndim != 1 or labels.shape[0] != X.shape[0]:
                raise ValueError(f"groups must hold one site label per row of X ({X.shape[0]}), got shape "
                                 f"{labels.shape}")
            _, codes = np.unique(labels, return_inverse=True)
            rows = [np.flatnonzero(codes == g) for g in range(codes.max() + 1)]
        sites = [X[index] for index in rows]
    data = check_sites(sites, min_sites=1, min_rows=min_rows)
    estimator.n_features_in_ = data[0].shape[1]
    estimator.feature_names_in_ = names
    return data, rows


def check_sites(sites, *, min_sites: int, min_rows) -> list[np.ndarray]:
    """A federation given as arrays: a sequence of 2-D float arrays, one per site, with one width.

    ``min_rows(n_features)`` is the fewest rows a site needs.
    """
    if isinstance(sites, np.ndarray) or len(sites) < min_sites:
        raise ValueError(f"sites must be a sequence of at least {min_sites} arrays (one per site), "
                         "each (n_samples, n_features)")
    _check_column_names(sites)
    data = []
    for g, X in enumerate(sites):
        try:
            data.append(np.asarray(X, dtype=np.float64))
        except (ValueError, TypeError) as err:
            raise ValueError(f"site {g} cannot be read as numbers ({' '.join(str(err).split())[:200]})") from None
    for g, X in enumerate(data):
        if X.ndim != 2 or X.shape[0] < min_rows(X.shape[-1]):
            raise ValueError(f"site {g} must be a 2-D array (n_samples, n_features) with at least "
                             f"{min_rows(X.shape[-1])} rows, got shape {X.shape}")
        if X.shape[1] != data[0].shape[1]:
            raise ValueError(f"site {g} has {X.shape[1]} features, site 0 has {data[0].shape[1]}")
        if not np.all(np.isfinite(X)):
            raise ValueError(f"site {g} holds NaN or infinite values")
    for g, X in enumerate(data):
        if X.shape[0] > 1 and (X == X[0]).all():
            raise ValueError(f"site {g}: all its {X.shape[0]} rows are the same row; a site needs points that differ "
                             "(a repeated record, or an export that wrote one row many times?)")
    return data


def _check_column_names(sites) -> None:
    """Sites given as pandas DataFrames name their columns: every one must name the first's, in its order.

    The arrays are read by position, so a site whose columns come in another order (two exports of one
    table) would put another feature in each place without a word.
    """
    named = [(g, tuple(str(c) for c in X.columns)) for g, X in enumerate(sites) if hasattr(X, "columns")]
    for g, names in named[1:]:
        reference, first = named[0]
        if len(names) == len(first) and names != first:
            raise ValueError(f"site {g}'s columns differ from site {reference}'s ({name_difference(names, first)}); "
                             "every site must have the same columns in the same order (they are read by position)")


def column_names(sites) -> tuple[str, ...] | None:
    """The columns the sites name, when given as pandas DataFrames (:func:`check_sites` holds them to one order);
    None for arrays, which name nothing."""
    for X in sites:
        if hasattr(X, "columns"):
            return tuple(str(c) for c in X.columns)
    return None


def check_columns(X, names: tuple[str, ...] | None) -> None:
    """Refuse a DataFrame ``X`` whose columns are not the fit's ``names``, in their order (they are read by
    position); an array, or a fit on arrays (``names`` None), is taken as it is."""
    if names is None or not hasattr(X, "columns"):
        return
    given = tuple(str(c) for c in X.columns)
    if given != tuple(names):
        raise ValueError(f"X's columns differ from the fit's ({name_difference(given, tuple(names))}); give them in "
                         "the fit's order (they are read by position)")


def name_difference(names: tuple[str, ...], reference: tuple[str, ...], kind: str = "columns") -> str:
    """How a site's names (columns, EEG channels) differ from the reference site's, in a few words.

    Returns
    -------
    str
        The names only one of them has, or, for the same set, that the order differs and where first.
    """
    extra = [name for name in names if name not in reference]
    missing = [name for name in reference if name not in names]
    if not extra and not missing:
        first = next((f"position {i}: {a!r} for {b!r}" for i, (a, b) in enumerate(zip(names, reference)) if a != b), None)
        if first is None:  # the same names, one of them repeated: one list is the other's start
            return f"the same {kind}, {len(names)} here against {len(reference)} (a name repeated)"
        return f"the same {kind} in another order (first difference: {first})"
    parts = []
    if extra:
        parts.append(f"only here: {', '.join(extra)}")
    if missing:
        parts.append(f"missing here: {', '.join(missing)}")
    return "; ".join(parts)


def check_seed(seed) -> int:
    """A run seed: a non-negative integer (numpy's SeedSequence takes no negative entropy)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return int(seed)
