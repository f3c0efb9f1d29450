"""The Mattermost listener in-process, against the fake server and the real stores."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway import keys
from gateway.config import ConfigError, Settings
from gateway.dedup import claims
from gateway.inbound.mattermost import health
from gateway.inbound.mattermost.backoff import Backoff
from gateway.inbound.mattermost.client import Post
from gateway.inbound.mattermost.component import MattermostBot, listener_config
from gateway.inbound.mattermost.listener import LEASE_NAME
from gateway.inbox.queue import Inbox
from gateway.leases import lease as leases
from gateway.leases import maintenance
from gateway.stores.runtime import Runtime
from tests.conftest import ServerSet, make_settings
from tests.fakes.mattermost import BOT_USER_ID, FakeMattermost
from tests.fakes.pytest_plugin import MATTERMOST_TOKEN
from tests.helpers import registry_violations, wait_until
from tests.inbound.mattermost.helpers import LEASE_SECONDS, mattermost_settings, running


@pytest.fixture
def settings(servers: ServerSet, fake_mattermost: FakeMattermost) -> Settings:
    """The shared ``runtime`` fixture, pointed at the fake with test timings."""
    return mattermost_settings(make_settings(servers), fake_mattermost.url)


def messages(fake: FakeMattermost) -> Counter[str]:
    return Counter(fake.reply_messages())


async def test_posted_event_gets_exactly_one_reply(runtime: Runtime,
                                                   fake_mattermost: FakeMattermost) -> None:
    fake = fake_mattermost
    async with running(runtime):
        await fake.wait_for_sockets(1)
        challenge = fake.ws_messages[0]
        assert challenge["seq"] == 1 and challenge["action"] == "authentication_challenge"
        assert challenge["data"] == {"token": MATTERMOST_TOKEN}

        post = await fake.create_post("general", "hello")
        [reply] = await fake.wait_for_replies(1)
        assert (reply["channel_id"], reply["message"], reply["root_id"]) == (
            "general", "echo: hello", "")

        assert await fake.redeliver(post["id"]) == 1  # the same post id again: no answer
        await fake.create_post("random", "in a thread", root_id=post["id"])
        await fake.create_post("general", "last")
        await fake.wait_for_replies(3)
        threaded = [r for r in fake.replies() if r["message"] == "echo: in a thread"]
        assert threaded[0]["root_id"] == post["id"] and threaded[0]["channel_id"] == "random"

    # The bot's own replies came back as `posted` events too (the fake echoes them, like
    # Mattermost): none was answered, or we would see "echo: echo: ...".
    assert messages(fake) == Counter(["echo: hello", "echo: in a thread", "echo: last"])
    key = keys.dedup_mattermost_post(post["id"])
    assert await claims.state(runtime.durable, key) == claims.DONE
    assert 0 < await runtime.durable.ttl(key) <= runtime.settings.dedup_ttl
    assert await registry_violations(runtime.durable, "durable") == []
    assert await registry_violations(runtime.cache, "cache") == []


@pytest.mark.parametrize("drop", ["close-1000", "close-1011", "kill"])
async def test_drop_reconnects_with_backoff_and_catches_up_once(
        runtime: Runtime, fake_mattermost: FakeMattermost, drop: str) -> None:
    fake = fake_mattermost
    loop = asyncio.get_running_loop()
    async with running(runtime) as listener:
        await fake.wait_for_sockets(1)
        before = await fake.create_post("general", "before")
        await fake.wait_for_replies(1)

        fake.set_accepting(False)  # the server stays unreachable for a while
        attempts = fake.ws_attempts
        dropped_at = loop.time()
        if drop == "kill":
            assert fake.kill_sockets() == 1
        else:
            assert await fake.drop_sockets(int(drop.split("-")[1])) == 1
        missed = fake.make_post("general", "while away")  # stored, never pushed
        other = fake.make_post("random", "also while away")
        await wait_until(lambda: fake.ws_attempts >= attempts + 5, timeout=10,
                         message="five refused reconnects")
        # Delays 0.05, 0.1, 0.2, 0.4, 0.4 s, each jittered down to no less than half:
        # five refused attempts cannot come sooner than 0.575 s (a hot loop takes ms).
        assert loop.time() - dropped_at >= 0.57

        fake.set_accepting(True)
        await fake.wait_for_sockets(1, timeout=5)
        await fake.wait_for_replies(3)
        assert await fake.redeliver(missed["id"]) == 1  # live duplicate after the catch-up
        await fake.create_post("general", "after")
        await fake.wait_for_replies(4)
        assert listener.state.reconnects == 1 and listener.state.connected
    assert messages(fake) == Counter(
        ["echo: before", "echo: while away", "echo: also while away", "echo: after"])
    assert before["id"] and other["id"]
    assert fake.ws_connections == 2


async def test_health_flag_and_readyz_entry(runtime: Runtime, fake_mattermost: FakeMattermost,
                                            make_client: Callable[..., Any]) -> None:
    fake = fake_mattermost
    client = await make_client()  # the full app: its Mattermost component runs the listener

    async def flag(connected: bool) -> dict[str, object] | None:
        value = await health.read(runtime.cache)
        return value if value and value["connected"] is connected else None

    up = await wait_until(lambda: flag(True), timeout=5, message="connected flag")
    assert set(up) == {"instance", "connected", "since", "last_event_at", "reconnects"}
    holder = await leases.current(runtime.durable, LEASE_NAME)
    assert holder is not None and up["instance"] == holder[0]
    assert 0 < await runtime.cache.pttl(keys.mattermost_listener()) <= 1500
    body = await (await client.get("/readyz")).json()
    entry = body["checks"]["mattermost-listener"]
    assert entry["ok"] and entry["required"] is False and "connected" in entry["detail"]

    fake.set_accepting(False)
    await fake.drop_sockets(1011)
    down = await wait_until(lambda: flag(False), timeout=5, message="disconnected flag")
    assert down["reconnects"] == 1 and float(str(down["since"])) >= float(str(up["since"]))
    response = await client.get("/readyz")
    body = await response.json()
    assert response.status == 200  # not required: a standby or a reconnect is not "unready"
    assert not body["checks"]["mattermost-listener"]["ok"]

    fake.set_accepting(True)
    await wait_until(lambda: flag(True), timeout=5, message="reconnected flag")
    await client.close()  # clean stop: the flag and the lease go at once
    assert await health.read(runtime.cache) is None
    assert await leases.current(runtime.durable, LEASE_NAME) is None


async def test_cancelled_listener_flag_expires(runtime: Runtime,
                                               fake_mattermost: FakeMattermost) -> None:

    listener = MattermostBot(runtime).listener
    task = asyncio.create_task(listener.run(asyncio.Event()))
    await wait_until(lambda: health.read(runtime.cache), timeout=5, message="flag")
    task.cancel()  # no clean stop: nothing clears the flag, its TTL does
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 10)
    await wait_until(lambda: fake_mattermost.open_sockets == 0, message="socket closed")
    assert await health.read(runtime.cache) is not None

    async def expired() -> bool:
        return await health.read(runtime.cache) is None

    await wait_until(expired, timeout=3, message="flag expiry (TTL 1.5 s)")


async def test_holder_that_lost_its_lease_stands_by_and_nothing_is_answered_twice(
        runtime: Runtime, fake_mattermost: FakeMattermost) -> None:
    """A post that reached the old holder before it noticed is taken in by it (the claim
    makes any second intake a duplicate); the listener leaves its socket, and after the
    other replica goes away it takes the lease back: one answer in all."""
    fake = fake_mattermost
    durable = runtime.durable
    async with running(runtime) as listener:
        await fake.wait_for_sockets(1)
        mine = listener.lease
        assert mine is not None
        # As after a pause longer than the TTL: the lease expired and another replica took it.
        await durable.delete(leases.lease_key(LEASE_NAME))
        thief = await leases.acquire(durable, LEASE_NAME, "other-replica", 30)
        assert thief is not None and thief.token > mine.token
        await fake.create_post("general", "who answers?")
        await wait_until(lambda: listener.lease is None, timeout=5, message="standing by")
        assert fake.open_sockets == 0

        await leases.release(durable, thief)  # the other replica goes away
        await wait_until(lambda: listener.lease is not None, timeout=5, message="lease back")
        assert listener.lease is not None and listener.lease.token > thief.token
        await fake.wait_for_replies(1, timeout=5)
        await fake.wait_for_sockets(1)
        await fake.create_post("general", "and now?")  # live again: the catch-up is done
        await fake.wait_for_replies(2, timeout=5)
    assert fake.reply_messages() == ["echo: who answers?", "echo: and now?"]


async def test_malformed_and_foreign_events_are_ignored(
        runtime: Runtime, fake_mattermost: FakeMattermost) -> None:
    fake = fake_mattermost
    async with running(runtime):
        await fake.wait_for_sockets(1)
        await fake.push_event("posted", {"post": "{not json"})
        await fake.push_event("typing", {"user_id": "x"})
        await fake.create_post("general", "joined")
        system = fake.make_post("general", "alice joined")
        system["type"] = "system_join_channel"
        await fake.push_posted(system)
        await fake.create_post("general", "real")
        await fake.wait_for_replies(2)
    assert messages(fake) == Counter(["echo: joined", "echo: real"])


def test_backoff_doubles_with_jitter_and_resets() -> None:
    high = Backoff(1, 8, rng=lambda: 0.999999)
    assert [round(high.next(), 3) for _ in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    high.reset()
    assert round(high.next(), 3) == 1.0
    low = Backoff(1, 8, rng=lambda: 0.0)
    assert [low.next() for _ in range(3)] == [0.5, 1.0, 2.0]


def test_listener_config_from_settings(settings: Settings) -> None:
    config = listener_config(settings)
    assert config.lease_seconds == 2 and config.health_interval == 0.2
    assert config.token == MATTERMOST_TOKEN and config.dedup_ttl == settings.dedup_ttl
    with pytest.raises(ConfigError, match="unknown setting"):
        listener_config(mattermost_settings(settings, "http://127.0.0.1:1", bogus=1))
    with pytest.raises(ConfigError, match="positive"):
        listener_config(mattermost_settings(settings, "http://127.0.0.1:1", backoff_max=0))
    with pytest.raises(ConfigError, match="MATTERMOST_URL"):
        listener_config(Settings())


def test_posted_event_decoding() -> None:
    from gateway.inbound.mattermost.client import posted_post

    post = {"id": "p1", "channel_id": "c", "user_id": "u", "message": "hi", "create_at": 5}
    event = {"event": "posted", "data": {"post": json.dumps(post)}}
    decoded = posted_post(event)
    assert decoded is not None and (decoded.id, decoded.create_at, decoded.root_id) == (
        "p1", 5, "")
    assert posted_post({"event": "posted", "data": {"post": "{oops"}}) is None
    assert posted_post({"event": "typing", "data": {}}) is None


async def test_replies_go_through_the_conversation_service(
        runtime: Runtime, fake_mattermost: FakeMattermost) -> None:

    fake = fake_mattermost
    async with running(runtime, handler=None):
        await fake.wait_for_sockets(1)
        first = await fake.create_post("general", "hello")
        await fake.wait_for_replies(1)
        await fake.create_post("general", "again")
        await fake.wait_for_replies(2)
    assert fake.reply_messages() == ["echo: hello (1 messages)", "echo: again (3 messages)"]
    rows = await runtime.pg.fetch(
        "SELECT c.platform, c.chat, m.role, m.user_name FROM conversation_messages m"
        " JOIN conversations c ON c.id = m.conversation_id"
        " WHERE m.platform_message_id = $1", first["id"])
    assert [tuple(r) for r in rows] == [("mattermost", "general", "user", "alice")]


async def test_rejected_token_backs_off_without_touching_the_socket(
        runtime: Runtime, fake_mattermost: FakeMattermost) -> None:
    fake = fake_mattermost
    fake.valid_tokens.clear()  # the bot token was revoked
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with running(runtime) as listener:
        await wait_until(lambda: len(fake.calls_to("unauthorized")) >= 4, timeout=10,
                         message="four refused attempts")
        # 3 backoff delays (0.05, 0.1, 0.2 s, each at least halved) separate four attempts.
        assert loop.time() - started >= 0.17
        assert fake.ws_attempts == 0 and not listener.state.connected
        flag = await health.read(runtime.cache)
        assert flag is not None and flag["connected"] is False


class SilentMattermost(FakeMattermost):
    """Accepts the socket and the challenge but never sends ``hello``."""

    async def _authenticate(self, sock: object) -> None:  # type: ignore[override]
        return None


async def test_socket_without_hello_counts_as_a_drop(
        runtime: Runtime, servers: ServerSet) -> None:
    async with SilentMattermost(token=MATTERMOST_TOKEN) as fake:
        settings = mattermost_settings(make_settings(servers), fake.url, hello_timeout=0.3)
        silent = Runtime(settings, runtime.durable, runtime.cache, runtime.pg)
        async with running(silent) as listener:
            await fake.wait_for_connections(3, timeout=10)
            assert not listener.state.connected and listener.state.reconnects == 0


def test_listen_without_mattermost_url_is_a_configuration_error(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from gateway import cli

    for variable in ("MATTERMOST_URL", "MATTERMOST_TOKEN", "GATEWAY_CONFIG"):
        monkeypatch.delenv(variable, raising=False)
    assert cli.main(["listen", "mattermost"]) == 2
    assert "MATTERMOST_URL" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.single_instance
async def test_durable_outage_fences_the_holder_then_it_recovers(
        runtime: Runtime, servers: ServerSet, fake_mattermost: FakeMattermost,
        redis_factory: Callable[..., Any]) -> None:
    from gateway.stores import redis as redis_clients
    fake = fake_mattermost
    durable_server = redis_factory("durable")
    durable = redis_clients.connect(durable_server.url, variable="test")
    settings = mattermost_settings(make_settings(servers, durable_url=durable_server.url),
                                   fake.url)
    try:
        async with running(Runtime(settings, durable, runtime.cache, runtime.pg)) as listener:
            await fake.wait_for_sockets(1)
            first = listener.lease
            assert first is not None
            durable_server.kill()  # the lease can no longer be renewed nor checked
            # The local deadline runs out: the holder stops before anyone else could take over.
            await wait_until(lambda: listener.lease is None, timeout=LEASE_SECONDS + 3,
                             message="holder fenced by its local deadline")
            assert fake.open_sockets == 0
            post = await fake.create_post("general", "during the outage")
            durable_server.start()
            await fake.wait_for_replies(1, timeout=10)
            assert listener.lease is not None and listener.lease.token > first.token
        assert fake.reply_messages() == ["echo: during the outage"]
        assert await claims.state(durable, keys.dedup_mattermost_post(post["id"])) == claims.DONE
    finally:
        await durable.aclose()


async def test_a_retried_entry_already_answered_on_the_platform_is_not_sent_again(
        runtime: Runtime, fake_mattermost: FakeMattermost) -> None:
    """A holder posted its reply and died before acknowledging the entry: the next holder
    sees our reply on the platform (its props name the post) and posts no second one."""
    fake = fake_mattermost
    post = fake.make_post("general", "answered, then the crash")
    fake.make_post("general", "echo: answered, then the crash", user_id=BOT_USER_ID,
                   props={"gateway_reply_to": post["id"]})
    bot = MattermostBot(runtime)
    queue = bot.inbox.queue
    await bot.accept(Post.from_api(post))  # the dead holder's state: in the inbox,
    [taken] = await queue.take("dead-holder", 1)  # taken, and its lease run out
    await queue.release(taken.chat, "dead-holder", delay=0, counted=True)
    later = fake.make_post("general", "a later question")  # proves the consumer ran
    async with running(runtime):
        await wait_until(lambda: "echo: a later question" in fake.reply_messages(),
                         timeout=10, message="the later post answered")
        await wait_until(lambda: _chat_empty(queue, taken.chat), timeout=5,
                         message="the retried entry acknowledged")
    # The earlier reply was on the platform already (made above, not through the REST API
    # this fake records): nothing was posted again.
    assert fake.reply_messages() == ["echo: a later question"]
    assert later["id"]


async def _chat_empty(queue: Inbox, chat: str) -> bool:
    return await queue.redis.llen(queue.chat_list(chat)) == 0


async def test_catch_up_leaves_posts_that_were_only_edited_since(
        runtime: Runtime, fake_mattermost: FakeMattermost) -> None:
    """The REST ``since`` query returns posts created *or edited* since: a post from before
    the catch-up window, edited now, has no claim any more (the window is longer than the
    dedup TTL in real life) and must not be answered again."""
    fake = fake_mattermost
    old = fake.make_post("general", "asked last week, edited today")
    old["create_at"] -= 7 * 24 * 3600 * 1000
    fake.make_post("general", "a recent question")  # proves the catch-up ran
    async with running(runtime):
        await wait_until(lambda: "echo: a recent question" in fake.reply_messages(),
                         timeout=5, message="catch-up answered the recent post")
    # The listener has drained every post it took up: the old one was never claimed.
    assert fake.reply_messages() == ["echo: a recent question"]
    assert await runtime.durable.get(keys.dedup_mattermost_post(old["id"])) is None


async def test_a_post_whose_claim_failed_is_answered_while_the_socket_stays_up(
        runtime: Runtime, fake_mattermost: FakeMattermost, monkeypatch: pytest.MonkeyPatch) -> None:
    """redis-durable refuses the intake once: the post is tried again on its own, without
    waiting for a reconnect's catch-up (none comes while the socket stays up)."""
    fake = fake_mattermost
    real_push, refused = Inbox.push, []

    async def push_refused_once(self: Inbox, chat: str, entry: Any, key: Any,
                                ttl: int) -> Any:
        if not refused:
            refused.append(key)
            raise RedisConnectionError("redis-durable went away for a moment")
        return await real_push(self, chat, entry, key, ttl)

    async with running(runtime):
        await fake.wait_for_sockets(1)
        monkeypatch.setattr(Inbox, "push", push_refused_once)
        post = await fake.create_post("general", "asked during a blip")
        await fake.wait_for_replies(1, timeout=10)
        assert refused == [keys.dedup_mattermost_post(post["id"])]
        assert fake.ws_connections == 1  # answered on the same socket, not by a catch-up
    assert fake.reply_messages() == ["echo: asked during a blip"]


async def test_maintenance_keeps_the_listener_quiet_and_its_catch_up_answers_after(
        runtime: Runtime, fake_mattermost: FakeMattermost) -> None:
    fake = fake_mattermost
    view = maintenance.view_for(runtime.durable)  # the listener reads the same view
    async with running(runtime):
        await fake.wait_for_sockets(1)
        await maintenance.switch_on(runtime.durable, "restore", seconds=120)
        await wait_until(lambda: _on(view), timeout=2, message="the switch seen")
        await fake.create_post("general", "asked during maintenance")
        await wait_until(lambda: fake.open_sockets == 0, timeout=5,
                         message="the listener left its socket")
        assert fake.reply_messages() == []
        await maintenance.switch_off(runtime.durable)
        await fake.wait_for_replies(1, timeout=10)
    assert fake.reply_messages() == ["echo: asked during maintenance"]


async def _on(view: maintenance.MaintenanceView) -> bool:
    return (await view.current()).on
