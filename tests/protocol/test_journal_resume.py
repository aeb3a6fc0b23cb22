"""The protocol kit's journal: a run interrupted after stage k resumes to the uninterrupted run's result, bit for bit."""

import json

import numpy as np
import pytest
from fedica.server.app import compose_config

from fedica.config import validate_config
from fedica.data.common import ClientData
from fedica.data.scenarios import ica_scenario_data, scenario_client_data
from fedica.fedgem.coordinator import FedGEMServer, FedGEMSettings
from fedica.protocol import ArraySite, InMemoryFederation, Journal, JournalError, Reply, Request, journaled
from fedica.protocol.journal import JOURNAL_DIR, decode_value, encode_value, load_stage, save_stage, stage_file
from fedica.results import to_jsonable
from fedica.rfica.coordinator import RFICAState, rfica_protocol
from fedica.tasks import CLIENT_TASKS


class Crash(RuntimeError):
    """The process dying mid-stage: not a client's refusal (ValueError), so nothing catches it."""


def tasks_that(crash_at=None, refuse=None):
    """The client registry, crashing the run when a site answers stage ``crash_at`` ((task, round) of its request),
    and with site ``refuse[0]`` refusing the request of ``refuse[1]`` (a rejection the transport records)."""
    def transform(task, site, arrays, values, reply):
        stage = (task, values["server-round"])
        if stage == crash_at:
            raise Crash(f"killed during {stage}")
        if refuse is not None and (site.partition_id, stage) == refuse:
            raise ValueError("this site refuses the round")
        return reply
    return CLIENT_TASKS.with_transforms(transform)


def fedgem_run(tmp_path, crash_at=None, resume=False):
    cfg = validate_config(compose_config(["engine=inprocess", "algorithm=fedgem", "scenario=blobs", "scenario.n_clients=5",
                                          "algorithm.rounds=4", "baselines=false"]))
    server = FedGEMServer(FedGEMSettings.from_config(cfg["algorithm"], min_clients=2, seed=cfg["seed"]))
    sites = {p: ArraySite(scenario_client_data(cfg["scenario"], p, cfg["seed"]), p, cfg) for p in range(5)}
    journal = Journal.resume(tmp_path, cfg) if resume else Journal.create(tmp_path, cfg)
    federation = InMemoryFederation(sites, tasks_that(crash_at, refuse=(3, ("fedgem_round", "2"))), server.rejected)
    federation.run(server.run(), journal)
    return json.dumps(to_jsonable({
        "history": server.history, "centroids": server.aggregation.global_centroids, "labels": server.aggregation.labels,
        "k_hat": server.aggregation.k_hat, "upsilon": server.upsilon, "tuning": server.tuning,
        "rejected": server.rejected, "evaluation": server.evaluation, "client_aris": server.client_aris,
        "models": {p: m.centroids for p, m in server.models.items()}}))


def rfica_run(tmp_path, crash_at=None, resume=False):
    cfg = validate_config(compose_config(["engine=inprocess", "algorithm=rfica", "scenario=ica_paper",
                                          "scenario.n_clients=6", "scenario.n_normal=400", "baselines=false"]))
    state = RFICAState(n_components=3, whitening="federated", seed=0, min_clients=2)
    sites = {g: ArraySite(ClientData((X := ica_scenario_data(cfg["scenario"], g, 0).T), None, X[:0], None, 1), g)
             for g in range(6)}
    journal = Journal.resume(tmp_path, cfg) if resume else Journal.create(tmp_path, cfg)
    InMemoryFederation(sites, tasks_that(crash_at, refuse=(2, ("rfica_fit", "2"))), state.rejected).run(
        rfica_protocol(state), journal)
    kept = {k: v for k, v in vars(state).items() if k not in ("server_seconds", "client_seconds", "aggregate")}
    aggregate = {k: v for k, v in vars(state.aggregate).items() if k != "method_seconds"}  # the timings aside
    return json.dumps(to_jsonable({**kept, **aggregate}), default=repr)


@pytest.mark.parametrize("run, crash_at", [(fedgem_run, ("fedgem_round", "3")), (fedgem_run, ("fedgem_evaluate", "evaluate")),
                                           (rfica_run, ("rfica_fit", "2"))])
