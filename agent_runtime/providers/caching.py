"""The ``prompt_caching`` model param, which every wire reads the same way.

Prompt caching is on unless a binding's, an agent's or a run's model params say
``prompt_caching: false``. The param is the runtime's own: a provider pops it from the params
it sends. What it turns on is each wire's own: ``cache_control`` breakpoints on Anthropic's
(``anthropic_cache``), ``prompt_cache_key`` on OpenAI's (the request's ``cache_key``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PROMPT_CACHING", "caching_enabled"]

#: The name of the model param.
PROMPT_CACHING = "prompt_caching"


def caching_enabled(params: dict[str, Any]) -> bool:
    """Pop ``prompt_caching`` from ``params`` (it is never sent); True unless it is false."""
    return bool(params.pop(PROMPT_CACHING, True))
