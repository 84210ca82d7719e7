"""Skills: the catalogue on disk, per-run activation, allowed-tools, run_skill, pipelines,
dispatch. Models are the runtime's scripted ones; the skills are real folders."""

from __future__ import annotations

import asyncio
import os
import re
import threading
from pathlib import Path
from typing import Any

import pytest

from agent_runtime import (
    AgentCore,
    AgentEvent,
    AgentEventType,
    ModelBindings,
    RunTimeoutError,
    SkillNotFoundError,
    tool,
)
from agent_runtime.errors import ConfigurationError, SkillResourceError
from agent_runtime.messages import AssistantMessage, ToolMessage
from agent_runtime.model import ModelRequest
from agent_runtime.skills import (
    MAX_RESOURCE_BYTES,
    PipelineContext,
    PipelineStep,
    SkillManager,
    SkillPipeline,
    choose_skill,
)
from agent_runtime.testing import FunctionModel, ScriptedModel, tool_call_turn


def write_skill(
    root: Path,
    name: str,
    description: str = "Does a thing.",
    body: str = "Follow these steps.",
    *,
    folder: str | None = None,
    extra: str = "",
) -> Path:
    where = root / (folder or name)
    where.mkdir(parents=True, exist_ok=True)
    (where / "SKILL.md").write_text(
        f"---\nname: {name}\ndescription: {description}\n{extra}---\n{body}\n", encoding="utf-8"
    )
    return where


def activations(events: list[AgentEvent]) -> list[str]:
    return [
        str((e.payload or {})["skill"])
        for e in events
        if e.type is AgentEventType.CUSTOM and e.name == "skill_activated"
    ]


async def collect(agent: AgentCore, prompt: str, **options: Any) -> list[AgentEvent]:
    return [event async for event in agent.stream(prompt, **options)]


# the catalogue ------------------------------------------------------------------------------


async def test_catalogue_reads_front_matter_body_and_resources(tmp_path: Path) -> None:
    folder = write_skill(
        tmp_path,
        "pdf-forms",
        "Fill in PDF forms.",
        "Step one.\nStep two.",
        extra="allowed-tools: read_file, fill_form\nlicense: MIT\n",
    )
    (folder / "reference.md").write_text("ref", encoding="utf-8")
    (folder / "scripts").mkdir()
    (folder / "scripts" / "fill.py").write_text("print(1)", encoding="utf-8")

    manager = SkillManager([tmp_path])
    assert not manager.loaded
    skills = await manager.aload()

    skill = skills["pdf-forms"]
    assert skill.description == "Fill in PDF forms."
    assert skill.instructions == "Step one.\nStep two."
    assert skill.allowed_tools == ("read_file", "fill_form")
    assert skill.resources == ("reference.md", "scripts/fill.py")
    assert skill.metadata == {"license": "MIT"}
    assert manager.problems == ()
    assert await manager.aload() is skills  # cached


async def test_catalogue_loads_in_a_worker_thread_not_on_the_loop(tmp_path: Path) -> None:
    # SKILL.md is a FIFO: reading it blocks until a writer comes. Read on the loop, the loop
    # would stop (and the autouse blocked-loop check fail); read in a thread, the loop runs on
    # and is the one that lets the writer in.
    folder = tmp_path / "slow-skill"
    folder.mkdir()
    fifo = folder / "SKILL.md"
    os.mkfifo(fifo)
    go = threading.Event()

    def writer() -> None:
        go.wait(30)  # a safety net: a blocked loop never sets it, and the check then fails
        fifo.write_text("---\nname: slow-skill\ndescription: Slow.\n---\nBody\n")

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        manager = SkillManager([tmp_path])
        task = asyncio.ensure_future(manager.aload())
        for _ in range(20):
            await asyncio.sleep(0)  # the loop keeps turning while the read waits
        assert not task.done()
        go.set()
        skills = await asyncio.wait_for(task, 30)
    finally:
        go.set()
        await asyncio.to_thread(thread.join)
    assert list(skills) == ["slow-skill"]


