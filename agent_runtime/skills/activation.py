"""One run's skills: progressive disclosure, activation, allowed-tools, dispatch.

The model first sees each skill's name and description (in the system prompt) and two tools:
``load_skill`` activates a skill (its instructions come back as the call's result) and
``read_skill_resource`` reads one of its files. A run may also start with a skill active: named
by the caller (``skill=``) or chosen by the ``system_one`` binding (``skill_dispatch``); its
instructions then go into the system prompt.

Activation belongs to the run (``SkillState``), never to the agent: a skill activated in one
run does not affect another. While a skill with ``allowed-tools`` is active, the tools
advertised to the model are narrowed to those, and a call to any other tool returns an error
without running and without asking for a confirmation (the advertised set is the execution
set). Activation only narrows: with several skills active, a tool must be allowed by every one
that restricts tools. The two skill tools themselves stay available.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fnmatch
import logging
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from ..errors import ProviderError, SkillNotFoundError, SkillResourceError
from ..events import AgentEvent, AgentEventType
from ..messages import UserMessage
from ..model import ModelEventKind, ModelRequest, ToolSpec, Usage
from ..tools.base import Tool, tool
from .catalogue import Skill, SkillManager

if TYPE_CHECKING:
    from ..bindings import ModelBinding

__all__ = [
    "LOAD_SKILL",
    "READ_SKILL_RESOURCE",
    "SKILL_ACTIVATED",
    "SkillState",
    "choose_skill",
]

logger = logging.getLogger("agent_runtime.skills")

LOAD_SKILL = "load_skill"
READ_SKILL_RESOURCE = "read_skill_resource"
#: The ``custom`` event a run emits when a skill becomes active: payload ``{"skill": name}``.
SKILL_ACTIVATED = "skill_activated"

_DISPATCH_SYSTEM = (
    "You route a request to the one skill that fits it best. Answer with the skill's name "
    "only, exactly as listed, or with none if no skill fits."
)


class _RunTotals(Protocol):
    usage: Usage


class SkillRunContext(Protocol):
    """What a run's skills need of the run (``AgentRunContext`` is one): its ids, its totals and
    its event stream. A protocol, because the run's context itself holds a ``SkillState``."""

    @property
    def run_id(self) -> str: ...

    @property
    def session_id(self) -> str: ...

    @property
    def state(self) -> _RunTotals: ...

    async def emit(self, event: AgentEvent) -> None: ...


