"""The run manager: starts runs, owns their event logs, cancels them, drains them.

A run is decoupled from the HTTP response that started it::

    start()  session (store) → session lock (bus) → admission ticket → run record + event log
       └─ task: Driver.execute()
            wait for a slot (background runs) → load the conversation → agent.stream(...)
            every AgentEvent → wire event (seq, JSON once) → the run's event log
            the runtime's terminal event (or our own, for a run cut short before or around
            the runtime) → store the messages and the run → release lock and slot →
            append the one terminal wire event, which seals the log

``RunManager`` (``app.runs.manager``) is the one object the rest of the service uses; the
modules beside it each hold one part of a run's life.
"""

from app.runs.handle import RunHandle, RunRequestOptions, record_view
from app.runs.manager import RunManager

__all__ = ["RunHandle", "RunManager", "RunRequestOptions", "record_view"]
