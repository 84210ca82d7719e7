"""The DNS-rebinding guard's reading of ``Host`` and ``Origin`` (``app.http.hosts``)."""

from __future__ import annotations

import pytest

from app.http.hosts import LOOPBACK_NAMES, AllowedHosts, host_name
from app.settings import Settings


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("localhost", "localhost"),
        ("LocalHost:8000", "localhost"),
        ("[::1]:8000", "::1"),
        ("[::1]", "::1"),
        ("example.com.", "example.com"),
        ("a:b", None),
        ("[::1]x", None),
        ("", None),
        (":80", None),
    ],
)
def test_host_name(value: str, name: str | None) -> None:
    assert host_name(value) == name


def test_the_default_is_the_loopback_names() -> None:
    allowed = AllowedHosts.parse(Settings().allowed_host_list)
    assert allowed.names == frozenset(LOOPBACK_NAMES)
    assert allowed.allows_host("127.0.0.1:8000") and allowed.allows_host("[::1]:1")
    assert not allowed.allows_host("evil.example.com")
    assert not allowed.allows_host("127.0.0.1.evil.example.com")
    assert allowed.allows_origin("http://localhost:5173")
    assert not allowed.allows_origin("http://evil.example.com")
    assert not allowed.allows_origin("null")
    assert not allowed.allows_origin("file://")
    assert not allowed.allows_origin("http://[bad")


def test_subdomains_cors_origins_and_any() -> None:
    allowed = AllowedHosts.parse(["*.example.com", "[::2]"], ["https://app.partner.test/"])
    assert allowed.allows_host("a.example.com") and allowed.allows_host("a.b.example.com:1")
    assert not allowed.allows_host("example.com") and not allowed.allows_host("xexample.com")
    assert allowed.allows_host("[::2]:80")
    # a CORS origin is a page allowed to call: the guard lets its Origin through
    assert allowed.allows_origin("https://app.partner.test")
    assert not allowed.allows_origin("https://other.partner.test")
    anything = AllowedHosts.parse(["*"])
    assert anything.allows_host("x") and anything.allows_origin("null")
    assert AllowedHosts.parse([], ["*"]).any
