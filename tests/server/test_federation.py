"""End to end through the real ClientApp and ServerApp code: in-process, and on Flower's simulation engine."""

import json

import numpy as np
import pytest
from fedica.clients.app import app as client_app
from fedica.scripts.engines import run_engine, run_inprocess
from fedica.server.app import compose_config
from fedica.server.harness.outputs import write_result
from fedica.server.records import ARRAYS, VALUES
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedica.protocol import CATEGORY, TRAIN, NotEnoughClients

SMALL_ICA = [
    "scenario.n_clients=10",
    "scenario.corrupt_ratio=0.2",
    "scenario.n_corrupt=60",
    "scenario.n_normal=3000",
    "scenario.r=4",
]
SEPARATED_BLOBS = [
    "algorithm=fedgem",
    "scenario=blobs",
    "scenario.r_min=8",
    "scenario.n_clients=5",
    "scenario.n_clusters=6",
    "scenario.n_train=1500",
    "scenario.n_test=1500",
    "algorithm.rounds=5",
]


def _assert_same_numbers(a, b, path="result"):
    """Every number in two results agrees to 1e-12 (timings and versions excluded)."""
    if isinstance(a, dict):
        assert set(a) == set(b), path
        for key in a:
            # ray_nodes says where the work ran (Ray's node ids), not what it computed.
            if key in ("timings", "versions", "engine", "config", "ray_nodes") or key.startswith("fit"):
                continue
            _assert_same_numbers(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_numbers(x, y, f"{path}[{i}]")
    elif isinstance(a, (float, np.floating)) and not isinstance(a, bool):
        assert np.isclose(a, b, rtol=0, atol=1e-12) or (np.isnan(a) and np.isnan(b)), f"{path}: {a} != {b}"
    elif isinstance(a, np.ndarray):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12, err_msg=path)
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


@pytest.fixture(scope="module")
def ica_inprocess():
    return run_inprocess(compose_config(SMALL_ICA + ["engine=inprocess"]))


@pytest.fixture(scope="module")
def gem_inprocess():
    return run_inprocess(compose_config(SEPARATED_BLOBS + ["engine=inprocess"]))


def test_rfica_inprocess_is_robust_to_a_corrupted_client(ica_inprocess):
    errors = {name: m["error"] for name, m in ica_inprocess["metrics"].items()}
    assert errors["rf-ica"] < 0.1
    assert errors["rf-ica"] < errors["f-ica"]
    assert errors["rf-ica"] < errors["simple-mean"]
    assert errors["simple-mean"] > 0.5 and errors["simple-median"] > 0.5
    assert ica_inprocess["clients"] == {"expected": 10, "answered": 10, "rejected": []}
    assert len(ica_inprocess["rfica"]["corrupted_clients"]) == 2


def test_result_json_has_the_interface_keys(ica_inprocess, tmp_path):
    path = write_result(tmp_path, ica_inprocess)
    data = json.loads(path.read_text())
    for key in ("algorithm", "scenario", "engine", "seed", "config", "versions", "metrics", "clients", "history", "timings"):
        assert key in data
    assert set(data["metrics"]) == {"rf-ica", "f-ica", "simple-mean", "simple-median"}
    assert data["timings"]["total"] > 0 and data["timings"]["rf-ica"] > 0
    assert "rf-ica" in (tmp_path / "summary.txt").read_text()


def test_fedgem_inprocess_recovers_separated_blobs(gem_inprocess):
    fedgem = gem_inprocess["metrics"]["fedgem"]
    assert fedgem["k_hat"] == 6 and fedgem["k_true"] == 6
    assert fedgem["global_ari"] > 0.95 and fedgem["local_ari"] > 0.95
    assert {"central-gmm", "dp-gmm", "k-fed", "fed-kmeans"} <= set(gem_inprocess["metrics"])
    history = gem_inprocess["history"]
    assert [h["round"] for h in history] == [1, 2, 3, 4, 5]
    assert all({"super_clusters", "mean_radius", "centroid_shift"} <= set(h) for h in history)
    mapping = gem_inprocess["fedgem"]["client_mapping"]
    assert sorted(mapping) == [str(i) for i in range(5)]
    # No client maps two of its components to one global cluster.
    assert all(len(set(ids)) == len(ids) for ids in mapping.values())


