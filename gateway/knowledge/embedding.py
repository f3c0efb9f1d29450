"""Deterministic hashed embeddings (feature hashing): no model, no network, same vector for
the same text on every machine, good enough to rank chunks by shared vocabulary."""

from __future__ import annotations

import hashlib
import itertools
import math
import re

DIMENSIONS = 256
_WORD = re.compile(r"\w+", re.UNICODE)


def tokens(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def embed(text: str, dimensions: int = DIMENSIONS) -> list[float]:
    """Signed feature hashing of words and word bigrams, L2-normalised (so a dot product is
    the cosine similarity). An empty text gives the zero vector."""
    vector = [0.0] * dimensions
    words = tokens(text)
    features = words + [f"{a} {b}" for a, b in itertools.pairwise(words)]
    for feature in features:
        digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
        value = int.from_bytes(digest, "little")
        vector[value % dimensions] += 1.0 if (value >> 63) & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vector))
    return [v / norm for v in vector] if norm else vector


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))
