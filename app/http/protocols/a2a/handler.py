"""The A2A ``RequestHandler`` of ``a2a-sdk``, answered by the service's run manager.

The SDK's JSON-RPC and HTTP+JSON dispatchers parse each request, check ``A2A-Version`` and call
this handler with protobuf requests; this handler starts runs through ``RunManager.start`` and
reads their event logs (``TaskBuilder``). It keeps nothing of its own: a task is a run, found
by id in the run manager and read from its log, on whichever worker the request lands.

The SDK's own ``DefaultRequestHandler`` (with its ``AgentExecutor``, task store and in-memory
event queues) is not used: it would be a second run path with its own state, blind to the
service's admission, session locks, event logs and workers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from functools import wraps
from typing import Any, TypeVar

from a2a.server.context import ServerCallContext
from a2a.server.events import Event
from a2a.server.request_handlers.request_handler import RequestHandler
from a2a.types import a2a_pb2 as pb
from a2a.utils.errors import (
    A2AError,
    ContentTypeNotSupportedError,
    ExtendedAgentCardNotConfiguredError,
    InternalError,
    InvalidParamsError,
    InvalidRequestError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)

from app.errors import (
    InvalidRequest,
    NotAccepted,
    NotFound,
    PayloadTooLarge,
    ServiceError,
    SessionBusy,
    UnsupportedMediaType,
)
from app.http.api.schemas import is_session_id
from app.http.protocols.a2a.parts import history_parts, message_parts, refuse_unsupported_parts
from app.http.protocols.a2a.tasks import STATE_OF_STATUS, TaskBuilder, data_of
from app.http.protocols.common import (
    answer_confirmation,
    check_session_id,
    check_text,
    follow,
    new_session_id,
    snapshot,
)
from app.http.protocols.media import has_media, parts_text, run_input
from app.runs import RunHandle, RunRequestOptions
from app.runs.handle import stored_parts
from app.server.services import Services
from app.storage import RunRecord, SessionCursor

__all__ = ["RunTaskHandler", "TaskCaller"]

logger = logging.getLogger("app.http.protocols.a2a")

_CANCEL_WAIT = 10.0
_LIST_DEFAULT = 50
_LIST_MAX = 100

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TaskCaller:
    """Who asks, of which agent, through which worker (put on the SDK's call context)."""

    services: Services
    principal: str
    agent: str
    base_url: str = ""
    """The service's URL as the caller reached it (a task's history names files under it)."""
    media: Mapping[str, str] = field(default_factory=dict)
    """The base64 strings the guard set aside from the body, by their placeholders
    (``set_media_aside``)."""


def _caller(context: ServerCallContext) -> TaskCaller:
    caller = context.state.get("caller")
    if not isinstance(caller, TaskCaller):  # pragma: no cover - the endpoint always sets it
        raise InternalError("the request reached the A2A handler without its caller")
    return caller


def _a2a_error(exc: ServiceError) -> A2AError:
    """The A2A error answering a domain error."""
    # strings only: the HTTP+JSON binding carries them as google.rpc.ErrorInfo metadata
    data = {"code": exc.code, **{key: str(value) for key, value in exc.extra.items()}}
    if exc.retry_after is not None:
        data["retryAfter"] = str(exc.retry_after)
    if isinstance(exc, UnsupportedMediaType):
        return ContentTypeNotSupportedError(exc.detail, data=data)
    if isinstance(exc, NotFound) and exc.code != "file_not_found":
        return TaskNotFoundError(exc.detail, data=data)
    if isinstance(exc, InvalidRequest | NotAccepted | NotFound | PayloadTooLarge):
        return InvalidParamsError(exc.detail, data=data)
    if isinstance(exc, SessionBusy):
        return InvalidRequestError(exc.detail, data=data)
    return InternalError(exc.detail, data=data)


def _unexpected(method: str) -> InternalError:
    """What answers an error nobody mapped: the SDK would send its text (a database's own
    message, say) to the client; it is logged here instead."""
    logger.exception("unhandled error in the A2A method %s", method)
    return InternalError("the server failed to answer this request; it was logged")


def _mapped(
    method: Callable[..., Coroutine[Any, Any, T]],
) -> Callable[..., Coroutine[Any, Any, T]]:
    @wraps(method)
    async def call(*args: Any, **kwargs: Any) -> T:
        try:
            return await method(*args, **kwargs)
        except ServiceError as exc:
            raise _a2a_error(exc) from None
        except A2AError:
            raise
        except Exception:
            raise _unexpected(method.__name__) from None

    return call


def _mapped_stream(
    method: Callable[..., AsyncIterator[Event]],
) -> Callable[..., AsyncGenerator[Event]]:
    @wraps(method)
    async def stream(*args: Any, **kwargs: Any) -> AsyncGenerator[Event]:
        inner = method(*args, **kwargs)
        try:
            async for event in inner:
                yield event
        except ServiceError as exc:
            raise _a2a_error(exc) from None
        except A2AError:
            raise
        except Exception:
            raise _unexpected(method.__name__) from None
        finally:
            await inner.aclose()  # type: ignore[attr-defined]

    return stream


def _builder(found: RunHandle | RunRecord, base_url: str = "") -> TaskBuilder:
    stored = (
        stored_parts(found.options.parts) if isinstance(found, RunHandle) else found.input_parts
    )
    return TaskBuilder(
        run_id=found.run_id,
        session_id=found.session_id,
        input_text=found.input,
        input_parts=history_parts(stored or (), base_url),
        created_at=found.created_at,
    )


class RunTaskHandler(RequestHandler):
    """Every A2A method, over the service's runs."""

    # --- reading a task -----------------------------------------------------------------------

    async def _task(
        self, caller: TaskCaller, task_id: str
    ) -> tuple[RunHandle | RunRecord, TaskBuilder]:
        """The caller's task as it stands: its run, and a builder that read its whole log."""
        # a task id is a run id, made of the session ids' characters: anything else names none
        # (and is never looked up: PostgreSQL refuses a NUL in a query's text)
        found = (
            await caller.services.manager.find(task_id, caller.principal)
            if is_session_id(task_id)
            else None
        )
        if found is None or found.agent != caller.agent:
            raise TaskNotFoundError(f"no task {task_id!r}")
        builder = _builder(found, caller.base_url)
        documents = await snapshot(caller.services.bus.events, found.run_id)
        if documents is None:
            return found, _from_record(found, caller.base_url)
        for document in documents:
            if builder.done and not builder.terminal:
                builder.resume()  # the question it stopped at was answered: read on
            builder.feed(document)
        return found, builder

    # --- sending ------------------------------------------------------------------------------

    async def _start(
        self, caller: TaskCaller, params: pb.SendMessageRequest, *, background: bool
    ) -> tuple[RunHandle, TaskBuilder]:
        message = params.message
        parts = await message_parts(message, caller.media)
        check_text("message.parts", parts)
        if not (has_media(parts) or parts_text(parts, "").strip()):
            raise InvalidParamsError(
                "the message needs a text or file part: it is the agent's input"
            )
        session_id = check_session_id("contextId", message.context_id or new_session_id("ctx"))
        taken = await run_input(caller.services, caller.principal, parts, separator="")
        options = RunRequestOptions(
            input=taken.text,
            parts=taken.parts,
            agent=caller.agent,
            background=background,
            on_disconnect="continue",
        )
        async with taken:
            handle = await caller.services.manager.start(caller.principal, session_id, options)
        return handle, _builder(handle, caller.base_url)

    async def _answer(
        self, caller: TaskCaller, message: pb.Message
    ) -> tuple[RunHandle | RunRecord, TaskBuilder, int]:
        """Deliver a message on an existing task: the answer to its question."""
        refuse_unsupported_parts(message)
        found, builder = await self._task(caller, message.task_id)
        if builder.terminal:
            raise UnsupportedOperationError(
                f"task {message.task_id!r} is in a terminal state; to go on with the "
                "conversation, send a new message with the same contextId and no taskId"
            )
        if builder.pending_call is None:
            raise UnsupportedOperationError(
                f"task {message.task_id!r} is not waiting for input; wait for it to end, or "
                "cancel it"
            )
        approved = next(
            (d["approved"] for d in data_of(message) if isinstance(d.get("approved"), bool)), None
        )
        if approved is None:
            raise InvalidParamsError(
                'the task waits for a confirmation: answer with a data part {"approved": true} '
                'or {"approved": false}'
            )
        if not await answer_confirmation(
            caller.services,
            caller.principal,
            found.session_id,
            found.run_id,
            builder.pending_call,
            approved,
        ):
            raise InvalidParamsError(
                "the question is no longer open: it expired, or it was answered already"
            )
        cursor = builder.pending_seq
        builder.resume()
        return found, builder, cursor

    @_mapped
    async def on_message_send(
        self, params: pb.SendMessageRequest, context: ServerCallContext
    ) -> pb.Task | pb.Message:
        caller = _caller(context)
        immediately = params.configuration.return_immediately
        history = (
            params.configuration.history_length
            if params.configuration.HasField("history_length")
            else None
        )
        if params.message.task_id:
            found, builder, cursor = await self._answer(caller, params.message)
            run_id = found.run_id
        else:
            handle, builder = await self._start(caller, params, background=immediately)
            run_id, cursor = handle.run_id, 0
        if not immediately:
            stream = follow(caller.services.bus.events, run_id, cursor)
            try:
                async for document in stream:
                    builder.feed(document)
                    if builder.done:
                        break
            finally:
                await stream.aclose()  # type: ignore[attr-defined]
        return builder.task(history)

    @_mapped_stream
    async def on_message_send_stream(
        self, params: pb.SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        caller = _caller(context)
        if params.message.task_id:
            found, builder, cursor = await self._answer(caller, params.message)
            run_id = found.run_id
        else:
            handle, builder = await self._start(caller, params, background=False)
            run_id, cursor = handle.run_id, 0
        async for event in self._stream(caller, builder, run_id, cursor):
            yield event

    async def _stream(
        self,
        caller: TaskCaller,
        builder: TaskBuilder,
        run_id: str,
        cursor: int,
        *,
        to_the_end: bool = False,
    ) -> AsyncGenerator[Event]:
        """The task, then its events from ``cursor`` until the builder stops: at the task's
        end, or (a message's stream) at a question; ``to_the_end`` reads on past questions."""
        manager = caller.services.manager
        manager.stream_opened()
        stream = follow(caller.services.bus.events, run_id, cursor)
        try:
            yield builder.task()
            async for document in stream:
                if to_the_end and builder.done and not builder.terminal:
                    builder.resume()  # the question was answered: the task goes on
                for event in builder.feed(document):
                    yield event
                if builder.terminal or (builder.done and not to_the_end):
                    break
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
            manager.stream_closed()

    # --- tasks --------------------------------------------------------------------------------

    @_mapped
    async def on_get_task(self, params: pb.GetTaskRequest, context: ServerCallContext) -> pb.Task:
        _, builder = await self._task(_caller(context), params.id)
        history = params.history_length if params.HasField("history_length") else None
        return builder.task(history)

    @_mapped
    async def on_list_tasks(
        self, params: pb.ListTasksRequest, context: ServerCallContext
    ) -> pb.ListTasksResponse:
        caller = _caller(context)
        store = caller.services.store
        size = params.page_size if params.HasField("page_size") and params.page_size > 0 else 0
        size = min(size or _LIST_DEFAULT, _LIST_MAX)
        if params.page_token:
            raise InvalidParamsError("pageToken: this server returns one page of recent tasks")
        if params.context_id:
            check_session_id("contextId", params.context_id)
            session = await store.get_session(params.context_id)
            if session is None or session.principal != caller.principal:
                records: list[RunRecord] = []
            else:
                records = await store.list_runs(params.context_id, limit=_LIST_MAX)
        else:
            records = []
            cursor: SessionCursor | None = None
            for session in await store.list_sessions(caller.principal, limit=size, before=cursor):
                records.extend(await store.list_runs(session.id, limit=size))
        records = [r for r in records if r.agent == caller.agent]
        if params.status:
            records = [r for r in records if STATE_OF_STATUS.get(r.status) == params.status]
        records.sort(key=lambda r: r.created_at, reverse=True)
        history = params.history_length if params.HasField("history_length") else None
        tasks = [_from_record(r, caller.base_url).task(history) for r in records[:size]]
        if not params.include_artifacts:
            for task in tasks:
                del task.artifacts[:]
        return pb.ListTasksResponse(
            tasks=tasks, next_page_token="", page_size=size, total_size=len(tasks)
        )

    @_mapped
    async def on_cancel_task(
        self, params: pb.CancelTaskRequest, context: ServerCallContext
    ) -> pb.Task | None:
        caller = _caller(context)
        found, builder = await self._task(caller, params.id)
        if builder.terminal:
            raise TaskNotCancelableError(f"task {params.id!r} has already ended")
        answer = await caller.services.manager.cancel(found.run_id, caller.principal)
        if answer is None:
            raise TaskNotFoundError(f"no task {params.id!r}")
        if answer[0] == "cancelling":
            await _wait_end(caller.services, found.run_id)
        _, builder = await self._task(caller, params.id)
        return builder.task()

    @_mapped_stream
    async def on_subscribe_to_task(
        self, params: pb.SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        caller = _caller(context)
        found, builder = await self._task(caller, params.id)
        if builder.terminal:
            raise UnsupportedOperationError(f"task {params.id!r} has ended: read it with GetTask")
        # a subscription lasts until the task ends: through its questions and their answers
        cursor = builder.last_seq
        async for event in self._stream(caller, builder, found.run_id, cursor, to_the_end=True):
            yield event

    # --- not offered --------------------------------------------------------------------------

    async def on_create_task_push_notification_config(
        self, params: pb.TaskPushNotificationConfig, context: ServerCallContext
    ) -> pb.TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError()

    async def on_get_task_push_notification_config(
        self, params: pb.GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> pb.TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError()

    async def on_list_task_push_notification_configs(
        self, params: pb.ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> pb.ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError()

    async def on_delete_task_push_notification_config(
        self, params: pb.DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        raise PushNotificationNotSupportedError()

    async def on_get_extended_agent_card(
        self, params: pb.GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> pb.AgentCard:
        raise ExtendedAgentCardNotConfiguredError()


def _from_record(record: RunHandle | RunRecord, base_url: str = "") -> TaskBuilder:
    """A task from its stored run alone (its log expired, or a list): state and answer."""
    builder = _builder(record, base_url)
    status = record.status
    if status == "completed":
        content = (record.output or {}).get("content")
        builder.feed(
            {"type": "run.completed", "seq": 0, "data": {"output": {"content": content or ""}}}
        )
    elif status == "failed":
        builder.feed({"type": "run.failed", "seq": 0, "data": {"error": record.error or {}}})
    elif status == "cancelled":
        builder.feed({"type": "run.cancelled", "seq": 0, "data": {}})
    elif status in ("running", "waiting"):
        builder.feed({"type": "run.started", "seq": 0, "data": {}})
    return builder


async def _wait_end(services: Services, run_id: str) -> None:
    """Wait (a bounded time) for the run's terminal event."""
    last = await services.bus.events.last_seq(run_id)
    if last is None:
        return
    stream = follow(services.bus.events, run_id, max(0, last - 1))
    try:
        async with asyncio.timeout(_CANCEL_WAIT):
            async for _ in stream:
                pass
    except (TimeoutError, ServiceError):
        pass
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