@pytest.mark.parametrize("overrides, inprocess_fixture", [(SMALL_ICA, "ica_inprocess"), (SEPARATED_BLOBS, "gem_inprocess")])
@pytest.mark.slow
def test_flower_simulation_equals_inprocess(overrides, inprocess_fixture, request, monkeypatch):
    """A real Flower simulation (Ray, one ClientApp per simulated SuperNode) gives the in-process result to 1e-12."""
    from fedica.server import federation

    monkeypatch.setattr(federation, "MIN_IN_FLIGHT", 2)  # the 5 clients' stages paced, as a large federation's are
    simulated = run_engine(compose_config(overrides + ["engine=simulation"]))
    assert simulated["engine"] == "simulation"
    _assert_same_numbers(request.getfixturevalue(inprocess_fixture), simulated)


@pytest.mark.slow
def test_the_refinement_through_flower_simulation_equals_inprocess(monkeypatch):
    """RF-ICA's refinement rounds (covariances, then FastICA steps) run the same over Flower's simulation."""
    from fedica.server import federation

    monkeypatch.setattr(federation, "MIN_IN_FLIGHT", 2)
    refined = SMALL_ICA + ["algorithm.refine_rounds=5", "algorithm.local_solver=picard", "algorithm.contrast=logcosh"]
    inprocess = run_inprocess(compose_config(refined + ["engine=inprocess"]))
    steps = inprocess["rfica"]["refinement"]["steps"]
    assert 1 <= len(steps) <= 5 and [s["round"] for s in steps] == list(range(3, 3 + len(steps)))
    assert inprocess["metrics"]["rf-ica"]["error"] < 0.1
    _assert_same_numbers(inprocess, run_engine(compose_config(refined + ["engine=simulation"])))


def _corrupting_app(corrupt):
    """A ClientApp that runs fedica's real ClientApp, then lets ``corrupt(partition, reply)`` tamper with the reply."""
    app = ClientApp()

    def handler(msg: Message, context: Context) -> Message:
        reply = client_app(msg, context)
        partition = int(context.node_config["partition-id"])
        if reply.has_content():
            tampered = corrupt(partition, reply.content)
            if isinstance(tampered, Exception):
                raise tampered
            if tampered is not None:
                return Message(tampered, reply_to=msg)
        return reply

    for task, category in CATEGORY.items():
        (app.train if category == TRAIN else app.evaluate)(task)(handler)
    return app


def _replace(content, arrays=None, values=None):
    new_arrays = {k: v.numpy() for k, v in content[ARRAYS].items()}
    new_arrays.update(arrays or {})
    new_values = dict(content[VALUES].items())
    new_values.update(values or {})
    return RecordDict({ARRAYS: ArrayRecord({k: Array(np.asarray(v)) for k, v in new_arrays.items()}), VALUES: ConfigRecord(new_values)})


def test_malformed_rfica_replies_are_rejected_with_reasons():
    def corrupt(partition, content):
        return {
            0: _replace(content, arrays={"mixing": np.full((4, 4), np.inf)}),
            1: _replace(content, arrays={"mixing": np.eye(3)}),
            2: _replace(content, values={"n-samples": 0}),
            3: RecordDict({"other": ConfigRecord({"x": 1})}),
            4: RuntimeError("client crashed"),
            5: _replace(content, arrays={"mixing": np.eye(4).astype(np.complex128)}),
        }.get(partition)

    cfg = compose_config(SMALL_ICA + ["engine=inprocess"])
    result = run_inprocess(cfg, client_app=_corrupting_app(corrupt))
    reasons = {r["client"] if isinstance(r["client"], int) else r["reason"]: r["reason"] for r in result["clients"]["rejected"]}
    assert result["clients"]["answered"] == 4
    assert len(result["clients"]["rejected"]) == 6
    assert "non-finite" in reasons[0]
    assert "shape (3, 3)" in reasons[1]
    assert "'n-samples'=0" in reasons[2]
    assert any("client crashed" in r for r in reasons.values())
    assert any("no 'arrays' record" in r for r in reasons.values())
    assert "dtype complex128" in reasons[5]
    assert all(r["round"] == 1 for r in result["clients"]["rejected"])
    assert np.isfinite(result["metrics"]["rf-ica"]["error"])


