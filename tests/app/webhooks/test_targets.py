"""Which webhook targets are refused: every non-public range, after DNS resolution."""

from __future__ import annotations

import ipaddress

import pytest

from app.webhooks.targets import (
    TargetRefused,
    TargetUnresolved,
    WebhookTargets,
    check_url,
    refusal,
)

REFUSED = {
    "127.0.0.1": "loopback",
    "127.8.9.10": "loopback",
    "::1": "loopback",
    "10.1.2.3": "private",
    "172.16.0.1": "private",
    "192.168.1.1": "private",
    "169.254.169.254": "link-local",  # the cloud metadata address
    "fe80::1": "link-local",
    "fc00::1": "private",  # unique-local
    "fd12:3456::1": "private",
    "224.0.0.1": "multicast",
    "ff02::1": "multicast",
    "0.0.0.0": "unspecified",
    "::": "unspecified",
    "::ffff:127.0.0.1": "loopback",  # IPv4-mapped
    "::ffff:10.0.0.1": "private",
    "::ffff:169.254.169.254": "link-local",
    "100.64.0.1": "shared (CGNAT)",
    "240.0.0.1": "reserved",
    # IPv6 forms that carry an IPv4 address, judged by where they lead
    "2002:7f00:1::": "loopback (as 6to4 of 127.0.0.1)",
    "2002:a9fe:a9fe::": "link-local (as 6to4 of 169.254.169.254)",
    "2002:a00:1::1": "private (as 6to4 of 10.0.0.1)",
    "64:ff9b::7f00:1": "loopback (as NAT64 of 127.0.0.1)",
    "64:ff9b::a9fe:a9fe": "link-local (as NAT64 of 169.254.169.254)",
    "64:ff9b:1::7f00:1": "local-use NAT64",  # refused outright: the embedding is site-defined
    "64:ff9b:1:808:8:800::": "local-use NAT64",
    "::127.0.0.1": "IPv4-compatible",  # deprecated: refused outright
    "::8.8.8.8": "IPv4-compatible",
    # Teredo (refused outright): server 65.54.227.120, client 127.0.0.1 XOR'd into the last bits
    "2001:0:4136:e378:8000:63bf:80ff:fffe": "Teredo",
    "2001:0:808:808::f7f7:f7f7": "Teredo",
}


@pytest.mark.parametrize(("address", "why"), sorted(REFUSED.items()))
def test_non_public_ranges_are_refused(address: str, why: str) -> None:
    assert refusal(ipaddress.ip_address(address)) == why


@pytest.mark.parametrize(
    "address",
    [
        "93.184.215.14",
        "8.8.8.8",
        "2606:4700:4700::1111",
        "::ffff:8.8.8.8",
        "2002:808:808::1",  # 6to4 of a public address
        "64:ff9b::808:808",  # what DNS64 answers for a public IPv4-only host
    ],
)
def test_public_addresses_are_allowed(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://example.com/x", "https:// or http://"),
        ("https:///path", "names a host"),
        ("https://user:pw@example.com/x", "no credentials"),
        ("https://example.com/x#frag", "no #fragment"),
        ("https://exa mple.com/", "printable ASCII"),
        ("https://example.com:99999/", "not a URL"),
        ("https://" + "a" * 2100 + ".com/", "at most 2048"),
    ],
)
def test_malformed_urls_are_refused(url: str, problem: str) -> None:
    with pytest.raises(TargetRefused, match=problem):
        check_url(url)


async def test_localhost_is_refused_after_resolution() -> None:
    # resolved by the system resolver (no network: the hosts file answers)
    with pytest.raises(TargetRefused, match=r"'localhost' \(resolves to .*\) is a loopback"):
        await WebhookTargets().resolve("http://localhost:8080/hooks")


async def test_a_literal_address_is_checked() -> None:
    with pytest.raises(TargetRefused, match=r"\[::ffff:127.0.0.1\]|::ffff:127.0.0.1"):
        await WebhookTargets().resolve("http://[::ffff:127.0.0.1]/hooks")
    with pytest.raises(TargetRefused, match="link-local"):
        await WebhookTargets().resolve("http://169.254.169.254/latest/meta-data")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://[2002:7f00:1::]/", "loopback"),
        ("https://[2002:a9fe:a9fe::]/", "link-local"),
        ("https://[64:ff9b::7f00:1]/", "loopback"),
        ("https://[::169.254.169.254]/", "IPv4-compatible"),
    ],
)
async def test_a_literal_carrying_an_ipv4_address_is_checked(url: str, why: str) -> None:
    with pytest.raises(TargetRefused, match=why):
        await WebhookTargets().resolve(url)


async def test_a_name_resolving_to_6to4_of_loopback_is_refused() -> None:
    async def resolver(host: str, port: int) -> list[str]:
        return ["2002:7f00:1::"]

    with pytest.raises(TargetRefused, match=r"as 6to4 of 127\.0\.0\.1"):
        await WebhookTargets(resolver=resolver).resolve("https://hooks.example.com/x")


async def test_one_refused_address_among_public_ones_refuses_the_name() -> None:
    async def resolver(host: str, port: int) -> list[str]:
        return ["93.184.215.14", "127.0.0.1"]

    with pytest.raises(TargetRefused, match="loopback"):
        await WebhookTargets(resolver=resolver).resolve("https://hooks.example.com/x")


async def test_the_checked_address_is_the_one_connected_to() -> None:
    async def resolver(host: str, port: int) -> list[str]:
        assert (host, port) == ("hooks.example.com", 8443)
        return ["2606:4700:4700::1111", "93.184.215.14"]

    target = await WebhookTargets(resolver=resolver).resolve(
        "https://hooks.example.com:8443/in?x=1"
    )
    assert target.address == "2606:4700:4700::1111"
    assert target.request_url == "https://[2606:4700:4700::1111]:8443/in?x=1"
    assert target.host_header == "hooks.example.com:8443"
    assert target.host == "hooks.example.com"


async def test_allowance_lets_loopback_through() -> None:
    target = await WebhookTargets(allow_private=True).resolve("http://localhost:9/hooks")
    assert ipaddress.ip_address(target.address).is_loopback
    assert target.host_header == "localhost:9"


async def test_a_name_that_does_not_resolve() -> None:
    async def resolver(host: str, port: int) -> list[str]:
        raise TargetUnresolved(f"{host!r} does not resolve")

    with pytest.raises(TargetUnresolved):
        await WebhookTargets(resolver=resolver).resolve("https://nowhere.invalid/")
