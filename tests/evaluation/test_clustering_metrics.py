"""The ARI kernels equal scikit-learn's adjusted_rand_score bit for bit, and forged counts cannot overflow them."""

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from fedica.evaluation.metrics import adjusted_rand, ari_from_contingency, contingency, leave_one_out_aris
from fedica.metrics import PooledTables


def _labelings(seed: int, count: int):
    rng = np.random.default_rng(seed)
    for case in range(count):
        n = int(rng.integers(1, 400))
        true = rng.integers(0, rng.integers(1, 12), n)
        pred = rng.integers(-3, rng.integers(-2, 60), n)
        if case % 5 == 0:
            pred = true.copy()  # identical: sklearn's special case
        if case % 7 == 0:
            pred = np.zeros(n, dtype=int)  # one predicted cluster
        yield true, pred


def test_adjusted_rand_equals_scikit_learn_bit_for_bit():
    for true, pred in _labelings(0, 500):
        assert adjusted_rand(true, pred) == adjusted_rand_score(true, pred)


def test_the_pooled_ari_from_triplets_equals_scikit_learn_on_the_pooled_labels():
    for true, pred in _labelings(1, 200):
        half = true.size // 2
        triplets = [np.concatenate(parts) for parts in zip(contingency(true[:half], pred[:half]),
                                                            contingency(true[half:], pred[half:]))]
        assert ari_from_contingency(*triplets) == adjusted_rand_score(true, pred)


def test_labels_of_any_kind_and_empty_labelings():
    assert adjusted_rand(["a", "b", "a"], ["x", "x", "y"]) == adjusted_rand_score(["a", "b", "a"], ["x", "x", "y"])
    assert adjusted_rand([], []) == 1.0
    with pytest.raises(ValueError, match="equal length"):
        adjusted_rand([0, 1], [0])


def test_forged_counts_beyond_int64_squares_give_a_finite_ari_in_range():
    # 1e18 squared overflows int64; the pair counts are then taken in Python integers.
    value = ari_from_contingency([0, 0, 1, 1], [0, 1, 0, 1], [10**18, 3, 7, 10**18])
    assert -1.0 <= value <= 1.0 and np.isfinite(value)
    small = ari_from_contingency([0, 0, 1, 1], [0, 1, 0, 1], [10**6, 3, 7, 10**6])
    assert value == pytest.approx(1.0, abs=1e-9) and small < value


def _pooled_without(tables, left_out):
    kept = [table for g, table in enumerate(tables) if g != left_out]
    if not kept:
        return 1.0
    return ari_from_contingency(*(np.concatenate([np.asarray(table[i]) for table in kept]) for i in range(3)))


@pytest.mark.parametrize("seed", range(4))
def test_leave_one_out_aris_equal_the_pooled_ari_recomputed_without_each_table_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    tables = [contingency(true, pred) for true, pred in _labelings(seed, 25)]
    # A forged table repeating a pair, and an empty one.
    tables.append((np.array([0, 0, 1]), np.array([2, 2, 5]), np.array([4, 9, 0])))
    tables.append((np.empty(0, dtype=int), np.empty(0, dtype=int), np.empty(0, dtype=np.int64)))
    rng.shuffle(tables)
    pooled, without = leave_one_out_aris(tables)
    assert pooled == _pooled_without(tables, -1)
    assert without.tolist() == [_pooled_without(tables, g) for g in range(len(tables))]


def test_leave_one_out_aris_of_huge_forged_counts_stay_exact():
    tables = [([0, 0], [0, 1], [10**18, 3]), ([1, 1], [0, 1], [7, 10**18]), ([0, 1], [0, 0], [5, 5])]
    pooled, without = leave_one_out_aris(tables)
    assert pooled == _pooled_without(tables, -1)
    assert without.tolist() == [_pooled_without(tables, g) for g in range(3)]
    assert leave_one_out_aris([tables[2]])[1].tolist() == [1.0]


@pytest.mark.parametrize("seed", range(3))
def test_pooled_tables_taken_out_and_put_back_give_the_recomputed_ari_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    tables = [contingency(true, pred) for true, pred in _labelings(seed + 10, 20)]
    tables.append((np.array([0, 0, 1]), np.array([2, 2, 5]), np.array([4, 9, 0])))
    tables.append((np.empty(0, dtype=int), np.empty(0, dtype=int), np.empty(0, dtype=np.int64)))
    pool = PooledTables(tables)
    for _ in range(60):
        table = int(rng.integers(len(tables)))
        pool.put_back(table) if not pool.in_pool[table] else pool.take_out(table)
        members = [tables[g] for g in np.flatnonzero(pool.in_pool)]
        expected = ari_from_contingency(*(np.concatenate([np.asarray(t[i]) for t in members]) for i in range(3))) \
            if members else 1.0
        assert pool.ari() == expected
    with pytest.raises(ValueError, match="already in the pool"):
        pool.put_back(int(np.flatnonzero(pool.in_pool)[0]))


def test_pooled_tables_of_huge_forged_counts_stay_exact():
    tables = [([0, 0], [0, 1], [10**18, 3]), ([1, 1], [0, 1], [7, 10**18]), ([0, 1], [0, 0], [5, 5])]
    pool = PooledTables(tables)
    pool.take_out(1)
    assert pool.ari() == _pooled_without(tables, 1)
