"""ModelBinding and ModelBindings: lazy build, loop claim, leases, rotation, preflight, specs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest

from agent_runtime import (
    AgentCore,
    ConfigurationError,
    LoopAffinityError,
    ModelBinding,
    ModelBindings,
    presets,
)
from agent_runtime.bindings import PreflightError, binding_from_spec, bindings_from_spec
from agent_runtime.messages import UserMessage
from agent_runtime.model import ModelRequest, RetryOptions
from agent_runtime.providers.anthropic import AnthropicModel
from agent_runtime.providers.demo import DemoModel
from agent_runtime.providers.openai import OpenAIModel
from agent_runtime.testing import ScriptedModel
from tests.fakes.upstream import FakeUpstream, Gate, Text, freeze_imports

freeze_imports()  # keep full collections short: see its docstring

KEY = "sk-binding-test-0123456789"
T = TypeVar("T")


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream() as server:
        yield server


@pytest.fixture(autouse=True)
def _no_ambient_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "DEEPSEEK_API_KEY",
        "AGENT_DEMO_TOKEN_DELAY",
    ):
        monkeypatch.delenv(name, raising=False)


def openai_binding(upstream: FakeUpstream, **options: Any) -> ModelBinding:
    options.setdefault("api_key", KEY)
    return ModelBinding.llm(
        model="gpt-test", base_url=upstream.openai_url, client_max_retries=0, **options
    )


async def in_other_loop(work: Callable[[], Awaitable[T]]) -> T:
    """Run ``work`` on a fresh event loop in a worker thread; our loop keeps running."""
    return await asyncio.to_thread(asyncio.run, work())  # type: ignore[arg-type]


def closed(provider: OpenAIModel) -> bool:
    # a call, so mypy does not carry an earlier narrowing of the property across awaits
    return provider.closed


async def one_call(binding: ModelBinding, text: str = "hi") -> str:
    async with binding.lease_provider() as provider:
        parts = [event.delta async for event in provider.stream(ModelRequest([UserMessage(text)]))]
    return "".join(parts)


# construction and diagnostics -------------------------------------------------------------------


async def test_a_definition_is_lazy_until_first_use(upstream: FakeUpstream) -> None:
    binding = openai_binding(upstream)
    assert (binding.built, binding.owner_loop, binding.provider) == (False, None, None)
    assert repr(binding).endswith("loop=None built=False>")
    assert upstream.requests == []

    upstream.script(Text("ready"))
    assert await one_call(binding) == "ready"

    loop = asyncio.get_running_loop()
    assert (binding.built, binding.owner_loop) == (True, loop)
    assert isinstance(binding.provider, OpenAIModel)
    assert repr(binding).endswith(f"loop={hex(id(loop))} built=True>")
    assert KEY not in repr(binding)

    await binding.aclose()
    assert (binding.built, binding.owner_loop) == (False, None)
    assert binding.providers_built == binding.providers_closed == 1


async def test_client_options_are_applied_to_the_sdk_client(upstream: FakeUpstream) -> None:
    binding = ModelBinding.llm(
        model="claude-test",
        protocol="anthropic",
        api_key=KEY,
        base_url=upstream.anthropic_url,
        client_timeout=7,
        client_max_retries=0,
        retry=RetryOptions(max_retries=1),
        credential_provider=lambda: "sk-rotated-credential-value",
    )
    async with binding:
        provider = await binding.build_provider()
        assert isinstance(provider, AnthropicModel)
        assert (provider.client.timeout, provider.client.max_retries) == (7, 0)
        assert provider.retry.max_retries == 1
        await binding.arefresh()  # options survive a rotation
        rebuilt = binding.provider
        assert isinstance(rebuilt, AnthropicModel) and rebuilt is not provider
        assert (rebuilt.client.timeout, rebuilt.client.max_retries) == (7, 0)
        assert provider.closed


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "needs model="),
        ({"model": "m", "protocol": "grpc"}, "unknown protocol"),
        ({"model": "m", "base_url": "ftp://host"}, "http"),
        ({"model": "m", "base_url": "not a url"}, "http"),
        ({"model": "m", "client_timeout": 0}, "client_timeout"),
        ({"model": "m", "client_max_retries": -1}, "client_max_retries"),
        ({"model": "m", "client_max_retries": 1.5}, "client_max_retries"),
        ({"model": "m", "api_key": ""}, "api_key"),
    ],
)
def test_bad_definitions_are_rejected_at_construction(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ModelBinding.llm(**options)


@pytest.mark.parametrize(
    "option",
    ["api_key", "base_url", "protocol", "client_timeout", "client_max_retries", "params"],
)
def test_a_supplied_provider_takes_no_definition_options(option: str) -> None:
    value: Any = {"api_key": "k", "base_url": "http://h", "protocol": "openai"}.get(option, 1)
    if option == "params":
        value = {"temperature": 0}
    options: dict[str, Any] = {option: value}
    with pytest.raises(ValueError, match=option):
        ModelBinding.llm(provider=ScriptedModel([]), **options)


async def test_a_supplied_provider_is_never_built_or_closed() -> None:
    closed: list[bool] = []

    class Closable(ScriptedModel):
        async def aclose(self) -> None:
            closed.append(True)

    model = Closable(["hello"], model_name="scripted-x")
    binding = ModelBinding(provider=model)
    assert binding.model == "scripted-x" and binding.supplied
    async with AgentCore.open(binding) as agent:
        assert (await agent.chat("hi")).content == "hello"
    assert closed == [] and not binding.built
    # the claim stays: the caller's provider may hold loop-bound state
    assert binding.owner_loop is asyncio.get_running_loop()
    with pytest.raises(ConfigurationError, match="inside the target loop"):
        binding.for_current_loop()


async def test_a_loop_agnostic_provider_claims_no_loop() -> None:
    class Agnostic(ScriptedModel):
        loop_agnostic = True

    binding = ModelBinding(provider=Agnostic(["one", "two"]))
    assert await one_call(binding) == "one"
    assert binding.owner_loop is None
    sibling = binding.for_current_loop()
    assert sibling.provider is binding.provider
    assert await in_other_loop(lambda: one_call(binding)) == "two"


# loop affinity ----------------------------------------------------------------------------------


async def test_a_second_loop_gets_loop_affinity_error_with_diagnostics(
    upstream: FakeUpstream,
) -> None:
    upstream.script(Text("first loop"))
    binding = openai_binding(upstream)
    assert await one_call(binding) == "first loop"
    main_loop = asyncio.get_running_loop()

    async def use_elsewhere() -> tuple[LoopAffinityError, asyncio.AbstractEventLoop]:
        with pytest.raises(LoopAffinityError) as caught:
            await one_call(binding)
        return caught.value, asyncio.get_running_loop()

    error, thread_loop = await in_other_loop(use_elsewhere)
    assert error.model == "gpt-test"
    assert error.owner_loop is main_loop
    assert error.current_loop is thread_loop and thread_loop is not main_loop
    assert "for_current_loop" in str(error)
    assert binding.owner_loop is main_loop  # the failed use changed nothing
    await binding.aclose()


async def test_an_agent_on_a_second_loop_fails_with_loop_affinity_error(
    upstream: FakeUpstream,
) -> None:
    binding = openai_binding(upstream)
    await binding.preflight()

    async def chat_elsewhere() -> BaseException | None:
        agent = AgentCore(binding)
        try:
            await agent.chat("hi")
        except LoopAffinityError as error:
            return error
        return None

    error = await in_other_loop(chat_elsewhere)
    assert isinstance(error, LoopAffinityError) and error.model == "gpt-test"
    await binding.aclose()


async def test_aclose_releases_the_claim_and_for_current_loop_gives_a_sibling(
    upstream: FakeUpstream,
) -> None:
    upstream.script(Text("one"), Text("two"), Text("three"))
    binding = openai_binding(upstream)
    assert await one_call(binding) == "one"
    first = binding.provider

    async def sibling_call() -> str:
        sibling = binding.for_current_loop()
        assert not sibling.built and sibling.owner_loop is None
        async with sibling:
            answer = await one_call(sibling)
            assert sibling.provider is not first
            return answer

    assert await in_other_loop(sibling_call) == "two"
    assert binding.owner_loop is asyncio.get_running_loop()

    await binding.aclose()

    async def reuse() -> str:
        try:
            return await one_call(binding)
        finally:
            await binding.aclose()

    assert await in_other_loop(reuse) == "three"
    assert [r.api_key for r in upstream.requests] == [KEY, KEY, KEY]


# preflight --------------------------------------------------------------------------------------


async def test_preflight_builds_everything_without_a_network_call(upstream: FakeUpstream) -> None:
    resolved: list[str] = []

    async def credential() -> str:
        resolved.append("x")
        return "sk-from-the-vault-123456"

    bindings = ModelBindings(
        llm=[
            openai_binding(upstream),
            ModelBinding.llm(
                model="claude-test",
                protocol="anthropic",
                base_url=upstream.anthropic_url,
                credential_provider=credential,
            ),
        ]
    )
    async with bindings:
        await bindings.preflight()
        assert [b.built for b in bindings.llm] == [True, True]
        assert resolved == ["x"]
        providers = [b.provider for b in bindings.llm]
        await bindings.preflight()  # idempotent: nothing rebuilt, nothing resolved again
        assert [b.provider for b in bindings.llm] == providers
        assert resolved == ["x"]
        assert upstream.requests == []
    assert [b.built for b in bindings.llm] == [False, False]


async def test_preflight_names_the_binding_that_failed(upstream: FakeUpstream) -> None:
    bindings = ModelBindings(
        llm=[
            openai_binding(upstream),
            ModelBinding.llm(model="claude-fallback", protocol="anthropic"),
        ]
    )
    with pytest.raises(PreflightError) as caught:
        await bindings.preflight()
    error = caught.value
    assert (error.index, error.model) == (1, "claude-fallback")
    assert "llm[1]" in str(error) and "ANTHROPIC_API_KEY" in str(error)
    assert isinstance(error, ValueError)
    await bindings.aclose()


async def test_preflight_reads_the_key_from_the_environment(
    upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env-123456")
    upstream.script(Text("ok"))
    binding = ModelBinding.llm(
        model="claude-test",
        protocol="anthropic",
        base_url=upstream.anthropic_url,
        client_max_retries=0,
    )
    async with ModelBindings(llm=binding) as bindings:
        await bindings.preflight()
        assert await one_call(binding) == "ok"
    assert upstream.requests[0].api_key == "sk-ant-from-env-123456"


async def test_preflight_names_a_failing_credential_provider() -> None:
    def broken() -> str:
        raise RuntimeError("vault unreachable")

    bindings = ModelBindings(llm=[ModelBinding.llm(model="m", credential_provider=broken)])
    with pytest.raises(PreflightError, match=r"llm\[0\].*credential_provider.*RuntimeError"):
        await bindings.preflight()


async def test_preflight_keeps_loop_affinity_diagnostics(upstream: FakeUpstream) -> None:
    bindings = ModelBindings(llm=[openai_binding(upstream)])
    await bindings.preflight()
    main_loop = asyncio.get_running_loop()

    async def preflight_elsewhere() -> LoopAffinityError:
        with pytest.raises(LoopAffinityError) as caught:
            await bindings.preflight()
        return caught.value

    error = await in_other_loop(preflight_elsewhere)
    assert "llm[0]" in str(error) and error.model == "gpt-test"
    assert error.owner_loop is main_loop and error.current_loop is not main_loop
    await bindings.aclose()


# credentials and rotation -----------------------------------------------------------------------


async def test_refresh_uses_the_new_credential_and_closes_the_idle_provider(
    upstream: FakeUpstream,
) -> None:
    keys = iter(["sk-second-key-00000001", "sk-third-key-000000002"])
    binding = openai_binding(upstream, credential_provider=lambda: next(keys))
    upstream.script(Text("a"), Text("b"))
    await one_call(binding)
    first = binding.provider
    assert isinstance(first, OpenAIModel)

    await binding.arefresh()

    assert first.closed and binding.provider is not first
    await one_call(binding)
    assert [r.api_key for r in upstream.requests] == [KEY, "sk-second-key-00000001"]
    assert (binding.providers_built, binding.providers_closed) == (2, 1)
    await binding.aclose()
    assert binding.providers_closed == 2


@pytest.mark.parametrize(
    "source",
    [
        lambda: "",
        lambda: "   ",
        lambda: None,
        lambda: 42,
        lambda: (_ for _ in ()).throw(OSError("secret store down")),
    ],
    ids=["empty", "blank", "none", "not-a-string", "raises"],
)
async def test_a_bad_credential_changes_nothing(
    upstream: FakeUpstream, source: Callable[[], Any]
) -> None:
    binding = openai_binding(upstream, credential_provider=source)
    upstream.script(Text("before"), Text("after"))
    await one_call(binding)
    provider = binding.provider

    with pytest.raises(ValueError, match="credential_provider"):
        await binding.arefresh()

    assert binding.provider is provider and isinstance(provider, OpenAIModel)
    assert not provider.closed
    await one_call(binding)
    assert [r.api_key for r in upstream.requests] == [KEY, KEY]
    assert binding.providers_built == 1
    await binding.aclose()


async def test_an_async_credential_provider_feeds_the_first_build(upstream: FakeUpstream) -> None:
    async def credential() -> str:
        await asyncio.sleep(0)
        return "sk-async-credential-01"

    binding = ModelBinding.llm(
        model="m", base_url=upstream.openai_url, credential_provider=credential
    )
    upstream.script(Text("ok"))
    async with binding:
        await one_call(binding)
    assert upstream.requests[0].api_key == "sk-async-credential-01"


async def test_refresh_without_a_credential_provider_rebuilds_nothing(
    upstream: FakeUpstream,
) -> None:
    binding = openai_binding(upstream)
    async with binding:
        provider = await binding.build_provider()
        await binding.arefresh()
        assert binding.provider is provider and binding.providers_built == 1


async def test_rotation_never_closes_a_provider_under_a_call(upstream: FakeUpstream) -> None:
    """Calls hold leases across rotations; retired providers close once idle, counted."""
    counter = iter(range(1, 1000))

    def credential() -> str:
        return f"sk-rotated-key-{next(counter):06d}"

    binding = openai_binding(upstream, credential_provider=credential)
    gate = Gate()
    upstream.default = Text("held answer", hold=gate)

    first_wave = [asyncio.ensure_future(one_call(binding)) for _ in range(8)]
    await upstream.wait_until(lambda: gate.waiting == 8)
    p0 = binding.provider
    assert isinstance(p0, OpenAIModel) and binding.lease_count == 8

    await binding.arefresh()  # P1 current; P0 retired, still leased
    await binding.arefresh()  # P2 current; P1 closed at once (idle)
    second_wave = [asyncio.ensure_future(one_call(binding)) for _ in range(4)]
    await upstream.wait_until(lambda: gate.waiting == 12)
    p2 = binding.provider
    assert isinstance(p2, OpenAIModel)
    for _ in range(3):  # P3, P4, P5 built; P3 and P4 closed idle; P2 retired, leased
        await binding.arefresh()

    assert (binding.providers_built, binding.providers_closed) == (6, 3)
    assert binding.retired_count == 2 and binding.lease_count == 12
    assert not p0.closed and not p2.closed

    gate.open()
    answers = await asyncio.gather(*first_wave, *second_wave)
    assert answers == ["held answer"] * 12
    assert binding.lease_count == 0
    assert not p0.closed and not p2.closed  # closed by the next refresh or aclose, not here

    await binding.arefresh()  # P6 current; P0, P2 and the idle P5 closed
    assert closed(p0) and closed(p2) and binding.retired_count == 0
    assert (binding.providers_built, binding.providers_closed) == (7, 6)
    await binding.aclose()
    assert binding.providers_closed == binding.providers_built == 7

    keys = [request.api_key for request in upstream.requests]
    assert keys[:8] == [KEY] * 8
    assert keys[8:] == ["sk-rotated-key-000002"] * 4


async def test_rotation_under_concurrent_runs(upstream: FakeUpstream) -> None:
    """Many runs in flight while arefresh() runs repeatedly: every run completes."""
    counter = iter(range(1, 1000))

    async def credential() -> str:
        await asyncio.sleep(0)  # let calls interleave with the refresh
        return f"sk-concurrent-key-{next(counter):06d}"

    binding = openai_binding(upstream, credential_provider=credential)
    upstream.default = Text("fine thanks")
    refreshes = 12
    await binding.preflight()

    async with AgentCore.open(binding) as agent:

        async def run(index: int) -> str:
            return (await agent.chat(f"how are you {index}?")).content

        in_flight: list[int] = []

        async def rotate() -> None:
            for _ in range(refreshes):
                in_flight.append(binding.lease_count)
                await agent.arefresh_credentials()
                await asyncio.sleep(0)

        runs = [asyncio.ensure_future(run(i)) for i in range(40)]
        await rotate()
        answers = await asyncio.gather(*runs)
        assert answers == ["fine thanks"] * 40
        assert max(in_flight) > 0  # rotations really happened under calls
        assert binding.providers_built == refreshes + 1
        await binding.arefresh()
        assert binding.retired_count == 0
        assert binding.providers_closed == binding.providers_built - 1
    assert binding.providers_closed == binding.providers_built
    assert len(upstream.requests) == 40


# ModelBindings ----------------------------------------------------------------------------------


async def test_model_bindings_accepts_one_binding_a_list_or_raw_models() -> None:
    single = ModelBinding.llm(model="m", api_key=KEY)
    assert ModelBindings(llm=single).llm == [single]
    wrapped = ModelBindings(llm=[single, DemoModel(token_delay=0)])
    assert wrapped.primary is single and wrapped.llm[1].model == "demo"
    assert ModelBindings(llm=DemoModel()).llm[0].supplied
    with pytest.raises(ValueError, match="at least one"):
        ModelBindings(llm=[])
    assert "gpt" not in repr(wrapped) and "model='m'" in repr(wrapped)


async def test_agent_refresh_credentials_refreshes_every_llm_binding() -> None:
    refreshed: list[str] = []

    class Recording(ModelBinding):
        async def arefresh(self) -> None:
            refreshed.append(self.model)

    bindings = ModelBindings(
        llm=[Recording(model="a", api_key=KEY), Recording(model="b", api_key=KEY)]
    )
    async with AgentCore.open(bindings) as agent:
        await agent.arefresh_credentials()
    assert refreshed == ["a", "b"]


async def test_bindings_close_every_binding_even_after_a_failure() -> None:
    closed: list[str] = []

    class Failing(ModelBinding):
        async def aclose(self) -> None:
            closed.append(self.model)
            raise RuntimeError("close failed")

    class Recording(ModelBinding):
        async def aclose(self) -> None:
            closed.append(self.model)

    bindings = ModelBindings(
        llm=[Failing(model="a", api_key=KEY), Recording(model="b", api_key=KEY)]
    )
    with pytest.raises(RuntimeError, match="close failed"):
        await bindings.aclose()
    assert closed == ["a", "b"]


# settings strings and presets -------------------------------------------------------------------


def test_spec_openai_reads_key_and_endpoint_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-openai-000000")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    binding = binding_from_spec("openai:gpt-4o-mini", client_timeout=5)
    assert (binding.model, binding.protocol, binding.base_url) == (
        "gpt-4o-mini",
        "openai",
        "http://127.0.0.1:9/v1",
    )
    assert "sk-env" not in repr(binding)


async def test_spec_keywords_override_the_environment(upstream: FakeUpstream) -> None:
    upstream.script(Text("from spec"))
    binding = binding_from_spec(
        "anthropic:claude-x",
        ANTHROPIC_API_KEY="sk-ant-override-00001",
        ANTHROPIC_BASE_URL=upstream.anthropic_url,
        client_max_retries=0,
    )
    assert (binding.model, binding.protocol) == ("claude-x", "anthropic")
    async with binding:
        assert await one_call(binding) == "from spec"
    assert upstream.requests[0].api_key == "sk-ant-override-00001"


def test_spec_presets_and_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    deepseek = binding_from_spec("deepseek", DEEPSEEK_API_KEY="sk-deepseek-000000")
    assert (deepseek.model, deepseek.base_url) == ("deepseek-chat", presets.DEEPSEEK_URL)
    assert "provider='deepseek'" in repr(deepseek)
    reasoner = binding_from_spec("deepseek:deepseek-reasoner")
    assert reasoner.model == "deepseek-reasoner"
    assert binding_from_spec("ollama-local").base_url == presets.OLLAMA_URL
    assert binding_from_spec("groq").base_url == presets.GROQ_URL
    assert binding_from_spec("vllm:served").model == "served"

    monkeypatch.setenv("AGENT_DEMO_TOKEN_DELAY", "0")
    demo = binding_from_spec("demo")
    assert demo.supplied and isinstance(demo.provider, DemoModel)
    assert demo.provider.token_delay == 0


@pytest.mark.parametrize("spec", ["", "gpt-4o", "openai", "nonsense:model", "vllm"])
def test_bad_specs_say_what_is_accepted(spec: str) -> None:
    if spec == "openai":  # a bare protocol is the preset with its default model
        assert binding_from_spec(spec).model == "gpt-4o-mini"
        return
    with pytest.raises(ConfigurationError):
        binding_from_spec(spec)


def test_bindings_from_spec_builds_the_failover_chain() -> None:
    chain = bindings_from_spec(
        "openai:gpt-4o-mini",
        " anthropic:claude-x , deepseek,",
        OPENAI_API_KEY="sk-a-0000000000",
        ANTHROPIC_API_KEY="sk-b-0000000000",
    )
    assert [b.model for b in chain.llm] == ["gpt-4o-mini", "claude-x", "deepseek-chat"]
    assert [b.protocol for b in chain.llm] == ["openai", "anthropic", "openai"]


async def test_preset_without_its_key_fails_preflight_naming_the_variable() -> None:
    bindings = ModelBindings(llm=[presets.deepseek()])
    with pytest.raises(PreflightError, match="DEEPSEEK_API_KEY"):
        await bindings.preflight()


@pytest.mark.parametrize(
    ("factory", "url", "name"),
    [
        (presets.deepseek, presets.DEEPSEEK_URL, "deepseek"),
        (presets.groq, presets.GROQ_URL, "groq"),
        (presets.together, presets.TOGETHER_URL, "together"),
        (presets.openrouter, presets.OPENROUTER_URL, "openrouter"),
        (presets.ollama, presets.OLLAMA_URL, "ollama"),
    ],
)
def test_presets_are_lazy_openai_compatible_definitions(
    factory: Callable[..., ModelBinding], url: str, name: str
) -> None:
    binding = factory(api_key="sk-preset-key-000000")
    assert (binding.protocol, binding.base_url, binding.built) == ("openai", url, False)
    assert presets.get(name) is factory
    assert "sk-preset" not in repr(binding)
