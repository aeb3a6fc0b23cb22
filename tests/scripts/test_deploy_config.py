"""The deployment launcher's configuration, without starting a process (issue 5): the Flower app it submits,
the overrides it sends the ServerApp, the SuperNodes' node configs and the commands for separate machines.

The tests that start real flower-superlink and flower-supernode processes are in test_deployment.py.
"""

import json
import shlex
import tomllib
from pathlib import Path

import pytest
from fedica.scripts import deploy
from fedica.scripts.deploy import (
    bind,
    secret as deploy_secret,
    superlink as deploy_superlink,
    compose,
    config_overrides,
    deployment_node_configs,
)
from fedica.server.app import parse_node_partitions
from flwr.common.config import parse_config_args

REPO = Path(__file__).resolve().parents[2]
# Small runs of each algorithm on three sites; only their configuration is composed here.
RFICA = ["scenario.n_clients=3", "scenario.n_normal=2000", "scenario.n_corrupt=200", "scenario.r=3"]
FEDGEM = ["algorithm=fedgem", "scenario.n_clients=3", "scenario.n_clusters=4", "scenario.r_min=8", "scenario.n_train=600",
          "scenario.n_test=600", "algorithm.rounds=2", "algorithm.upsilon=1.0", "baselines=false"]


def test_the_submitted_app_declares_the_projects_flower_app():
    ours = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    submitted = tomllib.loads(deploy.app_pyproject())
    assert submitted["tool"]["flwr"]["app"]["publisher"] == ours["publisher"]
    assert submitted["tool"]["flwr"]["app"]["components"] == ours["components"]
    assert submitted["tool"]["flwr"]["app"]["config"] == ours["config"]
    assert submitted["project"]["dependencies"] == []  # nothing for a runtime `uv sync` to fetch


@pytest.mark.parametrize("overrides", [
    ["engine=deployment"] + RFICA + ["seed=4", "round_timeout=12.5", "engine.tls=true"],
    ["engine=deployment"] + FEDGEM + ["algorithm.upsilon_grid=[0.5,2.0]", "+extra.note='a b'"],
    ["engine=deployment", "algorithm=fedgem", "scenario=files", "scenario.n_components=3",
     "scenario.paths=['/data/site a.csv',\"/data/it's.csv\"]"],
])
def test_overrides_for_the_serverapp_compose_the_same_config(overrides):
    cfg = compose(overrides)
    sent = config_overrides(cfg)
    assert compose(sent) == cfg
    assert "engine=deployment" in sent


def test_any_string_reaches_the_serverapp_unchanged_or_is_refused():
    cfg = compose(["engine=deployment", "algorithm=fedgem", "scenario=files", "scenario.n_components=2", "scenario.paths=[a,b]"])
    cfg["scenario"]["paths"] = ["C:\\data\\", "it's \\'odd\\'", 'q"uote', "null", "12", "é ü", ""]
    assert compose(config_overrides(cfg)) == cfg
    cfg["scenario"]["paths"] = ["${oops}"]  # OmegaConf would resolve it in the ServerApp
    with pytest.raises(deploy.DeploymentError, match="Hydra overrides"):
        config_overrides(cfg)


def test_files_scenario_gives_each_supernode_its_own_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = compose(["engine=deployment", "algorithm=fedgem", "scenario=files", "scenario.n_components=2",
                   "scenario.paths=[a.csv,sub/b.csv]"])
    configs = deployment_node_configs(cfg)
    assert configs == [
        {"partition-id": 0, "num-partitions": 2, "data-path": str(tmp_path / "a.csv")},
        {"partition-id": 1, "num-partitions": 2, "data-path": str(tmp_path / "sub" / "b.csv")},
    ]
    # Flower parses the --node-config value back into the same node config.
    odd_paths = [{"partition-id": 0, "num-partitions": 1, "data-path": path} for path in ("C:\\data\\site a.csv", "/data/it's.csv")]
    for config in configs + odd_paths:
        assert parse_config_args([deploy.node_config_arg(config)]) == config

