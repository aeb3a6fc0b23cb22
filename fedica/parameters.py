"""Every algorithm parameter declared once, with its constraint, default and meaning.

scikit-learn's estimators declare ``_parameter_constraints`` with ``Interval`` and ``StrOptions``
(a private module of scikit-learn, so this one takes the idea, not the import). Here a
:class:`Parameter` holds a name, its constraints, its default and one line of meaning; a
:class:`Declaration` holds one algorithm's parameters in order. From :data:`FEDGEM_PARAMETERS`
and :data:`RFICA_PARAMETERS` come:

- the defaults of :class:`fedica.FedGEM`, :class:`fedica.RFICA`, the server's
  :class:`fedica.fedgem.coordinator.FedGEMSettings` and the Flower strategies;
- the checks those run before any work (:meth:`Declaration.check`), each failure one
  ``ValueError`` or ``TypeError`` line ``name=value: rule``;
- the keys of the ``algorithm`` config section and their rules (:mod:`fedica.config`), so that a
  config error reads ``algorithm.name=value: rule`` with the same rule;
- ``conf/algorithm/<name>.yaml``, which ``tests/test_parameters.py`` holds to exactly these keys
  and these defaults (:meth:`Declaration.config_defaults`), so that ``fedica-run`` and the library
  compute the same model;
- the papers' protocols as presets: where the library measured a better setting than the paper's,
  the parameter declares the paper's value apart (``paper=``), and :meth:`Declaration.paper_preset`
  gathers them for ``conf/algorithm/<name>_paper.yaml`` and the estimators' ``paper()``.

The option lists are declared here with their parameters, and the modules that implement the options
import them: this module is the library's bottom layer and imports no algorithm.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any

import numpy as np


__all__ = ["Interval", "Options", "PositiveNumbers", "Parameter", "Declaration", "UPSILON_CRITERIA", "SAME_CLIENT_RULES", "LOCAL_STARTS", "DP_UNITS",
           "FEDGEM_PARAMETERS", "RFICA_PARAMETERS"]

# The option lists of the parameters below, declared with them; the modules that implement each option import
# its list from here (the library's bottom layer: this module imports no algorithm).
# FedGEM: each component's covariance; how a site labels its points with the global model (docs/ALGORITHMS.md
# section 2.8: the nearest centre of its own components' clusters, or the posterior of its own mixture over every
# global centre); the data's standardisation (None: the data's own units).
COVARIANCE_TYPES = ("identity", "spherical", "diag", "full", "auto")
LABELLINGS = ("consensus", "adapted")
STANDARDIZE_MODES = ("federated",)
# RF-ICA: the benchmark site (medoid: chosen from the estimates alone; largest and best_objective let a site's claimed
# n_k decide ties); the clustering of all columns (kmeans, the paper's; matched: one column per site per cluster); a
# cluster's centre (geometric_median, the paper's eq. 7; trimmed_geometric_median, re-taken without the members far
# beyond the cluster's own spread; trimmed_mean, the mean of the same kept members, as efficient as a pooled fit).
BENCHMARK_RULES = ("medoid", "largest", "best_objective")
CLUSTERINGS = ("kmeans", "matched")
CENTERS = ("geometric_median", "trimmed_geometric_median", "trimmed_mean")
# RF-ICA's local ICA: its contrast (cube: the paper's kurtosis, eq. 8; logcosh: robust to outliers), its start, its
# solver (scikit-learn's symmetric FastICA, or python-picard's orthogonal Picard) and how the sites reach the subspace
# of n_components (docs/ALGORITHMS.md section 1.8).
CUBE, LOGCOSH = "cube", "logcosh"
CONTRASTS = (CUBE, LOGCOSH)
INITS = ("random", "shared")
SOLVERS = ("fastica", "picard")
WHITENINGS = ("federated", "local")

# How ``upsilon="auto"`` chooses the final partition (fedica.fedgem.coordinator implements both).
UPSILON_CRITERIA = ("likelihood", "silhouette")
# How the final partition treats two components of one site: never in one global cluster (the paper's rule), or
# joined when the federation's evidence says so and the ICL agrees (docs/ALGORITHMS.md section 2.6.3).
SAME_CLIENT_RULES = ("strict", "evidence")
# How a site starts: the best of n_init k-means++ seedings (the paper's), or Lloyd's k-means refining each.
LOCAL_STARTS = ("seeds", "kmeans")

# Upper bounds of the counts that set a run's time or memory, so that a mistyped 1e9 is refused up front
# instead of running for days or exhausting memory. A FedGEM round is an exchange with every site (milliseconds
# in memory, seconds in a deployment): 10,000 rounds are hours. k-means++'s n_init seedings advance together,
# n_init x (3 + log K_g) x n floats at a site of n points (1,000 seedings of 5,000 points: 0.4 GB; 10^9 asked
# 7.45 GiB of seeds alone). RF-ICA's k-means restarts each cluster all the sites' columns: 1,000 take minutes.
MAX_ROUNDS = 10_000
MAX_SEEDINGS = 1_000
MAX_KMEANS_RESTARTS = 1_000

# What one unit of differential privacy protects (fedica.privacy implements both): one data point of a site
# (record), or everything one site holds (client).
DP_UNITS = ("record", "client")

# Parameter.paper when the paper's protocol uses the library's default.
_SAME_AS_DEFAULT = object()

# A violated rule: the exception to raise (TypeError: no constraint takes a value of this type)
# and the rule, worded "must be ...".
Violation = tuple[type[Exception], str]


def _bound(value: float) -> str:
    return str(int(value)) if isinstance(value, Integral) else str(value)


@dataclass(frozen=True)
class Interval:
    """An integer or a finite real number between two bounds.

    Parameters
    ----------
    kind : {"integer", "real"}
    low, high : float or None
        The bounds; None: unbounded on that side.
    closed : {"left", "right", "both", "neither"}, default="left"
        Which bounds belong to the interval.
    """

    kind: str
    low: float | None = None
    high: float | None = None
    closed: str = "left"

    def __post_init__(self) -> None:
        if self.kind not in ("integer", "real") or self.closed not in ("left", "right", "both", "neither"):
            raise ValueError(f"Interval({self.kind!r}, closed={self.closed!r}): kind is integer or real, closed "
                             "is left, right, both or neither")

    @property
    def _low_open(self) -> bool:
        return self.closed in ("right", "neither")

    @property
    def _high_open(self) -> bool:
        return self.closed in ("left", "neither")

    def range_text(self) -> str:
        """The bounds alone, e.g. ``>= 0`` or ``in [0, 0.5)``."""
        if self.low is not None and self.high is not None:
            return (f"in {'(' if self._low_open else '['}{_bound(self.low)}, {_bound(self.high)}"
                    f"{')' if self._high_open else ']'}")
        if self.low is not None:
            return f"{'>' if self._low_open else '>='} {_bound(self.low)}"
        if self.high is not None:
            return f"{'<' if self._high_open else '<='} {_bound(self.high)}"
        return ""

    def describe(self) -> str:
        """The rule as a noun phrase, for a parameter that takes other values too."""
        if self.kind == "real" and self.low == 0 and self._low_open and self.high is None:
            return "a positive number"
        noun = "an integer" if self.kind == "integer" else "a number"
        return f"{noun} {self.range_text()}".rstrip()

    def violation(self, value: Any) -> Violation | None:
        # The config validator's wording ("must be an integer", "must be >= 0"), the type's rule
        # completed with the bounds, so that one line says everything the value must be.
        noun = "an integer" if self.kind == "integer" else "a finite number"
        whole = f"must be {noun} {self.range_text()}".rstrip()
        if self.kind == "integer":
            if isinstance(value, bool) or not isinstance(value, Integral):
                return TypeError, whole
        else:
            if isinstance(value, bool) or not isinstance(value, Real):
                return TypeError, whole
            if not math.isfinite(value):
                return ValueError, whole
        too_low = self.low is not None and (value < self.low or (self._low_open and value == self.low))
        too_high = self.high is not None and (value > self.high or (self._high_open and value == self.high))
        if not (too_low or too_high):
            return None
        if self.kind == "integer":  # an integer's bounds are reported one at a time, as they are broken
            if too_low:
                return ValueError, f"must be {'>' if self._low_open else '>='} {_bound(self.low)}"
            return ValueError, f"must be {'<' if self._high_open else '<='} {_bound(self.high)}"
        return ValueError, f"must be {self.range_text()}"


@dataclass(frozen=True)
class Options:
    """One string of a fixed set (``values``, a tuple owned by the module that implements them)."""

    values: tuple[str, ...]

    def describe(self) -> str:
        return self.values[0] if len(self.values) == 1 else f"one of {', '.join(self.values)}"

    def violation(self, value: Any) -> Violation | None:
        if isinstance(value, str) and value in self.values:
            return None
        return (ValueError if isinstance(value, str) else TypeError), f"must be {self.describe()}"


@dataclass(frozen=True)
class PositiveNumbers:
    """A non-empty list (or tuple, or 1-D array) of positive finite numbers, each at most ``high`` (when given)."""

    high: float | None = None

    def describe(self) -> str:
        return "a non-empty list of positive numbers" + ("" if self.high is None else f" of at most {_bound(self.high)}")

    def violation(self, value: Any) -> Violation | None:
        if isinstance(value, np.ndarray):
            value = value.tolist() if value.ndim == 1 else None
        if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
            return TypeError, f"must be {self.describe()}"
        positive = [isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                    and (self.high is None or v <= self.high) for v in value]
        if not value or not all(positive):
            return ValueError, f"must be {self.describe()}"
        return None


Constraint = Interval | Options | PositiveNumbers

# upsilon scales the sites' radii: far beyond any radius ratio (every ball already overlaps every other
# at a few hundred), and small enough that a squared radius times it stays finite.
MAX_UPSILON = 1_000_000


@dataclass(frozen=True)
class Parameter:
    """One parameter: its name, what it may be, its default and what it means.

    Parameters
    ----------
    name : str
    constraints : tuple of Interval, Options or PositiveNumbers
        The value must satisfy one of them.
    default : object
        Satisfies the constraints (:class:`Declaration` checks it).
    doc : str
        One line: what the parameter means.
    none : bool, default=False
        None is allowed too (it switches the rule off).
    in_config : bool, default=True
        A key of the config's ``algorithm`` section; False: a library argument only (the config
        has it at the top level, e.g. ``seed``, or not at all).
    paper : object, optional
        The paper's value, where the library's ``default`` is a setting measured better than the
        paper's protocol: the paper preset (``algorithm=<name>_paper``, ``<Estimator>.paper()``)
        takes it, so that the papers' experiments keep the papers' numbers. Omitted: the paper's
        protocol uses ``default`` (:attr:`paper_value`).
    """

    name: str
    constraints: tuple[Constraint, ...]
    default: Any
    doc: str
    none: bool = False
    in_config: bool = True
    paper: Any = field(default=_SAME_AS_DEFAULT)

    @property
    def paper_value(self) -> Any:
        """The value of the paper's protocol: ``paper``, else ``default``."""
        return self.default if self.paper is _SAME_AS_DEFAULT else self.paper

    def violation(self, value: Any) -> Violation | None:
        """The broken rule of ``value``, or None when it is allowed."""
        if value is None and self.none:
            return None
        if len(self.constraints) == 1:
            return self.constraints[0].violation(value)
        broken = [c.violation(value) for c in self.constraints]
        if any(b is None for b in broken):
            return None
        kind = TypeError if all(b[0] is TypeError for b in broken) else ValueError
        return kind, f"must be {' or '.join(c.describe() for c in self.constraints)}"

    def check(self, value: Any) -> Any:
        """Return ``value``, or raise ValueError/TypeError ``name=value: rule`` (one line)."""
        broken = self.violation(value)
        if broken is not None:
            raise broken[0](f"{self.name}={value!r}: {broken[1]}")
        return value