@pytest.mark.parametrize(
    ("folder", "front", "problem"),
    [
        ("no-front", None, "must begin with YAML front matter"),
        ("Bad-Name", "name: Bad-Name\ndescription: x\n", "lowercase letters"),
        ("other", "name: mismatch\ndescription: x\n", "must equal the skill's folder name"),
        ("a" * 65, f"name: {'a' * 65}\ndescription: x\n", "1 to 64"),
        ("double--hyphen", "name: double--hyphen\ndescription: x\n", "single hyphens"),
        ("no-description", "name: no-description\n", "needs a description"),
        ("long-description", f"name: long-description\ndescription: {'x' * 1025}\n", "1025"),
        ("bad-yaml", "name: bad-yaml\ndescription: [unclosed\n", "not valid YAML"),
        ("bad-tools", "name: bad-tools\ndescription: x\nallowed-tools: {a: 1}\n", "allowed-tools"),
        ("no-name", "description: x\n", "needs a name"),
    ],
)
async def test_a_bad_skill_is_reported_with_its_path_and_skipped(
    tmp_path: Path, folder: str, front: str | None, problem: str
) -> None:
    write_skill(tmp_path, "good-skill")
    where = tmp_path / folder
    where.mkdir()
    text = "just text\n" if front is None else f"---\n{front}---\nbody\n"
    (where / "SKILL.md").write_text(text, encoding="utf-8")

    manager = SkillManager([tmp_path])
    skills = await manager.aload()

    assert list(skills) == ["good-skill"]
    [reported] = manager.problems
    assert reported.path == where
    assert problem in reported.problem
    assert str(where) in str(reported)


async def test_a_missing_path_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    write_skill(tmp_path / "real", "kept")
    manager = SkillManager([tmp_path / "absent", tmp_path / "real"])
    assert list(await manager.aload()) == ["kept"]
    assert [p.path for p in manager.problems] == [tmp_path / "absent"]


async def test_later_paths_override_earlier_ones_by_name(tmp_path: Path) -> None:
    write_skill(tmp_path / "system", "review", "System review.")
    write_skill(tmp_path / "system", "only-system", "Kept.")
    write_skill(tmp_path / "user", "review", "User review.")
    # a path may also be one skill folder itself
    single = write_skill(tmp_path / "project", "review", "Project review.")

    skills = await SkillManager([tmp_path / "system", tmp_path / "user"]).aload()
    assert skills["review"].description == "User review."
    assert skills["only-system"].description == "Kept."

    skills = await SkillManager([tmp_path / "user", single]).aload()
    assert skills["review"].description == "Project review."


async def test_reload_is_the_explicit_refresh(tmp_path: Path) -> None:
    write_skill(tmp_path, "first")
    manager = SkillManager([tmp_path])
    assert list(await manager.aload()) == ["first"]
    write_skill(tmp_path, "second")
    assert list(await manager.aload()) == ["first"]  # cached
    assert list(await manager.reload()) == ["first", "second"]


# resources -------------------------------------------------------------------------------


async def test_resource_paths_are_confined_to_the_skill_folder(tmp_path: Path) -> None:
    folder = write_skill(tmp_path / "skills", "docs")
    (folder / "guide.md").write_text("the guide", encoding="utf-8")
    (folder / "nested").mkdir()
    (folder / "nested" / "a.txt").write_text("nested text", encoding="utf-8")
    secret = tmp_path / "secret.txt"
    secret.write_text("outside", encoding="utf-8")
    (folder / "escape.txt").symlink_to(secret)
    (folder / "inside.txt").symlink_to(folder / "guide.md")
    (folder / "big.txt").write_text("x" * (MAX_RESOURCE_BYTES + 1), encoding="utf-8")
    skill = (await SkillManager([tmp_path / "skills"]).aload())["docs"]

    assert skill.read_resource("guide.md") == "the guide"
    assert skill.read_resource("nested/a.txt") == "nested text"
    assert skill.read_resource("./guide.md") == "the guide"
    assert skill.read_resource("inside.txt") == "the guide"  # a link that stays inside
    for bad, why in [
        ("../secret.txt", "'..'"),
        ("nested/../../secret.txt", "'..'"),
        (str(secret), "relative"),
        ("/etc/passwd", "relative"),
        ("escape.txt", "out of the skill's folder"),
        ("missing.md", "no file"),
        ("nested", "no file"),
        ("big.txt", "at most"),
        ("", "non-empty"),
    ]:
        with pytest.raises(SkillResourceError, match=re.escape(why)):
            skill.read_resource(bad)


