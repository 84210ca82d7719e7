"""Tools of your own for configured agents, and a check of ``agents.toml``.

An agent in ``AGENT_CONFIG`` names such a tool by its import path::

    tools = ["docs.examples.custom_tools:word_count", "docs.examples.custom_tools:shout"]

``word_count`` is a ``@tool``; ``shout`` is a plain function, which the server wraps with
``@tool`` itself. The module must be importable by the server (install your package, or set
``PYTHONPATH``).

Run this file to validate ``agents.toml`` next to it, as ``agent-server`` does at start-up::

    uv run python docs/examples/custom_tools.py
"""

from __future__ import annotations

import os
from pathlib import Path

from agent_runtime.tools.base import tool


@tool
def word_count(text: str) -> int:
    """Count the words of a text."""
    return len(text.split())


def shout(text: str) -> str:
    """Repeat a text in capital letters."""
    return text.upper()


def main() -> None:
    from app.agents.build import load_config

    # the file takes the search server's token from the environment; a placeholder will do
    # for a check that starts nothing
    os.environ.setdefault("SEARCH_MCP_TOKEN", "placeholder")
    path = Path(__file__).with_name("agents.toml")
    config = load_config(str(path))  # raises ConfigError naming the file and the key
    for name, agent in config.agents.items():
        tools = [t.name for t in agent.tools]
        servers = ", ".join(agent.mcp_servers) or "none"
        print(f"{name}: model {agent.model}, tools {tools}, MCP servers: {servers}")


if __name__ == "__main__":
    main()
