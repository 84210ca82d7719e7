"""A BERT sentence encoder in numpy: the default backend of the local providers.

It runs the sentence-transformers layout of a BERT-family model (``config.json``,
``model.safetensors``, ``tokenizer.json``, ``1_Pooling/config.json``, ``modules.json``) with
nothing but numpy and the ``tokenizers`` package: no torch, no transformers, no network. The
weights are read once (``load_bert``); ``BertEncoder.encode`` is then a pure function of read-only
arrays, safe to call from several threads at once (numpy releases the GIL in its kernels). The
tokenizer, whose padding and truncation settings are state, is behind a lock.

The arithmetic is the reference model's: embeddings + LayerNorm, ``num_hidden_layers`` blocks
of multi-head self-attention and a GELU feed-forward (each with a residual LayerNorm), then the
pooling the model was trained with (mean over tokens or the CLS token) and, if the model says
so, L2 normalisation. Vectors agree with sentence-transformers' to about 1e-6.
"""

from __future__ import annotations

import json
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ..errors import ConfigurationError

__all__ = ["BertEncoder", "load_bert"]

Array = NDArray[np.float32]
Ids = NDArray[np.int64]

_DTYPES: dict[str, Any] = {"F32": np.float32, "F16": np.float16, "BF16": None, "I64": np.int64}


