"""Skills: a catalogue from docs/examples/skills, loaded per run, with allowed-tools enforced.

Offline: scripted models play the model's part (a real model decides the same things from the
skills' names and descriptions). Shown, in order:

1. the catalogue, read in a worker thread;
2. a run in which the model loads a skill, reads one of its files, and has a tool outside the
   skill's allowed-tools refused (without any approval prompt);
3. ``run_skill``: a skill active from the start;
4. dispatch: a ``system_one`` model picks the skill for a prompt;
5. a ``SkillPipeline``: two skills in sequence, one run id.
"""

import asyncio
from pathlib import Path

from agent_runtime import AgentCore, AgentEventType, ModelBindings, tool
from agent_runtime.skills import SkillManager, SkillPipeline
from agent_runtime.testing import ScriptedModel, tool_call_turn

SKILLS = Path(__file__).resolve().parent / "skills"


@tool
def current_time() -> str:
    """The current date and time (fixed here, so the example's output is stable)."""
    return "2026-12-01T12:00:00Z"


@tool(policy="ask")
def publish(text: str) -> str:
    """Publish text to the website (needs a person's approval)."""
    return "published"


async def main() -> None:
    manager = SkillManager([SKILLS])
    catalogue = await manager.aload()
    print(
        "skills:", ", ".join(f"{s.name} ({len(s.resources)} file(s))" for s in catalogue.values())
    )

    model = ScriptedModel(
        [
            tool_call_turn("load_skill", {"name": "release-notes"}),
            tool_call_turn(
                "read_skill_resource", {"skill": "release-notes", "path": "template.md"}
            ),
            tool_call_turn("publish", {"text": "draft"}),  # not in the skill's allowed-tools
            tool_call_turn("current_time"),
            "## Release 2026-12-01\n\n### Added\n- Skills.",
        ]
    )
    async with AgentCore.open(model, tools=[current_time, publish], skills=manager) as agent:
        async for event in agent.stream("Write release notes for: added skills"):
            if event.type is AgentEventType.CUSTOM and event.name == "skill_activated":
                print("activated:", (event.payload or {})["skill"])
            elif event.type is AgentEventType.TOOL_CALL_COMPLETED:
                outcome = f"error: {event.error}" if event.is_error else "ok"
                print(f"tool {event.name}: {outcome}")
            elif event.type is AgentEventType.RUN_COMPLETED and event.message is not None:
                print("answer:", (event.message.content or "").splitlines()[0])
        advertised = sorted(t.name for t in model.requests[-1].tools)
        print("advertised while active:", ", ".join(advertised))

    model = ScriptedModel(["Bug: the loop never ends when the list is empty."])
    async with AgentCore.open(model, skills=manager) as agent:
        response = await agent.run_skill("code-review", "Review: while items: pass")
        print("run_skill:", response.content)

    router = ScriptedModel(["code-review"])  # the System One model names a skill
    bindings = ModelBindings(llm=ScriptedModel(["Looks fine."]), system_one=router)
    async with AgentCore.open(bindings, skills=manager) as agent:
        events = [e async for e in agent.stream("Please look over my pull request")]
        chosen = [e.payload for e in events if e.name == "skill_activated"]
        print("dispatched:", chosen)

    model = ScriptedModel(["Missing test for the empty list.", "## Release\n- Fixed empty lists."])
    async with AgentCore.open(model, tools=[current_time], skills=manager) as agent:
        pipeline = SkillPipeline(agent, ["code-review", "release-notes"])
        result = await pipeline.run("Change: handle empty lists")
        print(f"pipeline {result.run_id[:4]}...: {[s.skill for s in result.steps]}")
        print("pipeline output:", result.output.splitlines()[-1])


if __name__ == "__main__":
    asyncio.run(main())