class Declaration(Mapping[str, Parameter]):
    """One algorithm's parameters, in the order of its signature (a read-only mapping by name)."""

    def __init__(self, algorithm: str, *parameters: Parameter):
        self.algorithm = algorithm
        self._parameters = {p.name: p for p in parameters}
        for p in parameters:  # a declaration whose default breaks its own rule is a bug here, not the user's
            if p.violation(p.default) is not None:
                raise AssertionError(f"{algorithm}: the default of {p.name} breaks its rule")
            if p.paper is not _SAME_AS_DEFAULT and (not p.in_config or p.violation(p.paper)):
                raise AssertionError(f"{algorithm}: the paper's value of {p.name} breaks its rule or has no config key")

    def __getitem__(self, name: str) -> Parameter:
        return self._parameters[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._parameters)

    def __len__(self) -> int:
        return len(self._parameters)

    def defaults(self) -> dict[str, Any]:
        """Every parameter's (library) default, by name."""
        return {name: p.default for name, p in self._parameters.items()}

    def config_defaults(self) -> dict[str, Any]:
        """The default of every key of the config's ``algorithm`` section: the library's."""
        return {name: p.default for name, p in self._parameters.items() if p.in_config}

    def paper_preset(self) -> dict[str, Any]:
        """The paper's value of every parameter whose library default differs from it (the paper preset)."""
        return {name: p.paper for name, p in self._parameters.items() if p.paper is not _SAME_AS_DEFAULT}

    @property
    def config_keys(self) -> tuple[str, ...]:
        """The keys of ``conf/algorithm/<algorithm>.yaml`` besides ``name``, in order."""
        return tuple(name for name, p in self._parameters.items() if p.in_config)

    def check(self, values: Mapping[str, Any]) -> None:
        """Check the declared parameters among ``values`` (other keys are ignored), in declaration order.

        Raises
        ------
        TypeError, ValueError
            For the first broken rule: ``name=value: rule``.
        """
        for name, parameter in self._parameters.items():
            if name in values:
                parameter.check(values[name])


