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
}


@pytest.mark.parametrize(("address", "why"), sorted(REFUSED.items()))
def test_non_public_ranges_are_refused(address: str, why: str) -> None:
    assert refusal(ipaddress.ip_address(address)) == why


@pytest.mark.parametrize("address", ["93.184.215.14", "8.8.8.8", "2606:4700:4700::1111"])
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
