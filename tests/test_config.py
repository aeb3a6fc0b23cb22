"""Config validation: every user mistake is one ConfigError naming the key and the rule."""

import pytest
from fedica.server.app import compose_config

from fedica.config import ConfigError, validate_config


@pytest.fixture(scope="module")
def rfica_cfg():
    return compose_config([])


@pytest.fixture(scope="module")
def fedgem_cfg():
    return compose_config(["algorithm=fedgem"])


def test_default_configs_are_valid(rfica_cfg, fedgem_cfg):
    validate_config(rfica_cfg)
    validate_config(fedgem_cfg)
    assert rfica_cfg["scenario"]["name"] == "ica_paper"
    assert rfica_cfg["scenario"]["n_clients"] == 30
    # Choosing FedGEM alone selects a clustering scenario.
    assert fedgem_cfg["scenario"]["name"] == "blobs"


@pytest.mark.parametrize("scenario", ["blobs", "waveform", "digits"])
def test_every_fedgem_scenario_composes(scenario):
    validate_config(compose_config(["algorithm=fedgem", f"scenario={scenario}"]))


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["scenario.r=1"], "scenario.r"),
        (["scenario.corrupt_ratio=1.0"], "scenario.corrupt_ratio"),
        (["scenario.corrupt_ratio=-0.1"], "scenario.corrupt_ratio"),
        (["scenario.n_corrupt=3"], "scenario.n_corrupt"),
        (["scenario.n_clients=0"], "scenario.n_clients"),
        (["algorithm.contrast=tanh"], "algorithm.contrast"),
        (["algorithm.init=zeros"], "algorithm.init"),
        (["seed=-1"], "seed"),
        (["min_clients=31"], "min_clients"),
        (["round_timeout=0"], "round_timeout"),
        (["attack.kind=inflated_radius", "attack.fraction=0.2"], "attack.kind"),
        (["algorithm=fedgem", "scenario.k_min=6"], "scenario.k_min"),
        (["algorithm=fedgem", "scenario.k_min=1"], "scenario.k_min"),
        (["algorithm=fedgem", "scenario.k_max=7"], "scenario.k_max"),
        (["algorithm=fedgem", "scenario.n_train=50"], "scenario.n_train"),
        (["algorithm=fedgem", "scenario.setting=skewed"], "scenario.setting"),
        (["algorithm=fedgem", "algorithm.upsilon=0"], "algorithm.upsilon"),
        (["algorithm=fedgem", "algorithm.upsilon=-2"], "algorithm.upsilon"),
        (["algorithm=fedgem", "algorithm.upsilon_grid=[]"], "algorithm.upsilon_grid"),
        (["algorithm=fedgem", "algorithm.rounds=-1"], "algorithm.rounds"),
        (["algorithm=fedgem", "scenario=files"], "scenario.paths"),
        (["algorithm=fedgem", "attack.kind=scaled_junk", "attack.fraction=0.1"], "attack.kind"),
        (["algorithm=fedgem", "attack.kind=inflated_radius", "attack.fraction=1.0"], "attack.fraction"),
    ],
)
def test_bad_values_name_the_key(overrides, key):
    cfg = compose_config(overrides)
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    assert str(info.value).startswith(key), str(info.value)


def test_scenario_must_fit_the_algorithm():
    cfg = compose_config(["algorithm=rfica", "scenario=blobs"])
    with pytest.raises(ConfigError, match="does not fit algorithm=rfica"):
        validate_config(cfg)


def test_missing_section_is_named(rfica_cfg):
    cfg = dict(rfica_cfg)
    del cfg["scenario"]
    with pytest.raises(ConfigError, match="scenario is missing"):
        validate_config(cfg)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["algorithm=fedgem", "algorithm.participation=0"], "algorithm.participation"),
        (["algorithm=fedgem", "algorithm.participation=1.5"], "algorithm.participation"),
        (["algorithm=fedgem", "algorithm.radius_outlier_factor=0.5"], "algorithm.radius_outlier_factor"),
        (["algorithm=fedgem", "algorithm.count_cap_factor=0.5"], "algorithm.count_cap_factor"),
        (["algorithm=fedgem", "baseline_methods=[central-gmm,em]"], "baseline_methods"),
    ],
)
def test_bad_robustness_values_name_the_key(overrides, key):
    with pytest.raises(ConfigError) as info:
        validate_config(compose_config(overrides))
    assert str(info.value).startswith(key), str(info.value)
