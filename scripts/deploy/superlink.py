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

Before authentication nothing costs memory (:class:`SignedBeforeRead`, and :class:`BoundedReplies`'
own rules):

- with ``--enable-supernode-auth``, a Fleet API request's node signature (Flower's: a signed
  timestamp and a registered public key, in the headers) is checked before a byte of its body is
  read; Flower checks it again, with the node id inside the body, after;
- a body must arrive within :data:`BODY_SECONDS`, and all bodies being read or handled at once
  hold at most :data:`IN_FLIGHT_REPLIES` times the bound (beyond, ``503``, which Flower's
  SuperNodes retry);
- a reply's byte count is kept only for a push session that Flower opened (its answer to a
  ``push-messages`` that it stored), so that junk pushes cannot evict it; a ``push-object``
  without a session id is refused (Flower 1.42 always sends one);
- a ``push-messages`` whose message claims another node as its sender than the request's node
  is refused: a registered node cannot answer another node's instruction in that node's name.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import ipaddress
import json
import logging
import os
import sys
from collections import OrderedDict
from collections.abc import Mapping, Sequence

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


class SignedBeforeRead:
    """ASGI middleware: with SuperNode authentication on, a Fleet API request whose headers do not carry a
    valid node signature of a registered key is answered ``401`` before any of its body is read.

    Flower's own check (``flwr.superlink.routers.fleet.node_auth``) runs after its body is parsed: an
    unauthenticated peer could otherwise make the SuperLink read a body of up to the bound first. The
    same rules as Flower's are applied to the headers (a timestamp inside Flower's window, signed by
    the public key sent beside it); the key must belong to a node the operator registered. Flower then
    checks that the body's node id is that key's. A node's first requests (:data:`REGISTRATION_PATHS`)
    name the key in the body, and Flower answers an unregistered one itself (the SuperNode then exits
    with Flower's "Failed to activate SuperNode"): for them the signature is checked here, and their
    bodies are bounded to :data:`REGISTRATION_BODY_BYTES` by :class:`BoundedReplies`.
    """

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        app_state = getattr(scope.get("app"), "state", None)
        if path.startswith(PUBLIC_PATH_PREFIXES) and getattr(app_state, "enable_supernode_auth", False):
            from starlette.concurrency import run_in_threadpool

            reason = await run_in_threadpool(unsigned_reason, dict(scope.get("headers", [])), app_state,
                                             path not in REGISTRATION_PATHS)
            if reason is not None:
                await _answer(scope, send, 401, f"fedica-superlink: {reason}; nothing of the request was read")
                return
        await self.app(scope, receive, send)


def unsigned_reason(headers: dict[bytes, bytes], app_state, registered: bool = True) -> str | None:
    """Why a Fleet API request's headers do not authenticate a node (None: they do); with ``registered``,
    a node whose key the operator registered."""
    from flwr.common.constant import SYSTEM_TIME_TOLERANCE, TIMESTAMP_HEADER, TIMESTAMP_TOLERANCE
    from flwr.supercore.constant import FLEET_HTTP_PUBLIC_KEY_HEADER, FLEET_HTTP_SIGNATURE_HEADER
    from flwr.supercore.primitives.asymmetric import bytes_to_public_key, verify_signature

    try:
        public_key = base64.b64decode(headers[FLEET_HTTP_PUBLIC_KEY_HEADER.encode()], validate=True)
        signature = base64.b64decode(headers[FLEET_HTTP_SIGNATURE_HEADER.encode()], validate=True)
        timestamp = headers[TIMESTAMP_HEADER.encode()].decode("ascii")
        age = (datetime.datetime.now(datetime.timezone.utc) - datetime.datetime.fromisoformat(timestamp)).total_seconds()
    except (KeyError, ValueError, TypeError, UnicodeError, OverflowError):
        return "no node signature in the request's headers"
    if not -SYSTEM_TIME_TOLERANCE < age < TIMESTAMP_TOLERANCE + SYSTEM_TIME_TOLERANCE:
        return "the node signature's timestamp is outside Flower's window"
    try:
        valid = verify_signature(bytes_to_public_key(public_key), timestamp.encode("ascii"), signature)
    except (ValueError, TypeError):
        valid = False
    if not valid:
        return "the node signature does not verify"
    if registered and app_state.linkstate_factory.state().get_node_id_by_public_key(public_key) is None:
        return "the signing key is not one the operator registered"
    return None


# The bound of one reply. Honest replies of fedica's tasks are kilobytes to a few MiB (FedGEM's rounds
# 3 d K_g numbers, RF-ICA's d r and d^2, the evaluation's contingency counts); the comparators' per-point
# residuals grow with a site's size (8 bytes a point: 64 MiB is 8 million points). A site with more
# raises it with --max-reply-mib (fedica-deploy: engine.max_reply_mib).
DEFAULT_MAX_REPLY_MIB = 64
PUSH_OBJECT_PATH = "/v1/fleet/push-object"
# Where the ServerApp pulls a reply's objects (Flower's Runtime API).
PULL_OBJECT_PATH = "/v1/runtime/pull-object"
PUSH_MESSAGES_PATH = "/v1/fleet/push-messages"
# A node's first requests carry its public key and a heartbeat interval: a few hundred bytes.
REGISTRATION_PATHS = frozenset({"/v1/fleet/register-node", "/v1/fleet/activate-node"})
REGISTRATION_BODY_BYTES = 64 * 2**10
# How many pushed replies' byte counts are kept: a reply's objects are pushed right after its message,
# so only the newest sessions can still grow; the oldest are forgotten first. Only sessions Flower
# opened are kept, so only replies Flower stored can push older ones out.
TRACKED_SESSIONS = 65_536
# The seconds a Fleet API request's body may take to arrive. An honest body of the bound (64 MiB) takes
# a second on a 1 Gbit/s link; a peer that holds its last byte is cut off instead of holding memory.
BODY_SECONDS = 60.0
# The bodies being read or handled at once hold at most this many times the bound.
IN_FLIGHT_REPLIES = 2


class _Busy(Exception):
    """Reading another chunk would take the bodies in flight beyond their global bound."""


class BoundedReplies:
    """ASGI middleware: a Fleet API request, and one reply's objects together, hold at most ``limit`` bytes.

    A request's body is read here (never more than ``limit`` bytes of it) and handed on to Flower
    unchanged; a ``push-object`` request adds its object's bytes to its reply's (Flower's push
    session's) total, each object counted once however often it is pushed. Over the bound, the
    request is answered ``413`` with a JSON ``detail`` naming the bound, and Flower never sees it.
    A Runtime API pull of a refused object that Flower holds no content for is answered "not found"
    (a permanent failure to Flower's ServerApp, which would otherwise retry it for minutes).
    """

    def __init__(self, app, limit: int = DEFAULT_MAX_REPLY_MIB * 2**20, *, body_seconds: float = BODY_SECONDS,
                 in_flight_limit: int | None = None) -> None:
        self.app = app
        self.limit = int(limit)
        self.body_seconds = float(body_seconds)
        self.in_flight_limit = IN_FLIGHT_REPLIES * self.limit if in_flight_limit is None else int(in_flight_limit)
        self.in_flight = 0  # the bytes of the Fleet API bodies read and not yet handled
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
        limit = REGISTRATION_BODY_BYTES if path in REGISTRATION_PATHS else self.limit
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await self._refuse(scope, send, f"the request holds {declared} bytes", limit)
            return
        held = [0]  # the bytes this request counts in self.in_flight, given back when it is handled
        try:
            try:
                body = await asyncio.wait_for(self._read_fleet_body(receive, held, limit), self.body_seconds)
            except asyncio.TimeoutError:
                await _answer(scope, send, 408, f"fedica-superlink: the request's body did not arrive within "
                                                     f"{self.body_seconds:.0f} s")
                return
            except _Busy:
                await _answer(scope, send, 503, "fedica-superlink: too many request bodies at once; retry")
                return
            if body is None:
                return  # the peer left; nothing to answer
            await self._handle(scope, receive, send, path, body, limit)
        finally:
            self.in_flight -= held[0]

    async def _handle(self, scope, receive, send, path: str, body: bytes, limit: int) -> None:
        """A Fleet API request whose body (at most ``limit`` + one chunk) was read."""
        if len(body) > limit:
            if path == PUSH_OBJECT_PATH:
                self._remember_refused(*_object_key(body))
            await self._refuse(scope, send, f"the request holds more than {limit} bytes", limit)
            return
        if path == PUSH_OBJECT_PATH:
            total = self._count_object(body)
            if total == NO_SESSION:
                await _answer(scope, send, 400, "fedica-superlink: an object pushed without its push session's id")
                return
            if total is not None and total > self.limit:
                await self._refuse(scope, send, f"the objects of one reply hold {total} bytes")
                return
        if path == PUSH_MESSAGES_PATH:
            run_id, impostor = _sender_check(body)
            if impostor:
                await _answer(scope, send, 403, f"fedica-superlink: {impostor}")
                return
            await self.app(scope, _replaying(body, receive), self._opened_session(send, run_id))
            return
        await self.app(scope, _replaying(body, receive), send)

    async def _read_fleet_body(self, receive, held: list[int], limit: int) -> bytes | None:
        """:func:`_read_body`, with every chunk counted against the bodies in flight (``held[0]``: this one's share)."""
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            # One request alone may always reach the bound (its last chunk beyond it is refused with 413).
            if self.in_flight > held[0] and self.in_flight + len(chunk) > self.in_flight_limit:
                raise _Busy
            self.in_flight += len(chunk)
            held[0] += len(chunk)
            body += chunk
            if len(body) > limit or not message.get("more_body", False):
                return bytes(body)

    def _opened_session(self, send, run_id: int | None):
        """``send``, noting the push session Flower's answer to a ``push-messages`` opens (its bytes are counted)."""
        start: dict = {}
        answer = bytearray()

        async def noting(message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body" and len(answer) <= MAX_SESSION_ANSWER:
                answer.extend(message.get("body", b""))
                if not message.get("more_body", False) and start.get("status") == 200 and run_id is not None:
                    self._open_session(run_id, bytes(answer))
            await send(message)

        return noting

    def _open_session(self, run_id: int, answer: bytes) -> None:
        from flwr.proto.fleet_pb2 import PushMessagesResponse  # pylint: disable=no-name-in-module
        from google.protobuf.message import DecodeError

        response = PushMessagesResponse()
        try:
            response.ParseFromString(answer)
        except DecodeError:
            return
        if response.session_id:
            self.session_objects[(run_id, str(response.session_id))] = {}
            while len(self.session_objects) > TRACKED_SESSIONS:
                self.session_objects.popitem(last=False)

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
        """The bytes of the reply this pushed object belongs to, with it; None for a body Flower will refuse itself
        (not a ``PushObjectRequest``, or of a session Flower did not open here); :data:`NO_SESSION` without a session id."""
        from flwr.proto.message_pb2 import PushObjectRequest  # pylint: disable=no-name-in-module
        from google.protobuf.message import DecodeError

        request = PushObjectRequest()
        try:
            request.ParseFromString(body)
        except DecodeError:
            return None
        if not request.session_id:
            # Flower would look for the session itself, among every pending object of the run: uncounted.
            return NO_SESSION
        key = (int(request.run_id), str(request.session_id))
        if key not in self.session_objects:
            return None
        objects = self.session_objects.pop(key)
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

    async def _refuse(self, scope, send, what: str, limit: int | None = None) -> None:
        if limit is None or limit == self.limit:
            reason = f"fedica-superlink: {what}, more than the {self.limit} bytes a reply may hold (--max-reply-mib)"
        else:
            reason = f"fedica-superlink: {what}, more than the {limit} bytes a node's registration holds"
        await _answer(scope, send, 413, reason)


async def _answer(scope, send, status: int, reason: str) -> None:
    """Answer ``status`` with a JSON ``detail`` (Flower's form), log one line, and close the connection."""
    client = scope.get("client")
    log.warning("refused %s from %s: %s", scope.get("path"), client[0] if client else "an unknown peer", reason)
    body = json.dumps({"detail": reason}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


NO_SESSION = -1
# Flower's answer to a push-messages is a few hundred bytes (the session id and the object ids to push).
MAX_SESSION_ANSWER = 2**20


def _sender_check(body: bytes) -> tuple[int | None, str | None]:
    """A ``push-messages`` body's run id, and why it is refused (None: not refused here).

    Flower checks that the request's node (``node.node_id``) holds the key that signed it and that a
    reply's sender is its instruction's destination, but not that the sender is the request's node.
    """
    from flwr.proto.fleet_pb2 import PushMessagesRequest  # pylint: disable=no-name-in-module
    from google.protobuf.message import DecodeError

    request = PushMessagesRequest()
    try:
        request.ParseFromString(body)
    except DecodeError:
        return None, None  # Flower refuses it itself
    node_id = int(request.node.node_id)
    for message in request.messages_list:
        if int(message.metadata.src_node_id) != node_id:
            return None, (f"node {node_id} pushed a reply in the name of node {message.metadata.src_node_id}; "
                          "a node answers only its own instructions")
    run_ids = {int(message.metadata.run_id) for message in request.messages_list}
    return (run_ids.pop() if len(run_ids) == 1 else None), None


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
    """Put :class:`OperatorOnlyBeyondFleet`, :class:`SignedBeforeRead` and :class:`BoundedReplies` first in Flower's middleware.

    ``flwr.superlink.extensions.get_middleware`` is the hook Flower's SuperLink asks for extra
    middleware when it builds its app (``flwr.superlink.main``); the launcher wraps it, so Flower's
    own middleware (node authentication included) still runs, after the guards. Installing again
    only sets the bound anew.
    """
    from flwr.superlink import extensions
    from starlette.middleware import Middleware

    flower_middleware = getattr(extensions.get_middleware, "flower_middleware", extensions.get_middleware)

    def get_middleware():
        return (Middleware(OperatorOnlyBeyondFleet), Middleware(SignedBeforeRead),
                Middleware(BoundedReplies, limit=max_reply_bytes), *flower_middleware())

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


# Flower reads these to open gRPC servers of its Control and Fleet APIs beside the HTTP one: they would
# answer on ports of their own, where neither the operator guard nor the reply bound sits.
UNGUARDED_SERVER_VARIABLES = ("FLWR_INTERNAL_GRPC_CONTROL_API", "FLWR_INTERNAL_GRPC_FLEET_API")


def unguarded_servers(environ: Mapping[str, str]) -> list[str]:
    """The variables of :data:`UNGUARDED_SERVER_VARIABLES` that ``environ`` sets."""
    return [name for name in UNGUARDED_SERVER_VARIABLES if name in environ]


def main(argv: Sequence[str] | None = None) -> None:
    """``fedica-superlink [--max-reply-mib N] [flower-superlink arguments]``."""
    from flwr.superlink.cli.flower_superlink import flower_superlink

    if unguarded_servers(os.environ):
        sys.exit(f"fedica-superlink: {', '.join(unguarded_servers(os.environ))} is set: Flower would open a gRPC "
                 "server outside the operator guard and the reply bound; unset it")

    parser = argparse.ArgumentParser(prog="fedica-superlink", add_help=False)
    parser.add_argument("--max-reply-mib", type=positive_mib, default=DEFAULT_MAX_REPLY_MIB,
                        help=f"the most MiB one site's reply may hold (default {DEFAULT_MAX_REPLY_MIB})")
    ours, flowers = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    install_operator_guard(ours.max_reply_mib * 2**20)
    sys.argv = ["fedica-superlink", *flowers]
    flower_superlink()


if __name__ == "__main__":
    main()
