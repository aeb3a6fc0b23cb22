"""FedGEM's rule on the evaluation's contingency tables: how much each table counts, and which no honest
client's could be (docs/ALGORITHMS.md section 2.5, "Tables no honest client's could be are not counted").

The evaluation stage (:class:`fedica.fedgem.evaluation.EvaluationStage`) caps each table at its
client's test share (:func:`table_caps`, :func:`capped_table`) and leaves out the tables, alone or
colluding, that lower the others' pooled ARI beyond what an honest client's can
(:func:`outlying_tables`); the rest of the server's defences are :mod:`fedica.fedgem.trust`'s.
"""

from __future__ import annotations

import math

import numpy as np

from fedica.fedgem.trust import hostile_count
from fedica.metrics import PooledTables, leave_one_out_aris
from fedica.sites import apportion

# A client's contingency table counts with at most this multiple of the median client's test points
# per training point (every site's test share is the same, up to rounding on tiny sites).
TEST_SHARE_SLACK = 1.5

# A client's contingency table is not counted when it lowers the pooled ARI of the others by more than this over the
# number of clients (its effect per share of the pool). Measured: honest clients' effects reach -0.97 / G in the
# paper's own workloads (section 6.2's client imbalance, R_min 6: the large site, whose four peers agree exactly),
# -0.66 / G (cluster imbalance), -0.53 / G (MNIST by sizes, G=100), -1.6 / G on iris split by classes over 10
# sites; a table spread evenly over every label and id, -1.8 / G among 19 honest ones.
TABLE_INFLUENCE_LIMIT = 1.0
# A group of j tables is held to max(sqrt(j) TABLE_INFLUENCE_LIMIT, TABLE_GROUP_TAIL j s) / G, s the median effect
# (times G, either way) of a table of the federation less its 2 floor(a G) most harmful tables: colluders that
# each keep under the limit while masking each other lower the ARI together by about j times one's effect, honest
# tables (the most harmful first) by less. The tail term keeps a large federation's honest tail counted: of 10,000
# honest tables the 246 most harmful lowered the ARI by 15.7 / G together (2.8 deviations each, s 0.6 of one)
# (docs/ALGORITHMS.md section 2.5).
TABLE_GROUP_TAIL = 8.0
# ... and to at least sqrt(j) TABLE_GROUP_SAMPLING / sqrt(m) / G, m the median table's test points: on wine split over
# 10 sites (5 test points a site) two honest tables lowered the others' ARI by 1.7 / G together.
TABLE_GROUP_SAMPLING = 3.0
# ... and never below this much of the pooled ARI (j >= 2): the precision results are judged at (issue targets compare
# global ARIs at .01). Without it the bound sqrt(j) / G shrinks with G while an honest federation's tail does not: at
# G=10,000 (blobs K=50, 10 test points a site, global ARI .9969) the 126 tables holding a point labelled apart,
# 0.16 / G each, lowered it together by .0024 and were set aside as colluding. What colluders may still do unseen
# is lower the reported ARI by this much, which the sqrt(floor(a G)) / G bound already allows at G=2,500 and below.
TABLE_GROUP_FLOOR = 0.01
# The spread of table_spread is of the pool less this many times as many tables as may be hostile: with more hostile
# tables than assumed, the trimmed pool is still theirs to pollute only beyond twice the assumption.
TRIM_FACTOR = 2


def capped_table(counts: np.ndarray, cap: float) -> np.ndarray:
    """A client's contingency counts scaled down to at most ``cap`` test points in all (integers, largest remainders first).

    A table within the cap is returned as it is; one above it keeps its proportions.
    """
    counts = np.asarray(counts, dtype=np.int64)
    if int(counts.sum()) <= cap:
        return counts
    return apportion(int(cap), counts.astype(np.float64))


