"""Federated standardisation (``standardize: federated``): one location and scale per feature, agreed by the sites.

FedGEM's components are isotropic: every feature of a component has one variance, so distances
weigh the features by their units (docs/ALGORITHMS.md section 2.11.1). Standardising every
feature by one location and scale that all sites share removes the units, as standardising the
pooled data would, without any site sending a point. Before the initial exchange each site sends
its columns' means and standard deviations (:func:`site_moments`, 2d numbers); the server combines
them robustly (:func:`federated_scale`) and every later request names the result
(:func:`encode_standardisation`), which each site applies to its points, training and held-out
alike (:func:`standardised`), before anything else: its choice of K_g, its local start, every EM
step and its labelling. The global centres are then in standardised units; the library maps them
back (``fedica.FedGEM.means_``).

Why the median, not the pooled moments: the pooled variance of a feature is the count-weighted
mean, over the sites, of each site's second moment about the pooled mean,
``sigma^2 = sum_g (N_g / N) (s_g^2 + (m_g - m)^2)``. One site that claims a huge mean, deviation or
count would decide it. :func:`federated_scale` replaces both weighted means by medians over the
sites (each site one vote, whatever count it claims): the location is the median of the sites'
means, the scale the square root of the median of ``s_g^2 + (m_g - location)^2``. Fewer than half
of the sites cannot move either outside the range of the honest sites' values; on sites that
share one distribution both equal the pooled moments in the limit. Multiplying a feature by
``c != 0`` multiplies its location by ``c`` and its scale by ``|c|``, and adding a constant moves only
the location, so the standardised points (mirrored in that feature when ``c < 0``, which no distance
sees), and every result computed from them, do not depend on any feature's unit or origin.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedica.sites import ClientData
from fedica.parameters import STANDARDIZE_MODES
from fedica.protocol.tasks import POINT_UNITS

__all__ = ["STANDARDISATION_KEY", "STANDARDIZE_MODES", "decode_standardisation", "encode_standardisation",
           "federated_scale", "in_request_units", "request_standardisation", "site_moments",
           "standardised"]


# The request value that carries the location and scale to the sites (a JSON text: Flower's config records hold
# scalars, and a float's repr, which json writes, reads back to the same bits).
STANDARDISATION_KEY = "feature-standardisation"


def site_moments(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A site's reply to the standardisation request: its columns' means and standard deviations (d,) each."""
    X = np.asarray(X, dtype=np.float64)
    return X.mean(axis=0), X.std(axis=0)


# A feature's spread at or below this share of its size (squared) is rounding: the feature is constant there.
CONSTANT_SHARE = 1e-12


def federated_scale(means: Sequence[np.ndarray], stds: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The location and scale (d,) every site standardises by: medians over the sites (see the module docstring).

    Parameters
    ----------
    means, stds : sequence of ndarray of shape (d,)
        Each site's column means and standard deviations (finite; deviations >= 0).

    Returns
    -------
    location : ndarray of shape (d,)
        The median over the sites of their means.
    scale : ndarray of shape (d,)
        ``sqrt(median_g(s_g^2 + (m_g - location)^2))``; for a feature constant at the location at half of the sites
        or more (a digit's border pixel, blank at most sites), the largest site's value instead, so that the scale
        is in the feature's unit whatever it is (every feature times its own ``c``, the standardised points are the
        same; issue 44); 1 for a feature constant at every site, which then is 0 everywhere once standardised.
    """
    means, stds = np.vstack(means), np.vstack(stds)
    location = np.median(means, axis=0)
    spreads = np.square(stds) + np.square(means - location)
    median, largest = np.median(spreads, axis=0), spreads.max(axis=0)
    # "Constant" is relative to the feature's size at the median site: a blank pixel of data standardised before
    # (digits on the pool: -0.003 +- 1e-18 at most sites) has a spread of rounding alone, and dividing by it sent
    # the sites that vary it to 1e17 (their components were then refused as far from the federation).
    floor = np.square(CONSTANT_SHARE * np.median(np.abs(means) + stds, axis=0))
    # The largest only where the median is constant: a hostile site can then only widen the scale of a feature most
    # sites hold constant, shrinking the few others' values of it, never narrow it.
    scale = np.sqrt(np.where(median > floor, median, largest))
    return location, np.where(scale > np.sqrt(floor), scale, 1.0)


def standardised(X: np.ndarray, location: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``(X - location) / scale``, a new array."""
    return (np.asarray(X, dtype=np.float64) - location) / scale


def encode_standardisation(location: np.ndarray, scale: np.ndarray) -> str:
    """The request value that names the location and scale to the sites (:data:`STANDARDISATION_KEY`)."""
    return json.dumps({"location": [float(v) for v in location], "scale": [float(v) for v in scale]})


def decode_standardisation(text: Any, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The location and scale a request names, refused with one line unless d finite values each, scales > 0."""
    try:
        fields = json.loads(text) if isinstance(text, str) else None
        location = np.asarray(fields["location"], dtype=np.float64)
        scale = np.asarray(fields["scale"], dtype=np.float64)
    except (TypeError, KeyError, ValueError):
        raise ValueError(f"the server's {STANDARDISATION_KEY} is not a JSON object of 'location' and 'scale' "
                         "lists of numbers") from None
    if (location.shape != (dim,) or scale.shape != (dim,) or not np.all(np.isfinite(location))
            or not np.all(np.isfinite(scale)) or np.any(scale <= 0)):
        raise ValueError(f"the server's {STANDARDISATION_KEY} has a location of shape {location.shape} and a scale of "
                         f"shape {scale.shape}; this site's points have d={dim} features (finite, scales > 0)")
    return location, scale


def request_standardisation(values: Mapping[str, Any], dim: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The location and scale a request names (checked), or None when it names none (the data's own units)."""
    if STANDARDISATION_KEY not in values:
        return None
    return decode_standardisation(values[STANDARDISATION_KEY], dim)


def in_request_units(data: ClientData, values: Mapping[str, Any]) -> ClientData:
    """A site's points in the units the request names: standardised (training and held-out rows) when it names a
    standardisation, else ``data`` itself. K_g is kept: a site that chooses its own K_g chooses on these points
    (its data source standardises before it chooses: ``fedica.data.scenarios.scenario_client_data``)."""
    named = request_standardisation(values, data.X_train.shape[1])
    if named is None:
        return data
    return dataclasses.replace(data, X_train=standardised(data.X_train, *named), X_test=standardised(data.X_test, *named))


# A site's points in the units a request names (the protocol kit's ArraySite asks this for every FedGEM request).
POINT_UNITS[STANDARDISATION_KEY] = in_request_units
