"""Every HTTP route, fed malformed input, answers a clear 4xx JSON error and logs no error.

The cases cover each route the components register (``gateway.web.app.COMPONENTS``): bad
JSON, wrong types, huge/negative/non-numeric query parameters, bytes that are not UTF-8, NUL
bytes, overlong ids, wrong content types and wrong methods. A route that raised would be
answered 500 by the route guard and logged with ``log.exception``: both are asserted absent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
from yarl import URL

from gateway.config import Secret
from gateway.stores.runtime import Runtime
from gateway.web.app import create_app
from tests.conftest import TEST_ADMIN_TOKEN
from tests.inbound.webhook_helpers import body_of, github, standard

LONG = "x" * 7_000  # within aiohttp's 8190-byte request line (past it: see the last test)
BAD_UTF8 = b'{"text": "\xff\xfe broken"}'
NUL_JSON = b'{"text": "a\\u0000b"}'
JSON = {"Content-Type": "application/json"}


def webhook_headers(body: bytes, msg_id: str = "m-1") -> dict[str, str]:
    return standard(body, msg_id)


# (id, method, path (already percent-encoded), request keyword arguments)
CASES: list[tuple[str, str, str, dict[str, Any]]] = [
    # --- health and metrics
    ("healthz-post", "POST", "/healthz", {}),
    ("readyz-delete", "DELETE", "/readyz", {}),
    ("metrics-put", "PUT", "/metrics", {"data": b"x"}),
    ("unknown-path", "GET", "/v1/nothing-here", {}),
    ("unknown-path-bad-utf8", "GET", "/v1/%ff%fe", {}),
    ("unknown-path-nul", "GET", "/v1/a%00b", {}),
    ("unknown-path-long", "GET", "/v1/" + LONG, {}),
    # --- webhooks
    ("webhook-bad-json", "POST", "/v1/webhooks/demo",
     {"data": b"{nope", "headers": webhook_headers(b"{nope")}),
    ("webhook-bad-utf8", "POST", "/v1/webhooks/demo",
     {"data": BAD_UTF8, "headers": webhook_headers(BAD_UTF8)}),
    ("webhook-nul", "POST", "/v1/webhooks/demo",
     {"data": NUL_JSON, "headers": webhook_headers(NUL_JSON)}),
    ("webhook-text-plain", "POST", "/v1/webhooks/demo",
     {"data": b"{}", "headers": {**webhook_headers(b"{}"), "Content-Type": "text/plain"}}),
    ("webhook-unsigned", "POST", "/v1/webhooks/demo", {"data": b"{}", "headers": JSON}),
    ("webhook-github-unsigned", "POST", "/v1/webhooks/gh", {"data": b"{}", "headers": JSON}),
    ("webhook-github-bad-utf8", "POST", "/v1/webhooks/gh",
     {"data": BAD_UTF8, "headers": github(BAD_UTF8, "d-1")}),
    ("webhook-github-long-id", "POST", "/v1/webhooks/gh",
     {"data": b"{}", "headers": github(b"{}", LONG[:5000])}),
    ("webhook-stripe-garbage", "POST", "/v1/webhooks/stripe",
     {"data": b"{}", "headers": {**JSON, "Stripe-Signature": "t=1e400,v1=,,="}}),
    ("webhook-long-id", "POST", "/v1/webhooks/demo",
     {"data": body_of({}), "headers": webhook_headers(body_of({}), LONG[:5000])}),
    ("webhook-unknown-source-long", "POST", "/v1/webhooks/" + LONG[:5000],
     {"data": b"{}", "headers": JSON}),
    ("webhook-source-nul", "POST", "/v1/webhooks/de%00mo", {"data": b"{}", "headers": JSON}),
    ("webhook-get", "GET", "/v1/webhooks/demo", {}),
    ("webhook-timestamp-huge", "POST", "/v1/webhooks/demo",
     {"data": b"{}", "headers": {**JSON, "webhook-id": "m", "webhook-timestamp": "9" * 400,
                                 "webhook-signature": "v1,AAAA"}}),
    # --- jobs
    ("jobs-bad-json", "POST", "/v1/jobs", {"data": b"{nope", "headers": JSON}),
    ("jobs-bad-utf8", "POST", "/v1/jobs",
     {"data": b'{"document": {"text": "\xff"}}', "headers": JSON}),
    ("jobs-nul", "POST", "/v1/jobs",
     {"data": b'{"document": {"text": "a\\u0000"}}', "headers": JSON}),
    ("jobs-array", "POST", "/v1/jobs", {"json": [1, 2]}),
    ("jobs-empty", "POST", "/v1/jobs", {"data": b"", "headers": JSON}),
    ("jobs-document-number", "POST", "/v1/jobs", {"json": {"document": 5}}),
    ("jobs-text-number", "POST", "/v1/jobs", {"json": {"document": {"text": 5}}}),
    ("jobs-priority-number", "POST", "/v1/jobs",
     {"json": {"priority": 5, "document": {"text": "x"}}}),
    ("jobs-priority-unknown", "POST", "/v1/jobs",
     {"json": {"priority": "urgent", "document": {"text": "x"}}}),
    ("jobs-type-list", "POST", "/v1/jobs", {"json": {"type": [], "document": {"text": "x"}}}),
    ("jobs-id-number", "POST", "/v1/jobs", {"json": {"job_id": 12, "document": {"text": "x"}}}),
    ("jobs-id-long", "POST", "/v1/jobs", {"json": {"job_id": LONG, "document": {"text": "x"}}}),
    ("jobs-id-nul", "POST", "/v1/jobs",
     {"json": {"job_id": "a\u0000b", "document": {"text": "x"}}}),
    ("jobs-id-webhook-prefix", "POST", "/v1/jobs",
     {"json": {"job_id": "webhook:demo:x", "document": {"text": "x"}}}),
    ("jobs-title-object", "POST", "/v1/jobs",
     {"json": {"document": {"text": "x", "title": {}}}}),
    ("jobs-text-plain", "POST", "/v1/jobs",
     {"data": b'{"document": {"text": "x"}}', "headers": {"Content-Type": "text/plain"}}),
    ("jobs-deep", "POST", "/v1/jobs",
     {"data": b'{"document": {"text": "x", "extra": ' + b"[" * 5000 + b"]" * 5000 + b"}}",
      "headers": JSON}),
    ("jobs-put", "PUT", "/v1/jobs", {"json": {}}),
    ("job-get-long-id", "GET", "/v1/jobs/" + LONG, {}),
    ("job-get-nul", "GET", "/v1/jobs/a%00b", {}),
    ("job-get-bad-utf8", "GET", "/v1/jobs/%ff%fe", {}),
    ("job-get-unknown", "GET", "/v1/jobs/never-submitted", {}),
    ("job-delete", "DELETE", "/v1/jobs/x", {}),
    # --- chat platforms (configured or not: a JSON 4xx either way)
    ("telegram-bad-json", "POST", "/telegram/webhook", {"data": b"{nope", "headers": JSON}),
    ("telegram-get", "GET", "/telegram/webhook", {}),
    ("slack-events-bad", "POST", "/slack/events", {"data": b"\xff\x00", "headers": JSON}),
    ("slack-commands-bad", "POST", "/slack/commands",
     {"data": b"%ff=%00", "headers": {"Content-Type": "application/x-www-form-urlencoded"}}),
    # --- admin
    ("admin-queues-post", "POST", "/v1/admin/queues", {}),
    ("admin-dead-unknown-stage", "GET", "/v1/admin/deadletter/nope", {}),
    ("admin-dead-stage-nul", "GET", "/v1/admin/deadletter/st%00ore", {}),
    ("admin-dead-stage-long", "GET", "/v1/admin/deadletter/" + LONG, {}),
    ("admin-dead-limit-text", "GET", "/v1/admin/deadletter/store?limit=abc", {}),
    ("admin-dead-limit-negative", "GET", "/v1/admin/deadletter/store?limit=-1", {}),
    ("admin-dead-limit-huge", "GET", "/v1/admin/deadletter/store?limit=" + "9" * 400, {}),
    ("admin-dead-limit-bad-utf8", "GET", "/v1/admin/deadletter/store?limit=%ff", {}),
    ("admin-requeue-bad-json", "POST", "/v1/admin/deadletter/store/requeue",
     {"data": b"{nope", "headers": JSON}),
    ("admin-requeue-bad-utf8", "POST", "/v1/admin/deadletter/store/requeue",
     {"data": b'{"count": "\xff"}', "headers": JSON}),
    ("admin-requeue-count-text", "POST", "/v1/admin/deadletter/store/requeue",
     {"json": {"count": "many"}}),
    ("admin-requeue-count-float", "POST", "/v1/admin/deadletter/store/requeue",
     {"json": {"count": 1.5e300}}),
    ("admin-requeue-count-list", "POST", "/v1/admin/deadletter/store/requeue",
     {"json": {"count": [1]}}),
    ("admin-requeue-array", "POST", "/v1/admin/deadletter/store/requeue", {"json": [1]}),
    ("admin-requeue-get", "GET", "/v1/admin/deadletter/store/requeue", {}),
    ("admin-usage-group-unknown", "GET", "/v1/admin/usage?group=everything", {}),
    ("admin-usage-group-nul", "GET", "/v1/admin/usage?group=model%00", {}),
    ("admin-usage-days-text", "GET", "/v1/admin/usage?days=week", {}),
    ("admin-usage-days-negative", "GET", "/v1/admin/usage?days=-3", {}),
    ("admin-usage-days-zero", "GET", "/v1/admin/usage?days=0", {}),
    ("admin-usage-days-huge", "GET", "/v1/admin/usage?days=" + "9" * 400, {}),
    ("admin-usage-days-int64", "GET", "/v1/admin/usage?days=99999999999", {}),
    ("admin-usage-post", "POST", "/v1/admin/usage", {}),
    # --- search
    ("search-no-q", "GET", "/v1/search", {}),
    ("search-blank-q", "GET", "/v1/search?q=%20%20", {}),
    ("search-long-q", "GET", "/v1/search?q=" + LONG, {}),
    ("search-limit-text", "GET", "/v1/search?q=a&limit=ten", {}),
    ("search-limit-negative", "GET", "/v1/search?q=a&limit=-5", {}),
    ("search-limit-zero", "GET", "/v1/search?q=a&limit=0", {}),
    ("search-limit-huge", "GET", "/v1/search?q=a&limit=" + "9" * 400, {}),
    ("search-limit-float", "GET", "/v1/search?q=a&limit=1e3", {}),
    ("search-post", "POST", "/v1/search?q=a", {}),
    # --- feed and stream
    ("feed-no-topic", "GET", "/v1/feed", {}),
    ("feed-after-text", "GET", "/v1/feed?topic=pipeline&after=abc", {}),
    ("feed-after-negative", "GET", "/v1/feed?topic=pipeline&after=-1", {}),
    ("feed-after-huge", "GET", "/v1/feed?topic=pipeline&after=" + "9" * 400, {}),
    ("feed-after-int64", "GET", "/v1/feed?topic=pipeline&after=9223372036854775808", {}),
    ("feed-after-float", "GET", "/v1/feed?topic=pipeline&after=1e400", {}),
    ("feed-limit-negative", "GET", "/v1/feed?topic=pipeline&limit=-1", {}),
    ("feed-limit-zero", "GET", "/v1/feed?topic=pipeline&limit=0", {}),
    ("feed-limit-huge", "GET", "/v1/feed?topic=pipeline&limit=" + "9" * 400, {}),
    ("feed-topic-nul", "GET", "/v1/feed?topic=pipe%00line", {}),
    ("feed-topic-bad-utf8", "GET", "/v1/feed?topic=%ff%fe", {}),
    ("feed-topic-long", "GET", "/v1/feed?topic=" + LONG, {}),
    ("feed-post", "POST", "/v1/feed?topic=pipeline", {}),
    ("stream-no-topics", "GET", "/v1/stream", {}),
    ("stream-empty-topics", "GET", "/v1/stream?topics=,,,", {}),
    ("stream-many-topics", "GET", "/v1/stream?topics=" + ",".join(f"t{i}" for i in range(500)),
     {}),
    ("stream-topic-nul", "GET", "/v1/stream?topics=pipe%00line", {}),
    ("stream-topic-bad-utf8", "GET", "/v1/stream?topics=%ff", {}),
    ("stream-topic-long", "GET", "/v1/stream?topics=" + LONG, {}),
    ("stream-since-garbage", "GET", "/v1/stream?topics=pipeline&since=garbage", {}),
    ("stream-since-huge", "GET", "/v1/stream?topics=pipeline&since=pipeline:" + "9" * 400, {}),
    ("stream-since-negative", "GET", "/v1/stream?topics=pipeline&since=pipeline:-5", {}),
    ("stream-post", "POST", "/v1/stream?topics=pipeline", {}),
    # --- dashboard and static files
    ("dashboard-summary-post", "POST", "/v1/dashboard/summary", {}),
    ("dashboard-page-post", "POST", "/", {"data": b"x"}),
    ("static-unknown", "GET", "/static/nope.js", {}),
    ("static-traversal", "GET", "/static/..%2f..%2fetc%2fpasswd", {}),
    ("static-nul", "GET", "/static/a%00.js", {}),
    ("static-long", "GET", "/static/" + LONG, {}),
    # --- auth
    ("token-bad-json", "POST", "/v1/auth/token", {"data": b"{nope", "headers": JSON}),
    ("token-bad-utf8", "POST", "/v1/auth/token", {"data": b'{"sub": "\xff"}', "headers": JSON}),
    ("token-array", "POST", "/v1/auth/token", {"json": []}),
    ("token-sub-number", "POST", "/v1/auth/token", {"json": {"sub": 5}}),
    ("token-sub-long", "POST", "/v1/auth/token", {"json": {"sub": LONG}}),
    ("token-sub-nul", "POST", "/v1/auth/token", {"json": {"sub": "a\u0000b"}}),
    ("token-ttl-text", "POST", "/v1/auth/token", {"json": {"sub": "a", "ttl": "long"}}),
    ("token-ttl-negative", "POST", "/v1/auth/token", {"json": {"sub": "a", "ttl": -5}}),
    ("token-ttl-huge", "POST", "/v1/auth/token", {"json": {"sub": "a", "ttl": 10 ** 400}}),
    ("token-ttl-float", "POST", "/v1/auth/token", {"json": {"sub": "a", "ttl": 1.5e308}}),
    ("token-ttl-bool", "POST", "/v1/auth/token", {"json": {"sub": "a", "ttl": True}}),
    ("token-scope-number", "POST", "/v1/auth/token", {"json": {"sub": "a", "scope": 5}}),
    ("token-scope-unknown", "POST", "/v1/auth/token",
     {"json": {"sub": "a", "scope": "everything:please"}}),
    ("token-topics-number", "POST", "/v1/auth/token", {"json": {"sub": "a", "topics": 5}}),
    ("token-topics-nested", "POST", "/v1/auth/token",
     {"json": {"sub": "a", "topics": [["x"]]}}),
    ("token-get", "GET", "/v1/auth/token", {}),
    ("refresh-bad-json", "POST", "/v1/auth/refresh", {"data": b"{nope", "headers": JSON}),
    ("refresh-number", "POST", "/v1/auth/refresh", {"json": {"refresh_token": 5}}),
    ("refresh-garbage", "POST", "/v1/auth/refresh",
     {"json": {"refresh_token": "rt_\u0000" + LONG[:3000]}}),
    ("refresh-bad-utf8", "POST", "/v1/auth/refresh",
     {"data": b'{"refresh_token": "\xff"}', "headers": JSON}),
    ("revoke-bad-json", "POST", "/v1/auth/revoke", {"data": b"[[[", "headers": JSON}),
    ("revoke-number", "POST", "/v1/auth/revoke", {"json": {"token": 5}}),
    ("admin-revoke-empty", "POST", "/v1/admin/revoke", {"json": {}}),
    ("admin-revoke-jti-number", "POST", "/v1/admin/revoke", {"json": {"jti": 5}}),
    ("admin-revoke-sub-long", "POST", "/v1/admin/revoke", {"json": {"sub": LONG}}),
    ("admin-revoke-bad-utf8", "POST", "/v1/admin/revoke",
     {"data": b'{"sub": "\xff"}', "headers": JSON}),
    ("link-code-bad-json", "POST", "/v1/auth/link-code", {"data": b"{nope", "headers": JSON}),
    ("links-delete-text-id", "DELETE", "/v1/auth/links/abc", {}),
    ("links-delete-huge-id", "DELETE", "/v1/auth/links/" + "9" * 400, {}),
    ("links-delete-negative-id", "DELETE", "/v1/auth/links/-1", {}),
    ("links-delete-nul-id", "DELETE", "/v1/auth/links/1%00", {}),
    ("links-put", "PUT", "/v1/auth/links", {}),
    # --- credentials in odd shapes
    ("bearer-empty", "GET", "/v1/admin/queues", {"headers": {"Authorization": "Bearer"}}),
    ("bearer-basic", "GET", "/v1/admin/queues", {"headers": {"Authorization": "Basic eDp5"}}),
    ("bearer-long", "GET", "/v1/admin/queues",
     {"headers": {"Authorization": "Bearer " + LONG[:7000]}}),
    ("bearer-jwt-garbage", "GET", "/v1/admin/queues",
     {"headers": {"Authorization": "Bearer eyJ.eyJ.x"}}),
    ("query-token-garbage", "GET", "/v1/stream?topics=pipeline&access_token=%ff%00",
     {"headers": {"Authorization": ""}}),
    # --- publishing
    ("publish-bad-json", "POST", "/v1/topics/t/events", {"data": b"{nope", "headers": JSON}),
    ("publish-bad-utf8", "POST", "/v1/topics/t/events", {"data": BAD_UTF8, "headers": JSON}),
    ("publish-nul", "POST", "/v1/topics/t/events", {"data": NUL_JSON, "headers": JSON}),
    ("publish-array", "POST", "/v1/topics/t/events", {"json": [1]}),
    ("publish-kind-number", "POST", "/v1/topics/t/events", {"json": {"kind": 5}}),
    ("publish-data-string", "POST", "/v1/topics/t/events", {"json": {"data": "x"}}),
    ("publish-event-id-long", "POST", "/v1/topics/t/events", {"json": {"event_id": LONG}}),
    ("publish-topic-long", "POST", "/v1/topics/" + LONG[:300] + "/events", {"json": {}}),
    ("publish-topic-bad-utf8", "POST", "/v1/topics/%ff%fe/events", {"json": {}}),
    ("publish-topic-nul", "POST", "/v1/topics/a%00b/events", {"json": {}}),
    ("publish-deep", "POST", "/v1/topics/t/events",
     {"data": b'{"data":' + b'[' * 100 + b']' * 100 + b'}', "headers": JSON}),
    ("publish-huge-int", "POST", "/v1/topics/t/events",
     {"data": b'{"data":{"n":' + b'9' * 5000 + b'}}', "headers": JSON}),
    ("publish-get", "GET", "/v1/topics/t/events", {}),
    # --- subscriptions
    ("subscribe-bad-json", "POST", "/v1/subscriptions", {"data": b"{nope", "headers": JSON}),
    ("subscribe-bad-utf8", "POST", "/v1/subscriptions", {"data": BAD_UTF8, "headers": JSON}),
    ("subscribe-array", "POST", "/v1/subscriptions", {"json": [1]}),
    ("subscribe-topic-number", "POST", "/v1/subscriptions",
     {"json": {"topic": 5, "destination": {"type": "webhook", "url": "https://x.test/"}}}),
    ("subscribe-url-long", "POST", "/v1/subscriptions",
     {"json": {"topic": "t", "destination": {"type": "webhook", "url": "https://" + LONG}}}),
    ("subscribe-url-nul", "POST", "/v1/subscriptions",
     {"json": {"topic": "t", "destination": {"type": "webhook", "url": "https://a\u0000b/"}}}),
    ("subscribe-url-port", "POST", "/v1/subscriptions",
     {"json": {"topic": "t", "destination": {"type": "webhook", "url": "https://x:99999/"}}}),
    ("subscribe-url-ipv6-broken", "POST", "/v1/subscriptions",
     {"json": {"topic": "t", "destination": {"type": "webhook", "url": "https://[::1/"}}}),
    ("subscribe-kinds-long", "POST", "/v1/subscriptions",
     {"json": {"topic": "t", "kinds": ["k"] * 51,
               "destination": {"type": "webhook", "url": "https://x.test/"}}}),
    ("subscribe-after-huge", "POST", "/v1/subscriptions",
     {"json": {"topic": "t", "after": 2**64,
               "destination": {"type": "webhook", "url": "https://x.test/"}}}),
    ("subscription-get-long", "GET", "/v1/subscriptions/" + LONG, {}),
    ("subscription-get-nul", "GET", "/v1/subscriptions/a%00b", {}),
    ("subscription-get-bad-utf8", "GET", "/v1/subscriptions/%ff%fe", {}),
    ("subscription-list-limit", "GET", "/v1/subscriptions?limit=-1", {}),
    ("subscription-list-limit-huge", "GET", "/v1/subscriptions?limit=" + "9" * 40, {}),
    ("subscription-failures-after", "GET", "/v1/subscriptions/x/failures?after=x", {}),
    ("subscription-replay-bad", "POST", "/v1/subscriptions/x/replay", {"json": {"after": "1"}}),
    ("subscription-replay-huge", "POST", "/v1/subscriptions/x/replay",
     {"json": {"after": 2**70}}),
    ("subscription-put", "PUT", "/v1/subscriptions/x", {"json": {}}),
    ("admin-subscriptions-limit", "GET", "/v1/admin/subscriptions?limit=x", {}),
]


@pytest.fixture
async def full_client(make_client: Callable[..., Any], runtime: Runtime) -> Any:
    """The whole app, token issuing included (it needs a JWT secret)."""
    settings = dataclasses.replace(runtime.settings, jwt_secret=Secret("s" * 32))
    return await make_client(create_app(dataclasses.replace(runtime, settings=settings)))


@pytest.mark.parametrize(("method", "path", "kwargs"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
async def test_malformed_input_is_a_json_4xx_without_an_error_log(
        full_client: Any, caplog: pytest.LogCaptureFixture, method: str, path: str,
        kwargs: dict[str, Any]) -> None:
    caplog.set_level(logging.INFO)
    response = await full_client.request(method, URL(path, encoded=True), **kwargs)
    text = await response.text()
    assert 400 <= response.status < 500, (response.status, text[:300])
    assert response.content_type == "application/json", text[:300]
    answer = json.loads(text)
    assert isinstance(answer.get("error"), str) and isinstance(answer.get("detail"), str)
    assert len(text) < 2000, "an error body echoes the input back"
    noisy = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert noisy == [], [r.getMessage() for r in noisy]


async def raw_request(client: Any, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send bytes as they are (the client library refuses control characters and bytes that
    are not ASCII in headers) and read one response: status, headers, body."""
    reader, writer = await asyncio.open_connection(client.host, client.port)
    try:
        writer.write(request)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in
                   (line.partition(":") for line in lines[1:] if line)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        return int(lines[0].split()[1]), headers, body
    finally:
        writer.close()


