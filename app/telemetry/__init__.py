"""What a worker tells its operators: logs, metrics and traces.

::

    logs.py     structured logs (JSON, or text on a terminal)
    metrics.py  Prometheus metrics in the app's own registry
    tracing.py  OpenTelemetry traces, when the environment asks for them
"""
