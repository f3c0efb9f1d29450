"""Budgets are sums over today's usage rows: calls stop at each limit (chat, account, total)
with ``OverBudget``, nothing reaching the provider; every call that ran is one row."""

from __future__ import annotations

import asyncio

import pytest

from gateway.providers import Chain, ChainFailed, Charge, OverBudget
from gateway.stores.runtime import Runtime
from tests.fakes.openai import FakeOpenAI
from tests.providers.conftest import MakeProviders

HELLO = [{"role": "user", "content": "one two three four"}]  # 4 tokens in
# The fake replies "echo: one two three four": 5 tokens out, so each call is 9 tokens.
PER_CALL = 9


async def calls_until_over(chain: Chain, charge: Charge) -> tuple[int, OverBudget]:
    for made in range(100):
        try:
            await chain.chat("m", HELLO, charge=charge)
        except OverBudget as over:
            return made, over
    raise AssertionError("never over budget")


async def test_budgets_stop_calls_at_each_limit(
        fake_openai: FakeOpenAI, make_providers: MakeProviders, runtime: Runtime) -> None:
    chain = make_providers(("a", fake_openai), budgets={
        "daily_tokens_per_chat": 30, "daily_tokens_per_account": 50,
        "daily_tokens": 80, "daily_tokens_recheck_seconds": 0}).chain(["a"])
    # Chat budget 30: calls at 0, 9, 18, 27 tokens used run; at 36 the chat is over.
    made, over = await calls_until_over(chain, Charge(chat="tg:1", account="alice"))
    assert made == 4 and over.budget.scope == "chat" and over.budget.used == 36
    # Alice's other chat: her account reaches 50 after two more (36, 45 run; 54 stops).
    made, over = await calls_until_over(chain, Charge(chat="tg:2", account="alice"))
    assert made == 2 and (over.budget.scope, over.budget.used) == ("account", 54)
    # Anyone: the total reaches 80 after 3 more (54, 63, 72 run; 81 stops), embeddings too.
    made, over = await calls_until_over(chain, Charge(chat="tg:3", account="bob"))
    assert made == 3 and (over.budget.scope, over.budget.limit) == ("total", 80)
    with pytest.raises(OverBudget):
        await chain.embeddings("e", ["x"], charge=Charge(job="job-1"))

    rows = await runtime.pg.fetch(
        "SELECT chat_key, account, tokens_in, tokens_out FROM provider_usage ORDER BY id")
    assert len(rows) == 9 == len(fake_openai.calls_to("chat"))  # refused calls sent nothing
    assert fake_openai.calls_to("embeddings") == []
    assert {(r["tokens_in"], r["tokens_out"]) for r in rows} == {(4, 5)}
    assert [r["chat_key"] for r in rows] == ["tg:1"] * 4 + ["tg:2"] * 2 + ["tg:3"] * 3


async def test_rows_name_provider_model_and_charge_and_no_budget_means_no_limit(
        fake_openai: FakeOpenAI, make_providers: MakeProviders, runtime: Runtime) -> None:
    chain = make_providers(("a", fake_openai)).chain(["a"])
    await chain.embeddings("embed-1", ["some words here"], charge=Charge(job="item-7"))
    stream = chain.stream_chat("chat-1", HELLO, charge=Charge(chat="sl:C1", account="carol"))
    assert "".join([d async for d in stream]) == "echo: one two three four"
    rows = [dict(r) for r in await runtime.pg.fetch(
        "SELECT provider, model, kind, tokens_in, tokens_out, estimated, chat_key, job_id,"
        " account FROM provider_usage ORDER BY id")]
    assert rows == [
        {"provider": "a", "model": "embed-1", "kind": "embeddings", "tokens_in": 3,
         "tokens_out": 0, "estimated": False, "chat_key": None, "job_id": "item-7",
         "account": None},
        {"provider": "a", "model": "chat-1", "kind": "chat", "tokens_in": 4, "tokens_out": 5,
         "estimated": False, "chat_key": "sl:C1", "job_id": None, "account": "carol"},
    ]


async def test_the_days_total_is_read_at_most_once_per_recheck_interval(
        fake_openai: FakeOpenAI, make_providers: MakeProviders) -> None:
    providers = make_providers(("a", fake_openai), budgets={
        "daily_tokens": 20, "daily_tokens_recheck_seconds": 3600})
    chain = providers.chain(["a"])
    for _ in range(3):  # 9 tokens each: past 20, but the total read before the first is 0
        await chain.chat("m", HELLO)
    assert providers.ledger is not None and providers.ledger.total.reads == 1
    providers.ledger.total.interval = 0  # the next check reads it again: 27 >= 20
    with pytest.raises(OverBudget) as info:
        await chain.chat("m", HELLO)
    assert (info.value.budget.scope, info.value.budget.used) == ("total", 27)


async def test_a_stream_ended_early_is_counted_on_what_was_sent(
        fake_openai: FakeOpenAI, make_providers: MakeProviders, runtime: Runtime) -> None:
    fake_openai.reply = "alpha beta gamma delta epsilon zeta"
    chain = make_providers(("a", fake_openai)).chain(["a"])
    stream = chain.stream_chat("m", HELLO, charge=Charge(chat="c"))
    seen: list[str] = []
    async for delta in stream:
        seen.append(delta)
        if len(seen) == 2:
            break
    await stream.aclose()  # the caller had enough
    assert seen == ["alpha ", "beta "]
    fake_openai.break_stream(after=3)
    with pytest.raises(ChainFailed):
        async for _ in chain.stream_chat("m", HELLO, charge=Charge(chat="c")):
            pass
    rows = await runtime.pg.fetch(
        "SELECT tokens_in, tokens_out, estimated FROM provider_usage ORDER BY id")
    # Estimates (4 characters a token, 4 a message): "alpha beta " and "alpha beta gamma ".
    assert [tuple(r) for r in rows] == [(9, 3, True), (9, 5, True)]


