"""Every site reads its columns by position: the transport holds the sites to the column names most of them send.

A deployed site reads its own file, which the server never sees, so the config cannot compare the sites'
headers as it does on fedica's local engines; each site reports the names with its replies instead
(``columns``), and a site whose names differ from the majority's is left out with the difference named.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from sklearn.datasets import load_wine

from fedica.clients.app import FlowerSite, ScenarioSource, make_client_app
from fedica.protocol import COLUMNS_KEY, InvalidReply, MisalignedSites, column_majority, reported_columns
from fedica.server.fedgem import FedGEMStrategy
from fedica.server.inprocess import InProcessGrid
from fedica.server.rfica import RFICAStrategy
from fedica.validation import name_difference


def test_the_majoritys_names_are_the_reference_and_the_others_are_named():
    wine = ("alcohol", "malic_acid", "ash")
    swapped = ("alcohol", "ash", "malic_acid")
    assert column_majority({}) == (None, [])
    assert column_majority({0: wine, 3: wine}) == (wine, [])
    assert column_majority({0: wine, 1: swapped, 2: wine}) == (wine, [1])
    # No site sets the order alone: one against one, or two against two and one, stops the run in one line.
    with pytest.raises(MisalignedSites, match=r"no majority of them agrees \(site 0: \('alcohol', 'malic_acid', 'ash'\); "
                                              r"site 1: \('alcohol', 'ash', 'malic_acid'\)\)"):
        column_majority({0: wine, 1: swapped})
    with pytest.raises(MisalignedSites, match="sites 0, 1: .*sites 2, 3: .*site 4: "):
        column_majority({0: wine, 1: wine, 2: swapped, 3: swapped, 4: wine[:2]})
    # The difference named: an extra or missing name, the first position out of order, a name repeated.
    assert name_difference(swapped, wine) == "the same columns in another order (first difference: position 1: 'ash' for 'malic_acid')"
    assert name_difference(wine[:2] + ("pH",), wine) == "only here: pH; missing here: ash"
    assert name_difference(wine + ("ash",), wine) == "the same columns, 4 here against 3 (a name repeated)"


@pytest.mark.parametrize("value", [3, "not json", json.dumps({"a": 1}), json.dumps([1, 2]), json.dumps(["x" * 300]),
                                   json.dumps(["a"] * 100_001)])
def test_a_malformed_list_of_names_is_an_invalid_reply(value):
    with pytest.raises(InvalidReply, match=COLUMNS_KEY):
        reported_columns({COLUMNS_KEY: value})


def test_a_reply_without_names_reports_none():
    assert reported_columns({"partition-id": 0}) is None
    assert reported_columns({COLUMNS_KEY: json.dumps(["a", "b"])}) == ("a", "b")


def wine_frames(n_sites=5):
    frame = load_wine(as_frame=True).data.sample(frac=1.0, random_state=7)
    return [frame.iloc[rows] for rows in np.array_split(np.arange(len(frame)), n_sites)]


def run_users_app(frames, strategy):
    """A user's Flower app (make_client_app over DataFrames, a fedica strategy) on the in-process Grid."""
    grid = InProcessGrid(make_client_app(lambda context: frames[int(context.node_config["partition-id"])],
                                         n_components=3),
                         [{"partition-id": g, "num-partitions": len(frames)} for g in range(len(frames))])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        strategy.start(grid=grid)
    return strategy


def reasons(strategy, partition):
    return [entry["reason"] for entry in strategy.federation.rejected if entry["client"] == partition]


def test_a_users_site_whose_dataframe_orders_its_columns_otherwise_is_left_out_with_the_difference_named():
    frames = wine_frames()
    frames[3] = frames[3][list(reversed(frames[3].columns))]  # the same columns, exported in another order
    strategy = run_users_app(frames, FedGEMStrategy(min_available_nodes=5, min_clients=2, standardize="federated"))
    assert sorted(strategy.server.models) == [0, 1, 2, 4]
    [reason] = reasons(strategy, 3)
    assert reason.startswith("its columns differ from those of 4 of the 5 sites that name theirs (the same columns "
                             "in another order (first difference: position 0: 'proline' for 'alcohol'))")
    assert "none of its replies is used" in reason
    assert {entry["client"] for entry in strategy.federation.rejected} == {3}


def test_aligned_sites_are_all_used_and_names_change_no_number():
    """The same sites as DataFrames and as arrays: the names travel, every number is the same."""
    frames = wine_frames()
    named = run_users_app(frames, FedGEMStrategy(min_available_nodes=5, min_clients=2))
    unnamed = run_users_app([f.to_numpy() for f in frames], FedGEMStrategy(min_available_nodes=5, min_clients=2))
    assert named.federation.rejected == [] == unnamed.federation.rejected
    assert named.federation.columns_of == {g: tuple(frames[0].columns) for g in range(5)}
    assert unnamed.federation.columns_of == {}
    np.testing.assert_array_equal(named.means_, unnamed.means_)


def test_rfica_sites_with_one_renamed_channel_are_left_out():
    rng = np.random.default_rng(0)
    mixing = rng.normal(size=(3, 3))
    import pandas as pd

    channels = ["Fz", "Cz", "Pz"]
    frames = [pd.DataFrame(rng.laplace(size=(2000, 3)) @ mixing.T, columns=channels) for _ in range(5)]
    frames[1] = frames[1].rename(columns={"Pz": "Oz"})
    strategy = run_users_app(frames, RFICAStrategy(min_available_nodes=5, min_clients=2))
    [reason] = reasons(strategy, 1)
    assert "(only here: Oz; missing here: Pz)" in reason
    assert strategy.mixing_.shape == (3, 3)


def test_two_sites_that_disagree_stop_the_run_in_one_line():
    frames = wine_frames(2)
    frames[1] = frames[1][list(reversed(frames[1].columns))]
    with pytest.raises(MisalignedSites, match="no majority of them agrees"):
        run_users_app(frames, FedGEMStrategy(min_available_nodes=2, min_clients=2))


def test_fedicas_own_supernode_reports_its_files_header(tmp_path, monkeypatch):
    """What a deployed SuperNode sends: the header of the file its own node config names."""
    from fedica.protocol.tasks import LOCAL_ENGINE_VARIABLE

    monkeypatch.delenv(LOCAL_ENGINE_VARIABLE, raising=False)
    frame = load_wine(as_frame=True).frame
    path = tmp_path / "site.csv"
    frame.to_csv(path, index=False)
    values = {"cfg": json.dumps({"scenario": {"name": "files", "paths": []}})}
    context = Context(1, 2, {"partition-id": 0, "data-path": str(path)}, RecordDict(), {})
    assert ScenarioSource().columns(FlowerSite(ScenarioSource(), 0, context, values)) == tuple(frame.columns)
    generated = {"cfg": json.dumps({"scenario": {"name": "blobs"}})}
    assert ScenarioSource().columns(FlowerSite(ScenarioSource(), 0, context, generated)) is None
