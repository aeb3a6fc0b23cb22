"""Each algorithm parameter declared once (fedica.parameters): its rule, its default, and everyone using both."""

import dataclasses
import inspect
from pathlib import Path

import fedica.conf
import numpy as np
import pytest
import yaml

import fedica
from fedica import parameters
from fedica.fedgem import estimator as fedgem_estimator
from fedica.fedgem import geometry
from fedica.fedgem.coordinator import FedGEMSettings
from fedica.parameters import FEDGEM_PARAMETERS, RFICA_PARAMETERS, UPSILON_CRITERIA, Interval, Options, Parameter, PositiveNumbers
from fedica.rfica import aggregation, local
from fedica.rfica import estimator as rfica_estimator

CONF_DIR = Path(fedica.conf.__file__).resolve().parent


# ---------------------------------------------------------------- the kit


@pytest.mark.parametrize("parameter, value, kind, message", [
    (Parameter("rounds", (Interval("integer", 0),), 10, ""), "ten", TypeError, "rounds='ten': must be an integer >= 0"),
    (Parameter("rounds", (Interval("integer", 0),), 10, ""), 2.0, TypeError, "rounds=2.0: must be an integer >= 0"),
    (Parameter("rounds", (Interval("integer", 0),), 10, ""), True, TypeError, "rounds=True: must be an integer >= 0"),
    (Parameter("rounds", (Interval("integer", 0),), 10, ""), -1, ValueError, "rounds=-1: must be >= 0"),
    (Parameter("p", (Interval("real", 0, 1, "right"),), 1.0, ""), 0, ValueError, "p=0: must be in (0, 1]"),
    (Parameter("p", (Interval("real", 0, 1, "right"),), 1.0, ""), float("nan"), ValueError,
     "p=nan: must be a finite number in (0, 1]"),
    (Parameter("p", (Interval("real", 0, 0.5, "left"),), 0.2, ""), 0.5, ValueError, "p=0.5: must be in [0, 0.5)"),
    (Parameter("tol", (Interval("real", 0, None, "neither"),), 1.0, ""), "x", TypeError,
     "tol='x': must be a finite number > 0"),
    (Parameter("c", (Options(("a", "b")),), "a", ""), "c", ValueError, "c='c': must be one of a, b"),
    (Parameter("c", (Options(("a", "b")),), "a", ""), 1, TypeError, "c=1: must be one of a, b"),
    (Parameter("u", (Interval("real", 0, None, "neither"), Options(("auto",))), "auto", ""), "Auto", ValueError,
     "u='Auto': must be a positive number or auto"),
    (Parameter("u", (Interval("real", 0, None, "neither"), Options(("auto",))), "auto", ""), [1.0], TypeError,
     "u=[1.0]: must be a positive number or auto"),
    (Parameter("grid", (PositiveNumbers(),), (1.0,), ""), [], ValueError,
     "grid=[]: must be a non-empty list of positive numbers"),
    (Parameter("grid", (PositiveNumbers(),), (1.0,), ""), [1, -2], ValueError,
     "grid=[1, -2]: must be a non-empty list of positive numbers"),
    (Parameter("grid", (PositiveNumbers(),), (1.0,), ""), "1,2", TypeError,
     "grid='1,2': must be a non-empty list of positive numbers"),
])
def test_a_broken_rule_is_one_line_naming_the_parameter(parameter, value, kind, message):
    with pytest.raises(kind) as info:
        parameter.check(value)
    assert type(info.value) is kind and str(info.value) == message


def test_allowed_values_pass_and_none_only_where_declared():
    grid = Parameter("grid", (PositiveNumbers(),), (1.0,), "")
    for good in ([0.5, 2], (1,), np.array([0.1, 3.0])):
        grid.check(good)
    cap = Parameter("cap", (Interval("real", 1),), 3.0, "", none=True)
    assert cap.check(None) is None and cap.check(1) == 1
    with pytest.raises(TypeError, match=r"^rounds=None: must be an integer in \[0, 10000\]$"):
        FEDGEM_PARAMETERS["rounds"].check(None)
    assert FEDGEM_PARAMETERS["rounds"].check(np.int64(3)) == 3


