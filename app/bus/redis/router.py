"""Command routing over Redis: find the worker holding a run, ask it, wait for its answer.

Registry: ``route:<run>`` names the worker holding the run (``SET PX``, extended with the
run's session lease by every renewal, deleted when the run's log is sealed or the run is
unregistered), so a dead worker's routes vanish with its leases.

Request/reply: every worker subscribes to its own channel ``cmd:<worker>``. A caller tries
its own handler first; otherwise it looks the holder up, ``PUBLISH``es a JSON command with a
fresh reply key, and ``BLPOP``s that key for at most ``reply_timeout`` seconds. ``PUBLISH``
answers how many subscribers got the message: 0 means the worker is gone, and the caller
answers at once (not delivered) instead of waiting. The holder runs the command with its
``CommandHandler`` and ``RPUSH``es the result on the reply key, which expires on its own if
nobody reads it.

Commands: ``{"op": "cancel", "run_id", "reason", "reply"}`` → ``{"ok": bool}``;
``{"op": "deliver", "session_id", "run_id", "name", "payload", "reply"}`` →
``{"accepted": [names]}``, with ``"retry": true`` when the worker cannot speak for the run
now (past its lease, handing it over, or resumed and not asking again yet).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from typing import Any, Final

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from agent_runtime.extensions.external import ExternalEvent
from app.bus.base import CommandHandler
from app.bus.redis import scripts
from app.bus.redis.connection import Keys, text, unavailable
from app.bus.redis.locks import milliseconds
from app.tasks import stop_task

__all__ = ["RedisRouter"]

logger = logging.getLogger("app.bus.redis")

_REPLY_TTL_MS: Final = 60_000
_RETRY_FIRST: Final = 0.1
_RETRY_MAX: Final = 2.0


class RedisRouter:
    """Routes cancellations and external answers to the worker holding a run."""

    def __init__(
        self,
        client: Redis,
        keys: Keys,
        where: str,
        worker: str,
        *,
        route_ttl: float,
        reply_timeout: float,
    ) -> None:
        self._client = client
        self._keys = keys
        self._where = where
        self.worker = worker
        self._channel = keys.commands(worker)
        self._route_ms = milliseconds(route_ttl)
        self._reply_timeout = reply_timeout
        self._unregister: Any = client.register_script(scripts.UNREGISTER)
        self._handler: CommandHandler | None = None
        self._runs: dict[str, str] = {}
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()
        self._replies: set[asyncio.Task[None]] = set()

    # --- lifetime ---------------------------------------------------------------------------

    async def start(self, timeout: float) -> None:  # noqa: ASYNC109 - the start's own budget
        """Subscribe to this worker's channel; raises BusUnavailable if that fails in time."""
        self._listener = asyncio.get_running_loop().create_task(
            self._listen(), name="redis-commands"
        )
        try:
            async with asyncio.timeout(timeout):
                await self._subscribed.wait()
        except TimeoutError:
            async with unavailable(self._where, "subscribing to this worker's command channel"):
                raise TimeoutError("no subscription in time") from None

    async def aclose(self) -> None:
        listener, self._listener = self._listener, None
        await stop_task(listener)
        if self._replies:
            await asyncio.wait(self._replies)

    # --- Router -----------------------------------------------------------------------------

    def bind(self, handler: CommandHandler) -> None:
        self._handler = handler

    async def register(self, run_id: str, session_id: str) -> None:
        async with unavailable(self._where, "registering a run"):
            await self._client.set(self._keys.route(run_id), self.worker, px=self._route_ms)
        self._runs[run_id] = session_id

    @property
    def route(self) -> tuple[str, int]:
        """What a run's route key holds, and for how long (ms): for a script that routes a
        run to this worker itself (``RedisEventLog.create``), which then calls ``routed_here``."""
        return self.worker, self._route_ms

    def routed_here(self, run_id: str, session_id: str) -> None:
        """Note a run routed here by such a script (``register`` without the call)."""
        self._runs[run_id] = session_id

    def forget(self, run_id: str) -> None:
        """Drop this worker's own entry for ``run_id`` (its session lock was released); the
        route key, if unregistering cannot reach Redis, expires with its TTL."""
        self._runs.pop(run_id, None)

    async def unregister(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
        async with unavailable(self._where, "unregistering a run"):
            await self._unregister(keys=[self._keys.route(run_id)], args=[self.worker])

    async def cancel(self, run_id: str, reason: str) -> bool:
        handler = self._handler
        if handler is not None and handler.cancel_local(run_id, reason):
            return True
        worker = await self._holder_of(run_id)
        if worker is None or worker == self.worker:
            return False
        answer = await self._ask(worker, {"op": "cancel", "run_id": run_id, "reason": reason})
        return bool(answer is not None and answer.get("ok"))

    async def deliver_external(
        self, session_id: str, run_id: str | None, event: ExternalEvent
    ) -> list[str] | None:
        handler = self._handler
        here: list[str] | None = None
        if handler is not None:
            here = handler.deliver_local(session_id, run_id, event)
            if here:
                return here
        target = run_id
        if target is None:  # the answer is for whichever run holds the session
            async with unavailable(self._where, "reading a session lock"):
                value = await self._client.get(self._keys.lock(session_id))
            if value is None:
                return here
            target = text(value).partition(" ")[2]
        worker = await self._holder_of(target)
        if worker is None or worker == self.worker:
            return here
        answer = await self._ask(
            worker,
            {
                "op": "deliver",
                "session_id": session_id,
                "run_id": run_id,
                "name": event.name,
                "payload": dict(event.payload),
            },
        )
        if answer is None or answer.get("retry"):
            return None  # gone, silent, or between owners there
        names = answer.get("accepted")
        return [str(item) for item in names] if isinstance(names, list) else []

    @property
    def registered(self) -> int:
        """Runs registered as held by this worker."""
        return len(self._runs)

    # --- the requesting side ----------------------------------------------------------------

    async def _holder_of(self, run_id: str) -> str | None:
        async with unavailable(self._where, "looking up the worker of a run"):
            worker = await self._client.get(self._keys.route(run_id))
        return None if worker is None else text(worker)

    async def _ask(self, worker: str, command: dict[str, Any]) -> dict[str, Any] | None:
        """Send ``command`` to ``worker``; its answer, or None if it is gone or silent."""
        request = secrets.token_hex(12)
        reply = self._keys.reply(request)
        message = json.dumps({**command, "reply": reply}, separators=(",", ":"))
        async with unavailable(
            self._where, "sending a command to another worker", extra=self._reply_timeout
        ):
            receivers = await self._client.publish(self._keys.commands(worker), message)
            if not receivers:
                logger.info("worker %s is gone; command %s not delivered", worker, command["op"])
                return None
            answer = await self._client.blpop([reply], timeout=self._reply_timeout)
        if answer is None:
            logger.warning(
                "worker %s did not answer a %s command within %.1f s",
                worker,
                command["op"],
                self._reply_timeout,
            )
            return None
        value = json.loads(text(answer[1]))
        return value if isinstance(value, dict) else None

    # --- the answering side -----------------------------------------------------------------

    async def _listen(self) -> None:
        delay = _RETRY_FIRST
        failing = False
        while True:
            pubsub: PubSub = self._client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self._channel)
                self._subscribed.set()
                if failing:
                    logger.info("Redis reachable again: taking commands")
                    failing = False
                delay = _RETRY_FIRST
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=5.0)
                    if message is not None and message.get("type") == "message":
                        self._on_command(message["data"])
            except (RedisError, OSError) as exc:
                if not failing:
                    logger.warning("Redis unreachable: this worker takes no commands: %s", exc)
                failing = True
            except Exception:  # the listener must outlive anything a message does to it
                logger.exception("the command listener failed; restarting it")
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RETRY_MAX)

    def _on_command(self, data: Any) -> None:
        try:
            command = json.loads(text(data))
            reply = str(command["reply"])
            op = command["op"]
        except (ValueError, KeyError, TypeError):
            logger.warning("ignored a malformed command")
            return
        if not reply.startswith(self._keys.reply("")):
            logger.warning("ignored a command whose reply key is not ours")
            return
        handler = self._handler
        answer: dict[str, Any]
        try:
            if op == "cancel":
                ok = handler is not None and handler.cancel_local(
                    str(command["run_id"]), str(command["reason"])
                )
                answer = {"ok": ok}
            elif op == "deliver":
                accepted = (
                    None
                    if handler is None
                    else handler.deliver_local(
                        str(command["session_id"]),
                        None if command.get("run_id") is None else str(command["run_id"]),
                        # built once on this worker, from the wire
                        ExternalEvent(str(command["name"]), dict(command.get("payload") or {})),
                    )
                )
                answer = (
                    {"accepted": [], "retry": True}
                    if accepted is None
                    else {"accepted": list(accepted)}
                )
            else:
                logger.warning("ignored an unknown command %r", op)
                return
        except Exception:
            logger.exception("a routed command failed", extra={"op": op})
            answer = {"ok": False, "accepted": []}
        task = asyncio.get_running_loop().create_task(self._answer(reply, answer))
        self._replies.add(task)
        task.add_done_callback(self._replies.discard)

    async def _answer(self, reply: str, answer: dict[str, Any]) -> None:
        try:
            async with self._client.pipeline(transaction=True) as pipe:
                pipe.rpush(reply, json.dumps(answer, separators=(",", ":")))
                pipe.pexpire(reply, _REPLY_TTL_MS)
                await pipe.execute()
        except (RedisError, OSError):
            logger.warning("could not answer a routed command", exc_info=True)