def test_print_commands_for_separate_machines(tmp_path, capsys):
    code = deploy.main(RFICA + ["--print-commands", "--tls", "--node-auth", "--host", "0.0.0.0",
                                "--superlink-address", "link.example.org", "--superlink-port", "9443",
                                "--out-dir", str(tmp_path)])
    text = capsys.readouterr().out
    assert code == 0
    commands = [line for line in text.splitlines() if line and not line.startswith("#")]
    superlink = [c for c in commands if c.startswith("fedica-superlink")]
    supernodes = [c for c in commands if c.startswith("flower-supernode")]
    registrations = [c for c in commands if c.startswith("flwr supernode register")]
    assert len(superlink) == 1 and "--host 0.0.0.0 --port 9443" in superlink[0]
    assert "--enable-supernode-auth" in superlink[0] and "--ssl-certfile" in superlink[0] and "--insecure" not in superlink[0]
    assert len(supernodes) == 3 and len(registrations) == 3
    # The operator's connection is the SuperLink machine's loopback: fedica-superlink answers its Control API nowhere else.
    assert 'address = "127.0.0.1:9443"' in text
    for i, command in enumerate(supernodes):
        assert "--superlink link.example.org:9443" in command
        assert f"partition-id={i} num-partitions=3" in command
        assert f"--auth-supernode-private-key supernode-{i}" in command
    assert any(c.startswith("flwr run ") and "--run-config" in c for c in commands)
    # Every machine makes its own SuperExec secret; the SuperLink and each SuperNode hand tasks only to a
    # SuperExec that signs with it (process isolation), started beside them.
    isolated = "--isolation process --superexec-auth-secret-file superexec.secret"
    assert isolated in superlink[0] and all(isolated in c for c in supernodes)
    assert commands.count("python -m fedica.scripts.deploy.secret superexec.secret") == 4
    superexecs = [c for c in commands if c.startswith("flower-superexec")]
    assert len(superexecs) == 4 and all("--superexec-auth-secret-file superexec.secret" in c for c in superexecs)
    assert "--runtime-api-address 127.0.0.1:9443" in superexecs[0] and "--root-certificates" in superexecs[0]
    # The files the commands name exist, and the certificate is valid for the advertised name.
    from cryptography import x509

    cert = x509.load_pem_x509_certificate((tmp_path / "certs" / "server.pem").read_bytes())
    assert "link.example.org" in cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert (tmp_path / "keys" / "supernode-2.pub").exists() and (tmp_path / "app" / "fedica-app" / "pyproject.toml").exists()
    sent = compose(shlex.split(tomllib.loads((tmp_path / "run_config.toml").read_text())["overrides"]))
    assert sent["scenario"]["n_clients"] == 3 and sent["engine"]["node_auth"] is True and sent["engine"]["superlink_port"] == 9443
    # Step 3 keeps Flower's answers and binds each partition to its registered node.
    assert all(c.endswith(f"supernode-{i}.json") for i, c in enumerate(registrations))
    binder = [c for c in commands if "fedica.scripts.deploy.bind" in c]
    assert len(binder) == 1
    for i, node in enumerate((5551, 7772, 3333)):
        (tmp_path / "keys" / f"supernode-{i}.json").write_text(json.dumps({"success": True, "node-id": node}))
    assert bind.main([str(tmp_path)]) == 0
    run_config = tomllib.loads((tmp_path / "run_config.toml").read_text())
    assert parse_node_partitions(run_config["node-partitions"]) == {5551: 0, 7772: 1, 3333: 2}
    assert run_config["overrides"] and run_config["out-dir"]


def test_binding_refuses_missing_or_forged_registrations(tmp_path, capsys):
    (tmp_path / "run_config.toml").write_text('overrides = ""\n')
    assert bind.main([str(tmp_path)]) == 1
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "supernode-0.json").write_text("root:x:0:0")
    assert bind.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "run step 3's register commands first" in err and "not Flower's answer" in err and "root:x" not in err


def test_keys_certificates_and_secrets_are_written_as_new_private_files_only(tmp_path, capsys):
    # Row 5 of issue 43: key writing followed a symlink and kept an existing file's mode (a private key in a 644 file).
    elsewhere = tmp_path / "elsewhere.pem"
    elsewhere.write_text("someone else's file\n")
    printed = ["--print-commands", "--tls", "--node-auth", "--superlink-address", "link.example.org"]
    cases = {
        "a link in the key's place": lambda out: (out / "certs").mkdir() or (out / "certs" / "ca.pem").symlink_to(elsewhere),
        "an old key file": lambda out: (out / "keys").mkdir() or (out / "keys" / "supernode-1").write_text("old"),
        "a linked folder": lambda out: (out / "certs").symlink_to(tmp_path, target_is_directory=True),
    }
    for what, prepare in cases.items():
        out = tmp_path / what.replace(" ", "-")
        out.mkdir()
        prepare(out)
        assert deploy.main(RFICA + printed + ["--out-dir", str(out)]) == 2, what
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("fedica-deploy: ") and ("already exists" in err or "not a plain folder" in err), err
    assert elsewhere.read_text() == "someone else's file\n"
    assert (tmp_path / "an-old-key-file" / "keys" / "supernode-1").read_text() == "old"

    fresh = tmp_path / "fresh"
    assert deploy.main(RFICA + printed + ["--out-dir", str(fresh)]) == 0
    for secret in [fresh / "certs" / "server.key", *(fresh / "keys").glob("supernode-?")]:
        assert secret.stat().st_mode & 0o777 == 0o600, secret
    assert (fresh / "certs" / "ca.pem").stat().st_mode & 0o777 == 0o644

    secret = tmp_path / "superexec.secret"
    assert deploy_secret.main([str(secret)]) == 0
    assert secret.stat().st_mode & 0o777 == 0o600 and len(bytes.fromhex(secret.read_text())) == 32
    assert deploy_secret.main([str(secret)]) == 2  # never overwritten
    assert "already exists" in capsys.readouterr().err


def test_the_launcher_keeps_flowers_server_switches_out_of_its_processes(monkeypatch, tmp_path):
    # Row 4 of issue 43: FLWR_INTERNAL_GRPC_CONTROL_API=1 in the environment opened a gRPC Control API
    # outside the operator guard.
    monkeypatch.setenv("FLWR_INTERNAL_GRPC_CONTROL_API", "1")
    monkeypatch.setenv("FLWR_RUNTIME_BASE_URL", "http://elsewhere.example")
    monkeypatch.setenv("FLWR_LOG_LEVEL", "DEBUG")
    env = deploy.flower_environment(tmp_path)
    assert "FLWR_INTERNAL_GRPC_CONTROL_API" not in env and "FLWR_RUNTIME_BASE_URL" not in env
    assert env["FLWR_LOG_LEVEL"] == "DEBUG" and env["FLWR_HOME"] == str(tmp_path)
    # fedica-superlink started by hand with the variable refuses before Flower starts anything.
    with pytest.raises(SystemExit, match="FLWR_INTERNAL_GRPC_CONTROL_API is set"):
        deploy_superlink.main(["--insecure"])
