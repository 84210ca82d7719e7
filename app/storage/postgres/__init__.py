"""The store at scale: PostgreSQL through asyncpg.

::

    store.py        ``PostgresStore``: sessions, messages, runs, the outbox
    schema.py       its migrations
    checkpoints.py  run checkpoints
    schedules.py    schedules and their firings
"""