def read_safetensors(path: Path) -> dict[str, NDArray[Any]]:
    """The tensors of a ``.safetensors`` file (an 8-byte header length, a JSON header, the
    raw little-endian data), as numpy arrays."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
        data = handle.read()
    tensors: dict[str, NDArray[Any]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info["dtype"])
        begin, end = info["data_offsets"]
        if info["dtype"] == "BF16":  # the upper half of a float32
            raw = np.frombuffer(data[begin:end], dtype="<u2").astype(np.uint32) << 16
            tensors[name] = raw.view(np.float32).reshape(info["shape"])
            continue
        if dtype is None:
            raise ConfigurationError(f"{path}: tensor {name} has unsupported type {info['dtype']}")
        tensors[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(info["shape"])
    return tensors


@dataclass(frozen=True, slots=True)
class _Layer:
    qkv: Array  # (hidden, 3 * hidden): query, key and value projections side by side
    qkv_bias: Array
    out: Array
    out_bias: Array
    norm1: tuple[Array, Array]
    up: Array
    up_bias: Array
    down: Array
    down_bias: Array
    norm2: tuple[Array, Array]


class BertEncoder:
    """A loaded model. ``encode(texts)`` returns (vectors, token count)."""

    def __init__(
        self,
        *,
        tokenizer: Any,
        tensors: dict[str, NDArray[Any]],
        config: dict[str, Any],
        pooling: str,
        normalize: bool,
        max_length: int,
    ) -> None:
        self._tokenizer = tokenizer
        self._tokenizer_lock = threading.Lock()
        self._heads = int(config["num_attention_heads"])
        self._eps = np.float32(config.get("layer_norm_eps", 1e-12))
        self._pooling = pooling
        self._normalize = normalize
        self.max_length = max_length
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in tensors else ""

        def get(name: str) -> Array:
            return np.ascontiguousarray(tensors[prefix + name], dtype=np.float32)

        self._words = get("embeddings.word_embeddings.weight")
        self._positions = get("embeddings.position_embeddings.weight")
        self._types = get("embeddings.token_type_embeddings.weight")
        self._norm = (get("embeddings.LayerNorm.weight"), get("embeddings.LayerNorm.bias"))
        self.dimensions = int(self._words.shape[1])
        self._layers: list[_Layer] = []
        for index in range(int(config["num_hidden_layers"])):
            base = f"encoder.layer.{index}."
            attention = base + "attention."
            projections = [attention + f"self.{part}" for part in ("query", "key", "value")]
            self._layers.append(
                _Layer(
                    qkv=np.ascontiguousarray(
                        np.concatenate([get(p + ".weight") for p in projections]).T
                    ),
                    qkv_bias=np.concatenate([get(p + ".bias") for p in projections]),
                    out=np.ascontiguousarray(get(attention + "output.dense.weight").T),
                    out_bias=get(attention + "output.dense.bias"),
                    norm1=(
                        get(attention + "output.LayerNorm.weight"),
                        get(attention + "output.LayerNorm.bias"),
                    ),
                    up=np.ascontiguousarray(get(base + "intermediate.dense.weight").T),
                    up_bias=get(base + "intermediate.dense.bias"),
                    down=np.ascontiguousarray(get(base + "output.dense.weight").T),
                    down_bias=get(base + "output.dense.bias"),
                    norm2=(
                        get(base + "output.LayerNorm.weight"),
                        get(base + "output.LayerNorm.bias"),
                    ),
                )
            )

    def tokenize(
        self, texts: list[str]
    ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
        """Token ids, type ids and attention mask, padded to the longest text."""
        with self._tokenizer_lock:
            encoded = self._tokenizer.encode_batch(texts)
        ids = np.array([item.ids for item in encoded], dtype=np.int64)
        types = np.array([item.type_ids for item in encoded], dtype=np.int64)
        mask = np.array([item.attention_mask for item in encoded], dtype=np.int64)
        return ids, types, mask

    def encode(self, texts: list[str]) -> tuple[Array, int]:
        """One vector per text (rows, float32) and the number of tokens read."""
        ids, types, mask = self.tokenize(texts)
        batch, length = ids.shape
        x = self._words[ids] + self._positions[:length][None] + self._types[types]
        x = self._layer_norm(x, self._norm)
        keep = mask.astype(np.float32)
        # padded positions get no attention: a large negative score before the softmax
        bias = ((np.float32(1.0) - keep) * np.float32(-1e9))[:, None, None, :]
        heads = self._heads
        size = self.dimensions // heads
        scale = np.float32(1.0 / np.sqrt(size))
        for layer in self._layers:
            qkv = x @ layer.qkv + layer.qkv_bias
            qkv = qkv.reshape(batch, length, 3, heads, size).transpose(2, 0, 3, 1, 4)
            query, key, value = qkv[0], qkv[1], qkv[2]
            scores = (query @ key.transpose(0, 1, 3, 2)) * scale + bias
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ value).transpose(0, 2, 1, 3).reshape(batch, length, self.dimensions)
            x = self._layer_norm(context @ layer.out + layer.out_bias + x, layer.norm1)
            hidden = _gelu(x @ layer.up + layer.up_bias)
            x = self._layer_norm(hidden @ layer.down + layer.down_bias + x, layer.norm2)
        if self._pooling == "cls":
            vectors = x[:, 0]
        else:
            weights = keep[:, :, None]
            vectors = (x * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        if self._normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.maximum(norms, 1e-12)
        return vectors.astype(np.float32, copy=False), int(mask.sum())

    def _layer_norm(self, x: Array, weights: tuple[Array, Array]) -> Array:
        mean = x.mean(axis=-1, keepdims=True)
        centered = x - mean
        variance = (centered * centered).mean(axis=-1, keepdims=True)
        normed: Array = centered / np.sqrt(variance + self._eps) * weights[0] + weights[1]
        return normed


def _gelu(x: Array) -> Array:
    """GELU with the error function (BERT's exact form), erf by Abramowitz-Stegun 7.1.26
    (absolute error below 1.5e-7, below float32's resolution of these values)."""
    z = x * np.float32(0.7071067811865476)
    sign = np.sign(z)
    a = np.abs(z)
    t = np.float32(1.0) / (np.float32(1.0) + np.float32(0.3275911) * a)
    poly = np.float32(1.061405429)
    for coefficient in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        poly = poly * t + np.float32(coefficient)
    poly = poly * t
    erf = sign * (np.float32(1.0) - poly * np.exp(-a * a))
    out: Array = np.float32(0.5) * x * (np.float32(1.0) + erf)
    return out


def load_bert(directory: Path, *, max_length: int | None = None) -> BertEncoder:
    """Load a sentence-transformers BERT model directory; ConfigurationError says what is
    missing or unsupported."""
    from tokenizers import Tokenizer

    config = _json(directory / "config.json")
    if config.get("model_type") != "bert":
        raise ConfigurationError(
            f"{directory}: the numpy backend runs BERT models; this one is "
            f"{config.get('model_type')!r} (use backend='sentence-transformers')"
        )
    weights = directory / "model.safetensors"
    if not weights.is_file():
        raise ConfigurationError(f"{directory}: model.safetensors is missing")
    pooling_config = directory / "1_Pooling" / "config.json"
    pooling = "mean"
    if pooling_config.is_file():
        options = _json(pooling_config)
        if options.get("pooling_mode_cls_token"):
            pooling = "cls"
        elif not options.get("pooling_mode_mean_tokens", True):
            raise ConfigurationError(f"{directory}: only mean and CLS pooling are supported")
    modules = directory / "modules.json"
    normalize = modules.is_file() and any(
        str(module.get("type", "")).endswith("Normalize") for module in _json_list(modules)
    )
    limit = max_length
    if limit is None:
        sentence = directory / "sentence_bert_config.json"
        limit = int(_json(sentence).get("max_seq_length", 512)) if sentence.is_file() else 512
    limit = min(limit, int(config.get("max_position_embeddings", 512)))
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.enable_truncation(limit)
    tokenizer.enable_padding(pad_id=int(config.get("pad_token_id", 0)))
    return BertEncoder(
        tokenizer=tokenizer,
        tensors=read_safetensors(weights),
        config=config,
        pooling=pooling,
        normalize=normalize,
        max_length=limit,
    )


def _json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot read {path}: {exc}") from exc
    if not isinstance(value, dict):
        raise ConfigurationError(f"{path} is not a JSON object")
    return value


def _json_list(path: Path) -> list[dict[str, Any]]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot read {path}: {exc}") from exc
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []
