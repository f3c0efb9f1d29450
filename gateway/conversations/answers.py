"""Answers from the documents: what the ``llm`` handler adds around the model's call.

::

    [answers]
    retrieve = true          # false: the model gets the conversation alone, as before
    top_k = 5                # chunks searched for (hybrid search) per question
    min_score = 0.4          # a chunk only the vector neighbours found needs this similarity
    context_tokens = 1500    # the sources' share of the prompt (estimated tokens)
    shared = ["docs:src.handbook"]   # documents every chat may read, as topic patterns

What a chat may read: the documents of the accounts linked to it (``/link``: each account's
own namespace, ``u.<hash of sub>``), plus ``shared``. The question goes through the same
search as ``GET /v1/search`` (``gateway.knowledge.ranking``, hybrid), with that reader's
``Readable``: the owner filter is inside the statement, as for the API; there is no second
copy of it here. A chunk counts when a word of the question matched it, or when its cosine
similarity is at least ``min_score``. The chunks found go into the system prompt as numbered
sources, best first, as many as fit ``context_tokens``; the model is asked to cite them as
``[n]``; the reply then ends with the sources it cited (each named by its document's title,
else url, else item id). Nothing found: the model answers without sources and the reply says
that no document matched. ``/sources`` repeats the last answer's sources, read back from that
answer (the stored reply ends with them), so nothing else is stored.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway import keys
from gateway.config import ConfigError, Settings
from gateway.conversations.store import Message
from gateway.knowledge import ranking
from gateway.knowledge.owners import Readable
from gateway.providers import estimate_tokens

SOURCES_HEADING = "Sources:"
NO_MATCH = "No document matched this question."
NO_SOURCES = "The last answer cited no sources."
INSTRUCTIONS = ("Answer from the numbered sources below when they answer the question, and "
                "cite each source you use as [n], its number in brackets. If they do not "
                "answer it, say so.")
_CITATION = re.compile(r"\[(\d{1,3})\]")


@dataclass(frozen=True)
class AnswerSettings:
    """``[answers]``, checked when the handler is built."""

    retrieve: bool = True
    top_k: int = 5
    min_score: float = 0.4
    context_tokens: int = 1500
    shared: tuple[str, ...] = field(default=())

    @classmethod
    def of(cls, settings: Settings) -> AnswerSettings:
        section = dict(settings.section("answers"))
        unknown = set(section) - {"retrieve", "top_k", "min_score", "context_tokens",
                                  "shared"}
        if unknown:
            raise ConfigError(f"[answers].{sorted(unknown)[0]}", "unknown setting")
        found = cls()
        retrieve = section.get("retrieve", found.retrieve)
        if not isinstance(retrieve, bool):
            raise ConfigError("[answers].retrieve", "must be true or false")
        counts = {}
        for name in ("top_k", "context_tokens"):
            value = section.get(name, getattr(found, name))
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"[answers].{name}", "must be a positive integer")
            counts[name] = value
        if counts["top_k"] > ranking.CANDIDATES:
            raise ConfigError("[answers].top_k", f"must be at most {ranking.CANDIDATES}")
        score = section.get("min_score", found.min_score)
        if isinstance(score, bool) or not isinstance(score, int | float) or not 0 <= score <= 1:
            raise ConfigError("[answers].min_score", "must be a number from 0 to 1")
        shared = section.get("shared", [])
        if not isinstance(shared, list) or not all(isinstance(p, str) and p for p in shared):
            raise ConfigError("[answers].shared", "must be a list of topic patterns")
        return cls(retrieve, counts["top_k"], float(score), counts["context_tokens"],
                   tuple(shared))


@dataclass(frozen=True)
class Source:
    number: int
    label: str  # the document's title, else its url, else the item id
    text: str


def readable(accounts: Sequence[str], shared: Sequence[str]) -> Readable:
    """What a chat may read: its linked accounts' own documents and the shared ones."""
    return Readable.of(None, [f"docs:{keys.owner_namespace(sub)}" for sub in accounts]
                       + list(shared))


def relevant(hits: list[ranking.Hit], min_score: float) -> list[ranking.Hit]:
    """The hits that answer something: a word of the question is in them, or their
    similarity reaches ``min_score``."""
    return [hit for hit in hits
            if hit.matched or (hit.similarity is not None and hit.similarity >= min_score)]


async def retrieve(runtime: Any, question: str, reader: Readable, config: AnswerSettings,
                   **usage: str | None) -> list[Source]:
    """The numbered sources for ``question`` among what ``reader`` may read: hybrid search
    (its query's embedding charged to ``usage``), the relevant hits, as many as fit the
    context budget."""
    hits = relevant(await ranking.ranked(
        runtime, question, config.top_k, reader, "hybrid",
        embedded=await ranking.embed_query(runtime, question, **usage)), config.min_score)
    sources: list[Source] = []
    used = 0
    for hit in hits:
        label = hit.title or hit.url or hit.item_id
        cost = estimate_tokens(hit.text) + estimate_tokens(label) + 4
        text = hit.text
        if used + cost > config.context_tokens:
            if sources:
                break
            text = text[: max(0, 4 * (config.context_tokens - used))]  # the first, cut to fit
        sources.append(Source(len(sources) + 1, label, text))
        used += cost
    return sources


def system_prompt(base: str | None, sources: list[Source]) -> str | None:
    """The system prompt with the sources appended (unchanged when there are none)."""
    if not sources:
        return base
    block = "\n\n".join(f"[{s.number}] {s.label}\n{s.text}" for s in sources)
    return "\n\n".join(filter(None, (base, INSTRUCTIONS, block)))


def footer(reply: str, sources: list[Source]) -> str:
    """What ends the reply: the sources the model cited, in the order of their numbers;
    with no source at all, that no document matched; nothing when it cited none."""
    if not sources:
        return f"\n\n{NO_MATCH}"
    cited = {int(n) for n in _CITATION.findall(reply)}
    named = [s for s in sources if s.number in cited]
    if not named:
        return ""
    return f"\n\n{SOURCES_HEADING}\n" + "\n".join(f"[{s.number}] {s.label}" for s in named)


def last_sources(history: Sequence[Message]) -> str:
    """``/sources``: the sources the last answer ended with."""
    for message in reversed(history):
        if message.role != "bot":
            continue
        if message.text.startswith(f"{SOURCES_HEADING}\n"):  # an earlier /sources
            return message.text
        head, found, listed = message.text.rpartition(f"\n\n{SOURCES_HEADING}\n")
        if found and head:
            return f"{SOURCES_HEADING}\n{listed}"
        if message.text.endswith(NO_MATCH):
            return NO_MATCH
        return NO_SOURCES
    return NO_SOURCES
