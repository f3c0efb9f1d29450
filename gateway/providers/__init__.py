"""Model providers (DESIGN 8): OpenAI-compatible clients, chains with fallback, the ``rl:``
limits on every call, usage rows and daily budgets.

Use::

    providers = ModelProviders.from_settings(runtime.settings, runtime.durable, runtime.pg)
    chain = providers.chain(["groq", "openrouter"])
    vectors = (await chain.embeddings("model", ["text", ...], charge=Charge(job=id))).vectors
    reply = await chain.chat("model", [{"role": "user", "content": "hi"}],
                             charge=Charge(chat=key, account=sub))
    stream = chain.stream_chat("model", messages, charge=Charge(chat=key))
    async for delta in stream: ...          # stream.usage, stream.provider once ended
    await providers.close()

Errors: ``ChainFailed`` (no provider answered: apologise), ``OverBudget`` (a daily budget is
reached: nothing was sent). Tests use ``tests/fakes/openai.py``.

Its names are imported on first use (PEP 562): ``gateway.providers.config``, which every
``gateway`` command reads for its secrets, then no longer starts aiohttp and the clients
(about 0.35 s of each CLI start); ``serve`` imports them when it builds its app.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.providers.chain import Chain
    from gateway.providers.client import (
        ChatStream,
        Completion,
        Embeddings,
        Message,
        OpenAIClient,
        Usage,
        estimate_tokens,
    )
    from gateway.providers.config import ProviderConfig, provider_configs
    from gateway.providers.errors import (
        Budget,
        ChainFailed,
        OverBudget,
        ProviderError,
        RateLimited,
        Rejected,
        Unavailable,
    )
    from gateway.providers.registry import ModelProviders, shared_providers
    from gateway.providers.usage import (
        GROUPS,
        Budgets,
        Charge,
        UsageLedger,
        budgets,
        start_of_day,
        usage_report,
    )

_MODULE_OF = {
    "Chain": "chain",
    "ChatStream": "client",
    "Completion": "client",
    "Embeddings": "client",
    "Message": "client",
    "OpenAIClient": "client",
    "Usage": "client",
    "estimate_tokens": "client",
    "ProviderConfig": "config",
    "provider_configs": "config",
    "Budget": "errors",
    "ChainFailed": "errors",
    "OverBudget": "errors",
    "ProviderError": "errors",
    "RateLimited": "errors",
    "Rejected": "errors",
    "Unavailable": "errors",
    "ModelProviders": "registry",
    "shared_providers": "registry",
    "GROUPS": "usage",
    "Budgets": "usage",
    "Charge": "usage",
    "UsageLedger": "usage",
    "budgets": "usage",
    "start_of_day": "usage",
    "usage_report": "usage",
}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "GROUPS",
    "Budget",
    "Budgets",
    "Chain",
    "ChainFailed",
    "Charge",
    "ChatStream",
    "Completion",
    "Embeddings",
    "Message",
    "ModelProviders",
    "OpenAIClient",
    "OverBudget",
    "ProviderConfig",
    "ProviderError",
    "RateLimited",
    "Rejected",
    "Unavailable",
    "Usage",
    "UsageLedger",
    "budgets",
    "estimate_tokens",
    "provider_configs",
    "shared_providers",
    "start_of_day",
    "usage_report",
]
