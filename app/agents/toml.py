"""The TOML reader under ``AGENT_CONFIG``: typed reads of one table, ``${NAME}`` expansion,
and the ``ConfigError`` that names the file and the key of every problem.

``app.agents.config`` (agents, MCP servers) and ``app.agents.capabilities`` (the capability
sections) both read through it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from agent_runtime.errors import ConfigurationError

__all__ = [
    "ENV_REFERENCE",
    "ConfigError",
    "Table",
    "describe",
    "expand",
    "key_path",
]

ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
"""``${NAME}`` or ``${NAME:-default}`` in a string value."""
_POLICIES = ("allow", "ask", "deny")
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


class ConfigError(ConfigurationError):
    """``AGENT_CONFIG`` is wrong. ``file`` and ``key`` (a dotted path) say where."""

    def __init__(self, file: str, key: str, problem: str) -> None:
        super().__init__(f"{file}: {key}: {problem}" if key else f"{file}: {problem}")
        self.file = file
        self.key = key
        self.problem = problem


def key_path(*parts: str | int) -> str:
    """A dotted TOML key path; parts that are not bare keys are quoted, indexes bracketed."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
            continue
        shown = part if _BARE_KEY.match(part) else '"' + part.replace('"', '\\"') + '"'
        text = f"{text}.{shown}" if text else shown
    return text


class Table:
    """Typed reads from one TOML table, with errors naming the file and the key."""

    def __init__(
        self, file: str, where: tuple[str | int, ...], value: Any, known: Sequence[str] | None
    ) -> None:
        self.file = file
        self.where = where
        if not isinstance(value, dict):
            raise self.error(None, f"expected a table, got {describe(value)}")
        self.data: dict[str, Any] = value
        if known is not None:
            for name in self.data:
                if name not in known:
                    raise self.error(name, f"unknown key; expected one of: {', '.join(known)}")

    def error(self, name: str | int | None, problem: str, index: int | None = None) -> ConfigError:
        parts = self.where if name is None else (*self.where, name)
        if index is not None:
            parts = (*parts, index)
        return ConfigError(self.file, key_path(*parts), problem)

    def child(self, name: str, known: Sequence[str] | None) -> Table | None:
        if name not in self.data:
            return None
        return Table(self.file, (*self.where, name), self.data[name], known)

    def string(self, name: str, *, empty: bool = False) -> str | None:
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, str) or (not empty and not value.strip()):
            raise self.error(name, f"expected a non-empty string, got {describe(value)}")
        return value

    def integer(self, name: str) -> int | None:
        value = self.data.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.error(name, f"expected a positive integer, got {describe(value)}")
        return value

    def seconds(self, name: str) -> float | None:
        value = self.data.get(name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
            raise self.error(name, f"expected a positive number of seconds, got {describe(value)}")
        return float(value)

    def boolean(self, name: str) -> bool | None:
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise self.error(name, f"expected true or false, got {describe(value)}")
        return value

    def strings(self, name: str) -> list[str] | None:
        value = self.data.get(name)
        if value is None:
            return None
        if not isinstance(value, list):
            raise self.error(name, f"expected an array of strings, got {describe(value)}")
        for index, item in enumerate(value):
            if not isinstance(item, str) or not item.strip():
                raise self.error(name, f"expected a non-empty string, got {describe(item)}", index)
        return value

    def policy(self, name: str) -> str | None:
        value = self.data.get(name)
        if value is None:
            return None
        if value not in _POLICIES:
            raise self.error(name, f"expected one of {', '.join(_POLICIES)}, got {describe(value)}")
        return str(value)


def describe(value: Any) -> str:
    """A short description of a bad value (its repr for scalars, its type otherwise)."""
    if isinstance(value, bool | int | float) or (isinstance(value, str) and len(value) <= 60):
        return repr(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


def expand(file: str, where: tuple[str | int, ...], value: str) -> str:
    """``${NAME}`` and ``${NAME:-default}`` from the environment."""

    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        found = os.environ.get(name)
        if found is not None:
            return found
        if default is not None:
            return default
        raise ConfigError(file, key_path(*where), f"environment variable {name} is not set")

    return ENV_REFERENCE.sub(replace, value)
