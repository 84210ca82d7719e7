"""The skill catalogue: skills read from disk in the Agent Skills format.

A skill is a folder holding a ``SKILL.md`` whose YAML front matter names and describes it; the
body after the front matter is its instructions, the folder's other files its resources::

    pdf-forms/
      SKILL.md          ---\\nname: pdf-forms\\ndescription: Fill in PDF forms.\\n---\\nSteps...
      reference.md
      scripts/fill.py

Front matter keys: ``name`` (required; 1 to 64 lowercase letters, digits and single hyphens,
equal to the folder's name), ``description`` (required, at most 1024 characters),
``allowed-tools`` (optional: a list, or a string of names separated by spaces or commas; names
or ``fnmatch`` patterns), and any others (``license``, ``compatibility``, ``metadata``...), kept
in ``Skill.metadata``.

``SkillManager(paths)`` reads every path in a worker thread, never on the event loop. A path is
a folder of skill folders, or one skill folder. Later paths override earlier ones: a skill of
the same name found in a later path replaces the earlier one. A skill that cannot be read is
reported in ``problems`` (with its path) and logged, and the others still load.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import SkillResourceError

__all__ = [
    "MAX_DESCRIPTION_CHARS",
    "MAX_NAME_CHARS",
    "MAX_RESOURCE_BYTES",
    "Skill",
    "SkillManager",
    "SkillProblem",
    "parse_skill",
]

logger = logging.getLogger("agent_runtime.skills")

SKILL_FILE = "SKILL.md"
MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024
#: A resource larger than this is refused: it would flood the conversation.
MAX_RESOURCE_BYTES = 256 * 1024
# a folder with more files than this lists only the first ones (sorted) to the model
_MAX_LISTED_RESOURCES = 200
_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)^---[ \t]*(?:\r?\n|\Z)", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Skill:
    """One skill: its name, description, instructions, folder and resource files.

    ``allowed_tools`` is None when the skill does not restrict tools; otherwise the tool names
    (or patterns) a run may call while the skill is active.
    """

    name: str
    description: str
    instructions: str
    path: Path
    allowed_tools: tuple[str, ...] | None = None
    resources: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def read_resource(self, relative: str) -> str:
        """The text of one of the skill's files (blocking file I/O: call it in a thread).

        The path is relative to the skill's folder; an absolute path, a ``..`` component, a
        symlink that leads out of the folder, a missing file or one over ``MAX_RESOURCE_BYTES``
        raises SkillResourceError.
        """
        target = _confined(self.path, relative)
        try:
            size = target.stat().st_size
            if size > MAX_RESOURCE_BYTES:
                raise SkillResourceError(
                    f"resource {relative!r} of skill {self.name!r} is {size} bytes; at most "
                    f"{MAX_RESOURCE_BYTES} are read"
                )
            return target.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise SkillResourceError(
                f"resource {relative!r} of skill {self.name!r} cannot be read ({exc.strerror})"
            ) from None


@dataclass(frozen=True, slots=True)
class SkillProblem:
    """A skill that was skipped: where it is and why."""

    path: Path
    problem: str

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


def _confined(root: Path, relative: str) -> Path:
    if not isinstance(relative, str) or not relative.strip():
        raise SkillResourceError("a resource path must be a non-empty relative path")
    candidate = Path(relative)
    if candidate.is_absolute() or relative.startswith(("/", "\\")):
        raise SkillResourceError(f"resource path {relative!r} must be relative to the skill")
    if any(part == ".." for part in re.split(r"[\\/]", relative)):
        raise SkillResourceError(f"resource path {relative!r} may not contain '..'")
    base = root.resolve()
    # resolve() follows every symlink: a link that points out of the folder ends outside it
    target = (base / candidate).resolve()
    if target != base and base not in target.parents:
        raise SkillResourceError(f"resource path {relative!r} leads out of the skill's folder")
    if not target.is_file():
        raise SkillResourceError(f"the skill has no file {relative!r}")
    return target


def _allowed_tools(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        items = [item for item in re.split(r"[\s,]+", value) if item]
    elif isinstance(value, list) and all(isinstance(item, str) for item in value):
        items = [item.strip() for item in value if item.strip()]
    else:
        raise ValueError("allowed-tools must be a list of tool names or a string of them")
    return tuple(items)


def parse_skill(folder: Path) -> Skill:
    """Read one skill folder; ValueError says what is wrong with it (blocking I/O)."""
    source = folder / SKILL_FILE
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{SKILL_FILE} cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{SKILL_FILE} is not UTF-8 text") from None
    match = _FRONT_MATTER.match(text.lstrip("\ufeff"))
    if match is None:
        raise ValueError(f"{SKILL_FILE} must begin with YAML front matter between '---' lines")
    try:
        front = yaml.safe_load(match.group(1))
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 2})" if where is not None else ""
        raise ValueError(f"the front matter is not valid YAML{line}") from None
    if not isinstance(front, dict):
        raise ValueError("the front matter must be a mapping of keys to values")
    name = front.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError("the front matter needs a name")
    if len(name) > MAX_NAME_CHARS or not _NAME.match(name):
        raise ValueError(
            f"name {name!r} must be 1 to {MAX_NAME_CHARS} lowercase letters, digits and "
            "single hyphens, not starting or ending with one"
        )
    if name != folder.name:
        raise ValueError(f"name {name!r} must equal the skill's folder name {folder.name!r}")
    description = front.get("description")
    if not isinstance(description, str) or not description.strip():
        raise ValueError("the front matter needs a description")
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise ValueError(
            f"the description has {len(description)} characters; at most "
            f"{MAX_DESCRIPTION_CHARS} are allowed"
        )
    allowed = _allowed_tools(front.get("allowed-tools"))
    metadata = {
        key: value
        for key, value in front.items()
        if key not in ("name", "description", "allowed-tools")
    }
    return Skill(
        name=name,
        description=description.strip(),
        instructions=text[match.end() :].strip(),
        path=folder,
        allowed_tools=allowed,
        resources=_resources(folder),
        metadata=metadata,
    )


def _resources(folder: Path) -> tuple[str, ...]:
    found: list[str] = []
    # followlinks=False: a linked directory is not walked (its files may be anywhere)
    for top, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith("."):
                continue
            relative = Path(top, name).relative_to(folder).as_posix()
            if relative != SKILL_FILE:
                found.append(relative)
            if len(found) >= _MAX_LISTED_RESOURCES:
                return tuple(found)
    return tuple(found)


def _skill_folders(path: Path) -> list[Path]:
    # exists(), not is_file(): a SKILL.md that is no regular file is reported, not ignored
    if (path / SKILL_FILE).exists():
        return [path]
    return sorted(child for child in path.iterdir() if (child / SKILL_FILE).exists())


class SkillManager:
    """The catalogue of skills found under ``paths`` (folders of skill folders, or skill folders).

    Shared, read-mostly state: the catalogue is read once, in a worker thread, by the first
    ``aload()`` (an ``AgentCore`` calls it when a run first needs skills) and cached;
    ``reload()`` is the explicit refresh. Later paths override earlier ones by name. Safe to
    share between agents, loops and threads.
    """

    def __init__(self, paths: Iterable[str | os.PathLike[str]] = ()) -> None:
        self.paths: tuple[Path, ...] = tuple(Path(p) for p in paths)
        self._skills: dict[str, Skill] | None = None
        self._problems: tuple[SkillProblem, ...] = ()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        state = "not loaded" if self._skills is None else f"{len(self._skills)} skill(s)"
        return f"<SkillManager paths={[str(p) for p in self.paths]} {state}>"

    @property
    def loaded(self) -> bool:
        """True once the catalogue was read."""
        return self._skills is not None

    @property
    def skills(self) -> Mapping[str, Skill]:
        """The loaded skills by name, in name order (empty before the first load)."""
        return dict(self._skills or {})

    @property
    def problems(self) -> tuple[SkillProblem, ...]:
        """The skills the last load skipped, with why."""
        return self._problems

    def get(self, name: str) -> Skill | None:
        """The loaded skill of that name, if any."""
        return (self._skills or {}).get(name)

    async def aload(self) -> Mapping[str, Skill]:
        """The catalogue, read in a worker thread the first time, cached afterwards."""
        if self._skills is not None:
            return self._skills
        return await asyncio.to_thread(self._load_once)

    async def reload(self) -> Mapping[str, Skill]:
        """Read the catalogue again (in a worker thread) and replace the cached one."""
        return await asyncio.to_thread(self._load, True)

    def load_blocking(self) -> Mapping[str, Skill]:
        """``aload`` for code without a loop (a script, a thread): reads on the calling thread."""
        return self._load_once()

    def _load_once(self) -> dict[str, Skill]:
        return self._load(False)

    def _load(self, force: bool) -> dict[str, Skill]:
        with self._lock:
            if self._skills is not None and not force:
                return self._skills
            skills: dict[str, Skill] = {}
            problems: list[SkillProblem] = []
            for path in self.paths:
                try:
                    folders = _skill_folders(path)
                except OSError as exc:
                    problems.append(SkillProblem(path, f"cannot be listed ({exc.strerror})"))
                    continue
                for folder in folders:
                    try:
                        skill = parse_skill(folder)
                    except ValueError as exc:
                        problems.append(SkillProblem(folder, str(exc)))
                        continue
                    skills[skill.name] = skill  # a later path overrides an earlier one
            for problem in problems:
                logger.warning(
                    "skill skipped: %s", problem.problem, extra={"path": str(problem.path)}
                )
            self._skills = dict(sorted(skills.items()))
            self._problems = tuple(problems)
            return self._skills