def test_a_default_breaking_its_own_rule_is_refused_when_declared():
    with pytest.raises(AssertionError, match="the default of k breaks its rule"):
        parameters.Declaration("x", Parameter("k", (Interval("integer", 2),), 1, ""))


# ---------------------------------------------------------------- one declaration, every user


def test_the_implementing_modules_take_the_declared_option_lists():
    assert RFICA_PARAMETERS["contrast"].constraints[0].values is local.CONTRASTS
    assert RFICA_PARAMETERS["local_solver"].constraints[0].values is local.SOLVERS
    assert RFICA_PARAMETERS["init"].constraints[0].values is local.INITS
    assert RFICA_PARAMETERS["benchmark"].constraints[0].values is aggregation.BENCHMARK_RULES
    assert RFICA_PARAMETERS["clustering"].constraints[0].values is aggregation.CLUSTERINGS
    assert RFICA_PARAMETERS["center"].constraints[0].values is aggregation.CENTERS
    assert FEDGEM_PARAMETERS["upsilon_criterion"].constraints[0].values is UPSILON_CRITERIA
    assert FEDGEM_PARAMETERS["labelling"].constraints[0].values is geometry.LABELLINGS


def test_todays_defaults_are_unchanged():
    assert FEDGEM_PARAMETERS.defaults() == {
        "rounds": 10, "local_steps": 1, "upsilon": "auto", "upsilon_grid": (0.1, 0.5, 1.0, 5.0, 10.0, 50.0),
        "upsilon_criterion": "likelihood", "same_client_rule": "evidence", "guard_factor": 1.5, "n_init": 3,
        "local_start": "seeds",
        "silhouette_sample": 1000,
        "radius_outlier_factor": 10.0, "count_cap_factor": 10.0, "component_cap_factor": 3.0,
        "max_hostile_fraction": 0.25, "max_overlap_pairs": 20_000_000, "participation": 1.0,
        "covariance_type": "auto", "labelling": "adapted", "standardize": "federated", "min_clients": 2, "max_local_clusters": 10,
        "random_state": 0,
        "dp_epsilon": None, "dp_delta": 1e-5, "dp_clip": None, "dp_unit": "record"}
    assert RFICA_PARAMETERS.defaults() == {"contrast": "logcosh", "init": "random", "local_solver": "picard",
                                           "n_components": None, "whitening": None, "benchmark": "medoid",
                                           "kmeans_restarts": 10, "gm_tol": 1e-10, "clustering": "matched",
                                           "center": "trimmed_mean", "refine_rounds": 20,
                                           "min_clients": 2, "random_state": 0,
                                           "dp_epsilon": None, "dp_delta": 1e-5, "n_jobs": None}


def test_only_the_measured_improvements_have_a_paper_value_apart():
    # The library defaults to the measured improvements (learned variances: results independent of the data's
    # units; a site's over-split joined on the federation's evidence; a site's points labelled by its own mixture;
    # one column per site per cluster; the trimmed mean; Picard with logcosh; the refinement); the paper preset,
    # which runs the paper's experiments, keeps the paper's identity covariance, strict same-client rule, consensus
    # labels, k-means, geometric median, FastICA, cube and one shot, so the paper's numbers stay as they were.
    expected = {"fedgem": {"covariance_type": ("auto", "identity"), "same_client_rule": ("evidence", "strict"),
                           "labelling": ("adapted", "consensus"), "standardize": ("federated", None)},
                "rfica": {"clustering": ("matched", "kmeans"), "center": ("trimmed_mean", "geometric_median"),
                          "contrast": ("logcosh", "cube"), "local_solver": ("picard", "fastica"),
                          "refine_rounds": (20, 0)}}
    for declaration in (FEDGEM_PARAMETERS, RFICA_PARAMETERS):
        library, config = declaration.defaults(), declaration.config_defaults()
        assert list(config) == list(declaration.config_keys)
        assert config == {k: library[k] for k in declaration.config_keys}  # one set of defaults
        apart = {k: (library[k], v) for k, v in declaration.paper_preset().items()}
        assert apart == expected[declaration.algorithm]
    assert FEDGEM_PARAMETERS["covariance_type"].constraints[0].values is geometry.COVARIANCE_TYPES


