"""Run notifications over HTTP: signed as Standard Webhooks, sent from the store's outbox.

``signing`` (the signature), ``targets`` (which URLs may be called, checked after DNS),
``messages`` (what a run's end or confirmation sends), ``delivery`` (the worker's sender).
"""
