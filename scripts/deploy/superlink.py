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
reply it belongs to never completes (the ServerApp records Flower's "Reply message objects are
unavailable" for that site, with :data:`fedica.server.federation.UNAVAILABLE_HINT`).
Flower's ServerApp would then retry pulling the refused object for minutes (it waits for an upload
that may still come); the middleware answers those pulls "not found", which ends the stage at once
with that site's reply missing whenever the ServerApp asks for the refused object itself (not when
it is busy with the reply's objects the SuperNode never pushed after the refusal: those wait for
Flower's expiry). The ServerApp's own, relative, bound
(``fedica.protocol.messages.reply_size_limits``) still checks every reply that arrives.
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
# Where the ServerApp pulls a reply's objects (Flower's Runtime API).
PULL_OBJECT_PATH = "/v1/runtime/pull-object"
# How many pushed replies' byte counts are kept: a reply's objects are pushed right after its message,
# so only the newest sessions can still grow; the oldest are forgotten first.
TRACKED_SESSIONS = 65_536


class BoundedReplies:
    """ASGI middleware: a Fleet API request, and one reply's objects together, hold at most ``limit`` bytes.

    A request's body is read here (never more than ``limit`` bytes of it) and handed on to Flower
    unchanged; a ``push-object`` request adds its object's bytes to its reply's (Flower's push
    session's) total, each object counted once however often it is pushed. Over the bound, the
    request is answered ``413`` with a JSON ``detail`` naming the bound, and Flower never sees it.
    A Runtime API pull of a refused object that Flower holds no content for is answered "not found"
    (a permanent failure to Flower's ServerApp, which would otherwise retry it for minutes).
    """

    def __init__(self, app, limit: int = DEFAULT_MAX_REPLY_MIB * 2**20) -> None:
        self.app = app
        self.limit = int(limit)
        self.session_objects: OrderedDict[tuple[int, str], dict[str, int]] = OrderedDict()
        self.refused_objects: OrderedDict[tuple[int, str], None] = OrderedDict()

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path == PULL_OBJECT_PATH and self.refused_objects:
            await self._pull_object(scope, receive, send)
            return
        if not path.startswith(PUBLIC_PATH_PREFIXES):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await self._refuse(scope, send, f"the request holds {declared} bytes")
            return
        body = await _read_body(receive, self.limit)
        if body is None:
            return  # the peer left; nothing to answer
        if len(body) > self.limit:
            if path == PUSH_OBJECT_PATH:
                self._remember_refused(*_object_key(body))
            await self._refuse(scope, send, f"the request holds more than {self.limit} bytes")
            return
        if path == PUSH_OBJECT_PATH:
            total = self._count_object(body)
            if total is not None and total > self.limit:
                await self._refuse(scope, send, f"the objects of one reply hold {total} bytes")
                return
        await self.app(scope, _replaying(body, receive), send)

    async def _pull_object(self, scope, receive, send) -> None:
        """The ServerApp's pull of an object: Flower's answer, or "not found" for a refused object Flower lacks."""
        from flwr.proto.message_pb2 import PullObjectRequest, PullObjectResponse  # pylint: disable=no-name-in-module
        from google.protobuf.message import DecodeError

        body = await _read_body(receive, self.limit)
        if body is None:
            return
        request = PullObjectRequest()
        try:
            request.ParseFromString(body)
        except DecodeError:
            await self.app(scope, _replaying(body, receive), send)
            return
        if (int(request.run_id), str(request.object_id)) not in self.refused_objects:
            await self.app(scope, _replaying(body, receive), send)
            return
        # Ask Flower first: the same content (objects are named by their hash) may have come in another reply.
        answer = []
        await self.app(scope, _replaying(body, receive), lambda message: _append(answer, message))
        start, parts = answer[0], answer[1:]
        flowers = b"".join(m.get("body", b"") for m in parts)
        response = PullObjectResponse()
        if start["status"] == 200:
            try:
                response.ParseFromString(flowers)
            except DecodeError:
                response.object_available = True  # not Flower's protobuf answer: pass it on untouched
        if start["status"] != 200 or response.object_available:
            for message in answer:
                await send(message)
            return
        missing = PullObjectResponse(object_found=False, object_available=False).SerializeToString()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/protobuf"), (b"content-length", str(len(missing)).encode())]})
        await send({"type": "http.response.body", "body": missing})

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
            self._remember_refused(key[0], str(request.object_id))
        self.session_objects[key] = objects
        while len(self.session_objects) > TRACKED_SESSIONS:
            self.session_objects.popitem(last=False)
        return total

    def _remember_refused(self, run_id: int | None, object_id: str | None) -> None:
        if run_id is not None and object_id is not None:
            self.refused_objects[(run_id, object_id)] = None
            while len(self.refused_objects) > TRACKED_SESSIONS:
                self.refused_objects.popitem(last=False)

    async def _refuse(self, scope, send, what: str) -> None:
        client = scope.get("client")
        reason = f"fedica-superlink: {what}, more than the {self.limit} bytes a reply may hold (--max-reply-mib)"
        log.warning("refused %s from %s: %s", scope.get("path"), client[0] if client else "an unknown peer", reason)
        body = json.dumps({"detail": reason}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def _object_key(prefix: bytes) -> tuple[int | None, str | None]:
    """The run id and object id of a ``PushObjectRequest`` of which only the first bytes were read.

    The protobuf runtime parses whole messages only, and a request refused for its size is never read
    whole; protobuf writes fields in their numbers' order, so the run id (field 2, a varint) and the
    object id (field 3, a string) come before the content (field 4), and a walk over the wire format
    (tag, then a varint or a length and its bytes) finds them in the prefix.
    """
    run_id = object_id = None
    position = 0
    try:
        while position < len(prefix) and (run_id is None or object_id is None):
            tag, position = _varint(prefix, position)
            field, wire_type = tag >> 3, tag & 7
            if wire_type == 0:
                value, position = _varint(prefix, position)
                if field == 2:
                    run_id = value
            elif wire_type == 2:
                length, position = _varint(prefix, position)
                if field == 3 and position + length <= len(prefix):
                    object_id = prefix[position:position + length].decode("utf-8")
                position += length
            else:
                break  # no such field in a PushObjectRequest
    except (IndexError, UnicodeDecodeError):
        pass
    return run_id, object_id


def _varint(data: bytes, position: int) -> tuple[int, int]:
    """The protobuf varint at ``position`` and the position after it."""
    value = shift = 0
    while True:
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7


async def _read_body(receive, limit: int) -> bytes | None:
    """A request's body, read until its end or until it holds more than ``limit`` bytes; None if the peer left."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        body += message.get("body", b"")
        if len(body) > limit or not message.get("more_body", False):
            return bytes(body)


def _replaying(body: bytes, receive):
    """An ASGI ``receive`` that gives ``body`` (already read) once, then what ``receive`` gives (the disconnect)."""
    replayed = False

    async def replay():
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _append(messages: list, message) -> None:
    messages.append(message)


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