def table_caps(test_totals: np.ndarray, declared: np.ndarray, counted: np.ndarray, hostile_fraction: float) -> np.ndarray:
    """The most test points each client's contingency table counts with in the pooled ARI (inf: no cap).

    Every client's test share is the same (a scenario splits each site's data alike), so a table
    counts with at most :data:`TEST_SHARE_SLACK` times the median client's test points per declared
    training point, times the client's counted training points (its declared count, capped at
    ``count_cap_factor`` times the median): a forged table far larger than the client's own share
    weighs as a table of that share. Honest tables are never scaled.

    Parameters
    ----------
    test_totals, declared, counted : ndarray of shape (n_clients,)
    hostile_fraction : float
        0 switches the cap off.

    Returns
    -------
    caps : ndarray of shape (n_clients,)
    """
    counted = np.asarray(counted, dtype=np.float64)
    if hostile_fraction <= 0 or counted.size == 0:
        return np.full(counted.shape, np.inf)
    share = float(np.median(np.asarray(test_totals, dtype=np.float64) / np.asarray(declared, dtype=np.float64)))
    return np.floor(TEST_SHARE_SLACK * share * counted)


def table_influences(tables: list[tuple[np.ndarray, np.ndarray, np.ndarray]], counted: np.ndarray,
                     sizes: np.ndarray) -> np.ndarray:
    """Each client's effect on the pooled ARI of the ``counted`` others: ARI(the others and it) - ARI(the others).

    Each table takes part with at most ``sizes`` test points (a larger one scaled down with its
    proportions, :func:`capped_table`). NaN where ``counted`` is False.

    Parameters
    ----------
    tables : list of (true_values, pred_values, counts)
        Each client's contingency triplets.
    counted : ndarray of shape (n_clients,), dtype bool
    sizes : ndarray of shape (n_clients,)

    Returns
    -------
    influences : ndarray of shape (n_clients,)
    """
    influences = np.full(len(tables), np.nan)
    members = np.flatnonzero(counted)
    if members.shape[0] < 2:
        return influences
    everyone, without = leave_one_out_aris([(tables[g][0], tables[g][1], capped_table(tables[g][2], sizes[g]))
                                            for g in members.tolist()])
    influences[members] = everyone - without
    return influences