def test_only_ray_node_ids_that_look_like_ray_s_are_recorded():
    valid = "0123abcd" * 7  # a Ray node id is 28 bytes in hex
    claims = {0: valid, 1: 12345, 2: "not-hex!", 3: "a" * 100_000, 4: "ABCDEF12", 5: "", 6: True, 7: valid}

    def corrupt(partition, content):
        return _replace(content, values={"ray-node-id": claims[partition]}) if partition in claims else None

    result = run_inprocess(compose_config(SMALL_ICA + ["engine=inprocess"]), client_app=_corrupting_app(corrupt))
    assert result["clients"] == {"expected": 10, "answered": 10, "rejected": []}
    exchanges = result["rfica"]["participation"]  # the estimates, then each refinement step
    assert len(exchanges) > 1 and [p["ray_nodes"] for p in exchanges] == [{valid: 2}] * len(exchanges)


def test_off_ray_no_ray_node_is_recorded(ica_inprocess):
    exchanges = ica_inprocess["rfica"]["participation"]
    assert exchanges and [p["ray_nodes"] for p in exchanges] == [{}] * len(exchanges)


def test_too_few_valid_replies_is_a_clear_error():
    cfg = compose_config(SMALL_ICA + ["engine=inprocess", "min_clients=8"])
    app = _corrupting_app(lambda partition, content: RuntimeError("down") if partition < 4 else None)
    with pytest.raises(NotEnoughClients, match="only 6 valid replies, min_clients=8") as info:
        run_inprocess(cfg, client_app=app)
    assert len(info.value.partial["clients"]["rejected"]) == 4


def test_a_stopped_fedgem_run_keeps_what_it_computed(tmp_path):
    """Clients that fail from round 3 on stop the run; the two rounds already done are kept."""

    rounds_seen = {}

    def failing(partition, content):
        rounds_seen[partition] = rounds_seen.get(partition, 0) + 1
        # the moments (the federated standardisation), init, round 1, round 2 succeed; every later reply fails
        return RuntimeError("site went down") if rounds_seen[partition] > 4 and partition < 4 else None

    cfg = compose_config(SEPARATED_BLOBS + ["engine=inprocess", "min_clients=2"])
    with pytest.raises(NotEnoughClients) as info:
        run_inprocess(cfg, client_app=_corrupting_app(failing))
    partial = info.value.partial
    assert [h["round"] for h in partial["history"]] == [1, 2]
    assert partial["status"].startswith("stopped: FedGEM round 3")
    path = write_result(tmp_path, partial, name="partial_result.json")
    assert json.loads(path.read_text())["history"][1]["super_clusters"] >= 6


def test_fedgem_survives_a_client_with_broken_replies(gem_inprocess):
    def corrupt(partition, content):
        if partition == 2:
            return _replace(content, arrays={"maximisers": np.full((9, 2), 1.0)} if "maximisers" in content[ARRAYS] else {})
        return None

    cfg = compose_config(SEPARATED_BLOBS + ["engine=inprocess"])
    result = run_inprocess(cfg, client_app=_corrupting_app(corrupt))
    rejected_rounds = {r["round"] for r in result["clients"]["rejected"] if r["client"] == 2}
    assert rejected_rounds == {1, 2, 3, 4, 5, "final"}
    assert all("shape" in r["reason"] for r in result["clients"]["rejected"])
    assert result["metrics"]["fedgem"]["global_ari"] > 0.9
    assert "2" not in result["fedgem"]["client_mapping"]


