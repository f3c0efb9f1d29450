"""PushClient with a TokenRefresher (and push.js with GatewayPush.refresher, run by node)
against the full app: a stream whose short-lived access token ends (``token_expired``)
resumes with a token from ``POST /v1/auth/refresh``, every row once and in order; a refused
refresh token stops the client with ``RefreshRefused``."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import traceback
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

import gateway.web
from gateway.config import Secret, Settings
from gateway.push import feed
from gateway.push.client import AccessRefused, PushClient, RefreshRefused, TokenRefresher
from gateway.stores.runtime import Runtime, open_runtime
from gateway.web.app import create_app
from tests.conftest import TEST_ADMIN_TOKEN
from tests.helpers import wait_until
from tests.push.conftest import base_url

SECRET = "push-credential-secret-0123456789-0123456789"
TOPIC = "conversation:1"


@pytest.fixture
async def app_client(runtime: Runtime, settings: Settings,
                     make_client: Any) -> AsyncIterator[TestClient[Any, Any]]:
    rt = await open_runtime(dataclasses.replace(settings, jwt_secret=Secret(SECRET)))
    try:
        yield await make_client(create_app(rt), rt=rt)
    finally:
        await rt.close()


async def login(client: TestClient[Any, Any], ttl: int) -> dict[str, Any]:
    async with client.post("/v1/auth/token", json={
            "sub": "alice", "scope": "feed:read", "topics": [TOPIC], "ttl": ttl},
            headers={"Authorization": f"Bearer {TEST_ADMIN_TOKEN}"}) as response:
        assert response.status == 200
        pair: dict[str, Any] = await response.json()
        return pair


async def test_refresher_resumes_a_stream_across_expiries_without_loss_or_duplicate(
        app_client: TestClient[Any, Any], runtime: Runtime) -> None:
    pair = await login(app_client, ttl=2)
    rotated: list[str] = []
    base = base_url(app_client)
    refresher = TokenRefresher(base, pair["refresh_token"], access_token=pair["access_token"],
                               expires_in=pair["expires_in"], on_rotate=rotated.append)
    offsets: list[int] = []
    async with PushClient(base, [TOPIC], since={TOPIC: 0}, credential=refresher,
                          poll_seconds=0.5) as push:
        async def follow() -> None:
            async for row in push:
                offsets.append(row.offset)

        following = asyncio.create_task(follow())
        await push.wait_connected()
        first = refresher.refreshes
        for n in range(12):  # rows arrive before and after the first token's end
            await feed.append_and_publish(runtime.pg, runtime.cache, TOPIC, "message", {"n": n})
            if n == 5:
                # The stream the first token opened is ended by the server at its expiry.
                await wait_until(lambda: push.last_disconnect_reason is not None, timeout=6,
                                 message="the server ended the first stream")
        await wait_until(lambda: refresher.refreshes > first and push.connects >= 2,
                         timeout=6, message="refreshed and reconnected")
        await wait_until(lambda: len(offsets) >= 12, timeout=10, message="every row")
        following.cancel()
        assert push.last_disconnect_reason is not None
        assert json.loads(push.last_disconnect_reason)["reason"] == "token_expired"
    assert offsets == list(range(1, 13))  # none lost, none twice, in order
    assert rotated and len(set(rotated)) == len(rotated) == refresher.refreshes
    assert pair["refresh_token"] not in rotated and refresher.refresh_token == rotated[-1]


async def test_a_refused_refresh_token_stops_the_client(
        app_client: TestClient[Any, Any]) -> None:
    """The holder logs out (its refresh family and access token revoked): the stream ends
    ``revoked``, the refresh is refused, and ``get()`` raises RefreshRefused."""
    pair = await login(app_client, ttl=300)
    base = base_url(app_client)
    refresher = TokenRefresher(base, pair["refresh_token"], access_token=pair["access_token"],
                               expires_in=pair["expires_in"])
    # No silence poll of the feed within the test: the stream's end is what tells the
    # refresher (its token's own deadline is minutes away).
    async with PushClient(base, [TOPIC], credential=refresher, poll_seconds=30) as push:
        await push.wait_connected()
        for token in (pair["refresh_token"], pair["access_token"]):
            async with app_client.post("/v1/auth/revoke", json={"token": token},
                                       headers={"Authorization": ""}) as revoked:
                assert revoked.status == 200
        with pytest.raises(RefreshRefused):
            await push.get(timeout=8)  # 2 s watch + 1 s cache, then the refresh
        assert push.last_disconnect_reason is not None
        assert json.loads(push.last_disconnect_reason)["reason"] == "revoked"
    assert refresher.refreshes == 0


NODE = shutil.which("node")
PUSH_JS = Path(gateway.web.__file__).parent / "static" / "push.js"
NODE_DRIVER = """
globalThis.window = globalThis;
%s
const [base, login, want] = [process.argv[2], JSON.parse(process.argv[3]), Number(process.argv[4])];
const say = (line) => process.stdout.write("@" + JSON.stringify(line) + "\\n");
const rows = [];
const credential = GatewayPush.refresher(base, login.refresh_token, {
  accessToken: login.access_token, expiresIn: login.expires_in,
  onRotate: (token) => say({rotated: token}),
});
new GatewayPush(["%s"], {
  base, since: {"%s": 0}, pollMs: 500, credential,
  onRow: (row) => { rows.push(row.offset); say({row: row.offset}); },
}).start();
setInterval(() => { if (rows.length >= want) { say({done: rows}); process.exit(0); } }, 20);
"""


@pytest.mark.skipif(NODE is None, reason="node is not installed")
async def test_push_js_refresher_resumes_across_expiries(
        app_client: TestClient[Any, Any], runtime: Runtime, tmp_path: Path) -> None:
    """The browser client's GatewayPush.refresher, run by node against the real app: the
    server ends the stream at the 2 s token's expiry, the client refreshes through
    /v1/auth/refresh and resumes: every row once, in order."""
    assert NODE is not None
    script = tmp_path / "driver.js"
    script.write_text(NODE_DRIVER % (PUSH_JS.read_text(), TOPIC, TOPIC))
    pair = await login(app_client, ttl=2)
    proc = await asyncio.create_subprocess_exec(
        NODE, str(script), base_url(app_client), json.dumps(pair), "12",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    said: list[dict[str, Any]] = []
    warned: list[str] = []

    async def read() -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            if line.startswith(b"@"):
                said.append(json.loads(line[1:]))

    async def read_warnings() -> None:
        assert proc.stderr is not None
        async for line in proc.stderr:
            warned.append(line.decode())

    reading = asyncio.create_task(read())
    warnings = asyncio.create_task(read_warnings())
    try:
        for n in range(12):
            await feed.append_and_publish(runtime.pg, runtime.cache, TOPIC, "message", {"n": n})
            if n == 5:  # half before the first token's end, half after it and a refresh
                await wait_until(lambda: any("rotated" in s for s in said), timeout=8,
                                 message="the JS client refreshed")
                # The client refreshes ahead of the end; the server still ends the stream
                # of the first token at its expiry: the rest arrives after that.
                await wait_until(lambda: "token_expired" in "".join(warned), timeout=8,
                                 message="the server ended the first token's stream")
        async with asyncio.timeout(20):
            await reading
            await warnings
            await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    errors = "".join(warned)
    assert proc.returncode == 0, errors
    assert [s["done"] for s in said if "done" in s] == [list(range(1, 13))]
    assert [s["row"] for s in said if "row" in s] == list(range(1, 13))
    rotated = [s["rotated"] for s in said if "rotated" in s]
    assert rotated and pair["refresh_token"] not in rotated and len(set(rotated)) == len(rotated)
    assert "token_expired" in errors  # the server ended a stream at its token's expiry


async def test_no_credential_stops_the_client_with_a_clear_error(
        app_client: TestClient[Any, Any]) -> None:
    """The README's first snippet without a credential: the stream answers 401 and the
    client stops at once with ``AccessRefused`` saying what to pass, instead of retrying
    (ten retries would get the address blocked by the barrier)."""
    base = base_url(app_client)
    async with PushClient(base, [TOPIC], since={TOPIC: 0}) as push:
        with pytest.raises(AccessRefused) as refused:
            await push.get(timeout=5)
    assert refused.value.status == 401
    assert "Authorization" in str(refused.value) and push.connects == 0


async def test_the_refusal_is_raised_at_the_readers_loop(
        app_client: TestClient[Any, Any]) -> None:
    """The README's loop without a credential, as a script runs it: the traceback ends at its
    own ``async for`` (through ``get``), not in the client's ``close`` (which re-raised the
    same exception on the way out of ``async with`` and so rewrote where it came from)."""
    with pytest.raises(AccessRefused) as refused:
        async with PushClient(base_url(app_client), [TOPIC], since={TOPIC: 0}) as push:
            async for _row in push:
                pass
    frames = [frame.name for frame in traceback.extract_tb(refused.value.__traceback__)]
    assert "close" not in frames, frames
    assert frames[:2] == ["test_the_refusal_is_raised_at_the_readers_loop", "_iterate"], frames


async def test_a_credential_without_the_topic_stops_the_client_with_403(
        app_client: TestClient[Any, Any]) -> None:
    pair = await login(app_client, ttl=300)  # may read conversation:1 only
    headers = {"Authorization": f"Bearer {pair['access_token']}"}
    async with PushClient(base_url(app_client), ["conversation:2"], headers=headers) as push:
        with pytest.raises(AccessRefused) as refused:
            await push.get(timeout=5)
    assert refused.value.status == 403 and "topics" in str(refused.value)


async def test_a_refreshing_credential_is_retried_once_then_the_client_stops(
        app_client: TestClient[Any, Any]) -> None:
    """A credential with ``invalidate()`` whose new token is refused as well: one retry
    with a new token, then ``AccessRefused``; never a loop."""

    class Refused:
        def __init__(self) -> None:
            self.asked = self.invalidated = 0

        async def __call__(self) -> str:
            self.asked += 1
            return f"not-a-token-{self.asked}"

        def invalidate(self) -> None:
            self.invalidated += 1

    credential = Refused()
    async with PushClient(base_url(app_client), [TOPIC], credential=credential) as push:
        with pytest.raises(AccessRefused):
            await push.get(timeout=5)
    assert (credential.asked, credential.invalidated) == (2, 2)


NODE_REFUSED = """
globalThis.window = globalThis;
%s
const [base, token] = [process.argv[2], process.argv[3] || null];
let calls = 0;
const credential = async () => { calls += 1; return "not-a-token"; };
credential.invalidate = () => {};
new GatewayPush(["%s"], {
  base, since: {"%s": 0}, pollMs: 500, token, credential: token === "refresh" ? credential : null,
  onRow: () => {},
  onState: (state, error) => {
    if (state !== "refused") return;
    const line = JSON.stringify({status: error.status, message: error.message, calls}) + "\\n";
    process.stdout.write(line, () => process.exit(0));  // a pipe is written asynchronously
  },
}).start();
setTimeout(() => process.stdout.write("still retrying\\n", () => process.exit(1)), 8000);
"""


@pytest.mark.skipif(NODE is None, reason="node is not installed")
@pytest.mark.parametrize(("token", "status", "calls"), [
    # refresh: the stream, the feed read after it, the stream again with the new token
    ("", 401, 0), ("refresh", 401, 3), ("wrong-topic", 403, 0)])
async def test_push_js_stops_on_401_and_403(
        app_client: TestClient[Any, Any], tmp_path: Path, token: str, status: int,
        calls: int) -> None:
    """push.js, run by node: no credential (401), a refreshing credential refused again
    after one new token (401), a token without the topic (403): the client stops with
    onState("refused", error) instead of retrying forever."""
    assert NODE is not None
    if token == "wrong-topic":
        token = (await login(app_client, ttl=300))["access_token"]  # conversation:1 only
    script = tmp_path / "refused.js"
    script.write_text(NODE_REFUSED % (PUSH_JS.read_text(), "conversation:2", "conversation:2"))
    proc = await asyncio.create_subprocess_exec(
        NODE, str(script), base_url(app_client), token, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, (out, err)
    said = json.loads(out.decode().splitlines()[-1])  # console.info writes to stdout too
    assert (said["status"], said["calls"]) == (status, calls), said
    assert f"answered {status}" in said["message"]