async def test_read_skill_resource_tool_refuses_escapes_as_an_error_result(
    tmp_path: Path,
) -> None:
    folder = write_skill(tmp_path, "docs")
    (folder / "guide.md").write_text("the guide", encoding="utf-8")
    model = ScriptedModel(
        [
            tool_call_turn("load_skill", {"name": "docs"}, call_id="c1"),
            tool_call_turn(
                "read_skill_resource", {"skill": "docs", "path": "guide.md"}, call_id="c2"
            ),
            tool_call_turn(
                "read_skill_resource", {"skill": "docs", "path": "../../etc/passwd"}, call_id="c3"
            ),
            "done",
        ]
    )
    agent = AgentCore(model, skills=[tmp_path])
    response = await agent.chat("read the guide")
    results = {m.tool_call_id: m for m in response.messages if isinstance(m, ToolMessage)}
    assert "Follow these steps." in results["c1"].content
    assert "guide.md" in results["c1"].content  # the files are listed on activation
    assert results["c2"].content == "the guide"
    assert results["c3"].is_error
    assert "'..'" in results["c3"].content
    model.assert_consumed()
    await agent.aclose()


# progressive disclosure and activation --------------------------------------------------------


async def test_the_model_sees_names_and_descriptions_then_loads_a_body(tmp_path: Path) -> None:
    write_skill(tmp_path, "pdf-forms", "Fill in PDF forms.", "SECRET-BODY-PDF")
    write_skill(tmp_path, "review", "Review code.", "SECRET-BODY-REVIEW")
    model = ScriptedModel([tool_call_turn("load_skill", {"name": "review"}), "reviewed"])
    agent = AgentCore(model, skills=SkillManager([tmp_path]), system_prompt="Be brief.")

    events = await collect(agent, "review this")

    first, second = model.requests
    assert first.system is not None
    assert first.system.startswith("Be brief.")
    assert "- pdf-forms: Fill in PDF forms." in first.system
    assert "- review: Review code." in first.system
    assert "SECRET-BODY" not in first.system  # bodies are disclosed only on activation
    assert {t.name for t in first.tools} == {"load_skill", "read_skill_resource"}
    loaded = second.messages[-1]
    assert isinstance(loaded, ToolMessage)
    assert "SECRET-BODY-REVIEW" in loaded.content
    assert activations(events) == ["review"]
    started = [e.type for e in events].index(AgentEventType.RUN_STARTED)
    custom = next(i for i, e in enumerate(events) if e.type is AgentEventType.CUSTOM)
    assert started < custom
    await agent.aclose()


async def test_loading_an_unknown_skill_is_an_error_result(tmp_path: Path) -> None:
    write_skill(tmp_path, "known")
    model = ScriptedModel([tool_call_turn("load_skill", {"name": "nope"}), "ok"])
    agent = AgentCore(model, skills=[tmp_path])
    response = await agent.chat("x")
    result = next(m for m in response.messages if isinstance(m, ToolMessage))
    assert result.is_error
    assert "no skill named 'nope'" in result.content
    await agent.aclose()


async def test_an_agent_without_skills_gets_no_skill_tools() -> None:
    model = ScriptedModel(["hi"])
    agent = AgentCore(model)
    await agent.chat("x")
    assert model.requests[0].tools == []
    with pytest.raises(ConfigurationError, match="has no skills"):
        await agent.chat("x", skill="any")
    await agent.aclose()


async def test_an_empty_catalogue_adds_nothing(tmp_path: Path) -> None:
    model = ScriptedModel(["hi"])
    agent = AgentCore(model, skills=[tmp_path], system_prompt="base")
    await agent.chat("x")
    assert model.requests[0].tools == []
    assert model.requests[0].system == "base"
    await agent.aclose()


