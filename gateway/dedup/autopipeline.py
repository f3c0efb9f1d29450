"""Automatic pipelining: the Redis commands of concurrent requests go out in one round trip.

redis-py spends ~70 µs of client CPU per command sent alone (shared/notes/baselines.md), which
caps a handler that sends one command per request at about a quarter of a bare aiohttp
handler's rate. Sent together in one pipeline, the same commands cost a fraction of that each.
``AutoPipeline`` collects every batch submitted during one turn of the event loop (and while a
previous flush is on the wire), sends them as one non-transactional pipeline, and hands each
caller its own slice of the replies. It is the idea of ioredis' ``enableAutoPipelining``;
redis-py has no equivalent, hence this small module.

A caller's commands stay contiguous and in order, so "claim, then enqueue" keeps its order
on the wire. Errors are per command (returned as exception values); a failure of the whole
round trip (connection lost) is raised to every caller of that flush. On Redis Cluster the
commands of one batch may live in different slots: there, each batch goes out as its own
cluster pipeline and nothing is coalesced.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from redis.asyncio.cluster import RedisCluster

from gateway.redis_clients import AnyRedis

# Something that queues one or more commands on a pipeline (``pipe.set(...)``, ...).
Build = Callable[[Any], None]


class AutoPipeline:
    def __init__(self, redis: AnyRedis, *, max_batch: int = 512) -> None:
        self.redis = redis
        self.max_batch = max_batch
        self._pending: list[tuple[Build, asyncio.Future[list[Any]]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self.flushes = 0  # round trips sent, for benchmarks and tests

    async def batch(self, build: Build) -> list[Any]:
        """Queue ``build``'s commands for the next flush; their replies, errors as values."""
        if isinstance(self.redis, RedisCluster):
            return (await self._send([build]))[0]
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._pending.append((build, future))
        if self._flusher is None:
            # A task starts on the next loop turn: callers ready in this turn join the batch.
            self._flusher = asyncio.create_task(self._flush_loop())
        return await future

    async def execute(self, *args: Any) -> Any:
        """One command through the shared pipeline; raises its error."""
        (reply,) = await self.batch(lambda pipe: pipe.execute_command(*args))
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def _flush_loop(self) -> None:
        try:
            while self._pending:
                taken = self._pending[: self.max_batch]
                del self._pending[: self.max_batch]
                try:
                    await self._send_to(taken)
                except Exception as exc:
                    for _, future in taken:
                        if not future.done():
                            future.set_exception(exc)
        finally:
            self._flusher = None
            for _, future in self._pending:  # cancelled at shutdown: fail the stragglers
                future.cancel()
            self._pending.clear()

    async def _send_to(self, taken: list[tuple[Build, asyncio.Future[list[Any]]]]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        bounds = []
        for build, future in taken:
            start = len(pipe)
            try:
                build(pipe)
            except Exception as exc:  # one caller's bug must not sink the others' commands
                future.set_exception(exc)
                if len(taken) == 1:
                    return
                del pipe.command_stack[start:]  # type: ignore[union-attr]
            bounds.append((start, len(pipe)))
        self.flushes += 1
        replies = await pipe.execute(raise_on_error=False) if len(pipe) else []
        for (_, future), (start, end) in zip(taken, bounds, strict=True):
            if not future.done():
                future.set_result(replies[start:end])

    async def _send(self, builds: list[Build]) -> list[list[Any]]:
        loop = asyncio.get_running_loop()
        taken = [(build, loop.create_future()) for build in builds]
        await self._send_to(taken)
        return [future.result() for _, future in taken]
