"""What the service stores, and the `Store` protocol every backend implements.

Errors form one tree::

    StorageError
     ├── StorageUnavailable     the database cannot be reached, or the store is closed
     ├── StorageConfigError     a bad AGENT_DATABASE_URL (also a ValueError)
     ├── SessionNotFound        a write into a session that does not exist
     ├── SessionOwnedByOther    the session id belongs to another principal (HTTP: 404)
     ├── RunNotFound            an update of a run that does not exist
     ├── RunAlreadyExists       a second run with the same id
     ├── StaleFence             a fenced write whose token is older than one already used
     ├── FiringLost             a firing no longer held with that token (app.storage.schedules)
     ├── FileInUse              a file a stored conversation refers to (app.storage.files)
     ├── FileMissing            a file, or its bytes, not stored (app.storage.files)
     ├── CheckpointFenced       a checkpoint of a run this worker no longer holds
     │                          (app.runs.checkpoints)
     └── CheckpointUnavailable  a once-only tool call's start could not be recorded
                                (app.runs.checkpoints)

Fencing: the writes that change or end a run (``update_run``, ``append_messages``,
``end_run``) may carry the fencing token of the session lease they are made under
(``fence=``). The store keeps the highest token that wrote each run and each session's
messages, and refuses a write with a lower one (``StaleFence``) in the same statement that
makes it: a worker that lost its lease, once another worker (or the lost-run sweep) wrote
with a newer token, can no longer change what is stored, whatever it believes. A write without
a token is not fenced (tools, recovery at start with one worker).

Misuse of the API with bad values (a message without a "role", a value JSON cannot encode,
a naive datetime) raises the built-in `TypeError` / `ValueError`, as Python code does.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Final,
    Literal,
    ParamSpec,
    Protocol,
    TypeVar,
    get_args,
)

if TYPE_CHECKING:
    from app.storage.checkpoints import CheckpointRecord
    from app.storage.schedules import FiringFence, FiringRecord, FiringStatus, ScheduleRecord
    from app.storage.threads import ThreadQuery

from app.storage.common import JSONObject, StorageError, require_aware, utcnow
from app.storage.files import FileStore
from app.storage.outbox import (
    ClaimedWebhook,
    WebhookAttempt,
    WebhookMessage,
    WebhookState,
    WebhookStatus,
)

__all__ = [
    "TERMINAL_STATUSES",
    "TITLE_MAX_CHARS",
    "UNFINISHED_STATUSES",
    "JSONObject",
    "RunAlreadyExists",
    "RunNotFound",
    "RunRecord",
    "RunStatus",
    "SessionCursor",
    "SessionNotFound",
    "SessionOwnedByOther",
    "SessionRecord",
    "StaleFence",
    "StorageConfigError",
    "StorageError",
    "StorageUnavailable",
    "Store",
    "StoredMessage",
    "UsageGroup",
    "UsageTotal",
    "require_aware",
    "title_of",
    "utcnow",
]

RunStatus = Literal["queued", "running", "waiting", "completed", "failed", "cancelled"]

UsageGroup = Literal["agent", "principal", "day"]
"""What ``Store.usage_totals`` sums by: the run's agent, its principal, or its UTC day."""

RUN_STATUSES: Final[frozenset[str]] = frozenset(get_args(RunStatus))
TERMINAL_STATUSES: Final[frozenset[RunStatus]] = frozenset({"completed", "failed", "cancelled"})
UNFINISHED_STATUSES: Final[frozenset[RunStatus]] = frozenset({"queued", "running", "waiting"})


# --- errors -------------------------------------------------------------------------------


class StorageUnavailable(StorageError):
    """The database cannot be reached, the connection was lost, or the store is closed.

    Transient from the caller's point of view: the HTTP layer answers 503.
    """


class StorageConfigError(StorageError, ValueError):
    """AGENT_DATABASE_URL cannot be used (unsupported scheme, empty path...)."""


class SessionNotFound(StorageError):
    """A write named a session that does not exist."""

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} does not exist")
        self.session_id = session_id


class SessionOwnedByOther(StorageError):
    """The session exists and belongs to another principal.

    Never show this to the caller as such: to them, the session does not exist (404).
    """

    def __init__(self, session_id: str) -> None:
        # The owner is deliberately not part of the message: it may end up in a log or answer.
        super().__init__(f"session {session_id!r} belongs to another principal")
        self.session_id = session_id


