"""The HTTP edge: everything that speaks HTTP, and the only layer that turns domain errors
into answers.

::

    api/           the native routes (/v1, /external-events, health, OpenAPI, problem+json)
    protocols/     the same runs in other protocols: OpenAI, AG-UI, AI SDK, A2A, MCP
    middleware.py  the request body limit and load shedding
    security.py    response headers (CSP, framing, sniffing)
    ui/            the browser UI (static files)
    docs_ui/       the API reference pages (static files)
"""
