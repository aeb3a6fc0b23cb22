"""fedica-superlink's guard: who may use which of the SuperLink's APIs (the real processes: test_deployment.py)."""

import asyncio

import pytest

from fedica.scripts.deploy import superlink
from fedica.scripts.deploy.superlink import BoundedReplies, OperatorOnlyBeyondFleet, SignedBeforeRead, is_operator, is_public


@pytest.mark.parametrize("host, expected", [
    ("127.0.0.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("127.0.0.2", False), ("192.0.2.7", False), ("10.0.0.1", False), ("::ffff:192.0.2.7", False),
    ("fe80::1%eth0", False), ("", False), (None, False), ("testclient", False),
])
def test_the_operator_is_the_loopback_address_only(host, expected):
    assert is_operator(host) is expected


@pytest.mark.parametrize("path, expected", [
    ("/v1/fleet/register-node", True), ("/v1/fleet/pull-messages", True), ("/health", True),
    ("/v1/control/start-run", False), ("/v1/control/list-runs", False), ("/v1/runtime/pull-messages", False),
    ("/docs", False), ("/openapi.json", False), ("/v1/fleetx", False), ("/v1/fleet", False), ("/", False),
])
def test_only_the_fleet_api_and_the_health_check_are_public(path, expected):
    assert is_public(path) is expected


def _call(path: str, host: str | None) -> tuple[int, bytes]:
    reached = []

    async def app(scope, receive, send):
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "method": "POST", "path": path, "client": None if host is None else (host, 5000)}
    asyncio.run(OperatorOnlyBeyondFleet(app)(scope, receive, send))
    status = sent[0]["status"]
    assert (status == 200) == bool(reached)  # a refused request never reaches Flower
    return status, b"".join(m.get("body", b"") for m in sent[1:])


def test_a_remote_peer_reaches_the_fleet_api_but_not_the_control_or_runtime_api():
    assert _call("/v1/fleet/pull-messages", "192.0.2.7")[0] == 200
    for path in ("/v1/control/start-run", "/v1/control/stop-run", "/v1/runtime/push-messages", "/docs"):
        status, body = _call(path, "192.0.2.7")
        assert status == 403 and b"only the operator" in body
    assert _call("/v1/control/start-run", None)[0] == 403


def test_the_operator_reaches_every_api():
    for path in ("/v1/control/start-run", "/v1/runtime/push-messages", "/v1/fleet/pull-messages"):
        assert _call(path, "127.0.0.1")[0] == 200


def test_the_guard_goes_first_in_flowers_middleware_and_keeps_flowers_own(monkeypatch):
    from flwr.superlink import extensions
    from flwr.superlink.main import create_app

    monkeypatch.setattr(extensions, "get_middleware", extensions.get_middleware)  # restored after the test
    superlink.install_operator_guard()
    superlink.install_operator_guard(5 * 2**20)  # again: only the bound changes
    middleware = create_app().user_middleware
    stack = [m.cls for m in middleware]
    assert stack[:3] == [OperatorOnlyBeyondFleet, SignedBeforeRead, BoundedReplies] and stack.count(OperatorOnlyBeyondFleet) == 1
    assert middleware[2].kwargs == {"limit": 5 * 2**20}
    assert any(cls.__name__ == "NodeAuthMiddleware" for cls in stack)