def table_spread(tables: list[tuple[np.ndarray, np.ndarray, np.ndarray]], sizes: np.ndarray, counted: np.ndarray,
                 influences: np.ndarray, hostile_fraction: float) -> float:
    """The median effect of a table on the others' pooled ARI (its size, times G) once the ``2 floor(a G)`` most
    harmful of the ``counted`` tables (by ``influences``) are out: how far honest tables move the ARI on this data,
    which tables that lower it (hostile ones among them) cannot raise by making every other table's effect large."""
    n_clients = len(tables)
    trimmed = min(TRIM_FACTOR * hostile_count(n_clients, hostile_fraction), int(counted.sum()) // 2)
    kept = counted.copy()
    kept[np.argsort(np.where(counted, influences, np.inf), kind="stable")[:trimmed]] = False
    return float(np.nanmedian(np.abs(n_clients * table_influences(tables, kept, sizes))))


def outlying_tables(tables: list[tuple[np.ndarray, np.ndarray, np.ndarray]], caps: np.ndarray,
                    hostile_fraction: float) -> dict[int, str]:
    """The clients (indices into ``tables``) whose contingency tables no honest client's could be, with the reason.

    Each table's effect is measured at two weights: at most a typical client's test points (the
    median client's: the measure of its labels, not of the points it claims) and at the size it
    counts with in the reported metric (``caps``, :func:`table_caps`); the more harmful counts.
    A table whose effect on the others' pooled ARI (:func:`table_influences`) is below minus the
    :data:`TABLE_INFLUENCE_LIMIT` over G is not counted. So that colluding
    tables cannot each hide behind the others (with several in the pool, each one's own effect is
    masked by the rest), the j most harmful tables are also taken out together, for every j up to
    as many as may be hostile: a group that lowers the pooled ARI by more than
    ``max(sqrt(j) L_g / G, TABLE_GROUP_TAIL j spread / G, TABLE_GROUP_FLOOR)`` (``L_g`` the limit, or more on a
    few test points a table; ``spread``: :func:`table_spread`) loses the member that alone lowers the
    others' (the pool without the group) most. Then everything is measured again without it, at
    most as many times as there may be hostile clients. ``hostile_fraction`` 0, or fewer than three
    tables, switches the rule off.
    """
    n_clients = len(tables)
    outliers: dict[int, str] = {}
    if hostile_fraction <= 0 or n_clients < 3:
        return outliers
    caps = np.asarray(caps, dtype=np.float64)
    typical = np.minimum(caps, float(np.median([int(table[2].sum()) for table in tables])))
    weighings = [typical, caps]
    limit = TABLE_INFLUENCE_LIMIT
    # On a few test points a site, one honest point labelled apart moves a table's effect by about 1 / sqrt(m).
    group_limit = max(limit, TABLE_GROUP_SAMPLING / math.sqrt(max(float(np.median(typical)), 1.0)))
    pools = [PooledTables([(t[0], t[1], capped_table(t[2], size)) for t, size in zip(tables, sizes)]) for sizes in weighings]
    budget = hostile_count(n_clients, hostile_fraction)
    counted = np.ones(n_clients, dtype=bool)
    spread = None
    while len(outliers) < budget:
        influences = np.fmin.reduce([table_influences(tables, counted, sizes) for sizes in weighings])
        order = [int(g) for g in np.argsort(np.where(counted, influences, np.inf), kind="stable")[:budget - len(outliers)]]
        group_effects = _group_effects(pools, order)
        sizes_j = np.arange(1, len(order) + 1)
        thresholds = np.where(sizes_j == 1, limit / n_clients,
                              np.maximum(np.sqrt(sizes_j) * group_limit / n_clients, TABLE_GROUP_FLOOR))
        if np.any(group_effects[1:] < -thresholds[1:]):
            if spread is None:  # measured once, and only when a group is beyond sqrt(j): a large federation's tail
                spread = max(table_spread(tables, sizes, counted, influences, hostile_fraction) for sizes in weighings)
            thresholds = np.maximum(thresholds, np.where(sizes_j == 1, 0.0, TABLE_GROUP_TAIL * sizes_j * spread) / n_clients)
        failing = np.flatnonzero(group_effects < -thresholds)
        if failing.size == 0:
            break
        size = int(failing[0]) + 1
        group = order[:size]
        alone = _effects_alone(pools, group)
        worst = group[int(np.argmin(alone))]
        others = int(counted.sum()) - 1
        if size == 1:
            outliers[worst] = (f"its contingency table lowers the pooled ARI of the {others} other counted clients by "
                               f"{-alone.min():.3g}, more than {limit:g} / {n_clients} clients "
                               f"(its labels disagree with the federation's beyond any honest client's)")
        else:
            outliers[worst] = (f"its contingency table lowers the pooled ARI of the {others} other counted clients by "
                               f"{-alone.min():.3g} without the {size - 1} other tables that, each less alone, lower it "
                               f"by {-group_effects[size - 1]:.3g} together with it, more than "
                               f"{thresholds[size - 1]:.3g} for {size} of {n_clients} clients (colluding tables)")
        counted[worst] = False
        for pool in pools:
            pool.take_out(worst)
    return outliers


def _group_effects(pools: list[PooledTables], order: list[int]) -> np.ndarray:
    """The pooled ARI minus the ARI without the first j tables of ``order``, for every j (the more harmful weighing)."""
    effects = np.full(len(order), np.inf)
    for pool in pools:
        everyone = pool.ari()
        for j, table in enumerate(order):
            pool.take_out(table)
            effects[j] = min(effects[j], everyone - pool.ari())
        for table in order:
            pool.put_back(table)
    return effects


def _effects_alone(pools: list[PooledTables], group: list[int]) -> np.ndarray:
    """Each member's effect on the pool without the whole ``group`` (the others' masking taken away)."""
    effects = np.full(len(group), np.inf)
    for pool in pools:
        for table in group:
            pool.take_out(table)
        rest = pool.ari()
        for index, table in enumerate(group):
            pool.put_back(table)
            effects[index] = min(effects[index], pool.ari() - rest)
            pool.take_out(table)
        for table in group:
            pool.put_back(table)
    return effects
