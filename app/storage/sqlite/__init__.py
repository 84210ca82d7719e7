"""The embedded store: SQLite, by default under ``./var/``.

::

    store.py        ``SQLiteStore``: sessions, messages, runs, the outbox
    jobs.py         the thread its operations run on
    loop_connection.py  the connection a run's short operations use on the loop
    schema.py       its migrations
    checkpoints.py  run checkpoints
    schedules.py    schedules and their firings
"""