def test_fedgem_on_users_files_goes_on_without_unusable_ones(tmp_path):
    """The files scenario: each client reads its own CSV; a broken or mismatched file is one client's error, not the run's."""
    from fedica.data.blobs import blobs_client_data

    paths = []
    for partition in range(4):
        data = blobs_client_data(partition, n_clients=4, n_clusters=4, dim=3, r_min=8.0, n_train=1200, n_test=800, seed=5)
        table = np.column_stack([np.vstack([data.X_train, data.X_test]), np.concatenate([data.y_train, data.y_test])])
        path = tmp_path / f"site{partition}.csv"
        lines = ["f0,f1,f2,label"] + [",".join(f"{v:.6f}" for v in row[:3]) + f",{int(row[3])}" for row in table]
        paths.append(path)
        path.write_text("\n".join(lines) + "\n")
    broken = tmp_path / "site4.csv"
    broken.write_text("f0,f1,f2,label\n1.0,2.0,nan,0\n3.0,1.0,2.0,1\n")
    wrong_dim = tmp_path / "site5.csv"
    wrong_dim.write_text("f0,f1,label\n" + "\n".join(f"{i % 7}.0,{i % 3}.5,{i % 2}" for i in range(60)) + "\n")
    missing = tmp_path / "site6.csv"
    all_paths = ",".join(str(p) for p in paths + [broken, wrong_dim, missing])
    cfg = compose_config([
        "engine=inprocess", "algorithm=fedgem", "scenario=files", f"scenario.paths=[{all_paths}]",
        "scenario.label_column=label", "algorithm.rounds=3", "algorithm.upsilon=1.0",
    ])
    result = run_inprocess(cfg)
    reasons = {r["client"]: r["reason"] for r in result["clients"]["rejected"]}
    first = {}  # each client's first rejection (a site left out may fail the later requests too)
    for r in result["clients"]["rejected"]:
        first.setdefault(r["client"], r["reason"])
    assert result["clients"]["answered"] == 4
    assert "site4.csv" in reasons[4] and "column 2" in reasons[4] and "DataFileError" in reasons[4]
    # Its header names one column fewer: its first reply says so before the protocol finds its width short.
    assert "its columns differ from those of 4 of the 5 sites that name theirs (missing here: f2)" in first[5]
    assert "site6.csv: no such file" in reasons[6]
    assert result["metrics"]["fedgem"]["global_ari"] > 0.9
    assert set(result["metrics"]) == {"fedgem"}


def test_files_without_labels_let_each_client_choose_its_k(tmp_path):
    """n_components: auto: unlabeled sites choose K_g themselves (BIC); the result records each choice."""
    from fedica.data.blobs import blobs_client_data

    paths, truth = [], {}
    for partition in range(4):
        data = blobs_client_data(partition, n_clients=4, n_clusters=5, dim=3, r_min=10.0, n_train=2000, n_test=800, seed=2)
        path = tmp_path / f"site{partition}.npy"
        np.save(path, np.vstack([data.X_train, data.X_test]))
        paths.append(str(path))
        truth[str(partition)] = data.n_components
    cfg = compose_config(["engine=inprocess", "algorithm=fedgem", "scenario=files", f"scenario.paths=[{','.join(paths)}]",
                          "scenario.n_components=auto", "algorithm.rounds=5"])
    result = run_inprocess(cfg)
    assert result["fedgem"]["local_clusters"] == truth
    assert result["metrics"]["fedgem"]["k_hat"] == 5


def _two_cluster_sites(folder, *, seed, rows, shift, **savetxt):
    """Three CSV sites of ``rows`` 2-d points in two clusters ``shift`` apart, the label in the last column."""
    rng = np.random.default_rng(seed)
    paths = []
    for site in range(3):
        labels = np.arange(rows) % 2
        points = np.c_[rng.standard_normal((rows, 2)) + shift * labels[:, None], labels]
        paths.append(folder / f"site{site}.csv")
        np.savetxt(paths[-1], points, delimiter=",", fmt="%.6f", **savetxt)
    return paths


