"""Config validation: one schema, one validator; every user mistake is one ConfigError naming the key and the rule."""

import ast
import copy
import os
import subprocess
import sys
from pathlib import Path

import fedica.conf
import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from fedica import attacks, config, parameters
from fedica.config import ConfigError, validate_config
from fedica.data import blobs, scenarios
from fedica.evaluation import baselines

CONF_DIR = Path(fedica.conf.__file__).resolve().parent
REPO = Path(__file__).resolve().parent.parent
EXPERIMENTS = sorted(path.stem for path in (CONF_DIR / "experiment").glob("*.yaml"))


def compose_config(overrides, *, hydra_config=False):
    """The resolved config ``fedica-run`` gets (Hydra's own ``hydra`` node removed, as Hydra does for the task)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=list(overrides), return_hydra_config=hydra_config)
    if hydra_config:
        return cfg
    return OmegaConf.to_container(cfg, resolve=True)


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
def test_every_fedgem_scenario_composes_with_the_librarys_defaults(scenario):
    checked = validate_config(compose_config(["algorithm=fedgem", f"scenario={scenario}"]))
    assert (checked["algorithm"]["name"], checked["scenario"]["name"]) == ("fedgem", scenario)
    defaults = {k: list(v) if isinstance(v, tuple) else v for k, v in parameters.FEDGEM_PARAMETERS.config_defaults().items()}
    assert {k: v for k, v in checked["algorithm"].items() if k != "name"} == defaults  # no scenario names its own


@pytest.mark.parametrize("engine", ["simulation", "inprocess", "deployment"])
def test_every_engine_composes(engine):
    checked = validate_config(compose_config([f"engine={engine}"]))
    assert checked["engine"]["name"] == engine
    assert set(checked["engine"]) == {"name", *config.SECTION_KEYS["engine"][engine]}


# ---------------------------------------------------------------- the returned config


def test_returns_a_plain_deep_copy_with_the_same_values(rfica_cfg):
    cfg = copy.deepcopy(rfica_cfg)
    cfg["baseline_methods"] = ("central-gmm",)  # a tuple, as a library user may pass
    checked = validate_config(cfg)
    assert type(checked) is dict and type(checked["scenario"]) is dict
    assert checked["baseline_methods"] == ["central-gmm"] and type(checked["baseline_methods"]) is list
    assert checked == {**rfica_cfg, "baseline_methods": ["central-gmm"]}
    checked["scenario"]["n_clients"] = 3
    assert cfg["scenario"]["n_clients"] == 30  # a copy, not a view
    # Types are kept, nothing is filled in or converted: a config composed again gives the same dict.
    assert validate_config(rfica_cfg) == rfica_cfg
    assert type(validate_config(rfica_cfg)["round_timeout"]) is type(rfica_cfg["round_timeout"])


def test_validating_again_is_harmless(fedgem_cfg):
    once = validate_config(fedgem_cfg)
    assert validate_config(once) == once == fedgem_cfg


def test_an_omegaconf_config_becomes_plain_dicts():
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose(config_name="config", overrides=["algorithm=fedgem"])
    checked = validate_config(cfg)
    assert type(checked) is dict and type(checked["algorithm"]["upsilon_grid"]) is list
    assert checked == OmegaConf.to_container(cfg, resolve=True)


# ---------------------------------------------------------------- unknown keys


@pytest.mark.parametrize(
    "overrides, key, known",
    [
        (["+algoritm=fedgem"], "algoritm", "the top level has keys seed, min_clients, round_timeout"),
        (["+n_clients=5"], "n_clients", "the top level has keys seed,"),
        (["+hydra_extra=1"], "hydra_extra", "the top level has keys"),
        (["+algorithm.rounds=3"], "algorithm.rounds", "algorithm 'rfica' has keys contrast, init, local_solver, n_components, whitening, benchmark, kmeans_restarts, gm_tol, clustering"),
        (["algorithm=fedgem", "+algorithm.contrast=cube"], "algorithm.contrast", "algorithm 'fedgem' has keys rounds,"),
        (["+scenario.n_client=5"], "scenario.n_client", "scenario 'ica_paper' has keys n_clients, r, corrupt_ratio"),
        (["algorithm=fedgem", "+scenario.n_client=5"], "scenario.n_client",
         "scenario 'blobs' has keys n_clients, n_clusters, dim, r_min, n_train, n_test, setting, k_min, k_max"),
        (["algorithm=fedgem", "scenario=digits", "+scenario.n_samples=500"], "scenario.n_samples",
         "scenario 'digits' has keys n_clients, test_fraction, k_min, k_max"),
        (["algorithm=fedgem", "scenario=waveform", "+scenario.dim=3"], "scenario.dim", "scenario 'waveform' has keys"),
        (["algorithm=fedgem", "scenario=files", "+scenario.n_clients=2"], "scenario.n_clients", "scenario 'files' has keys paths,"),
        (["+scenario.extra.deep=1"], "scenario.extra", "scenario 'ica_paper' has keys"),
        (["+engine.client_num_cpu=2"], "engine.client_num_cpu", "engine 'simulation' has keys client_num_cpus"),
        (["engine=inprocess", "+engine.client_num_cpus=2"], "engine.client_num_cpus", "engine 'inprocess' has keys n_jobs"),
        (["engine=deployment", "+engine.port=8080"], "engine.port", "engine 'deployment' has keys host, superlink_port,"),
        (["+attack.name=none"], "attack.name", "attack has keys kind, fraction"),
        (["+attack.fractions=0.1"], "attack.fractions", "attack has keys kind, fraction"),
        (["+experiment=rfica_fig1_k", "+plot.y=error"], "plot.y", "plot has keys x, xlabel, metrics"),
    ],
)
def test_unknown_keys_are_refused_with_the_known_keys(overrides, key, known):
    with pytest.raises(ConfigError) as info:
        validate_config(compose_config(overrides))
    first, *others = info.value.errors
    assert first.startswith(f"{key}: unknown key; {known}"), str(info.value)
    # The other lines (scenario=files without paths) are the config's other mistakes, not this key again.
    assert not any("unknown key" in line for line in others), str(info.value)


def test_an_unknown_key_is_reported_before_a_bad_value():
    with pytest.raises(ConfigError, match=r"^scenario\.n_client: unknown key"):
        validate_config(compose_config(["+scenario.n_client=5", "scenario.r=1", "seed=-1"]))


def test_a_near_miss_is_suggested():
    with pytest.raises(ConfigError, match=r"\(did you mean scenario\.n_clients\?\)$"):
        validate_config(compose_config(["+scenario.n_client=5"]))
    with pytest.raises(ConfigError, match=r"\(did you mean algorithm\?\)$"):
        validate_config(compose_config(["+algoritm=fedgem"]))


def test_unknown_keys_in_a_hand_built_config(rfica_cfg):
    cfg = copy.deepcopy(rfica_cfg)
    cfg["attack"]["strength"] = 2.0
    with pytest.raises(ConfigError, match=r"^attack\.strength: unknown key; attack has keys kind, fraction"):
        validate_config(cfg)


@pytest.mark.parametrize("section, key", [("", "seed"), ("", "log_level"), ("scenario", "n_corrupt"),
                                          ("algorithm", "gm_tol"), ("engine", "client_num_cpus"), ("attack", "fraction")])
def test_every_schema_key_is_required(rfica_cfg, section, key):
    cfg = copy.deepcopy(rfica_cfg)
    del (cfg[section] if section else cfg)[key]
    with pytest.raises(ConfigError, match=rf"^{section + '.' if section else ''}{key} is missing$"):
        validate_config(cfg)


# ---------------------------------------------------------------- fedica-run itself


def _fedica_run(tmp_path, *overrides):
    executable = Path(sys.executable).parent / "fedica-run"
    command = [str(executable)] if executable.exists() else [sys.executable, "-m", "fedica.scripts.run"]
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
    return subprocess.run(
        [*command, *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )


@pytest.mark.parametrize(
    "overrides, line",
    [
        (["+scenario.n_client=5"],
         "scenario.n_client: unknown key; scenario 'ica_paper' has keys n_clients, r, corrupt_ratio, n_normal, "
         "n_corrupt, sparsity, orthogonal (did you mean scenario.n_clients?)"),
        (["+algoritm=fedgem"],
         "algoritm: unknown key; the top level has keys seed, min_clients, round_timeout, node_wait_timeout, min_nodes, "
         "baselines, baseline_methods, log_level, resume, algorithm, scenario, engine, attack, plot, workload (did you mean algorithm?)"),
        (["algorithm=fedgem", "+algorithm.kmeans_restarts=3"], "algorithm.kmeans_restarts: unknown key; algorithm 'fedgem' has keys"),
        (["engine=inprocess", "+engine.host=0.0.0.0"], "engine.host: unknown key; engine 'inprocess' has keys n_jobs"),
        (["+attack.seed=3"], "attack.seed: unknown key; attack has keys kind, fraction"),
        (["engine=deployment", "engine.superlink_port=-1"], "engine.superlink_port=-1: must be a port number in 1..65535"),
        (["engine=inprocess", "engine.n_jobs=0"], "engine.n_jobs=0: must be a thread count >= 1, or -1 for every core"),
        (["seed=${nope}"], "Interpolation key 'nope' not found"),
    ],
)
@pytest.mark.slow
def test_fedica_run_refuses_with_one_line_and_status_2(tmp_path, overrides, line):
    done = _fedica_run(tmp_path, *overrides)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"fedica-run: configuration error: {line}"), done.stderr
    assert done.stderr.count("\n") == 1 and done.stdout == "", done.stderr
    assert not (tmp_path / "run" / "result.json").exists()


@pytest.mark.slow
def test_fedica_run_refuses_in_a_sweep(tmp_path):
    done = _fedica_run(tmp_path, "-m", "+experiment=rfica_fig1_k", "seed=0,1", "+scenario.n_client=5",
                       f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert done.returncode == 2, done.stderr
    assert "fedica-run: configuration error: scenario.n_client: unknown key; scenario 'ica_paper'" in done.stderr
    assert not list((tmp_path / "sweep").glob("*/result.json"))


# ---------------------------------------------------------------- values


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
        (["algorithm.benchmark=smallest"], "algorithm.benchmark"),
        (["seed=-1"], "seed"),
        (["min_clients=31"], "min_clients"),
        (["round_timeout=0"], "round_timeout"),
        (["node_wait_timeout=nan"], "node_wait_timeout"),
        (["log_level=LOUD"], "log_level"),
        (["baselines=maybe"], "baselines"),
        (["attack.kind=inflated_radius", "attack.fraction=0.2"], "attack.kind"),
        (["algorithm=fedgem", "scenario.k_min=6"], "scenario.k_min"),
        (["algorithm=fedgem", "scenario.k_min=1"], "scenario.k_min"),
        (["algorithm=fedgem", "scenario.k_max=7"], "scenario.k_max"),
        (["algorithm=fedgem", "scenario.n_train=50"], "scenario.n_train"),
        (["algorithm=fedgem", "scenario.setting=skewed"], "scenario.setting"),
        (["algorithm=fedgem", "algorithm.upsilon=0"], "algorithm.upsilon"),
        (["algorithm=fedgem", "algorithm.upsilon=-2"], "algorithm.upsilon"),
        (["algorithm=fedgem", "algorithm.upsilon=big"], "algorithm.upsilon"),
        (["algorithm=fedgem", "algorithm.upsilon_grid=[]"], "algorithm.upsilon_grid"),
        (["algorithm=fedgem", "algorithm.rounds=-1"], "algorithm.rounds"),
        (["algorithm=fedgem", "scenario=files"], "scenario.paths"),
        (["algorithm=fedgem", "scenario=digits", "scenario.test_fraction=0"], "scenario.test_fraction"),
        (["algorithm=fedgem", "scenario=waveform", "scenario.test_fraction=1"], "scenario.test_fraction"),
        (["algorithm=fedgem", "scenario=files", "scenario.paths=[a.csv]", "scenario.n_components=2",
          "scenario.test_fraction=1"], "scenario.test_fraction"),
        (["algorithm=fedgem", "scenario=files", "scenario.paths=[a.csv]", "scenario.n_components=2",
          "scenario.standardize=zscore"], "scenario.standardize"),
        (["algorithm=fedgem", "attack.kind=scaled_junk", "attack.fraction=0.1"], "attack.kind"),
        (["algorithm=fedgem", "attack.kind=inflated_radius", "attack.fraction=1.0"], "attack.fraction"),
        (["+experiment=rfica_fig1_k", "plot.x=scenario.n_client"], "plot.x"),
        (["+experiment=rfica_fig1_k", "plot.logy=often"], "plot.logy"),
    ],
)
def test_bad_values_name_the_key(overrides, key):
    cfg = compose_config(overrides)
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    assert str(info.value).startswith(key), str(info.value)


def test_test_fraction_zero_is_refused_up_front():
    with pytest.raises(ConfigError, match=r"^scenario\.test_fraction=0: must be in \(0, 1\)$"):
        validate_config(compose_config(["algorithm=fedgem", "scenario=digits", "scenario.test_fraction=0"]))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["engine=deployment", "engine.superlink_port=-1"], "engine.superlink_port=-1: must be a port number in 1..65535"),
        (["engine=inprocess", "engine.n_jobs=0"], "engine.n_jobs=0: must be a thread count >= 1, or -1 for every core"),
        (["engine=deployment", "engine.superlink_port=70000"], "engine.superlink_port=70000: must be a port number in 1..65535"),
        (["engine=deployment", "engine.supernode_port=8.5"], "engine.supernode_port=8.5: must be a port number in 1..65535"),
        (["engine=deployment", "engine.supernode_port=65530"],
         "engine.supernode_port=65530: the 30 SuperNodes need ports 65530..65559, beyond 65535"),
        (["engine=deployment", "engine.superlink_port=9100"],
         "engine.superlink_port=9100: falls in the SuperNodes' ports 9094..9123"),
        (["engine=deployment", "engine.shutdown_grace=-5"], "engine.shutdown_grace=-5: must be a positive number of seconds"),
        (["engine=deployment", "engine.startup_timeout=nan"], "engine.startup_timeout=nan: must be a positive number of seconds"),
        (["engine=deployment", "engine.startup_timeout=inf"], "engine.startup_timeout=inf: must be a positive number of seconds"),
        (["engine=deployment", "engine.run_timeout=0"], "engine.run_timeout=0: must be a positive number of seconds or null"),
        (["engine=deployment", "engine.tls=yes"], "engine.tls='yes': must be true or false"),
        (["engine=deployment", "engine.node_auth=true"], "engine.node_auth=True: needs engine.tls=true"),
        (["engine=deployment", "engine.host=''"], "engine.host='': must be a non-empty string"),
        (["engine=deployment", "engine.out_dir=''"], "engine.out_dir='': must be a non-empty string or null"),
        (["engine.client_num_cpus=0"], "engine.client_num_cpus=0: must be > 0"),
        (["engine.client_num_cpus=-1"], "engine.client_num_cpus=-1: must be > 0"),
        (["engine.client_num_cpus=nan"], "engine.client_num_cpus=nan: must be a finite number"),
        (["engine.client_num_cpus=1000000"], "engine.client_num_cpus=1000000: must be <= the "),
        (["engine.ray_address=localhost"], "engine.ray_address='localhost': must be null (Ray starts locally), auto, or "
                                           "HOST:PORT of the Ray head (port 1..65535)"),
        (["engine.ray_address='head:0'"], "engine.ray_address='head:0': must be null"),
        (["engine.ray_address='head:65536'"], "engine.ray_address='head:65536': must be null"),
        (["engine.ray_address=':6379'"], "engine.ray_address=':6379': must be null"),
        (["engine.ray_address='a b:6379'"], "engine.ray_address='a b:6379': must be null"),
        (["engine.ray_address=6379"], "engine.ray_address=6379: must be null"),
        (["engine.ray_address=local"], "engine.ray_address='local': must be null"),
        (["algorithm=fedgem", "scenario=files", "scenario.paths=[a.csv,b.csv]", "scenario.label_column=-1",
          "engine.ray_address=auto"],
         "engine.ray_address='auto': scenario=files runs on this machine's own Ray only"),
        (["algorithm=fedgem", "scenario=files", "scenario.paths=[/a.csv,/b.csv]", "scenario.n_components=2",
          "scenario.standardize=pool", "engine=deployment"],
         "scenario.standardize=pool: the pooled scale needs every site's file on this machine"),
    ],
)
def test_engine_mistakes_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as info:
        validate_config(compose_config(overrides))
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_good_deployment_options_pass_unchanged():
    engine = validate_config(compose_config(["engine=deployment", "engine.tls=true", "engine.node_auth=true",
                                             "engine.run_timeout=60", "engine.out_dir=outputs/deploy-check",
                                             "engine.host=0.0.0.0"]))["engine"]
    assert (engine["tls"], engine["node_auth"], engine["run_timeout"], engine["out_dir"], engine["host"]) == (
        True, True, 60, "outputs/deploy-check", "0.0.0.0")
    assert validate_config(compose_config(["engine.client_num_cpus=0.5"]))["engine"]["client_num_cpus"] == 0.5
    for override, address in (("auto", "auto"), ("10.0.0.5:6379", "10.0.0.5:6379"),
                              ("ray-head.lan:6379", "ray-head.lan:6379"), ("'[fd00::1]:6379'", "[fd00::1]:6379")):
        assert validate_config(compose_config([f"engine.ray_address={override}"]))["engine"]["ray_address"] == address
    # The cluster's nodes, not this machine, hold a clustered run's CPUs; on this machine the same count is refused.
    clustered = validate_config(compose_config(["engine.ray_address=auto", "engine.client_num_cpus=1000"]))
    assert clustered["engine"]["client_num_cpus"] == 1000
    with pytest.raises(ConfigError, match=r"^engine\.client_num_cpus=1000"):
        validate_config(compose_config(["engine.client_num_cpus=1000"]))


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


# ---------------------------------------------------------------- the experiments


def _sweep_values(experiment):
    """The sweeper params of an experiment: {key: [its values as override strings]}."""
    params = compose_config([f"+experiment={experiment}"], hydra_config=True).hydra.sweeper.get("params") or {}
    parsed = OverridesParser.create().parse_overrides([f"{key}={value}" for key, value in params.items()])
    return {o.get_key_element(): list(o.sweep_string_iterator()) if o.is_sweep_override() else [o.get_value_element_as_str()]
            for o in parsed}


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_config_validates(experiment):
    params = _sweep_values(experiment)
    assert params, f"{experiment} sweeps nothing"
    first = [f"{key}={values[0]}" for key, values in params.items()]
    cfg = validate_config(compose_config([f"+experiment={experiment}", *first]))
    assert cfg["engine"]["name"] == "inprocess" and "plot" in cfg
    # Each value of each swept key (the others at their first value) validates as well.
    for key, values in params.items():
        if key == "seed":
            continue
        for value in values[1:]:
            others = [o for o in first if not o.startswith(f"{key}=")]
            validate_config(compose_config([f"+experiment={experiment}", *others, f"{key}={value}"]))


def test_the_experiments_are_all_found():
    assert len(EXPERIMENTS) >= 9 and "rfica_fig1_k" in EXPERIMENTS


# ---------------------------------------------------------------- one schema, owned lists


def _yaml_keys(path):
    return {key for key in yaml.safe_load(path.read_text()) or {} if key not in ("defaults", "hydra")}


@pytest.mark.parametrize("group", ["algorithm", "scenario", "engine"])
def test_schema_has_exactly_the_keys_of_each_yaml(group):
    files = {path.stem: path for path in (CONF_DIR / group).glob("*.yaml")}
    # A preset (algorithm=<name>_paper) is its algorithm's file with some values changed, no key of its own.
    presets = {stem for stem in files if group == "algorithm" and stem.removesuffix("_paper") in files and stem.endswith("_paper")}
    assert set(files) - presets == set(config.SECTION_KEYS[group])
    for stem in presets:
        assert set(yaml.safe_load(files.pop(stem).read_text())) - {"defaults"} <= set(config.SECTION_KEYS[group][stem[:-6]])
    for name, path in files.items():
        assert _yaml_keys(path) == {"name", *config.SECTION_KEYS[group][name]}, path
        assert yaml.safe_load(path.read_text())["name"] == name, path


def test_schema_of_the_attacks_and_the_top_level():
    for path in (CONF_DIR / "attack").glob("*.yaml"):
        assert _yaml_keys(path) == set(config.ATTACK_KEYS), path
        assert yaml.safe_load(path.read_text())["kind"] == path.stem
    kinds = {path.stem for path in (CONF_DIR / "attack").glob("*.yaml")}
    assert kinds == set(config.ATTACKS_BY_ALGORITHM["rfica"]) | set(config.ATTACKS_BY_ALGORITHM["fedgem"])
    assert _yaml_keys(CONF_DIR / "config.yaml") | set(config.SECTIONS) == set(config.TOP_LEVEL_KEYS)
    for experiment in EXPERIMENTS:
        extra = _yaml_keys(CONF_DIR / "experiment" / f"{experiment}.yaml") - set(config.TOP_LEVEL_KEYS)
        assert extra <= set(config.OPTIONAL_TOP_LEVEL_KEYS), experiment


def test_the_scenario_keys_are_the_registrys_and_the_yamls():
    for path in (CONF_DIR / "scenario").glob("*.yaml"):
        assert _yaml_keys(path) == {"name", *scenarios.SCENARIOS[path.stem].keys}, path
    assert set(scenarios.SCENARIOS) == {path.stem for path in (CONF_DIR / "scenario").glob("*.yaml")}
    for name, scenario in scenarios.SCENARIOS.items():
        assert config.SECTION_KEYS["scenario"][name] is scenario.keys, name
    assert scenarios.SCENARIO_NAMES == ("blobs", "waveform", "digits", "mnist", "sklearn_real", "files")
    assert scenarios.ICA_SCENARIOS == ("ica_paper", "signals", "recordings", "files")


def test_the_algorithm_keys_are_the_parameter_declarations():
    for name, declaration in parameters.DECLARATIONS.items():
        assert config.SECTION_KEYS["algorithm"][name] == declaration.config_keys, name


def test_option_lists_come_from_the_modules_that_implement_them():
    assert config.SCENARIOS_BY_ALGORITHM == {"rfica": scenarios.ICA_SCENARIOS, "fedgem": scenarios.SCENARIO_NAMES}
    assert config.SCENARIOS_BY_ALGORITHM["fedgem"] is scenarios.SCENARIO_NAMES
    assert config.ATTACKS_BY_ALGORITHM == {
        "rfica": ("none", *attacks.ICA_ATTACKS, attacks.SPOOF_PARTITION, attacks.BLOATED_REPLY),
        "fedgem": ("none", *attacks.GEM_ATTACKS, *attacks.GEM_PROTOCOL_ATTACKS, attacks.SPOOF_PARTITION,
                   attacks.BLOATED_REPLY)}
    assert scenarios.SETTINGS is blobs.SETTINGS
    # The default runs the four cheap comparators; FFCM and AFCL are chosen by name (the tables experiment runs all).
    assert set(compose_config(["algorithm=fedgem"])["baseline_methods"]) <= set(baselines.BASELINE_METHODS)
    # The option values are not spelt out in the config package or the registry (scenario names do key the schema's
    # tables): fedica/parameters.py declares the algorithms' lists, tests/test_parameters.py checks that the
    # implementing modules take them.
    sources = [*sorted((REPO / "fedica" / "config").glob("*.py")), REPO / "fedica" / "data" / "scenarios.py"]
    for path in sources:
        source = path.read_text()
        for literal in ('"logcosh"', '"best_objective"', '"cluster_imbalance"', '"scaled_junk"', '"random_centroids"',
                        '"dp-gmm"'):
            assert literal not in source, f"{path.relative_to(REPO)} copies {literal} instead of importing it"


def test_the_config_rooms_import_no_private_name():
    """A leading-underscore name is used only inside its own module (the config's rooms are split by purpose)."""
    for path in [*sorted((REPO / "fedica" / "config").glob("*.py")), REPO / "fedica" / "parameters.py",
                 REPO / "fedica" / "data" / "scenarios.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fedica"):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                assert not private, f"{path.relative_to(REPO)} imports {private} from {node.module}"


@pytest.mark.slow
def test_a_misspelt_or_directory_data_path_stops_the_run_before_it_starts(tmp_path):
    good = tmp_path / "site0.csv"
    good.write_text("f0,f1\n" + "\n".join(f"{i}.0,{i % 3}.0" for i in range(30)) + "\n")
    missing = tmp_path / "site1.cvs"
    done = subprocess.run(
        [str(Path(sys.executable).with_name("fedica-run")), "algorithm=fedgem", "scenario=files", "engine=inprocess",
         f"scenario.paths=[{good},{missing}]", "scenario.n_components=2", f"hydra.run.dir={tmp_path / 'out'}"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"fedica-run: configuration error: scenario.paths[1]={missing}: no such file"]
    assert not (tmp_path / "out" / "result.json").exists()
    cfg = compose_config(["algorithm=fedgem", "scenario=files", "engine=inprocess", f"scenario.paths=[{good},{tmp_path}]",
                          "scenario.n_components=2"])
    with pytest.raises(ConfigError, match=r"scenario.paths\[1\]=.*: is a directory"):
        validate_config(cfg)
    # In a deployment each SuperNode reads its own data-path, which need not exist on the launcher's machine.
    validate_config(compose_config(["algorithm=fedgem", "scenario=files", "engine=deployment",
                                    f"scenario.paths=[{good},{missing}]", "scenario.n_components=2"]))


@pytest.mark.parametrize("overrides, message", [
    (["scenario.n_clients=10000000"], "scenario.n_clients=10000000: 10000000 clients are more than fedica's engines hold"),
    (["scenario.n_clients=100000", "scenario.n_normal=100000"], "scenario.n_normal=100000: the scenario's data would take"),
    (["algorithm=fedgem", "scenario.n_clusters=100000"], "scenario.n_clusters=100000: must be <= 10000"),
    (["algorithm=fedgem", "scenario.n_clusters=3000"], "scenario.n_train=2500: must be >= n_clusters (3000)"),
])
def test_unaffordable_scenarios_are_refused_before_anything_starts(overrides, message):
    with pytest.raises(ConfigError) as error:
        validate_config(compose_config(overrides))
    assert str(error.value).startswith(message), str(error.value)