class SkillState:
    """The skills of one run: the catalogue it read, what is active, and its skill tools."""

    def __init__(
        self,
        manager: SkillManager,
        *,
        requested: str | None = None,
        dispatch: bool = True,
        system_one: Sequence[ModelBinding] = (),
    ) -> None:
        self.manager = manager
        self.requested = requested
        self.dispatch = dispatch
        self._system_one = list(system_one)
        self.catalogue: Mapping[str, Skill] = {}
        self.active: list[str] = []
        self._in_prompt: list[str] = []
        self._context: SkillRunContext | None = None

    def __repr__(self) -> str:
        return f"<SkillState active={self.active}>"

    async def start(self, context: SkillRunContext, prompt: str) -> None:
        """Read the catalogue (off the loop), then activate the requested or dispatched skill."""
        self._context = context
        self.catalogue = await self.manager.aload()
        if self.requested is not None:
            if self.requested not in self.catalogue:
                raise SkillNotFoundError(
                    self.requested, tuple(self.catalogue), run_id=context.run_id
                )
            await self.activate(self.requested, in_prompt=True)
        elif self.dispatch and self._system_one and self.catalogue:
            chosen = await self._dispatch(context, prompt)
            if chosen is not None:
                await self.activate(chosen, in_prompt=True)

    async def activate(self, name: str, *, in_prompt: bool = False) -> Skill:
        """Make a skill active for the rest of the run and emit ``skill_activated``."""
        skill = self.catalogue.get(name)
        if skill is None:
            raise SkillNotFoundError(name, tuple(self.catalogue))
        if name not in self.active:
            self.active.append(name)
            if in_prompt:
                self._in_prompt.append(name)
            if self._context is not None:
                await self._context.emit(
                    AgentEvent(AgentEventType.CUSTOM, name=SKILL_ACTIVATED, payload={"skill": name})
                )
        return skill

    # what the model sees ------------------------------------------------------------------

    def tools(self) -> dict[str, Tool]:
        """This run's ``load_skill`` and ``read_skill_resource`` (none without skills)."""
        if not self.catalogue:
            return {}
        state = self

        @tool(name=LOAD_SKILL, policy="allow")
        async def load_skill(name: str) -> str:
            """Activate a skill by its name and return its instructions; follow them."""
            skill = await state.activate(name)
            text = f"Skill {skill.name} is active. Its instructions:\n\n{skill.instructions}"
            if skill.resources:
                files = "\n".join(f"- {item}" for item in skill.resources)
                text += f"\n\nIts files (read them with {READ_SKILL_RESOURCE}):\n{files}"
            return text

        @tool(name=READ_SKILL_RESOURCE, policy="allow")
        async def read_skill_resource(skill: str, path: str) -> str:
            """Read one file of a skill, by its path relative to the skill's folder."""
            found = state.catalogue.get(skill)
            if found is None:
                raise SkillNotFoundError(skill, tuple(state.catalogue))
            if skill not in state.active:
                raise SkillResourceError(f"load skill {skill!r} before reading its files")
            return await asyncio.to_thread(found.read_resource, path)

        return {LOAD_SKILL: load_skill, READ_SKILL_RESOURCE: read_skill_resource}

    def system_prompt(self, base: str | None) -> str | None:
        """``base`` followed by the catalogue and the instructions of skills active from the
        start."""
        if not self.catalogue:
            return base
        listing = "\n".join(f"- {s.name}: {s.description}" for s in self.catalogue.values())
        parts = [base] if base else []
        parts.append(
            "You have skills: instructions for particular tasks. When a request fits one, call "
            f"{LOAD_SKILL} with its name and follow what it returns; {READ_SKILL_RESOURCE} "
            f"reads one of the skill's files.\n\nSkills:\n{listing}"
        )
        for name in self._in_prompt:
            parts.append(f"The skill {name} is active. Its instructions:\n\n")
            parts[-1] += self.catalogue[name].instructions
        return "\n\n".join(parts)

    def allows(self, tool_name: str) -> bool:
        """True if every active skill that restricts tools allows ``tool_name``."""
        if tool_name in (LOAD_SKILL, READ_SKILL_RESOURCE):
            return True
        for name in self.active:
            allowed = self.catalogue[name].allowed_tools
            if allowed is not None and not any(
                fnmatch.fnmatchcase(tool_name, pattern) for pattern in allowed
            ):
                return False
        return True

    def refusal(self, tool_name: str) -> str:
        """The error result of a call the active skills do not allow."""
        return (
            f"tool {tool_name!r} is not available while skill(s) {', '.join(self.active)} "
            "are active (allowed-tools)"
        )

    def advertised(self, tools: Mapping[str, Tool]) -> list[ToolSpec]:
        """The specs of the tools the active skills allow."""
        return [t.spec for name, t in tools.items() if self.allows(name)]

    # dispatch -------------------------------------------------------------------------------

    async def _dispatch(self, context: SkillRunContext, prompt: str) -> str | None:
        listing = "\n".join(f"- {s.name}: {s.description}" for s in self.catalogue.values())
        request = ModelRequest(
            messages=[UserMessage(f"Skills:\n{listing}\n\nRequest:\n{prompt}")],
            system=_DISPATCH_SYSTEM,
            run_id=context.run_id,
            session_id=context.session_id,
            model_call_id=f"mcall_{secrets.token_hex(16)}",
        )
        for binding in self._system_one:
            try:
                answer, usage = await _ask(binding, request)
            except ProviderError as exc:
                # dispatch only saves the model a load_skill call: a failure is not the run's
                logger.warning(
                    "system_one failed; the run goes on without a dispatched skill",
                    extra={"run_id": context.run_id, "model": binding.model, "error": str(exc)},
                )
                continue
            if usage is not None:
                context.state.usage.add(usage)
                await context.emit(
                    AgentEvent(
                        AgentEventType.USAGE,
                        model_call_id=request.model_call_id,
                        usage=usage,
                        model=usage.model,
                    )
                )
            return choose_skill(answer, self.catalogue)
        return None


async def _ask(binding: ModelBinding, request: ModelRequest) -> tuple[str, Usage | None]:
    async with binding.lease_provider() as provider:
        stream = provider.stream(request)
        text: list[str] = []
        usage: Usage | None = None
        try:
            async for item in stream:
                if item.kind is ModelEventKind.TEXT:
                    text.append(item.delta)
                elif item.kind is ModelEventKind.COMPLETED and item.response is not None:
                    if item.response.message.content:
                        text = [item.response.message.content]
                    if item.response.usage is not None:
                        found = item.response.usage
                        usage = dataclasses.replace(found, model=found.model or binding.model)
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
    return "".join(text), usage


def choose_skill(answer: str, catalogue: Mapping[str, Skill]) -> str | None:
    """The skill a router's answer names: the whole answer, else the longest name it contains
    as a word; None for ``none`` or an answer naming no skill."""
    cleaned = answer.strip().strip("`'\".").strip().lower()
    if cleaned in catalogue:
        return cleaned
    for name in sorted(catalogue, key=len, reverse=True):
        if re.search(rf"(?<![a-z0-9-]){re.escape(name)}(?![a-z0-9-])", cleaned):
            return name
    return None
