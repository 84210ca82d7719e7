"""Capability work over HTTP (embeddings, rerank, media jobs) in the worker's admission.

::

    jobs.py  admitted calls, and background media jobs with their status and result
"""
