"""Properties of the FedGEM clustering scenarios (fedica.data)."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import pdist
from sklearn.datasets import load_digits

from fedica.data.blobs import (
    _blobs_structure,
    blobs_centers,
    blobs_client_data,
    client_cluster_sets,
    client_shares,
)
from fedica.data.classes import (
    _class_partition,
    _digits_dataset,
    _waveform_dataset,
    digits_client_data,
    waveform,
    waveform_client_data,
)
from fedica.data.common import ClientData
from fedica.data.files import DataFileError, load_client_file
from fedica.data.scenarios import (
    CLIENT_CACHE_BYTES,
    _cached_client_data,
    scenario_client_data,
    true_n_clusters,
)
from fedica.seeding import generator

BLOBS = dict(n_clients=5, n_clusters=6, dim=3, r_min=4.0, n_train=2500, n_test=5000)


def clear_caches():
    for cached in (_blobs_structure, _waveform_dataset, _digits_dataset,
                   _class_partition, _cached_client_data):
        cached.cache_clear()


def assert_same(a: ClientData, b: ClientData):
    for field in dataclasses.fields(ClientData):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, np.ndarray):
            np.testing.assert_array_equal(x, y)
        else:
            assert x == y


# ------------------------------------------------------------------------------------------------ determinism

@pytest.mark.parametrize("setting", ["nominal", "client_imbalance", "cluster_imbalance"])
def test_blobs_deterministic_and_partitions_differ(setting):
    a = blobs_client_data(1, setting=setting, seed=3, **BLOBS)
    clear_caches()
    assert_same(a, blobs_client_data(1, setting=setting, seed=3, **BLOBS))
    other = blobs_client_data(2, setting=setting, seed=3, **BLOBS)
    centers = blobs_centers(6, 3, 4.0, random_state=generator(3, "blobs.centers"))
    noise, other_noise = a.X_train - centers[a.y_train], other.X_train - centers[other.y_train]
    assert not np.allclose(noise[:10], other_noise[:10])  # clients draw independent noise
    reseeded = blobs_client_data(1, setting=setting, seed=4, **BLOBS)
    assert not np.array_equal(a.X_train[:10], reseeded.X_train[:10])


@pytest.mark.parametrize("make", [
    lambda g: blobs_client_data(g, setting="cluster_imbalance", seed=7, **BLOBS),
    lambda g: waveform_client_data(g, n_samples=1500, seed=7),
    lambda g: digits_client_data(g, n_clients=5, seed=7),
])
def test_client_alone_equals_client_among_all(make):
    clear_caches()
    alone = make(3)
    clear_caches()
    together = [make(g) for g in reversed(range(5))][::-1]
    assert_same(alone, together[3])


def test_scenario_dispatch_matches_direct_call_and_returns_copies():
    scenario = {"name": "blobs", "setting": "nominal", "k_min": 2, "k_max": None, **BLOBS}
    direct = blobs_client_data(0, seed=5, **{k: v for k, v in scenario.items() if k != "name"})
    first = scenario_client_data(scenario, 0, 5)
    assert_same(first, direct)
    first.X_train[:] = 0.0  # must not reach the cache
    assert_same(scenario_client_data(scenario, 0, 5), direct)
    assert_same(scenario_client_data({"name": "waveform", "n_samples": 900}, 2, 1),
                waveform_client_data(2, n_samples=900, seed=1))


def test_the_client_cache_is_bounded_by_the_bytes_it_holds():
    # One process serves every client of the in-process engine (or any of a Ray actor's), in turn, for every
    # message: a cache smaller than the federation never hits and regenerates each client's data each time.
    # 10,000 clients of 100 points stay cached (they hold 12 MB), where a count of 4,096 entries held too few.
    scenario = {"name": "blobs", "n_clients": 10000, "n_clusters": 6, "dim": 2, "r_min": 4.0,
                "n_train": 1_000_000, "n_test": 10000, "k_max": 3}
    _cached_client_data.cache_clear()
    for _ in range(2):
        for partition in range(10000):
            scenario_client_data(scenario, partition, 0)
    info = _cached_client_data.cache_info()
    assert info.hits == 10000 and info.maxsize == CLIENT_CACHE_BYTES
    data = scenario_client_data(scenario, 0, 0)
    assert info.currsize == 10000 * (data.X_train.nbytes + data.X_test.nbytes + data.y_train.nbytes + data.y_test.nbytes)


def test_scenario_errors_and_true_k():
    with pytest.raises(ValueError, match="blobs.*waveform.*digits.*files"):
        scenario_client_data({"name": "moons"}, 0, 0)
    with pytest.raises(ValueError, match="unknown keys.*'rmin'"):
        scenario_client_data({"name": "digits", "rmin": 3}, 0, 0)
    assert true_n_clusters({"name": "blobs", **BLOBS}) == 6
    assert true_n_clusters({"name": "waveform"}) == 3
    assert true_n_clusters({"name": "digits"}) == 10
    assert true_n_clusters({"name": "files", "paths": ["a.csv"]}) is None


# ------------------------------------------------------------------------------------------------ blobs

@settings(max_examples=40, deadline=None)
@given(n_clusters=st.integers(2, 12), dim=st.integers(1, 6), r_min=st.floats(0.1, 30.0), seed=st.integers(0, 10**6))
def test_blobs_centers_min_distance_is_exactly_r_min(n_clusters, dim, r_min, seed):
    centers = blobs_centers(n_clusters, dim, r_min, random_state=seed)
    assert centers.shape == (n_clusters, dim)
    distances = pdist(centers)
    assert distances.min() >= r_min - 1e-9
    assert abs(distances.min() - r_min) <= 1e-9


@pytest.mark.parametrize("args, match", [((1, 2, 1.0), "n_clusters"), ((3, 0, 1.0), "dim"),
                                         ((3, 2, 0.0), "r_min"), ((3, 2, -1.0), "r_min")])
def test_blobs_centers_rejects_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        blobs_centers(*args)


@settings(max_examples=60, deadline=None)
@given(n_clients=st.integers(1, 12), n_clusters=st.integers(2, 12), data=st.data())
def test_cluster_sets_cover_every_cluster_with_sizes_in_range(n_clients, n_clusters, data):
    k_max = data.draw(st.integers(max(1, -(-n_clusters // n_clients)), n_clusters))
    k_min = data.draw(st.integers(1, k_max))
    sets = client_cluster_sets(n_clients, n_clusters, k_min, k_max, random_state=data.draw(st.integers(0, 999)))
    assert len(sets) == n_clients
    for held in sets:
        assert k_min <= held.size <= k_max
        assert np.all(np.diff(held) > 0) and held.min() >= 0 and held.max() < n_clusters
    np.testing.assert_array_equal(np.unique(np.concatenate(sets)), np.arange(n_clusters))


def test_fedgem_default_range_is_two_to_k_minus_one():
    for seed in range(20):
        for g in range(5):
            data = blobs_client_data(g, seed=seed, **BLOBS)
            assert 2 <= data.n_components < BLOBS["n_clusters"]
            assert np.unique(data.y_train).size == data.n_components


@pytest.mark.parametrize("k_min, k_max", [(0, 3), (4, 3), (2, 7)])
def test_cluster_sets_reject_bad_range(k_min, k_max):
    with pytest.raises(ValueError, match=r"k_min <= k_max <= n_clusters"):
        client_cluster_sets(5, 6, k_min, k_max)


def test_cluster_sets_reject_uncoverable():
    with pytest.raises(ValueError, match="every cluster"):
        client_cluster_sets(2, 10, 2, 3)


def test_client_shares():
    assert client_shares("client_imbalance", 5).tolist() == [0.40, 0.24, 0.16, 0.16, 0.04]
    np.testing.assert_allclose(client_shares("client_imbalance", 10), [.2, .12, .08, .08, .02] * 2)
    for setting in ("nominal", "cluster_imbalance"):
        np.testing.assert_allclose(client_shares(setting, 7), np.full(7, 1 / 7))
    for g in range(1, 13):
        assert client_shares("client_imbalance", g).sum() == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError, match="setting"):
        client_shares("skewed", 5)


@pytest.mark.parametrize("n_train, n_test", [(2500, 5000), (2503, 4999)])
def test_client_imbalance_counts_add_up(n_train, n_test):
    params = {**BLOBS, "n_train": n_train, "n_test": n_test}
    clients = [blobs_client_data(g, setting="client_imbalance", **params) for g in range(5)]
    train = np.array([c.X_train.shape[0] for c in clients])
    test = np.array([c.X_test.shape[0] for c in clients])
    assert train.sum() == n_train and test.sum() == n_test
    np.testing.assert_allclose(train / n_train, [.4, .24, .16, .16, .04], atol=1 / n_train + 1e-12)
    np.testing.assert_allclose(test / n_test, [.4, .24, .16, .16, .04], atol=1 / n_test + 1e-12)
    if n_train == 2500:
        assert train.tolist() == [1000, 600, 400, 400, 100]


def test_blobs_points_are_unit_gaussians_around_the_centres_of_own_clusters():
    params = {**BLOBS, "n_train": 25000, "n_test": 5000}
    centers = blobs_centers(6, 3, 4.0, random_state=generator(0, "blobs.centers"))
    for g in range(5):
        c = blobs_client_data(g, **params)
        held = np.unique(c.y_train)
        np.testing.assert_array_equal(np.unique(c.y_test), held)
        counts = np.bincount(c.y_train, minlength=6)[held]
        assert counts.max() - counts.min() <= 1  # nominal: equal local proportions
        for k in held:
            X = c.X_train[c.y_train == k]
            assert np.all(np.abs(X.mean(axis=0) - centers[k]) < 5 / np.sqrt(len(X)))
            np.testing.assert_allclose(X.var(axis=0), 1.0, atol=0.15)


def test_cluster_imbalance_varies_local_proportions_but_keeps_every_cluster():
    spreads = []
    for g in range(5):
        c = blobs_client_data(g, setting="cluster_imbalance", seed=2, **BLOBS)
        counts = np.bincount(c.y_train)[np.unique(c.y_train)]
        assert counts.size == c.n_components and counts.min() >= 1
        spreads.append(counts.max() - counts.min())
    assert max(spreads) > 10


# ------------------------------------------------------------------------------------------------ waveform

def test_waveform_matches_breiman_formulas():
    n = 9000
    X, y = waveform(n, random_state=0)
    assert X.shape == (n, 21) and y.shape == (n,) and set(np.unique(y)) == {0, 1, 2}
    np.testing.assert_allclose(np.bincount(y) / n, 1 / 3, atol=0.025)
    i = np.arange(1, 22)
    h1 = np.maximum(6 - np.abs(i - 11), 0)
    h2 = np.maximum(6 - np.abs(i - 15), 0)
    h3 = np.maximum(6 - np.abs(i - 7), 0)
    for label, (a, b) in enumerate([(h1, h2), (h1, h3), (h2, h3)]):
        Xc = X[y == label]
        sd = np.sqrt((a - b) ** 2 / 12 + 1)  # u ~ U(0,1) mixes a and b, plus N(0,1) noise
        assert np.all(np.abs(Xc.mean(axis=0) - (0.5 * a + 0.5 * b)) < 5 * sd / np.sqrt(len(Xc)))
        np.testing.assert_allclose(Xc.std(axis=0), sd, rtol=0.1)


def test_waveform_clients_partition_the_data_set_by_held_classes():
    clients = [waveform_client_data(g, n_samples=3000, seed=1) for g in range(5)]
    X_all = np.concatenate([np.vstack([c.X_train, c.X_test]) for c in clients])
    assert X_all.shape == (3000, 21)
    assert np.unique(X_all, axis=0).shape[0] == 3000  # every point on exactly one client
    n_train = sum(c.X_train.shape[0] for c in clients)
    assert n_train == pytest.approx(0.7 * 3000, abs=3)
    for c in clients:
        assert c.n_components == 2 == np.unique(c.y_train).size  # text's default: 2 <= K_g < 3
        np.testing.assert_array_equal(np.unique(c.y_test), np.unique(c.y_train))
    # every class's training points are dealt evenly among its holders
    for label in range(3):
        sizes = [np.sum(c.y_train == label) for c in clients if label in c.y_train]
        assert max(sizes) - min(sizes) <= 1


def test_waveform_k_max_is_configurable():
    sizes = {waveform_client_data(g, n_samples=600, k_max=3, seed=s).n_components for s in range(6) for g in range(5)}
    assert 3 in sizes


# ------------------------------------------------------------------------------------------------ digits

def test_digits_clients_hold_the_whole_data_set():
    clients = [digits_client_data(g, seed=0) for g in range(10)]
    y_all = np.concatenate([np.concatenate([c.y_train, c.y_test]) for c in clients])
    assert y_all.size == 1797
    np.testing.assert_array_equal(np.bincount(y_all), np.bincount(load_digits().target))
    for c in clients:
        assert c.X_train.shape[1] == 64 and c.X_train.max() <= 16 and c.X_train.min() >= 0
        assert c.n_components == np.unique(c.y_train).size
        assert 2 <= c.n_components <= 9
        assert set(np.unique(c.y_train)) <= set(range(10))


# ------------------------------------------------------------------------------------------------ files

def _data(n=40, d=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)).round(6), rng.integers(0, 3, n)


def _assert_round_trip(client, X, y):
    X_back = np.vstack([client.X_train, client.X_test])
    y_back = np.concatenate([client.y_train, client.y_test])
    order, order_back = np.lexsort(X.T), np.lexsort(X_back.T)
    np.testing.assert_allclose(X_back[order_back], X[order])
    np.testing.assert_array_equal(y_back[order_back], y[order])


def test_csv_with_header_and_label_column(tmp_path):
    X, y = _data()
    path = tmp_path / "client.csv"
    lines = ["a,label,b,c"] + [f"{r[0]},{lab},{r[1]},{r[2]}" for r, lab in zip(X, y)]
    path.write_text("\n".join(lines) + "\n")
    by_name = load_client_file(path, label_column="label", test_fraction=0.25, seed=1)
    by_index = load_client_file(path, label_column=1, test_fraction=0.25, seed=1)
    assert_same(by_name, by_index)
    assert by_name.n_components == 3 and by_name.X_test.shape == (10, 3)
    _assert_round_trip(by_name, X, y)


def test_csv_without_header_and_unlabelled(tmp_path):
    X, _ = _data()
    path = tmp_path / "plain.csv"
    path.write_text("\n".join(",".join(map(str, row)) for row in X))
    client = load_client_file(path, n_components=4)
    assert client.y_train is None and client.n_components == 4
    assert client.X_train.shape[0] + client.X_test.shape[0] == 40  # first row is data, not a header
    # Without labels to count, the site chooses its K_g (as the library's sites do), on its training rows.
    chosen = load_client_file(path)
    assert chosen.y_train is None and 1 <= chosen.n_components <= 4
    tiny = tmp_path / "tiny.csv"
    tiny.write_text("\n".join(",".join(map(str, row)) for row in X[:3]))
    with pytest.raises(DataFileError, match="tiny.csv.*no labels"):
        load_client_file(tiny)


def test_npy_and_npz_round_trip(tmp_path):
    X, y = _data()
    np.save(tmp_path / "c.npy", np.column_stack([X, y]))
    _assert_round_trip(load_client_file(tmp_path / "c.npy", label_column=-1), X, y)
    np.savez(tmp_path / "c.npz", X=X, y=y)
    client = load_client_file(tmp_path / "c.npz")
    assert client.n_components == 3
    _assert_round_trip(client, X, y)


def test_files_scenario(tmp_path):
    X, y = _data()
    paths = []
    for g in range(2):
        np.savez(tmp_path / f"c{g}.npz", X=X + g, y=y)
        paths.append(str(tmp_path / f"c{g}.npz"))
    scenario = {"name": "files", "paths": paths, "label_column": None, "n_components": [2, 5],
                "test_fraction": 0.3}
    assert [scenario_client_data(scenario, g, 0).n_components for g in range(2)] == [2, 5]


BAD_FILES = [
    # (file name, content, expected message parts)
    ("empty.csv", "", ["empty.csv", "empty"]),
    ("header_only.csv", "a,b,label\n", ["header_only.csv", "no data"]),
    ("text.csv", "a,b,label\n1,2,0\n3,x,1\n", ["text.csv", "line 3", "column 1", "not a number"]),
    ("blank.csv", "1,2,0\n3,,1\n", ["blank.csv", "line 2", "column 1", "not a number"]),
    ("nan.csv", "a,b,label\n1,2,0\n3,4,1\nnan,5,0\n", ["nan.csv", "line 4", "column 0", "not finite"]),
    ("inf.csv", "1,2,0\n3,4,1\n5,-inf,0\n", ["inf.csv", "line 3", "column 1", "not finite"]),
    ("few.csv", "1,2,0\n3,4,1\n5,6,2\n", ["few.csv", "3 points", "n_components=4"]),
    ("ragged.csv", "1,2,0\n3,4\n", ["ragged.csv", "line 2", "cells"]),
    ("fraction.csv", "1,2,0\n3,4,1.5\n5,6,0\n", ["fraction.csv", "line 2", "column 2", "not an integer"]),
]


@pytest.mark.parametrize("name, content, parts", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_csv_files_name_file_and_place(tmp_path, name, content, parts):
    path = tmp_path / name
    path.write_text(content)
    n_components = 4 if name == "few.csv" else None
    with pytest.raises(DataFileError) as error:
        load_client_file(path, label_column=2 if name != "few.csv" else -1, n_components=n_components)
    for part in parts:
        assert part in str(error.value)


def test_file_errors_name_the_place_never_the_content(tmp_path):
    secret = tmp_path / "shadow.csv"
    secret.write_text("root:$6$saltsalt$hashhashhash:19000:0:99999:7:::\nalice:$6$abc$def:19000:0:99999:7:::\n")
    with pytest.raises(DataFileError) as error:
        load_client_file(secret, label_column="label")
    assert "root:" not in str(error.value) and "$6$" not in str(error.value) and "alice" not in str(error.value)
    assert "shadow.csv" in str(error.value)


def test_a_directory_or_a_symbolic_link_is_not_read(tmp_path):
    data = tmp_path / "data.csv"
    data.write_text("1,2,0\n3,4,1\n5,6,0\n7,8,1\n")
    link = tmp_path / "link.csv"
    link.symlink_to(data)
    with pytest.raises(DataFileError, match="link.csv: is a symbolic link"):
        load_client_file(link, label_column=2)
    with pytest.raises(DataFileError, match="is a directory"):
        load_client_file(tmp_path, label_column=2)


def test_bad_numpy_files(tmp_path):
    with pytest.raises(DataFileError, match="missing.npy.*no such file"):
        load_client_file(tmp_path / "missing.npy")
    np.save(tmp_path / "flat.npy", np.arange(10.0))
    with pytest.raises(DataFileError, match="flat.npy.*2-D"):
        load_client_file(tmp_path / "flat.npy", n_components=2)
    bad = np.ones((6, 3))
    bad[4, 2] = np.nan
    np.save(tmp_path / "nan.npy", bad)
    with pytest.raises(DataFileError, match=r"nan.npy: row 4, column 2.*not finite"):
        load_client_file(tmp_path / "nan.npy", n_components=2)
    bad[4, 2] = np.inf
    np.savez(tmp_path / "inf.npz", X=bad)
    with pytest.raises(DataFileError, match=r"inf.npz: row 4, column 2.*not finite"):
        load_client_file(tmp_path / "inf.npz", n_components=2)
    np.savez(tmp_path / "noX.npz", data=np.ones((5, 2)))
    with pytest.raises(DataFileError, match="noX.npz.*'X'"):
        load_client_file(tmp_path / "noX.npz", n_components=2)
    assert issubclass(DataFileError, ValueError)


def test_labels_too_large_to_tell_apart_are_refused(tmp_path):
    path = tmp_path / "huge.csv"
    path.write_text("1,2,0\n3,4,1\n5,6,18446744073709551616\n7,8,1\n")
    with pytest.raises(DataFileError, match=r"huge.csv: line 3, column 2: a label beyond 2\*\*53"):
        load_client_file(path, label_column=2)


def test_test_fraction_none_holds_out_only_with_labels(tmp_path):
    X, y = _data()
    labelled, plain = tmp_path / "labelled.csv", tmp_path / "plain.csv"
    labelled.write_text("a,b,c,label\n" + "\n".join(f"{r[0]},{r[1]},{r[2]},{lab}" for r, lab in zip(X, y)) + "\n")
    plain.write_text("\n".join(",".join(map(str, row)) for row in X) + "\n")
    # null is 0.3 with labels: the same split as the former default.
    assert_same(load_client_file(labelled, label_column="label", test_fraction=None, seed=2),
                load_client_file(labelled, label_column="label", test_fraction=0.3, seed=2))
    # Without labels every row trains, in the file's order; nothing is held out.
    client = load_client_file(plain, n_components=3, test_fraction=None)
    np.testing.assert_array_equal(client.X_train, X)
    assert client.X_test.shape == (0, 3) and client.y_test is None
    # An explicit number is used as given, with labels or without.
    assert load_client_file(plain, n_components=3, test_fraction=0.25).X_test.shape == (10, 3)
    assert load_client_file(labelled, label_column="label", test_fraction=0).X_test.shape == (0, 3)
    with pytest.raises(ValueError, match=r"test_fraction must be in \[0, 1\)"):
        load_client_file(plain, n_components=3, test_fraction=1.0)


def test_a_checked_file_is_not_parsed_again_for_the_run(tmp_path, monkeypatch):
    from fedica import config
    from fedica.data import scenarios as registry
    from fedica.server.app import compose_config

    X, y = _data(seed=3)
    path = tmp_path / "site.csv"
    path.write_text("a,b,c,label\n" + "\n".join(f"{r[0]},{r[1]},{r[2]},{lab}" for r, lab in zip(X, y)) + "\n")
    parsed = []
    real = registry.read_table
    monkeypatch.setattr(registry, "read_table", lambda *args, **kwargs: parsed.append(args) or real(*args, **kwargs))
    cfg = config.validate_config(compose_config(["algorithm=fedgem", "scenario=files", "engine=inprocess",
                                                 f"scenario.paths=[{path},{path}]", "scenario.label_column=label"]))
    assert len(parsed) == 1  # the two sites name one file: one parse
    client = scenario_client_data(cfg["scenario"], 1, 0)
    assert len(parsed) == 1 and client.X_train.flags.writeable
    path.write_text(path.read_text() + "9,9,9,1\n")  # an edited file is read anew
    scenario_client_data(cfg["scenario"], 1, 0)
    assert len(parsed) == 2


def _blob_sites(tmp_path, labelled: bool) -> list[str]:
    """Three CSV sites of two or three well-separated 2-D blobs (header a,b[,label])."""
    rng = np.random.default_rng(5)
    centres = np.array([[0.0, 0.0], [6.0, 6.0], [0.0, 6.0]])
    paths = []
    for g in range(3):
        k = 2 + g % 2
        X = np.vstack([rng.normal(centres[c], 0.3, size=(40, 2)) for c in range(k)])
        y = np.repeat(np.arange(k), 40)
        path = tmp_path / f"site{g}.csv"
        table, header = (np.c_[X, y], "a,b,label") if labelled else (X, "a,b")
        np.savetxt(path, table, delimiter=",", header=header, comments="", fmt="%.6f")
        paths.append(str(path))
    return paths


def _fedgem_files(paths, *overrides):
    from fedica.config import validate_config
    from fedica.scripts.engines import run_inprocess
    from fedica.server.app import compose_config

    return run_inprocess(validate_config(compose_config(["algorithm=fedgem", "scenario=files", "engine=inprocess",
                                                         "algorithm.rounds=3", f"scenario.paths=[{','.join(paths)}]",
                                                         *overrides])))


@pytest.mark.slow
def test_a_fedgem_files_run_without_labels_trains_on_every_row_and_writes_its_labels(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    paths = _blob_sites(tmp_path, labelled=False)
    out = tmp_path / "run"
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-m", "fedica.scripts.run", "algorithm=fedgem", "scenario=files",
                           "engine=inprocess", "algorithm.rounds=3", f"scenario.paths=[{','.join(paths)}]",
                           "scenario.n_components=auto", f"hydra.run.dir={out}"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads((out / "result.json").read_text())
    assert list(result["metrics"]) == ["fedgem"]  # nothing held out: no comparator to score
    assert result["metrics"]["fedgem"]["super_clusters"] == 3
    for g in range(3):
        rows = np.loadtxt(out / f"labels_site{g}.csv", delimiter=",", skiprows=1, dtype=int)
        assert rows.shape == (40 * (2 + g % 2), 2) and (rows[:, 0] == np.arange(rows.shape[0])).all()


@pytest.mark.parametrize("labelling, units, separated", [("adapted", "algorithm.standardize=federated", True),
                                                       ("consensus", "algorithm.standardize=federated", False),
                                                       ("adapted", "scenario.standardize=pool", True),
                                                       ("adapted", "algorithm.standardize=null", False)])
def test_the_labels_files_label_every_row_as_the_run_s_evaluation_does(tmp_path, labelling, units, separated):
    # Nothing held out: the evaluation labels every row, as the site does under the run's labelling and in its units,
    # so the files' ARI against the label column is the run's global ARI. Site 2 fits 2 components to 3 clusters: under
    # "adapted" its own mixture over every global centre labels them apart, its consensus model cannot
    # (issue 44: the files labelled by the consensus model scored .64 where the run's labels scored 1.00).
    from sklearn.metrics import adjusted_rand_score

    from fedica.server.harness.outputs import write_site_labels

    rng = np.random.default_rng(5)
    centres = np.array([[0.0, 0.0], [6.0, 6000.0], [0.0, 6000.0]])
    paths = []
    for g in range(3):
        X = np.vstack([rng.normal(centres[c], [0.5, 500.0], size=(60, 2)) for c in range(3)])
        path = tmp_path / f"site{g}.csv"
        np.savetxt(path, np.c_[X, np.repeat(np.arange(3), 60)], delimiter=",", header="a,b,label", comments="", fmt="%.6f")
        paths.append(str(path))
    result = _fedgem_files(paths, "scenario.label_column=label", "scenario.test_fraction=0",
                           "scenario.n_components=[3,3,2]", f"algorithm.labelling={labelling}", units)
    written = write_site_labels(result, tmp_path / "labels")
    truth = np.concatenate([np.loadtxt(path, delimiter=",", skiprows=1)[:, 2] for path in paths])
    labels = np.concatenate([np.loadtxt(path, delimiter=",", skiprows=1, dtype=int)[:, 1] for path in written])
    assert adjusted_rand_score(truth, labels) == pytest.approx(result["metrics"]["fedgem"]["global_ari"], abs=1e-12)
    # In the files' units the second feature (x1000) hides the first, which alone tells clusters 1 and 2 apart.
    assert (result["metrics"]["fedgem"]["global_ari"] > 0.99) == separated


def test_the_central_gmm_on_labelled_files_takes_k_from_the_labels(tmp_path):
    paths = _blob_sites(tmp_path, labelled=True)
    result = _fedgem_files(paths, "scenario.label_column=label", "baseline_methods=[central-gmm]")
    gmm = result["metrics"]["central-gmm"]
    assert gmm["k_true"] == 3 and gmm["k_source"] == "labels" and gmm["global_ari"] > 0.99
    # The default list names the simulated scenarios' comparators too: on files it runs none, as before.
    default = _fedgem_files(paths, "scenario.label_column=label")
    assert list(default["metrics"]) == ["fedgem"]
    # FedGEM's own scores are the same; beside a central GMM its mixture is also scored by their criterion.
    assert default["metrics"]["fedgem"] == {k: v for k, v in result["metrics"]["fedgem"].items() if k != "pooled_bic"}
    assert np.isfinite(result["metrics"]["fedgem"]["pooled_bic"]) and np.isfinite(gmm["pooled_bic"])


def test_the_central_gmm_on_unlabelled_files_takes_fedgems_k(tmp_path):
    result = _fedgem_files(_blob_sites(tmp_path, labelled=False), "scenario.n_components=auto",
                           "scenario.test_fraction=0.3", "baseline_methods=[central-gmm]")
    gmm = result["metrics"]["central-gmm"]
    assert gmm["k_source"] == "fedgem" and "k_true" not in gmm
    assert gmm["k_hat"] == result["metrics"]["fedgem"]["super_clusters"] == 3
    assert gmm["silhouette"] > 0.8


def _wine_sites(tmp_path, unit, folder: str | None = None) -> list[str]:
    """wine, as a user writes it: four CSV files with a header, in its own units times ``unit`` (one factor, or one
    per feature); site 0 holds one class (K_g = 1), the others two or three."""
    from sklearn.datasets import load_wine

    data = load_wine(as_frame=True)
    frame = data.frame
    frame[data.feature_names] = frame[data.feature_names] * unit
    rng = np.random.default_rng(0)
    classes = [{0}, {0, 1}, {1, 2}, {0, 1, 2}]
    site = np.array([rng.choice([g for g, held in enumerate(classes) if label in held]) for label in frame["target"]])
    paths = []
    for g in range(4):
        path = tmp_path / (folder or f"{unit:g}") / f"site{g}.csv"
        path.parent.mkdir(exist_ok=True)
        frame[site == g].to_csv(path, index=False, float_format="%.17g")
        paths.append(str(path))
    return paths


def test_a_fedgem_files_run_learns_the_variances_so_the_data_s_units_change_nothing(tmp_path):
    # Before, scenario=files ran the paper's identity covariance (a variance of 1 in the data's units) with the
    # strict same-client rule, and a site whose labels hold one class was refused ("at least 2 components").
    first = _fedgem_files(_wine_sites(tmp_path, 1.0), "scenario.label_column=target")
    thousands = _fedgem_files(_wine_sites(tmp_path, 1000.0), "scenario.label_column=target")
    assert first["config"]["algorithm"]["covariance_type"] == "auto"
    assert first["config"]["algorithm"]["same_client_rule"] == "evidence"
    assert first["fedgem"]["local_clusters"] == {"0": 1, "1": 2, "2": 2, "3": 3}
    assert first["metrics"]["fedgem"] == thousands["metrics"]["fedgem"]
    assert first["fedgem"]["client_mapping"] == thousands["fedgem"]["client_mapping"]
    identity = _fedgem_files(_wine_sites(tmp_path, 1.0), "scenario.label_column=target",
                             "algorithm.covariance_type=identity")
    assert identity["config"]["algorithm"]["covariance_type"] == "identity"


def test_standardised_files_are_free_of_each_feature_s_unit_and_the_scale_warning_says_when_they_are_not(tmp_path):
    # wine as shipped: proline (standard deviation 315) beside hue (0.23); FedGEM's spheres in the data's units weigh
    # features by them (the families, which the spheres start, are run below with the spheres alone).
    shipped = _fedgem_files(_wine_sites(tmp_path, 1.0), "scenario.label_column=target", "algorithm.standardize=null",
                            "algorithm.covariance_type=spherical")
    assert shipped["fedgem"]["feature_scale_spread"] > 100
    assert any("the features' scales differ" in warning for warning in shipped["warnings"])
    assert any("scenario.standardize=pool" in warning for warning in shipped["warnings"])  # what the user can set
    # Every feature in a unit of its own (1e-3 to 1e3): standardize=pool gives the same clusters, without a warning.
    units = np.logspace(-3, 3, 13)[np.random.default_rng(1).permutation(13)]
    pooled = [_fedgem_files(_wine_sites(tmp_path, unit, folder), "scenario.label_column=target",
                            "scenario.standardize=pool", "algorithm.standardize=null", "algorithm.covariance_type=spherical")
              for unit, folder in ((1.0, None), (units, "per-feature"))]
    for result in pooled:
        assert result["fedgem"]["feature_scale_spread"] < 2
        assert not any("scales differ" in warning for warning in result["warnings"])
    assert pooled[0]["metrics"]["fedgem"] == pooled[1]["metrics"]["fedgem"]
    assert pooled[0]["fedgem"]["client_mapping"] == pooled[1]["fedgem"]["client_mapping"]
    assert pooled[0]["metrics"]["fedgem"]["global_ari"] > shipped["metrics"]["fedgem"]["global_ari"] + 0.3


def test_federated_standardisation_frees_files_of_each_feature_s_unit_and_the_sites_choose_k_g_after_it(tmp_path):
    # The sites agree on every feature's location and scale (medians of their column moments), on any engine: each
    # reads its own file only. Every feature in a unit of its own gives the same run, labels files included. (The
    # spheres alone, whose dependence on the units the standardisation removes.)
    shipped = _fedgem_files(_wine_sites(tmp_path, 1.0), "scenario.label_column=target", "algorithm.standardize=null",
                            "algorithm.covariance_type=spherical")
    assert any("algorithm.standardize=federated" in warning for warning in shipped["warnings"])
    units = np.logspace(-3, 3, 13)[np.random.default_rng(1).permutation(13)]
    runs = [_fedgem_files(_wine_sites(tmp_path, unit, folder), "scenario.label_column=target",
                          "scenario.n_components=auto", "algorithm.standardize=federated",
                          "algorithm.covariance_type=spherical")
            for unit, folder in ((1.0, None), (units, "per-feature"))]
    for result in runs:
        assert result["fedgem"]["feature_scale_spread"] < 2
        assert not any("standardize" in warning for warning in result["warnings"])
        assert result["fedgem"]["feature_scale"] is not None
    assert runs[0]["metrics"]["fedgem"] == runs[1]["metrics"]["fedgem"]
    assert runs[0]["fedgem"]["client_mapping"] == runs[1]["fedgem"]["client_mapping"]
    assert runs[0]["fedgem"]["local_clusters"] == runs[1]["fedgem"]["local_clusters"]
    from fedica.server.harness.outputs import write_site_labels

    written = [write_site_labels(result, tmp_path / f"labels{i}") for i, result in enumerate(runs)]
    assert len(written[0]) == 4
    for ours, theirs in zip(*written):
        assert open(ours).read() == open(theirs).read()
    # The centres are written in each run's own units.
    np.testing.assert_allclose(np.asarray(runs[1]["fedgem"]["global_centroids"]),
                               np.asarray(runs[0]["fedgem"]["global_centroids"]) * units, rtol=1e-9)
    assert runs[0]["metrics"]["fedgem"]["global_ari"] > shipped["metrics"]["fedgem"]["global_ari"] + 0.3


def test_standardize_pool_uses_every_file_s_rows_and_site_each_file_s_own(tmp_path):
    from fedica.data.scenarios import pooled_file_scale

    paths = _wine_sites(tmp_path, 1.0)
    tables = [np.loadtxt(path, delimiter=",", skiprows=1)[:, :-1] for path in paths]
    scenario = {"name": "files", "paths": paths, "label_column": "target", "n_components": None, "test_fraction": 0.0}
    pooled = np.vstack(tables)
    mean, std = pooled_file_scale(paths, "target")
    np.testing.assert_allclose(mean, pooled.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(std, pooled.std(axis=0), rtol=1e-12)
    for g, table in enumerate(tables):
        as_pool = scenario_client_data({**scenario, "standardize": "pool"}, g, 0).X_train
        as_site = scenario_client_data({**scenario, "standardize": "site"}, g, 0).X_train
        # Nothing is held out (test_fraction 0); the split still shuffles the rows: compare them as sets.
        np.testing.assert_allclose(np.sort(as_pool, axis=0), np.sort((table - mean) / std, axis=0), atol=1e-12)
        np.testing.assert_allclose(np.sort(as_site, axis=0),
                                   np.sort((table - table.mean(axis=0)) / table.std(axis=0), axis=0), atol=1e-12)


@pytest.mark.parametrize("algorithm", ["fedgem", "rfica"])
def test_site_files_whose_headers_name_other_columns_or_another_order_are_refused_in_one_line(tmp_path, algorithm):
    # Files exported from two systems: the same columns in another order were read by position, so one site's
    # proline sat where the others have alcohol (before: wine's global ARI .722 for .897, without a word).
    import pandas as pd

    from fedica.config import ConfigError, validate_config
    from fedica.server.app import compose_config

    paths = _wine_sites(tmp_path, 1.0)
    frame = pd.read_csv(paths[2])
    label = ["scenario.label_column=target"]

    def check(*files):
        return validate_config(compose_config([f"algorithm={algorithm}", "scenario=files", "engine=inprocess",
                                               f"scenario.paths=[{','.join(files)}]", *label]))

    check(*paths)  # the same header everywhere
    reordered = tmp_path / "reordered.csv"
    frame[list(frame.columns[::-1])].to_csv(reordered, index=False)
    with pytest.raises(ConfigError, match=r"scenario\.paths\[1\]=.*reordered\.csv: its header differs from "
                                          r"scenario\.paths\[0\]'s \(the same columns in another order \(first "
                                          r"difference: position 0: 'target' for 'alcohol'\)\)") as caught:
        check(paths[0], str(reordered))
    assert "\n" not in str(caught.value)
    renamed = tmp_path / "renamed.csv"
    frame.rename(columns={"proline": "proline_mg_l"}).to_csv(renamed, index=False)
    with pytest.raises(ConfigError, match=r"\(only here: proline_mg_l; missing here: proline\)"):
        check(paths[0], str(renamed))
    # A file without a header names no columns: it is read by position beside the others, as before.
    bare = tmp_path / "bare.csv"
    frame.to_csv(bare, index=False, header=False)
    label = [f"scenario.label_column={list(frame.columns).index('target')}"]
    check(paths[0], str(bare))
