"""``GET /v1/files/limits``: what a file and a run's input may be, as the browser UI reads them
to refuse a file before uploading it."""

from __future__ import annotations

from app.files import ACCEPTED_MEDIA_TYPES
from app.files.intake import DEFAULT_MAX_PARTS
from tests.support.served import Serve


async def test_the_limits_are_the_settings(serve: Serve) -> None:
    async with serve(max_file_bytes=12_345) as served:
        answer = await served.client.get("/v1/files/limits")
        assert answer.status_code == 200, answer.text
        assert answer.json() == {
            "max_bytes": 12_345,
            "media_types": sorted(ACCEPTED_MEDIA_TYPES),
            "max_input_bytes": 12_345,
            "max_input_parts": DEFAULT_MAX_PARTS,
        }


async def test_the_limits_need_a_key_when_keys_are_on(serve: Serve) -> None:
    async with serve(api_keys="secret-key=alice") as served:
        refused = await served.client.get("/v1/files/limits")
        assert refused.status_code == 401
        assert refused.headers["content-type"].startswith("application/problem+json")
        allowed = await served.client.get(
            "/v1/files/limits", headers={"Authorization": "Bearer secret-key"}
        )
        assert allowed.status_code == 200
