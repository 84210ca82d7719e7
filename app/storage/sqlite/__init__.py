"""The embedded store: SQLite, by default under ``./var/``.

::

    store.py        ``SQLiteStore``: sessions, messages, runs, the outbox
    schema.py       its migrations
    checkpoints.py  run checkpoints
    schedules.py    schedules and their firings
"""
