"""Priority is a grant (issue 24 point 6): a client once sent 300 jobs with ``priority:
high`` and all of them ran before a webhook that came in earlier. Now ``high`` needs the
``jobs:priority`` scope: the client's 300 are refused as ``high`` (nothing written), taken as
``normal`` they queue behind the webhook, which the store stage takes first; a credential
granted the scope still goes ahead."""

from __future__ import annotations

import json
from typing import Any

from gateway.access import apikeys
from gateway.pipeline.stages import meta_key
from gateway.pipeline.status import ready_items
from gateway.stores.runtime import Runtime
from tests.inbound.webhook_helpers import body_of, post_as_sender, standard

DOC = {"text": "a client's document"}


async def _key(runtime: Runtime, *scopes: str) -> dict[str, str]:
    created = await apikeys.create(runtime.pg, "client", frozenset(scopes), ())
    return {"Authorization": f"Bearer {created['key']}"}


async def _queued(client: Any, headers: dict[str, str], job: dict[str, Any]) -> int:
    """The status of a job sent as a client does: a 503 (the write outlasted its budget on a
    loaded machine, with Retry-After) sent again. A first try that did write makes the
    re-send a duplicate (200), which fails the caller's 202."""
    response = await post_as_sender(client, "/v1/jobs", json.dumps(job).encode(),
                                    {**headers, "Content-Type": "application/json"})
    response.release()
    return int(response.status)


async def _early_webhook(client: Any) -> str:
    """A signed webhook accepted before the client's jobs: its item id."""
    body = body_of({"type": "order.created", "text": "order 1234"})
    async with client.post("/v1/webhooks/demo", data=body,
                           headers=standard(body, "msg_early")) as accepted:
        assert accepted.status == 202
        return str((await accepted.json())["item_id"])


async def test_300_high_jobs_of_a_client_do_not_pass_an_earlier_webhook(
        client: Any, runtime: Runtime) -> None:
    webhook = await _early_webhook(client)
    plain = await _key(runtime, "jobs:write")
    for n in range(300):
        async with client.post("/v1/jobs", headers=plain, json={
                "job_id": f"j{n}", "priority": "high", "document": DOC}) as refused:
            assert refused.status == 403
            assert "jobs:priority" in (await refused.json())["detail"]
    assert await runtime.durable.hlen(meta_key()) == 1  # nothing of theirs was written
    for n in range(300):
        assert await _queued(client, plain, {"job_id": f"j{n}", "document": DOC}) == 202
    order = await ready_items(runtime.durable, "store")
    assert len(order) == 301 and order[0] == webhook  # the store stage takes it first
    granted = await _key(runtime, "jobs:write", "jobs:priority")
    async with client.post("/v1/jobs", headers=granted, json={
            "job_id": "urgent", "priority": "high", "document": DOC}) as urgent:
        assert urgent.status == 202
        item = (await urgent.json())["item_id"]
    assert (await ready_items(runtime.durable, "store"))[:2] == [item, webhook]


async def test_300_jobs_typed_for_a_bonus_do_not_pass_an_earlier_webhook(
        client: Any, runtime: Runtime) -> None:
    """The type bonus (``api_docs`` 5, ``code`` 3: 50-83 minutes of queue age) is priority
    too: a client without the grant once put 300 ``"type": "api_docs"`` jobs ahead of an
    earlier webhook. Refused like ``high``; a granted credential still has it."""
    webhook = await _early_webhook(client)
    plain = await _key(runtime, "jobs:write")
    for n in range(300):
        async with client.post("/v1/jobs", headers=plain, json={
                "job_id": f"j{n}", "type": ("api_docs", "code")[n % 2],
                "document": DOC}) as refused:
            assert refused.status == 403
            assert "jobs:priority" in (await refused.json())["detail"]
    assert await runtime.durable.hlen(meta_key()) == 1  # nothing of theirs was written
    for n in range(300):
        assert await _queued(client, plain, {
            "job_id": f"j{n}", "type": "other", "document": DOC}) == 202
    order = await ready_items(runtime.durable, "store")
    assert len(order) == 301 and order[0] == webhook
    granted = await _key(runtime, "jobs:write", "jobs:priority")
    async with client.post("/v1/jobs", headers=granted, json={
            "job_id": "manual", "type": "api_docs", "document": DOC}) as docs:
        assert docs.status == 202
        item = (await docs.json())["item_id"]
    assert (await ready_items(runtime.durable, "store"))[:2] == [item, webhook]