class RunNotFound(StorageError):
    """An update named a run that does not exist."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} does not exist")
        self.run_id = run_id


class RunAlreadyExists(StorageError):
    """`create_run` was given a run id that is already stored."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} already exists")
        self.run_id = run_id


class StaleFence(StorageError):
    """A fenced write carried a token older than one the run (or the session's messages) was
    already written with: the writer lost its lease, and the write was refused."""

    def __init__(self, what: str, fence: int, stored: int) -> None:
        super().__init__(
            f"{what} was written with fencing token {stored}; a write with the older token "
            f"{fence} is refused"
        )
        self.fence = fence
        self.stored = stored


# --- records ------------------------------------------------------------------------------


def require_status(status: str) -> None:
    if status not in RUN_STATUSES:
        raise ValueError(f"unknown run status {status!r}; expected one of {sorted(RUN_STATUSES)}")


def run_update_stamps(
    status: str, started_at: datetime | None, finished_at: datetime | None
) -> tuple[datetime | None, datetime | None]:
    """Check an ``update_run`` call; the start and end times a store fills in when it has none.

    A run gets its start time on its first move to running or waiting, and its end time on a
    terminal status; both backends apply these with ``COALESCE`` in their own SQL.
    """
    require_status(status)
    require_aware("started_at", started_at)
    require_aware("finished_at", finished_at)
    now = utcnow()
    auto_started = now if status in ("running", "waiting") else None
    auto_finished = now if status in TERMINAL_STATUSES else None
    return auto_started, auto_finished


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionRecord:
    """One conversation, owned by one principal."""

    id: str
    principal: str
    created_at: datetime
    updated_at: datetime
    message_count: int = 0
    last_run_id: str | None = None
    title: str | None = None
    stateless: bool = False
    """Created by a stateless protocol call (a chat completion, a response or an MCP call
    that named no conversation): never listed, deleted once idle past the retention."""


@dataclass(frozen=True, slots=True)
class SessionCursor:
    """A place in a principal's list of sessions, newest first: the sessions after it are
    those updated earlier, or at the same instant with a smaller id.

    (updated_at, id) orders the sessions totally (ids are unique), and a cursor is a place in
    that order, not a row number: paging with it (keyset pagination) repeats no session and
    skips none that stayed put, however many are created or updated meanwhile.
    """

    updated_at: datetime
    session_id: str

    def __post_init__(self) -> None:
        require_aware("updated_at", self.updated_at)

    @classmethod
    def after(cls, session: SessionRecord) -> SessionCursor:
        """The cursor that continues the list after ``session``."""
        return cls(session.updated_at, session.id)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredMessage:
    """One message of a session's conversation; `position` counts from 0 across all runs."""

    session_id: str
    run_id: str
    position: int
    role: str
    message: JSONObject
    created_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRecord:
    """One run: what was asked, where it stands, and how it ended.

    `error` is `{"code": ..., "message": ...}` for a failed run. `model` is the model that
    answered its latest model call (a fallback's, after a failover), once there was one.
    `webhook_url` is where its notifications go (the request's or its agent's webhook, as
    the run started), so that whoever ends it (another worker's sweep) can notify it.
    `input_parts` is the JSON form of its input's content parts (media by file id, never
    bytes) when it was given as parts; `input` is then their text.
    """

    run_id: str
    session_id: str
    principal: str
    agent: str
    input: str
    status: RunStatus = "queued"
    created_at: datetime = field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    output: JSONObject | None = None
    error: JSONObject | None = None
    usage: JSONObject | None = None
    metadata: JSONObject = field(default_factory=dict)
    model: str | None = None
    webhook_url: str | None = None
    input_parts: tuple[JSONObject, ...] = ()

    def __post_init__(self) -> None:
        require_status(self.status)
        require_aware("created_at", self.created_at)
        require_aware("started_at", self.started_at)
        require_aware("finished_at", self.finished_at)

    @property
    def is_finished(self) -> bool:
        """Whether the run reached a terminal status."""
        return self.status in TERMINAL_STATUSES


