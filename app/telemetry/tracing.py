"""Traces: the OpenTelemetry SDK and its OTLP exporter, set up only when the environment asks.

::

    tracing_requested(environ)   the standard OTEL_* variables ask for traces?
    Tracing.from_environment()   TracerProvider + BatchSpanProcessor(OTLP/HTTP or console)
                                 + the runtime's OTelTracer (AGENT_TRACE_CONTENT: prompts too)
    TraceContextMiddleware       an incoming W3C ``traceparent`` becomes the current context of
                                 the request: the runs it starts are spans of the caller's trace
    Tracing.remember(...)        the run span's traceparent under the session, in the bus's
                                 shared values: another worker answering the run's
                                 confirmation continues (or links to) the run's trace

Nothing is imported from the SDK, and nothing is exported, unless tracing is requested: with
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) set, or
``OTEL_TRACES_EXPORTER`` naming ``otlp`` or ``console``; ``OTEL_SDK_DISABLED=true`` turns it off.
The exporter reads the other standard variables itself (headers, timeout, compression...).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.types import ASGIApp, Receive, Scope, Send

from agent_runtime.errors import ConfigurationError
from agent_runtime.integrations.otel import OTelTracer

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from app.bus.base import SharedValues

__all__ = ["TraceContextMiddleware", "Tracing", "check_tracing_environment", "tracing_requested"]

logger = logging.getLogger("app.telemetry.tracing")

_EXPORTERS = frozenset({"otlp", "console", "none"})
_ROUTE_TTL = 86_400.0  # a run waiting on a person may wait long; the key is replaced per run
# what workers store for each other is always W3C trace context, whatever OTEL_PROPAGATORS says
_W3C = TraceContextTextMapPropagator()


def _exporter_names(environ: Mapping[str, str]) -> list[str]:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    named = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if named:
        names = [n.strip() for n in named.split(",") if n.strip()]
        unknown = sorted(set(names) - _EXPORTERS)
        if unknown:
            raise ConfigurationError(
                f"OTEL_TRACES_EXPORTER={named!r}: {', '.join(unknown)} is not supported here; "
                "use otlp (OTLP over HTTP/protobuf), console or none"
            )
        return [n for n in names if n != "none"]
    if environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    ):
        return ["otlp"]
    return []


def tracing_requested(environ: Mapping[str, str] | None = None) -> bool:
    """True when the standard ``OTEL_*`` variables ask for traces (see the module docstring)."""
    return bool(_exporter_names(os.environ if environ is None else environ))


def check_tracing_environment(environ: Mapping[str, str] | None = None) -> None:
    """Raise ConfigurationError for ``OTEL_*`` values this service cannot honour."""
    env = os.environ if environ is None else environ
    if "otlp" in _exporter_names(env):
        _check_protocol(env)


def _check_protocol(environ: Mapping[str, str]) -> None:
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if protocol != "http/protobuf":
        raise ConfigurationError(
            f"OTLP protocol {protocol!r} is not supported here; this service exports "
            "http/protobuf (unset OTEL_EXPORTER_OTLP_PROTOCOL, or point it at a collector's "
            "HTTP port, 4318)"
        )


def _run_link(traceparent: str | None) -> SpanContext | None:
    if not traceparent:
        return None
    span = trace.get_current_span(_W3C.extract({"traceparent": traceparent}))
    found = span.get_span_context()
    return found if found.is_valid else None


class Tracing:
    """One worker's trace pipeline: its provider, the runtime's tracer, and propagation."""

    def __init__(self, provider: TracerProvider, *, capture_content: bool) -> None:
        self.provider = provider
        self.tracer = OTelTracer(tracer_provider=provider, capture_content=capture_content)
        self._app_tracer = provider.get_tracer("app")

    @classmethod
    def from_environment(
        cls, *, capture_content: bool, environ: Mapping[str, str] | None = None
    ) -> Tracing | None:
        """The pipeline the ``OTEL_*`` variables ask for; None when they ask for none."""
        env = os.environ if environ is None else environ
        names = _exporter_names(env)
        if not names:
            return None
        # imported only here: a service without tracing never loads the SDK
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        provider = TracerProvider(
            resource=Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", "agent-server")})
        )
        for name in names:
            if name == "otlp":
                _check_protocol(env)
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                    OTLPSpanExporter,
                )

                provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            else:
                provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        return cls(provider, capture_content=capture_content)

    async def aclose(self) -> None:
        """Export what is buffered and stop (in a thread: the exporter's calls block)."""
        await asyncio.to_thread(self.provider.shutdown)

    # --- across workers ----------------------------------------------------------------------

    def traceparent_of(self, run_id: str) -> str | None:
        """The W3C ``traceparent`` of a run in progress on this worker."""
        found = self.tracer.run_span_context(run_id)
        if found is None or not found.is_valid:
            return None
        carrier: dict[str, str] = {}
        _W3C.inject(carrier, context=trace.set_span_in_context(NonRecordingSpan(found)))
        return carrier.get("traceparent")

    async def remember(self, values: SharedValues, session_id: str, run_id: str) -> None:
        """Keep the run's trace context where any worker finds it by the run's session."""
        traceparent = self.traceparent_of(run_id)
        if traceparent is not None:
            await values.set(_route_key(session_id), f"{run_id} {traceparent}", _ROUTE_TTL)

    async def run_context(
        self, values: SharedValues, session_id: str, run_id: str | None
    ) -> SpanContext | None:
        """The span context of the session's run (``run_id``'s if given), wherever it runs."""
        if run_id is not None:
            local = self.tracer.run_span_context(run_id)
            if local is not None:
                return local
        stored = await values.get(_route_key(session_id))
        if stored is None:
            return None
        stored_run, _, traceparent = stored.partition(" ")
        if run_id is not None and stored_run != run_id:
            return None
        return _run_link(traceparent)

    @contextlib.contextmanager
    def answer_span(
        self, name: str, session_id: str, run_id: str | None, run: SpanContext | None
    ) -> Iterator[Span]:
        """The span of an answer (``external_event <name>``) to a waiting run.

        Its parent is the caller's trace when the request carried a ``traceparent``, else the
        run's own trace; either way it links to the run's span.
        """
        current = trace.get_current_span().get_span_context()
        parent: otel_context.Context | None = None
        if not current.is_valid and run is not None:
            parent = trace.set_span_in_context(NonRecordingSpan(run))
        attributes: dict[str, Any] = {"gen_ai.conversation.id": session_id}
        if run_id is not None:
            attributes["agent_runtime.run.id"] = run_id
        with self._app_tracer.start_as_current_span(
            f"external_event {name}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            links=[Link(run)] if run is not None else None,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield span
            except Exception as exc:
                span.set_attribute("error.type", type(exc).__name__)
                span.set_status(StatusCode.ERROR)
                raise


def _route_key(session_id: str) -> str:
    return f"trace:{session_id}"


class TraceContextMiddleware:
    """Make an incoming ``traceparent`` (and ``tracestate``) the request's current context.

    Installed only when tracing is on. The runs a request starts are tasks created within it,
    so their spans take the caller's trace as parent.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        carrier: dict[str, str] = {}
        for key, value in scope.get("headers", ()):
            if key in (b"traceparent", b"tracestate"):
                carrier[key.decode("latin-1")] = value.decode("latin-1")
        if "traceparent" not in carrier:
            await self.app(scope, receive, send)
            return
        token = otel_context.attach(propagate.extract(carrier))
        try:
            await self.app(scope, receive, send)
        finally:
            otel_context.detach(token)
