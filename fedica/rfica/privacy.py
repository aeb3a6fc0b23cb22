"""Differential privacy of RF-ICA's one release: each site's mixing estimate through the Gaussian mechanism.

With ``dp_epsilon`` set, a site's only data-dependent release, its mixing estimate (``n_channels x r``),
leaves it as (docs/ALGORITHMS.md section 1.9):

1. every column divided by its norm and given a canonical sign (its entry of largest magnitude
   positive), so that every column is a unit vector whatever the data;
2. plus Gaussian noise of standard deviation ``sigma * 2 sqrt(r)`` in every entry: two releases of
   unit columns differ by at most 2 per column, ``2 sqrt(r)`` in the Frobenius norm, whatever data
   either site holds, so the release is ``(dp_epsilon, dp_delta)``-differentially private **per
   site** (the site's whole data replaced). No per-record bound is claimed: one sample can move a
   local ICA's estimate anywhere on the sphere.

The site declares one sample (its size is not released) and leaves out its solver's iterations and
convergence (they depend on its data). ``sigma`` is the noise multiplier of one Gaussian mechanism
spending ``(dp_epsilon, dp_delta)``, calibrated by dp-accounting's RDP accountant through
:class:`fedica.privacy.PrivacyPlan`; the server renormalises the noisy columns (section 1.4) and
aggregates them as any others. The noise is added by a reply transform (:func:`private_mixing_reply`,
in :data:`fedica.tasks.CLIENT_TASKS`), drawn from the site's ``noise_secret`` (a deployment) or
the run's seed (the library and fedica's local engines), as FedGEM's (section 2.13).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fedica.privacy import NOISE_KEY, SEED_KEY, PrivacyPlan
from fedica.protocol.messages import RFICA_COVARIANCE, RFICA_FIT
from fedica.protocol.tasks import ReplyParts, Site
from fedica.seeding import generator

__all__ = ["RELEASE", "SITE_UNIT", "canonical_columns", "check_covered", "private_mixing", "private_mixing_reply",
           "release_sensitivity", "rfica_plan", "uncovered"]

# The one exchange a private RF-ICA run makes, and its one Gaussian mechanism.
RELEASE = (("mixing", 1),)
# What the privacy protects: one site's whole data (the privacy record's ``unit``).
SITE_UNIT = "client"
# The norm every released column is scaled to before the noise (the privacy record's ``clip``).
COLUMN_NORM = 1.0


def uncovered(parameters: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first RF-ICA parameter a private run (``dp_epsilon`` set) cannot take, and why; None when covered.

    ``parameters`` holds the declared names (``n_components``, ``whitening``, ``benchmark``), as the
    config's ``algorithm`` section and the estimator's parameters do.
    """
    if parameters.get("dp_epsilon") is None:
        return None
    federated = parameters["whitening"] == "federated" or (parameters["whitening"] is None
                                                           and parameters["n_components"] is not None)
    if federated:
        return "whitening", ("a private run releases the mixing alone: take 'local' (the federated whitening's "
                             "covariances have no bounded sensitivity, their scale is the data's)")
    if isinstance(parameters["n_components"], float):
        return "n_components", ("a private run needs a count or null (with a share of the variance each site's "
                                "data would choose how many columns its release has)")
    if parameters["benchmark"] == "largest":
        return "benchmark", "a private run does not release the sites' sizes: take 'medoid' or 'best_objective'"
    if parameters.get("refine_rounds", 0) > 0:
        return "refine_rounds", ("a private run releases the one-shot estimate alone: take 0 (every refinement "
                                 "step would release the site's averages again)")
    return None


def check_covered(parameters: Mapping[str, Any]) -> None:
    """Raise ValueError ``name=value: rule`` (one line) for what a private run cannot take (:func:`uncovered`)."""
    refusal = uncovered(parameters)
    if refusal is not None:
        key, rule = refusal
        raise ValueError(f"{key}={parameters[key]!r}: {rule}")


