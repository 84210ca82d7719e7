"""Model bindings: a model definition, the provider built from it, and failover chains.

A ``ModelBinding`` is either a *definition* (``ModelBinding.llm(model=..., protocol=...,
api_key=...)``), whose provider it builds lazily, rotates and closes, or a wrapper around a
provider the caller supplies (``ModelBinding(provider=...)``), which it never closes.

Lifecycle of one binding::

    constructed ──first use / preflight()──▶ built, owner_loop claimed
        ▲                                        │ arefresh(): new provider built, then swapped;
        │                                        │ the old one retires and closes once idle
        └──────────────── aclose() ◀─────────────┘ (closes what it built, releases the loop)

A provider wraps an async HTTP client that belongs to one event loop, so a binding claims the
loop of its first use and raises ``LoopAffinityError`` on any other. ``for_current_loop()``
gives a sibling for another loop. Every model call holds a *lease* on the provider it captured
(``async with binding.lease_provider() as provider``); a rotation never closes a provider that
still has one.

``ModelBindings(llm=[primary, fallback, ...])`` is the failover chain the agent walks on a
retryable ``ProviderError``; ``binding_from_spec`` and ``bindings_from_spec`` build bindings
from setting strings such as ``openai:gpt-4o-mini`` or ``deepseek``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeAlias, cast
from urllib.parse import urlsplit

from .errors import ConfigurationError, LoopAffinityError
from .model import Model, RetryOptions

if TYPE_CHECKING:
    from typing import Self

__all__ = [
    "DEFAULT_KEY_ENV",
    "CredentialProvider",
    "ModelBinding",
    "ModelBindings",
    "PreflightError",
    "binding_from_spec",
    "bindings_from_spec",
]

CredentialProvider: TypeAlias = Callable[[], "str | Awaitable[str]"]

_PROTOCOLS: tuple[str, ...] = ("openai", "anthropic")

#: Environment variable read for the API key of a definition with no ``api_key`` or
#: ``credential_provider``, by protocol.
DEFAULT_KEY_ENV: Mapping[str, str] = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
}


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

    def __init__(self, provider: Model) -> None:
        self.provider = provider
        self.leases = 0
        self.retired = False
        self.closed = False


@dataclass(frozen=True, slots=True)
class _Definition:
    """What a definition-built binding needs to (re)build its provider. Holds no key."""

    model: str
    protocol: str
    base_url: str | None
    client_timeout: float | None
    client_max_retries: int | None
    params: Mapping[str, Any]
    retry: RetryOptions | None
    provider_name: str
    api_key_env: str | None
    default_headers: Mapping[str, str] | None = field(repr=False)


_BACKGROUND: set[asyncio.Future[Any]] = set()


def _close_orphan(future: asyncio.Future[Model]) -> None:
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


class ModelBinding:
    """One model, and the provider that serves it.

    Build a definition with ``ModelBinding.llm(...)``; wrap your own provider with
    ``ModelBinding(provider=...)``. The binding is an async context manager that closes what it
    built on exit.
    """

    def __init__(
        self,
        *,
        provider: Model | None = None,
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
    ) -> None:
        self._definition: _Definition | None
        self._supplied: Model | None
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
            rejected = sorted(name for name, value in given.items() if value is not None)
            if rejected:
                raise ConfigurationError(
                    f"{', '.join(rejected)} cannot be combined with provider=: configure the "
                    "provider (and its client) directly"
                )
            if not callable(getattr(provider, "stream", None)):
                raise ConfigurationError(f"{type(provider).__name__} has no stream(request)")
            self._supplied = provider
            self._definition = None
            self.model = model or getattr(provider, "model_name", None) or type(provider).__name__
        else:
            self._supplied = None
            self._definition = _validated_definition(
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
            if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
                raise ConfigurationError("api_key must be a non-empty string or None")
            if credential_provider is not None and not callable(credential_provider):
                raise ConfigurationError("credential_provider must be a callable")
            self.model = self._definition.model
        self._api_key = api_key
        self._credential_provider = credential_provider
        self._loop_agnostic = bool(getattr(provider, "loop_agnostic", False))
        self._owner_loop: asyncio.AbstractEventLoop | None = None
        self._current: _Slot | None = None
        self._retired: list[_Slot] = []
        self._supplied_leases = 0
        self._build_lock: asyncio.Lock | None = None
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
    ) -> ModelBinding:
        """A chat model binding.

        Either a definition: ``model`` and ``protocol`` (``"openai"``, the default, for any
        Chat Completions endpoint, or ``"anthropic"``), with ``api_key`` (else
        ``credential_provider``, else the environment variable ``api_key_env``, by default
        ``OPENAI_API_KEY``/``ANTHROPIC_API_KEY``) and ``base_url`` (else the SDK default).
        ``client_timeout`` (seconds, every HTTP phase) and ``client_max_retries`` configure
        the SDK client; None keeps the SDK defaults (600 s, 2 retries). ``params`` go into
        every request. ``retry`` is the runtime's retry of a failed call on this binding
        before failing over (none by default: the SDK already retried).

        Or a supplied provider: ``provider=`` (with an optional ``model`` label). It is never
        closed or rebuilt by the binding and takes none of the definition's options.
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
        )

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
            return ModelBinding(provider=self._supplied, model=self.model)
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
    def protocol(self) -> str | None:
        """``"openai"`` or ``"anthropic"`` for a definition; None for a supplied provider."""
        return self._definition.protocol if self._definition is not None else None

    @property
    def base_url(self) -> str | None:
        """The configured endpoint, or None for the SDK default or a supplied provider."""
        return self._definition.base_url if self._definition is not None else None

    @property
    def supplied(self) -> bool:
        """True if the caller supplied the provider."""
        return self._supplied is not None

    @property
    def provider(self) -> Model | None:
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

    def __repr__(self) -> str:
        parts = [f"model={self.model!r}"]
        if self._definition is not None:
            parts.append(f"protocol={self._definition.protocol!r}")
            if self._definition.provider_name != self._definition.protocol:
                parts.append(f"provider={self._definition.provider_name!r}")
            if self._definition.base_url:
                parts.append(f"base_url={_safe_url(self._definition.base_url)!r}")
        else:
            parts.append(f"provider={type(self._supplied).__name__}")
        parts.append(f"loop={_loop_id(self._owner_loop)}")
        parts.append(f"built={self.built}")
        return f"<ModelBinding {' '.join(parts)}>"

    # loop claim -----------------------------------------------------------------------------

    def _claim_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._supplied is not None and self._loop_agnostic:
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

    # building -------------------------------------------------------------------------------

    async def _resolve_credential(self) -> str:
        source = self._credential_provider
        assert source is not None
        try:
            value = source()
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            from .providers.errors import scrub_exception

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

    def _initial_key(self) -> str:
        definition = self._definition
        assert definition is not None
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

    async def _build(self, api_key: str) -> Model:
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

    def _make_provider(self, api_key: str) -> Model:
        """Construct the provider for ``api_key``, and do the one-time work of its first call
        (lazy imports). No network call; runs off the loop."""
        definition = self._definition
        assert definition is not None
        provider: Any
        common: dict[str, Any] = {
            "api_key": api_key,
            "base_url": definition.base_url,
            "timeout": definition.client_timeout,
            "max_retries": definition.client_max_retries,
            "params": definition.params,
            "retry": definition.retry,
            "provider_name": definition.provider_name,
            "default_headers": definition.default_headers,
        }
        if definition.protocol == "anthropic":
            from .providers.anthropic import AnthropicModel

            provider = AnthropicModel(definition.model, **common)
        else:
            from .providers.openai import OpenAIModel

            provider = OpenAIModel(definition.model, **common)
        provider.prepare()
        return cast(Model, provider)

    async def _ensure_built(self, *, fresh_credential: bool = False) -> _Slot:
        """The current slot, building it first if needed (one build at a time)."""
        if self._current is not None:
            return self._current
        if self._build_lock is None:
            self._build_lock = asyncio.Lock()
        async with self._build_lock:
            built = self._peek()
            if built is not None:  # built by another task while we waited
                return built
            if self._credential_provider is not None and (
                fresh_credential or self._api_key is None
            ):
                key = await self._resolve_credential()
            else:
                key = self._initial_key()
            slot = _Slot(await self._build(key))
            self._api_key = key
            self._current = slot
            self.providers_built += 1
            return slot

    def _peek(self) -> _Slot | None:
        # a method call, so type narrowing does not outlive the await before it
        return self._current

    async def build_provider(self) -> Model:
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
        """Close every provider this binding built, and release the loop claim.

        A supplied provider is never closed; the claim on its loop is kept unless it is loop
        agnostic. The binding can be used again afterwards: it rebuilds on its next use.
        """
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


