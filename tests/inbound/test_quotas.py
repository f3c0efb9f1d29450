"""Per-owner quotas on real stores: a credential (or webhook source) that holds its quota of
queued items or bytes is refused with 429 and nothing is written, while other credentials,
other sources and the chat platforms (Telegram updates and signed Slack events through their
routes, answered) go on; once its items have left the pipeline it is let in again."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from gateway.access import apikeys
from gateway.access.principal import parse_scopes
from gateway.config import Settings
from gateway.pipeline.stages import meta_key, quota_key
from gateway.stores.runtime import Runtime, open_runtime
from gateway.web.app import create_app
from tests.fakes import FakeSlack, FakeTelegram
from tests.fakes.waiting import wait_until
from tests.inbound.bystanders import chats_go_on, with_chat
from tests.inbound.webhook_helpers import body_of, standard
from tests.pipeline.helpers import workers


async def key_for(runtime: Runtime, name: str) -> str:
    created = await apikeys.create(runtime.pg, name, parse_scopes("jobs:write jobs:read"), ())
    return str(created["key"])


async def quota_app(settings: Settings, make_client: Callable[..., Any],
                    **table: int) -> tuple[Any, Runtime]:
    rt = await open_runtime(dataclasses.replace(settings, sections={
        **settings.sections, "quotas": table}))
    return await make_client(create_app(rt), rt=rt), rt


async def submit(client: Any, key: str, job_id: str, text: str = "x") -> Any:
    return await client.post("/v1/jobs", json={"job_id": job_id, "document": {"text": text}},
                             headers={"Authorization": f"Bearer {key}"})


async def test_a_full_credential_is_refused_and_nobody_else_is(
        settings: Settings, runtime: Runtime, make_client: Callable[..., Any],
        fake_telegram: FakeTelegram, fake_slack: FakeSlack) -> None:
    client, rt = await quota_app(with_chat(settings, fake_telegram, fake_slack), make_client,
                                 items_per_credential=3, items_per_source=2)
    try:
        greedy, modest = await key_for(runtime, "greedy"), await key_for(runtime, "modest")
        for i in range(3):
            assert (await submit(client, greedy, f"g{i}")).status == 202
        refused = await submit(client, greedy, "g3")
        assert refused.status == 429 and refused.headers["Retry-After"] == "30"
        assert (await refused.json())["error"] == "quota_exceeded"
        assert not await runtime.durable.hexists(meta_key(), refused_id(greedy, "g3"))
        again = await submit(client, greedy, "g3")  # the claim was not left behind
        assert again.status == 429
        assert (await submit(client, modest, "m0")).status == 202
        body = body_of({"text": "signed"})
        for i in range(2):
            delivered = await client.post("/v1/webhooks/demo", data=body_of({"n": i}),
                                          headers=standard(body_of({"n": i}), f"w{i}"))
            assert delivered.status == 202
        over = await client.post("/v1/webhooks/demo", data=body,
                                 headers=standard(body, "w-over"))
        assert over.status == 429  # the source's own quota
        assert await runtime.durable.hlen(meta_key()) == 6  # 3 + 1 jobs, 2 webhooks
        # The chats go on while both are refused, and take nothing of their quotas.
        await chats_go_on(client, client.app, fake_telegram, fake_slack)
        assert (await submit(client, greedy, "g4")).status == 429
        assert (await client.post("/v1/webhooks/demo", data=body,
                                  headers=standard(body, "w-over2"))).status == 429
        assert await runtime.durable.hlen(meta_key()) == 6
    finally:
        await rt.close()


def refused_id(key: str, job_id: str) -> str:
    return f"k.{key.split('_')[1]}/{job_id}"


async def test_bytes_count_and_finished_items_free_the_quota(
        settings: Settings, runtime: Runtime, make_client: Callable[..., Any]) -> None:
    client, rt = await quota_app(settings, make_client, bytes_per_credential=2000)
    try:
        key = await key_for(runtime, "bulky")
        assert (await submit(client, key, "b0", "a" * 1200)).status == 202
        assert (await submit(client, key, "b1", "b" * 1200)).status == 429
        assert (await submit(client, key, "b2", "c" * 300)).status == 202  # fits beside b0
        owner = "k." + key.split("_")[1]
        held = await runtime.durable.hgetall(quota_key(owner))
        assert set(held) == {refused_id(key, "b0"), refused_id(key, "b2"), "~bytes"}
        async with workers(rt):
            await wait_until(lambda: _left(runtime), timeout=30, message="items done")
        accepted = await submit(client, key, "b1", "b" * 1200)
        assert accepted.status == 202, await accepted.text()
        assert json.loads(await runtime.durable.hget(quota_key(owner), "~bytes")) < 2000
    finally:
        await rt.close()


async def _left(runtime: Runtime) -> bool:
    return int(await runtime.durable.hlen(meta_key())) == 0