async def test_a_stream_whose_reader_is_cancelled_is_counted_on_what_was_sent(
        fake_openai: FakeOpenAI, make_providers: MakeProviders, runtime: Runtime) -> None:
    """The task reading the stream is cancelled mid-reply (a chat given back at shutdown, a
    reply interrupted): the words sent are still counted, so the chat's budget sees them."""
    fake_openai.reply = "alpha beta gamma delta epsilon zeta"
    fake_openai.chunk_delay = 0.2
    chain = make_providers(("a", fake_openai)).chain(["a"])
    seen: list[str] = []
    two = asyncio.Event()

    async def read() -> None:
        async for delta in chain.stream_chat("m", HELLO, charge=Charge(chat="c")):
            seen.append(delta)
            if len(seen) == 2:
                two.set()

    reader = asyncio.create_task(read())
    await asyncio.wait_for(two.wait(), 10)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert seen == ["alpha ", "beta "]
    rows = await runtime.pg.fetch(
        "SELECT chat_key, tokens_in, tokens_out, estimated FROM provider_usage")
    assert [tuple(r) for r in rows] == [("c", 9, 3, True)]  # "alpha beta ", estimated


async def test_a_chats_sum_is_read_once_per_recheck_and_this_process_calls_count_at_once(
        fake_openai: FakeOpenAI, make_providers: MakeProviders, runtime: Runtime) -> None:
    """The staleness bound: within ``daily_tokens_recheck_seconds`` a process's own calls
    count at once (the chat stops at its budget on one read), another process's rows only
    from the next read."""
    providers = make_providers(("a", fake_openai), budgets={
        "daily_tokens_per_chat": 30, "daily_tokens_recheck_seconds": 3600})
    chain = providers.chain(["a"])
    ledger = providers.ledger
    assert ledger is not None
    made, over = await calls_until_over(chain, Charge(chat="tg:1"))
    assert made == 4 and over.budget.used == 36 and ledger.sums.reads == 1
    # Another process's 100 tokens in chat tg:2, after this process read its sum (0).
    await chain.chat("m", HELLO, charge=Charge(chat="tg:2"))
    await runtime.pg.execute(
        "INSERT INTO provider_usage (provider, model, kind, tokens_in, tokens_out, chat_key)"
        " VALUES ('a', 'm', 'chat', 100, 0, 'tg:2')")
    await chain.chat("m", HELLO, charge=Charge(chat="tg:2"))  # still its 9: runs
    assert ledger.sums.reads == 2
    ledger.sums.interval = 0  # the recheck is due: 118 tokens read, refused
    with pytest.raises(OverBudget) as info:
        await chain.chat("m", HELLO, charge=Charge(chat="tg:2"))
    assert (info.value.budget.scope, info.value.budget.used) == ("chat", 118)


async def test_rows_of_concurrent_calls_share_statements_and_are_stored_before_returning(
        fake_openai: FakeOpenAI, make_providers: MakeProviders, runtime: Runtime) -> None:
    providers = make_providers(("a", fake_openai))
    chain = providers.chain(["a"])
    ledger = providers.ledger
    assert ledger is not None

    async def one(i: int) -> int:
        await chain.embeddings("e", ["some words here"], charge=Charge(job=f"j{i}"))
        # Returned: its row is stored.
        return int(await runtime.pg.fetchval(
            "SELECT count(*) FROM provider_usage WHERE job_id = $1", f"j{i}"))

    assert await asyncio.gather(*(one(i) for i in range(40))) == [1] * 40
    assert ledger.rows.statements < 40
    assert await runtime.pg.fetchval("SELECT count(*) FROM provider_usage") == 40


async def test_the_sums_of_concurrent_checks_are_read_in_one_statement(
        fake_openai: FakeOpenAI, make_providers: MakeProviders, runtime: Runtime) -> None:
    providers = make_providers(("a", fake_openai), budgets={
        "daily_tokens_per_chat": 30, "daily_tokens_per_account": 1000,
        "daily_tokens_recheck_seconds": 3600})
    ledger = providers.ledger
    assert ledger is not None
    await runtime.pg.execute(
        "INSERT INTO provider_usage (provider, model, kind, tokens_in, tokens_out, chat_key,"
        " account) VALUES ('a', 'm', 'chat', 40, 0, 'c7', 'x')")
    checks = await asyncio.gather(*(ledger.check(Charge(chat=f"c{i}", account=f"a{i % 3}"))
                                    for i in range(7)), return_exceptions=True)
    assert checks == [None] * 7 and ledger.sums.reads == 1  # 7 chats, 3 accounts: one read
    with pytest.raises(OverBudget) as info:  # c7's 40 tokens, read with the next batch
        await ledger.check(Charge(chat="c7"))
    assert (info.value.budget.scope, info.value.budget.used) == ("chat", 40)
    assert ledger.sums.reads == 2
