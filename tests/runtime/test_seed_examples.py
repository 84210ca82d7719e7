"""The specification's complete example programs run with only the package renamed."""

from __future__ import annotations

import asyncio
import contextlib
import io
from typing import Any

import pytest

from tests.support.seeds import complete_source, renamed, seed_text


def test_seed_001_cancellation_example_runs_unchanged() -> None:
    text = seed_text("001")
    if text is None:
        pytest.skip("the specification documents are not beside this checkout")
    source = renamed(complete_source(text, '"""Close a streaming request', "asyncio.run(main())"))
    namespace: dict[str, Any] = {"__name__": "seed_001"}
    exec(compile(source, "seed_001_cancellation.py", "exec"), namespace)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        asyncio.run(namespace["main"]())
    assert out.getvalue().splitlines() == [
        "Cancelled request; extension state cleared",
        "Partial answer",
    ]
