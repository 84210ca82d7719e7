"""``ModelBindings``: a failover chain of bindings for each purpose."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeAlias

from ..errors import ConfigurationError, LoopAffinityError
from .binding import ModelBinding, PreflightError
from .purposes import PURPOSES, purpose_of

if TYPE_CHECKING:
    from typing import Self

__all__ = ["BindingLike", "ModelBindings"]


BindingLike: TypeAlias = "ModelBinding | Any | Sequence[ModelBinding | Any]"


class ModelBindings:
    """Bindings by purpose: one failover chain each, primary first, then fallbacks.

    ``llm`` is the chat chain the agent walks; ``system_one`` a small, fast chat model the
    runtime asks for quick decisions (which skill fits a prompt); ``image``, ``video``,
    ``tts``, ``asr``, ``embed`` and ``rerank`` serve the capability calls
    (``agent_runtime.capabilities``) the same way. Each takes a binding, a provider (wrapped
    for that purpose) or a list of them.
    A call tries the primary every time and moves to the next binding only on a retryable
    ProviderError that happened before any of the call's output reached the consumer.
    """

    def __init__(
        self,
        *,
        llm: BindingLike | None = None,
        system_one: BindingLike | None = None,
        image: BindingLike | None = None,
        video: BindingLike | None = None,
        tts: BindingLike | None = None,
        asr: BindingLike | None = None,
        embed: BindingLike | None = None,
        rerank: BindingLike | None = None,
    ) -> None:
        given = {
            "llm": llm,
            "system_one": system_one,
            "image": image,
            "video": video,
            "tts": tts,
            "asr": asr,
            "embed": embed,
            "rerank": rerank,
        }
        self._chains: dict[str, list[ModelBinding]] = {}
        for purpose, value in given.items():
            if value is None:
                continue
            chain = [_as_binding(item, purpose) for item in _items(value)]
            if not chain:
                raise ConfigurationError(f"ModelBindings needs at least one {purpose} binding")
            self._chains[purpose] = chain
        if not self._chains:
            raise ConfigurationError("ModelBindings needs at least one llm binding")

    def __repr__(self) -> str:
        chains = " ".join(f"{purpose}={chain!r}" for purpose, chain in self._chains.items())
        return f"<ModelBindings {chains}>"

    def for_purpose(self, purpose: str) -> list[ModelBinding]:
        """The chain of ``purpose`` (empty when none is configured)."""
        purpose_of(purpose)
        return self._chains.get(purpose, [])

    @property
    def purposes(self) -> tuple[str, ...]:
        """The purposes that have bindings, in their canonical order."""
        return tuple(name for name in PURPOSES if name in self._chains)

    def __iter__(self) -> Iterator[tuple[str, int, ModelBinding]]:
        """Every binding, as ``(purpose, index, binding)``."""
        for purpose in self.purposes:
            for index, binding in enumerate(self._chains[purpose]):
                yield purpose, index, binding

    @property
    def llm(self) -> list[ModelBinding]:
        """The chat chain."""
        return self._chains.get("llm", [])

    @property
    def system_one(self) -> list[ModelBinding]:
        """The System One chain: a small, fast chat model (skill dispatch)."""
        return self._chains.get("system_one", [])

    @property
    def image(self) -> list[ModelBinding]:
        """The image generation chain."""
        return self._chains.get("image", [])

    @property
    def video(self) -> list[ModelBinding]:
        """The video generation chain."""
        return self._chains.get("video", [])

    @property
    def tts(self) -> list[ModelBinding]:
        """The text-to-speech chain."""
        return self._chains.get("tts", [])

    @property
    def asr(self) -> list[ModelBinding]:
        """The speech recognition chain."""
        return self._chains.get("asr", [])

    @property
    def embed(self) -> list[ModelBinding]:
        """The embedding chain."""
        return self._chains.get("embed", [])

    @property
    def rerank(self) -> list[ModelBinding]:
        """The rerank chain."""
        return self._chains.get("rerank", [])

    @property
    def primary(self) -> ModelBinding:
        """The first llm binding."""
        if not self.llm:
            raise ConfigurationError("these ModelBindings have no llm binding")
        return self.llm[0]

    def for_current_loop(self) -> ModelBindings:
        """Siblings of every binding, for use on another loop (see ModelBinding)."""
        return ModelBindings(
            **{
                purpose: [binding.for_current_loop() for binding in chain]
                for purpose, chain in self._chains.items()
            }
        )

    async def preflight(self) -> None:
        """Build every provider of every purpose on this loop, without a network call.

        Resolves each ``credential_provider`` once. The first binding that fails raises a
        ``PreflightError`` naming it (``llm[INDEX]``, ``embed[INDEX]``... and its model); a loop
        conflict stays a ``LoopAffinityError`` with its diagnostics, labelled the same way.
        """
        for purpose, index, binding in self:
            label = f"{purpose}[{index}] (model {binding.model!r})"
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
                    f"{label} failed preflight: {exc}",
                    index=index,
                    model=binding.model,
                    purpose=purpose,
                ) from exc

    async def arefresh(self) -> None:
        """Rotate the credential of every binding (see ``ModelBinding.arefresh``)."""
        for _purpose, _index, binding in self:
            await binding.arefresh()

    async def aclose(self) -> None:
        """Close every binding; the first failure is raised after all were closed."""
        errors: list[Exception] = []
        for _purpose, _index, binding in self:
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


def _items(value: Any) -> Sequence[Any]:
    if isinstance(value, Sequence) and not isinstance(value, (ModelBinding, str)):
        return value
    return [value]


def _as_binding(item: Any, purpose: str) -> ModelBinding:
    if isinstance(item, ModelBinding):
        # a System One model is a chat model: a chat binding serves as one
        if item.purpose != purpose and not (purpose == "system_one" and item.purpose == "llm"):
            raise ConfigurationError(
                f"binding {item.model!r} is a {item.purpose} binding, given as {purpose}: build "
                f"it with ModelBinding.{purpose}(...)"
            )
        return item
    return ModelBinding(provider=item, purpose=purpose)
