"""Which webhook URLs may be called: checked after DNS resolution, connected to as checked.

A URL's host is resolved (off the event loop), and every address it resolves to must be a
public one: loopback, private, link-local, unique-local, shared (CGNAT), multicast,
unspecified, reserved and documentation ranges are refused, IPv4 and IPv6 alike. An IPv6
address that carries an IPv4 one is judged by the IPv4 address it reaches: IPv4-mapped
(``::ffff:0:0/96``), NAT64 (``64:ff9b::/96``) and 6to4 (``2002::/16``) by their embedded IPv4
form. The transition forms whose destination is not that IPv4 address alone are refused
outright: IPv4-compatible (``::/96``, deprecated), local-use NAT64 (``64:ff9b:1::/48``, its
embedding is the site's choice) and Teredo (``2001::/32``, reached through relays). A name with
any refused address is refused (a resolver answering one public and one private address must
not get a chance).

The request then goes to the address that was checked (``Target.address``), with the URL's
host as ``Host`` and as the TLS server name: no second resolution between the check and the
connection. Redirects are not followed (``app.webhooks.delivery``), so no other address is
ever reached.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit, urlunsplit

__all__ = [
    "MAX_URL_LENGTH",
    "Resolver",
    "Target",
    "TargetRefused",
    "TargetUnresolved",
    "WebhookTargets",
    "check_url",
    "refusal",
    "system_resolver",
]

MAX_URL_LENGTH = 2048

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""``(host, port)`` → the addresses the host resolves to (text form)."""

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_SHARED = ipaddress.ip_network("100.64.0.0/10")  # CGNAT: not is_private, still not public

# IPv6 forms that carry an IPv4 address (RFC 4291, 6052, 8215, 3056, 4380). The embedded address
# is where the packet ends up (through a translator or relay), so it decides; ``ipaddress``
# alone judges these by their IPv6 range, and 6to4 of 127.0.0.1 counts as global there.
_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_TEREDO = ipaddress.ip_network("2001::/32")


class TargetRefused(ValueError):
    """The URL may not be called: malformed, or its host resolves to a refused address."""


class TargetUnresolved(Exception):
    """The URL's host did not resolve now (DNS failure): worth another attempt later."""


@dataclass(frozen=True, slots=True)
class Target:
    """A URL as it will be called: the checked address to connect to."""

    url: str
    address: str
    host: str
    """The URL's host, for ``Host`` and the TLS server name."""
    host_header: str

    @property
    def request_url(self) -> str:
        """The URL with its host replaced by the checked address."""
        parts = urlsplit(self.url)
        address = f"[{self.address}]" if ":" in self.address else self.address
        netloc = address if parts.port is None else f"{address}:{parts.port}"
        return urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))


async def system_resolver(host: str, port: int) -> list[str]:
    """The system's resolver (``getaddrinfo``, on the loop's executor)."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except (socket.gaierror, UnicodeError) as exc:
        raise TargetUnresolved(f"{host!r} does not resolve: {exc}") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def refusal(address: Address) -> str | None:
    """Why ``address`` is not a public one (a category name), or None."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = _embedded_refusal(address)
        if embedded is not None:
            return embedded or None
    for name, hit in (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("reserved", address.is_reserved),
        ("private", address.is_private),
    ):
        if hit:
            return name
    if isinstance(address, ipaddress.IPv4Address) and address in _SHARED:
        return "shared (CGNAT)"
    if isinstance(address, ipaddress.IPv6Address) and address.is_site_local:
        return "site-local"
    if not address.is_global:
        return "not public"
    return None


def _embedded_refusal(address: ipaddress.IPv6Address) -> str | None:
    """The verdict on an IPv6 transition address ("" public, else why); None if it is not one."""
    mapped = address.ipv4_mapped
    if mapped is not None:
        return refusal(mapped) or ""
    if address in _TEREDO:
        return "Teredo"
    if address in _NAT64_LOCAL:
        return "local-use NAT64"
    if address in _NAT64:
        form, ipv4 = "NAT64", ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    elif address.sixtofour is not None:
        form, ipv4 = "6to4", address.sixtofour
    elif address in _COMPATIBLE and int(address) > 1:  # :: and ::1 are judged as themselves
        return "IPv4-compatible"
    else:
        return None
    why = refusal(ipv4)
    return "" if why is None else f"{why} (as {form} of {ipv4})"


def check_url(url: str) -> SplitResult:
    """``url``'s parts if it is an absolute http(s) URL a webhook may have; else
    ``TargetRefused`` saying why."""
    if len(url) > MAX_URL_LENGTH:
        raise TargetRefused(f"a webhook URL is at most {MAX_URL_LENGTH} characters")
    if not url.isascii() or any(c.isspace() or not c.isprintable() for c in url):
        raise TargetRefused("a webhook URL is printable ASCII without spaces (IDNA-encode it)")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise TargetRefused(f"not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise TargetRefused("a webhook URL starts with https:// or http://")
    if not parts.hostname:
        raise TargetRefused("a webhook URL names a host")
    if parts.username is not None or parts.password is not None:
        raise TargetRefused("a webhook URL carries no credentials (the signature authenticates)")
    if parts.fragment:
        raise TargetRefused("a webhook URL has no #fragment")
    if port == 0:
        raise TargetRefused("a webhook URL's port is 1 to 65535")
    return parts


class WebhookTargets:
    """Resolves and checks webhook URLs (``allow_private``: every address is allowed)."""

    def __init__(self, *, allow_private: bool = False, resolver: Resolver | None = None) -> None:
        self.allow_private = allow_private
        self._resolve = resolver or system_resolver

    async def resolve(self, url: str) -> Target:
        """The target to call for ``url``; ``TargetRefused`` or ``TargetUnresolved``."""
        parts = check_url(url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            literal: Address | None = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:
            addresses = [str(literal)]
        else:
            addresses = await self._resolve(host, port)
            if not addresses:
                raise TargetUnresolved(f"{host!r} resolves to no address")
        checked: list[str] = []
        for text in addresses:
            try:
                address = ipaddress.ip_address(text.split("%", 1)[0])
            except ValueError:
                raise TargetRefused(f"{host!r} resolves to {text!r}, not an address") from None
            why = None if self.allow_private else refusal(address)
            if why is not None:
                shown = host if literal is not None else f"{host!r} (resolves to {address})"
                raise TargetRefused(
                    f"{shown} is a {why} address; webhooks go to public addresses only "
                    "(AGENT_WEBHOOK_ALLOW_PRIVATE=1 allows others)"
                )
            checked.append(str(address))
        netloc_host = f"[{host}]" if ":" in host else host
        host_header = netloc_host if parts.port is None else f"{netloc_host}:{parts.port}"
        return Target(url=url, address=checked[0], host=host, host_header=host_header)
