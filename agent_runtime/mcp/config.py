"""MCP server settings and the names their tools are advertised under."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ConfigurationError

__all__ = ["DEFAULT_TIMEOUT", "MCPServerConfig", "Transport", "mcp_tool_name"]

Transport = Literal["stdio", "streamable_http"]

DEFAULT_TIMEOUT = 30.0
_TRANSPORTS: dict[str, Transport] = {
    "stdio": "stdio",
    "streamable_http": "streamable_http",
    "streamable-http": "streamable_http",
    "http": "streamable_http",
}
_SERVER_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_))*$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_SEPARATOR = "__"


def mcp_tool_name(server: str, tool: str) -> str:
    """The name a server's tool is advertised under: ``{server}__{tool}``.

    Characters outside ``[A-Za-z0-9_-]`` become ``_`` and a name longer than 64 characters is
    shortened with a hash suffix, so the result is valid for the OpenAI and Anthropic APIs.
    """
    name = f"{server}{_SEPARATOR}{_UNSAFE.sub('_', tool)}"
    if len(name) > 64:
        digest = hashlib.sha256(tool.encode()).hexdigest()[:8]
        name = f"{name[:55]}_{digest}"
    return name


@dataclass(frozen=True, slots=True, repr=False)
class MCPServerConfig:
    """One MCP server: how to reach it, how long to wait for it, how many sessions to keep.

    ``transport`` is ``"stdio"`` (``command``, ``args``, ``env``, ``cwd``) or
    ``"streamable_http"`` (``url``, ``headers``). ``timeout`` bounds opening a session plus one
    call's answer, in seconds. ``session_pool_size`` 0 opens a session per call; N keeps up to N
    sessions open, each leased to one call at a time. ``allowed_tools`` limits the server's tools
    offered to the model (by their MCP names); None offers all of them. ``idempotent_tools``
    (MCP names) are safe to call twice: a resumed run runs again a call of theirs that was cut
    off (``Tool.idempotent``); the server's own ``idempotentHint`` is not trusted for that.
    ``env`` and ``headers`` values never appear in ``repr``.
    """

    name: str
    transport: Transport = "stdio"
    command: str | None = None
    args: Sequence[str] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] | None = None
    timeout: float = DEFAULT_TIMEOUT
    session_pool_size: int = 0
    allowed_tools: Sequence[str] | None = None
    idempotent_tools: Sequence[str] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _SERVER_NAME.match(self.name):
            raise ConfigurationError(
                f"MCP server name {self.name!r} must start with a letter or digit and hold only "
                "letters, digits, '-' and single '_' (it prefixes the tool names)"
            )
        if len(self.name) > 32:
            raise ConfigurationError(f"MCP server name {self.name!r} is longer than 32 characters")
        transport = _TRANSPORTS.get(str(self.transport))
        if transport is None:
            raise ConfigurationError(
                f"MCP server {self.name!r}: transport must be 'stdio' or 'streamable_http', "
                f"not {self.transport!r}"
            )
        object.__setattr__(self, "transport", transport)
        object.__setattr__(self, "args", tuple(str(a) for a in self.args))
        if self.env is not None:
            object.__setattr__(self, "env", {str(k): str(v) for k, v in self.env.items()})
        if self.headers is not None:
            object.__setattr__(self, "headers", {str(k): str(v) for k, v in self.headers.items()})
        if self.allowed_tools is not None:
            object.__setattr__(self, "allowed_tools", tuple(self.allowed_tools))
        object.__setattr__(self, "idempotent_tools", tuple(self.idempotent_tools))
        if self.allowed_tools is not None:
            offered = set(self.allowed_tools)
            stray = [name for name in self.idempotent_tools if name not in offered]
            if stray:
                raise ConfigurationError(
                    f"MCP server {self.name!r}: idempotent_tools {', '.join(stray)} are not "
                    "among its allowed_tools"
                )
        if transport == "stdio":
            if not self.command:
                raise ConfigurationError(f"MCP server {self.name!r}: stdio needs a command")
            if self.url is not None or self.headers is not None:
                raise ConfigurationError(
                    f"MCP server {self.name!r}: url and headers belong to streamable_http, "
                    "not stdio"
                )
        else:
            if not self.url or not self.url.startswith(("http://", "https://")):
                raise ConfigurationError(
                    f"MCP server {self.name!r}: streamable_http needs an http(s) url"
                )
            if self.command is not None or self.args or self.env is not None or self.cwd:
                raise ConfigurationError(
                    f"MCP server {self.name!r}: command, args, env and cwd belong to stdio, "
                    "not streamable_http"
                )
        if isinstance(self.timeout, bool) or not self.timeout > 0:
            raise ConfigurationError(f"MCP server {self.name!r}: timeout must be positive")
        size = self.session_pool_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ConfigurationError(
                f"MCP server {self.name!r}: session_pool_size must be an integer >= 0 "
                "(0 opens a session per call)"
            )

    @classmethod
    def stdio(
        cls,
        name: str,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        **options: Any,
    ) -> MCPServerConfig:
        """A server started as a subprocess and spoken to over its stdin and stdout."""
        return cls(name, "stdio", command=command, args=args, env=env, cwd=cwd, **options)

    @classmethod
    def streamable_http(
        cls, name: str, url: str, *, headers: Mapping[str, str] | None = None, **options: Any
    ) -> MCPServerConfig:
        """A server reached over streamable HTTP at ``url``."""
        return cls(name, "streamable_http", url=url, headers=headers, **options)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MCPServerConfig:
        """Build from a plain mapping (a TOML table); unknown keys raise ConfigurationError.

        ``transport`` may be left out: a ``url`` means streamable_http, else stdio.
        """
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ConfigurationError(
                f"unknown MCP server setting(s) {', '.join(sorted(unknown))}; "
                f"expected some of {', '.join(sorted(known))}"
            )
        values = dict(data)
        if "name" not in values:
            raise ConfigurationError("an MCP server needs a name")
        values.setdefault("transport", "streamable_http" if "url" in values else "stdio")
        return cls(**values)

    def __repr__(self) -> str:
        where = f"command={self.command!r}" if self.transport == "stdio" else f"url={self.url!r}"
        secrets = ""
        if self.env:
            secrets += f" env_keys={sorted(self.env)}"
        if self.headers:
            secrets += f" header_names={sorted(self.headers)}"
        return (
            f"<MCPServerConfig {self.name} {self.transport} {where}{secrets} "
            f"timeout={self.timeout:g} session_pool_size={self.session_pool_size}>"
        )
