"""Platform and provider limits: the published defaults, configuration, and the provider
budget API handlers use."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from gateway.config import ConfigError, Settings
from gateway.conversations.model import Incoming
from gateway.outbound.delivery import limit_names
from gateway.ratelimit import (
    PROVIDER_LIMITS,
    Limiter,
    ProviderLimits,
    Providers,
    Rate,
    platform_limits,
    provider_limits,
)
from gateway.ratelimit.limiter import Decision, Window, group_key
from gateway.stores.coalesce import AutoPipeline
from gateway.stores.runtime import Runtime
from tests.fakes.waiting import wait_until


def test_defaults_follow_the_design(settings: Settings) -> None:
    table = platform_limits(settings)
    assert table["telegram"]["bot"] == Rate(30, 1.0)
    assert table["telegram"]["chat"] == Rate(1, 1.0)
    assert table["telegram"]["group"].rate == 20 and table["telegram"]["group"].period == 60
    assert table["slack"]["channel"] == Rate(1, 1.0)
    assert table["mattermost"]["bot"] == Rate(10, 1.0)
    assert provider_limits(settings)["openrouter"] == ProviderLimits(200, 100_000, 10)
    assert PROVIDER_LIMITS["cerebras"] == ProviderLimits(30, 20_000, 3)
    assert set(PROVIDER_LIMITS) == {"openrouter", "anthropic", "google", "groq", "cerebras",
                                    "deepseek"}


def test_configuration_overrides_and_errors(settings: Settings) -> None:
    configured = dataclasses.replace(settings, sections={"ratelimit": {
        "platforms": {"telegram": {"chat": {"rate": 5}}},
        "providers": {"groq": {"concurrent": 1}, "local": {"requests_per_minute": 600}}}})
    assert platform_limits(configured)["telegram"]["chat"] == Rate(5, 1.0)
    providers = provider_limits(configured)
    assert providers["groq"] == ProviderLimits(30, 30_000, 1)
    assert providers["local"].requests_per_minute == 600
    for bad in ({"platforms": {"slack": {"channel": {"rate": -1}}}},
                {"platforms": {"slack": {"channel": 3}}},
                {"providers": {"groq": {"concurrent": 1.5}}}):
        with pytest.raises(ConfigError):
            broken = dataclasses.replace(settings, sections={"ratelimit": bad})
            platform_limits(broken)
            provider_limits(broken)


def test_which_buckets_a_reply_passes(settings: Settings) -> None:
    table = platform_limits(settings)

    def names(edit: bool = False, **fields: str) -> list[str]:
        base = dict(platform="telegram", chat="1", thread=None, user_id="u", user_name=None,
                    text="t", message_id="m")
        return [n for n, _ in limit_names(Incoming(**{**base, **fields}), table, edit=edit)]

    assert names(chat="777") == ["telegram:bot", "telegram:chat:-:777"]
    assert names(chat="-100123") == ["telegram:bot", "telegram:chat:-:-100123",
                                     "telegram:group:-100123"]
    assert names(platform="slack", chat="C1", team="T1") == ["slack:channel:T1:C1"]
    assert names(platform="mattermost", chat="ch") == ["mattermost:bot"]
    # An edit passes the message buckets (Telegram counts it like a message), and Slack's
    # chat.update tier per workspace.
    assert names(edit=True, chat="777") == ["telegram:bot", "telegram:chat:-:777"]
    assert names(edit=True, platform="slack", chat="C1", team="T1") == [
        "slack:channel:T1:C1", "slack:edit:T1"]
    assert table["slack"]["edit"] == Rate(50, 60.0, 5)


async def test_provider_budget_counts_requests_tokens_and_concurrency(
        runtime: Runtime) -> None:
    limiter = Limiter(runtime.durable)
    providers = Providers(limiter, {"tiny": ProviderLimits(100, 1000, 2)})
    running = peak = 0

    async def call(tokens: int) -> None:
        nonlocal running, peak
        async with providers.call("tiny", tokens=tokens):
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.01)
            running -= 1

    await asyncio.gather(*(call(150) for _ in range(6)))  # 900 of 1000 tokens this minute
    assert peak == 2
    # The token budget is shared state in rl: — the next 150 tokens do not fit this minute.
    tokens = Window("tokens", 1000, 60.0, 150)
    assert not (await limiter.check_all("provider:tiny", [tokens], attempt="x")).admitted
    assert await runtime.durable.exists(group_key("provider:tiny", "requests"))
    with pytest.raises(KeyError):
        async with providers.call("unknown"):
            pass


async def test_a_retried_group_attempt_is_answered_as_before_and_counted_once(
        runtime: Runtime) -> None:
    """A client's retry of an attempt that ran finds it by its entry in the longest window
    (all went in at one instant), at every point of the shorter windows' lives."""
    limiter = Limiter(runtime.durable)
    short, long_ = Window("short", 5, 10.0, 1), Window("long", 50, 100.0, 2)
    base = 13_000_000.0
    assert (await limiter.check_all("retry", [short, long_], attempt="a", now=base)).admitted
    assert (await limiter.check_all("retry", [short, long_], attempt="a",
                                    now=base + 1)).admitted
    # b's admission drops a's entry from the short window; a's retry is still a retry
    assert (await limiter.check_all("retry", [short, long_], attempt="b",
                                    now=base + 20)).admitted
    assert (await limiter.check_all("retry", [short, long_], attempt="a",
                                    now=base + 21)).admitted
    assert await runtime.durable.get(group_key("retry", "long") + ":total") == "4"
    assert await runtime.durable.get(group_key("retry", "short") + ":total") == "1"


