"""Fuzzed webhook requests (hypothesis): never a 5xx other than 503, never an unhandled
exception. Half the examples are correctly signed so the fuzz also reaches the body checks
and the store."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.stores.runtime import Runtime
from gateway.web.app import create_app
from tests.inbound.webhook_helpers import standard

HEADER_NAMES = ("webhook-id", "webhook-timestamp", "webhook-signature", "Content-Type",
                "X-Hub-Signature-256", "X-GitHub-Delivery", "Stripe-Signature",
                "X-Forwarded-For", "Content-Encoding")
header_text = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=80)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12)
bodies = st.binary(max_size=512) | json_values.map(lambda v: json.dumps(v).encode())
requests = st.fixed_dictionaries({
    "source": st.sampled_from(["demo", "gh", "stripe", "unknown"]) | st.from_regex(
        r"\A[a-z0-9_-]{1,12}\Z"),
    "body": bodies,
    "headers": st.dictionaries(st.sampled_from(HEADER_NAMES), header_text, max_size=6),
    "sign_as": st.none() | header_text.filter(bool),
    "content_type": st.sampled_from(["application/json", "application/cloudevents+json",
                                     "text/plain", ""]),
})


@pytest.fixture
async def fuzz_client(make_client: Any, runtime: Runtime) -> Any:
    # A barrier that never trips: every example should reach verification.
    settings_ = dataclasses.replace(runtime.settings,
                                    sections={"security": {"brute_max_failures": 10**9}})
    return await make_client(create_app(dataclasses.replace(runtime, settings=settings_)))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(request=requests)
async def test_fuzzed_requests_never_fail_the_server(fuzz_client: Any, request: dict[str, Any],
                                                     caplog: pytest.LogCaptureFixture) -> None:
    headers = dict(request["headers"])
    if request["sign_as"] is not None:
        headers.update(standard(request["body"], request["sign_as"]))
    if request["content_type"]:
        headers["Content-Type"] = request["content_type"]
    response = await fuzz_client.post(f"/v1/webhooks/{request['source']}",
                                      data=request["body"], headers=headers)
    assert response.status < 500 or response.status == 503, await response.text()
    answer = await response.json()
    if response.status >= 400:
        assert set(answer) >= {"error", "detail"}
    else:
        assert answer["status"] in ("accepted", "duplicate")
    assert "unhandled error" not in caplog.text


raw_values = st.binary(min_size=1, max_size=60).filter(
    lambda b: b"\r" not in b and b"\n" not in b and not b[:1].isspace())


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(values=st.dictionaries(st.sampled_from(HEADER_NAMES[:3]), raw_values, min_size=1),
       body=st.binary(max_size=64), fresh=st.booleans())
async def test_raw_header_bytes_never_fail_the_server(fuzz_client: Any, values: dict[str, bytes],
                                                      body: bytes, fresh: bool) -> None:
    """Bytes an HTTP client library would refuse to send (not UTF-8, controls), on a raw
    socket: the answer is never a 5xx. ``fresh`` puts a current timestamp and some signature
    in, so the odd bytes reach the HMAC too."""
    if fresh:
        values = {"webhook-timestamp": str(int(time.time())).encode(),
                  "webhook-signature": b"v1,AAAA", **values}
    headers = b"".join(name.encode() + b": " + value + b"\r\n" for name, value in values.items())
    reader, writer = await asyncio.open_connection(fuzz_client.server.host,
                                                   fuzz_client.server.port)
    writer.write(b"POST /v1/webhooks/demo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json"
                 b"\r\n" + headers + b"Content-Length: " + str(len(body)).encode()
                 + b"\r\nConnection: close\r\n\r\n" + body)
    await writer.drain()
    status_line = (await reader.readline()).decode("latin-1")
    writer.close()
    version, _, rest = status_line.partition(" ")
    assert version in ("HTTP/1.0", "HTTP/1.1"), status_line  # the parser's refusals are 1.0
    assert not rest.startswith("5"), status_line
