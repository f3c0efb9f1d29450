"""The ``llm`` conversation handler: the reply is a model's, streamed into the chat.

::

    [conversations]
    handler = "llm"
    providers = ["groq", "openrouter"]   # the chain: the next one when one fails
    model = "llama-3.1-8b-instant"
    system_prompt = "You are the team's helpful assistant."   # optional
    history_tokens = 2000                # optional: the conversation sent along, newest first

The conversation (this message included) is sent newest first until ``history_tokens``
would be exceeded, counted with the providers' estimate (about 4 characters per token, plus
4 per message); the current message is always sent. ``/help``, ``/new`` and ``/status`` are
answered as by the default handler, without a model. The reply streams (the service shows it
while it is written); a chain that fails ends in the apology, and a reached ``[budgets]``
limit answers that it is reached, with no call made.

With ``[answers]`` (``answers.py``; on unless ``retrieve = false``) the question is first
searched among the documents the chat may read, and what is found goes into the system
prompt as numbered sources; the reply ends with the sources the model cited, and ``/sources``
repeats them.

The providers are the process's (``runtime.shared``, shared with the embedder: one HTTP
session, closed with the runtime).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from gateway import keys
from gateway.config import ConfigError, Settings
from gateway.conversations import answers
from gateway.conversations.handlers import Context, Reply, default_handler
from gateway.conversations.model import budget_key, chat_key
from gateway.conversations.store import Message
from gateway.providers import (
    Charge,
    OverBudget,
    estimate_tokens,
    provider_configs,
    shared_providers,
)
from gateway.providers.client import Message as ChatMessage

DEFAULT_HISTORY_TOKENS = 2000
MAX_HISTORY_MESSAGES = 500
MESSAGE_OVERHEAD = 4  # tokens a message costs beyond its text (role, separators)
COMMANDS = ("help", "new", "status")
SOURCES_LOOKBACK = 20  # messages /sources looks back through for the last answer
OVER_BUDGET = {
    "chat": "This chat has used today's AI budget; I can answer again tomorrow (UTC).",
    "account": "Your account has used today's AI budget; I can answer again tomorrow (UTC).",
    "total": "Today's AI budget is used up; I can answer again tomorrow (UTC).",
}


def trim(history: Sequence[Message], budget: int) -> list[Message]:
    """The newest messages whose estimated tokens fit ``budget`` (the newest always),
    oldest first."""
    kept: list[Message] = []
    used = 0
    for message in reversed(history):
        cost = estimate_tokens(message.text) + MESSAGE_OVERHEAD
        if kept and used + cost > budget:
            break
        kept.append(message)
        used += cost
    return kept[::-1]


class LlmHandler:
    """``[conversations] handler = "llm"``; checked when the service is built."""

    def __init__(self, settings: Settings) -> None:
        section = settings.section("conversations")
        names = section.get("providers")
        if (not isinstance(names, list) or not names
                or not all(isinstance(n, str) and n for n in names)):
            raise ConfigError("[conversations].providers",
                              "must be a list of provider names (the chain)")
        configured = provider_configs(settings)
        for name in names:
            if name not in configured:
                raise ConfigError("[conversations].providers",
                                  f"{name!r} has no [providers.{name}] table")
        model = section.get("model")
        if not isinstance(model, str) or not model:
            raise ConfigError("[conversations].model", "must name the model")
        prompt = section.get("system_prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise ConfigError("[conversations].system_prompt", "must be a string")
        tokens = section.get("history_tokens", DEFAULT_HISTORY_TOKENS)
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
            raise ConfigError("[conversations].history_tokens", "must be a positive integer")
        self.names: list[str] = names
        self.model = model
        self.system_prompt = prompt or None
        self.history_tokens = tokens
        self.answers = answers.AnswerSettings.of(settings)

    async def __call__(self, ctx: Context) -> Reply:
        if ctx.command == "sources":
            return answers.last_sources(await ctx.history(SOURCES_LOOKBACK))
        if ctx.command in COMMANDS:
            return await default_handler(ctx)
        charge, accounts = await self._charge(ctx)
        sources: list[answers.Source] | None = None
        if self.answers.retrieve:
            try:
                sources = await answers.retrieve(
                    ctx.runtime, ctx.incoming.text,
                    answers.readable(accounts, self.answers.shared), self.answers,
                    chat=charge.chat, account=charge.account)
            except OverBudget as exc:  # the question's embedding: nothing was sent
                return OVER_BUDGET.get(exc.budget.scope, OVER_BUDGET["total"])
        limit = min(MAX_HISTORY_MESSAGES, self.history_tokens // (1 + MESSAGE_OVERHEAD) + 1)
        messages = self.messages(trim(await ctx.history(limit), self.history_tokens),
                                 answers.system_prompt(self.system_prompt, sources or []))
        return self._reply(ctx, messages, charge, sources)

    def messages(self, history: Sequence[Message],
                 system: str | None = None) -> list[ChatMessage]:
        """The model's input: the system prompt (with the sources, when any), then the
        conversation."""
        prompt: list[ChatMessage] = []
        system = system or self.system_prompt
        if system:
            prompt.append({"role": "system", "content": system})
        prompt += [{"role": "assistant" if m.role == "bot" else "user", "content": m.text}
                   for m in history]
        return prompt

    async def _charge(self, ctx: Context) -> tuple[Charge, list[str]]:
        """Whom the call is charged to: the chat, and its first linked account, if any (its
        usage rows name it whether or not a per-account budget is configured), by the
        account's namespace, as the account's jobs are: one account for both. And every
        account linked to the chat (whose documents it may read)."""
        incoming = ctx.incoming
        subs = [r["sub"] for r in await ctx.runtime.pg.fetch(
            "SELECT sub FROM chat_links WHERE platform = $1 AND chat_key = $2"
            " ORDER BY created_at, id", incoming.platform, chat_key(incoming))]
        return Charge(chat=f"{incoming.platform}:{budget_key(incoming)}",
                      account=keys.owner_namespace(subs[0]) if subs else None), subs

    async def _reply(self, ctx: Context, messages: list[ChatMessage], charge: Charge,
                     sources: list[answers.Source] | None) -> AsyncIterator[str]:
        stream = shared_providers(ctx.runtime).chain(self.names).stream_chat(
            self.model, messages, charge=charge)
        said: list[str] = []
        try:
            async for delta in stream:
                said.append(delta)
                yield delta
        except OverBudget as exc:  # checked before any call: nothing was sent
            yield OVER_BUDGET.get(exc.budget.scope, OVER_BUDGET["total"])
            return
        finally:
            await stream.aclose()  # an interrupted reply closes the provider's response
        if sources is not None:  # the sources it cited, or that none matched
            end = answers.footer("".join(said), sources)
            if end:
                yield end


