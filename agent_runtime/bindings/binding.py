"""``ModelBinding``: one model definition (or supplied provider) and the provider it serves.

Lifecycle of one binding::

    constructed ──first use / preflight()──▶ built, owner_loop claimed
        ▲                                        │ arefresh(): new provider built, then swapped;
        │                                        │ the old one retires and closes once idle
        └──────────────── aclose() ◀─────────────┘ (cancels its media jobs, closes what it
                                                    built, releases the loop)

A provider wraps an async HTTP client that belongs to one event loop, so a binding claims the
loop of its first use and raises ``LoopAffinityError`` on any other. ``for_current_loop()``
gives a sibling for another loop. A provider that declares ``loop_agnostic = True`` (the
in-process providers of ``agent_runtime.local``) owns nothing loop-bound: its binding claims no
loop. Every model or capability call holds a *lease* on the provider it captured (``async with
binding.lease_provider() as provider``); a rotation never closes a provider that still has one.
Media jobs (``submit_image``...) hold theirs for their whole life; ``aclose()`` cancels and
awaits them before it closes the providers.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import threading
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
)
from contextlib import asynccontextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeAlias, TypedDict, TypeVar, cast

from ..errors import ConfigurationError, LoopAffinityError
from ..input_kinds import as_input_kinds
from ..model import Model, RetryOptions
from .purposes import (
    PURPOSES,
    Definition,
    Purpose,
    purpose_of,
    safe_url,
    validated_definition,
)

if TYPE_CHECKING:
    from typing import Self, Unpack

__all__ = [
    "DEFAULT_KEY_ENV",
    "BindingOptions",
    "CredentialProvider",
    "ModelBinding",
    "PreflightError",
]

CredentialProvider: TypeAlias = Callable[[], "str | Awaitable[str]"]
T = TypeVar("T")

#: Environment variable read for the API key of a definition with no ``api_key`` or
#: ``credential_provider``, by protocol.
DEFAULT_KEY_ENV: Mapping[str, str] = {
    "openai": "OPENAI_API_KEY",
    "openai-responses": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
}


class BindingOptions(TypedDict, total=False):
    """The keyword options every binding factory takes (see ``ModelBinding.llm``)."""

    model: str | None
    protocol: str | None
    api_key: str | None
    base_url: str | None
    credential_provider: CredentialProvider | None
    client_timeout: float | None
    client_max_retries: int | None
    params: Mapping[str, Any] | None
    retry: RetryOptions | None
    provider: Any
    provider_name: str | None
    api_key_env: str | None
    default_headers: Mapping[str, str] | None
    input_kinds: Iterable[str] | None  # chat bindings only (llm, system_one)


class PreflightError(ConfigurationError):
    """``ModelBindings.preflight()`` found a binding that cannot be built.

    ``index`` is its position in the chain (0 is the primary), ``model`` its model name.
    """

    def __init__(self, message: str, *, index: int, model: str, purpose: str = "llm") -> None:
        super().__init__(message)
        self.index = index
        self.model = model
        self.purpose = purpose


class _Slot:
    """One provider and the calls leasing it."""

    __slots__ = ("closed", "leases", "provider", "retired")

    def __init__(self, provider: Any) -> None:
        self.provider = provider
        self.leases = 0
        self.retired = False
        self.closed = False


_BACKGROUND: set[asyncio.Future[Any]] = set()


def _close_orphan(future: asyncio.Future[Any]) -> None:
    """Close a provider whose build finished after the caller was cancelled."""
    if future.cancelled() or future.exception() is not None:
        return
    aclose = getattr(future.result(), "aclose", None)
    if aclose is None:
        return
    with contextlib.suppress(RuntimeError):  # the loop is already closing
        task = asyncio.ensure_future(aclose())
        _BACKGROUND.add(task)
        task.add_done_callback(_BACKGROUND.discard)


def _loop_id(loop: asyncio.AbstractEventLoop | None) -> str:
    return "None" if loop is None else hex(id(loop))


def _describe_loop(loop: asyncio.AbstractEventLoop | None) -> str:
    if loop is None:
        return "no loop"
    state = "closed" if loop.is_closed() else ("running" if loop.is_running() else "idle")
    return f"loop {hex(id(loop))} ({state})"


def _check_supplied(provider: Any, spec: Purpose, given: Mapping[str, Any]) -> None:
    """A provider given as it is: nothing else to configure, and the purpose's method."""
    rejected = sorted(name for name, value in given.items() if value is not None)
    if rejected:
        raise ConfigurationError(
            f"{', '.join(rejected)} cannot be combined with provider=: configure the "
            "provider (and its client) directly"
        )
    if not spec.has_method(provider):
        raise ConfigurationError(
            f"{type(provider).__name__} has no {spec.method}(...): it cannot serve "
            f"as a {spec.title}"
        )


