"""Response headers that keep the UI and the API from being framed, sniffed or scripted.

Every HTTP answer carries ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer``
and a ``Content-Security-Policy``: data (JSON, problem answers, event streams, metrics) the
strictest one, which allows nothing; the pages and their files one of these:

- The UI (``/``): scripts, styles, fetches and images from this origin only; no inline script
  or style, no ``eval``, no plugins, no ``<base>``. Images may be ``data:`` (the favicon) or
  ``blob:`` (stored files, fetched with the API key, which an ``<img>`` cannot send).
- ``/docs`` (``app.http.api.docs``): the same, except that Swagger UI sets inline styles.
- ``frame-ancestors 'none'`` (and ``X-Frame-Options: DENY`` for old browsers) unless
  ``AGENT_FRAME_ANCESTORS`` names the origins allowed to frame the pages: no other site can put
  the approval dialog in a frame and trick a click on *Approve*.

The headers are computed once; each response costs a scan of its own header list.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["SecurityHeadersMiddleware", "content_security_policies"]

_UI: Final = (
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data: blob:",
    "font-src 'self'",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
)
_DOCS: Final = (
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self' 'unsafe-inline'",
    "img-src 'self' data:",
    "font-src 'self' data:",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
)
_NOTHING: Final = ("default-src 'none'", "base-uri 'none'", "form-action 'none'")
_DATA_TYPES: Final = (b"application/", b"text/event-stream", b"text/plain")


def content_security_policies(frame_ancestors: str) -> dict[str, str]:
    """The policies by kind of answer (``ui``, ``docs``, ``other``) for ``frame_ancestors``
    (a CSP source list; empty for ``'none'``)."""
    sources = frame_ancestors or "'none'"
    ancestors = f"frame-ancestors {sources}"
    return {
        kind: "; ".join((*directives, ancestors))
        for kind, directives in (("ui", _UI), ("docs", _DOCS), ("other", _NOTHING))
    }


class SecurityHeadersMiddleware:
    """Adds the headers above to every HTTP answer that does not set them itself."""

    def __init__(
        self, app: ASGIApp, *, frame_ancestors: str = "", docs_paths: Iterable[str] = ()
    ) -> None:
        self.app = app
        self._docs_paths = tuple(docs_paths)
        common = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]
        if not frame_ancestors:
            common.append((b"x-frame-options", b"DENY"))
        policies = content_security_policies(frame_ancestors)
        self._headers = {
            kind: [*common, (b"content-security-policy", policy.encode("latin-1"))]
            for kind, policy in policies.items()
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        docs = scope["path"] in self._docs_paths

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                present = {name.lower() for name, _ in headers}
                kind = "docs" if docs else "ui"
                for name, value in headers:
                    # data (JSON, problems, event streams) gets the policy that allows
                    # nothing; a page, its files, and a 304 (which has no content type but
                    # whose headers the browser applies to the page it revalidated) the UI's
                    if name.lower() == b"content-type" and value.startswith(_DATA_TYPES):
                        kind = "other"
                        break
                headers.extend(h for h in self._headers[kind] if h[0] not in present)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