async def test_activation_is_per_run_across_100_concurrent_runs(tmp_path: Path) -> None:
    count = 100
    for i in range(count):
        write_skill(
            tmp_path, f"skill-{i}", f"Skill {i}.", f"BODY-{i}", extra=f"allowed-tools: t{i % 10}\n"
        )
    ran: list[tuple[int, str]] = []

    def make(index: int) -> Any:
        @tool(name=f"t{index}")
        async def run_it(run: int) -> str:
            ran.append((run, f"t{index}"))
            return "ok"

        return run_it

    release = asyncio.Event()
    waiting = 0

    async def answer(request: ModelRequest) -> Any:
        nonlocal waiting
        prompt = str(request.messages[0].content)
        run = int(prompt.split()[-1])
        calls = sum(isinstance(m, AssistantMessage) for m in request.messages)
        if calls == 0:
            # every run activates its skill before any run goes on: they overlap for sure
            waiting += 1
            if waiting == count:
                release.set()
            await release.wait()
            return tool_call_turn("load_skill", {"name": f"skill-{run}"}, call_id=f"l{run}")
        if calls == 1:
            advertised = sorted(t.name for t in request.tools)
            assert advertised == sorted(["load_skill", "read_skill_resource", f"t{run % 10}"])
            return tool_call_turn(f"t{run % 10}", {"run": run}, call_id=f"c{run}")
        return f"done {run}"

    agent = AgentCore(FunctionModel(answer), tools=[make(i) for i in range(10)], skills=[tmp_path])
    results = await asyncio.wait_for(
        asyncio.gather(*(collect(agent, f"go {i}") for i in range(count))), 60
    )
    for i, events in enumerate(results):
        assert activations(events) == [f"skill-{i}"]
        assert events[-1].type is AgentEventType.RUN_COMPLETED
        assert events[-1].message is not None
        assert events[-1].message.content == f"done {i}"
    assert sorted(ran) == sorted((i, f"t{i % 10}") for i in range(count))
    await agent.aclose()


# allowed-tools ----------------------------------------------------------------------------------


async def test_allowed_tools_narrow_what_is_advertised_and_what_runs(tmp_path: Path) -> None:
    write_skill(tmp_path, "careful", extra="allowed-tools:\n  - safe\n  - mcp_*\n")
    ran: list[str] = []
    asked: list[str] = []

    @tool
    def safe() -> str:
        """Safe."""
        ran.append("safe")
        return "safe done"

    @tool(policy="ask")
    def danger() -> str:
        """Dangerous: needs approval."""
        ran.append("danger")
        return "boom"

    @tool
    def mcp_lookup() -> str:
        """Matches a pattern."""
        ran.append("mcp_lookup")
        return "found"

    def approve(_context: Any, call: Any) -> bool:
        asked.append(call.name)
        return True

    model = ScriptedModel(
        [
            tool_call_turn("danger", call_id="before"),  # no skill active yet: asks, runs
            tool_call_turn("load_skill", {"name": "careful"}, call_id="load"),
            tool_call_turn("danger", call_id="refused"),
            tool_call_turn("safe", call_id="s"),
            tool_call_turn("mcp_lookup", call_id="m"),
            "finished",
        ]
    )
    agent = AgentCore(
        model, tools=[safe, danger, mcp_lookup], skills=[tmp_path], permission_callback=approve
    )
    response = await agent.chat("go")

    assert {t.name for t in model.requests[0].tools} >= {"safe", "danger", "mcp_lookup"}
    narrowed = {t.name for t in model.requests[2].tools}
    assert narrowed == {"safe", "mcp_lookup", "load_skill", "read_skill_resource"}
    results = {m.tool_call_id: m for m in response.messages if isinstance(m, ToolMessage)}
    assert results["refused"].is_error
    assert "not available while skill(s) careful are active" in results["refused"].content
    assert asked == ["danger"]  # only the call before the skill: the refused one never asks
    assert ran == ["danger", "safe", "mcp_lookup"]
    await agent.aclose()


