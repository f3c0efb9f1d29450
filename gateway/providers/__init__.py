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
"""

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