def _integer(low: int, high: int | None = None) -> tuple[Interval]:
    return (Interval("integer", low, high, "left" if high is None else "both"),)


def _real(low: float | None = None, high: float | None = None, closed: str = "left") -> tuple[Interval]:
    return (Interval("real", low, high, closed),)


FEDGEM_PARAMETERS = Declaration(
    "fedgem",
    Parameter("rounds", _integer(0, MAX_ROUNDS), 10, "T, the number of collaborative rounds."),
    Parameter("local_steps", _integer(1), 1, "S, EM steps per site per round."),
    Parameter("upsilon", (Interval("real", 0, MAX_UPSILON, "right"), Options(("auto",))), "auto",
              "The final-radius hyperparameter; auto chooses it (and so K_hat) by upsilon_criterion."),
    Parameter("upsilon_grid", (PositiveNumbers(MAX_UPSILON),), (0.1, 0.5, 1.0, 5.0, 10.0, 50.0),
              "The candidates of the upsilon tuning."),
    Parameter("upsilon_criterion", (Options(UPSILON_CRITERIA),), "likelihood",
              "How upsilon=auto chooses: the sites' federated ICL, or their local silhouettes."),
    # The library lets the federation's evidence join a site's over-split (measured: K_hat 68-74 -> 50-51 at 1,000
    # sites, section 6.2's cluster imbalance .927 -> .971, no workload worse, RESULTS.md "A site's over-split");
    # the paper preset keeps the paper's strict rule.
    Parameter("same_client_rule", (Options(SAME_CLIENT_RULES),), "evidence",
              "Two components of one site never share a global cluster (strict), or may when one client or a small "
              "minority of clients hold both clusters and the sites' ICL agrees (evidence).",
              paper="strict"),
    Parameter("guard_factor", _real(0, closed="neither"), 1.5,
              "The tuning prefers K_hat <= guard_factor * sqrt(sum K_g)."),
    Parameter("n_init", _integer(1, MAX_SEEDINGS), 3, "k-means++ seedings per site; the best starts the site."),
    Parameter("local_start", (Options(LOCAL_STARTS),), "seeds",
              "How a site starts: the best of its n_init k-means++ seedings (seeds, the paper's), or Lloyd's "
              "k-means run from each seeding, the best kept (kmeans)."),
    Parameter("silhouette_sample", _integer(10), 1000, "Points per site scored by the tuning's silhouette."),
    Parameter("radius_outlier_factor", _real(1, closed="neither"), 10.0,
              "A ball this many times the median radius takes part in no merge; None: off.", none=True),
    Parameter("count_cap_factor", _real(1), 10.0,
              "The server counts at most this multiple of the median site size for one site; None: no cap.",
              none=True),
    Parameter("component_cap_factor", _real(1), 3.0,
              "A site declaring more than this multiple of the median K_g is not admitted; None: off.", none=True),
    Parameter("max_hostile_fraction", _real(0, 0.5, "left"), 0.25,
              "The share of sites that may be hostile (the support rule of global clusters)."),
    Parameter("max_overlap_pairs", _integer(1), 20_000_000,
              "Memory budget of one server step, in overlapping pairs of balls; None: no budget.", none=True),
    Parameter("participation", _real(0, 1, "right"), 1.0, "Share of the sites asked in each round."),
    # The family and K chosen together by the federation's BIC, as the central analyst's GMM chooses them (issue 44):
    # measured on seven real data sets against scikit-learn's GaussianMixture whose family and K the BIC choose on
    # the pooled points, K within one of its in 159 of 189 runs where spherical gave 67 (RESULTS.md, "Covariance
    # families"); the paper preset keeps the paper's identity covariance.
    Parameter("covariance_type", (Options(COVARIANCE_TYPES),), "auto",
              "Each component's covariance: spherical (sigma_k^2 I, learned by its site) or identity (the paper's); diag, "
              "full or auto join the sites' spheres into global clusters of that family (auto: the family too) by its BIC.",
              paper="identity"),
    # The library labels a site's points with its own mixture over every global centre (measured: global ARI .933 ->
    # .995 at 1,000 sites, the real data sets' mean .525 -> .560, RESULTS.md "How a site labels its points"); the
    # paper preset keeps the paper's consensus model.
    Parameter("labelling", (Options(LABELLINGS),), "adapted",
              "How a site labels its points: the nearest centre of its own components' clusters (consensus, the "
              "paper's), or its own mixture over every global centre, weights fitted to its points (adapted).",
              paper="consensus"),
    # On by default, so that no feature's unit changes the result (issue 44): measured against the central analyst's
    # GMM on seven real data sets in their own units (RESULTS.md, "Federated equals central"); the paper preset keeps
    # the data's units, and a private run must (its sites' moments would leave them without noise).
    Parameter("standardize", (Options(STANDARDIZE_MODES),), "federated",
              "Every feature centred and scaled by one location and scale the sites agree on before anything else "
              "(federated: medians over the sites of their column moments, one more exchange); None: the data's "
              "own units.", none=True, paper=None),
    Parameter("min_clients", _integer(1), 2, "Fewest valid sites a round needs.", in_config=False),
    Parameter("max_local_clusters", _integer(2), 10,
              "Largest K_g tried when a site's number of clusters is estimated.", in_config=False),
    Parameter("random_state", _integer(0), 0, "Seeds every random stream (the config's seed).", in_config=False),
    # Differential privacy of what the sites send (fedica.privacy, docs/ALGORITHMS.md section 2.13).
    Parameter("dp_epsilon", _real(0, closed="neither"), None,
              "The whole run's privacy budget epsilon; None: no noise, every result as without privacy.", none=True),
    Parameter("dp_delta", _real(0, 1, "neither"), 1e-5, "The privacy budget's delta (with dp_epsilon)."),
    Parameter("dp_clip", _real(0, closed="neither"), None,
              "Norm bound of a point in the data's units (points are clipped to it); needed with dp_epsilon.",
              none=True),
    Parameter("dp_unit", (Options(DP_UNITS),), "record", "What the privacy protects: one data point of a site (record), or a site's whole data (client)."),
)