def test_a_run_interrupted_after_a_stage_resumes_to_the_uninterrupted_result_bit_for_bit(tmp_path, run, crash_at):
    uninterrupted = run(tmp_path / "whole")
    with pytest.raises(Crash):
        run(tmp_path / "crashed", crash_at=crash_at)
    completed = len(list((tmp_path / "crashed" / JOURNAL_DIR).glob("stage_*.npz")))
    assert completed >= 1
    assert run(tmp_path / "crashed", resume=True) == uninterrupted
    # The resumed run journalled its own stages after the replayed ones: a second crash would lose nothing either.
    assert len(list((tmp_path / "crashed" / JOURNAL_DIR).glob("stage_*.npz"))) == \
        len(list((tmp_path / "whole" / JOURNAL_DIR).glob("stage_*.npz"))) > completed


def test_replayed_stages_ask_no_client(tmp_path):
    with pytest.raises(Crash):
        fedgem_run(tmp_path / "run", crash_at=("fedgem_round", "3"))
    asked = []

    def count(task, site, arrays, values, reply):
        asked.append((task, values["server-round"]))
        return reply

    cfg = validate_config(compose_config(["engine=inprocess", "algorithm=fedgem", "scenario=blobs", "scenario.n_clients=5",
                                          "algorithm.rounds=4", "baselines=false"]))
    server = FedGEMServer(FedGEMSettings.from_config(cfg["algorithm"], min_clients=2, seed=cfg["seed"]))
    sites = {p: ArraySite(scenario_client_data(cfg["scenario"], p, cfg["seed"]), p, cfg) for p in range(5)}
    InMemoryFederation(sites, CLIENT_TASKS.with_transforms(count), server.rejected).run(
        server.run(), Journal.resume(tmp_path / "run", cfg))
    assert ("fedgem_init", "init") not in asked and ("fedgem_round", "2") not in asked
    # Only the data check, whose digests are compared with those the sites sent first, goes to them before the new
    # stages.
    assert asked[:6] == [("data_digest", "data-check")] * 5 + [("fedgem_round", "3")]


def test_a_missing_or_foreign_journal_is_refused_in_one_line(tmp_path):
    with pytest.raises(JournalError, match="no journal to resume"):
        Journal.resume(tmp_path, {"seed": 0})
    Journal.create(tmp_path, {"seed": 0, "algorithm": {"rounds": 4}})
    with pytest.raises(JournalError, match=r"another configuration \(differs in algorithm.rounds\)") as err:
        Journal.resume(tmp_path, {"seed": 0, "algorithm": {"rounds": 5}})
    assert "\n" not in str(err.value)


def data_checked(run, partitions=(0,), digest="0" * 64):
    """A resumed ``run``'s first request, the data check, answered by ``partitions`` with ``digest``; what ``run``
    sends next."""
    check = next(run)
    assert (check.task, check.round_label, check.payloads) == ("data_digest", "data-check", None)
    return run.send([Reply(p, {}, {"data-digest": digest}) for p in partitions])


def salted(run):
    """A new journal's ``run``'s first request: the protocol's own, with the run's salt among its values."""
    first = next(run)
    assert first.task == "rfica_fit" and len(first.values["digest-salt"]) == 64
    return first


def test_a_protocol_that_asks_something_else_than_the_journal_is_refused(tmp_path):
    def protocol(scale):
        yield Request("rfica_fit", 1, {0: {"w": np.full(2, scale)}}, {})

    journal = Journal.create(tmp_path, {})
    run = journaled(protocol(1.0), journal)
    salted(run)
    with pytest.raises(StopIteration):
        run.send([Reply(0, {}, {"data-digest": "0" * 64})])
    with pytest.raises(JournalError, match="stage 1 .* asked something else"):
        data_checked(journaled(protocol(2.0), Journal.resume(tmp_path, {})))


def test_a_site_whose_data_changed_before_the_resume_is_named_and_the_resume_refused(tmp_path, caplog):
    def protocol():
        yield Request("rfica_fit", 1, {0: {}, 1: {}, 2: {}}, {})
        yield Request("rfica_fit", 2, {0: {}, 1: {}, 2: {}}, {})

    run = journaled(protocol(), Journal.create(tmp_path, {}))
    salted(run)
    run.send([Reply(p, {}, {"data-digest": "a" * 64}) for p in range(3)])  # stage 1 on disk; the run stops here
    assert json.loads((tmp_path / JOURNAL_DIR / "sites.json").read_text()) == {"0": "a" * 64, "1": "a" * 64, "2": "a" * 64}

    resumed = journaled(protocol(), Journal.resume(tmp_path, {}))
    check = next(resumed)
    replies = [Reply(0, {}, {"data-digest": "a" * 64}), Reply(1, {}, {"data-digest": "b" * 64}),
               Reply(2, {}, {"data-digest": "c" * 64})]
    with pytest.raises(JournalError, match=r"^the data of sites 1, 2 changed since the run began") as err:
        resumed.send(replies)
    assert "\n" not in str(err.value) and check.values["digest-salt"] == Journal.resume(tmp_path, {}).salt
    # The same data goes on from the recorded stage; a site that gives no digest now is said, not refused.
    resumed = journaled(protocol(), Journal.resume(tmp_path, {}))
    next(resumed)
    assert resumed.send([Reply(0, {}, {"data-digest": "a" * 64}), Reply(1, {}, {"data-digest": "a" * 64})]).round_label == 2
    assert "sites 2 gave a data digest only when the run began or only now" in caplog.text


