"""Tools: the ``@tool`` decorator, the Tool object it builds, and the current call's id.

``@tool`` reads a function's signature and docstring: the JSON schema of its arguments comes
from the type annotations (through pydantic), the description from the docstring. Arguments a
model sends are validated against the same model before the function runs.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, overload

import pydantic

from ..errors import ConfigurationError
from ..model import ToolSpec

__all__ = ["Tool", "ToolPolicy", "current_tool_call_id", "run_state", "tool"]

_current_tool_call_id: ContextVar[str | None] = ContextVar("current_tool_call_id", default=None)


class RunStateOwner(Protocol):
    """What a tool call's ``run_state()`` comes from: its run (``AgentRunContext``)."""

    def tool_state(self) -> dict[str, Any]:
        """The run's own dict for its tools (made on first use)."""
        ...


# set by the runtime around each tool call (not for the run's whole task: a context variable
# set there would cost every run, waiting ones included, a copy of the context's mapping)
_run_state: ContextVar[RunStateOwner | None] = ContextVar("run_state", default=None)


def current_tool_call_id() -> str | None:
    """The id of the tool call being executed, inside a tool (sync or async); else None."""
    return _current_tool_call_id.get()


def run_state() -> dict[str, Any]:
    """The current run's own store for tools (the built-in Todo list keeps its items here).

    One dict per ``chat()``/``stream()`` call, gone when the run ends; another run, even a
    concurrent one, never sees it. Outside a run it raises RuntimeError.
    """
    owner = _run_state.get()
    if owner is None:
        raise RuntimeError("run_state() is only available inside a tool called by a run")
    return owner.tool_state()


class ToolPolicy(enum.StrEnum):
    """Whether a tool may run: always, after approval, or never."""

    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


class ToolArgumentsError(ValueError):
    """A model's arguments did not match the tool's schema."""


@dataclass(eq=False, slots=True)
class Tool:
    """A callable the model may use. Build it with ``@tool``."""

    name: str
    description: str
    function: Callable[..., Any]
    parameters: dict[str, Any]
    is_async: bool
    policy: ToolPolicy | None = None
    timeout: float | None = None
    idempotent: bool = False
    """Safe to run again with the same arguments: a resumed run re-runs such a call that had
    started, instead of reporting its outcome as unknown (``agent_runtime.checkpoints``)."""
    editable: bool = False
    """A person approving a call of this tool may change its arguments: the call then runs
    with theirs, checked against ``parameters`` (``agent_runtime.extensions.edits``)."""
    _validator: type[pydantic.BaseModel] | None = field(default=None, repr=False)
    _spec: ToolSpec | None = field(default=None, init=False, repr=False)

    @property
    def spec(self) -> ToolSpec:
        """The tool as advertised to a model (built once, not for each of its runs; again if
        its name, description or parameters were replaced)."""
        spec = self._spec
        if (
            spec is None
            or spec.name is not self.name
            or spec.description is not self.description
            or spec.parameters is not self.parameters
        ):
            spec = self._spec = ToolSpec(self.name, self.description, self.parameters)
        return spec

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Check and coerce a model's arguments; raises ToolArgumentsError with the reason."""
        if self._validator is None:
            return arguments
        try:
            model = self._validator.model_validate(arguments)
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(arguments)'}: {err['msg']}"
                for err in exc.errors()
            )
            raise ToolArgumentsError(f"invalid arguments for {self.name}: {problems}") from None
        return {name: getattr(model, name) for name in type(model).model_fields}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)


def _build(
    function: Callable[..., Any],
    name: str | None,
    description: str | None,
    policy: ToolPolicy | str | None,
    timeout: float | None,
    idempotent: bool = False,
    editable: bool = False,
) -> Tool:
    if not callable(function):
        raise ConfigurationError("@tool needs a function")
    tool_name = name or function.__name__
    if not tool_name.replace("_", "a").replace("-", "a").replace(".", "a").isalnum():
        raise ConfigurationError(
            f"tool name {tool_name!r} may hold only letters, digits, '_', '-' and '.'"
        )
    doc = description if description is not None else inspect.getdoc(function) or ""
    signature = inspect.signature(function)
    try:
        hints = inspect.get_annotations(function, eval_str=True)
    except Exception as exc:  # a forward reference the module cannot resolve
        raise ConfigurationError(f"cannot read the annotations of tool {tool_name}: {exc}") from exc
    fields: dict[str, Any] = {}
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(f"tool {tool_name} cannot take *args or **kwargs")
        annotation = hints.get(param.name, Any)
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    validator = pydantic.create_model(
        f"{tool_name}_arguments",
        __config__=pydantic.ConfigDict(extra="forbid"),
        **fields,
    )
    schema = validator.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    schema.setdefault("properties", {})
    return Tool(
        name=tool_name,
        description=doc,
        function=function,
        parameters=schema,
        is_async=inspect.iscoroutinefunction(function),
        policy=ToolPolicy(policy) if policy is not None else None,
        timeout=timeout,
        idempotent=idempotent,
        editable=editable,
        _validator=validator,
    )


@overload
def tool(function: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    policy: ToolPolicy | str | None = None,
    timeout: float | None = None,
    idempotent: bool = False,
    editable: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    function: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    policy: ToolPolicy | str | None = None,
    timeout: float | None = None,
    idempotent: bool = False,
    editable: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a function into a Tool; use bare (``@tool``) or with options (``@tool(policy="ask")``).

    Sync functions run in a worker thread, async ones on the agent's loop. ``policy`` overrides
    the agent's policy table for this tool; ``timeout`` overrides the agent's ``tool_timeout``;
    ``idempotent=True`` says a second run with the same arguments does no harm (a resumed run
    may then run a call again whose outcome was not recorded); ``editable=True`` lets the person
    who approves a call (policy ``ask``) change its arguments first.
    """
    if function is not None:
        return _build(function, name, description, policy, timeout, idempotent, editable)

    def decorate(fn: Callable[..., Any]) -> Tool:
        return _build(fn, name, description, policy, timeout, idempotent, editable)

    return decorate
