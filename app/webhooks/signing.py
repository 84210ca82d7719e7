"""Standard Webhooks signatures (https://www.standardwebhooks.com/).

A secret is ``whsec_`` followed by the base64 of its key bytes. A message is sent with
``webhook-id`` (the same on every attempt), ``webhook-timestamp`` (Unix seconds of the attempt)
and ``webhook-signature``: ``v1,`` and the base64 of HMAC-SHA256 over ``id.timestamp.body``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from urllib.parse import urlsplit

__all__ = ["SECRET_PREFIX", "origin_of", "parse_endpoint_secrets", "parse_secret", "sign"]

SECRET_PREFIX = "whsec_"
_MIN_KEY_BYTES = 24


def parse_secret(text: str) -> bytes:
    """The key of a ``whsec_...`` secret; ValueError (never quoting it) when malformed."""
    if not text.startswith(SECRET_PREFIX):
        raise ValueError("a webhook secret starts with whsec_ (then base64 of 24 to 64 bytes)")
    try:
        key = base64.b64decode(text[len(SECRET_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a webhook secret's part after whsec_ is not base64") from None
    if not _MIN_KEY_BYTES <= len(key) <= 64:
        raise ValueError("a webhook secret's key is 24 to 64 bytes (base64 after whsec_)")
    return key


def origin_of(url: str) -> str:
    """``scheme://host[:port]`` of ``url``, lower-cased, the default port left out."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    port = parts.port
    default = {"http": 80, "https": 443}.get(scheme)
    return f"{scheme}://{host}" if port in (None, default) else f"{scheme}://{host}:{port}"


def parse_endpoint_secrets(text: str) -> dict[str, bytes]:
    """``ORIGIN=whsec_...`` pairs, comma-separated, as origin → key; ValueError names the
    entry, never a secret."""
    secrets: dict[str, bytes] = {}
    for index, item in enumerate(text.split(","), start=1):
        item = item.strip()
        if not item:
            continue
        origin, sep, secret = item.partition("=")
        origin, secret = origin.strip(), secret.strip()
        parts = urlsplit(origin)
        if not sep or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"AGENT_WEBHOOK_SECRETS entry {index} is not of the form "
                "https://host[:port]=whsec_... (entries are separated by commas)"
            )
        try:
            key = parse_secret(secret)
        except ValueError as exc:
            raise ValueError(f"AGENT_WEBHOOK_SECRETS entry {index}: {exc}") from None
        secrets[origin_of(origin)] = key
    return secrets


def sign(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value of one attempt."""
    signed = b"%s.%d.%s" % (message_id.encode("ascii"), timestamp, body)
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")
