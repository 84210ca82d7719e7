"""Who a request is: bearer keys to principals, and the stream tokens of browser readers.

::

    keys.py           ``AGENT_API_KEYS`` → principals; the FastAPI dependency
    stream_tokens.py  signed, short-lived tokens that let an EventSource read one run
"""
