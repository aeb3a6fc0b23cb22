"""Differential privacy's accounting, shared by both algorithms: the plan of a private run and what it spends.

:class:`PrivacyPlan` holds a run's budget and the noise multiplier that makes the RDP composition of its
exchanges' Gaussian mechanisms (``dp-accounting``'s accountant) spend exactly ``(dp_epsilon, dp_delta)``; the
request keys carry the plan to the sites. Each algorithm's mechanisms live with it: FedGEM's in
:mod:`fedica.fedgem.privacy` (docs/ALGORITHMS.md section 2.13), RF-ICA's in :mod:`fedica.rfica.privacy`
(section 1.9).

Whose seed the noise is drawn from is the site's ``noise_secret`` (:class:`fedica.protocol.tasks.Site`):

- **simulation: reproducible noise.** The library's sites and those of fedica's in-process and
  simulation engines, where the server and the sites are one user's process, take None: the
  noise is drawn from the run's seed, so an experiment is reproducible from its config (and the
  guarantee protects the points from whoever sees the replies, not from the run's own server);
- **deployment: secret noise.** A ClientApp site elsewhere draws it from a secret of its own: its
  node config's ``dp-noise-seed`` (an int its operator chooses), else fresh OS entropy drawn once
  per site and run. The server, which knows the run's seed, cannot regenerate and subtract it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fedica.parameters import DP_UNITS

__all__ = ["CLIP_KEY", "DP_UNITS", "NOISE_KEY", "NOISE_SECRET_KEY", "SECRET_NOISE", "SEEDED_NOISE", "SEED_KEY", "UNIT_KEY",
           "PrivacyPlan", "spent_epsilon"]

# The request values that carry the plan to the sites.
NOISE_KEY, CLIP_KEY, SEED_KEY = "dp-noise", "dp-clip", "dp-seed"
# Sent only by a per-client run, so that a per-record run's requests stay what they were.
UNIT_KEY = "dp-unit"

# The node-config key of a deployed site's secret noise seed, chosen by the site's operator.
NOISE_SECRET_KEY = "dp-noise-seed"

# What a result's ``privacy.noise`` says of the noise's seed (see the module docstring).
SEEDED_NOISE = "seeded by the run (simulation)"
SECRET_NOISE = "secret at each site"

# dp-accounting is imported by the server of a private run only: its import (scipy.signal, mpmath)
# takes seconds, which neither a site nor a run without dp_epsilon should pay.


def _accountant():
    from dp_accounting import rdp

    return rdp.RdpAccountant()


def _events(noise_multiplier: float, exchanges: Sequence[tuple[str, int]]):
    """The run's mechanisms: each exchange's ``n`` Gaussian mechanisms of multiplier ``noise_multiplier``."""
    import dp_accounting

    return dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(noise_multiplier), n) for _, n in exchanges])


def spent_epsilon(noise_multiplier: float, exchanges: Sequence[tuple[str, int]], delta: float) -> float:
    """The RDP accountant's epsilon at ``delta`` of the mechanisms of ``exchanges`` (see :func:`_events`)."""
    accountant = _accountant()
    accountant.compose(_events(noise_multiplier, exchanges))
    return float(accountant.get_epsilon(delta))


@dataclass(frozen=True)
class PrivacyPlan:
    """The noise of a private run and what it spends.

    Parameters
    ----------
    epsilon, delta : float
        The whole run's budget.
    clip : float
        The norm bound of a point, in the data's units.
    unit : str
        The neighbouring relation (one of :data:`DP_UNITS`).
    exchanges : tuple of (str, int)
        Each exchange's label and how many Gaussian mechanisms it releases, in protocol order.
    noise_multiplier : float
        ``sigma``: every mechanism's noise standard deviation over its sensitivity, calibrated so
        that the composition of all ``exchanges`` spends ``epsilon`` at ``delta``.
    """

    epsilon: float
    delta: float
    clip: float
    unit: str
    exchanges: tuple[tuple[str, int], ...]
    noise_multiplier: float

    @classmethod
    def calibrated(cls, epsilon: float, delta: float, clip: float, unit: str,
                   exchanges: Sequence[tuple[str, int]]) -> PrivacyPlan:
        """The plan whose noise multiplier makes the RDP composition of ``exchanges`` spend ``(epsilon, delta)``."""
        import dp_accounting

        exchanges = tuple((str(label), int(n)) for label, n in exchanges)
        sigma = dp_accounting.calibrate_dp_mechanism(
            _accountant, lambda s: _events(s, exchanges), epsilon, delta,
            dp_accounting.LowerEndpointAndGuess(1e-3, 1.0), tol=1e-6)
        return cls(float(epsilon), float(delta), float(clip), unit, exchanges, float(sigma))

    def request_values(self, seed: int) -> dict[str, Any]:
        """What a site needs to add the noise: the multiplier, the clip, the seed of its stream (and a per-client unit)."""
        values: dict[str, Any] = {NOISE_KEY: self.noise_multiplier, CLIP_KEY: self.clip, SEED_KEY: int(seed)}
        if self.unit == "client":
            values[UNIT_KEY] = self.unit
        return values

    def record(self, noise: str = SEEDED_NOISE) -> dict[str, Any]:
        """The ``privacy`` section of a result: the total spent, and each exchange's own and cumulative epsilon.

        ``noise`` (:data:`SEEDED_NOISE` or :data:`SECRET_NOISE`) says whose seed the sites drew the noise from.
        """
        if noise not in (SEEDED_NOISE, SECRET_NOISE):
            raise ValueError(f"noise must be {SEEDED_NOISE!r} or {SECRET_NOISE!r}, got {noise!r}")
        per_exchange = []
        for i, (label, n) in enumerate(self.exchanges):
            per_exchange.append({"exchange": label, "mechanisms": n,
                                 "epsilon": spent_epsilon(self.noise_multiplier, self.exchanges[i:i + 1], self.delta),
                                 "cumulative_epsilon": spent_epsilon(self.noise_multiplier, self.exchanges[:i + 1],
                                                                     self.delta)})
        return {"epsilon": spent_epsilon(self.noise_multiplier, self.exchanges, self.delta), "delta": self.delta,
                "target_epsilon": self.epsilon, "unit": self.unit, "clip": self.clip, "accountant": "rdp",
                "mechanism": "gaussian", "noise_multiplier": self.noise_multiplier, "noise": noise,
                "exchanges": per_exchange}
