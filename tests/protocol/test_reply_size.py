"""A reply's size is held to what its exchange admits before it is decoded; a client's text is cut in the books."""

import numpy as np
import pytest

from fedica.data.common import ClientData
from fedica.protocol import (
    REPLY_SIZE_FLOOR,
    ArraySite,
    ClientTasks,
    InMemoryFederation,
    InvalidReply,
    Request,
    check_reply_size,
    client_text,
    payload_bytes,
    record_rejection,
    reply_size_limits,
)
from fedica.protocol.messages import MAX_CLIENT_TEXT, MAX_REASON_TEXT, REPLY_SIZE_FACTOR


def test_an_extra_array_of_1e8_floats_is_over_the_limit_and_honest_replies_are_within_it():
    honest = payload_bytes({"maximisers": np.zeros((10, 784)), "radii": np.zeros(10)}, {"n-points": 500})
    sizes = {0: honest, 1: honest, 2: honest + 8 * 10**8}
    limits = reply_size_limits({}, sizes)
    for client in (0, 1):
        check_reply_size(sizes[client], limits[client])
    with pytest.raises(InvalidReply, match=r"holds 763\.0 MiB, more than the 4\.8 MiB this exchange admits"):
        check_reply_size(sizes[2], limits[2])


def test_with_two_clients_a_bloated_reply_does_not_raise_the_other_ones_limit_nor_its_own():
    limits = reply_size_limits({}, {0: 1_000, 1: 10**9})
    assert limits == {0: REPLY_SIZE_FACTOR * 10**9 + REPLY_SIZE_FLOOR, 1: REPLY_SIZE_FACTOR * 1_000 + REPLY_SIZE_FLOOR}
    # A lone client is held to what it was sent.
    assert reply_size_limits({0: 10**6}, {0: 5}) == {0: REPLY_SIZE_FACTOR * 10**6 + REPLY_SIZE_FLOOR}


@pytest.mark.parametrize("seed", range(20))
def test_each_limit_is_the_others_lower_median_ties_included(seed):
    rng = np.random.default_rng(seed)
    n_clients = int(rng.integers(1, 40))
    received = {f"c{i}": int(size) for i, size in enumerate(rng.integers(0, 6, n_clients) * 1_000)}
    sent = {client: int(rng.integers(0, 3)) * 500 for client in received}
    for client, limit in reply_size_limits(sent, received).items():
        others = sorted(size for other, size in received.items() if other != client)
        typical = others[(len(others) - 1) // 2] if others else 0
        assert limit == REPLY_SIZE_FACTOR * max(sent[client], typical) + REPLY_SIZE_FLOOR


def test_a_clients_text_is_cut_and_the_cut_said():
    assert client_text("bad data") == "bad data"
    cut = client_text("x" * 20_000_000)
    assert cut.startswith("x" * MAX_CLIENT_TEXT) and cut.endswith("... (cut: 20000000 characters)")
    assert len(cut) < MAX_CLIENT_TEXT + 40


def test_the_in_memory_driver_refuses_an_oversized_reply_with_its_size_and_cuts_a_long_refusal():
    def handler(site, arrays, values):
        if site.partition_id == 2:
            raise ValueError("y" * 100_000)
        extra = {"padding": np.zeros(2**18)} if site.partition_id == 1 else {}
        return {"x": np.ones(3), **extra}, {"n-points": 3}

    X = np.zeros((5, 2))
    sites = {p: ArraySite(ClientData(X, None, X[:0], None, 1), p, None) for p in range(4)}
    books = []
    replies = InMemoryFederation(sites, ClientTasks({"t": handler}), books).answer(Request("t", "init", None))
    assert [r.partition_id for r in replies] == [0, 3]
    reasons = {entry["client"]: entry["reason"] for entry in books}
    assert reasons[1].startswith("malformed reply: the reply holds 2.0 MiB, more than the 1.0 MiB")
    assert reasons[2].endswith("... (cut: 100000 characters)") and len(reasons[2]) < 600


def test_a_rejections_reason_quoting_a_clients_value_is_cut_in_the_books():
    books = []
    record_rejection(books, 3, 1, f"malformed reply: 'n-points'={'9' * 900_000!r} is not an integer")
    assert len(books[0]["reason"]) < MAX_REASON_TEXT + 40 and books[0]["reason"].endswith("(cut: 900048 characters)")