async def test_several_active_skills_only_narrow(tmp_path: Path) -> None:
    write_skill(tmp_path, "a-skill", extra="allowed-tools: one two\n")
    write_skill(tmp_path, "b-skill", extra="allowed-tools: two three\n")
    write_skill(tmp_path, "open-skill")

    @tool
    def one() -> str:
        """1"""
        return "1"

    @tool
    def two() -> str:
        """2"""
        return "2"

    @tool
    def three() -> str:
        """3"""
        return "3"

    model = ScriptedModel(
        [
            tool_call_turn("load_skill", {"name": "a-skill"}, call_id="a"),
            tool_call_turn("load_skill", {"name": "open-skill"}, call_id="o"),
            tool_call_turn("load_skill", {"name": "b-skill"}, call_id="b"),
            "done",
        ]
    )
    agent = AgentCore(model, tools=[one, two, three], skills=[tmp_path])
    events = await collect(agent, "go")
    assert activations(events) == ["a-skill", "open-skill", "b-skill"]
    names = [
        {t.name for t in r.tools} - {"load_skill", "read_skill_resource"} for r in model.requests
    ]
    assert names == [{"one", "two", "three"}, {"one", "two"}, {"one", "two"}, {"two"}]
    await agent.aclose()


# run_skill, skill=, dispatch -------------------------------------------------------------------


async def test_run_skill_starts_with_the_skill_active(tmp_path: Path) -> None:
    write_skill(
        tmp_path, "summarise", "Summarise text.", "SUMMARY-BODY", extra="allowed-tools: []\n"
    )

    @tool
    def other() -> str:
        """Not allowed by the skill."""
        return "x"

    model = ScriptedModel(["short"])
    agent = AgentCore(model, tools=[other], skills=[tmp_path])
    response = await agent.run_skill("summarise", "a long text")
    assert response.content == "short"
    [request] = model.requests
    assert request.system is not None
    assert "The skill summarise is active" in request.system
    assert "SUMMARY-BODY" in request.system
    assert {t.name for t in request.tools} == {"load_skill", "read_skill_resource"}

    with pytest.raises(SkillNotFoundError) as caught:
        await agent.run_skill("absent", "x")
    assert caught.value.available == ("summarise",)
    assert caught.value.code == "skill_not_found"
    assert caught.value.run_id
    await agent.aclose()


async def test_run_skill_has_one_clock(tmp_path: Path) -> None:
    write_skill(tmp_path, "slow")
    never = asyncio.Event()
    calls = 0

    async def hang(request: ModelRequest) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            return tool_call_turn("load_skill", {"name": "slow"})
        await never.wait()
        return "never"

    agent = AgentCore(FunctionModel(hang), skills=[tmp_path], run_timeout=60)
    with pytest.raises(RunTimeoutError) as caught:
        await agent.run_skill("slow", "x", run_timeout=0.5)
    assert caught.value.timeout == 0.5
    assert calls == 2
    await agent.aclose()


async def test_dispatch_asks_system_one_and_activates_its_choice(tmp_path: Path) -> None:
    write_skill(tmp_path, "pdf-forms", "Fill in PDF forms.", "PDF-BODY")
    write_skill(tmp_path, "review", "Review code.", "REVIEW-BODY")
    router = ScriptedModel(["`pdf-forms`", "none", "I would pick review here."])
    main = ScriptedModel(["filled", "plain", "reviewed", "skipped"])
    agent = AgentCore(ModelBindings(llm=main, system_one=router), skills=[tmp_path])

    events = await collect(agent, "please fill this form")
    assert activations(events) == ["pdf-forms"]
    question = router.requests[0]
    assert "please fill this form" in str(question.messages[0].content)
    assert "- review: Review code." in str(question.messages[0].content)
    assert main.requests[0].system is not None
    assert "PDF-BODY" in main.requests[0].system
    usage = [e for e in events if e.type is AgentEventType.USAGE]
    assert len(usage) == 2  # the router's call and the model's

    assert activations(await collect(agent, "hello")) == []
    assert activations(await collect(agent, "look at my diff")) == ["review"]

    # skill_dispatch=False: the router is not asked at all
    asked = len(router.requests)
    assert activations(await collect(agent, "fill a form", skill_dispatch=False)) == []
    assert len(router.requests) == asked
    router.assert_consumed()
    main.assert_consumed()
    await agent.aclose()


