"""The configured embedder of a process: the local model or a provider's."""

from __future__ import annotations

from typing import Any

from gateway.knowledge import embedding, remote
from gateway.knowledge.embedding import Embedder


def for_runtime(runtime: Any) -> Embedder:
    """``[pipeline] embedder``'s embedder (the local model is one per process)."""
    spec = embedding.configured(runtime.settings)
    if spec == embedding.LOCAL:
        return embedding.local()
    return remote.embedder(runtime, spec)
