"""The client against the fake provider over loopback: the three calls, what was sent (model,
inputs, the key in the Authorization header), usage read from the answer."""

from __future__ import annotations

from gateway.providers import Charge
from tests.fakes.openai import FakeOpenAI, fake_tokens, fake_vector, split_reply
from tests.fakes.pytest_plugin import OPENAI_KEY
from tests.providers.conftest import MakeProviders


async def test_embeddings_are_the_fakes_vectors_in_input_order(
        fake_openai: FakeOpenAI, make_providers: MakeProviders) -> None:
    fake_openai.dimension = 16
    chain = make_providers(("a", fake_openai)).chain(["a"])
    texts = ["the first text", "second", "and a third one here"]
    result = await chain.embeddings("embed-small", texts, charge=Charge(job="j1"))
    assert result.vectors == [fake_vector(t, 16) for t in texts]
    assert result.usage.prompt_tokens == sum(fake_tokens(t) for t in texts)
    assert not result.usage.estimated and result.provider == "a"
    [call] = fake_openai.calls_to("embeddings")
    assert call.params == {"model": "embed-small", "input": texts}
    assert call.token == OPENAI_KEY
    assert (await chain.embeddings("embed-small", [])).vectors == []  # no call for nothing
    assert len(fake_openai.calls_to("embeddings")) == 1


async def test_chat_returns_the_reply_and_its_usage(
        fake_openai: FakeOpenAI, make_providers: MakeProviders) -> None:
    fake_openai.reply = "Paris is the capital of France."
    chain = make_providers(("a", fake_openai)).chain(["a"])
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is the capital of France?"}]
    result = await chain.chat("chat-model", messages, max_tokens=50)
    assert result.text == "Paris is the capital of France."
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (8, 6)
    [call] = fake_openai.calls_to("chat")
    assert call.params["messages"] == messages and call.params["max_tokens"] == 50
    assert "stream" not in call.params


async def test_streamed_reply_is_assembled_exactly(
        fake_openai: FakeOpenAI, make_providers: MakeProviders) -> None:
    reply = "Line one,  with two spaces.\nLine two: ünïcode ✓ and `code`  "
    fake_openai.reply = reply
    chain = make_providers(("a", fake_openai)).chain(["a"])
    stream = chain.stream_chat("chat-model", [{"role": "user", "content": "go"}])
    deltas = [delta async for delta in stream]
    assert deltas == split_reply(reply) and len(deltas) > 5
    assert "".join(deltas) == reply
    assert stream.provider == "a"
    assert stream.usage is not None and not stream.usage.estimated
    assert stream.usage.completion_tokens == fake_tokens(reply)
    [call] = fake_openai.calls_to("chat")
    assert call.params["stream"] is True
    assert call.params["stream_options"] == {"include_usage": True}
