"""POST /v1/webhooks/{source} on real servers: every documented answer, dedup, replay."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gateway import keys
from gateway.dedup import claims
from gateway.inbound import signing
from gateway.inbound.http_intake import INBOUND
from gateway.pipeline.stages import meta_key
from gateway.pipeline.status import document as stored_document
from gateway.pipeline.status import ready_items
from gateway.stores.runtime import Runtime
from tests.helpers import registry_violations
from tests.inbound.webhook_helpers import JSON, body_of, github, standard, stripe


async def queued(runtime: Runtime) -> set[str]:
    return set(await ready_items(runtime.durable, "store"))


async def dedup_keys(runtime: Runtime) -> list[str]:
    return [k async for k in runtime.durable.scan_iter("dedup:*")]


async def test_accepted_then_duplicate(client: Any, runtime: Runtime) -> None:
    payload = {"type": "invoice.paid", "text": "Invoice 42 paid", "url": "https://x.test/42"}
    body = body_of(payload)
    first = await client.post("/v1/webhooks/demo", data=body, headers=standard(body, "msg_1"))
    assert first.status == 202
    assert await first.json() == {"status": "accepted", "item_id": "webhook:demo:msg_1"}
    again = await client.post("/v1/webhooks/demo", data=body, headers=standard(body, "msg_1"))
    assert again.status == 200
    assert (await again.json())["status"] == "duplicate"

    assert await queued(runtime) == {"webhook:demo:msg_1"}
    document = await stored_document(runtime.durable, "webhook:demo:msg_1")
    assert document["text"] == "Invoice 42 paid"
    assert document["title"] == "invoice.paid"
    assert document["url"] == "https://x.test/42"
    assert document["body"] == payload
    status = await client.get("/v1/jobs/webhook:demo:msg_1")
    assert (await status.json())["state"] == "queued"
    claim_key = keys.dedup_webhook("demo", "msg_1")
    await client.app[INBOUND].auto.drain()  # the claim turns done with the next flush
    assert await claims.state(runtime.durable, claim_key) == claims.DONE
    assert 0 < await runtime.durable.ttl(claim_key) <= runtime.settings.dedup_ttl
    assert await registry_violations(runtime.durable, "durable") == []


async def test_body_without_text_is_kept_whole(client: Any, runtime: Runtime) -> None:
    body = body_of([1, {"a": "b"}])
    response = await client.post("/v1/webhooks/demo", data=body, headers=standard(body, "m2"))
    assert response.status == 202
    document = await stored_document(runtime.durable, "webhook:demo:m2")
    assert document["body"] == [1, {"a": "b"}]
    assert json.loads(document["text"]) == [1, {"a": "b"}]


async def test_escaped_surrogate_pairs_are_kept(client: Any, runtime: Runtime) -> None:
    body = b'{"note": "\\ud83d\\ude00 a pair"}'
    response = await client.post("/v1/webhooks/demo", data=body, headers=standard(body, "sur"))
    assert response.status == 202
    document = await stored_document(runtime.durable, "webhook:demo:sur")
    assert document["body"] == {"note": "\U0001f600 a pair"}


async def test_rotated_secrets_any_listed_signature_counts(client: Any) -> None:
    body = body_of({"text": "x"})
    headers = standard(body, "rot")
    headers["webhook-signature"] = "v1,AAAA v2,zzz " + headers["webhook-signature"]
    response = await client.post("/v1/webhooks/demo", data=body, headers=headers)
    assert response.status == 202


@pytest.mark.parametrize("change", [
    {"webhook-signature": "v1,Zm9vYmFy"},
    {"webhook-id": "other-id"},
    {"webhook-timestamp": "not-a-number"},
    {"webhook-signature": ""},
])
async def test_bad_signature_is_401_and_writes_nothing(client: Any, runtime: Runtime,
                                                      change: dict[str, str]) -> None:
    body = body_of({"text": "x"})
    headers = {**standard(body, "msg_bad"), **change}
    response = await client.post("/v1/webhooks/demo", data=body, headers=headers)
    assert response.status == 401
    answer = await response.json()
    assert answer["error"] == "bad_signature" and answer["detail"]
    assert await queued(runtime) == set()
    assert await dedup_keys(runtime) == []


async def test_tampered_body_is_401(client: Any, runtime: Runtime) -> None:
    headers = standard(body_of({"text": "x"}), "msg_t")
    response = await client.post("/v1/webhooks/demo", data=body_of({"text": "y"}),
                                 headers=headers)
    assert response.status == 401


async def test_replay_after_tolerance_is_401(client: Any, runtime: Runtime,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    body = body_of({"text": "captured"})
    captured = standard(body, "msg_replay")
    assert (await client.post("/v1/webhooks/demo", data=body, headers=captured)).status == 202
    later = time.time() + signing.TOLERANCE_SECONDS + 1
    monkeypatch.setattr(signing.time, "time", lambda: later)
    replay = await client.post("/v1/webhooks/demo", data=body, headers=captured)
    assert replay.status == 401
    assert "tolerance" in (await replay.json())["detail"]
    # A delivery signed in the future past the tolerance is refused the same way.
    future = standard(body, "msg_future", timestamp=int(later) + 400)
    assert (await client.post("/v1/webhooks/demo", data=body, headers=future)).status == 401


async def test_unknown_source_is_404(client: Any) -> None:
    body = body_of({"text": "x"})
    response = await client.post("/v1/webhooks/nope", data=body, headers=standard(body, "m"))
    assert response.status == 404
    assert (await response.json())["error"] == "unknown_source"


async def test_wrong_content_type_is_415(client: Any, runtime: Runtime) -> None:
    body = body_of({"text": "x"})
    headers = {**standard(body, "m"), "Content-Type": "text/plain"}
    response = await client.post("/v1/webhooks/demo", data=body, headers=headers)
    assert response.status == 415
    assert await queued(runtime) == set()


@pytest.mark.parametrize(("body", "fragment"), [
    (b"{not json", "not JSON"),
    (b"\xff\xfe{}", "not UTF-8"),
    # PostgreSQL keeps neither; accepted, they would fail the store stage for good.
    (b'{"a": ["\\u0000"]}', "u0000"),
    (b'{"\\ud800": 1}', "unpaired surrogate"),
    # Parsed fine, but the stages would fail on it for good: refused at the door.
    (b'{"a": ' + b"[" * 100 + b"]" * 100 + b"}", "nested deeper"),
    (b"[" * 1000 + b"]" * 1000, "nested deeper"),
])
async def test_signed_but_malformed_body_is_400(client: Any, runtime: Runtime, body: bytes,
                                                fragment: str) -> None:
    response = await client.post("/v1/webhooks/demo", data=body, headers=standard(body, "m"))
    assert response.status == 400
    assert fragment in (await response.json())["detail"]
    assert await queued(runtime) == set() and await dedup_keys(runtime) == []


async def test_unusable_delivery_id_is_400(client: Any, runtime: Runtime) -> None:
    body = body_of({"text": "x"})
    response = await client.post("/v1/webhooks/demo", data=body,
                                 headers=standard(body, "id with spaces"))
    assert response.status == 400
    assert "webhook-id" in (await response.json())["detail"]


async def test_oversized_body_with_length_is_413(client: Any, runtime: Runtime) -> None:
    body = b'{"text": "' + b"x" * (1024 * 1024) + b'"}'
    response = await client.post("/v1/webhooks/demo", data=body, headers=standard(body, "big"))
    assert response.status == 413
    assert await queued(runtime) == set()


async def test_oversized_chunked_body_is_refused_before_it_ends(client: Any,
                                                                runtime: Runtime) -> None:
    sent = 0
    total_chunks = 256  # 16 MiB offered, 1 MiB allowed

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(total_chunks):
            sent += 1
            yield b"x" * 65536

    headers = {**JSON, "webhook-id": "chunked", "webhook-timestamp": str(int(time.time())),
               "webhook-signature": "v1,AAAA"}
    try:
        response = await client.post("/v1/webhooks/demo", data=chunks(), headers=headers)
        status = response.status
    except Exception:  # the server may close while the client is still sending
        status = None
    assert status in (413, None)
    assert sent < total_chunks, "the server read the whole oversized body"
    assert await queued(runtime) == set()


async def test_github_scheme(client: Any, runtime: Runtime) -> None:
    body = body_of({"action": "opened", "html_url": "https://github.test/pr/1"})
    ok = await client.post("/v1/webhooks/gh", data=body, headers=github(body, "d-1"))
    assert ok.status == 202
    headers = github(body, "d-2")
    headers["X-Hub-Signature-256"] = "sha256=" + "0" * 64
    assert (await client.post("/v1/webhooks/gh", data=body, headers=headers)).status == 401
    assert await queued(runtime) == {"webhook:gh:d-1"}


async def test_stripe_scheme(client: Any, runtime: Runtime) -> None:
    body = body_of({"id": "evt_1", "type": "charge.succeeded"})
    ok = await client.post("/v1/webhooks/stripe", data=body, headers=stripe(body))
    assert ok.status == 202
    # Stripe resends the same event with a fresh timestamp: still one item.
    resent = await client.post("/v1/webhooks/stripe", data=body,
                               headers=stripe(body, int(time.time()) - 10))
    assert resent.status == 200
    stale = await client.post("/v1/webhooks/stripe", data=body,
                              headers=stripe(body, int(time.time()) - 3600))
    assert stale.status == 401
    assert len(await queued(runtime)) == 1


async def test_fifty_concurrent_deliveries_make_one_item(client: Any, runtime: Runtime) -> None:
    body = body_of({"text": "once"})
    headers = standard(body, "msg_storm")
    responses = await asyncio.gather(*(
        client.post("/v1/webhooks/demo", data=body, headers=headers) for _ in range(50)))
    statuses = sorted(r.status for r in responses)
    assert statuses == [200] * 49 + [202]
    assert await queued(runtime) == {"webhook:demo:msg_storm"}
    assert await runtime.durable.hlen(meta_key()) == 1


@pytest.mark.parametrize("atomic", [True, False], ids=["claim_add-script", "two-commands"])
async def test_claim_released_after_injected_failure_lets_retry_through(
        client: Any, runtime: Runtime, atomic: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Single instance: one script, so a failed call leaves no claim. The two-command path
    (a cluster's) claims first and must release the claim when ADD fails."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    intaker = client.app[INBOUND].intaker
    was_atomic, intaker.atomic = intaker.atomic, atomic
    name = "_claim_add" if atomic else "_add"
    real_script = getattr(intaker, name)

    class LostStore:
        """The script as seen when the script cache was flushed (its SHA unknown) and the
        store then went away (loading it fails)."""

        sha = "0" * 40
        script = "return 1"

    async def lost_load(_: str) -> Any:
        raise RedisConnectionError("injected: connection lost during ADD")

    setattr(intaker, name, LostStore())
    monkeypatch.setattr(intaker.auto.redis, "script_load", lost_load)
    body = body_of({"text": "retry me"})
    headers = standard(body, "msg_retry")
    try:
        failed = await client.post("/v1/webhooks/demo", data=body, headers=headers)
        assert failed.status == 503
        assert failed.headers["Retry-After"]
        assert await dedup_keys(runtime) == [], "the claim was not released"
        assert await queued(runtime) == set()

        setattr(intaker, name, real_script)
        monkeypatch.undo()
        retry = await client.post("/v1/webhooks/demo", data=body, headers=headers)
        assert retry.status == 202
        assert await queued(runtime) == {"webhook:demo:msg_retry"}
        again = await client.post("/v1/webhooks/demo", data=body, headers=headers)
        assert again.status == 200
        assert await runtime.durable.get(keys.dedup_webhook("demo", "msg_retry")) == "done"
    finally:
        intaker.atomic = was_atomic


async def test_script_flush_is_survived(client: Any, runtime: Runtime) -> None:
    await runtime.durable.script_flush()
    body = body_of({"text": "after flush"})
    response = await client.post("/v1/webhooks/demo", data=body,
                                 headers=standard(body, "msg_flush"))
    assert response.status == 202
    assert await queued(runtime) == {"webhook:demo:msg_flush"}


async def test_header_bytes_that_are_not_utf8_are_a_401_not_a_crash(client: Any) -> None:
    """aiohttp hands such header values over with surrogates (found by hand, not by the fuzz,
    which only sends what an HTTP client library will send)."""
    body = b'{"text": "x"}'
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    writer.write(b"POST /v1/webhooks/demo HTTP/1.1\r\nHost: t\r\n"
                 b"Content-Type: application/json\r\nwebhook-id: ab\xff\xfecd\r\n"
                 b"webhook-timestamp: " + str(int(time.time())).encode() + b"\r\n"
                 b"webhook-signature: v1,AAAA\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