class ModelBindings:
    """Bindings by purpose. ``llm`` is the failover chain: primary first, then fallbacks.

    The agent tries the primary on every call and moves to the next binding only on a
    retryable ProviderError that happened before any of the call's text reached the consumer.
    """

    def __init__(self, *, llm: ModelBinding | Model | Sequence[ModelBinding | Model]) -> None:
        items: Sequence[ModelBinding | Model] = (
            llm if isinstance(llm, Sequence) and not isinstance(llm, ModelBinding) else [llm]
        )
        self.llm: list[ModelBinding] = [
            item if isinstance(item, ModelBinding) else ModelBinding(provider=item)
            for item in items
        ]
        if not self.llm:
            raise ConfigurationError("ModelBindings needs at least one llm binding")

    def __repr__(self) -> str:
        return f"<ModelBindings llm={self.llm!r}>"

    @property
    def primary(self) -> ModelBinding:
        """The first llm binding."""
        return self.llm[0]

    def for_current_loop(self) -> ModelBindings:
        """Siblings of every binding, for use on another loop (see ModelBinding)."""
        return ModelBindings(llm=[binding.for_current_loop() for binding in self.llm])

    async def preflight(self) -> None:
        """Build every provider on this loop, without a network call.

        Resolves each ``credential_provider`` once. The first binding that fails raises a
        ``PreflightError`` naming it (``llm[INDEX]`` and its model); a loop conflict stays a
        ``LoopAffinityError`` with its diagnostics, labelled the same way.
        """
        for index, binding in enumerate(self.llm):
            label = f"llm[{index}] (model {binding.model!r})"
            try:
                await binding.preflight()
            except LoopAffinityError as exc:
                raise LoopAffinityError(
                    f"{label}: {exc}",
                    owner_loop=exc.owner_loop,
                    current_loop=exc.current_loop,
                    model=exc.model,
                ) from exc
            except Exception as exc:
                raise PreflightError(
                    f"{label} failed preflight: {exc}", index=index, model=binding.model
                ) from exc

    async def arefresh(self) -> None:
        """Rotate the credential of every binding (see ``ModelBinding.arefresh``)."""
        for binding in self.llm:
            await binding.arefresh()

    async def aclose(self) -> None:
        """Close every binding; the first failure is raised after all were closed."""
        errors: list[Exception] = []
        for binding in self.llm:
            try:
                await binding.aclose()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