def test_a_resume_without_the_sites_record_or_with_a_damaged_one_is_refused_in_one_line(tmp_path):
    def protocol():
        yield Request("rfica_fit", 1, None, {})
        yield Request("rfica_fit", 2, None, {})

    run = journaled(protocol(), Journal.create(tmp_path, {}))
    salted(run)
    run.send([Reply(0, {}, {"data-digest": "0" * 64})])
    sites = tmp_path / JOURNAL_DIR / "sites.json"
    for content, reason in [('{"0": "not a digest"}', "not a mapping of site numbers to SHA-256 digests"),
                            ("[", "cannot be read"), (None, "no record of its sites' data")]:
        sites.unlink(missing_ok=True)
        if content is not None:
            sites.write_text(content)
        with pytest.raises(JournalError, match=reason) as err:
            Journal.resume(tmp_path, {})
        assert "\n" not in str(err.value)


def test_a_stage_file_gives_back_every_reply_of_its_own_types_bit_for_bit(tmp_path):
    values = {"n": 3, "x": 0.1 + 0.2, "nan": float("nan"), "flag": True, "np-int": np.int64(7), "np-bool": np.bool_(False),
              "np-float": np.float32(1 / 3), "text": "a", "raw": b"\x00\xff", "items": [1, 2.5, "b"], "pair": (1, 2)}
    arrays = {"m": np.arange(6, dtype=np.float32).reshape(2, 3), "i": np.array([1, -2], dtype=np.int8)}
    path = tmp_path / stage_file(1)
    rejected = [{"client": 1, "round": 1, "reason": "no reply"}]
    save_stage(path, 1, Request("fedgem_round", 1, None), [Reply(4, arrays, values)], {"rejected": rejected})
    stage = load_stage(path)
    (reply,) = stage.replies
    assert reply.partition_id == 4 and stage.books == {"rejected": rejected}
    for key, array in arrays.items():
        assert reply.arrays[key].dtype == array.dtype and np.array_equal(reply.arrays[key], array)
    for key, value in values.items():
        assert type(reply.values[key]) is type(value), key
    assert np.isnan(reply.values["nan"]) and reply.values["x"] == values["x"] and reply.values["np-float"] == values["np-float"]
    assert decode_value(encode_value(values["items"])) == values["items"]


def test_a_reply_the_journal_cannot_record_is_refused_with_its_reason(tmp_path):
    with pytest.raises(JournalError, match="reply member 'm' is a list"):
        save_stage(tmp_path / stage_file(1), 1, Request("fedgem_round", 1, None), [Reply(0, {"m": [1.0]}, {})], {})


def test_a_new_run_never_deletes_an_earlier_runs_stages(tmp_path):
    # Row 9 of issue 43: the same command again without resume= deleted the interrupted run's journal.
    def protocol():
        yield Request("rfica_fit", 1, None, {})

    run = journaled(protocol(), Journal.create(tmp_path, {"seed": 0}))
    salted(run)
    with pytest.raises(StopIteration):
        run.send([Reply(0, {"w": np.ones(2)}, {})])
    for description in ({"seed": 0}, {"seed": 1}):
        with pytest.raises(JournalError, match=r"holds the journal of an earlier run \(1 completed stages\); resume it"):
            Journal.create(tmp_path, description)
    assert (tmp_path / JOURNAL_DIR / stage_file(1)).exists()
    assert Journal.holds_stages(tmp_path) and Journal.written_for(tmp_path, {"seed": 0})
    assert not Journal.written_for(tmp_path, {"seed": 1})


def _stage_with(tmp_path, replies, books=None, request=None):
    path = tmp_path / stage_file(1)
    save_stage(path, 1, request or Request("rfica_fit", 1, None), replies, books or {})
    return path