def test_a_paper_value_breaking_its_rule_or_without_a_config_key_is_refused_when_declared():
    with pytest.raises(AssertionError, match="the paper's value of c breaks its rule"):
        parameters.Declaration("x", Parameter("c", (Options(("a", "b")),), "a", "", paper="z"))
    with pytest.raises(AssertionError, match="the paper's value of c breaks its rule or has no config key"):
        parameters.Declaration("x", Parameter("c", (Options(("a", "b")),), "a", "", in_config=False, paper="b"))


@pytest.mark.parametrize("estimator, declaration", [(fedica.FedGEM, FEDGEM_PARAMETERS),
                                                    (fedica.RFICA, RFICA_PARAMETERS)])
def test_the_estimators_paper_preset_is_the_declared_one(estimator, declaration):
    assert estimator.paper().get_params() == {**declaration.defaults(), **declaration.paper_preset()}
    assert estimator.paper(random_state=3).get_params() == {**declaration.defaults(), **declaration.paper_preset(),
                                                            "random_state": 3}


def _signature_defaults(function):
    return {name: p.default for name, p in inspect.signature(function).parameters.items()
            if p.default is not inspect.Parameter.empty}


@pytest.mark.parametrize("estimator, declaration", [(fedica.FedGEM, FEDGEM_PARAMETERS),
                                                    (fedica.RFICA, RFICA_PARAMETERS)])
def test_the_estimators_signatures_are_the_declaration(estimator, declaration):
    assert _signature_defaults(estimator.__init__) == declaration.defaults()
    assert list(estimator().get_params()) == sorted(declaration)


def test_the_server_settings_and_the_strategies_take_the_declared_defaults():
    from fedica.server.fedgem import FedGEMStrategy
    from fedica.server.rfica import RFICAStrategy

    settings = {f.name: f.default for f in dataclasses.fields(FedGEMSettings)}
    declared = FEDGEM_PARAMETERS.defaults()
    assert settings == {**{k: declared[k] for k in FEDGEM_PARAMETERS.config_keys},
                        "min_clients": declared["min_clients"], "seed": declared["random_state"]}
    fedgem = _signature_defaults(FedGEMStrategy.__init__)
    assert {k: fedgem[k] for k in (*FEDGEM_PARAMETERS.config_keys, "random_state")} == {
        k: declared[k] for k in (*FEDGEM_PARAMETERS.config_keys, "random_state")}
    rfica = _signature_defaults(RFICAStrategy.__init__)
    assert {k: rfica[k] for k in (*RFICA_PARAMETERS.config_keys, "random_state")} == {
        k: RFICA_PARAMETERS[k].default for k in (*RFICA_PARAMETERS.config_keys, "random_state")}


@pytest.mark.parametrize("name, declaration", [("fedgem", FEDGEM_PARAMETERS), ("rfica", RFICA_PARAMETERS)])
def test_the_algorithm_yaml_holds_exactly_the_declared_keys_and_defaults(name, declaration):
    conf = yaml.safe_load((CONF_DIR / "algorithm" / f"{name}.yaml").read_text())
    values = {k: v for k, v in conf.items() if k not in ("defaults", "name")}
    assert list(values) == list(declaration.config_keys)
    assert values == {k: list(v) if isinstance(v, tuple) else v for k, v in declaration.config_defaults().items()}
    for key, value in values.items():
        default = declaration[key].default
        assert type(value) is type(default) or isinstance(default, tuple), key