@pytest.mark.slow
def test_flower_simulation_clients_read_the_files_the_config_names(tmp_path):
    paths = _two_cluster_sites(tmp_path, seed=0, rows=60, shift=8)
    overrides = ["algorithm=fedgem", "scenario=files", f"scenario.paths=[{','.join(map(str, paths))}]",
                 "scenario.label_column=-1", "baselines=false", "algorithm.rounds=3"]
    simulated = run_engine(compose_config(overrides + ["engine=simulation"]))
    assert simulated["clients"]["answered"] == 3 and simulated["metrics"]["fedgem"]["k_hat"] == 2


def test_a_supernode_reads_only_its_own_data_path(monkeypatch, tmp_path):
    from fedica.clients.app import LOCAL_ENGINE_VARIABLE, _site_scenario

    cfg = {"scenario": {"name": "files", "paths": ["/etc/shadow", "/etc/passwd"]}}
    monkeypatch.delenv(LOCAL_ENGINE_VARIABLE, raising=False)
    with pytest.raises(ValueError, match="no 'data-path' in its node config, and it reads no file the server names"):
        _site_scenario(cfg, 1, Context(1, 2, {"partition-id": 1, "num-partitions": 2}, RecordDict(), {}))
    own = _site_scenario(cfg, 1, Context(1, 2, {"partition-id": 1, "data-path": "/site/b.csv"}, RecordDict(), {}))
    assert own["paths"][1] == "/site/b.csv"
    # A pooled scale would read the other sites' paths: a SuperNode refuses it, and standardises its own file.
    pooled = {"scenario": {**cfg["scenario"], "standardize": "pool"}}
    with pytest.raises(ValueError, match="standardize=pool needs every site's file on one machine"):
        _site_scenario(pooled, 1, Context(1, 2, {"partition-id": 1, "data-path": "/site/b.csv"}, RecordDict(), {}))
    by_site = {"scenario": {**cfg["scenario"], "standardize": "site"}}
    assert _site_scenario(by_site, 1, Context(1, 2, {"data-path": "/site/b.csv"}, RecordDict(), {}))["standardize"] == "site"
    monkeypatch.setenv(LOCAL_ENGINE_VARIABLE, "1")  # fedica's own local engines
    assert _site_scenario(cfg, 1, Context(1, 2, {"partition-id": 1}, RecordDict(), {}))["paths"][1] == "/etc/passwd"


COMPARATORS = SEPARATED_BLOBS + ["baseline_methods=[ffcm-avg1,ffcm-avg2,afcl]"]


@pytest.fixture(scope="module")
def comparators_inprocess():
    return run_inprocess(compose_config(COMPARATORS))


def test_federated_comparators_exchange_their_messages_with_the_clients_as_in_memory(comparators_inprocess):
    from fedica.evaluation.baselines import run_baselines

    cfg = compose_config(COMPARATORS)
    in_memory, _ = run_baselines(cfg["scenario"], cfg["baseline_methods"], seed=cfg["seed"], n_init=cfg["algorithm"]["n_init"])
    for method in ("ffcm-avg1", "ffcm-avg2", "afcl"):
        over_grid = comparators_inprocess["metrics"][method]
        assert {k: over_grid[k] for k in in_memory[method]} == pytest.approx(in_memory[method], nan_ok=True), method
        assert comparators_inprocess["timings"][method] > 0
    assert comparators_inprocess["metrics"]["ffcm-avg2"]["global_ari"] > 0.95
    assert comparators_inprocess["metrics"]["afcl"]["residual_bytes"] > 0


@pytest.mark.slow
def test_federated_comparators_run_on_flowers_simulation(comparators_inprocess):
    simulated = run_engine(compose_config(COMPARATORS + ["engine=simulation"]))
    for method in ("ffcm-avg1", "ffcm-avg2", "afcl"):
        assert simulated["metrics"][method] == pytest.approx(comparators_inprocess["metrics"][method], nan_ok=True), method


