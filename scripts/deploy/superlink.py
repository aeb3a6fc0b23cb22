"""``fedica-superlink``: Flower's SuperLink, whose Control and Runtime APIs answer only the operator.

Flower 1.42 serves its Fleet API (what SuperNodes use), its Control API (``flwr run``, ``ls``,
``log``, ``stop``, ``supernode register``) and its Runtime API (what the ServerApp uses) on one
HTTP port, and its open-source SuperLink authenticates no user: whoever reaches the port and
trusts ``ca.pem`` could submit an App of their own, whose ClientApp every SuperNode would run,
read the operator's logs, stop the operator's runs and register node keys. ``--control-api-address``
is deprecated and ignored, and SuperNode-side App verification (``--trusted-entities``) accepts only
FABs signed through Flower Hub, never one submitted with ``flwr run``.

This launcher starts Flower's own SuperLink (the same arguments as ``flower-superlink``) with one
more ASGI middleware, put in at Flower's middleware hook: a request from any peer but the
operator's addresses (:data:`OPERATOR_ADDRESSES`, the loopback addresses: the operator works on the
SuperLink machine, or through an SSH tunnel to it) may reach only the Fleet API and the health
check; everything else gets ``403`` and one line saying why. The ServerApp process, which Flower
starts on the SuperLink machine, reaches the Runtime API over loopback.

A second middleware, :class:`BoundedReplies`, bounds what a site may push: Flower 1.42 has no
message size option (a SuperNode's reply is pushed as objects of up to 5 MiB, any number of them,
all kept in the SuperLink's memory and pulled whole by the ServerApp). Every Fleet API request body,
and the objects of one pushed reply together, may hold at most ``--max-reply-mib`` (default
:data:`DEFAULT_MAX_REPLY_MIB`); a request beyond it gets ``413`` before Flower reads it, and the
reply it belongs to never completes (the ServerApp records ``no reply within ...`` for that site).
The ServerApp's own, relative, bound (``fedica.protocol.messages.reply_size_limits``) still checks
every reply that arrives.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import sys
from collections import OrderedDict
from collections.abc import Sequence

log = logging.getLogger("fedica.deploy")

# The peers that may use the Control and Runtime APIs. Only these two: another 127.x address is
# still this machine, but nothing of Flower's or fedica's connects from one, and the tests use one to
# stand for a remote machine while every server they start listens on loopback only.
OPERATOR_ADDRESSES = frozenset({ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")})

# What a site's SuperNode needs: the Fleet API, and the health check a load balancer may probe.
PUBLIC_PATH_PREFIXES = ("/v1/fleet/",)
PUBLIC_PATHS = frozenset({"/health"})

REFUSAL = (b"fedica-superlink: only the operator (a connection from the SuperLink machine's loopback address) "
           b"may use this API; sites may use the Fleet API only\n")


def is_operator(host: str | None) -> bool:
    """Whether a peer address is one of :data:`OPERATOR_ADDRESSES` (an IPv4-mapped IPv6 address counts as IPv4)."""
    if not host:
        return False  # a Unix socket or an unknown peer: not provably the operator
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address in OPERATOR_ADDRESSES


def is_public(path: str) -> bool:
    """Whether ``path`` is one any peer may request (the Fleet API, the health check)."""
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PATH_PREFIXES)


class OperatorOnlyBeyondFleet:
    """ASGI middleware: a non-operator peer reaches only the public paths; anything else is refused with 403."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] in ("http", "websocket") and not is_public(scope.get("path", "")):
            client = scope.get("client")
            if not is_operator(client[0] if client else None):
                log.warning("refused %s %s from %s: not the operator", scope.get("method", "WS"), scope.get("path"),
                            client[0] if client else "an unknown peer")
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                await send({"type": "http.response.start", "status": 403,
                            "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                        (b"content-length", str(len(REFUSAL)).encode())]})
                await send({"type": "http.response.body", "body": REFUSAL})
                return
        await self.app(scope, receive, send)


# The bound of one reply. Honest replies of fedica's tasks are kilobytes to a few MiB (FedGEM's rounds
# 3 d K_g numbers, RF-ICA's d r and d^2, the evaluation's contingency counts); the comparators' per-point
# residuals grow with a site's size (8 bytes a point: 64 MiB is 8 million points). A site with more
# raises it with --max-reply-mib (fedica-deploy: engine.max_reply_mib).
DEFAULT_MAX_REPLY_MIB = 64
PUSH_OBJECT_PATH = "/v1/fleet/push-object"
# How many pushed replies' byte counts are kept: a reply's objects are pushed right after its message,
# so only the newest sessions can still grow; the oldest are forgotten first.
TRACKED_SESSIONS = 65_536


class BoundedReplies:
    """ASGI middleware: a Fleet API request, and one reply's objects together, hold at most ``limit`` bytes.

    A request's body is read here (never more than ``limit`` bytes of it) and handed on to Flower
    unchanged; a ``push-object`` request adds its object's bytes to its reply's (Flower's push
    session's) total, each object counted once however often it is pushed. Over the bound, the
    request is answered ``413`` with a JSON ``detail`` naming the bound, and Flower never sees it.
    """

    def __init__(self, app, limit: int = DEFAULT_MAX_REPLY_MIB * 2**20) -> None:
        self.app = app
        self.limit = int(limit)
        self.session_objects: OrderedDict[tuple[int, str], dict[str, int]] = OrderedDict()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith(PUBLIC_PATH_PREFIXES):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await self._refuse(scope, send, f"the request holds {declared} bytes")
            return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the peer left; nothing to answer
            body += message.get("body", b"")
            if len(body) > self.limit:
                await self._refuse(scope, send, f"the request holds more than {self.limit} bytes")
                return
            if not message.get("more_body", False):
                break
        if scope["path"] == PUSH_OBJECT_PATH:
            total = self._count_object(bytes(body))
            if total is not None and total > self.limit:
                await self._refuse(scope, send, f"the objects of one reply hold {total} bytes")
                return
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: the disconnect, when it comes
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)

    def _count_object(self, body: bytes) -> int | None:
        """The bytes of the reply this pushed object belongs to, with it; None for a body Flower will refuse itself."""
        from flwr.proto.message_pb2 import PushObjectRequest  # pylint: disable=no-name-in-module
        from google.protobuf.message import DecodeError

        request = PushObjectRequest()
        try:
            request.ParseFromString(body)
        except DecodeError:
            return None
        key = (int(request.run_id), str(request.session_id))
        objects = self.session_objects.pop(key, {})
        objects.setdefault(request.object_id, len(request.object_content))
        total = sum(objects.values())
        if total > self.limit:
            objects.pop(request.object_id)  # refused: it does not count
        self.session_objects[key] = objects
        while len(self.session_objects) > TRACKED_SESSIONS:
            self.session_objects.popitem(last=False)
        return total

    async def _refuse(self, scope, send, what: str) -> None:
        client = scope.get("client")
        reason = f"fedica-superlink: {what}, more than the {self.limit} bytes a reply may hold (--max-reply-mib)"
        log.warning("refused %s from %s: %s", scope.get("path"), client[0] if client else "an unknown peer", reason)
        body = json.dumps({"detail": reason}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def _content_length(scope) -> int | None:
    """The request's declared ``content-length``, or None when it declares none (or none that is a number)."""
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def install_operator_guard(max_reply_bytes: int = DEFAULT_MAX_REPLY_MIB * 2**20) -> None:
    """Put :class:`OperatorOnlyBeyondFleet`, then :class:`BoundedReplies`, first in Flower's middleware.

    ``flwr.superlink.extensions.get_middleware`` is the hook Flower's SuperLink asks for extra
    middleware when it builds its app (``flwr.superlink.main``); the launcher wraps it, so Flower's
    own middleware (node authentication included) still runs, after the guards. Installing again
    only sets the bound anew.
    """
    from flwr.superlink import extensions
    from starlette.middleware import Middleware

    flower_middleware = getattr(extensions.get_middleware, "flower_middleware", extensions.get_middleware)

    def get_middleware():
        return (Middleware(OperatorOnlyBeyondFleet), Middleware(BoundedReplies, limit=max_reply_bytes),
                *flower_middleware())

    get_middleware.flower_middleware = flower_middleware
    extensions.get_middleware = get_middleware


def positive_mib(text: str) -> int:
    """``--max-reply-mib``'s value: a positive whole number of MiB."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of MiB") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1 MiB")
    return value


def main(argv: Sequence[str] | None = None) -> None:
    """``fedica-superlink [--max-reply-mib N] [flower-superlink arguments]``."""
    from flwr.superlink.cli.flower_superlink import flower_superlink

    parser = argparse.ArgumentParser(prog="fedica-superlink", add_help=False)
    parser.add_argument("--max-reply-mib", type=positive_mib, default=DEFAULT_MAX_REPLY_MIB,
                        help=f"the most MiB one site's reply may hold (default {DEFAULT_MAX_REPLY_MIB})")
    ours, flowers = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    install_operator_guard(ours.max_reply_mib * 2**20)
    sys.argv = ["fedica-superlink", *flowers]
    flower_superlink()


if __name__ == "__main__":
    main()
