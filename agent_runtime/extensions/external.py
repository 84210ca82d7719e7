"""Answers from outside a run, and the base class of extensions that pause a run for one.

Some runs cannot go on until somebody outside them answers: a person approves a tool call, a
front end returns a choice. ``ExternalEvent`` is the answer's envelope; ``ExternalEventExtension``
does the bookkeeping every such extension needs, so a subclass only says what to ask and what
to do with the reply::

    run task (event loop)                         any thread
    ─────────────────────                         ──────────
    async with self._wait_for_external_event(context, call.id) as wait:
        │ 1. the wait is registered under (session, call id)
        │ 2. body: context.emit(question) ───────► UI shows the question
        │                                            │
        │                                            ▼
        │                                 agent.emit_external_event(answer, config=...)
        │                                   └─ accept(): match, claim once (lock),
        │ ◄──────── result set on the run's loop ─── wake the waiter on its own loop
        │ 3. leaving the body: await the answer (phase WAITING), stage it
    tool runs ── self._take_external_event(context) pops the staged answer

Registering before the body runs means an answer that arrives before the question's event has
even reached the consumer still finds its waiter.

Every way a wait can end removes its entry: the answer, expiry, the run's cancellation, the
run's failure and an exception in the body. ``pending_count()`` and ``staged_count()`` let
tests check it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import threading
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from ..deadlines import Deadline, Deadlines
from ..errors import AgentRuntimeError
from ..messages import AssistantMessage, ToolCall
from ..tools.base import current_tool_call_id
from .base import AgentExtension, ToolOutcome
from .events import ExtensionEvent, ExternalEvent, RunCancelledEvent

if TYPE_CHECKING:
    from ..run_context import AgentRunConfig, AgentRunContext

__all__ = [
    "ExternalEvent",
    "ExternalEventExpiredError",
    "ExternalEventExtension",
    "ExternalWait",
]


class ExternalEventExpiredError(AgentRuntimeError, TimeoutError):
    """Nobody answered before the wait's ``timeout`` ran out; a later answer is refused."""

    def __init__(self, correlation_id: str, timeout: float) -> None:
        super().__init__(f"no answer for {correlation_id!r} arrived within {timeout:g} s")
        self.correlation_id = correlation_id
        self.timeout = timeout


@dataclass(frozen=True, slots=True)
class ExternalWait:
    """What ``_wait_for_external_event`` yields: the wait's id and when it expires (UTC)."""

    correlation_id: str
    expires_at: datetime | None


class _State(enum.Enum):
    OPEN = "open"  # registered, nobody answered yet
    SUSPENDED = "suspended"  # the run is being handed over: no answer is taken here
    CLAIMED = "claimed"  # an answer won; its delivery to the loop is scheduled
    CLOSED = "closed"  # over: answered and staged, expired, cancelled or failed


class _Wait(Deadline["_Wait"]):
    """One registered wait. ``state`` only changes under the extension's lock.

    Its waiter awaits ``future`` itself (no task or coroutine of the wait's own): the answer
    resolves it, and its expiry at ``deadline`` on the loop's clock fails it with
    ``ExternalEventExpiredError``. Many runs may wait at once, so this is all a wait holds:
    it is its own entry among the loop's shared ``Deadlines`` (with a timeout), not a timer.
    """

    __slots__ = (
        "context",
        "correlation_id",
        "deadline",
        "future",
        "names",
        "state",
        "subject",
        "timeout",
    )

    def __init__(
        self,
        context: AgentRunContext,
        correlation_id: str,
        names: frozenset[str],
        future: asyncio.Future[ExternalEvent],
        timeout: float | None,
        expiry: tuple[Deadlines, float, Callable[[_Wait], object]] | None,
        subject: object = None,
    ) -> None:
        if expiry is None:
            self._callback = None  # an entry never scheduled
            self._arg = None
            self.deadline: float | None = None
        else:
            owner, when, callback = expiry
            super().__init__(owner, when, callback, self)
            self.deadline = when
        self.context = context
        self.correlation_id = correlation_id
        self.names = names
        self.future = future
        self.timeout = timeout
        self.subject = subject
        self.state = _State.OPEN


def _resolve(future: asyncio.Future[ExternalEvent], event: ExternalEvent) -> None:
    if not future.done():
        future.set_result(event)