async def test_a_failing_system_one_does_not_fail_the_run(tmp_path: Path) -> None:
    from agent_runtime.errors import ProviderError

    write_skill(tmp_path, "x-skill")
    router = ScriptedModel([ProviderError("router down", retryable=True)])
    agent = AgentCore(
        ModelBindings(llm=ScriptedModel(["fine"]), system_one=router), skills=[tmp_path]
    )
    response = await agent.chat("anything")
    assert response.content == "fine"
    await agent.aclose()


def test_choose_skill_reads_the_router_answer() -> None:
    catalogue: Any = {"review": None, "code-review": None, "pdf": None}
    assert choose_skill("review", catalogue) == "review"
    assert choose_skill(" Code-Review. ", catalogue) == "code-review"
    assert choose_skill("use code-review please", catalogue) == "code-review"
    assert choose_skill("none", catalogue) is None
    assert choose_skill("pdfs", catalogue) is None


# pipelines ----------------------------------------------------------------------------------------


async def test_pipeline_runs_skills_in_order_under_one_run_id(tmp_path: Path) -> None:
    write_skill(tmp_path, "draft", "Draft.", "DRAFT-BODY")
    write_skill(tmp_path, "polish", "Polish.", "POLISH-BODY")
    model = ScriptedModel(["a rough draft", "a polished text"])
    agent = AgentCore(model, skills=[tmp_path])
    seen: list[AgentEvent] = []
    contexts: list[str] = []

    def second_prompt(context: PipelineContext) -> str:
        contexts.append(context.run_id)
        assert context.last is not None
        return f"Polish: {context.last.content}"

    pipeline = SkillPipeline(agent, ["draft", PipelineStep("polish", second_prompt)])
    result = await pipeline.run("write a note", on_event=seen.append, run_id="run_pipeline_1")

    assert result.run_id == "run_pipeline_1"
    assert contexts == ["run_pipeline_1"]
    assert [s.skill for s in result.steps] == ["draft", "polish"]
    assert result.output == "a polished text"
    assert {e.run_id for e in seen} == {"run_pipeline_1"}
    assert [e.name for e in seen if e.type is AgentEventType.CUSTOM] == [
        "pipeline_step_started",
        "skill_activated",
        "pipeline_step_completed",
        "pipeline_step_started",
        "skill_activated",
        "pipeline_step_completed",
    ]
    assert model.requests[1].messages[-1].content == "Polish: a rough draft"
    assert result.usage.output_tokens == 6
    await agent.aclose()


async def test_pipeline_generates_a_run_id_and_has_one_clock(tmp_path: Path) -> None:
    write_skill(tmp_path, "one")
    write_skill(tmp_path, "two")
    never = asyncio.Event()
    calls = 0

    async def answer(request: ModelRequest) -> Any:
        nonlocal calls
        calls += 1
        if calls == 1:
            return "first done"
        await never.wait()
        return "never"

    agent = AgentCore(FunctionModel(answer), skills=[tmp_path])
    pipeline = SkillPipeline(agent, ["one", "two"])
    with pytest.raises(RunTimeoutError) as caught:
        await pipeline.run("x", run_timeout=0.5)
    assert caught.value.timeout == 0.5
    assert caught.value.run_id is not None
    assert caught.value.run_id.startswith("run_")
    with pytest.raises(ConfigurationError):
        SkillPipeline(agent, [])
    await agent.aclose()


async def test_a_tool_filter_reaches_the_skill_tools(tmp_path: Path) -> None:
    write_skill(tmp_path, "any-skill")
    model = ScriptedModel(["warm"])
    agent = AgentCore(model, skills=[tmp_path])
    await agent.chat("x", tool_filter=lambda _tool: False, skill_dispatch=False)
    assert model.requests[0].tools == []
    await agent.aclose()


async def test_a_tool_named_like_a_skill_tool_fails_the_run(tmp_path: Path) -> None:
    write_skill(tmp_path, "any-skill")

    @tool(name="load_skill")
    def mine() -> str:
        """Mine."""
        return "mine"

    agent = AgentCore(ScriptedModel([]), tools=[mine], skills=[tmp_path])
    with pytest.raises(ConfigurationError, match="collides with the skill tool"):
        await agent.chat("x")
    with pytest.raises(ConfigurationError, match="list of paths"):
        AgentCore(ScriptedModel([]), skills=str(tmp_path))
    await agent.aclose()