@dataclass(frozen=True, slots=True)
class UsageTotal:
    """Tokens of the finished runs of one group (an agent, a principal or a UTC day
    ``YYYY-MM-DD``), and how many runs they were. The cache and reasoning counts are parts of
    ``input_tokens`` and ``output_tokens`` (``agent_runtime.model.Usage``), summed over the
    runs that reported them; None when none of them did."""

    key: str
    input_tokens: int
    output_tokens: int
    runs: int
    cached_input_tokens: int | None = None
    cache_write_tokens: int | None = None
    reasoning_tokens: int | None = None


# --- JSON ---------------------------------------------------------------------------------


# one encoder for every write (``json.dumps`` with these options builds a new one per call)
_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode


def encode_json(value: Mapping[str, Any]) -> str:
    """Encode for storage; both backends store exactly this text's meaning.

    NaN and infinities are refused because they are not JSON (PostgreSQL's jsonb rejects
    them, and so would a browser's JSON.parse).
    """
    return _encode(value)


def encode_optional_json(value: Mapping[str, Any] | None) -> str | None:
    return None if value is None else encode_json(value)


def decode_json(text: str) -> JSONObject:
    value = json.loads(text)
    if not isinstance(value, dict):  # pragma: no cover - only if someone edits the database
        raise StorageError(f"stored JSON is not an object: {text[:80]!r}")
    return value


def decode_optional_json(text: str | None) -> JSONObject | None:
    return None if text is None else decode_json(text)


def encode_parts(parts: Sequence[Mapping[str, Any]]) -> str | None:
    """A run's input parts (a JSON array) for storage; None for none."""
    if not parts:
        return None
    return _encode(list(parts))


def decode_parts(text: str | None) -> tuple[JSONObject, ...]:
    """``encode_parts``' text read back."""
    if text is None:
        return ()
    value = json.loads(text)
    if not isinstance(value, list):  # pragma: no cover - only if someone edits the database
        raise StorageError(f"stored parts are not a JSON array: {text[:80]!r}")
    return tuple(dict(item) for item in value)


TITLE_MAX_CHARS: Final = 200
"""The longest session title a store keeps (a longer first input is cut, with an ellipsis)."""


def title_of(text: str) -> str | None:
    """A session's title from its first input: one line, at most ``TITLE_MAX_CHARS``."""
    line = " ".join(text.split())
    if len(line) > TITLE_MAX_CHARS:
        line = line[: TITLE_MAX_CHARS - 1].rstrip() + "…"
    return line or None


def message_role(index: int, message: Mapping[str, Any]) -> str:
    """The `role` of a message about to be stored; a message without one is a caller bug."""
    if not isinstance(message, Mapping):
        raise TypeError(f"message {index} is a {type(message).__name__}, not a mapping")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise ValueError(f"message {index} has no string 'role'")
    return role


# --- cancellation -------------------------------------------------------------------------

_log = logging.getLogger("app.storage")

P = ParamSpec("P")
T = TypeVar("T")


class BackgroundOperations:
    """Book-keeping for `finish_on_cancel`: the operations in flight, and whether closing."""

    def __init__(self) -> None:
        self._operations: set[asyncio.Task[Any]] = set()
        self._closing = False

    async def _finish_operations(self) -> None:
        """Refuse new operations and wait for those in flight (without cancelling them)."""
        self._closing = True
        if self._operations:
            await asyncio.wait(set(self._operations))


S = TypeVar("S", bound=BackgroundOperations)


