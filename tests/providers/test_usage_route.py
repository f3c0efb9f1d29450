"""``GET /v1/admin/usage``: sums of real usage rows (made by calls to the fake provider) by
provider, model, chat and day; 400 on a bad group or days; admin scope only. The dashboard's
summary shows today's by provider."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from gateway.providers import Charge
from gateway.stores.runtime import Runtime
from tests.fakes.openai import FakeOpenAI
from tests.providers.conftest import MakeProviders

HELLO = [{"role": "user", "content": "one two three four"}]  # 4 in, 5 out


async def test_usage_is_grouped_by_provider_model_chat_and_day(
        fake_openai: FakeOpenAI, make_providers: MakeProviders, runtime: Runtime,
        make_client: Callable[..., Any]) -> None:
    async with FakeOpenAI(api_key=fake_openai.api_key) as other:
        providers = make_providers(("a", fake_openai), ("b", other))
        await providers.chain(["a"]).chat("small", HELLO, charge=Charge(chat="tg:1"))
        await providers.chain(["a"]).chat("big", HELLO, charge=Charge(chat="tg:2"))
        await providers.chain(["b"]).embeddings("emb", ["x y z"], charge=Charge(job="j"))
    # A row from three days ago: counted with days=4, not in today's sums.
    await runtime.pg.execute(
        "INSERT INTO provider_usage (provider, model, kind, tokens_in, tokens_out, chat_key,"
        " created_at) VALUES ('a', 'small', 'chat', 100, 10, 'tg:1', $1)",
        datetime.now(UTC) - timedelta(days=3))
    client = await make_client()

    async def rows(query: str) -> list[dict[str, Any]]:
        response = await client.get(f"/v1/admin/usage?{query}")
        assert response.status == 200, await response.text()
        return [{k: r[k] for k in ("key", "calls", "tokens")}
                for r in (await response.json())["rows"]]

    assert await rows("group=provider&days=1") == [
        {"key": "a", "calls": 2, "tokens": 18}, {"key": "b", "calls": 1, "tokens": 3}]
    assert await rows("group=provider&days=4") == [
        {"key": "a", "calls": 3, "tokens": 128}, {"key": "b", "calls": 1, "tokens": 3}]
    assert await rows("group=model&days=1") == [
        {"key": "big", "calls": 1, "tokens": 9}, {"key": "emb", "calls": 1, "tokens": 3},
        {"key": "small", "calls": 1, "tokens": 9}]
    assert await rows("group=chat") == [
        {"key": "", "calls": 1, "tokens": 3}, {"key": "tg:1", "calls": 2, "tokens": 119},
        {"key": "tg:2", "calls": 1, "tokens": 9}]
    today = datetime.now(UTC).date()
    assert await rows("group=day") == [
        {"key": (today - timedelta(days=3)).isoformat(), "calls": 1, "tokens": 110},
        {"key": today.isoformat(), "calls": 3, "tokens": 21}]

    summary = await (await client.get("/v1/dashboard/summary")).json()
    assert [(u["key"], u["calls"]) for u in summary["usage"]] == [("a", 2), ("b", 1)]


async def test_bad_group_or_days_is_400_and_the_route_needs_admin(
        runtime: Runtime, make_client: Callable[..., Any]) -> None:
    client = await make_client()
    for query in ("group=account", "group=", "group=provider&days=0", "days=x",
                  "days=400"):
        response = await client.get(f"/v1/admin/usage?{query}")
        body = await response.json()
        assert response.status == 400, query
        assert body["error"] == "bad_request" and body["detail"], body
    response = await client.get("/v1/admin/usage", headers={"Authorization": ""})
    assert response.status == 401
