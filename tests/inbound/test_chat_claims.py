"""The chat platforms' claims on Redis Cluster's two-command path (claim ``in-progress`` for
30 s, then the inbox PUSH): a retry that arrives while the first attempt still holds the claim
must not be told "done", since the first attempt may yet fail. Driven on one instance with the
inbox's cluster path switched on, as the cluster run does on a real cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp.test_utils import TestClient
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway import keys
from gateway.config import Settings
from gateway.inbound.telegram import TELEGRAM_BOT
from gateway.inbox.queue import CLAIM_SECONDS
from gateway.stores.runtime import Runtime
from tests.conversations.fast import Apps
from tests.fakes import FakeTelegram, text_update
from tests.helpers import wait_until
from tests.inbound.test_telegram import COMPONENTS, HEADER, SECRET, telegram_settings


async def _post(client: TestClient[Any, Any], update: dict[str, Any]) -> tuple[int, str | None]:
    async with client.post("/telegram/webhook", json=update,
                           headers={HEADER: SECRET}) as response:
        await response.read()
        return response.status, response.headers.get("Retry-After")


async def test_a_retry_during_the_first_attempts_claim_is_503_and_the_event_is_not_lost(
        runtime: Runtime, settings: Settings, fake_telegram: FakeTelegram,
        make_client: Callable[..., Any]) -> None:
    """Issue 25 point 9: the first attempt holds the 30 s in-progress claim while its PUSH is
    on the wire; Telegram's retry then gets 503 + Retry-After (it was ``200 duplicate``);
    the first PUSH fails, so nothing is stored; the next retry is taken in and answered."""
    apps = Apps(make_client)
    try:
        client, app = await apps.start(telegram_settings(settings, fake_telegram), COMPONENTS)
        bot = app[TELEGRAM_BOT]
        await wait_until(bot.ready.is_set, message="bot ready")
        queue = bot.inbox.queue
        queue.cluster = True  # the cluster's claim-then-push path
        pushing, fail_now = asyncio.Event(), asyncio.Event()
        real_run_script = queue.auto.run_script

        async def first_push_stalls_then_fails(*args: Any) -> Any:
            queue.auto.run_script = real_run_script  # type: ignore[method-assign]
            pushing.set()
            await fail_now.wait()
            raise RedisConnectionError("redis-durable went away during the push")

        queue.auto.run_script = first_push_stalls_then_fails  # type: ignore[method-assign]
        update = text_update("do not lose me", chat_id=4242)
        first = asyncio.create_task(_post(client, update))
        await asyncio.wait_for(pushing.wait(), 10)
        claim = keys.dedup_telegram_update(fake_telegram.bot_user["id"], update["update_id"])
        assert (await runtime.durable.get(claim) or "").startswith("in-progress")
        assert 0 < await runtime.durable.ttl(claim) <= CLAIM_SECONDS

        assert await _post(client, update) == (503, "5")  # not 200 duplicate

        fail_now.set()
        assert (await first)[0] == 503  # the first attempt failed: nothing stored
        assert await runtime.durable.get(claim) is None  # released
        assert await _post(client, update) == (200, None)  # Telegram's next retry gets in
        sent = await fake_telegram.wait_for_messages(1, chat_id=4242, timeout=15)
        assert sent[0]["text"].startswith("echo: do not lose me")
        assert await runtime.durable.get(claim) == "done"
        assert await _post(client, update) == (200, None)  # now a true duplicate
        assert await runtime.pg.fetchval(
            "SELECT count(*) FROM conversation_messages WHERE role = 'user'") == 1
    finally:
        await apps.close()