def raw(method: str | bytes, path: str | bytes, *headers: bytes) -> bytes:
    """A request as bytes, with the admin token unless ``headers`` bring an Authorization."""
    line = b" ".join(p if isinstance(p, bytes) else p.encode() for p in (method, path))
    auth = [] if any(h.lower().startswith(b"authorization:") for h in headers) else [
        f"Authorization: Bearer {TEST_ADMIN_TOKEN}".encode()]
    lines = [line + b" HTTP/1.1", b"Host: gateway", *auth, *headers, b"Connection: close",
             b"", b""]
    return b"\r\n".join(lines)


RAW_CASES: list[tuple[str, bytes]] = [
    ("stream-last-event-id-bad-utf8", raw("GET", "/v1/stream?topics=pipeline",
                                          b"Last-Event-ID: pipeline:\xff\xfe")),
    ("stream-last-event-id-long", raw("GET", "/v1/stream?topics=pipeline",
                                      b"Last-Event-ID: ::" + b"9" * 6000)),
    ("bearer-not-utf8", raw("GET", "/v1/admin/queues", b"Authorization: Bearer gk_\xff_\xfe")),
    ("bearer-utf8", raw("GET", "/v1/admin/queues",
                        b"Authorization: Bearer gk_\xc3\xa9_\xc3\xa9")),
    ("bearer-empty", raw("GET", "/v1/admin/queues", b"Authorization: Bearer ")),
    ("preflight-bad-utf8", raw("OPTIONS", "/v1/jobs", b"Origin: https://\xff" + b"o" * 2000,
                               b"Access-Control-Request-Method: \xfe")),
    ("webhook-id-not-utf8", raw("POST", "/v1/webhooks/demo", b"Content-Type: application/json",
                                b"webhook-id: \xff\xfe", b"webhook-timestamp: 1",
                                b"webhook-signature: v1,AAAA", b"Content-Length: 2") + b"{}"),
    ("content-type-not-utf8", raw("POST", "/v1/jobs", b"Content-Type: application/\xff",
                                  b"Content-Length: 2") + b"{}"),
]