async def test_a_provider_call_takes_request_and_tokens_together_and_settles_its_tokens(
        runtime: Runtime) -> None:
    limiter = Limiter(runtime.durable)
    providers = Providers(limiter, {"p": ProviderLimits(10, 100, 5, window_seconds=60.0)})
    async with providers.call("p", tokens=60) as ticket:
        await ticket.settle(40)  # the provider counted 40 of the 60 estimated
    total = group_key("provider:p", "tokens") + ":total"
    assert await runtime.durable.get(total) == "40"
    tokens = Window("tokens", 100, 60.0, 60)
    requests = Window("requests", 10, 60.0, 1)
    # 60 more tokens fit only because 20 were given back.
    assert (await limiter.check_all("provider:p", [requests, tokens], attempt="a")).admitted
    # Neither window is charged when one refuses: the request count stays at 2.
    refused = await limiter.check_all("provider:p", [requests, tokens], attempt="b")
    assert not refused.admitted and refused.wait > 50
    assert await runtime.durable.get(group_key("provider:p", "requests") + ":total") == "2"
    assert await runtime.durable.get(total) == "100"
    # Settling above the estimate charges the difference (later calls wait for it).
    assert await limiter.amend("provider:p", Window("tokens", 100, 60.0, 60), "a", 90)
    assert await runtime.durable.get(total) == "130"


async def test_a_settlement_not_waited_for_goes_out_ahead_of_the_next_admission(
        runtime: Runtime) -> None:
    auto = AutoPipeline(runtime.durable)
    limiter = Limiter(runtime.durable, auto)
    providers = Providers(limiter, {"one": ProviderLimits(10, 100, 1, window_seconds=60.0)})
    checks = 0
    check_group = limiter.check_group

    async def counting(*args: Any, **kwargs: Any) -> Decision:
        nonlocal checks
        checks += 1
        return await check_group(*args, **kwargs)

    limiter.check_group = counting  # type: ignore[method-assign]
    ticket = await providers.admit("one", tokens=60)
    await ticket.settle(40)
    ticket.finish_nowait()  # nothing awaited: sent with the next flush
    # The only slot is free for the next admission, at its first check: the release went
    # out before it on the coalescer's connection.
    second = await providers.admit("one", tokens=10)
    assert checks == 2
    total = group_key("provider:one", "tokens") + ":total"
    assert await runtime.durable.get(total) == "50"  # 40 settled + 10
    second.finish_nowait()
    await auto.drain()
    assert await runtime.durable.zcard("rl:slots:{provider:one}") == 0


async def test_a_settlement_not_waited_for_reaches_a_server_that_forgot_the_script(
        runtime: Runtime, caplog: pytest.LogCaptureFixture) -> None:
    """Through the coalescer it is sent as EVAL of its text (no reply is read there to answer
    NOSCRIPT with a load); without one, as a task of its own that loads the script."""
    auto = AutoPipeline(runtime.durable)
    total = group_key("provider:p", "tokens") + ":total"

    async def settled() -> bool:
        return (await runtime.durable.get(total) == "30"
                and await runtime.durable.zcard("rl:slots:{provider:p}") == 0)

    for limiter in (Limiter(runtime.durable, auto), Limiter(runtime.durable)):
        await runtime.durable.delete(total, group_key("provider:p", "tokens"))
        providers = Providers(limiter, {"p": ProviderLimits(10, 100, 1, window_seconds=60.0)})
        ticket = await providers.admit("p", tokens=60)
        await ticket.settle(30)
        await runtime.durable.script_flush()  # a restart or a failover meanwhile
        ticket.finish_nowait()
        if limiter.auto is not None:
            await auto.drain()
            assert await settled()
        else:
            await wait_until(settled, message="the task's settlement")
    assert "amend" not in caplog.text and "unawaited" not in caplog.text