# validation -----------------------------------------------------------------------------------


def _validated_definition(
    *,
    model: str | None,
    protocol: str | None,
    base_url: str | None,
    client_timeout: float | None,
    client_max_retries: int | None,
    params: Mapping[str, Any] | None,
    retry: RetryOptions | None,
    provider_name: str | None,
    api_key_env: str | None,
    default_headers: Mapping[str, str] | None,
) -> _Definition:
    if not isinstance(model, str) or not model.strip():
        raise ConfigurationError("a model binding needs model= (or provider=)")
    protocol = protocol or "openai"
    if protocol not in _PROTOCOLS:
        raise ConfigurationError(
            f"unknown protocol {protocol!r}: use 'openai' (any Chat Completions endpoint) or "
            "'anthropic'"
        )
    if base_url is not None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigurationError(
                f"base_url of model {model!r} must be an http(s) URL, got {_safe_url(base_url)!r}"
            )
    if client_timeout is not None and (isinstance(client_timeout, bool) or not client_timeout > 0):
        raise ConfigurationError("client_timeout must be a positive number of seconds or None")
    if client_max_retries is not None and (
        isinstance(client_max_retries, bool)
        or not isinstance(client_max_retries, int)
        or client_max_retries < 0
    ):
        raise ConfigurationError("client_max_retries must be an integer >= 0 or None")
    if retry is not None and not isinstance(retry, RetryOptions):
        raise ConfigurationError("retry must be a RetryOptions")
    return _Definition(
        model=model,
        protocol=protocol,
        base_url=base_url,
        client_timeout=float(client_timeout) if client_timeout is not None else None,
        client_max_retries=client_max_retries,
        params=dict(params or {}),
        retry=retry,
        provider_name=provider_name or protocol,
        api_key_env=api_key_env,
        default_headers=dict(default_headers) if default_headers else None,
    )