def _push(middleware: BoundedReplies, path: str, chunks: list[bytes], *, declared: int | None = None, answer: bytes = b"stored"):
    """A request through ``middleware``: its status, its answer, and the body Flower received (None: never reached)."""
    reached = []

    async def flower(scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        reached.append(body)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": answer})

    middleware.app = flower
    pending = [{"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1} for i, chunk in enumerate(chunks)]
    sent = []

    async def receive():
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    headers = [] if declared is None else [(b"content-length", str(declared).encode())]
    scope = {"type": "http", "method": "POST", "path": path, "client": ("192.0.2.7", 5000), "headers": headers}
    asyncio.run(middleware(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:]), reached[0] if reached else None


def _object(session: str, object_id: str, size: int, run_id: int = 7) -> bytes:
    from flwr.proto.message_pb2 import PushObjectRequest  # pylint: disable=no-name-in-module

    return PushObjectRequest(run_id=run_id, session_id=session, object_id=object_id,
                             object_content=b"x" * size).SerializeToString()


def test_a_fleet_request_larger_than_the_bound_is_refused_before_flower_reads_it():
    status, body, reached = _push(BoundedReplies(None, limit=1000), "/v1/fleet/push-messages", [b"x" * 10], declared=5000)
    assert (status, reached) == (413, None)
    assert b"5000 bytes" in body and b"--max-reply-mib" in body
    # Without a declared length (a chunked body), reading stops as soon as the bound is passed.
    status, _, reached = _push(BoundedReplies(None, limit=1000), "/v1/fleet/push-messages", [b"x" * 600] * 3)
    assert (status, reached) == (413, None)


def test_a_request_within_the_bound_reaches_flower_with_its_body_unchanged():
    body = _object("reply-1", "a", 100)
    status, _, reached = _push(BoundedReplies(None, limit=1000), "/v1/fleet/push-object", [body[:10], body[10:]])
    assert status == 200 and reached == body


def _reply(node: int, sender: int | None = None, run_id: int = 7) -> bytes:
    """A ``push-messages`` body: node ``node`` pushes one reply whose sender is ``sender`` (default: itself)."""
    from flwr.proto.fleet_pb2 import PushMessagesRequest  # pylint: disable=no-name-in-module
    from flwr.proto.message_pb2 import Message, Metadata  # pylint: disable=no-name-in-module
    from flwr.proto.node_pb2 import Node  # pylint: disable=no-name-in-module

    message = Message(metadata=Metadata(run_id=run_id, src_node_id=node if sender is None else sender, dst_node_id=1))
    return PushMessagesRequest(node=Node(node_id=node), messages_list=[message]).SerializeToString()


def _open_session(middleware: BoundedReplies, session: str, node: int = 11, run_id: int = 7) -> None:
    """A reply pushed by ``node`` and stored by Flower, whose answer opens push session ``session``."""
    from flwr.proto.fleet_pb2 import PushMessagesResponse  # pylint: disable=no-name-in-module

    answer = PushMessagesResponse(session_id=session).SerializeToString()
    assert _push(middleware, "/v1/fleet/push-messages", [_reply(node, run_id=run_id)], answer=answer)[0] == 200


def test_the_objects_of_one_reply_together_are_bounded_and_an_object_counts_once():
    middleware = BoundedReplies(None, limit=2000)
    _open_session(middleware, "reply-1")
    _open_session(middleware, "reply-2")

    def push(session, object_id, size):
        status, _, reached = _push(middleware, "/v1/fleet/push-object", [_object(session, object_id, size)])
        return status, reached is not None

    assert push("reply-1", "a", 900) == (200, True)
    assert push("reply-1", "a", 900) == (200, True)  # pushed again (a retry): counted once
    assert push("reply-1", "b", 900) == (200, True)
    assert push("reply-1", "c", 900) == (413, False)  # 2,700 bytes in one reply
    assert push("reply-2", "c", 900) == (200, True)  # another reply has its own bound
    assert push("reply-1", "d", 10) == (200, True)   # the refused object did not count


def test_paths_outside_the_fleet_api_are_not_bounded_here():
    reached = []

    async def flower(scope, receive, send):
        reached.append(scope["path"])

    middleware = BoundedReplies(flower, limit=10)
    asyncio.run(middleware({"type": "http", "method": "POST", "path": "/v1/control/start-run",
                            "headers": [(b"content-length", b"999")]}, None, None))
    assert reached == ["/v1/control/start-run"]


def test_the_bound_is_a_positive_whole_number_of_mib():
    import argparse

    assert superlink.positive_mib("64") == 64
    for bad in ("0", "-3", "1.5", "lots"):
        with pytest.raises(argparse.ArgumentTypeError):
            superlink.positive_mib(bad)


def _pull(middleware: BoundedReplies, object_id: str, flowers_answer, run_id: int = 7):
    """The ServerApp's pull of ``object_id`` through ``middleware``, Flower answering ``flowers_answer``."""
    from flwr.proto.message_pb2 import PullObjectRequest, PullObjectResponse  # pylint: disable=no-name-in-module

    asked = []

    async def flower(scope, receive, send):
        asked.append((await receive())["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": flowers_answer.SerializeToString()})

    middleware.app = flower
    sent = []
    body = PullObjectRequest(run_id=run_id, object_id=object_id).SerializeToString()

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(middleware({"type": "http", "method": "POST", "path": "/v1/runtime/pull-object",
                            "client": ("127.0.0.1", 5000), "headers": []}, receive, send))
    answer = PullObjectResponse()
    answer.ParseFromString(b"".join(m.get("body", b"") for m in sent[1:]))
    assert asked == [body]  # Flower is always asked first
    return answer


def test_the_serverapps_pull_of_a_refused_object_fails_at_once_unless_flower_holds_it():
    from flwr.proto.message_pb2 import PullObjectResponse  # pylint: disable=no-name-in-module

    middleware = BoundedReplies(None, limit=2000)
    assert _push(middleware, "/v1/fleet/push-object", [_object("reply-1", "big", 5000)])[0] == 413
    waiting = PullObjectResponse(object_found=True, object_available=False)  # preregistered, never uploaded
    answer = _pull(middleware, "big", waiting)
    assert not answer.object_found and not answer.object_available
    # The same content uploaded in another reply (objects are named by their hash): Flower's answer stands.
    held = PullObjectResponse(object_found=True, object_available=True, object_content=b"x")
    assert _pull(middleware, "big", held) == held
    # Objects never refused, and the same id in another run, are Flower's business.
    assert _pull(middleware, "small", waiting) == waiting
    assert _pull(middleware, "big", waiting, run_id=8) == waiting


def test_a_refused_requests_object_is_named_from_its_first_bytes():
    whole = _object("reply-1", "3f" * 32, 10**6, run_id=2**40 + 5)
    assert superlink._object_key(whole[:200]) == (2**40 + 5, "3f" * 32)
    assert superlink._object_key(whole[:10]) == (2**40 + 5, None)  # the id itself cut off
    assert superlink._object_key(b"\xff") == (None, None)


def test_a_reply_in_another_nodes_name_is_refused():
    # Flower 1.42 checks the request's node against its key and a reply's sender against its instruction's
    # destination, but never the sender against the request's node.
    status, body, reached = _push(BoundedReplies(None), "/v1/fleet/push-messages", [_reply(node=11, sender=22)])
    assert (status, reached) == (403, None)
    assert b"node 11 pushed a reply in the name of node 22" in body
    assert _push(BoundedReplies(None), "/v1/fleet/push-messages", [_reply(node=22)])[0] == 200


def test_junk_pushes_neither_evict_a_replys_count_nor_are_counted():
    # Row 3 of issue 43: 65,536 junk pushes evicted a real reply's byte count from the table.
    middleware = BoundedReplies(None, limit=2000)
    _open_session(middleware, "real")
    assert _push(middleware, "/v1/fleet/push-object", [_object("real", "a", 1500)])[0] == 200
    for i in range(superlink.TRACKED_SESSIONS + 10):
        middleware._count_object(_object(f"junk-{i}", "j", 10))
    assert list(middleware.session_objects) == [(7, "real")]
    assert _push(middleware, "/v1/fleet/push-object", [_object("real", "b", 1500)])[0] == 413  # still counted
    status, body, _ = _push(middleware, "/v1/fleet/push-object", [_object("", "c", 10)])
    assert status == 400 and b"without its push session" in body


def _held_body(middleware: BoundedReplies, chunks: list[bytes], *, then_wait: bool):
    """A push-object request whose peer sends ``chunks`` and then (``then_wait``) holds the rest forever."""
    pending = [{"type": "http.request", "body": chunk, "more_body": True} for chunk in chunks]
    sent = []

    async def receive():
        if pending:
            return pending.pop(0)
        if then_wait:
            await asyncio.sleep(3600)
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/fleet/push-object", "client": ("192.0.2.7", 5000), "headers": []}
    return middleware(scope, receive, send), sent


def test_a_held_body_times_out_and_bodies_in_flight_are_bounded_together():
    # Row 2 of issue 43: ten peers each sent 64 MiB - 1 byte and held the last one; the SuperLink grew by 660 MB.
    async def scenario():
        middleware = BoundedReplies(None, limit=1000, body_seconds=0.5)
        middleware.app = None  # never reached
        holders = [_held_body(middleware, [b"x" * 900], then_wait=True) for _ in range(3)]
        tasks = [asyncio.ensure_future(call) for call, _ in holders]
        await asyncio.sleep(0.1)
        held_at_peak = middleware.in_flight
        await asyncio.gather(*tasks)
        return held_at_peak, middleware.in_flight, [sent[0]["status"] for _, sent in holders]

    held_at_peak, held_after, statuses = asyncio.run(scenario())
    assert held_at_peak <= 2 * 1000  # the global bound: two bodies in flight; the third is turned away
    assert held_after == 0
    assert sorted(statuses) == [408, 408, 503]


class _State:
    enable_supernode_auth = True

    def __init__(self, registered: bytes | None):
        self.linkstate_factory = type("Factory", (), {"state": lambda _: type("LinkState", (), {
            "get_node_id_by_public_key": lambda _, key: 5 if key == registered else None})()})()


def _signed_headers(private_key, timestamp=None) -> dict:
    import base64
    import datetime

    from flwr.supercore.primitives.asymmetric import public_key_to_bytes, sign_message

    timestamp = timestamp or datetime.datetime.now(datetime.timezone.utc).isoformat()
    return {b"flwr-public-key": base64.b64encode(public_key_to_bytes(private_key.public_key())),
            b"flwr-signature": base64.b64encode(sign_message(private_key, timestamp.encode("ascii"))),
            b"flwr-timestamp": timestamp.encode()}


def test_with_node_authentication_an_unsigned_request_is_refused_before_its_body_is_read():
    from cryptography.hazmat.primitives.asymmetric import ec
    from flwr.supercore.primitives.asymmetric import public_key_to_bytes

    key, stranger = ec.generate_private_key(ec.SECP384R1()), ec.generate_private_key(ec.SECP384R1())
    state = _State(public_key_to_bytes(key.public_key()))
    assert superlink.unsigned_reason(_signed_headers(key), state) is None
    assert "not one the operator registered" in superlink.unsigned_reason(_signed_headers(stranger), state)
    assert "no node signature" in superlink.unsigned_reason({}, state)
    assert "outside Flower's window" in superlink.unsigned_reason(_signed_headers(key, "2020-01-01T00:00:00+00:00"), state)
    forged = {**_signed_headers(key), b"flwr-signature": _signed_headers(stranger)[b"flwr-signature"]}
    assert "does not verify" in superlink.unsigned_reason(forged, state)
    # A node's first requests: Flower itself answers an unregistered key ("Failed to activate SuperNode").
    assert superlink.unsigned_reason(_signed_headers(stranger), state, registered=False) is None

    read, reached, sent = [], [], []

    async def receive():
        read.append(True)
        return {"type": "http.request", "body": b"x" * 100, "more_body": False}

    async def flower(scope, receive, send):
        reached.append(scope["path"])

    async def send(message):
        sent.append(message)

    app = type("App", (), {"state": state})()
    scope = {"type": "http", "method": "POST", "path": "/v1/fleet/push-object", "client": ("192.0.2.7", 5000),
             "headers": list(_signed_headers(stranger).items()), "app": app}
    asyncio.run(SignedBeforeRead(flower)(scope, receive, send))
    assert sent[0]["status"] == 401 and not read and not reached
    asyncio.run(SignedBeforeRead(flower)({**scope, "headers": list(_signed_headers(key).items())}, receive, send))
    assert reached == ["/v1/fleet/push-object"]
    asyncio.run(SignedBeforeRead(flower)({**scope, "path": "/v1/fleet/activate-node"}, receive, send))
    assert reached[-1] == "/v1/fleet/activate-node"  # signed by a key of its own: Flower decides


def test_a_nodes_registration_requests_are_small():
    status, body, reached = _push(BoundedReplies(None), "/v1/fleet/activate-node", [b"x" * (superlink.REGISTRATION_BODY_BYTES + 1)])
    assert (status, reached) == (413, None) and b"a node's registration holds" in body
    assert _push(BoundedReplies(None), "/v1/fleet/activate-node", [b"x" * 300])[0] == 200
