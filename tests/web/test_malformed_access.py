"""Five inputs that once ended in an unhandled 500, uncounted by the brute-force barrier
(issue 24 point 8): a bearer token that is not UTF-8, unpaired surrogates in the refresh and
revoke bodies, integers past Python's 4,300-digit limit in JSON. Each is now a clear 4xx,
and a refused credential counts in the barrier like any other. (The non-ASCII Telegram secret
is in tests/inbound/test_telegram.py, where the bot runs.)"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from gateway.config import Secret
from gateway.security.brute import fail_key
from gateway.stores.runtime import Runtime
from gateway.web.app import create_app
from tests.inbound.webhook_helpers import standard
from tests.web.test_malformed import raw, raw_request

HUGE = b"9" * 5000  # past sys.get_int_max_str_digits() (4,300)
JSON = {"Content-Type": "application/json"}


@pytest.fixture
async def client(make_client: Callable[..., Any], runtime: Runtime) -> Any:
    """The whole app, token issuing included."""
    settings = dataclasses.replace(runtime.settings, jwt_secret=Secret("s" * 32))
    return await make_client(create_app(dataclasses.replace(runtime, settings=settings)))


def _no_error_logged(caplog: pytest.LogCaptureFixture) -> None:
    noisy = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert noisy == [], [r.getMessage() for r in noisy]


async def _failures(runtime: Runtime) -> int:
    return int(await runtime.durable.get(fail_key("127.0.0.1")) or 0)


async def test_a_bearer_token_that_is_not_utf8_is_a_counted_401(
        client: Any, runtime: Runtime, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    for token in (b"eyJ\xff\xfe.eyJ.x", b"\xc3\xa9t\xc3\xa9", b"\xff"):
        status, headers, _ = await raw_request(client, raw(
            "GET", "/v1/admin/queues", b"Authorization: Bearer " + token))
        assert status == 401 and headers["content-type"].startswith("application/json")
        assert "invalid_token" in headers["www-authenticate"]
    assert await _failures(runtime) == 3
    _no_error_logged(caplog)


@pytest.mark.parametrize(("path", "field"), [("/v1/auth/refresh", "refresh_token"),
                                             ("/v1/auth/revoke", "token")])
async def test_unpaired_surrogates_in_refresh_and_revoke_are_a_400(
        client: Any, caplog: pytest.LogCaptureFixture, path: str, field: str) -> None:
    caplog.set_level(logging.INFO)
    for value in ("\\ud800", "grt_\\udfff", "eyJ\\ud83d.x"):
        body = f'{{"{field}": "{value}"}}'.encode()
        async with client.post(path, data=body, headers={**JSON, "Authorization": ""}
                                    ) as response:
            assert response.status == 400, await response.text()
            assert (await response.json())["error"] == "bad_request"
    _no_error_logged(caplog)


@pytest.mark.parametrize(("path", "make"), [
    ("/v1/jobs", lambda n: b'{"document": {"text": "x", "n": ' + n + b"}}"),
    ("/v1/webhooks/demo", lambda n: b'{"amount": ' + n + b"}"),
    ("/v1/auth/token", lambda n: b'{"sub": "a", "ttl": ' + n + b"}"),
    ("/v1/auth/refresh", lambda n: b'{"refresh_token": ' + n + b"}"),
    ("/v1/auth/revoke", lambda n: b'{"token": ' + n + b"}"),
    ("/v1/admin/revoke", lambda n: b'{"jti": ' + n + b"}"),
    ("/v1/admin/deadletter/store/requeue", lambda n: b'{"count": ' + n + b"}"),
    ("/v1/topics/t/events", lambda n: b'{"data": {"n": ' + n + b"}}"),
    ("/v1/subscriptions", lambda n: b'{"topic": "t", "after": ' + n + b"}"),
])
async def test_integers_past_4300_digits_are_a_400(
        client: Any, caplog: pytest.LogCaptureFixture, path: str, make: Any) -> None:
    caplog.set_level(logging.INFO)
    body = make(HUGE)
    headers = standard(body, "msg-huge") if "webhooks" in path else JSON
    async with client.post(path, data=body, headers=headers) as response:
        text = await response.text()
        assert response.status == 400, text[:300]
        assert json.loads(text)["error"] in ("bad_request", "malformed")
    _no_error_logged(caplog)