def _safe_url(url: str) -> str:
    """``url`` without user information (``user:password@``) or query string."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return parts._replace(netloc=netloc, query="", fragment="").geturl()


# settings strings -----------------------------------------------------------------------------


def binding_from_spec(spec: str, **env: Any) -> ModelBinding:
    """A binding from a setting string.

    Forms: ``demo`` (the offline demo model), ``openai:MODEL``, ``anthropic:MODEL``, a preset
    name (``deepseek``, ``groq``, ``together``, ``openrouter``, ``ollama``, ``vllm``, ...) or
    ``PRESET:MODEL``. Upper-case keywords override the environment (``OPENAI_API_KEY``,
    ``OPENAI_BASE_URL``, ``ANTHROPIC_API_KEY``, ``ANTHROPIC_BASE_URL``, a preset's key variable
    such as ``DEEPSEEK_API_KEY``); what is not given is read from ``os.environ``. Lower-case
    keywords are binding options: ``client_timeout``, ``client_max_retries``, ``params``,
    ``retry``, ``credential_provider``.
    """
    from . import presets

    overrides = {key: value for key, value in env.items() if key.isupper()}
    options = {key: value for key, value in env.items() if not key.isupper()}

    def lookup(name: str) -> str | None:
        value = overrides[name] if name in overrides else os.environ.get(name)
        if value is None:
            return None
        text = str(value).strip()
        return text or None

    text = spec.strip()
    if not text:
        raise ConfigurationError("empty model setting")
    prefix, _, model = text.partition(":")
    prefix = prefix.strip().lower()
    model = model.strip()
    if prefix == "demo" and not model:
        if options:
            raise ConfigurationError(
                f"the demo model takes no binding options ({', '.join(sorted(options))})"
            )
        from .providers.demo import DemoModel

        demo_options: dict[str, float] = {}
        delay = lookup("AGENT_DEMO_TOKEN_DELAY")
        if delay is not None:
            demo_options["token_delay"] = float(delay)
        slow = lookup("AGENT_DEMO_SLOW_SECONDS")
        if slow is not None:
            demo_options["slow_seconds"] = float(slow)
        return ModelBinding(provider=DemoModel(**demo_options))
    if prefix in ("openai", "anthropic") and model:
        upper = prefix.upper()
        return ModelBinding.llm(
            model=model,
            protocol=prefix,
            api_key=lookup(f"{upper}_API_KEY"),
            base_url=lookup(f"{upper}_BASE_URL"),
            **options,
        )
    preset = presets.get(prefix)
    if preset is None:
        raise ConfigurationError(
            f"unknown model setting {spec!r}: use 'demo', 'openai:MODEL', 'anthropic:MODEL', "
            f"or a preset ({', '.join(presets.names())}), optionally as 'PRESET:MODEL'"
        )
    key_env = presets.key_env(prefix)
    preset_options: dict[str, Any] = dict(options)
    if model:
        preset_options["model"] = model
    if key_env is not None and "api_key" not in preset_options:
        api_key = lookup(key_env)
        if api_key is not None:
            preset_options["api_key"] = api_key
    return preset(**preset_options)


def bindings_from_spec(
    model: str, fallbacks: str | Sequence[str] = (), **env: Any
) -> ModelBindings:
    """``ModelBindings`` for a primary setting and its fallbacks (a comma-separated string or a
    list), each parsed by ``binding_from_spec`` with the same ``env``."""
    if isinstance(fallbacks, str):
        fallbacks = fallbacks.split(",")
    specs = [model, *(item for item in fallbacks if item.strip())]
    return ModelBindings(llm=[binding_from_spec(item, **env) for item in specs])
