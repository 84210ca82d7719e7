"""The listening address of ``agent-server``: bound before a worker starts, with one clear
error when it cannot be.

uvicorn binds its address only after the app's lifespan started (the store, the bus, the
agents, the warm-up's model calls), and a port already in use then ends the start with a log
line and exit status 3. ``agent-server`` binds first instead (``bind_sockets`` for one worker,
``app.server.supervisor.Listeners`` for several): a ``ListenError`` says which address and why, and
becomes the one line ``agent-server: cannot start: ...`` (exit status 2) of every other start
error.
"""

from __future__ import annotations

import errno
import logging
import socket

import uvicorn

__all__ = ["ListenError", "Server", "address_label", "bind_sockets", "listen_error"]

logger = logging.getLogger("uvicorn.error")


class ListenError(Exception):
    """The address cannot be listened on; the message names it and says what to do."""


def address_label(host: str, port: int) -> str:
    """``127.0.0.1:8000``, ``[::1]:8000``."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen_error(host: str, port: int, exc: OSError) -> ListenError:
    """``exc`` (from binding ``host:port``) as the error ``agent-server`` reports."""
    where = address_label(host, port)
    reason = exc.strerror or str(exc)
    if exc.errno == errno.EADDRINUSE:
        return ListenError(
            f"{where} is already in use (another process listens on it: stop that one, or "
            "choose another --port)"
        )
    if exc.errno == errno.EACCES:
        return ListenError(
            f"cannot listen on {where} ({reason}: ports below 1024 need privileges; choose "
            "another --port)"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return ListenError(
            f"cannot listen on {where} ({reason}: --host must be an address of this machine)"
        )
    return ListenError(f"cannot listen on {where} ({reason})")


def bind_sockets(host: str, port: int) -> list[socket.socket]:
    """A socket bound to each address ``host`` names, as asyncio's ``create_server`` would
    bind them (``SO_REUSEADDR``; an IPv6 one for IPv6 only), not listening yet. Raises
    ``ListenError``; nothing stays bound then."""
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as exc:
        raise listen_error(host, port, exc) from exc
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _name, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                raise listen_error(host, port, exc) from exc
            sock.set_inheritable(True)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


class Server(uvicorn.Server):
    """uvicorn's server for one worker, on sockets bound beforehand (``bind_sockets``),
    logging where it serves once it does (uvicorn logs that only for addresses it bound)."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if sockets and not self.should_exit:
            scheme = "https" if self.config.is_ssl else "http"
            where = address_label(self.config.host, sockets[0].getsockname()[1])
            logger.info("Uvicorn running on %s://%s (Press CTRL+C to quit)", scheme, where)
