"""fedica-superlink's guard: who may use which of the SuperLink's APIs (the real processes: test_deployment.py)."""

import asyncio

import pytest

from fedica.scripts.deploy import superlink
from fedica.scripts.deploy.superlink import OperatorOnlyBeyondFleet, is_operator, is_public


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
    superlink.install_operator_guard()  # idempotent
    stack = [m.cls for m in create_app().user_middleware]
    assert stack[0] is OperatorOnlyBeyondFleet and stack.count(OperatorOnlyBeyondFleet) == 1
    assert any(cls.__name__ == "NodeAuthMiddleware" for cls in stack)
