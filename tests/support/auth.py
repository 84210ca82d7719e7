"""The API keys of the test principals, ``alice`` and ``bob``, and their headers."""

from __future__ import annotations

import secrets

KEYS = {"alice": f"key-alice-{secrets.token_hex(8)}", "bob": f"key-bob-{secrets.token_hex(8)}"}
API_KEYS = ",".join(f"{key}={principal}" for principal, key in KEYS.items())


def auth(principal: str) -> dict[str, str]:
    """The ``Authorization`` header of ``principal`` (a key of ``KEYS``)."""
    return {"Authorization": f"Bearer {KEYS[principal]}"}