def finish_on_cancel(
    method: Callable[Concatenate[S, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[S, P], Coroutine[Any, Any, T]]:
    """Run a store operation in its own task: a cancelled caller stops waiting, the work does not.

    Interrupting a statement half-way buys nothing, since every write is one transaction
    and atomic either way, and it costs: asyncpg then sends a cancel request on a second
    connection (which can fail noisily) and resets or drops the pooled one. So the caller's
    CancelledError propagates at once while the operation commits or rolls back on its own;
    `close()` waits for it.
    """

    async def run(self: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
        if self._closing:
            raise StorageUnavailable(f"{self!r} is closed")
        task = asyncio.get_running_loop().create_task(method(self, *args, **kwargs))
        self._operations.add(task)
        task.add_done_callback(self._operations.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            # Nobody is left to see a failure, so say it here.
            task.add_done_callback(functools.partial(_log_orphan_failure, method.__name__))
            raise

    # update_wrapper rather than @wraps: mypy loses the Concatenate signature through @wraps.
    functools.update_wrapper(run, method)
    return run


def _log_orphan_failure(name: str, task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        _log.error("storage operation %s failed after its caller was cancelled", name, exc_info=exc)


# --- the protocol -------------------------------------------------------------------------


class Store(FileStore, Protocol):
    """Sessions, their conversations and their runs (and files: ``FileStore``).

    Every method may raise `StorageUnavailable`. Implementations are safe to share between
    the tasks of one event loop. Cancelling a caller does not interrupt its operation: the
    caller gets its CancelledError at once, the operation commits (or rolls back) on its own,
    and `close()` waits for it.
    """

    async def close(self) -> None:
        """Let operations in flight finish, then release the connection(s).

        Idempotent; later calls raise `StorageUnavailable`.
        """
        ...

    async def ping(self) -> None:
        """Round-trip to the database, for readiness checks; raises `StorageUnavailable`."""
        ...

    # sessions

    async def get_or_create_session(
        self, session_id: str, principal: str, *, stateless: bool = False
    ) -> SessionRecord:
        """Return the session, creating it for `principal` on first use (`stateless` if
        asked: the flag is set at creation only).

        Raises `SessionOwnedByOther` if it exists and belongs to another principal.
        """
        ...

    async def get_session(self, session_id: str) -> SessionRecord | None:
        """The session, or None. The caller checks `principal`."""
        ...

    async def delete_session(self, session_id: str) -> bool:
        """Delete the session with its messages and runs; False if it did not exist."""
        ...

    async def list_sessions(
        self, principal: str, limit: int = 20, before: SessionCursor | None = None
    ) -> list[SessionRecord]:
        """The principal's sessions, most recently updated first (ties: larger id first),
        stateless ones left out.

        At most `limit` (at least 1, else `ValueError`); with `before`, only the sessions
        after that cursor, so `SessionCursor.after(page[-1])` reads the next page.
        """
        ...

    async def set_title(self, session_id: str, title: str) -> SessionRecord | None:
        """Set the session's title (`updated_at` stays); the session, or None if there is none.

        A session is titled by its first run's input (`create_run`) until this renames it.
        """
        ...

    async def idle_stateless_sessions(self, before: datetime, limit: int) -> list[str]:
        """Up to `limit` stateless sessions last updated before `before` and with no
        unfinished run, the longest idle first: what the retention deletes."""
        ...

    async def delete_idle_stateless_session(self, session_id: str, before: datetime) -> bool:
        """Delete the session if it is still stateless, last updated before `before` and
        without an unfinished run; whether it was deleted."""
        ...

    # messages

    async def list_messages(self, session_id: str) -> list[StoredMessage]:
        """The conversation in order (by `position`); empty for an unknown session."""
        ...

    async def append_messages(
        self,
        session_id: str,
        run_id: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        fence: int | None = None,
    ) -> None:
        """Append one run's messages in one transaction: all are stored, or none.

        Also sets the session's `last_run_id`, `message_count` and `updated_at`. With `fence`,
        raises `StaleFence` (writing nothing) if the session's messages or the run were
        already written with a higher token.
        Raises `SessionNotFound`; `TypeError`/`ValueError` for a message without a string
        "role" or one JSON cannot encode (nothing is written then).
        """
        ...

    async def remove_last_turn(self, session_id: str, run_id: str) -> bool:
        """Remove the run's messages if they end the conversation, in one transaction.

        True if they were removed (or the run stored none); False, removing nothing, when
        another run's messages come after them. Updates `message_count`, `last_run_id` (the
        run that now ends the conversation) and `updated_at`.
        """
        ...

    # runs

    async def create_run(
        self,
        run: RunRecord,
        *,
        firing: FiringFence | None = None,
        create_session: bool = False,
        stateless: bool = False,
        checkpoint: CheckpointRecord | None = None,
    ) -> None:
        """Store a new run of an existing session owned by `run.principal`.

        A session without a title takes `title_of(run.input)`. Raises `SessionNotFound`,
        `SessionOwnedByOther` or `RunAlreadyExists`. With `create_session`, a missing session
        is created for `run.principal` in the same transaction instead (a new session's first
        run: one write, not two), `stateless` if asked. With `firing`, the run is a schedule's:
        it is stored only together with moving that firing, still held with `firing.token`, to
        `started` (else `FiringLost`, and nothing is written). With `checkpoint` (the run's
        first), it is stored in the same transaction too, with `checkpoint.fence` as its
        token, as `save_checkpoint` would: the run is resumable from the moment it exists.
        """
        ...

    async def update_run(
        self,
        run_id: str,
        *,
        status: RunStatus,
        output: Mapping[str, Any] | None = None,
        error: Mapping[str, Any] | None = None,
        usage: Mapping[str, Any] | None = None,
        started_at: datetime | None = None,
        finished_at: datetime | None = None,
        model: str | None = None,
        fence: int | None = None,
        webhook: WebhookMessage | None = None,
    ) -> RunRecord:
        """Move a run to `status` and return the run as stored afterwards.

        With `fence`, raises `StaleFence` (changing nothing) if the run was already written
        with a higher token; otherwise the run keeps `fence` as its highest.

        Arguments left as None keep their stored value. `started_at` defaults to now on the
        first move to running/waiting, `finished_at` to now on a terminal status. A finished
        run is final: the update is ignored and the stored run returned, so compare the
        returned `status` to learn whether this call won a race. Raises `RunNotFound`.

        The move to a terminal status books the run's `usage` in the usage ledger, in the
        same step: one row per run (principal, agent, model, UTC day, tokens), kept when the
        run's session is deleted (see `usage_totals`).

        `webhook` is queued in the webhook outbox in the same transaction, if and only if
        this call changed the run (its id once: a repeat adds nothing).
        """
        ...

    async def end_run(
        self,
        run_id: str,
        *,
        session_id: str,
        messages: Sequence[Mapping[str, Any]] = (),
        status: RunStatus,
        output: Mapping[str, Any] | None = None,
        error: Mapping[str, Any] | None = None,
        usage: Mapping[str, Any] | None = None,
        model: str | None = None,
        fence: int | None = None,
        webhook: WebhookMessage | None = None,
        delete_checkpoint: bool = False,
    ) -> bool:
        """A run's end in one transaction: its turn, its final state and its checkpoint gone.

        The same as, in one transaction, `append_messages(session_id, run_id, messages,
        fence=fence)` (when there are messages), `update_run(run_id, status=..., fence=fence,
        webhook=webhook)` and, with `delete_checkpoint`, `delete_checkpoint(run_id,
        fence=fence)`. True if this call ended the run; False if it had ended before (its
        stored end stands, as with `update_run`; read it with `get_run`). All of it is
        stored, or nothing: each part's error (`StaleFence`, `SessionNotFound`,
        `RunNotFound`, `TypeError` or `ValueError` for a bad message) rolls back the others.
        """
        ...

    async def claim_webhooks(
        self, claim: str, *, now: float, until: float, limit: int
    ) -> list[ClaimedWebhook]:
        """Claim up to ``limit`` pending messages due at ``now`` and not claimed by anyone
        (or whose claim ran out), until ``until``: one claimer per message at a time."""
        ...

    async def record_webhook_attempt(
        self,
        claimed: ClaimedWebhook,
        attempt: WebhookAttempt,
        *,
        state: WebhookStatus,
        next_attempt_at: float,
    ) -> bool:
        """Record one attempt and the message's new state, releasing the claim; False (and
        nothing written) when the claim is no longer this one (it ran out, another took it)."""
        ...

    async def prune_webhooks(self, *, before: float, limit: int) -> int:
        """Delete up to ``limit`` delivered or failed messages created before ``before``, with
        their attempts; how many were deleted. Pending messages are kept."""
        ...

    async def webhook_states(self, run_id: str) -> list[WebhookState]:
        """The run's webhook messages, oldest first, with their attempts."""
        ...

    async def usage_totals(
        self,
        *,
        start: datetime,
        end: datetime,
        group_by: UsageGroup,
        principal: str | None = None,
    ) -> list[UsageTotal]:
        """Tokens of the runs that finished in ``[start, end)``, summed by ``group_by``
        (ordered by key); only ``principal``'s runs when given."""
        ...

    async def get_run(self, run_id: str) -> RunRecord | None:
        """The run, or None. The caller checks `principal`."""
        ...

    async def list_runs(self, session_id: str, limit: int | None = 20) -> list[RunRecord]:
        """The session's most recent runs, newest first; all of them with `limit=None`."""
        ...

    async def list_unfinished_runs(self) -> list[RunRecord]:
        """Runs still queued, running or waiting, oldest first (for crash recovery)."""
        ...

    # checkpoints of runs in progress (app.storage.checkpoints)

    async def save_checkpoint(self, record: CheckpointRecord, *, fence: int) -> None:
        """Store the run's checkpoint in place of its last (the run's record must exist);
        ``StaleFence`` (writing nothing) if the run or its checkpoint was written with a
        newer token than ``fence``."""
        ...

    async def get_checkpoint(self, run_id: str) -> CheckpointRecord | None:
        """The run's last checkpoint, or None."""
        ...

    async def take_over_checkpoint(self, run_id: str, *, fence: int) -> CheckpointRecord | None:
        """Count one more resume of the run and make ``fence`` its checkpoint's token (so a
        fenced-off writer is refused from now on); the checkpoint after it, or None if the
        run has none. ``StaleFence`` if written with a newer token."""
        ...

    async def park_checkpoint(self, run_id: str, *, fence: int, reason: str) -> bool:
        """Mark the run's checkpoint handed over (``reason``, e.g. ``shutdown``): the worker
        that takes the run resumes it with that reason. False if there is none."""
        ...

    async def delete_checkpoint(self, run_id: str, *, fence: int | None = None) -> None:
        """Forget the run's checkpoint (the run ended); with ``fence``, only if it was not
        written with a newer token."""
        ...

    # schedules (app.storage.schedules)

    async def create_schedule(self, record: ScheduleRecord) -> None:
        """Store a new schedule."""
        ...

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        """The schedule, or None. The caller checks ``principal``."""
        ...

    async def list_schedules(self, principal: str, limit: int = 100) -> list[ScheduleRecord]:
        """The principal's schedules, newest first."""
        ...

    async def update_schedule(self, record: ScheduleRecord) -> bool:
        """Write a schedule's settings and ``next_due_at`` (never its ``fired_count``);
        False if it no longer exists."""
        ...

    async def delete_schedule(self, schedule_id: str) -> bool:
        """Delete the schedule and its firings; False if it did not exist."""
        ...

    async def due_schedules(self, now: datetime, limit: int) -> list[ScheduleRecord]:
        """Schedules not paused whose next due time is at or before ``now``, earliest first."""
        ...

    async def claim_due(
        self, schedule: ScheduleRecord, next_due_at: datetime | None, firing: FiringRecord
    ) -> bool:
        """Compare-and-set: if the schedule still has the ``next_due_at`` and ``fired_count``
        it was read with, move it to ``next_due_at`` (counting a firing that is not
        ``skipped``) and insert ``firing``, in one transaction. True if this call won."""
        ...

    async def reclaim_firings(
        self, now: datetime, lease_until: datetime, limit: int
    ) -> list[FiringRecord]:
        """Take over the open firings (claimed, retrying) whose lease ended by ``now``: each
        gets a new token and ``lease_until``; returns the ones this call took."""
        ...

    async def settle_firing(
        self,
        firing: FiringRecord,
        *,
        status: FiringStatus,
        run_id: str | None = None,
        detail: str | None = None,
        lease_until: datetime | None = None,
    ) -> bool:
        """Record the outcome of a claimed firing, only if ``firing.token`` is still current
        (fenced); ``lease_until`` is when a ``retrying`` one is tried again."""
        ...

    async def list_firings(self, schedule_id: str, limit: int = 20) -> list[FiringRecord]:
        """The schedule's latest firings, newest due time first."""
        ...

    # --- thread metadata (see app.storage.threads) -------------------------------------

    async def set_thread_metadata(self, session_id: str, metadata: Mapping[str, Any]) -> None:
        """Replace the session's metadata object (the session must exist)."""
        ...

    async def thread_metadata(self, session_id: str) -> dict[str, Any]:
        """The session's metadata object ({} when it has none)."""
        ...

    async def search_threads(
        self, query: ThreadQuery
    ) -> list[tuple[SessionRecord, dict[str, Any]]]:
        """The principal's listed sessions the query matches, with their metadata."""
        ...