def test_a_run_with_fewer_nodes_than_clients_stops_unless_allowed():
    from fedica.clients.app import app
    from fedica.server.inprocess import InProcessGrid
    from fedica.server.harness.runner import run_federation

    cfg = compose_config(SEPARATED_BLOBS + ["node_wait_timeout=0.5", "baseline_methods=[k-fed,ffcm-avg2]"])
    three_of_five = [{"partition-id": p, "num-partitions": 5} for p in (0, 1, 3)]
    with pytest.raises(NotEnoughClients, match=r"only 3 of the scenario's 5 clients connected.*min_nodes=3"):
        run_federation(InProcessGrid(app, three_of_five), cfg)
    result = run_federation(InProcessGrid(app, three_of_five), {**cfg, "min_nodes": 3})
    assert result["fedgem"]["client_mapping"].keys() == {"0", "1", "3"}
    # The comparators see exactly the clients that took part.
    from fedica.evaluation.baselines import run_baselines
    expected, _ = run_baselines(cfg["scenario"], ["k-fed", "ffcm-avg2"], seed=cfg["seed"], partitions=[0, 1, 3])
    for method in ("k-fed", "ffcm-avg2"):
        assert {k: result["metrics"][method][k] for k in expected[method]} == pytest.approx(expected[method], nan_ok=True)


def test_a_files_run_writes_every_sites_row_labels_next_to_its_result(tmp_path):
    paths = _two_cluster_sites(tmp_path, seed=1, rows=40, shift=9, header="x,y,label", comments="")
    cfg = compose_config(["engine=inprocess", "algorithm=fedgem", "scenario=files",
                          f"scenario.paths=[{','.join(map(str, paths))}]", "scenario.label_column=label", "algorithm.rounds=3"])
    result = run_inprocess(cfg)
    written = json.loads(write_result(tmp_path / "out", result).read_text())["fedgem"]["labels_files"]
    assert written == [str(tmp_path / "out" / f"labels_site{g}.csv") for g in range(3)]
    for site, path in enumerate(written):
        rows = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.int64)
        truth = np.loadtxt(paths[site], delimiter=",", skiprows=1)[:, 2].astype(np.int64)
        assert rows[:, 0].tolist() == list(range(40))
        # Two global clusters, and the site's rows split exactly along its true labels.
        assert len(set(rows[:, 1])) == 2 and len({(t, c) for t, c in zip(truth, rows[:, 1])}) == 2


def test_expected_warnings_are_counted_in_the_result_not_shown():
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        result = run_inprocess(compose_config(["engine=inprocess", "algorithm=fedgem", "+workload=waveform", "baseline_methods=[dp-gmm]"]))
    assert not [w for w in shown if issubclass(w.category, ConvergenceWarning)]
    assert any(key.startswith("ConvergenceWarning: ") and count >= 1 for key, count in result["warnings"].items())


def test_a_waiting_stage_says_how_many_replies_are_in(monkeypatch, caplog):
    import logging
    import time as clock
    from types import SimpleNamespace

    from fedica.server import federation as books

    class SlowGrid:
        """Two of three replies arrive once a progress line has said none is in (and 0.3 s have passed), the last one
        never. Waiting on the line, not on a clock alone: on a loaded machine a stall before the first check let
        the replies arrive first (CI)."""

        pull_interval = 0.05

        def __init__(self):
            self.start = None

        def push_messages(self, messages):
            self.start = clock.monotonic()
            return ["a", "b", "c"][:len(messages)]

        def pull_messages(self, ids):
            said = any("0 of 3 replies after" in r.getMessage() for r in caplog.records)
            if not said or clock.monotonic() - self.start < 0.3:
                return []
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)) for i in set(ids) & {"a", "b"}]

    monkeypatch.setattr(books, "PROGRESS_SECONDS", 0.1)
    federation = books.Federation(grid=SlowGrid(), expected=3)
    with caplog.at_level(logging.INFO, logger="fedica.server"):
        received = federation.send_and_receive([object()] * 3, "fedgem_round 4", timeout=2.0)
    assert len(received) == 2
    lines = [r.getMessage() for r in caplog.records if "replies after" in r.getMessage()]
    assert lines[0].startswith("fedgem_round 4: 0 of 3 replies after") and lines[-1].startswith("fedgem_round 4: 2 of 3 replies after")


