"""Keeping the garbage collector's pauses out of loop-blocking checks."""

from __future__ import annotations

import gc

__all__ = ["freeze_imports"]


def freeze_imports() -> None:
    """Move every object alive now (the imported modules above all) out of the collector's view.

    The two SDKs bring some 180,000 long-lived objects. While the collector tracks them, every
    full collection pauses the event loop for about a quarter of a second, which the runtime
    tests' blocking-call watchdog reports as a blocked loop. Call it once, after the imports.
    (A server process benefits from the same call after its warm-up.)
    """
    gc.freeze()
