"""The API reference pages, ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc), served offline.

FastAPI's own pages load Swagger UI and ReDoc from a CDN and start them with an inline script:
blank without the Internet, and refused by the strict Content-Security-Policy this service sends
(``app.security``). Here the libraries come from a package (``fastapi-offline``, pinned in
pyproject.toml, which ships their built files) under ``/docs/assets/``, and the pages and their
start-up scripts are this service's own files (``app/docs_ui``) under ``/docs/ui/``.
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
DOCS_PATHS: Final = ("/docs", "/redoc")


def install_docs(app: FastAPI) -> None:
    """Serve ``/docs``, ``/redoc`` and their files (call it with ``docs_url=None``)."""

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> FileResponse:
        return _page("swagger.html")

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> FileResponse:
        return _page("redoc.html")

    app.router.routes.append(
        Mount("/docs/assets", app=StaticFiles(directory=ASSETS_DIR), name="docs-assets")
    )
    app.router.routes.append(
        Mount("/docs/ui", app=StaticFiles(directory=PAGES_DIR), name="docs-ui")
    )


def _page(name: str) -> FileResponse:
    headers = {"Cache-Control": "no-cache"}
    return FileResponse(PAGES_DIR / name, media_type="text/html", headers=headers)
