"""Model providers, one module per wire protocol.

``OpenAIModel`` (Chat Completions, any compatible endpoint), ``OpenAIResponsesModel`` (the
Responses API) and ``AnthropicModel`` (Messages) import their SDKs on first access, so
``import agent_runtime`` stays light; ``DemoModel`` is the offline model of the service's
default configuration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .demo import DemoModel, demo_tools

if TYPE_CHECKING:
    from .anthropic import AnthropicModel
    from .openai import OpenAIModel
    from .openai_responses import OpenAIResponsesModel

__all__ = ["AnthropicModel", "DemoModel", "OpenAIModel", "OpenAIResponsesModel", "demo_tools"]


def __getattr__(name: str) -> Any:
    if name == "OpenAIModel":
        from .openai import OpenAIModel

        return OpenAIModel
    if name == "OpenAIResponsesModel":
        from .openai_responses import OpenAIResponsesModel

        return OpenAIResponsesModel
    if name == "AnthropicModel":
        from .anthropic import AnthropicModel

        return AnthropicModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
