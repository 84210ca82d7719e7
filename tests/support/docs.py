"""The documentation's fenced blocks: every page's, and the capability guide's Python examples."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
MARKER = re.compile(r"^\s*<!-- fragment(?::\s*(?P<why>\S.*?))? -->\s*$")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    text: str
    fragment: bool
    why: str | None = None

    @property
    def name(self) -> str:
        return f"{self.page}:{self.line}"


def blocks_of(path: Path, root: Path = ROOT) -> list[Block]:
    """The fenced blocks of a Markdown page, with their language and fragment marker."""
    lines = path.read_text(encoding="utf-8").splitlines()
    page = path.relative_to(root).as_posix()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        end = index + 1
        while end < len(lines):
            closing = lines[end].strip()
            if closing.startswith(fence) and set(closing) == {fence[0]}:
                break
            end += 1
        body = [
            line[indent:] if line[:indent].isspace() else line for line in lines[index + 1 : end]
        ]
        info = opening["info"].split()
        marker = MARKER.match(lines[index - 1]) if index > 0 else None
        found.append(
            Block(
                page=page,
                line=index + 1,
                language=info[0] if info else "",
                text="\n".join(body) + "\n",
                fragment=marker is not None,
                why=marker["why"] if marker is not None else None,
            )
        )
        index = end + 1
    return found


CAPABILITIES = ROOT / "docs" / "capabilities.md"
# the Python examples of the capability guide that need no server
CAPABILITY_BLOCKS = [
    block
    for block in re.findall(r"```python\n(.*?)```", CAPABILITIES.read_text(encoding="utf-8"), re.S)
    if "127.0.0.1:8000" not in block
]
