"""A contingency table no honest client's could be is not counted in the reported metrics (issue 25, item 3b;
fedica.fedgem.trust.outlying_tables)."""

import numpy as np
import pytest

from fedica import attacks
from fedica.evaluation.metrics import ari_from_contingency
from fedica.fedgem.trust import outlying_tables, table_influences


def _honest_table(rng, agreement=0.96, n_points=250):
    """A client's 250 test points over 10 clusters, ``agreement`` of them on the diagonal."""
    labels = rng.integers(0, 10, n_points)
    predicted = np.where(rng.random(n_points) < agreement, labels, rng.integers(0, 10, n_points))
    pairs, counts = np.unique(np.c_[labels, predicted], axis=0, return_counts=True)
    return pairs[:, 0], pairs[:, 1], counts


def _forged_table():
    """A self-consistent forgery: 9.9 x a client's 250 points spread evenly over every label and id, with its own ARI."""
    true_values, pred_values, counts, local_ari = attacks.consistent_forgery(np.arange(10), np.arange(10), 2475)
    assert local_ari == pytest.approx(ari_from_contingency(true_values, pred_values, counts))
    return true_values, pred_values, counts


def _pooled(tables):
    return ari_from_contingency(*(np.concatenate([table[i] for table in tables]) for i in range(3)))


def test_one_self_consistent_forger_of_twenty_is_not_counted_and_the_pooled_ari_is_the_honest_one():
    rng = np.random.default_rng(2)
    honest = [_honest_table(rng) for _ in range(19)]
    tables = honest[:7] + [_forged_table()] + honest[7:]
    # Before: the pooled ARI fell from .92 to .41 (and to .79 with the table capped at its client's share).
    assert _pooled(honest) - _pooled(tables) > 0.25
    uncapped = np.full(len(tables), np.inf)
    outliers = outlying_tables(tables, uncapped, 0.25)
    assert list(outliers) == [7] and "lowers the pooled ARI" in outliers[7]
    assert _pooled([t for i, t in enumerate(tables) if i not in outliers]) == _pooled(honest)
    # Counted at its client's share (1.5 x a typical client's), it is still an outlier; no rule without hostile
    # clients assumed.
    assert list(outlying_tables(tables, np.full(len(tables), 375), 0.25)) == [7]
    assert outlying_tables(tables, uncapped, 0.0) == {}


def test_five_colluding_forgers_are_set_aside_one_by_one_and_a_poor_honest_client_stays():
    rng = np.random.default_rng(3)
    tables = [_honest_table(rng) for _ in range(14)] + [_honest_table(rng, agreement=0.6)]
    forgers = list(range(len(tables), len(tables) + 5))
    tables += [_forged_table() for _ in forgers]
    # With all five in the pool, one forger's effect on the others is masked by the other four ...
    typical = np.full(len(tables), 250)
    together = table_influences(tables, np.ones(len(tables), dtype=bool), typical)[forgers[0]]
    alone = table_influences(tables, np.arange(len(tables)) <= forgers[0], typical)[forgers[0]]
    assert alone < 1.5 * together < 0
    # ... but setting the worst aside, again and again, finds them all, and only them.
    uncapped = np.full(len(tables), np.inf)
    assert sorted(outlying_tables(tables, uncapped, 0.25)) == forgers
    # With a lower share assumed hostile only as many as may be are set aside.
    assert len(outlying_tables(tables, uncapped, 0.2)) == 4


def test_honest_tables_of_unequal_quality_are_all_counted():
    rng = np.random.default_rng(4)
    tables = [_honest_table(rng, agreement=a, n_points=n) for a, n in zip(np.linspace(0.5, 1.0, 10),
                                                                             [40, 80, 120, 250, 250, 250, 500, 800, 1000, 60])]
    assert outlying_tables(tables, np.full(len(tables), np.inf), 0.25) == {}
    influences = table_influences(tables, np.r_[False, np.ones(9, dtype=bool)], np.full(len(tables), np.inf))
    assert np.isnan(influences[0]) and np.all(np.isfinite(influences[1:]))


BLOBS_G20_K10 = ["engine=inprocess", "algorithm=fedgem", "scenario=blobs", "scenario.n_clients=20",
                 "scenario.n_clusters=10", "baselines=false", "seed=0"]


def test_self_consistent_forgers_at_a_quarter_move_no_reported_metric():
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    # Before: reported global ARI .09 and local .22 (honest .963 and .969).
    result = run_inprocess(compose_config(BLOBS_G20_K10 + ["attack=consistent_forgery", "attack.fraction=0.25"]))
    metrics, hostile = result["metrics"]["fedgem"], result["fedgem"]["hostile_clients"]
    refused = sorted(r["client"] for r in result["clients"]["rejected"]
                     if r["round"] == "evaluate" and "lowers the pooled ARI" in r["reason"])
    assert refused == hostile
    assert metrics["global_ari"] == pytest.approx(metrics["honest_global_ari"])
    assert metrics["local_ari"] == pytest.approx(metrics["honest_local_ari"])
    assert metrics["k_hat"] == 10
