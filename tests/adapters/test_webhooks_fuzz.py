"""Fuzzed webhook requests (hypothesis): never a 5xx other than 503, never an unhandled
exception. Half the examples are correctly signed so the fuzz also reaches the body checks
and the store."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.runtime import Runtime
from gateway.web.app import create_app
from tests.adapters.webhook_helpers import standard

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