@pytest.mark.parametrize("request_bytes", [c[1] for c in RAW_CASES],
                         ids=[c[0] for c in RAW_CASES])
async def test_raw_bytes_are_a_json_4xx_without_an_error_log(
        full_client: Any, caplog: pytest.LogCaptureFixture, request_bytes: bytes) -> None:
    caplog.set_level(logging.INFO)
    status, headers, body = await raw_request(full_client, request_bytes)
    assert 400 <= status < 500, (status, body[:300])
    assert headers["content-type"].startswith("application/json"), body[:300]
    answer = json.loads(body)
    assert isinstance(answer.get("error"), str) and isinstance(answer.get("detail"), str)
    noisy = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert noisy == [], [r.getMessage() for r in noisy]


@pytest.mark.parametrize("request_bytes", [
    raw("GET", "/v1/jobs/" + "x" * 9000),  # request line over aiohttp's 8190 bytes
    raw("GET", "/v1/admin/queues", b"X-Big: " + b"y" * 9000),  # one header over it
    raw("GET", "/v1/admin/queues", b"X-Nul: a\x00b"),  # NUL in a header
    raw("GET", "/v1/stream?topics=pipeline", b"Last-Event-ID: \x01:::"),  # control character
    raw("GET", b"/v1/search?q=\xff\xfe"),  # raw bytes in the query
    raw("GET", b"/v1/jobs/\xff\xfe"),  # raw bytes in the path
    raw("GET", "/v1/jobs/a b"),  # a space in the target
    b"NOT HTTP AT ALL\r\n\r\n",
], ids=["line-too-long", "header-too-long", "header-nul", "header-control", "query-bytes",
        "path-bytes", "target-space", "not-http"])
async def test_what_the_http_parser_refuses_is_a_400_without_an_error_log(
        full_client: Any, caplog: pytest.LogCaptureFixture, request_bytes: bytes) -> None:
    """Refused by aiohttp's parser before any route runs: a plain-text 400 (see the
    departures in docs/architecture.md), and nothing worse than INFO in the log."""
    caplog.set_level(logging.INFO)
    status, _, _ = await raw_request(full_client, request_bytes)
    assert status == 400
    noisy = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert noisy == [], [r.getMessage() for r in noisy]