def rfica_plan(dp_epsilon: float | None, dp_delta: float) -> PrivacyPlan | None:
    """The plan of a private RF-ICA run: one Gaussian mechanism spending ``(dp_epsilon, dp_delta)``; None when off."""
    if dp_epsilon is None:
        return None
    return PrivacyPlan.calibrated(dp_epsilon, dp_delta, COLUMN_NORM, SITE_UNIT, RELEASE)


def release_sensitivity(n_columns: int) -> float:
    """The Frobenius distance two releases of ``n_columns`` unit columns can be apart: 2 per column, ``2 sqrt(r)``."""
    return 2.0 * COLUMN_NORM * np.sqrt(n_columns)


def canonical_columns(mixing: np.ndarray) -> np.ndarray:
    """``mixing`` with unit columns, each signed so that its entry of largest magnitude (the first on ties) is positive.

    ICA cannot tell a column from its negative; fixing the sign makes the release a function of the
    estimate's columns alone. A zero column (no direction at all) is released as the first channel's unit vector.
    """
    mixing = np.asarray(mixing, dtype=np.float64)
    scale = np.max(np.abs(mixing), axis=0)
    zero = scale == 0
    scaled = mixing / np.where(zero, 1.0, scale)  # scale-free norms: no overflow of a column of 1e200s
    unit = scaled / np.where(zero, 1.0, np.linalg.norm(scaled, axis=0))
    unit[:, zero] = np.eye(mixing.shape[0], 1)
    largest = unit[np.argmax(np.abs(unit), axis=0), np.arange(unit.shape[1])]
    return unit * np.where(largest < 0, -1.0, 1.0)


def private_mixing(mixing: np.ndarray, noise_multiplier: float, rng: np.random.Generator) -> np.ndarray:
    """The released estimate: canonical unit columns plus ``N(0, (noise_multiplier * 2 sqrt(r))^2)`` in every entry."""
    unit = canonical_columns(mixing)
    scale = noise_multiplier * release_sensitivity(unit.shape[1])
    return unit + scale * rng.standard_normal(unit.shape)


def _noise_rng(values: Mapping[str, Any], site: Site) -> np.random.Generator:
    """This request's noise at ``site``: the stream ``privacy.noise`` of its secret, else of the run's seed."""
    secret = site.noise_secret
    stage = int(str(values.get("server-round", "1")))
    return generator(int(values[SEED_KEY]) if secret is None else secret, "privacy.noise", site.partition_id, stage)


def private_mixing_reply(task: str, site: Site, arrays: Mapping[str, Any], values: Mapping[str, Any],
                         reply: ReplyParts) -> ReplyParts:
    """The reply transform of private RF-ICA runs: the mixing released through the Gaussian mechanism.

    A request without ``dp-noise`` (every non-private run) and every other algorithm's task pass
    ``reply`` through untouched. A private reply holds the noisy mixing, one declared sample and
    its timing; a private covariance request is refused (the federated whitening is not covered).
    """
    if NOISE_KEY not in values or task not in (RFICA_FIT, RFICA_COVARIANCE):
        return reply
    if task == RFICA_COVARIANCE:
        raise ValueError("a private RF-ICA run releases no covariance (the federated whitening is not covered)")
    noise_multiplier = float(values[NOISE_KEY])
    if not noise_multiplier > 0:
        raise ValueError(f"a private request needs dp-noise > 0, got {noise_multiplier!r}")
    reply_arrays, reply_values = reply
    # A site's flat channels are NaN rows (and its missing components NaN columns, fedica.rfica.local): zeros here, so
    # that the release is unit columns plus noise as for every site. Which channels are flat is a fact of the data the
    # NaN pattern would release outside the mechanism; as zeros it is within the sensitivity, which bounds any two
    # matrices of unit (or canonical, for a zero column) columns.
    released = private_mixing(np.nan_to_num(reply_arrays["mixing"], nan=0.0), noise_multiplier,
                              _noise_rng(values, site))
    return {"mixing": released}, {"n-samples": 1, "fit-seconds": reply_values["fit-seconds"]}
