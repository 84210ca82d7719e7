"""The embedded store: SQLite, by default under ``./var/``.

::

    store.py        ``SQLiteStore``: sessions, messages, runs, the outbox
    messages.py     a session's messages
    timestamps.py   how a time is written
    jobs.py         the thread its operations run on
    loop_connection.py  the connection a run's short operations use on the loop
    schema.py       its migrations
    checkpoints.py  run checkpoints
    schedules.py    schedules and their firings
"""