@pytest.mark.parametrize("name, declaration", [("fedgem", FEDGEM_PARAMETERS), ("rfica", RFICA_PARAMETERS)])
def test_the_paper_yaml_is_the_algorithm_with_the_declared_paper_values(name, declaration):
    from hydra import compose, initialize_config_module

    conf = yaml.safe_load((CONF_DIR / "algorithm" / f"{name}_paper.yaml").read_text())
    assert conf["defaults"] == [name, "_self_"]
    assert {k: v for k, v in conf.items() if k != "defaults"} == declaration.paper_preset()
    with initialize_config_module("fedica.conf", version_base=None):
        library = compose("config", [f"algorithm={name}"])
        paper = compose("config", [f"algorithm={name}_paper"])
    assert paper.algorithm == {**library.algorithm, **declaration.paper_preset()}
    assert paper.scenario == library.scenario


def test_every_paper_experiment_runs_the_paper_preset():
    # The papers' figures and tables keep their numbers: every experiment composes algorithm=<name>_paper.
    from hydra import compose, initialize_config_module

    experiments = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
    assert len(experiments) >= 17
    # The one experiment that measures the library's defaults against the central analyst (issue 44).
    defaults = {"fedgem_central_yardstick"}
    with initialize_config_module("fedica.conf", version_base=None):
        for experiment in experiments:
            cfg = compose("config", [f"+experiment={experiment}"], return_hydra_config=True)
            preset = cfg.algorithm.name if experiment in defaults else f"{cfg.algorithm.name}_paper"
            assert cfg.hydra.runtime.choices.algorithm == preset, experiment


# ---------------------------------------------------------------- the strategies refuse at construction


@pytest.mark.parametrize("kwargs, kind, message", [
    ({"upsilon_criterion": "silhoutte"}, ValueError, "upsilon_criterion='silhoutte': must be one of likelihood, silhouette"),
    ({"rounds": "ten"}, TypeError, "rounds='ten': must be an integer in [0, 10000]"),
    ({"upsilon": "Auto"}, ValueError, "upsilon='Auto': must be a number in (0, 1000000] or auto"),
    ({"upsilon_grid": []}, ValueError, "upsilon_grid=[]: must be a non-empty list of positive numbers of at most 1000000"),
    ({"covariance_type": "tied"}, ValueError, "covariance_type='tied': must be one of identity, spherical, diag, full, auto"),
])
def test_the_fedgem_strategy_refuses_a_bad_parameter_at_construction(kwargs, kind, message):
    from fedica.server.fedgem import FedGEMStrategy

    with pytest.raises(kind) as info:
        FedGEMStrategy(**kwargs)
    assert type(info.value) is kind and str(info.value) == message


@pytest.mark.parametrize("kwargs, kind, message", [
    ({"contrast": "tanh"}, ValueError, "contrast='tanh': must be one of cube, logcosh"),
    ({"kmeans_restarts": 0}, ValueError, "kmeans_restarts=0: must be >= 1"),
    ({"gm_tol": "small"}, TypeError, "gm_tol='small': must be a finite number > 0"),
    ({"random_state": -1}, ValueError, "random_state=-1: must be >= 0"),
    ({"local_solver": "infomax"}, ValueError, "local_solver='infomax': must be one of fastica, picard"),
    ({"n_components": 1.0}, ValueError, "n_components=1.0: must be an integer >= 1 or a number in (0, 1)"),
    ({"n_components": "4"}, TypeError, "n_components='4': must be an integer >= 1 or a number in (0, 1)"),
    ({"whitening": "global"}, ValueError, "whitening='global': must be one of federated, local"),
])
def test_the_rfica_strategy_refuses_a_bad_parameter_at_construction(kwargs, kind, message):
    from fedica.server.rfica import RFICAStrategy

    with pytest.raises(kind) as info:
        RFICAStrategy(**kwargs)
    assert type(info.value) is kind and str(info.value) == message


# ---------------------------------------------------------------- the estimators refuse before any work


@pytest.fixture
def no_work(monkeypatch):
    """Every kernel the estimators' fits start with fails if called: a refusal must come before it."""
    def fail(*args, **kwargs):
        raise AssertionError("work started before the arguments were checked")

    monkeypatch.setattr(fedgem_estimator, "estimate_n_components", fail)
    monkeypatch.setattr(fedgem_estimator, "FedGEMServer", fail)
    monkeypatch.setattr(fedgem_estimator, "InMemoryFederation", fail)
    monkeypatch.setattr(rfica_estimator, "rfica_protocol", fail)
    monkeypatch.setattr(rfica_estimator, "receive_estimates", fail)
    monkeypatch.setattr(rfica_estimator, "InMemoryFederation", fail)


