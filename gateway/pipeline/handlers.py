"""The stage-handler contract: a plain async callable taking a ``StageContext``, one per
stage, each replaceable by configuration (TOML ``[pipeline.handlers] embed =
"module:function"``). The default handlers are ``gateway.knowledge.stages``.

A handler runs inside the worker's PostgreSQL transaction (``ctx.conn``), the same one that
writes the journal row: its results and the journal commit together or not at all, so a
stage whose item is retried after a crash never leaves half its rows behind.

Slow work that writes nothing (a model provider's call) does not belong in that transaction:
it would hold a pooled connection and an open transaction (its locks, the xmin horizon) for
as long as the provider takes. A handler may carry ``prepare`` for it (see ``Prepare``).
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, cast

import asyncpg

from gateway.pipeline.stages import STAGES


class PermanentError(Exception):
    """The item can never succeed at this stage (bad document): dead-letter at once."""


class Deferred(Exception):
    """The item cannot run now but will later (a spent AI budget): it waits ``seconds`` in
    the stage's delayed set, and no failure is counted, so waiting never dead-letters it."""

    def __init__(self, seconds: float, reason: str) -> None:
        super().__init__(reason)
        self.seconds = seconds


class _Closed:
    """``ctx.conn`` outside the transaction (during ``prepare``): any use is a bug."""

    def __getattr__(self, name: str) -> NoReturn:
        raise RuntimeError("ctx.conn is the batch's transaction, not open in prepare: "
                           "read through ctx.runtime.pg")


NO_CONNECTION = cast(asyncpg.Connection, _Closed())


@dataclass
class StageContext:
    item_id: str
    stage: str
    priority: str
    doc_type: str
    # The document as enqueued; only the store stage receives it (later stages read
    # pipeline_documents).
    document: dict[str, Any] | None
    # The batch's transaction; ``NO_CONNECTION`` while ``prepare`` runs.
    conn: asyncpg.Connection
    runtime: Any
    # Called after the transaction commits (e.g. cache invalidation); the same callable
    # registered by several items of one batch is called once.
    after_commit: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    # What the handler's ``prepare`` left for its transaction phase (the handler's own
    # business); None when ``prepare`` has not run (a caller that runs the handler alone).
    prepared: Any = None


Handler = Callable[[StageContext], Awaitable[None]]
# Optional: a handler with an attribute ``many`` (``async def many(ctxs: list[StageContext])``)
# is given a batch's items in one call when there are several (the embed stage embeds all
# their chunks at once). If it raises, the batch is redone one item per transaction with
# the handler itself, so one bad item is still found and failed alone.
BatchHandler = Callable[[list[StageContext]], Awaitable[None]]
# Optional: a handler with an attribute ``prepare`` (``async def prepare(ctxs)``) has it
# called by the worker once per leased batch, before the batch's transaction, with no
# connection held: ``ctx.conn`` is not open; reads go through ``ctx.runtime.pg`` (a pooled
# connection per statement, returned at once) and what it finds goes on ``ctx.prepared``
# for the handler (or ``many``) in the transaction, including for the one-item-per-
# transaction redo, so it is not run again. It may run for an item whose stage proves
# journaled already (a redo after a crash between commit and acknowledgement): it must do
# nothing a repeat would harm (reads and calls, not the stage's writes). If it raises, every
# item of the batch fails with that error; an error of one item goes on its ``ctx.prepared``
# for the handler to raise. The handler must still work alone (``prepared`` None), as for a
# caller running it in its own transaction. The embed stage's model calls use it.
Prepare = Callable[[list[StageContext]], Awaitable[None]]


def resolve(spec: str) -> Handler:
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise ValueError(f"handler must be 'module:function', got {spec!r}")
    try:
        function = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot load handler {spec!r}: {exc}") from None
    if not callable(function):
        raise ValueError(f"handler {spec!r} is not callable")
    return function


def load_handlers(section: Mapping[str, Any],
                  defaults: Mapping[str, Handler]) -> dict[str, Handler]:
    """``defaults`` overridden by ``[pipeline.handlers]`` (stage = "module:function")."""
    configured = section.get("handlers", {})
    if not isinstance(configured, Mapping):
        raise ValueError("[pipeline.handlers] must be a table")
    unknown = set(configured) - set(STAGES)
    if unknown:
        raise ValueError(f"[pipeline.handlers]: unknown stage(s) {', '.join(sorted(unknown))}")
    handlers = dict(defaults)
    for stage, spec in configured.items():
        handlers[stage] = resolve(str(spec))
    return handlers
