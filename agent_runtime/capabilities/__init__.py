"""Capabilities beyond chat: embeddings, rerank, images, speech, transcription, media jobs.

Each call takes ``binding=``, a ``ModelBinding`` of its purpose (``ModelBinding.embed(...)``,
``.rerank``, ``.image``, ``.tts``, ``.asr``, ``.video``) or ``ModelBindings`` (the purpose's
chain, with failover). Used without an agent, a call owns its binding's lifetime: use the
binding as an async context manager::

    async with ModelBinding.image(model="gpt-image-1", api_key=key) as image:
        result = await generate_image(prompt="a red panda on a skateboard", binding=image)

``submit_image`` and ``submit_video`` run in the background and return a ``MediaJob`` bound to
the loop that created it. ``AgentCore`` offers the same calls on its own bindings
(``agent.embed(...)``, ``agent.submit_image(...)``) and cancels and awaits its media jobs in
``aclose()`` before it closes the providers.
"""

from __future__ import annotations

from .calls import embed, generate_image, rerank, synthesize_speech, transcribe
from .jobs import JobStatus, MediaJob, submit_image, submit_video
from .protocols import (
    EmbeddingProvider,
    ImageProvider,
    RerankProvider,
    SpeechProvider,
    TranscriptionProvider,
    VideoProvider,
)
from .results import (
    Embeddings,
    GeneratedImage,
    Images,
    RankedDocument,
    Ranking,
    Speech,
    Transcription,
    Video,
    VideoState,
)

__all__ = [
    "EmbeddingProvider",
    "Embeddings",
    "GeneratedImage",
    "ImageProvider",
    "Images",
    "JobStatus",
    "MediaJob",
    "RankedDocument",
    "Ranking",
    "RerankProvider",
    "Speech",
    "SpeechProvider",
    "Transcription",
    "TranscriptionProvider",
    "Video",
    "VideoProvider",
    "VideoState",
    "embed",
    "generate_image",
    "rerank",
    "submit_image",
    "submit_video",
    "synthesize_speech",
    "transcribe",
]
