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
"""

from __future__ import annotations

import ipaddress
import logging
import sys
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


def install_operator_guard() -> None:
    """Put :class:`OperatorOnlyBeyondFleet` first in Flower's middleware, through its extension hook.

    ``flwr.superlink.extensions.get_middleware`` is the hook Flower's SuperLink asks for extra
    middleware when it builds its app (``flwr.superlink.main``); the launcher wraps it, so Flower's
    own middleware (node authentication included) still runs, after the guard.
    """
    from flwr.superlink import extensions
    from starlette.middleware import Middleware

    flower_middleware = extensions.get_middleware
    if getattr(flower_middleware, "fedica_operator_guard", False):
        return

    def get_middleware():
        return (Middleware(OperatorOnlyBeyondFleet), *flower_middleware())

    get_middleware.fedica_operator_guard = True
    extensions.get_middleware = get_middleware


def main(argv: Sequence[str] | None = None) -> None:
    """``fedica-superlink [flower-superlink arguments]``."""
    from flwr.superlink.cli.flower_superlink import flower_superlink

    install_operator_guard()
    sys.argv = ["fedica-superlink", *(sys.argv[1:] if argv is None else argv)]
    flower_superlink()


if __name__ == "__main__":
    main()
