"""``[pipeline] embedder = "<provider>:<model>"``: vectors from a configured provider's
``/embeddings`` (``[providers.<provider>]``), through the provider room's chain, so every call
passes that provider's ``rl:`` limits and is a usage row charged to the item and, for a job
submitted by an API key or an account, to its owner namespace (``k.<key id>``,
``u.<hash of sub>``: the prefix of its item id, ``keys.item_owner``), which is then its usage
rows' account.

A document's chunks go in batches of ``[pipeline] embed_batch`` (64) inputs per call. When a
``[budgets]`` limit is spent, the chain raises ``OverBudget`` before sending anything; the
embed stage turns that into a delay of ``[pipeline] budget_delay_seconds`` (300), and search
into a 503.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gateway.config import ConfigError
from gateway.knowledge import embedding
from gateway.knowledge.embedding import normalise
from gateway.providers import Charge, shared_providers

BATCH = 64
BUDGET_DELAY_SECONDS = 300.0
def _positive(section: Any, name: str, default: float) -> float:
    value = section.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"GATEWAY_CONFIG [pipeline].{name}", "must be a positive number")
    return float(value)


def budget_delay(settings: Any) -> float:
    """How long an item waits when a budget is spent."""
    return _positive(settings.section("pipeline"), "budget_delay_seconds",
                     BUDGET_DELAY_SECONDS)


class ProviderEmbedder:
    """One provider's model; ``name`` is the configured ``"<provider>:<model>"``."""

    def __init__(self, runtime: Any, spec: str) -> None:
        provider, _, self.model = spec.partition(":")
        try:
            embedding.model_id(spec, 1)  # refused at start, not at every item
        except ValueError as exc:
            raise ConfigError("GATEWAY_CONFIG [pipeline].embedder", str(exc)) from None
        self.name = spec
        self.chain = shared_providers(runtime).chain([provider])
        self.batch = int(_positive(runtime.settings.section("pipeline"), "embed_batch", BATCH))

    async def embed(self, texts: Sequence[str], *, job: str | None = None,
                    account: str | None = None, chat: str | None = None,
                    **usage: Any) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        rows: list[list[float]] = []
        for start in range(0, len(texts), self.batch):
            answer = await self.chain.embeddings(self.model, texts[start:start + self.batch],
                                                 charge=Charge(chat=chat, job=job,
                                                               account=account))
            rows += answer.vectors
        return normalise(np.array(rows, dtype=np.float32).reshape(len(rows), -1))


def embedder(runtime: Any, spec: str) -> ProviderEmbedder:
    return ProviderEmbedder(runtime, spec)