SITES = [np.random.default_rng(g).standard_normal((30, 2)) for g in range(3)]


@pytest.mark.parametrize("kwargs, kind, message", [
    ({"upsilon_criterion": "silhoutte"}, ValueError, "upsilon_criterion='silhoutte': must be one of likelihood, silhouette"),
    ({"upsilon": "Auto"}, ValueError, "upsilon='Auto': must be a number in (0, 1000000] or auto"),
    ({"rounds": "ten"}, TypeError, "rounds='ten': must be an integer in [0, 10000]"),
    ({"participation": 1.5}, ValueError, "participation=1.5: must be in (0, 1]"),
    ({"max_local_clusters": 1}, ValueError, "max_local_clusters=1: must be >= 2"),
    ({"max_overlap_pairs": 0}, ValueError, "max_overlap_pairs=0: must be >= 1"),
    ({"covariance_type": "tied"}, ValueError, "covariance_type='tied': must be one of identity, spherical, diag, full, auto"),
    ({"random_state": -3}, ValueError, "random_state=-3: must be >= 0"),
])
@pytest.mark.parametrize("n_local_clusters", [None, 2])
def test_fedgem_fit_refuses_a_bad_parameter_before_any_work(no_work, kwargs, kind, message, n_local_clusters):
    with pytest.raises(kind) as info:
        fedica.FedGEM(**kwargs).fit(SITES, n_local_clusters)
    assert type(info.value) is kind and str(info.value) == message


def test_fedgem_fit_refuses_n_local_clusters_of_the_wrong_length_before_any_work(no_work):
    with pytest.raises(ValueError) as info:
        fedica.FedGEM().fit(SITES, [2, 3])
    assert str(info.value).startswith("n_local_clusters=[2, 3]: must be one int or one per site (3 sites)")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kwargs, kind, message", [
    ({"contrast": "tanh"}, ValueError, "contrast='tanh': must be one of cube, logcosh"),
    ({"init": 0}, TypeError, "init=0: must be one of random, shared"),
    ({"gm_tol": 0.0}, ValueError, "gm_tol=0.0: must be > 0"),
    ({"min_clients": 0}, ValueError, "min_clients=0: must be >= 1"),
    ({"local_solver": "picardo"}, ValueError, "local_solver='picardo': must be one of fastica, picard"),
    ({"n_components": 0}, ValueError, "n_components=0: must be an integer >= 1 or a number in (0, 1)"),
    ({"whitening": True}, TypeError, "whitening=True: must be one of federated, local"),
])
def test_rfica_fit_and_aggregate_refuse_a_bad_parameter_before_any_work(no_work, kwargs, kind, message):
    with pytest.raises(kind) as info:
        fedica.RFICA(**kwargs).fit(SITES)
    assert type(info.value) is kind and str(info.value) == message
    with pytest.raises(kind) as info:
        fedica.RFICA(**kwargs).aggregate(np.stack([np.eye(2)] * 3))
    assert str(info.value) == message


def test_rfica_aggregate_names_a_wrong_count_of_sample_sizes(no_work):
    with pytest.raises(ValueError, match=r"^n_samples=\[10, 10\]: must be one positive integer count per site \(3 sites\)$"):
        fedica.RFICA().aggregate(np.stack([np.eye(2)] * 3), [10, 10])


def test_scenario_files_names_no_model_of_its_own():
    # One set of defaults: a user's files are clustered with the algorithm's (the library's) model, as every scenario.
    files = yaml.safe_load((CONF_DIR / "scenario" / "files.yaml").read_text())
    assert not {"covariance_type", "same_client_rule", "labelling"} & set(files)
    assert "oc.select" not in (CONF_DIR / "algorithm" / "fedgem.yaml").read_text()