def _abort(future: asyncio.Future[ExternalEvent], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.cancel()
    else:
        future.set_exception(error)


def _on_loop(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """Run ``callback`` now if we are on ``loop``'s thread, else hand it to that loop.

    Futures are not thread-safe: only their own loop may complete them. Raises RuntimeError if
    the loop is already closed.
    """
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        callback()
    else:
        loop.call_soon_threadsafe(callback)


def _utc_deadline(timeout: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=timeout)


class ExternalEventExtension(AgentExtension):
    """Base for extensions that pause a run until an ``ExternalEvent`` answers it.

    Args:
        response_event_name: the event name (or names) this extension accepts.
        correlation_field: the payload key whose value names the wait an answer is for,
            usually ``"tool_call_id"``; it must equal the id given to the wait helper.

    Answers are matched on the session of the ``config`` given to ``accept`` plus the
    correlation id, so two sessions may use the same id without seeing each other's answers.
    When ``config.request_id`` is set it must also equal the waiting run's own request id.

    A subclass owns the question (the event it emits), the answer's business rules
    (``_is_valid_answer``) and what the answer means. This base owns registration, matching,
    exactly-once claiming from any thread, waking the run on its own loop, expiry and cleanup.
    Subclasses that override ``after_tool``, ``on_event``, ``on_error`` or ``on_success``
    must call ``super()`` so the cleanup still happens.

    One run handles one wait at a time per correlation id, and tools are expected to consume
    their answer in call order (the runtime checks calls one after another).
    """

    def __init__(
        self, *, response_event_name: str | Collection[str], correlation_field: str
    ) -> None:
        if isinstance(response_event_name, str):
            names: tuple[object, ...] = (response_event_name,)
        else:
            names = tuple(response_event_name)
        if not names:
            raise ValueError("response_event_name needs at least one event name")
        for name in names:
            if not isinstance(name, str) or not name.strip():
                raise ValueError(f"response event names must be non-empty strings, got {name!r}")
        if not isinstance(correlation_field, str) or not correlation_field.strip():
            raise ValueError("correlation_field must be a non-empty string such as 'tool_call_id'")
        self._names = frozenset(str(name) for name in names)
        self._field = correlation_field
        # guards _waits and every _Wait.state: accept() runs on arbitrary threads
        self._lock = threading.Lock()
        self._waits: dict[tuple[str, str], _Wait] = {}
        # the same waits by run, so ending a run costs its own waits, not a scan of everyone's
        self._run_waits: dict[AgentRunContext, list[_Wait]] = {}
        # only touched on the loop thread, by the run that owns the context
        self._staged: dict[AgentRunContext, dict[str, ExternalEvent]] = {}
        # one bound method for every wait's expiry (a deadline keeps its callback)
        self._expire_wait = self._expire

    # introspection --------------------------------------------------------------------------

    @property
    def response_event_names(self) -> frozenset[str]:
        """The event names this extension accepts."""
        return self._names

    @property
    def correlation_field(self) -> str:
        """The payload key that carries the correlation id."""
        return self._field

    def pending_count(self, session_id: str | None = None) -> int:
        """How many waits are registered (in one session, if given)."""
        with self._lock:
            if session_id is None:
                return len(self._waits)
            return sum(1 for key in self._waits if key[0] == session_id)

    def staged_count(self) -> int:
        """How many accepted answers are staged and not yet taken by their tool."""
        return sum(len(answers) for answers in self._staged.values())

    def is_waiting(self, session_id: str, correlation_id: str) -> bool:
        """True while a wait for this id in this session can still accept an answer."""
        with self._lock:
            wait = self._waits.get((session_id, correlation_id))
            return wait is not None and wait.state is _State.OPEN

    # the wait --------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _wait_for_external_event(
        self,
        context: AgentRunContext,
        correlation_id: str,
        *,
        response_event_name: str | None = None,
        # the expiry of the question, not a bound on this call: asyncio.timeout cannot replace it
        timeout: float | None = None,  # noqa: ASYNC109
        subject: object = None,
    ) -> AsyncIterator[ExternalWait]:
        """Register a wait, run the body, then wait for the answer and stage it.

        Emit the question inside the body: the wait exists already, so even an answer that
        comes back at once is matched. Leaving the body suspends this task (the run's phase
        reads WAITING) until an answer is claimed; then it is staged for
        ``_take_external_event``. ``response_event_name`` narrows the accepted names to one of
        the configured ones. With ``timeout`` (seconds) the wait ends with
        ``ExternalEventExpiredError`` if nobody answered in time, and later answers are
        refused. ``subject`` (what the question is about, such as the tool call) is handed to
        ``_check_answer``. The wait's entry is removed however the block ends.
        """
        wait = self._open_wait(
            context,
            correlation_id,
            response_event_name=response_event_name,
            timeout=timeout,
            subject=subject,
        )
        try:
            yield ExternalWait(correlation_id, None if timeout is None else _utc_deadline(timeout))
            with context.waiting():
                answer = await wait.future
            self._staged.setdefault(context, {})[correlation_id] = answer
        finally:
            self._close_wait(wait)

    def _open_wait(
        self,
        context: AgentRunContext,
        correlation_id: str,
        *,
        response_event_name: str | None = None,
        timeout: float | None = None,
        subject: object = None,
    ) -> _Wait:
        """Register a wait (``_wait_for_external_event``'s first step); its waiter awaits its
        ``future`` and calls ``_close_wait`` however it ends. ``subject`` is handed to
        ``_check_answer``.

        The lean form of the helper, for an extension that holds many waits at once: no
        generator or task lives while it waits, only the wait and its timer.
        """
        if not (isinstance(correlation_id, str) and correlation_id.strip()):
            raise ValueError("correlation_id must be a non-empty string")
        names = self._names
        if response_event_name is not None:
            if response_event_name not in self._names:
                raise ValueError(
                    f"{response_event_name!r} is not one of this extension's response event "
                    f"names {sorted(self._names)}"
                )
            names = frozenset((response_event_name,))
        if timeout is not None and not timeout > 0:  # also refuses NaN
            raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout}")
        loop = asyncio.get_running_loop()
        deadlines = Deadlines.of(loop)
        expiry = None if timeout is None else (deadlines, loop.time() + timeout, self._expire_wait)
        wait = _Wait(context, correlation_id, names, loop.create_future(), timeout, expiry, subject)
        slot = (context.session_id, correlation_id)
        with self._lock:
            if slot in self._waits:
                raise RuntimeError(
                    f"session {context.session_id!r} is already waiting for an answer to "
                    f"{correlation_id!r}; one wait per id at a time"
                )
            self._waits[slot] = wait
            run_waits = self._run_waits.get(context)
            if run_waits is None:
                self._run_waits[context] = [wait]
            else:
                run_waits.append(wait)
        if wait.active:
            deadlines.push(wait)
        return wait

    def _close_wait(self, wait: _Wait) -> None:
        """The wait is over, however it ended: its entry and timer go, and an answer or error
        nobody took is let go of."""
        with self._lock:
            self._forget(wait)
            wait.state = _State.CLOSED
        wait.cancel()  # its expiry (a no-op once expired, or without a timeout)
        future = wait.future
        if not future.done():
            future.cancel()
        elif not future.cancelled():
            future.exception()  # mark an unused error as retrieved (no GC warning)

    def _expire(self, wait: _Wait) -> None:
        """The wait's deadline passed (on its loop): nobody answered, so it fails expired."""
        with self._lock:
            expired = wait.state in (_State.OPEN, _State.SUSPENDED)
            if expired:
                wait.state = _State.CLOSED
                self._forget(wait)
        # an answer claimed just before expiry counts (accept() told its sender True): its
        # delivery is already queued on this loop
        if expired and not wait.future.done():
            wait.future.set_exception(
                ExternalEventExpiredError(wait.correlation_id, wait.timeout or 0.0)
            )

    def _take_external_event(
        self, context: AgentRunContext, correlation_id: str | None = None
    ) -> ExternalEvent:
        """Pop the staged answer, once. Call it inside the tool the wait was for.

        Without ``correlation_id`` the executing tool call's id (``current_tool_call_id()``)
        selects the answer. Raises RuntimeError when no answer is staged for it.
        """
        key_id = correlation_id if correlation_id is not None else current_tool_call_id()
        if key_id is None:
            raise RuntimeError(
                "no tool call is executing here: call _take_external_event inside the tool or "
                "pass correlation_id"
            )
        answers = self._staged.get(context)
        answer = answers.pop(key_id, None) if answers is not None else None
        if answers is not None and not answers:
            del self._staged[context]
        if answer is None:
            raise RuntimeError(
                f"no external answer is staged for {key_id!r}: it was never accepted, or it "
                "was already taken"
            )
        return answer

    # delivery ---------------------------------------------------------------------------------

    def _is_valid_answer(self, event: ExternalEvent) -> bool:
        """Business check of an answer's payload, run before it can claim a wait.

        Return False to refuse it; a refused answer leaves the wait open for a valid one.
        """
        return True

    def _check_answer(
        self, context: AgentRunContext, subject: object, event: ExternalEvent
    ) -> None:
        """Check an answer against the open wait it names, before it can claim it: raise an
        ``AnswerRefusedError`` to refuse it, saying why (the wait stays open for another).

        ``subject`` is what the wait was registered with. Called under the extension's lock,
        from any thread: it must neither block nor await.
        """

    def accept(self, config: AgentRunConfig | None, event: ExternalEvent) -> bool:
        """Claim ``event`` for the wait it names; True at most once per wait.

        Safe from any thread. False means not for us: wrong name, no config or session,
        unknown or finished wait (stale, duplicate, late, expired), another request id, or a
        payload ``_is_valid_answer`` refused. True means the answer was claimed and handed to
        the run's loop, not that the tool has run. An answer for an open wait that
        ``_check_answer`` refuses raises its ``AnswerRefusedError``, claiming nothing.
        """
        if config is None or event.name not in self._names:
            return False
        session_id = config.session_id
        correlation_id = event.payload.get(self._field)
        if not isinstance(session_id, str) or not session_id:
            return False
        if not isinstance(correlation_id, str) or not correlation_id:
            return False
        if not self._is_valid_answer(event):
            return False
        with self._lock:
            wait = self._waits.get((session_id, correlation_id))
            if wait is None or wait.state is not _State.OPEN or event.name not in wait.names:
                return False
            request_id = config.request_id
            if request_id is not None and request_id != wait.context.config.request_id:
                return False
            loop = wait.future.get_loop()
            if wait.deadline is not None and loop.time() >= wait.deadline:
                return False  # expired; the waiter will notice on its next turn
            self._check_answer(wait.context, wait.subject, event)
            try:
                _on_loop(loop, functools.partial(_resolve, wait.future, event))
            except RuntimeError:  # the loop is closed: nobody can take the answer any more
                wait.state = _State.CLOSED
                del self._waits[(session_id, correlation_id)]
                return False
            wait.state = _State.CLAIMED
        return True

    # hand-over --------------------------------------------------------------------------------

    def suspend_answers(self, context: AgentRunContext) -> bool:
        """Refuse answers to the run's waits from now on (it is being handed over); False,
        changing nothing, if one of them claimed an answer or one is staged, not yet used."""
        with self._lock:
            waits = list(self._run_waits.get(context, ()))
            if self._staged.get(context) or any(w.state is _State.CLAIMED for w in waits):
                return False
            for wait in waits:
                if wait.state is _State.OPEN:
                    wait.state = _State.SUSPENDED
        return True

    def resume_answers(self, context: AgentRunContext) -> None:
        """Take answers to the run's waits again (its hand-over did not happen)."""
        with self._lock:
            for wait in self._run_waits.get(context, ()):
                if wait.state is _State.SUSPENDED:
                    wait.state = _State.OPEN

    # cleanup ----------------------------------------------------------------------------------

    async def after_tool(
        self, context: AgentRunContext, call: ToolCall, outcome: ToolOutcome
    ) -> None:
        """Drop an answer its tool never took (the call was refused or its arguments invalid)."""
        answers = self._staged.get(context)
        if answers is not None:
            answers.pop(call.id, None)
            if not answers:
                del self._staged[context]

    async def on_event(self, context: AgentRunContext, event: ExtensionEvent) -> None:
        """On cancellation, drop the run's staged answers and cancel its waits."""
        if isinstance(event, RunCancelledEvent):
            self._drop_staged(context)
            self._end_waits(context, None)

    async def on_error(self, context: AgentRunContext, error: Exception) -> None:
        """On failure, drop the run's staged answers and wake its waits with ``error``."""
        self._drop_staged(context)
        self._end_waits(context, error)

    async def on_success(self, context: AgentRunContext, result: AssistantMessage) -> None:
        """On success, drop anything the run left behind."""
        self._drop_staged(context)
        self._end_waits(context, None)

    def _drop_staged(self, context: AgentRunContext) -> None:
        self._staged.pop(context, None)

    def _forget(self, wait: _Wait) -> None:
        """Remove a wait from both indexes (the caller holds the lock)."""
        key = (wait.context.session_id, wait.correlation_id)
        if self._waits.get(key) is wait:
            del self._waits[key]
        run_waits = self._run_waits.get(wait.context)
        if run_waits is not None and wait in run_waits:
            run_waits.remove(wait)
            if not run_waits:
                del self._run_waits[wait.context]

    def _end_waits(self, context: AgentRunContext, error: BaseException | None) -> None:
        with self._lock:
            ended = list(self._run_waits.get(context, ()))
            for wait in ended:
                self._forget(wait)
                wait.state = _State.CLOSED
        for wait in ended:
            with contextlib.suppress(RuntimeError):  # a closed loop has no waiter left
                _on_loop(wait.future.get_loop(), functools.partial(_abort, wait.future, error))
