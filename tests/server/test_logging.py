"""fedica's log lines: a user's own ServerApp sees the strategies' progress once (through Flower's
handlers), fedica's own ServerApp and Hydra print each line once, and FedGEM says once per run
that components with outlying radii took part in no merge."""

from __future__ import annotations

import io
import logging
from contextlib import contextmanager

import numpy as np
import pytest
from fedica.clients import make_client_app
from fedica.scripts.engines import run_inprocess
from fedica.server import FedGEMStrategy
from fedica.server.app import compose_config, configure_logging
from fedica.server.inprocess import InProcessGrid
from flwr.common.logger import console_handler

from fedica import attacks
from fedica.config import validate_config

CENTRES = np.array([[0.0, 0.0], [8.0, 0.0], [0.0, 8.0]])
PROGRESS = ("FedGEMStrategy: ", "FedGEM round 1/2", "FedGEM round 2/2", "FedGEMStrategy finished")


@pytest.fixture
def fresh_logging(monkeypatch):
    """fedica's loggers as nobody configured them, and Flower's console into a buffer (yielded).

    Their handlers, levels and propagation are restored afterwards. The root logger is pytest's
    during the test itself; :func:`unconfigured_root` sets its handlers aside in the test's body.
    """
    loggers = [logging.getLogger(name) for name in ("fedica", "fedica.server", "flwr")]
    saved = [(lg, lg.handlers, lg.level, lg.propagate) for lg in loggers]
    for lg in loggers[:2]:
        lg.handlers = []
        lg.setLevel(logging.NOTSET)
    flower_console = io.StringIO()
    monkeypatch.setattr(console_handler, "stream", flower_console)
    yield flower_console
    for lg, handlers, level, propagate in saved:
        lg.handlers = handlers
        lg.setLevel(level)
        lg.propagate = propagate


@contextmanager
def unconfigured_root():
    """No handler on the root logger (pytest's own are back before the test ends)."""
    root = logging.getLogger()
    handlers, root.handlers = root.handlers, []
    try:
        yield root
    finally:
        root.handlers = handlers


def fit_over_inprocess_grid() -> FedGEMStrategy:
    """A user's FedGEMStrategy over fedica's in-process Grid, each site holding two of three clusters."""
    def load(context):
        rng = np.random.default_rng(int(context.node_config["partition-id"]))
        held = np.delete(CENTRES, int(context.node_config["partition-id"]), axis=0)
        return np.vstack([c + rng.normal(size=(100, 2)) for c in held])

    grid = InProcessGrid(make_client_app(load, n_components=2), [{"partition-id": i, "num-partitions": 3} for i in range(3)])
    strategy = FedGEMStrategy(rounds=2, upsilon=1.0, min_available_nodes=3, min_clients=3)
    strategy.start(grid=grid)
    return strategy


def count_progress(text: str) -> list[int]:
    return [sum(line.count(marker) for line in text.splitlines()) for marker in PROGRESS]


def test_a_users_strategy_prints_its_progress_once_through_flowers_handlers(fresh_logging, capsys):
    with unconfigured_root():
        fit_over_inprocess_grid()
    assert count_progress(fresh_logging.getvalue()) == [1, 1, 1, 1]
    assert "FedGEM round" not in capsys.readouterr().err  # not a second time through Python's last resort


def test_fedicas_own_serverapp_prints_each_line_once(fresh_logging, capsys):
    with unconfigured_root():
        fit_over_inprocess_grid()  # a user's strategy first: fedica's lines went to Flower's handlers ...
        fresh_logging.truncate(0)
        configure_logging()  # ... then fedica's own ServerApp in the same process: its own handler only
        fit_over_inprocess_grid()
    assert count_progress(capsys.readouterr().err) == [1, 1, 1, 1]
    assert "FedGEM round" not in fresh_logging.getvalue()


def test_under_a_root_handler_like_hydras_each_line_once(fresh_logging):
    root_output = io.StringIO()
    with unconfigured_root() as root:
        root.addHandler(logging.StreamHandler(root_output))
        configure_logging()  # as fedica-run does under Hydra: the root handler prints fedica's lines
        fit_over_inprocess_grid()
    assert count_progress(root_output.getvalue()) == [1, 1, 1, 1]
    assert "FedGEM round" not in fresh_logging.getvalue()


def test_outlying_radii_are_said_once_per_run_with_the_counts(caplog, monkeypatch):
    # A client answering with random centroids away from the data, though not so far (as the default scale
    # is) that the far rule refuses its replies: its balls are outlying in every round.
    monkeypatch.setattr(attacks, "RANDOM_CENTROID_SCALE", 50.0)
    overrides = ["engine=inprocess", "algorithm=fedgem", "scenario.n_clients=4", "scenario.n_train=1000",
                 "scenario.n_test=400", "algorithm.rounds=3", "baselines=false", "attack.kind=random_centroids",
                 "attack.fraction=0.25"]
    with caplog.at_level(logging.DEBUG, logger="fedica"):
        result = run_inprocess(validate_config(compose_config(overrides)))
    counts = [entry["excluded_components"] for entry in result["history"]]
    assert all(counts), counts
    no_merge = [r for r in caplog.records if "took part in no merge" in r.getMessage()]
    per_round = [r for r in no_merge if r.getMessage().startswith("round ")]
    assert [r.levelno for r in per_round] == [logging.DEBUG] * 3
    summary = [r for r in no_merge if r.levelno >= logging.INFO]
    hostile = result["fedgem"]["hostile_clients"]
    assert [r.getMessage() for r in summary] == [
        f"FedGEM: components of {len(hostile)} of 4 clients with outlying radii took part in no merge in 3 of 3 "
        f"rounds ({sum(counts)} in all, at most {max(counts)} a round; each round's count is its history's "
        "excluded_components)"]