class _AnsweringGrid:
    """A Grid stand-in that answers every stored message at each pull once ``ready()`` (from the start if
    not given); it remembers the most messages ever stored at once and how many pulls answered."""

    def __init__(self, pull_interval, ready=None):
        self.pull_interval, self.ready = pull_interval, ready or (lambda: True)
        self.stored, self.most, self.pulls_answered = [], 0, 0

    def push_messages(self, messages):
        ids = [str(id(m)) for m in messages]
        self.stored += ids
        self.most = max(self.most, len(self.stored))
        return ids

    def pull_messages(self, ids):
        from types import SimpleNamespace

        if not self.ready():
            return []
        self.pulls_answered += 1
        answered, self.stored = [i for i in self.stored if i in ids], []
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)) for i in answered]


def test_a_paced_stage_keeps_few_messages_in_flight_and_sends_them_all():
    # Under Flower's simulation every stored message costs a scan per node and pass; pacing bounds them.
    from fedica.server import federation as books

    grid = _AnsweringGrid(pull_interval=0.0)
    federation = books.Federation(grid=grid, expected=100)
    federation.paced = True
    messages = [object() for _ in range(100)]
    assert len(federation.send_and_receive(messages, "fedgem_round 1", timeout=60.0)) == 100
    assert grid.most <= 50  # never more in flight than replies in: 16, 16, 32 and what is left
    federation.paced = False
    assert len(federation.send_and_receive(messages, "fedgem_round 2", timeout=60.0)) == 100
    assert grid.most == 100


def test_a_paced_stage_takes_its_rate_from_the_first_reply_not_from_the_actors_start_up(monkeypatch):
    # A simulation's first stage waits seconds for its actors; once they answer, the stage ramps up as any other.
    from types import SimpleNamespace

    from fedica.server import federation as books

    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(books, "time", SimpleNamespace(monotonic=lambda: clock.now,
                                                     sleep=lambda seconds: setattr(clock, "now", clock.now + seconds)))
    grid = _AnsweringGrid(pull_interval=0.1, ready=lambda: clock.now >= 5.0)  # the actors start for 5 s
    federation = books.Federation(grid=grid, expected=1000)
    federation.paced = True
    assert len(federation.send_and_receive([object() for _ in range(1000)], "fedgem_init init", timeout=600.0)) == 1000
    # 16 in flight, then the replies so far, doubling: 7 pulls. A rate counted from the stage's start
    # (16 replies in 5 s) holds the stage at 16 in flight at first: 37 pulls.
    assert grid.pulls_answered <= 8


@pytest.mark.parametrize("n_train", [1000, 4000])
def test_what_a_client_sends_per_round_does_not_grow_with_its_data(n_train):
    # The paper's model: under the library's spherical one each component's variance travels too (K_g more numbers).
    result = run_inprocess(compose_config(SEPARATED_BLOBS + [f"scenario.n_train={n_train}", "baselines=false",
                                                             "algorithm=fedgem_paper"]))
    d = 2
    k_g = np.mean(list(result["fedgem"]["local_clusters"].values()))
    rounds = [p for p in result["fedgem"]["participation"] if p["task"] == "fedgem_round"]
    for exchange in rounds:
        # Down: K_g centroids; up: K_g maximisers and K_g radii (FedGEM paper, appendix B.5.2: about 3 d K_g).
        assert exchange["numbers_to_client"] == pytest.approx(d * k_g)
        assert exchange["numbers_from_client"] == pytest.approx((d + 1) * k_g)
        assert exchange["numbers_to_client"] + exchange["numbers_from_client"] <= 3 * d * k_g


def test_an_rfica_client_sends_its_r_by_r_estimate_only():
    result = run_inprocess(compose_config(SMALL_ICA + ["algorithm=rfica_paper"]))  # one shot: no refinement exchange
    [exchange] = result["rfica"]["participation"]
    assert exchange["numbers_to_client"] == 0 and exchange["numbers_from_client"] == 4 * 4
