"""Two real ``gateway listen mattermost`` processes against the same stores and fake server:
one is active, the other stands by and takes over after the first is killed -9."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway import keys
from gateway.dedup import claims
from gateway.inbound.mattermost import health
from gateway.inbound.mattermost.listener import LEASE_NAME
from gateway.inbox.queue import Inbox
from gateway.leases import lease as leases
from gateway.stores.runtime import Runtime
from tests.conftest import ServerSet
from tests.fakes.mattermost import FakeMattermost
from tests.fakes.pytest_plugin import MATTERMOST_TOKEN
from tests.helpers import wait_until
from tests.inbound.mattermost.helpers import FAST, INBOX_FAST, LEASE_SECONDS

ROOT = Path(__file__).resolve().parents[3]
Process = asyncio.subprocess.Process


def listener_env(servers: ServerSet, fake: FakeMattermost, directory: Path,
                 extra_config: str = "") -> dict[str, str]:
    config = directory / "gateway.toml"
    config.write_text("[mattermost]\n" + "".join(f"{k} = {v}\n" for k, v in FAST.items())
                      + "[inbox]\n" + "".join(f"{k} = {v}\n" for k, v in INBOX_FAST.items())
                      + extra_config)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GATEWAY_", "MATTERMOST_", "TELEGRAM_", "SLACK_"))}
    env.update({
        "GATEWAY_DURABLE_URL": servers.durable_url,
        "GATEWAY_CACHE_URL": servers.cache_url,
        "GATEWAY_DATABASE_URL": servers.database_url,
        "MATTERMOST_URL": fake.url,
        "MATTERMOST_TOKEN": MATTERMOST_TOKEN,
        "GATEWAY_LISTENER_LEASE_SECONDS": str(LEASE_SECONDS),
        "GATEWAY_CONFIG": str(config),
    })
    return env


@pytest.fixture
async def spawn(tmp_path: Path) -> AsyncIterator[list[Process]]:
    """Started processes are collected here and killed at the end, whatever happens."""
    procs: list[Process] = []
    yield procs
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


async def start_listener(env: dict[str, str], log: Path) -> Process:
    with log.open("wb") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.cli", "listen", "mattermost",
            cwd=ROOT, env=env, stdout=out, stderr=asyncio.subprocess.STDOUT)


def pid_of(holder: str) -> int:
    return int(holder.split(":")[1])  # leases.instance_id(): host:pid:random


@pytest.mark.slow
async def test_two_listeners_one_active_then_takeover_after_kill9(
        runtime: Runtime, servers: ServerSet, fake_mattermost: FakeMattermost,
        spawn: list[Process], tmp_path: Path) -> None:
    fake = fake_mattermost
    loop = asyncio.get_running_loop()
    env = listener_env(servers, fake, tmp_path)
    spawn.extend([await start_listener(env, tmp_path / f"listener{i}.log") for i in range(2)])

    await fake.wait_for_sockets(1, timeout=30)
    first = await wait_until(lambda: leases.current(runtime.durable, LEASE_NAME), timeout=5)
    active = next(p for p in spawn if p.pid == pid_of(first[0]))
    standby = next(p for p in spawn if p is not active)
    await fake.create_post("general", "one")
    await fake.wait_for_replies(1, timeout=10)
    flag = await health.read(runtime.cache)
    assert flag is not None and flag["instance"] == first[0] and flag["connected"]
    assert fake.ws_connections == 1 and standby.returncode is None  # standing by, not connected

    active.kill()  # SIGKILL: no release, no goodbye; the lease must run out
    await active.wait()
    killed_at = loop.time()
    missed = await fake.create_post("general", "while nobody listened")
    await wait_until(lambda: fake.ws_connections == 2 and fake.open_sockets == 1, timeout=10,
                     message="the standby's connection")
    took = loop.time() - killed_at
    assert took < LEASE_SECONDS + 1.5, f"takeover took {took:.2f} s"
    second = await leases.current(runtime.durable, LEASE_NAME)
    assert second is not None and pid_of(second[0]) == standby.pid and second[1] > first[1]

    replies = await fake.wait_for_replies(2, timeout=10)  # the missed post, after catch-up
    assert "while nobody listened" in replies[1]["message"] and len(fake.replies()) == 2

    async def flag_of_standby() -> bool:
        value = await health.read(runtime.cache)
        return value is not None and value["instance"] == second[0]

    await wait_until(flag_of_standby, timeout=5, message="the new holder's flag")
    standby.kill()
    await standby.wait()
    killed_at = loop.time()

    async def flag_gone() -> bool:
        return await health.read(runtime.cache) is None

    await wait_until(flag_gone, timeout=5, message="flag expiry after kill -9")
    assert loop.time() - killed_at <= FAST["health_ttl"] + 1.0
    assert len(fake.replies()) == 2 and missed["id"]


@pytest.mark.slow
async def test_sigterm_steps_down_at_once(
        runtime: Runtime, servers: ServerSet, fake_mattermost: FakeMattermost,
        spawn: list[Process], tmp_path: Path) -> None:
    fake = fake_mattermost
    spawn.append(await start_listener(listener_env(servers, fake, tmp_path),
                                      tmp_path / "listener.log"))
    await fake.wait_for_sockets(1, timeout=30)
    await wait_until(lambda: health.read(runtime.cache), timeout=5, message="flag")
    spawn[0].terminate()
    assert await asyncio.wait_for(spawn[0].wait(), 10) == 0
    # Released, not left to expire: a standby could take over right away.
    assert await leases.current(runtime.durable, LEASE_NAME) is None
    assert await health.read(runtime.cache) is None
    assert fake.open_sockets == 0


@pytest.mark.slow
async def test_holder_killed_mid_answer_the_successor_answers_once(
        runtime: Runtime, servers: ServerSet, fake_mattermost: FakeMattermost,
        spawn: list[Process], tmp_path: Path) -> None:
    """The active process takes a post into the inbox, leases its chat and hangs in the
    handler; kill -9. The other process reclaims the chat when the lease runs out and
    answers: exactly one reply."""
    fake = fake_mattermost
    env = listener_env(servers, fake, tmp_path, '[conversations]\n'
                       'handler = "tests.inbound.mattermost.hanging_handler:handler"\n')
    hanging = await start_listener({**env, "GATEWAY_TEST_HANG": "1"}, tmp_path / "hang.log")
    spawn.append(hanging)
    await fake.wait_for_sockets(1, timeout=30)
    post = await fake.create_post("general", "are you there?")
    key = keys.dedup_mattermost_post(post["id"])
    queue = Inbox(runtime.durable, "mattermost")
    await wait_until(lambda: _leased(queue), timeout=10, message="the hanging holder's lease")
    assert await claims.state(runtime.durable, key) == claims.DONE  # durable: acknowledged
    spawn.append(await start_listener(env, tmp_path / "standby.log"))

    hanging.kill()  # mid-answer: stored, nothing sent
    await hanging.wait()
    [reply] = await fake.wait_for_replies(1, timeout=15)
    assert reply["message"] == "answer: are you there?"
    assert reply["props"] == {"gateway_reply_to": post["id"]}
    await fake.create_post("general", "and now?")  # the successor is live: proves it runs
    await fake.wait_for_replies(2, timeout=10)
    assert fake.reply_messages() == ["answer: are you there?", "answer: and now?"]


@pytest.mark.slow
async def test_holder_killed_after_its_reply_went_out_is_not_answered_again(
        runtime: Runtime, servers: ServerSet, fake_mattermost: FakeMattermost,
        spawn: list[Process], tmp_path: Path) -> None:
    """The reply reached the platform, but the holder died waiting for the answer (so its
    entry is unacknowledged and its stored reply unsettled). The successor finds our reply
    on the platform and does not post a second one."""
    fake = fake_mattermost
    env = listener_env(servers, fake, tmp_path, '[conversations]\n'
                       'handler = "tests.inbound.mattermost.hanging_handler:handler"\n')
    first = await start_listener(env, tmp_path / "first.log")
    spawn.append(first)
    await fake.wait_for_sockets(1, timeout=30)
    fake.stall_created_posts = True
    await fake.create_post("general", "did it arrive?")
    await fake.wait_for_replies(1, timeout=10)  # on the platform; its sender still waits
    queue = Inbox(runtime.durable, "mattermost")
    assert await _leased(queue)
    spawn.append(await start_listener(env, tmp_path / "standby.log"))

    first.kill()
    await first.wait()
    fake.stall_created_posts = False
    await wait_until(lambda: _drained(queue), timeout=15,
                     message="the successor settled the unacknowledged entry")
    await fake.create_post("general", "and now?")
    await fake.wait_for_replies(2, timeout=10)
    assert fake.reply_messages() == ["answer: did it arrive?", "answer: and now?"]


async def _leased(queue: Inbox) -> bool:
    return (await queue.depth())["leased_chats"] == 1


async def _drained(queue: Inbox) -> bool:
    return await queue.depth() == {"ready_chats": 0, "leased_chats": 0, "dead": 0}