RFICA_PARAMETERS = Declaration(
    "rfica",
    # logcosh halves the sites' error on every workload of issue 23 (docs/RESULTS.md, "The sites' solver and
    # contrast"); the paper preset keeps the paper's kurtosis.
    Parameter("contrast", (Options(CONTRASTS),), LOGCOSH,
              "The local ICA's contrast: logcosh (robust to outliers) or the paper's cube (kurtosis).",
              paper=CUBE),
    Parameter("init", (Options(INITS),), "random", "Each site's own random FastICA start, or one shared by all."),
    # Picard converges where FastICA reaches its iterations (a noisy site; 64 channels: 100 sites in 51 s where
    # FastICA had not finished after 13 min); the paper preset keeps the paper's FastICA.
    Parameter("local_solver", (Options(SOLVERS),), "picard",
              "The sites' ICA: Picard's orthogonal mode (python-picard, the solver of MNE's ICA) or the paper's "
              "FastICA.", paper="fastica"),
    Parameter("n_components", (Interval("integer", 1), Interval("real", 0, 1, "neither")), None,
              "The components estimated: a count, or a share of the variance kept; None: every channel.", none=True),
    Parameter("whitening", (Options(WHITENINGS),), None,
              "The subspace of n_components: the server's robust one (one more exchange) or each site's own; "
              "None: federated when n_components is set, local otherwise.", none=True),
    Parameter("benchmark", (Options(BENCHMARK_RULES),), "medoid", "The site the others' signs are aligned to."),
    Parameter("kmeans_restarts", _integer(1, MAX_KMEANS_RESTARTS), 10, "k-means restarts of the server's clustering of columns."),
    Parameter("gm_tol", _real(0, closed="neither"), 1e-10, "Tolerance of the geometric median."),
    # matched measured better or equal on every workload (docs/RESULTS.md); the paper's runs keep k-means.
    Parameter("clustering", (Options(CLUSTERINGS),), "matched",
              "The server's clustering of columns: matched (one column per site per cluster) or the paper's k-means.",
              paper="kmeans"),
    # trimmed_mean measured as robust as the trimmed median on every attack and as accurate as a pooled fit on honest
    # sites, where a median of a few estimates is not (docs/RESULTS.md); the paper preset keeps the plain median.
    Parameter("center", (Options(CENTERS),), "trimmed_mean",
              "Each cluster's centre: the mean of the members within the cluster's spread of its geometric median, "
              "the geometric median re-taken without the others, or the paper's plain geometric median.",
              paper="geometric_median"),
    # The refinement brings the one-shot estimate to the pooled FastICA's accuracy where the sites' own estimates
    # fall short (docs/RESULTS.md, issue 23); the paper preset keeps the paper's one-shot protocol.
    Parameter("refine_rounds", _integer(0, MAX_ROUNDS), 20,
              "Most steps of the federated FastICA refinement after the one-shot aggregate (one exchange each, "
              "stopping once converged); 0: the paper's one-shot protocol.", paper=0),
    Parameter("min_clients", _integer(1), 2, "Fewest valid sites the round needs.", in_config=False),
    Parameter("random_state", _integer(0), 0, "Seeds every random stream (the config's seed).", in_config=False),
    # Differential privacy of the one release, per site (fedica.rfica.privacy, docs/ALGORITHMS.md section 1.9).
    Parameter("dp_epsilon", _real(0, closed="neither"), None,
              "The release's privacy budget epsilon, per site; None: no noise, every result as without privacy.",
              none=True),
    Parameter("dp_delta", _real(0, 1, "neither"), 1e-5, "The privacy budget's delta (with dp_epsilon)."),
    # A library argument: fedica-run's in-process engine has its own (engine.n_jobs).
    Parameter("n_jobs", (Interval("integer", 1), Interval("integer", None, -1, "right")), None,
              "Threads on which the sites compute (fedica.concurrency): None one, -1 every core; the result is "
              "the same for every value.", none=True, in_config=False),
)

# The declaration of each algorithm of the config's ``algorithm.name``.
DECLARATIONS = {"rfica": RFICA_PARAMETERS, "fedgem": FEDGEM_PARAMETERS}
