"""Embedders: texts to unit vectors, the same one for chunks and for search queries.

``[pipeline] embedder = "local"`` (the default) is wordllama's ``l2_supercat`` model: 256
dimensions of average-pooled token embeddings whose weights and tokenizer ship inside the
wheel, so nothing is downloaded at run time. It is loaded once per process, on first use, and
runs on one dedicated thread. The model holds the GIL for most of its work, so the thread buys
no parallelism, but the interpreter hands the GIL over every few milliseconds: measured with
64 chunks per call, the event loop stalled up to ~40 ms instead of the whole run of calls
(300+ ms), so heartbeats and requests of the same process keep moving. One thread also keeps
the tokenizer out of concurrent use.
``"<provider>:<model>"`` calls a provider (``gateway.knowledge.remote``).

Every vector is L2-normalised (a dot product is the cosine) and recorded under its model id,
``<embedder>@<dimensions>``: vectors of two ids are never compared.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gateway.config import ConfigError

LOCAL = "local"
LOCAL_MODEL = "l2_supercat"
LOCAL_DIMENSIONS = 256
MODEL_RUN = 8  # texts per pass through the model (measured: see ``embed_now``)
# Model ids are written into SQL as literals (partial-index predicates must be constants).
_MODEL_ID = re.compile(r"^[A-Za-z0-9_.:/+-]{1,200}@[0-9]{1,6}$")


class Embedder(Protocol):
    """``name`` is what ``[pipeline] embedder`` says; ``embed`` returns one unit row per
    text (float32, shape ``(len(texts), dimensions)``)."""

    name: str

    async def embed(self, texts: Sequence[str], **usage: Any) -> np.ndarray: ...


def model_id(name: str, dimensions: int) -> str:
    value = f"{name}@{dimensions}"
    if not _MODEL_ID.match(value):
        raise ValueError(f"embedder name {name!r} has characters outside [A-Za-z0-9_.:/+-]")
    return value


def normalise(rows: np.ndarray) -> np.ndarray:
    """Unit rows; a row of zeros (an empty text) stays zeros instead of becoming NaN."""
    rows = np.asarray(rows, dtype=np.float32)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return np.divide(rows, norms, out=np.zeros_like(rows), where=norms > 0)


class LocalEmbedder:
    """wordllama from the package's own folder (``disable_download``: an offline load that
    fails loudly rather than fetching anything)."""

    name = f"{LOCAL}:{LOCAL_MODEL}"

    def __init__(self) -> None:
        self._model: Any = None
        self._lock = threading.Lock()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embed")

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                import wordllama

                folder = Path(wordllama.__file__).parent
                self._model = wordllama.WordLlama.load(
                    config=LOCAL_MODEL, dim=LOCAL_DIMENSIONS, cache_dir=folder,
                    disable_download=True)
            return self._model

    def embed_now(self, texts: Sequence[str]) -> np.ndarray:
        """On the calling thread (benchmarks, and the embed thread itself). The model pads
        each run of texts to the longest one and gathers a (texts, tokens, 256) array: runs
        of 8 are fastest here (2,060 chunks/s against 850 at its default of 64, which
        allocates ~13 MB per run), and texts go in by length and come back in their order."""
        if not texts:
            return np.zeros((0, LOCAL_DIMENSIONS), dtype=np.float32)
        order = np.argsort([len(text) for text in texts], kind="stable")
        found = np.empty((len(texts), LOCAL_DIMENSIONS), dtype=np.float32)
        found[order] = self._load().embed([texts[i] for i in order], norm=False,
                                          batch_size=MODEL_RUN)
        return normalise(found)

    async def embed(self, texts: Sequence[str], **usage: Any) -> np.ndarray:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self.embed_now, list(texts))

    async def warm(self) -> None:
        """Load the model now, on its thread: a worker does it before it leases anything, so
        its first batch does not wait ~0.6 s of CPU for the load while holding leases."""
        await asyncio.get_running_loop().run_in_executor(self._thread, self._load)


_local: LocalEmbedder | None = None


def local() -> LocalEmbedder:
    """The process's one local embedder (the model is loaded on its first call)."""
    global _local
    if _local is None:
        _local = LocalEmbedder()
    return _local


def configured(settings: Any) -> str:
    """``[pipeline] embedder``: "local" or "<provider>:<model>"."""
    spec = settings.section("pipeline").get("embedder", LOCAL)
    if not isinstance(spec, str) or not (spec == LOCAL or ":" in spec):
        raise ConfigError("GATEWAY_CONFIG [pipeline].embedder",
                          f"must be \"local\" or \"<provider>:<model>\" (got {spec!r})")
    return spec


def configured_name(settings: Any) -> str:
    """The name the configured embedder's vectors are recorded under (before ``@dims``)."""
    spec = configured(settings)
    return LocalEmbedder.name if spec == LOCAL else spec