def _rewrite_meta(path, change):
    with np.load(path, allow_pickle=False) as archive:
        members = {name: archive[name] for name in archive.files}
    meta = json.loads(str(members["meta"][()]))
    change(meta)
    members["meta"] = np.array(json.dumps(meta))
    np.savez(path, **members)


def _bomb(path):
    """A stage file whose one reply member declares a billion numbers in a few bytes."""
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (10**9,)})
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("r0_0.npy", header.getvalue() + b"\0" * 64)


@pytest.mark.parametrize("damage, reason", [
    (lambda path: path.write_bytes(b"\x00garbage" * 100), "not a readable .npz archive"),
    (lambda path: path.write_bytes(path.read_bytes()[:-40]), "cannot be read"),
    (lambda path: (_rewrite_meta(path, lambda meta: meta["replies"][0].update(arrays=[])), _bomb(path)), "declares shape"),
    (lambda path: _rewrite_meta(path, lambda meta: meta.update(number="1")), "'number' is not a stage number"),
    (lambda path: _rewrite_meta(path, lambda meta: meta.update(digest="edited")), "'digest' is not a SHA-256"),
    (lambda path: _rewrite_meta(path, lambda meta: meta["replies"][0].update(partition=-1)), "reply 0 has no partition id"),
    (lambda path: _rewrite_meta(path, lambda meta: meta["replies"][0].update(arrays=["w", "v"])), "are missing"),
    (lambda path: _rewrite_meta(path, lambda meta: meta["books"].update(
        rejected=[{"client": 1, "round": 1, "reason": "x" * 10**6}])), "a text of 1000000 characters"),
    (lambda path: _rewrite_meta(path, lambda meta: meta["books"].update(rejected=[5])), "lists of entries"),
    (lambda path: _rewrite_meta(path, lambda meta: meta["books"].update(rejected=[{"client": 1}])),
     "lacks its client, round or reason"),
    (lambda path: _rewrite_meta(path, lambda meta: meta["replies"][0]["values"].update(v={"__evil__": 1})),
     "a value tagged"),
    (lambda path: _rewrite_meta(path, lambda meta: meta.update(
        books={"rejected": [{"client": 1, "round": 1, "reason": "r", "more": [[[[]]]]}]})), None),
])
def test_a_damaged_stage_file_is_refused_in_one_line(tmp_path, damage, reason):
    # Rows 6 and 7 of issue 43: damaged stage files were tracebacks, and a 2 MB one took a resume to 2.36 GB.
    path = _stage_with(tmp_path, [Reply(0, {"w": np.ones(3)}, {"v": 1})], {"rejected": []})
    damage(path)
    if reason is None:  # a harmless shape: still loads
        load_stage(path)
        return
    with pytest.raises(JournalError, match=reason) as err:
        load_stage(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_a_replayed_stage_passes_the_transports_checks(tmp_path):
    # Row 6 of issue 43: a reply given partition 99, or removed, was replayed as "4 of 5 answered", nothing recorded.
    def protocol():
        yield Request("rfica_fit", 1, {0: {}, 1: {}, 2: {}}, {})

    def run_and_record(folder):
        books = {"participation": [], "rejected": []}
        run = journaled(protocol(), Journal.create(folder, {}), books)
        salted(run)
        books["participation"].append({"clients": [0, 1, 2]})
        with pytest.raises(StopIteration):
            run.send([Reply(p, {"w": np.full(2, p)}, {"data-digest": "0" * 64}) for p in range(3)])
        return folder / JOURNAL_DIR / stage_file(1)

    def replay(folder):
        run = journaled(protocol(), Journal.resume(folder, {}), {"participation": [], "rejected": []})
        with pytest.raises(StopIteration):
            data_checked(run, (0, 1, 2))

    replay(run_and_record(tmp_path / "intact").parents[1])  # an intact journal replays
    for name, change, reason in [
        ("stranger", lambda meta: meta["replies"][2].update(partition=99), "clients \\[99\\] that the stage did not ask"),
        ("removed", lambda meta: meta["replies"].pop(), "its books say"),
        ("twice", lambda meta: meta["replies"][1].update(partition=0), "two replies of one client"),
    ]:
        stage = run_and_record(tmp_path / name)
        with np.load(stage, allow_pickle=False) as archive:
            members = {key: archive[key] for key in archive.files}
        meta = json.loads(str(members["meta"][()]))
        change(meta)
        if name == "removed":
            members.pop("r2_0")
        members["meta"] = np.array(json.dumps(meta))
        np.savez(stage, **members)
        with pytest.raises(JournalError, match=reason):
            replay(stage.parents[1])