def _chat_input_kinds(purpose: str, kinds: Iterable[str] | None) -> frozenset[str] | None:
    """A chat binding's narrowing of what its model takes; no other purpose has one."""
    if kinds is None:
        return None
    if purpose not in _CHAT_PURPOSES:
        raise ConfigurationError(f"input_kinds is an option of chat bindings, not of {purpose}")
    return as_input_kinds(kinds)


_CHAT_PURPOSES = frozenset({"llm", "system_one"})


def _check_credentials(
    definition: Definition, api_key: str | None, credential_provider: CredentialProvider | None
) -> None:
    """A key or a credential provider, well formed, and only for a binding that takes one."""
    if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
        raise ConfigurationError("api_key must be a non-empty string or None")
    if credential_provider is not None and not callable(credential_provider):
        raise ConfigurationError("credential_provider must be a callable")
    if not definition.needs_key and (api_key is not None or credential_provider is not None):
        raise ConfigurationError(
            f"model binding {definition.model!r} is in-process (protocol "
            f"{definition.protocol!r}): it takes no api_key or credential_provider"
        )


class ModelBinding:
    """One model, and the provider that serves it.

    Build a definition with a factory (``ModelBinding.llm(...)``, ``.embed(...)``,
    ``.image(...)``...); wrap your own provider with ``ModelBinding(provider=...)`` or
    ``ModelBinding.embed(provider=...)``. The binding is an async context manager that closes
    what it built on exit.
    """

    def __init__(
        self,
        *,
        provider: Any = None,
        model: str | None = None,
        protocol: str | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        credential_provider: CredentialProvider | None = None,
        client_timeout: float | None = None,
        client_max_retries: int | None = None,
        params: Mapping[str, Any] | None = None,
        retry: RetryOptions | None = None,
        provider_name: str | None = None,
        api_key_env: str | None = None,
        default_headers: Mapping[str, str] | None = None,
        purpose: str = "llm",
        input_kinds: Iterable[str] | None = None,
    ) -> None:
        spec = purpose_of(purpose)
        self.purpose = purpose
        self._input_kinds = _chat_input_kinds(purpose, input_kinds)
        self._definition: Definition | None
        self._supplied: Any
        if provider is not None:
            given = {
                "protocol": protocol,
                "api_key": api_key,
                "base_url": base_url,
                "credential_provider": credential_provider,
                "client_timeout": client_timeout,
                "client_max_retries": client_max_retries,
                "params": params,
                "retry": retry,
                "api_key_env": api_key_env,
                "default_headers": default_headers,
            }
            _check_supplied(provider, spec, given)
            self._supplied = provider
            self._definition = None
            self.model = model or getattr(provider, "model_name", None) or type(provider).__name__
            self._loop_agnostic = bool(getattr(provider, "loop_agnostic", False))
        else:
            self._supplied = None
            self._definition = validated_definition(
                purpose=purpose,
                model=model,
                protocol=protocol,
                base_url=base_url,
                client_timeout=client_timeout,
                client_max_retries=client_max_retries,
                params=params,
                retry=retry,
                provider_name=provider_name,
                api_key_env=api_key_env,
                default_headers=default_headers,
            )
            _check_credentials(self._definition, api_key, credential_provider)
            self.model = self._definition.model
            self._loop_agnostic = self._definition.loop_agnostic
        self._api_key = api_key
        self._credential_provider = credential_provider
        self._owner_loop: asyncio.AbstractEventLoop | None = None
        self._current: _Slot | None = None
        self._retired: list[_Slot] = []
        self._supplied_leases = 0
        self._build_lock: asyncio.Lock | None = None
        # a loop-agnostic provider may be built from any loop or thread
        self._thread_lock = threading.Lock() if self._loop_agnostic else None
        self._jobs: set[asyncio.Future[Any]] = set()
        self.providers_built = 0
        self.providers_closed = 0

    # constructors -----------------------------------------------------------------------------

    @classmethod
    def llm(
        cls,
        *,
        model: str | None = None,
        protocol: str | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        credential_provider: CredentialProvider | None = None,
        client_timeout: float | None = None,
        client_max_retries: int | None = None,
        params: Mapping[str, Any] | None = None,
        retry: RetryOptions | None = None,
        provider: Model | None = None,
        provider_name: str | None = None,
        api_key_env: str | None = None,
        default_headers: Mapping[str, str] | None = None,
        input_kinds: Iterable[str] | None = None,
    ) -> ModelBinding:
        """A chat model binding.

        Either a definition: ``model`` and ``protocol`` (``"openai"``, the default, for any
        Chat Completions endpoint, ``"openai-responses"`` for the Responses API, or
        ``"anthropic"``), with ``api_key`` (else
        ``credential_provider``, else the environment variable ``api_key_env``, by default
        ``OPENAI_API_KEY``/``ANTHROPIC_API_KEY``) and ``base_url`` (else the SDK default).
        ``client_timeout`` (seconds, every HTTP phase) and ``client_max_retries`` configure
        the SDK client; None keeps the SDK defaults (600 s, 2 retries). ``params`` go into
        every request, except the runtime's own ``prompt_caching`` (default true: see
        docs/providers.md). ``retry`` is the runtime's retry of a failed call on this binding
        before failing over (none by default: the SDK already retried).

        Or a supplied provider: ``provider=`` (with an optional ``model`` label). It is never
        closed or rebuilt by the binding and takes none of the definition's options.

        ``input_kinds`` (either way) narrows what the model is sent, such as ``{"text"}`` for
        a text-only model behind a wire that carries images (``agent_runtime.input_kinds``).
        """
        return cls(
            provider=provider,
            model=model,
            protocol=protocol,
            api_key=api_key,
            base_url=base_url,
            credential_provider=credential_provider,
            client_timeout=client_timeout,
            client_max_retries=client_max_retries,
            params=params,
            retry=retry,
            provider_name=provider_name,
            api_key_env=api_key_env,
            default_headers=default_headers,
            input_kinds=input_kinds,
        )

    @classmethod
    def system_one(cls, **options: Unpack[BindingOptions]) -> ModelBinding:
        """A System One binding: a small, fast chat model (protocol ``openai`` or
        ``anthropic``, the options of ``llm``) for the runtime's quick decisions, such as which
        skill fits a prompt (``skill_dispatch``)."""
        return cls(purpose="system_one", **options)

    @classmethod
    def image(cls, **options: Unpack[BindingOptions]) -> ModelBinding:
        """An image generation binding (``images/generations`` of an OpenAI-compatible API).

        Takes the options of ``llm``; ``params`` go into every request (``quality``...).
        """
        return cls(purpose="image", **options)

    @classmethod
    def video(cls, **options: Unpack[BindingOptions]) -> ModelBinding:
        """A video generation binding (the ``videos`` job API: create, poll, download)."""
        return cls(purpose="video", **options)

    @classmethod
    def tts(cls, **options: Unpack[BindingOptions]) -> ModelBinding:
        """A text-to-speech binding (``audio/speech``)."""
        return cls(purpose="tts", **options)

    @classmethod
    def asr(cls, **options: Unpack[BindingOptions]) -> ModelBinding:
        """A speech recognition binding (``audio/transcriptions``)."""
        return cls(purpose="asr", **options)

    @classmethod
    def embed(cls, **options: Unpack[BindingOptions]) -> ModelBinding:
        """An embedding binding: ``embeddings`` of an OpenAI-compatible API, or in-process.

        ``protocol="local"`` builds a ``LocalEmbeddingProvider`` for ``model`` (a directory or
        an installed model's name; ``params`` are its options, such as ``backend``); or supply
        one with ``provider=``.
        """
        return cls(purpose="embed", **options)

    @classmethod
    def rerank(cls, **options: Unpack[BindingOptions]) -> ModelBinding:
        """A rerank binding: ``POST {base_url}/rerank`` in the shape vLLM, Jina and Cohere
        serve, or in-process (``protocol="local"``, a ``LocalRerankProvider``)."""
        return cls(purpose="rerank", **options)

    def for_current_loop(self) -> ModelBinding:
        """A sibling with the same definition and no loop claim, for use on another loop.

        A definition-built binding gets a fresh provider on the sibling's first use. A supplied
        provider is shared only if it declares ``loop_agnostic = True``; otherwise build that
        provider inside the target loop and bind it there.
        """
        if self._supplied is not None:
            if not self._loop_agnostic:
                raise ConfigurationError(
                    f"the provider of binding {self.model!r} was supplied by the caller and is "
                    "bound to its loop; build a new provider inside the target loop instead"
                )
            return ModelBinding(
                provider=self._supplied,
                model=self.model,
                purpose=self.purpose,
                input_kinds=self._input_kinds,
            )
        definition = self._definition
        assert definition is not None
        clone = ModelBinding.__new__(ModelBinding)
        ModelBinding.__init__(
            clone,
            model=definition.model,
            protocol=definition.protocol,
            api_key=self._api_key,
            base_url=definition.base_url,
            credential_provider=self._credential_provider,
            client_timeout=definition.client_timeout,
            client_max_retries=definition.client_max_retries,
            params=definition.params,
            retry=definition.retry,
            provider_name=definition.provider_name,
            api_key_env=definition.api_key_env,
            default_headers=definition.default_headers,
            purpose=self.purpose,
            input_kinds=self._input_kinds,
        )
        return clone

    # diagnostics ----------------------------------------------------------------------------

    @property
    def owner_loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop this binding claimed on first use, or None."""
        return self._owner_loop

    @property
    def built(self) -> bool:
        """True while a provider this binding built is current (never for a supplied one)."""
        return self._current is not None

    @property
    def loop_agnostic(self) -> bool:
        """True when the provider owns nothing loop-bound: the binding claims no loop."""
        return self._loop_agnostic

    @property
    def protocol(self) -> str | None:
        """The definition's wire protocol (``"openai"``, ``"anthropic"``, ``"local"``); None
        for a supplied provider."""
        return self._definition.protocol if self._definition is not None else None

    @property
    def input_kinds(self) -> frozenset[str] | None:
        """What this binding lets its model be sent (``ModelBinding.llm(input_kinds=...)``), or
        None: what the model itself declares."""
        return self._input_kinds

    @property
    def provider_name(self) -> str:
        """Who serves the model (``"openai"``, ``"anthropic"``, a configured ``provider_name``);
        for a supplied provider its ``provider_name`` attribute, else its class name."""
        if self._definition is not None:
            return self._definition.provider_name
        named = getattr(self._supplied, "provider_name", None)
        return named if isinstance(named, str) and named else type(self._supplied).__name__

    @property
    def base_url(self) -> str | None:
        """The configured endpoint, or None for the SDK default or a supplied provider."""
        return self._definition.base_url if self._definition is not None else None

    @property
    def supplied(self) -> bool:
        """True if the caller supplied the provider."""
        return self._supplied is not None

    @property
    def provider(self) -> Any:
        """The supplied provider, or the current built one (None before the first build)."""
        if self._supplied is not None:
            return self._supplied
        return self._current.provider if self._current is not None else None

    @property
    def lease_count(self) -> int:
        """Calls in flight on any provider of this binding."""
        slots = [self._current, *self._retired] if self._current else list(self._retired)
        return self._supplied_leases + sum(slot.leases for slot in slots)

    @property
    def retired_count(self) -> int:
        """Providers replaced by a rotation and not closed yet (still serving a call)."""
        return sum(1 for slot in self._retired if not slot.closed)

    @property
    def job_count(self) -> int:
        """Media jobs running on this binding."""
        return len(self._jobs)

    def __repr__(self) -> str:
        parts = [f"model={self.model!r}"]
        if self.purpose != "llm":
            parts.append(f"purpose={self.purpose!r}")
        if self._definition is not None:
            parts.append(f"protocol={self._definition.protocol!r}")
            if self._definition.provider_name != self._definition.protocol:
                parts.append(f"provider={self._definition.provider_name!r}")
            if self._definition.base_url:
                parts.append(f"base_url={safe_url(self._definition.base_url)!r}")
        else:
            parts.append(f"provider={type(self._supplied).__name__}")
        parts.append(f"loop={_loop_id(self._owner_loop)}")
        parts.append(f"built={self.built}")
        return f"<ModelBinding {' '.join(parts)}>"

    # loop claim -----------------------------------------------------------------------------

    def _claim_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop_agnostic:
            return loop
        owner = self._owner_loop
        if owner is None:
            self._owner_loop = loop
        elif owner is not loop:
            raise LoopAffinityError(
                f"model binding {self.model!r} belongs to {_describe_loop(owner)} and was used "
                f"from loop {hex(id(loop))}; a provider's HTTP client cannot cross event loops. "
                "Use binding.for_current_loop() (or build the binding inside this loop), or "
                "aclose() it on its loop first",
                owner_loop=owner,
                current_loop=loop,
                model=self.model,
            )
        return loop

    def claim_loop(self) -> None:
        """Claim the running loop now (a synchronous first use, such as ``submit_image``);
        LoopAffinityError if another loop owns the binding."""
        self._claim_loop()

    # building -------------------------------------------------------------------------------

    async def _resolve_credential(self) -> str:
        source = self._credential_provider
        assert source is not None
        try:
            value = source()
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            from ..providers.errors import scrub_exception

            scrub_exception(exc, [self._api_key] if self._api_key else [])
            raise ConfigurationError(
                f"credential_provider of model binding {self.model!r} failed "
                f"({type(exc).__name__}); the current credential stays in use"
            ) from exc
        if not isinstance(value, str) or not value.strip():
            raise ConfigurationError(
                f"credential_provider of model binding {self.model!r} returned "
                f"{'an empty string' if isinstance(value, str) else type(value).__name__}, "
                "not a non-empty string; the current credential stays in use"
            )
        return value

    def _initial_key(self) -> str | None:
        definition = self._definition
        assert definition is not None
        if not definition.needs_key:
            return None
        if self._api_key is not None:
            return self._api_key
        env_name = definition.api_key_env or DEFAULT_KEY_ENV[definition.protocol]
        value = os.environ.get(env_name, "").strip()
        if not value:
            raise ConfigurationError(
                f"model binding {self.model!r} ({definition.provider_name}) has no API key: "
                f"pass api_key= or credential_provider=, or set {env_name}"
            )
        return value

    async def _build(self, api_key: str | None) -> Any:
        """Construct the provider in a worker thread.

        The first import of an SDK takes seconds and a client's construction (TLS trust store,
        lazily imported resources) tens of milliseconds: on the loop, that stalls every other
        task. Constructing an SDK client needs no running loop, like one built at import time.
        """
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(None, self._make_provider, api_key)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            future.add_done_callback(_close_orphan)
            raise

    def _make_provider(self, api_key: str | None) -> Any:
        """Construct the provider for ``api_key``, and do the one-time work of its first call
        (lazy imports). No network call; runs off the loop."""
        definition = self._definition
        assert definition is not None
        return PURPOSES[definition.purpose].build(definition, api_key)

    async def _ensure_built(self, *, fresh_credential: bool = False) -> _Slot:
        """The current slot, building it first if needed (one build at a time)."""
        if self._current is not None:
            return self._current
        if self._thread_lock is not None:
            # loop-agnostic: callers on several loops and threads, so a thread lock, taken
            # in a worker thread (an asyncio.Lock belongs to one loop)
            return await asyncio.to_thread(self._ensure_built_in_thread)
        if self._build_lock is None:
            self._build_lock = asyncio.Lock()
        async with self._build_lock:
            built = self._peek()
            if built is not None:  # built by another task while we waited
                return built
            if self._credential_provider is not None and (
                fresh_credential or self._api_key is None
            ):
                key: str | None = await self._resolve_credential()
            else:
                key = self._initial_key()
            slot = _Slot(await self._build(key))
            self._api_key = key
            self._current = slot
            self.providers_built += 1
            return slot

    def _ensure_built_in_thread(self) -> _Slot:
        assert self._thread_lock is not None
        with self._thread_lock:
            built = self._peek()
            if built is not None:
                return built
            slot = _Slot(self._make_provider(None))
            self._current = slot
            self.providers_built += 1
            return slot

    def _peek(self) -> _Slot | None:
        # a method call, so type narrowing does not outlive the await before it
        return self._current

    async def build_provider(self) -> Any:
        """The provider, built (on this loop) if needed. Prefer ``lease_provider``."""
        self._claim_loop()
        if self._supplied is not None:
            return self._supplied
        return (await self._ensure_built()).provider

    async def preflight(self) -> None:
        """Claim this loop and build the provider without a network call.

        Resolves ``credential_provider`` once if the provider is not built yet. Idempotent: a
        built provider is neither rebuilt nor closed.
        """
        self._claim_loop()
        if self._supplied is None:
            await self._ensure_built(fresh_credential=True)

    @asynccontextmanager
    async def lease_provider(self) -> AsyncIterator[Model]:
        """The provider for one call; a rotation cannot close it until the block exits."""
        async with self._lease() as provider:
            yield cast(Model, provider)

    @asynccontextmanager
    async def lease_as(self, kind: type[T]) -> AsyncIterator[T]:
        """``lease_provider`` for a capability: the provider as ``kind`` (a runtime-checkable
        protocol such as ``EmbeddingProvider``); ConfigurationError if it is not one."""
        async with self._lease() as provider:
            if not isinstance(provider, kind):
                raise ConfigurationError(
                    f"the provider of binding {self.model!r} ({type(provider).__name__}) is "
                    f"not a {kind.__name__}"
                )
            yield provider

    @asynccontextmanager
    async def _lease(self) -> AsyncIterator[Any]:
        self._claim_loop()
        if self._supplied is not None:
            self._supplied_leases += 1
            try:
                yield self._supplied
            finally:
                self._supplied_leases -= 1
            return
        slot = await self._ensure_built()
        slot.leases += 1
        try:
            yield slot.provider
        finally:
            slot.leases -= 1

    # media jobs -------------------------------------------------------------------------------

    def track_job(self, task: asyncio.Future[Any]) -> None:
        """Count ``task`` (a media job) as running on this binding until it ends; ``aclose``
        cancels and awaits it before closing the providers."""
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)

    async def _cancel_jobs(self) -> None:
        if not self._jobs:
            return
        loop = asyncio.get_running_loop()
        here: list[asyncio.Future[Any]] = []
        for task in list(self._jobs):
            if task.get_loop() is loop:
                task.cancel()
                here.append(task)
            else:  # a loop-agnostic provider's job on another loop: only its loop can cancel it
                with contextlib.suppress(RuntimeError):
                    task.get_loop().call_soon_threadsafe(task.cancel)
        if here:
            # a job that ignores its cancellation delays this; a task cannot be killed
            await asyncio.wait(here)

    # rotation and close -----------------------------------------------------------------------

    async def arefresh(self) -> None:
        """Rotate the credential: resolve ``credential_provider``, build, swap, retire.

        The credential is resolved first; a failure or an empty value raises ValueError
        (ConfigurationError) and changes nothing. The new provider is built before the swap;
        the old one retires and is closed here if no call holds it, else by the first refresh
        or ``aclose()`` after its last call ended. A binding not built yet only stores the new
        credential for its first build. Without a ``credential_provider`` nothing is rebuilt
        (only retired providers are closed); a supplied provider is left alone.
        """
        if self._supplied is not None:
            return
        if self._current is not None:
            self._claim_loop()
        if self._credential_provider is None:
            # nothing can produce a fresher credential: only finish earlier rotations
            await self._close_idle_retired()
            return
        if self._build_lock is None:
            self._build_lock = asyncio.Lock()
        async with self._build_lock:  # one rotation (or first build) at a time, in order
            key = await self._resolve_credential()
            current = self._peek()
            if current is None:
                self._api_key = key
                return
            new_slot = _Slot(await self._build(key))
            self.providers_built += 1
            self._current = new_slot
            self._api_key = key
            current.retired = True
            self._retired.append(current)
        await self._close_idle_retired()

    async def _close_idle_retired(self) -> None:
        idle = [slot for slot in self._retired if slot.leases == 0]
        self._retired = [slot for slot in self._retired if slot.leases > 0]
        await self._close_slots(idle)

    async def _close_slots(self, slots: Iterable[_Slot]) -> None:
        errors: list[BaseException] = []
        for slot in slots:
            if slot.closed:
                continue
            slot.closed = True
            self.providers_closed += 1
            aclose = getattr(slot.provider, "aclose", None)
            if aclose is None:
                continue
            try:
                await aclose()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    async def aclose(self) -> None:
        """Cancel and await the media jobs still running on this binding, then close every
        provider it built and release the loop claim.

        A supplied provider is never closed; the claim on its loop is kept unless it is loop
        agnostic. The binding can be used again afterwards: it rebuilds on its next use.
        """
        await self._cancel_jobs()
        if self._supplied is not None:
            if self._loop_agnostic:
                self._owner_loop = None
            return
        slots = [*self._retired, *([self._current] if self._current is not None else [])]
        self._current = None
        self._retired = []
        self._owner_loop = None
        self._build_lock = None
        await self._close_slots(slots)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()
