"""The chain against fake providers: 429 waits its Retry-After and retries the same
provider; a 5xx, a timeout or a refused connection moves on; a malformed request stops; a
stream falls back only before its first delta; the key appears in no log line or error."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from gateway.providers import ChainFailed, RateLimited, Rejected, Unavailable
from gateway.ratelimit.limiter import cooldown_key
from gateway.stores.runtime import Runtime
from tests.fakes.openai import FakeOpenAI, dead_port
from tests.fakes.pytest_plugin import OPENAI_KEY
from tests.providers.conftest import MakeProviders

HELLO = [{"role": "user", "content": "hello"}]


@pytest.fixture
async def second() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI(api_key=OPENAI_KEY, reply="from b") as fake:
        yield fake


async def test_429_waits_retry_after_then_succeeds_on_the_same_provider(
        fake_openai: FakeOpenAI, second: FakeOpenAI, make_providers: MakeProviders) -> None:
    fake_openai.fail("chat", 429, retry_after=1)
    chain = make_providers(("a", fake_openai), ("b", second)).chain(["a", "b"])
    result = await chain.chat("m", HELLO)
    assert result.provider == "a" and result.text == "echo: hello"
    first, retry = fake_openai.calls_to("chat")
    assert retry.time - first.time >= 0.95  # Retry-After: 1, honoured
    assert second.calls == []


async def test_429_beyond_the_bounds_moves_on(
        fake_openai: FakeOpenAI, second: FakeOpenAI, make_providers: MakeProviders,
        runtime: Runtime) -> None:
    fake_openai.fail("chat", 429, retry_after=120)  # above max_retry_after_seconds (30)
    chain = make_providers(("a", fake_openai), ("b", second)).chain(["a", "b"])
    assert (await chain.chat("m", HELLO)).provider == "b"
    # The provider's cool-down holds for 120 s: the next call goes to b without asking a.
    assert (await chain.chat("m", HELLO)).provider == "b"
    assert len(fake_openai.calls_to("chat")) == 1 and len(second.calls_to("chat")) == 2
    await runtime.durable.delete(cooldown_key("provider:a"))  # two minutes later, as it were
    fake_openai.fail("chat", 429, retry_after=0, times=3)  # retries_on_429 = 2 below
    chain = make_providers(("a", fake_openai), ("b", second), retries_on_429=2).chain(["a", "b"])
    fake_openai.reset_calls()
    assert (await chain.chat("m", HELLO)).provider == "b"
    assert len(fake_openai.calls_to("chat")) == 3


async def test_5xx_falls_back_to_the_next_provider(
        fake_openai: FakeOpenAI, second: FakeOpenAI, make_providers: MakeProviders) -> None:
    fake_openai.fail("*", 503)
    chain = make_providers(("a", fake_openai), ("b", second)).chain(["a", "b"])
    result = await chain.embeddings("e", ["one", "two"])
    assert result.provider == "b" and len(result.vectors) == 2
    assert len(fake_openai.calls_to("embeddings")) == 1
    assert len(second.calls_to("embeddings")) == 1


async def test_a_dead_port_and_a_timeout_fall_back(
        fake_openai: FakeOpenAI, second: FakeOpenAI, make_providers: MakeProviders) -> None:
    dead = f"http://127.0.0.1:{dead_port()}/v1"
    chain = make_providers(("dead", dead), ("b", second)).chain(["dead", "b"])
    assert (await chain.chat("m", HELLO)).text == "from b"
    fake_openai.slow("chat", 3.0)
    chain = make_providers(("slow", fake_openai), ("b", second),
                           timeout_seconds=0.3).chain(["slow", "b"])
    assert (await chain.chat("m", HELLO)).provider == "b"
    assert len(fake_openai.calls_to("chat")) == 1
    # A stream's timeout is the gap between chunks: a silent provider is left for the next.
    fake_openai.slow("chat", 3.0)
    stream = chain.stream_chat("m", HELLO)
    assert "".join([d async for d in stream]) == "from b" and stream.provider == "b"


async def test_every_provider_failing_is_one_typed_error(
        fake_openai: FakeOpenAI, second: FakeOpenAI, make_providers: MakeProviders) -> None:
    fake_openai.fail("chat", 500)
    second.fail("chat", 502)
    dead = f"http://127.0.0.1:{dead_port()}/v1"
    chain = make_providers(("a", fake_openai), ("b", second), ("c", dead)).chain(["a", "b", "c"])
    with pytest.raises(ChainFailed) as info:
        await chain.chat("m", HELLO)
    assert [type(f) for f in info.value.failures] == [Unavailable] * 3
    assert [str(f).split(":")[0] for f in info.value.failures] == ["a", "b", "c"]


async def test_a_malformed_request_is_not_sent_to_the_next_provider(
        fake_openai: FakeOpenAI, second: FakeOpenAI, make_providers: MakeProviders) -> None:
    fake_openai.fail("chat", 400, message="messages: invalid role")
    chain = make_providers(("a", fake_openai), ("b", second)).chain(["a", "b"])
    with pytest.raises(ChainFailed) as info:
        await chain.chat("m", HELLO)
    [failure] = info.value.failures
    assert isinstance(failure, Rejected) and "invalid role" in str(failure)
    assert second.calls == []


async def test_a_stream_falls_back_before_its_first_delta_only(
        fake_openai: FakeOpenAI, second: FakeOpenAI, make_providers: MakeProviders) -> None:
    second.reply = "the answer from b"
    fake_openai.fail("chat", 500)
    chain = make_providers(("a", fake_openai), ("b", second)).chain(["a", "b"])
    stream = chain.stream_chat("m", HELLO)
    assert "".join([d async for d in stream]) == "the answer from b"
    assert stream.provider == "b"

    fake_openai.reply = "one two three four five"
    fake_openai.break_stream(after=2)
    second.reset_calls()
    stream = chain.stream_chat("m", HELLO)
    seen: list[str] = []
    with pytest.raises(ChainFailed) as info:
        async for delta in stream:
            seen.append(delta)
    assert seen == ["one ", "two "]
    assert isinstance(info.value.failures[-1], Unavailable)
    assert second.calls == []  # the words were out: no second voice


async def test_the_key_is_in_no_log_line_repr_or_error(
        fake_openai: FakeOpenAI, second: FakeOpenAI, make_providers: MakeProviders,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    fake_openai.fail("chat", 500, message=f"upstream said: bad key {OPENAI_KEY}")
    second.fail("chat", 429, retry_after=0, message=f"slow down {OPENAI_KEY}", times=10)
    providers = make_providers(("a", fake_openai), ("b", second), retries_on_429=1)
    chain = providers.chain(["a", "b"])
    with pytest.raises(ChainFailed) as info:
        await chain.chat("m", HELLO)
    assert fake_openai.calls[0].token == OPENAI_KEY  # it was sent...
    assert isinstance(info.value.failures[1], RateLimited)
    shown = [str(info.value), repr(info.value), *map(str, info.value.failures),
             repr(providers.configs), repr(chain), caplog.text]
    assert "upstream said: bad key ***" in str(info.value)
    for text in shown:  # ... and never shown
        assert OPENAI_KEY not in text
    assert caplog.records  # the failures were logged


async def test_a_refused_key_moves_on_to_the_next_provider(
        second: FakeOpenAI, make_providers: MakeProviders) -> None:
    async with FakeOpenAI(api_key="sk-another-key") as strict:
        chain = make_providers(("a", strict), ("b", second)).chain(["a", "b"])
        assert (await chain.chat("m", HELLO)).provider == "b"
        [refused] = strict.calls_to("chat")
        assert refused.token == OPENAI_KEY  # sent, refused with 401, not retried


async def test_an_answer_past_max_answer_bytes_fails_over_to_the_next_provider(
        fake_openai: FakeOpenAI, second: FakeOpenAI, make_providers: MakeProviders) -> None:
    """A provider gone wrong sends 2 MB where 1 MB is the most we read: the attempt fails
    (the next provider answers), and a stream that grows past it ends there."""
    fake_openai.reply = ("x" * 999 + " ") * 2000  # 2 MB of text
    chain = make_providers(("a", fake_openai), ("b", second),
                           max_answer_bytes=1_000_000).chain(["a", "b"])
    assert (await chain.chat("m", HELLO)).text == "from b"
    received: list[str] = []
    with pytest.raises(ChainFailed) as failed:
        async for delta in chain.stream_chat("m", HELLO):
            received.append(delta)
    assert "larger than 1000000 bytes" in str(failed.value)
    assert 0 < len("".join(received)) <= 1_000_000  # read up to the bound, not beyond
    assert len(second.calls_to("chat")) == 1  # the words were out: no fall-back for them


async def test_a_stream_line_too_long_to_read_fails_over_to_the_next_provider(
        fake_openai: FakeOpenAI, second: FakeOpenAI, make_providers: MakeProviders) -> None:
    """A provider gone wrong streams its 3 MB answer as one line (no spaces to split at):
    aiohttp refuses the line (``LineTooLong``) before a word is out, so the chain moves on
    to the next provider instead of ending the chat's reply in an apology."""
    fake_openai.reply = "x" * 3_000_000
    chain = make_providers(("a", fake_openai), ("b", second)).chain(["a", "b"])
    received = [delta async for delta in chain.stream_chat("m", HELLO)]
    assert "".join(received) == "from b"
    assert len(fake_openai.calls_to("chat")) == 1 and len(second.calls_to("chat")) == 1
