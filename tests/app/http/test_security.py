"""Security headers on the UI, the API and the docs; the docs served without a CDN."""

from __future__ import annotations

import pytest

from app.http.security import content_security_policies
from app.settings import Settings
from tests.support.served import Serve


def directives(policy: str) -> dict[str, str]:
    parts = (part.strip().partition(" ") for part in policy.split(";"))
    return {name: value for name, _, value in parts}


async def test_every_answer_carries_the_headers(serve: Serve) -> None:
    async with serve() as served:
        client = served.client
        answers = {
            "ui": await client.get("/"),
            "script": await client.get("/app.js"),
            "json": await client.get("/v1/sessions"),
            "problem": await client.get("/v1/runs/run_nope"),
            "health": await client.get("/healthz"),
            "docs": await client.get("/docs"),
        }
        for name, answer in answers.items():
            assert answer.headers["x-content-type-options"] == "nosniff", name
            assert answer.headers["referrer-policy"] == "no-referrer", name
            assert answer.headers["x-frame-options"] == "DENY", name
            policy = directives(answer.headers["content-security-policy"])
            assert policy["frame-ancestors"] == "'none'", name
        ui = directives(answers["ui"].headers["content-security-policy"])
        # no inline script, no eval, nothing from elsewhere
        assert ui["script-src"] == "'self'"
        assert ui["style-src"] == "'self'"
        assert ui["default-src"] == "'self'" and ui["object-src"] == "'none'"
        assert ui["base-uri"] == "'none'"
        # stored files are fetched with the API key and shown through object URLs
        assert ui["img-src"] == "'self' data: blob:"
        api = directives(answers["json"].headers["content-security-policy"])
        assert api["default-src"] == "'none'"
        docs = directives(answers["docs"].headers["content-security-policy"])
        assert docs["script-src"] == "'self'"


async def test_frame_ancestors_from_the_setting(serve: Serve) -> None:
    async with serve(frame_ancestors="https://portal.example, 'self'") as served:
        answer = await served.client.get("/")
        policy = directives(answer.headers["content-security-policy"])
        assert policy["frame-ancestors"] == "https://portal.example 'self'"
        assert "x-frame-options" not in answer.headers


@pytest.mark.parametrize("value", ["https://a.example; script-src *", "https://ä.example"])
def test_frame_ancestors_must_be_a_source_list(value: str) -> None:
    with pytest.raises(ValueError, match="AGENT_FRAME_ANCESTORS"):
        Settings(frame_ancestors=value)


def test_policies_differ_by_kind() -> None:
    policies = content_security_policies("")
    assert set(policies) == {"ui", "docs", "other"}
    assert all(p.endswith("frame-ancestors 'none'") for p in policies.values())


async def test_docs_come_from_this_server(serve: Serve) -> None:
    async with serve() as served:
        client = served.client
        for page, scripts in (
            ("/docs", ("docs/assets/swagger-ui-bundle.js", "docs/ui/swagger-init.js")),
        ):
            html = await client.get(page)
            assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
            assert "http" not in html.text.lower().replace("http-equiv", "")  # nothing remote
            assert "<script>" not in html.text  # no inline script
            for script in scripts:
                assert f'src="{script}"' in html.text
                asset = await client.get(f"/{script}")
                assert asset.status_code == 200, script
                assert "javascript" in asset.headers["content-type"]
        css = await client.get("/docs/assets/swagger-ui.css")
        assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
        assert (await client.get("/openapi.json")).status_code == 200
