"""The API reference page, ``/docs`` (Swagger UI), served offline.

FastAPI's own page loads Swagger UI from a CDN and starts it with an inline script: blank
without the Internet, and refused by the strict Content-Security-Policy this service sends
(``app.http.security``). Here the library comes from a package (``fastapi-offline``, pinned in
pyproject.toml, which ships its built files) under ``/docs/assets/``, and the page and its
start-up script are this service's own files (``app/http/docs_ui``) under ``/docs/ui/``.

ReDoc is not offered: its standalone build loads its logo from its vendor's CDN, which the
policy refuses (and reports as a violation in every browser console).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Final

from fastapi import FastAPI
from starlette.responses import FileResponse
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

__all__ = ["ASSETS_DIR", "DOCS_PATHS", "PAGES_DIR", "install_docs"]

PAGES_DIR: Final = Path(__file__).resolve().parent.parent / "docs_ui"
ASSETS_DIR: Final = Path(str(files("fastapi_offline") / "static"))
DOCS_PATHS: Final = ("/docs",)


def install_docs(app: FastAPI) -> None:
    """Serve ``/docs`` and its files (call it with ``docs_url=None``)."""

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> FileResponse:
        return _page("swagger.html")

    app.router.routes.append(
        Mount("/docs/assets", app=StaticFiles(directory=ASSETS_DIR), name="docs-assets")
    )
    app.router.routes.append(
        Mount("/docs/ui", app=StaticFiles(directory=PAGES_DIR), name="docs-ui")
    )


def _page(name: str) -> FileResponse:
    headers = {"Cache-Control": "no-cache"}
    return FileResponse(PAGES_DIR / name, media_type="text/html", headers=headers)
