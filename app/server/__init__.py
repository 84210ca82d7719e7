"""A worker process: what starts, serves and stops one worker.

::

    lifespan.py       a worker's lifetime: store, bus, agents, warm-up; drain; close
    services.py       what the worker's requests share (built by the lifespan)
    readiness.py      the store's and the bus's health, with hysteresis (/readyz)
    listen.py         binding the listening address before a worker starts
    supervisor.py     ``--workers N``: a socket per worker, replacing a worker that died
    http_protocol.py  the connection guard under the app (head size and time, connections)
"""
