"""Verify a webhook from agent-server in your receiver (standard library only).

agent-server signs each delivery as Standard Webhooks do: the headers ``webhook-id``,
``webhook-timestamp`` and ``webhook-signature`` (``v1,`` and base64 of HMAC-SHA256 over
``id.timestamp.body``, keyed with the base64 after ``whsec_``). Check the raw body before
parsing it, refuse old timestamps, and act on each ``webhook-id`` once.

    python docs/examples/verify_webhook.py
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Mapping
from typing import Any

TOLERANCE_SECONDS = 300


class InvalidWebhook(Exception):
    """The request is not a genuine, fresh delivery."""


def verify(secret: str, headers: Mapping[str, str], body: bytes) -> Any:
    """The delivery's JSON if its signature and timestamp check out; else InvalidWebhook."""
    lower = {name.lower(): value for name, value in headers.items()}
    try:
        message_id = lower["webhook-id"]
        timestamp = lower["webhook-timestamp"]
        signatures = lower["webhook-signature"].split()
    except KeyError as missing:
        raise InvalidWebhook(f"missing header {missing}") from None
    if abs(time.time() - int(timestamp)) > TOLERANCE_SECONDS:
        raise InvalidWebhook("timestamp too old or too new (a replay?)")
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{message_id}.{timestamp}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    for entry in signatures:  # "v1,<base64>", space-separated when keys rotate
        version, _, signature = entry.partition(",")
        if version == "v1" and hmac.compare_digest(signature, expected):
            return json.loads(body)
    raise InvalidWebhook("no matching signature")


seen: set[str] = set()


def handle(secret: str, headers: Mapping[str, str], body: bytes) -> str:
    """What a receiver does: verify, drop a repeat of a webhook-id, then act."""
    event = verify(secret, headers, body)
    if headers["webhook-id"] in seen:
        return "duplicate, ignored"  # a retry of a delivery already acted on: answer 2xx
    seen.add(headers["webhook-id"])
    return f"{event['type']} for {event['data']['run_id']}"


def main() -> None:
    # a delivery as agent-server would send it (signed here with the same algorithm)
    secret = "whsec_" + base64.b64encode(b"an example key of 32 bytes......").decode()
    body = json.dumps(
        {
            "type": "run.completed",
            "timestamp": "2026-12-02T07:00:00.000Z",
            "data": {"run_id": "run_0123", "status": "completed", "output": {"content": "hi"}},
        }
    ).encode()
    now = str(int(time.time()))
    key = base64.b64decode(secret.removeprefix("whsec_"))
    digest = hmac.new(key, b"msg_1." + now.encode() + b"." + body, hashlib.sha256).digest()
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": now,
        "webhook-signature": "v1," + base64.b64encode(digest).decode(),
    }
    print("first delivery:", handle(secret, headers, body))
    print("its retry:", handle(secret, headers, body))
    try:
        handle(secret, headers, body.replace(b"hi", b"HI"))
    except InvalidWebhook as exc:
        print("tampered body:", exc)


if __name__ == "__main__":
    main()
